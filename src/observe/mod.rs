//! Seeing a conversation afterwards: its journal (turns and their timings), a stereo
//! recording with a JSON transcript, an OpenTelemetry trace, and a report page.
//!
//! A server makes one [`Watchers`] from its flags; each session gets a [`SessionWatch`]
//! that taps its audio (when recording), folds its events into a [`journal::Journal`] and,
//! as turns settle, hands their spans to the trace exporter. Nothing here can hold a call
//! up: audio and spans go through bounded queues whose losses are counted, and a recording
//! that cannot be written is an error event while the call goes on.

pub mod journal;
pub mod recording;
pub mod report;
pub mod trace;
pub mod upload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use crate::audio::AudioSink;
use crate::events::{Event, ReportLevel, SessionEvent};
use crate::pipeline::SessionHandle;
use journal::{Journal, JournalBuilder};
use recording::{Recorder, RecordingDone};
use trace::{Exporter, TraceBuilder, TraceId};

/// What recording and tracing did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ObserveCounts {
    /// Recordings written whole.
    pub recordings_written: AtomicU64,
    /// Recordings that could not be started or finished.
    pub recordings_failed: AtomicU64,
    /// Audio chunks a recording lost (its writer fell behind or failed).
    pub recording_chunks_dropped: AtomicU64,
    /// Recordings uploaded whole (`--record-url`).
    pub uploads_done: AtomicU64,
    /// Recordings whose upload failed (their files stay in the folder).
    pub uploads_failed: AtomicU64,
}

/// Where finished recordings are uploaded, and whether their local copies go once they are.
#[derive(Debug, Clone)]
pub struct Uploads {
    target: Arc<upload::S3Target>,
    client: reqwest::Client,
    keep_local: bool,
}

impl Uploads {
    /// Uploads to `target`; `keep_local`: the files stay in the folder after.
    pub fn new(target: upload::S3Target, keep_local: bool) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            target: Arc::new(target),
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            keep_local,
        }
    }

    /// Uploads a session's recording and transcript; counts how it went.
    async fn send(&self, files: [(PathBuf, &'static str); 2], counts: &ObserveCounts) {
        for (path, content_type) in &files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Err(e) = self
                .target
                .put(&self.client, path, &name, content_type)
                .await
            {
                tracing::warn!("a recording's upload failed (its files stay in the folder): {e}");
                counts.uploads_failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        counts.uploads_done.fetch_add(1, Ordering::Relaxed);
        if !self.keep_local {
            for (path, _) in &files {
                let _ = tokio::fs::remove_file(path).await;
            }
        }
    }
}

/// A server's recording and tracing.
#[derive(Clone, Default)]
pub struct Watchers {
    record_dir: Option<PathBuf>,
    uploads: Option<Uploads>,
    exporter: Option<Arc<Exporter>>,
    counts: Arc<ObserveCounts>,
}

/// What one session is: the facts a watch needs.
#[derive(Debug, Clone)]
pub struct Watched<'a> {
    /// Its id.
    pub id: &'a str,
    /// The bot's name, where the client named one.
    pub bot: Option<&'a str>,
    /// `websocket`, `twilio`, `webrtc`.
    pub transport: &'a str,
    /// What tool calls may show.
    pub level: ReportLevel,
    /// Whether the caller allows a recording (`"record": false` in what it sent refuses).
    pub consent: bool,
    /// The caller's W3C `traceparent`: the session's trace is then the caller's, under its
    /// span, traced as the caller sampled it.
    pub traceparent: Option<&'a str>,
    /// Whether its bot may be recorded and traced (a bot file's `record` and `trace`).
    pub bot_allows: (bool, bool),
}

impl Watchers {
    /// Recording into `record_dir` (none: no recordings), tracing to `exporter`.
    pub fn new(
        record_dir: Option<PathBuf>,
        exporter: Option<Arc<Exporter>>,
        counts: Arc<ObserveCounts>,
    ) -> Self {
        Self {
            record_dir,
            uploads: None,
            exporter,
            counts,
        }
    }

    /// Uploads each finished recording too.
    pub fn uploading(mut self, uploads: Option<Uploads>) -> Self {
        self.uploads = uploads;
        self
    }

    /// Where recordings go.
    pub fn record_dir(&self) -> Option<&Path> {
        self.record_dir.as_deref()
    }

    /// A watch over one session.
    pub fn watch(&self, session: &Watched<'_>) -> SessionWatch {
        let journal =
            JournalBuilder::new(session.id, session.transport, session.level).bot(session.bot);
        let (may_record, may_trace) = session.bot_allows;
        let mut watch = SessionWatch {
            journal,
            recording: None,
            refused: None,
            trace: None,
            uploads: self.uploads.clone(),
            counts: self.counts.clone(),
        };
        if let Some(dir) = self
            .record_dir
            .as_deref()
            .filter(|_| may_record && session.consent)
        {
            let name = file_stem(session.id);
            let audio = dir.join(format!("{name}.wav"));
            match Recorder::create(&audio) {
                Ok((recorder, mut done)) => {
                    watch.journal.set_audio(&format!("{name}.wav"));
                    watch.recording = Some(Recording {
                        recorder,
                        failure: done.failure(),
                        done,
                        transcript: dir.join(format!("{name}.json")),
                    });
                }
                Err(e) => {
                    self.counts
                        .recordings_failed
                        .fetch_add(1, Ordering::Relaxed);
                    watch.refused = Some(format!(
                        "cannot record this session into {}: {e}",
                        audio.display()
                    ));
                }
            }
        }
        if let Some(exporter) = self.exporter.clone().filter(|_| may_trace) {
            // The caller's decision where it made one (OpenTelemetry's parent-based sampling),
            // else the ratio's.
            let (builder, sampled) = match session.traceparent.and_then(trace::parse_traceparent) {
                Some((id, parent, sampled)) => (TraceBuilder::new(id).with_parent(parent), sampled),
                None => {
                    let id = TraceId::random();
                    (TraceBuilder::new(id), id.sampled(exporter.options().sample))
                }
            };
            if sampled {
                watch.journal.set_trace(&builder.id().hex());
                watch.trace = Some((builder, exporter));
            }
        }
        watch
    }
}

/// A session id as a file name: letters, digits, `-` and `_` only (the rest become `_`).
pub fn file_stem(id: &str) -> String {
    let stem: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    if stem.is_empty() {
        "session".into()
    } else {
        stem
    }
}

struct Recording {
    recorder: Recorder,
    /// Says why the file stopped being written, the moment it does.
    failure: Option<tokio::sync::oneshot::Receiver<String>>,
    done: RecordingDone,
    transcript: PathBuf,
}

/// One session's journal, recording and trace.
pub struct SessionWatch {
    journal: JournalBuilder,
    recording: Option<Recording>,
    /// Why the session could not be recorded.
    refused: Option<String>,
    trace: Option<(TraceBuilder, Arc<Exporter>)>,
    uploads: Option<Uploads>,
    counts: Arc<ObserveCounts>,
}

impl SessionWatch {
    /// The bot's audio sink, recording what it plays when the session is recorded.
    pub fn sink(&self, sink: Box<dyn AudioSink>) -> Box<dyn AudioSink> {
        match &self.recording {
            Some(recording) => Box::new(recording.recorder.bot_tap(sink)),
            None => sink,
        }
    }

    /// Whether the session is recorded.
    pub fn recorded(&self) -> bool {
        self.recording.is_some()
    }

    /// The observer that records the user's audio, when the session is recorded.
    pub fn observer(&self) -> Option<Arc<dyn crate::pipeline::Observer>> {
        self.recording
            .as_ref()
            .map(|r| Arc::new(r.recorder.user_tap()) as Arc<dyn crate::pipeline::Observer>)
    }

    /// Keeps tool calls as a client at `level` would see them (the bot's report level, known
    /// once it is built).
    pub fn report_level(&mut self, level: ReportLevel) {
        self.journal.report_level(level);
    }

    /// The session's trace id, when it is traced.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.trace.as_ref().map(|(trace, _)| trace.id())
    }

    /// Follows the session from its start (call it as it is spawned) to its end: folds its
    /// events, exports settled turns' spans, and at the end finishes the recording, writes
    /// the transcript and exports the rest. Returns the journal (empty for a session neither
    /// recorded nor traced, whose events it does not fold).
    pub async fn follow(
        mut self,
        mut events: broadcast::Receiver<SessionEvent>,
        handle: SessionHandle,
    ) -> Journal {
        // Neither recorded nor traced: nothing to fold the events into.
        if self.recording.is_none() && self.trace.is_none() && self.refused.is_none() {
            return self.journal.finish();
        }
        if let Some(recording) = &self.recording {
            recording.recorder.start_clock();
        }
        if let Some(reason) = self.refused.take() {
            tracing::warn!("{reason}");
            handle.emit(recording_error(reason));
        }
        let mut failure = self.recording.as_mut().and_then(|r| r.failure.take());
        loop {
            let received = tokio::select! {
                received = events.recv() => received,
                reason = async { failure.as_mut().expect("guarded").await }, if failure.is_some() => {
                    failure = None;
                    // An error closes the channel without a word when the file was finished.
                    if let Ok(reason) = reason {
                        tracing::warn!("the recording stopped: {reason}");
                        handle.emit(recording_error(format!("the recording stopped: {reason}")));
                    }
                    continue;
                }
            };
            match received {
                Ok(event) => {
                    let ended = matches!(event.event, Event::SessionEnded { .. });
                    self.journal.observe(&event);
                    if let Some((trace, exporter)) = &mut self.trace {
                        exporter.export(trace.settled(self.journal.journal()));
                    }
                    if ended {
                        break;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
        self.finish().await
    }

    async fn finish(self) -> Journal {
        let SessionWatch {
            journal,
            recording,
            trace,
            uploads,
            counts,
            ..
        } = self;
        let journal = journal.finish();
        if let Some((mut trace, exporter)) = trace {
            exporter.export(trace.finish(&journal));
        }
        if let Some(Recording {
            recorder,
            done,
            transcript,
            ..
        }) = recording
        {
            counts
                .recording_chunks_dropped
                .fetch_add(recorder.dropped(), Ordering::Relaxed);
            drop(recorder);
            let audio = done.wait().await;
            let written = match audio {
                Ok(audio) => write_transcript(&transcript, &journal)
                    .await
                    .map(|()| audio),
                Err(e) => Err(e),
            };
            match written {
                Ok(audio) => {
                    counts.recordings_written.fetch_add(1, Ordering::Relaxed);
                    // The session is over: the upload holds up nothing.
                    if let Some(uploads) = uploads {
                        let counts = counts.clone();
                        tokio::spawn(async move {
                            let files = [(audio, "audio/wav"), (transcript, "application/json")];
                            uploads.send(files, &counts).await;
                        });
                    }
                }
                Err(e) => {
                    tracing::warn!(session = %journal.session, "the recording failed: {e}");
                    counts.recordings_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        journal
    }
}

fn recording_error(message: String) -> Event {
    Event::Error {
        message,
        fatal: false,
        processor: Some("recorder".into()),
    }
}

/// Writes the transcript whole or not at all (a reader never sees half of one).
async fn write_transcript(path: &Path, journal: &Journal) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(journal).map_err(|e| e.to_string())?;
    let partial = path.with_extension("json.partial");
    tokio::fs::write(&partial, text)
        .await
        .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
    tokio::fs::rename(&partial, path)
        .await
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_becomes_a_safe_file_name() {
        assert_eq!(file_stem("ws-0011aabb"), "ws-0011aabb");
        assert_eq!(file_stem("../../etc/passwd"), "______etc_passwd");
        assert_eq!(file_stem(""), "session");
    }
}
