//! The HTTP API without a socket or models: requests go straight into the router, and every
//! error comes back in one JSON shape with the right status.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tower::ServiceExt;
use voxide::bot::{Bot, BotError, SessionInfo};
use voxide::server::{BotFactory, ServeOptions, Server};
use voxide::transports::AudioSink;

/// Bots that need no models and never get built: these requests end before a session does.
/// The one bot there is is named `front-desk`.
struct NoBots;

impl BotFactory for NoBots {
    fn preload(&self) -> Result<(), BotError> {
        Ok(())
    }

    fn find(&self, name: &str) -> Result<(), BotError> {
        match name {
            "front-desk" => Ok(()),
            _ => Err(BotError::UnknownBot {
                name: name.to_owned(),
                known: "front-desk".to_owned(),
            }),
        }
    }

    fn build(&self, _: &SessionInfo, _: u32, _: Box<dyn AudioSink>) -> Result<Bot, BotError> {
        panic!("no request here gets as far as a session's bot")
    }
}

fn server(max_sessions: usize) -> Server {
    let options = ServeOptions {
        addr: ([127, 0, 0, 1], 0).into(),
        max_sessions,
        shutdown_grace: Duration::from_secs(1),
        bots: Vec::new(),
        ice_servers: Vec::new(),
    };
    Server::new(options, Arc::new(NoBots))
}

/// The status, the `Retry-After` header and the JSON body of `request`.
async fn send(server: &Server, request: Request<Body>) -> (StatusCode, Option<String>, Value) {
    let response = server.router().oneshot(request).await.expect("an answer");
    let status = response.status();
    let retry = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().expect("ASCII").to_owned());
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("a body");
    let body = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, retry, body)
}

fn json_request(method: &str, uri: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("a request")
}

fn get(uri: &str) -> Request<Body> {
    Request::builder()
        .uri(uri)
        .body(Body::empty())
        .expect("a request")
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn readiness_is_refused_with_a_retry_until_the_models_are_in() {
    let server = server(4);
    let (status, retry, body) = send(&server, get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry.as_deref(), Some("5"));
    assert_eq!(code(&body), "not_ready", "{body}");
    server.set_ready();
    let (status, _, body) = send(&server, get("/readyz")).await;
    assert_eq!((status, body), (StatusCode::OK, json!("ready")));
}

#[tokio::test]
async fn malformed_offers_are_bad_requests_in_the_json_shape() {
    let server = server(4);
    server.set_ready();
    for body in [
        "{not json",
        r#"{"type": "offer"}"#,
        r#"{"sdp": "v=0", "type": "answer"}"#,
    ] {
        let (status, _, answer) = send(&server, json_request("POST", "/api/offer", body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(code(&answer), "bad_request", "{body}: {answer}");
        assert!(
            !answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
        );
    }
}

#[tokio::test]
async fn a_connection_that_does_not_exist_is_not_found() {
    let server = server(4);
    server.set_ready();
    let patch = r#"{"pc_id": "pc-missing", "candidates": []}"#;
    let (status, _, body) = send(&server, json_request("PATCH", "/api/offer", patch)).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let renegotiate = r#"{"sdp": "v=0", "type": "offer", "pc_id": "pc-missing"}"#;
    let (status, _, body) = send(&server, json_request("POST", "/api/offer", renegotiate)).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
}

#[tokio::test]
async fn a_full_server_refuses_with_a_retry_and_a_draining_one_without() {
    let full = server(0);
    full.set_ready();
    let offer = r#"{"sdp": "v=0", "type": "offer"}"#;
    let (status, retry, body) = send(&full, json_request("POST", "/api/offer", offer)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "at_capacity")
    );
    assert_eq!(retry.as_deref(), Some("5"));

    let draining = server(4);
    draining.set_ready();
    draining.drain(Duration::ZERO).await;
    let (status, retry, body) = send(&draining, json_request("POST", "/api/offer", offer)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
    assert_eq!(retry, None);
    let (status, _, body) = send(&draining, get("/readyz")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
}

#[tokio::test]
async fn a_websocket_route_asked_without_an_upgrade_or_with_odd_rates_says_why_in_json() {
    let server = server(4);
    server.set_ready();
    let (status, _, body) = send(&server, get("/ws")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{body}"
    );
    let (status, _, body) = send(&server, get("/ws?sample_rate=loud")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{body}"
    );
}

#[tokio::test]
async fn status_reports_the_limits_as_json() {
    let server = server(7);
    let (status, _, body) = send(&server, get("/status")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["max_sessions"], 7);
    assert_eq!(body["ready"], false);
    assert_eq!(body["sessions"], 0);
}

#[tokio::test]
async fn a_client_asking_for_a_bot_the_server_lacks_is_told_which_it_has() {
    let server = server(4);
    server.set_ready();
    for request in [
        json_request("POST", "/start", r#"{"body": {"bot": "night-desk"}}"#),
        json_request(
            "POST",
            "/start",
            r#"{"requestData": {"bot": "night-desk"}}"#,
        ),
        json_request(
            "POST",
            "/api/offer",
            r#"{"sdp": "v=0", "type": "offer", "requestData": {"bot": "night-desk"}}"#,
        ),
        get("/ws?bot=night-desk"),
        get("/ws/twilio?bot=night-desk"),
    ] {
        let uri = request.uri().clone();
        let (status, _, body) = send(&server, request).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {body}");
        assert_eq!(code(&body), "not_found");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("night-desk") && message.contains("front-desk"),
            "{uri}: {message}"
        );
    }
}

#[tokio::test]
async fn start_takes_pipecats_body_and_refuses_one_it_cannot_read() {
    let server = server(4);
    server.set_ready();
    let (status, _, body) = send(
        &server,
        json_request(
            "POST",
            "/start",
            r#"{"body": {"bot": "front-desk", "caller": "+15550100"}}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["sessionId"].as_str().is_some_and(|id| !id.is_empty()));
    let (status, _, body) = send(&server, json_request("POST", "/start", "")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an empty body is a plain start: {body}"
    );
    let (status, _, body) = send(&server, json_request("POST", "/start", "{\"body\": ")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(code(&body), "bad_request");
}
