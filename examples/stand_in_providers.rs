//! Local stand-ins of Deepgram (live transcription), an OpenAI-compatible chat stream and
//! Cartesia (streaming TTS) on one port, each answering after a realistic delay: the STT's final
//! 150 ms after the finalize, the first token 300 ms after the request, the first audio 100 ms
//! after the first text. They speak the providers' wire protocols, so a bot that uses those
//! providers (voxide's, or pipecat's `DeepgramSTTService`, `OpenAILLMService` and
//! `CartesiaTTSService` pointed at them) runs whole without a key or the network, for load tests
//! and side-by-side comparisons.
//!
//! ```bash
//! cargo run --release --example stand_in_providers -- [--port 9000] [--stt-ms 150] [--llm-ms 300] [--tts-ms 100]
//! DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://127.0.0.1:9000 \
//! CARTESIA_API_KEY=local CARTESIA_URL=ws://127.0.0.1:9000 \
//! OPENAI_API_KEY=local OPENAI_BASE_URL=http://127.0.0.1:9000/v1 \
//!   voxide serve --stt deepgram --llm openai --tts cartesia
//! ```

use std::time::Duration;

use voxide::bench::providers::Protocol;
use voxide::bench::providers::stand_ins::{Delays, StandIns};

/// The value after `flag`, or `default`.
fn arg(flag: &str, default: u64) -> Result<u64, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == flag) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{flag} takes a number")),
    }
}

#[tokio::main]
async fn main() {
    let parsed = (|| {
        Ok::<_, String>((
            arg("--port", 9000)?,
            Delays {
                stt: Duration::from_millis(arg("--stt-ms", 150)?),
                llm: Duration::from_millis(arg("--llm-ms", 300)?),
                tts: Duration::from_millis(arg("--tts-ms", 100)?),
            },
        ))
    })();
    let (port, delays) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let Ok(port) = u16::try_from(port) else {
        eprintln!("error: --port {port} is not a port");
        std::process::exit(2);
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (_stand_ins, addr, server) = match StandIns::serve(addr, delays, Protocol::Openai).await {
        Ok(served) => served,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "Deepgram, OpenAI-compatible and Cartesia stand-ins on {addr} (final after {:?}, first \
         token after {:?}, first audio after {:?}). Point a bot at them:\n\
         DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://{addr} CARTESIA_API_KEY=local \
         CARTESIA_URL=ws://{addr} OPENAI_API_KEY=local OPENAI_BASE_URL=http://{addr}/v1",
        delays.stt, delays.llm, delays.tts
    );
    tokio::select! {
        _ = server => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
