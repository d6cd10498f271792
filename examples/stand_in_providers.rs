//! Local stand-ins of Deepgram (live transcription), an OpenAI-compatible chat stream and
//! Cartesia (streaming TTS) on one port, each answering after a realistic delay: the STT's final
//! 150 ms after the finalize, the first token 300 ms after the request, the first audio 100 ms
//! after the first text. They speak the providers' wire protocols, so a bot that uses those
//! providers (voxide's, or pipecat's `DeepgramSTTService`, `OpenAILLMService` and
//! `CartesiaTTSService` pointed at them) runs whole without a key or the network, for load tests
//! and side-by-side comparisons. Offered the tool `lookup_order`, the chat stream calls it once a
//! conversation, and `POST /tools/lookup_order` answers it 300 ms later.
//!
//! `--faults RATE` makes them fail on purpose, each kind at that rate: a Deepgram or Cartesia
//! socket dropped at a finalize or a new context, a first token `--late-ms` late (past the
//! client's deadline), a chat request or a socket's upgrade answered 429, 500 or 503 (`--seed`
//! repeats a run). `GET /stand-in/stats` says what failed, and whether every final was answered
//! exactly once and every finished tool result reached the model.
//!
//! `--stt-whisper` makes Deepgram's finals what the embedded Whisper hears (its model from
//! `scripts/setup.sh`), so that two bots' transports can be scored on the words (a network's
//! loss, a room's noise) behind the same recogniser.
//!
//! `--long-answers N` makes every answer a story of N words, spoken a quarter second a word,
//! long enough for a user to talk over (`scripts/backchannels.py --stand-ins`).
//!
//! ```bash
//! cargo run --release --example stand_in_providers -- [--port 9000] [--stt-ms 150] [--llm-ms 300] [--tts-ms 100] \
//!     [--faults 0.01] [--late-ms 6000] [--seed 1] [--stt-whisper] [--long-answers 30]
//! DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://127.0.0.1:9000 \
//! CARTESIA_API_KEY=local CARTESIA_URL=ws://127.0.0.1:9000 \
//! OPENAI_API_KEY=local OPENAI_BASE_URL=http://127.0.0.1:9000/v1 \
//!   voxide serve --stt deepgram --llm openai --tts cartesia
//! ```

use std::time::Duration;

use voxide::bench::providers::Protocol;
use voxide::bench::providers::stand_ins::{Delays, Faults, Options, StandIns};

/// The value after `flag`, or `default`.
fn arg<T: std::str::FromStr>(flag: &str, default: T) -> Result<T, String> {
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
        let rate: f64 = arg("--faults", 0.0)?;
        if !(0.0..=1.0).contains(&rate) {
            return Err("--faults takes a share between 0 and 1".into());
        }
        Ok::<_, String>((
            arg("--port", 9000u64)?,
            Delays {
                stt: Duration::from_millis(arg("--stt-ms", 150)?),
                llm: Duration::from_millis(arg("--llm-ms", 300)?),
                tts: Duration::from_millis(arg("--tts-ms", 100)?),
            },
            Faults {
                rate,
                late: Duration::from_millis(arg("--late-ms", 6_000)?),
                seed: arg("--seed", 1)?,
            },
            match arg("--long-answers", 0usize)? {
                0 => None,
                words => Some(words),
            },
        ))
    })();
    let (port, delays, faults, long_answers) = match parsed {
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
    let hearing = if std::env::args().any(|a| a == "--stt-whisper") {
        match voxide::stt::whisper::Whisper::shared() {
            Ok(whisper) => Some(whisper),
            Err(e) => {
                eprintln!("error: --stt-whisper: {e}");
                std::process::exit(1);
            }
        }
    } else {
        None
    };
    let options = Options {
        hearing,
        long_answers,
    };
    let (_stand_ins, addr, server) =
        match StandIns::serve_with(addr, delays, (Protocol::Openai, faults), options).await {
            Ok(served) => served,
            Err(e) => {
                eprintln!("error: cannot listen on {addr}: {e}");
                std::process::exit(1);
            }
        };
    println!(
        "Deepgram, OpenAI-compatible and Cartesia stand-ins on {addr} (final after {:?}, first \
         token after {:?}, first audio after {:?}, faults at {}). Point a bot at them:\n\
         DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://{addr} CARTESIA_API_KEY=local \
         CARTESIA_URL=ws://{addr} OPENAI_API_KEY=local OPENAI_BASE_URL=http://{addr}/v1",
        delays.stt, delays.llm, delays.tts, faults.rate
    );
    tokio::select! {
        _ = server => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
