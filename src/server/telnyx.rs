//! Telnyx's Call Control API, for what a Telnyx media stream cannot do by itself: handing the
//! call over (`POST /v2/calls/{call_control_id}/actions/transfer`, the API key as a bearer
//! token). The call's id is the one its stream's `start` named; the destination is one the bot
//! file's `[transfer]` names. Every address voxide reaches here is the operator's
//! (`--telnyx-api-url`).

use serde::Deserialize;

use super::carrier_api::{self, AnswerError};
use crate::secret::Secret;

/// Telnyx's API.
pub const DEFAULT_API: &str = "https://api.telnyx.com";

/// The most characters of a call control id: Telnyx's are `v3:` and some 80 more.
const MOST_ID: usize = 256;

/// Hands over calls through one Telnyx account.
pub(crate) struct CallControl {
    api: String,
    key: Secret,
    client: reqwest::Client,
}

/// Why Telnyx did not hand a call over.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransferError {
    /// Telnyx refused the command: the call has ended, the number is not one it can dial, the
    /// key is not the account's.
    #[error("Telnyx refused the transfer ({status}): {detail}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// Telnyx's first error's title and detail.
        detail: String,
    },
    /// Not a call control id voxide would put in a path.
    #[error("not a call control id: {0:.40?}")]
    NotAnId(String),
    /// Telnyx could not be reached, or failed.
    #[error("Telnyx's API did not answer: {0}")]
    Unreachable(String),
}

/// Telnyx's errors (the fields voxide reads).
#[derive(Debug, Default, Deserialize)]
struct Errors {
    #[serde(default)]
    errors: Vec<ErrorEntry>,
}

#[derive(Debug, Deserialize)]
struct ErrorEntry {
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: String,
}

impl CallControl {
    /// Call control for the account whose API key is `key`, at `api` ([`DEFAULT_API`] unless
    /// given).
    pub(crate) fn new(key: Secret, api: Option<&str>) -> Option<Self> {
        Some(Self {
            api: api.unwrap_or(DEFAULT_API).trim_end_matches('/').to_owned(),
            key,
            client: carrier_api::client()?,
        })
    }

    /// Hands call `call_control_id` over to `to`: an E.164 number or a `sip:` URI.
    pub(crate) async fn transfer(
        &self,
        call_control_id: &str,
        to: &str,
    ) -> Result<(), TransferError> {
        if !is_call_control_id(call_control_id) {
            return Err(TransferError::NotAnId(call_control_id.to_owned()));
        }
        let url = format!("{}/v2/calls/{call_control_id}/actions/transfer", self.api);
        let response = self
            .client
            .post(url)
            .bearer_auth(self.key.expose())
            .json(&serde_json::json!({ "to": to }))
            .send()
            .await
            .map_err(|e| TransferError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        let body = carrier_api::bounded_answer(response)
            .await
            .map_err(|e| match e {
                AnswerError::Broken(why) => TransferError::Unreachable(why),
                AnswerError::TooLong => TransferError::Unreachable(e.to_string()),
            })?;
        if status.is_success() {
            return Ok(());
        }
        let errors: Errors = serde_json::from_slice(&body).unwrap_or_default();
        let detail = match errors.errors.first() {
            Some(e) => format!("{} {}", e.title, e.detail).trim().to_owned(),
            None => String::from_utf8_lossy(&body).into_owned(),
        };
        let detail: String = detail.chars().take(300).collect();
        match status.as_u16() {
            400..=499 => Err(TransferError::Refused {
                status: status.as_u16(),
                detail,
            }),
            _ => Err(TransferError::Unreachable(format!("{status}: {detail}"))),
        }
    }
}

/// Whether `id` can be a call control id: `v3:` style, letters, digits, `-`, `_` and `:`.
fn is_call_control_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MOST_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_:".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Telnyx that answers every transfer with `status` and `body`; its URL.
    async fn telnyx_answering(status: u16, body: String) -> String {
        let answer = move || async move {
            (
                axum::http::StatusCode::from_u16(status).expect("a status"),
                body.clone(),
            )
        };
        let app = axum::Router::new().route(
            "/v2/calls/{id}/actions/transfer",
            axum::routing::post(answer),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("an address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_refusal_carries_telnyx_words_and_an_endless_answer_is_cut_off() {
        let refused = r#"{"errors": [{"code": "90018", "title": "Call has already ended",
            "detail": "This call is no longer active and can't receive commands."}]}"#;
        let api = telnyx_answering(422, refused.into()).await;
        let telnyx = CallControl::new("k".into(), Some(&api)).expect("a client");
        let e = telnyx
            .transfer("v3:x", "+15550001111")
            .await
            .expect_err("refused");
        assert!(
            matches!(&e, TransferError::Refused { status: 422, detail } if detail.contains("already ended")),
            "{e}"
        );
        let api = telnyx_answering(200, "x".repeat(carrier_api::MOST_ANSWER + 1)).await;
        let telnyx = CallControl::new("k".into(), Some(&api)).expect("a client");
        let e = telnyx
            .transfer("v3:x", "+15550001111")
            .await
            .expect_err("too long");
        assert!(matches!(e, TransferError::Unreachable(_)), "{e}");
        // A call control id that is not one never reaches the API.
        let e = telnyx
            .transfer("../x", "+15550001111")
            .await
            .expect_err("not an id");
        assert!(matches!(e, TransferError::NotAnId(_)), "{e}");
    }

    #[test]
    fn only_a_call_control_id_goes_into_the_path() {
        assert!(is_call_control_id(
            "v3:MdI91X4lWFEs7IgbBEOT9M4AigoY08M0WWZFISt1Yw2axZ_IiE4pqg"
        ));
        for bad in [
            "",
            "v3:../../calls",
            "a/b",
            "a?b=c",
            "a b",
            &"x".repeat(300),
        ] {
            assert!(!is_call_control_id(bad), "{bad:?}");
        }
    }
}
