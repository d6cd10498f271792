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
/// How often a session may restart or renegotiate its connection once its burst is spent.
pub(crate) const CHANGE_EVERY_SECS: u32 = 10;

/// An HTTP error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (unreadable JSON, a wrong field, an SDP that is not an offer).
    #[error("{0}")]
    BadRequest(String),
    /// The body is over [`super::MAX_BODY_BYTES`].
    #[error("{0}")]
    TooLarge(String),
    /// It asks for what this node does not allow (a call to an address it may not reach).
    #[error("{0}")]
    Forbidden(String),
    /// It names a connection that does not exist (or no longer does).
    #[error("{0}")]
    NotFound(String),
    /// Every session slot is taken.
    #[error("the server is at its session limit ({0} live sessions); try again later")]
    Full(usize),
    /// The models are still loading.
    #[error("the server is still loading its models; try again shortly")]
    NotReady,
    /// The server is draining (shutting down) and takes no new sessions; another node may.
    #[error(
        "this node is draining and takes no new sessions; try again (another node will take it)"
    )]
    Draining,
    /// The request needs a token it did not carry, or carried a wrong one.
    #[error(
        "a valid token is needed: `Authorization: Bearer <token>` (or `?token=` on a WebSocket)"
    )]
    Unauthorized,
    /// This client opened sessions faster than the per-address limit allows.
    #[error("too many new sessions from {0}; try again shortly")]
    RateLimited(String),
    /// A session asked for something (a restart, a renegotiation) faster than it may.
    #[error("{0}; try again shortly")]
    TooOften(String),
    /// The request is for another node that this one does not know.
    #[error(
        "the session lives on node {node:?}, which this node cannot find (--peers, --peer-url)"
    )]
    UnknownNode {
        /// The owner's id.
        node: String,
    },
    /// The request is for another node that did not answer.
    #[error("the session lives on node {node:?}, which did not answer: {why}")]
    NodeUnreachable {
        /// The owner's id.
        node: String,
        /// What went wrong.
        why: String,
    },
    /// A carrier voxide asked on the request's behalf failed or could not be reached.
    #[error("{0}")]
    Upstream(String),
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
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Full(_) | Self::NotReady | Self::Draining => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::RateLimited(_) | Self::TooOften(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::UnknownNode { .. } | Self::NodeUnreachable { .. } | Self::Upstream(_) => {
                StatusCode::BAD_GATEWAY
            }
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable code in the body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::TooLarge(_) => "too_large",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound(_) => "not_found",
            Self::Full(_) => "at_capacity",
            Self::NotReady => "not_ready",
            Self::Draining => "draining",
            Self::Unauthorized => "unauthorized",
            Self::RateLimited(_) | Self::TooOften(_) => "rate_limited",
            Self::UnknownNode { .. } => "unknown_node",
            Self::NodeUnreachable { .. } => "node_unreachable",
            Self::Upstream(_) => "upstream",
            Self::Internal(_) => "internal",
        }
    }

    /// The message a client reads: the server's own failures and an unreachable node's
    /// reason (an internal address, a backend's answer) stay in the log.
    fn public_message(&self) -> String {
        match self {
            Self::Internal(_) => {
                "the server could not handle this request; its log has the detail".to_owned()
            }
            Self::NodeUnreachable { node, .. } => {
                format!("the session lives on node {node:?}, which did not answer")
            }
            other => other.to_string(),
        }
    }

    /// Whether trying again later can work: the answer then carries `Retry-After`. A draining
    /// node's load balancer sends the retry to another node.
    fn retry_after(&self) -> Option<u32> {
        match self {
            Self::Full(_) | Self::NotReady | Self::RateLimited(_) => Some(RETRY_AFTER_SECS),
            Self::TooOften(_) => Some(CHANGE_EVERY_SECS),
            Self::Draining => Some(1),
            _ => None,
        }
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
        let body = json!({"error": {"code": self.code(), "message": self.public_message()}});
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
            WebRtcError::Offer(_) | WebRtcError::Candidate(_) => Self::BadRequest(e.to_string()),
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
    async fn a_full_or_draining_server_says_when_to_try_again() {
        let full = ApiError::Full(32).into_response();
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()[header::RETRY_AFTER], "5");
        assert_eq!(body(full).await["error"]["code"], "at_capacity");
        let draining = ApiError::Draining.into_response();
        assert_eq!(draining.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(draining.headers()[header::RETRY_AFTER], "1");
        let gone = ApiError::NotFound("no connection".into()).into_response();
        assert!(gone.headers().get(header::RETRY_AFTER).is_none());
    }
}
