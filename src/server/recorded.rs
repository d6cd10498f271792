//! What `--record-dir` kept of a session, for an operator (`/admin/sessions/{id}/…`, behind
//! the token): its report page, its stereo recording, its transcript.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use super::{ApiError, App};
use crate::observe::journal::Journal;
use crate::observe::{file_stem, report};

/// Recordings larger than this are served, but drawn without their waveforms (an hour of
/// 16 kHz stereo is 230 MB).
const MAX_DRAWN_AUDIO: u64 = 64 << 20;

/// The session's file with `extension`, when the node records and the id is one it could have
/// written.
fn recorded(app: &App, id: &str, extension: &str) -> Result<PathBuf, ApiError> {
    let dir = app
        .watchers
        .record_dir()
        .ok_or_else(|| ApiError::NotFound("this node records no sessions (--record-dir)".into()))?;
    if file_stem(id) != id {
        return Err(ApiError::NotFound(format!("no recorded session {id:.80}")));
    }
    let path = dir.join(format!("{id}.{extension}"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(ApiError::NotFound(format!(
            "no recorded session {id:.80} (it may still be running, or was not recorded)"
        )))
    }
}

async fn journal(path: PathBuf) -> Result<Journal, ApiError> {
    let text = tokio::fs::read_to_string(&path)
        .await
        .map_err(|e| ApiError::Internal(format!("cannot read a transcript: {e}")))?;
    serde_json::from_str(&text)
        .map_err(|e| ApiError::Internal(format!("a transcript does not read back: {e}")))
}

pub(crate) async fn report(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Html<String>, ApiError> {
    let journal = journal(recorded(&app, &id, "json")?).await?;
    let audio = recorded(&app, &id, "wav").ok();
    let page = tokio::task::spawn_blocking(move || {
        let wav = audio
            .filter(|path| std::fs::metadata(path).is_ok_and(|m| m.len() <= MAX_DRAWN_AUDIO))
            .and_then(|path| crate::audio::wav::read(path).ok());
        let href = journal.audio.as_ref().map(|_| "audio");
        report::render(&journal, wav.as_ref(), href)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the report failed: {e}")))?;
    Ok(Html(page))
}

pub(crate) async fn audio(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let path = recorded(&app, &id, "wav")?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| ApiError::Internal(format!("cannot read a recording: {e}")))?;
    let body = axum::body::Body::from_stream(chunks(file));
    Ok(([(header::CONTENT_TYPE, "audio/wav")], body).into_response())
}

pub(crate) async fn transcript(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<axum::Json<Journal>, ApiError> {
    Ok(axum::Json(journal(recorded(&app, &id, "json")?).await?))
}

/// A file as a stream of chunks, read as the client takes them.
fn chunks(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    use tokio::io::AsyncReadExt;
    // The state is the file until it ends or fails.
    futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buffer = vec![0u8; 64 << 10];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(n) => {
                buffer.truncate(n);
                Some((Ok(bytes::Bytes::from(buffer)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}
