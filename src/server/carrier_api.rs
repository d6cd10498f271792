//! What the carriers' REST APIs (Twilio's, Telnyx's Call Control) share: one HTTP client with
//! a short timeout and no redirects (the operator's API, never one a redirect names), and
//! answers read to a bound.

use std::time::Duration;

/// How long a carrier's API may take to answer.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of a carrier's answer voxide reads.
pub(crate) const MOST_ANSWER: usize = 64 * 1024;

/// A client for a carrier's API.
pub(crate) fn client() -> Option<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(API_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .ok()
}

/// Why a carrier's answer could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    /// The connection failed while the answer came.
    #[error("{0}")]
    Broken(String),
    /// The answer is longer than any the API gives.
    #[error("an answer over {MOST_ANSWER} bytes")]
    TooLong,
}

/// At most [`MOST_ANSWER`] bytes of `response`'s body.
pub(crate) async fn bounded_answer(
    mut response: reqwest::Response,
) -> Result<Vec<u8>, AnswerError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| AnswerError::Broken(e.without_url().to_string()))?
    {
        if body.len() + chunk.len() > MOST_ANSWER {
            return Err(AnswerError::TooLong);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
