//! `voxide report`: one recorded session as one HTML page.

use std::path::PathBuf;

use anyhow::{Context, Result};
use voxide::observe::journal::Journal;
use voxide::observe::report;

/// Transcripts larger than this are not a session's (a day of turns is under 20 MB).
const MAX_TRANSCRIPT: u64 = 64 << 20;

/// `voxide report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// The session's transcript, as `voxide serve --record-dir` wrote it; its stereo
    /// recording is read from beside it.
    transcript: PathBuf,
    /// Where the page goes (default: beside the transcript, `.html`).
    #[arg(long)]
    out: Option<PathBuf>,
}

impl ReportArgs {
    /// Writes the page; prints where.
    pub fn run(self) -> Result<()> {
        let size = std::fs::metadata(&self.transcript)
            .with_context(|| format!("cannot read {}", self.transcript.display()))?
            .len();
        if size > MAX_TRANSCRIPT {
            anyhow::bail!(
                "{} is {size} bytes: more than a session's transcript",
                self.transcript.display()
            );
        }
        let text = std::fs::read_to_string(&self.transcript)
            .with_context(|| format!("cannot read {}", self.transcript.display()))?;
        let journal: Journal = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a voxide session transcript",
                self.transcript.display()
            )
        })?;
        let audio_name = journal.audio.clone();
        let audio = match &audio_name {
            Some(name) => {
                let path = self.transcript.with_file_name(name);
                match voxide::audio::wav::read(&path) {
                    Ok(wav) => Some(wav),
                    Err(e) => {
                        eprintln!("voxide report: no waveforms: {e}");
                        None
                    }
                }
            }
            None => None,
        };
        let page = report::render(&journal, audio.as_ref(), audio_name.as_deref());
        let out = self
            .out
            .unwrap_or_else(|| self.transcript.with_extension("html"));
        std::fs::write(&out, page).with_context(|| format!("cannot write {}", out.display()))?;
        println!("{}", out.display());
        Ok(())
    }
}
