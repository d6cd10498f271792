#!/usr/bin/env bash
# Sets up the machine and runs the bot on the embedded defaults.
#
# Until the transports land (browser WebRTC, microphone, WebSocket), the bot answers a recorded
# question: it hears it (Silero VAD), transcribes it (Whisper), answers (SmolLM2) and speaks
# (Piper), all offline. Pass your own WAV: scripts/bot.sh QUESTION.wav [ANSWER.wav]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo run --release --example voice_turn -- "$@"
