// The official client as one browser script: tests/browser.rs injects it into voxide's page.
import { PipecatClient } from "@pipecat-ai/client-js";
import { SmallWebRTCTransport, WavMediaManager } from "@pipecat-ai/small-webrtc-transport";

window.PipecatOfficial = { PipecatClient, SmallWebRTCTransport, WavMediaManager };
