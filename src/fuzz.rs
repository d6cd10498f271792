//! Fuzz targets: every parser that reads what comes from outside the process, each as a
//! function of untrusted bytes that must return (an error is fine) without panicking, hanging
//! or allocating wildly. `fuzz/` drives them with libFuzzer (`scripts/fuzz.sh TARGET SECONDS`,
//! coverage-guided); `tests/fuzz_smoke.rs` runs each on its seeds (`fuzz/seeds/TARGET/`) and on
//! mutations of them in every test run.

use std::time::Instant;

use crate::services::ws::{Message, WsCore};

/// A fuzz target: bytes in, nothing out; it may not panic.
pub type Target = fn(&[u8]);

/// Every target, by name.
pub const TARGETS: &[(&str, Target)] = &[
    ("rtvi", rtvi),
    ("signalling", signalling),
    ("http_bodies", http_bodies),
    ("ws_pcm", ws_pcm),
    ("ws_carriers", ws_carriers),
    ("sip", sip),
    ("audiosocket", audiosocket),
    ("wav", wav),
    ("async_tool_message", async_tool_message),
    ("sse", sse),
    ("openai_chat", openai_chat),
    ("anthropic_chat", anthropic_chat),
    ("gemini_chat", gemini_chat),
    ("deepgram_stt", deepgram_stt),
    ("assemblyai_stt", assemblyai_stt),
    ("openai_stt", openai_stt),
    ("cartesia_tts", cartesia_tts),
    ("elevenlabs_tts", elevenlabs_tts),
    ("aura_tts", aura_tts),
    ("openai_realtime", openai_realtime),
    ("gemini_live", gemini_live),
    ("config", config),
    ("peers", peers),
    ("access", access),
    ("http_tool_answer", http_tool_answer),
    ("mcp_results", mcp_results),
    ("realtime_core", realtime_core),
    ("calculator", calculator),
    ("context_trim", context_trim),
    ("rtp_audio", rtp_audio),
];

/// The target `name`, if there is one.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Splits the input into messages at `0xff` bytes (never in UTF-8), so one input can be a
/// conversation.
fn messages(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes.split(|b| *b == 0xff)
}

/// RTVI client messages on the data channel, in a row.
fn rtvi(bytes: &[u8]) {
    let mut rtvi = crate::transports::rtvi::Rtvi::new();
    for message in messages(bytes) {
        let _ = rtvi.parse(&text(message));
    }
}

/// SmallWebRTC's data-channel signalling.
fn signalling(bytes: &[u8]) {
    for message in messages(bytes) {
        let _ = crate::transports::signalling::classify(&text(message));
    }
}

/// The HTTP bodies the server reads: an offer, trickled candidates, `/start`.
fn http_bodies(bytes: &[u8]) {
    crate::server::fuzz_bodies(bytes);
}

/// voxide's `/ws` framing: the first byte says text or binary.
fn ws_pcm(bytes: &[u8]) {
    socket(
        crate::transports::websocket::Framing::pcm(16_000, Default::default()),
        bytes,
    );
}

/// A telephone carrier's media stream (the first byte picks the carrier), then the bot's audio
/// to it, an interruption and the end of its speech.
fn ws_carriers(bytes: &[u8]) {
    use crate::transports::carriers::Carrier;
    use crate::transports::websocket::{Framing, Outbound};
    let Some((pick, rest)) = bytes.split_first() else {
        return;
    };
    let carrier = Carrier::ALL[usize::from(*pick) % Carrier::ALL.len()];
    let mut framing = Framing::phone(carrier);
    socket_into(&mut framing, rest);
    let _ = framing.encode(Outbound::Audio(vec![1_000; 333], 16_000));
    let _ = framing.encode(Outbound::Clear);
    let _ = framing.encode(Outbound::Audio(vec![-1_000; 4_000], 24_000));
    let _ = framing.encode(Outbound::Event(crate::events::SessionEvent {
        elapsed: std::time::Duration::ZERO,
        event: crate::events::Event::BotStoppedSpeaking,
    }));
}

fn socket(mut framing: crate::transports::websocket::Framing, bytes: &[u8]) {
    socket_into(&mut framing, bytes);
}

fn socket_into(framing: &mut crate::transports::websocket::Framing, bytes: &[u8]) {
    use crate::transports::websocket::WsMessage;
    for message in messages(bytes) {
        let message = match message.split_first() {
            Some((kind, rest)) if kind % 2 == 0 => WsMessage::Binary(rest.to_vec()),
            Some((_, rest)) => WsMessage::Text(text(rest)),
            None => continue,
        };
        let _ = framing.decode(message);
    }
}

/// What reaches `--sip-listen` and a call's RTP port: the bytes as a TCP stream, a SIP message (and its SDP offer, its
/// answer to a digest challenge, an answered call taking it, and the same as the answer to a
/// call voxide placed, then within it during a transfer), then RTP packets.
fn sip(bytes: &[u8]) {
    use crate::transports::sip::{auth, call, dial, message::SipMessage, register, rtp, sdp};
    static CALLERS: std::sync::OnceLock<Option<auth::Callers>> = std::sync::OnceLock::new();
    // The same bytes as a TCP stream, in pieces: cut into messages, each parsed.
    let mut framer = crate::transports::sip::stream::Framer::default();
    for piece in bytes.chunks(97) {
        if framer.push(piece).is_err() {
            break;
        }
        while let Ok(Some(framed)) = framer.take() {
            if let crate::transports::sip::stream::Framed::Message(m) = framed {
                let _ = SipMessage::parse(&m);
            }
        }
    }
    let mut parts = messages(bytes);
    let Some(first) = parts.next() else {
        return;
    };
    let Ok(message) = SipMessage::parse(first) else {
        return;
    };
    let offer = std::str::from_utf8(&message.body)
        .ok()
        .and_then(|text| sdp::Offer::parse(text).ok());
    let _ = offer.as_ref().map(sdp::Offer::choose);
    if let Some(callers) = CALLERS.get_or_init(|| auth::Callers::parse("alice:secret").ok()) {
        let _ = callers.judge(
            &message,
            [127, 0, 0, 1].into(),
            std::time::SystemTime::now(),
        );
    }
    let now = std::time::Instant::now();
    let (mut answered, _) = call::Call::answer(
        message.clone(),
        String::new(),
        call::Local::udp("127.0.0.1:5060"),
        "vx".into(),
        now,
    );
    let _ = answered.receive(&message, now);
    // The same message as the answer to a call voxide placed; answered, the call is up and
    // hears it again while a transfer waits on its NOTIFY.
    let (mut dialer, _) = dial::Dialer::start(
        dial::Dial {
            to: "sip:bob@127.0.0.1:5090".into(),
            from: "<sip:voxide@127.0.0.1:5060>".into(),
            local: call::Local::udp("127.0.0.1:5060"),
            offer: String::new(),
            account: register::Account::parse("sip:1001@127.0.0.1", "secret".into()).ok(),
            ring_for: std::time::Duration::from_secs(30),
            ids: (
                message.call_id().unwrap_or_default().to_owned(),
                "vx".into(),
            ),
        },
        now,
    );
    for outcome in dialer.receive(&message, now) {
        if let dial::Dialing::Answered(mut placed, _) = outcome {
            let _ = placed.transfer("2001", now);
            let _ = placed.receive(&message, now);
        }
    }
    let mut keys = rtp::Keys::default();
    for packet in parts {
        if let Ok(packet) = rtp::Packet::parse(packet) {
            let _ = keys.take(&packet);
        }
    }
    let _ = answered.hang_up(now);
}

/// What Asterisk's AudioSocket sends, in pieces split anywhere.
fn audiosocket(bytes: &[u8]) {
    let mut reader = crate::transports::audiosocket::Reader::default();
    for piece in messages(bytes) {
        if reader.push(piece).is_err() {
            break;
        }
    }
}

/// An uploaded recording.
fn wav(bytes: &[u8]) {
    let _ = crate::audio::wav::parse(bytes, "fuzz.wav");
}

/// pipecat's async-tool messages, as a tool's or a developer's message.
fn async_tool_message(bytes: &[u8]) {
    use crate::context::Message;
    let content = text(bytes);
    let _ = crate::context::async_tool_messages::parse_message(&Message::tool(
        "call-1",
        content.clone(),
    ));
    let _ = crate::context::async_tool_messages::parse_message(&Message::developer(content));
}

/// Server-sent events, in chunks split anywhere.
fn sse(bytes: &[u8]) {
    let _ = sse_events(bytes);
}

fn sse_events(bytes: &[u8]) -> Vec<crate::services::llm::sse::SseEvent> {
    let mut decoder = crate::services::llm::sse::SseDecoder::new();
    let mut events = Vec::new();
    for chunk in messages(bytes) {
        match decoder.push(chunk) {
            Ok(more) => events.extend(more),
            Err(_) => break,
        }
    }
    events
}

/// A chat completion stream, event by event, then its end.
fn chat(mut decoder: impl crate::services::llm::http::Decode, bytes: &[u8]) {
    for event in sse_events(bytes) {
        if decoder.event(&event).is_err() || decoder.done() {
            break;
        }
    }
    let _ = decoder.end();
}

fn openai_chat(bytes: &[u8]) {
    chat(crate::services::llm::openai::wire::Assembler::new(), bytes);
}

fn anthropic_chat(bytes: &[u8]) {
    chat(crate::services::llm::anthropic::wire::Decoder::new(), bytes);
}

fn gemini_chat(bytes: &[u8]) {
    chat(crate::services::llm::gemini::wire::Decoder::new(), bytes);
}

/// A provider's socket protocol: opened, then the provider's messages (text, or binary after
/// a leading even byte).
fn provider(mut core: impl WsCore, bytes: &[u8]) {
    let now = Instant::now();
    let _ = core.opened(now);
    for message in messages(bytes) {
        let message = match message.split_first() {
            Some((kind, rest)) if kind % 2 == 0 => Message::Binary(rest.to_vec().into()),
            Some((_, rest)) => Message::Text(text(rest).into()),
            None => continue,
        };
        if core.message(message, now).is_err() {
            break;
        }
    }
    let _ = core.tick(now);
}

fn deepgram_stt(bytes: &[u8]) {
    use crate::services::stt::deepgram::{DeepgramCore, DeepgramSettings};
    provider(
        DeepgramCore::new(DeepgramSettings::new("key"), Instant::now()),
        bytes,
    );
}

fn assemblyai_stt(bytes: &[u8]) {
    use crate::services::stt::assemblyai::{AssemblyAiCore, AssemblyAiSettings};
    provider(
        AssemblyAiCore::new(AssemblyAiSettings::new("key"), Instant::now()),
        bytes,
    );
}

fn openai_stt(bytes: &[u8]) {
    use crate::services::stt::openai::{OpenAiSttCore, OpenAiSttSettings};
    provider(
        OpenAiSttCore::new(OpenAiSttSettings::new(
            "https://api.openai.com/v1",
            Some("key".into()),
        )),
        bytes,
    );
}

fn cartesia_tts(bytes: &[u8]) {
    use crate::services::tts::cartesia::{CartesiaCore, CartesiaSettings};
    provider(CartesiaCore::new(CartesiaSettings::new("key")), bytes);
}

fn elevenlabs_tts(bytes: &[u8]) {
    use crate::services::tts::elevenlabs::{ElevenLabsCore, ElevenLabsSettings};
    provider(ElevenLabsCore::new(ElevenLabsSettings::new("key")), bytes);
}

fn aura_tts(bytes: &[u8]) {
    use crate::services::tts::deepgram::{AuraCore, AuraSettings};
    provider(AuraCore::new(AuraSettings::new("key")), bytes);
}

/// A realtime provider's server events.
fn realtime(mut protocol: impl crate::services::llm::realtime::RealtimeProtocol, bytes: &[u8]) {
    for message in messages(bytes) {
        let _ = protocol.parse(&text(message));
    }
}

fn openai_realtime(bytes: &[u8]) {
    use crate::services::llm::openai_realtime::{OpenAiRealtime, OpenAiRealtimeSettings};
    realtime(
        OpenAiRealtime::new(OpenAiRealtimeSettings::new("key")),
        bytes,
    );
}

fn gemini_live(bytes: &[u8]) {
    use crate::services::llm::gemini_live::{GeminiLive, GeminiLiveSettings};
    realtime(GeminiLive::new(GeminiLiveSettings::new("key")), bytes);
}

/// The config file and a bot file, read and resolved into a bot's options (an instructions
/// file is not read: the input names no file of this machine).
fn config(bytes: &[u8]) {
    let text = text(bytes);
    let _ = toml::from_str::<crate::config::Config>(&text);
    if let Ok(mut bot) = toml::from_str::<crate::config::BotConfig>(&text) {
        bot.instructions_file = None;
        let _ = bot.resolve();
    }
}

/// The cluster forwarder's inputs: a node id, `--peers`, `--peer-url` and a signature header.
fn peers(bytes: &[u8]) {
    crate::server::cluster::fuzz_peers(bytes);
}

/// A request as the access rules read it: token, query, `X-Forwarded-For`, Twilio's URL.
fn access(bytes: &[u8]) {
    crate::server::access::fuzz_request(bytes);
}

/// An HTTP tool's answer: JSON, NDJSON or server-sent events.
fn http_tool_answer(bytes: &[u8]) {
    crate::bot::http_tool::fuzz_answer(bytes);
}

/// An MCP server's call results and progress.
fn mcp_results(bytes: &[u8]) {
    crate::bot::mcp::fuzz_results(bytes);
}

/// The realtime core's state machine, over either provider (the first byte picks).
fn realtime_core(bytes: &[u8]) {
    use crate::services::llm::gemini_live::{GeminiLive, GeminiLiveSettings};
    use crate::services::llm::openai_realtime::{OpenAiRealtime, OpenAiRealtimeSettings};
    use crate::services::llm::realtime::fuzz_core;
    match bytes.split_first() {
        Some((kind, rest)) if kind % 2 == 0 => fuzz_core(
            OpenAiRealtime::new(OpenAiRealtimeSettings::new("key")),
            rest,
        ),
        Some((_, rest)) => fuzz_core(GeminiLive::new(GeminiLiveSettings::new("key")), rest),
        None => {}
    }
}

/// The calculator's expressions and the spoken numbers and sums it reads.
fn calculator(bytes: &[u8]) {
    use crate::bot::calculator::{evaluate, read_arithmetic, read_number, say_expression};
    let text = text(bytes);
    let _ = evaluate(&text);
    let _ = read_number(&text);
    if let Some(expression) = read_arithmetic(&text) {
        let _ = evaluate(&expression);
    }
    let _ = say_expression(&text);
}

/// A conversation (JSON messages) held to a small budget: it never grows, and what is left
/// still opens with its instructions.
fn context_trim(bytes: &[u8]) {
    let Some((budget, rest)) = bytes.split_first() else {
        return;
    };
    let Ok(messages) = serde_json::from_slice::<Vec<crate::context::Message>>(rest) else {
        return;
    };
    let mut context = crate::context::LlmContext::new(messages.clone());
    let dropped = context.trim(usize::from(*budget) * 4);
    assert_eq!(context.messages.len() + dropped, messages.len());
    let leading = |m: &[crate::context::Message]| {
        m.iter()
            .take_while(|m| {
                matches!(
                    m,
                    crate::context::Message::System(_) | crate::context::Message::Developer(_)
                )
            })
            .count()
    };
    assert_eq!(
        leading(&context.messages),
        leading(&messages).min(context.messages.len())
    );
}

/// A caller's RTP audio through the jitter buffer, into the Opus decoder and (the same packets)
/// into a SIP call's G.711 or G.722 input: each packet is 8 bytes of header (sequence number, timestamp,
/// milliseconds since the last packet, a byte whose low bit says the payload is RED around Opus
/// of payload type 111), then its payload up to the next `0xff`.
fn rtp_audio(bytes: &[u8]) {
    use crate::transports::phone_in::PhoneInput;
    use crate::transports::sip::sdp::Codec;
    let Ok(mut input) = crate::transports::opus_in::OpusInput::new(16_000) else {
        return;
    };
    let codec = match bytes.first().map(|b| b % 3) {
        Some(0) => Codec::Pcmu,
        Some(1) => Codec::Pcma,
        _ => Codec::G722,
    };
    let mut phone = PhoneInput::new(codec);
    let mut now = Instant::now();
    for packet in messages(bytes) {
        let Some((header, payload)) = packet.split_first_chunk::<8>() else {
            continue;
        };
        let sequence = u16::from_be_bytes([header[0], header[1]]);
        let timestamp = u32::from_be_bytes([header[2], header[3], header[4], header[5]]);
        now += std::time::Duration::from_millis(u64::from(header[6]));
        if header[7] & 1 == 1 {
            input.push_red(sequence, timestamp, payload, 111, now);
        } else {
            input.push(sequence, timestamp, payload, now);
        }
        phone.push(sequence, timestamp, payload, now);
        // Bounded: a piece is at most a second of audio, and the buffer holds 256 packets.
        for _ in 0..1_000 {
            if input.pop(now).is_none() {
                break;
            }
        }
        for _ in 0..1_000 {
            if phone.pop(now).is_none() {
                break;
            }
        }
    }
}
