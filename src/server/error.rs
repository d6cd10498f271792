//! The one shape of every HTTP error the server answers with:
//! `{"error": {"code": "...", "message": "..."}}`, the right status, and `Retry-After` where
//! trying again later can work.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::transports::webrtc::WebRtcError;

/// Seconds a refused client is told to wait before it tries again.
const RETRY_AFTER_SECS: u32 = 5;

/// An HTTP error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (unreadable JSON, a wrong field, an SDP that is not an offer).
    #[error("{0}")]
    BadRequest(String),
    /// The body is over [`super::MAX_BODY_BYTES`].
    #[error("{0}")]
    TooLarge(String),
    /// It names a connection that does not exist (or no longer does).
    #[error("{0}")]
    NotFound(String),
    /// Every session slot is taken.
    #[error("the server is at its session limit ({0} live sessions); try again later")]
    Full(usize),
    /// The models are still loading.
    #[error("the server is still loading its models; try again shortly")]
    NotReady,
    /// The server is shutting down and takes no new sessions.
    #[error("the server is shutting down and takes no new sessions")]
    Draining,
    /// Something on the server's side failed.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Full(_) | Self::NotReady | Self::Draining => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable code in the body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::TooLarge(_) => "too_large",
            Self::NotFound(_) => "not_found",
            Self::Full(_) => "at_capacity",
            Self::NotReady => "not_ready",
            Self::Draining => "draining",
            Self::Internal(_) => "internal",
        }
    }

    /// Whether trying again later can work: the answer then carries `Retry-After`. A draining
    /// node does not come back; the client should go to another.
    fn retry_after(&self) -> Option<u32> {
        matches!(self, Self::Full(_) | Self::NotReady).then_some(RETRY_AFTER_SECS)
    }
}

impl From<crate::bot::BotError> for ApiError {
    fn from(e: crate::bot::BotError) -> Self {
        match e {
            crate::bot::BotError::UnknownBot { .. } => Self::NotFound(e.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::warn!(code = self.code(), error = %self, "request failed");
        }
        let body = json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut response = (self.status(), Json(body)).into_response();
        if let Some(secs) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Self::TooLarge(rejection.body_text()),
            _ => Self::BadRequest(rejection.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::BadRequest(rejection.body_text())
    }
}

impl From<WebSocketUpgradeRejection> for ApiError {
    fn from(rejection: WebSocketUpgradeRejection) -> Self {
        Self::BadRequest(rejection.body_text())
    }
}

impl From<WebRtcError> for ApiError {
    fn from(e: WebRtcError) -> Self {
        match e {
            WebRtcError::Offer(_) => Self::BadRequest(e.to_string()),
            _ => Self::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("a body");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    #[tokio::test]
    async fn every_error_is_one_json_shape_with_its_status() {
        let response = ApiError::NotFound("no connection pc-1".into()).into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            body(response).await,
            json!({"error": {"code": "not_found", "message": "no connection pc-1"}})
        );
    }

    #[tokio::test]
    async fn a_full_server_says_when_to_try_again_and_a_draining_one_does_not() {
        let full = ApiError::Full(32).into_response();
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()[header::RETRY_AFTER], "5");
        assert_eq!(body(full).await["error"]["code"], "at_capacity");
        let draining = ApiError::Draining.into_response();
        assert_eq!(draining.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(draining.headers().get(header::RETRY_AFTER).is_none());
    }
}
