//! The HTTP API without models: requests go straight into the router (a node that forwards to
//! another reaches it on a socket), and every error comes back in one JSON shape with the right
//! status.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tower::ServiceExt;
use voxide::bot::{Bot, BotError, SessionInfo};
use voxide::server::{AccessOptions, BotFactory, Peers, ServeOptions, Server};
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
        max_sessions,
        drain_timeout: Duration::from_secs(1),
        node_id: "test".parse().expect("a node id"),
        ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
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
async fn a_full_or_draining_server_refuses_new_sessions_with_a_retry() {
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
    let (status, _, body) = send(&draining, json_request("POST", "/admin/drain", "")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["draining"], true);
    let (status, retry, body) = send(&draining, json_request("POST", "/api/offer", offer)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
    assert_eq!(
        retry.as_deref(),
        Some("1"),
        "the balancer tries another node"
    );
    let (status, _, body) = send(&draining, get("/readyz")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
    let (_, _, metrics) = send(&draining, get("/metrics")).await;
    let metrics = metrics.as_str().expect("text");
    assert!(metrics.contains("\nvoxide_draining 1\n"), "{metrics}");
    assert!(
        metrics.contains("\nvoxide_session_capacity 4\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nvoxide_active_sessions 0\n"),
        "{metrics}"
    );
}

/// A node named `node`, knowing `peers`, serving on a socket of its own; its address.
async fn node_on_a_socket(node: &str, peers: Peers) -> (Server, std::net::SocketAddr) {
    let options = ServeOptions {
        node_id: node.parse().expect("a node id"),
        peers,
        ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
    };
    let server = Server::new(options, Arc::new(NoBots));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let router = server.router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (server, addr)
}

/// A node `n1` that knows `n2` at `n2`'s address, and `n3` at a port nobody listens on.
async fn two_nodes() -> Server {
    let (_n2, n2) = node_on_a_socket("n2", Peers::default()).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let dead_addr = dead.local_addr().expect("an address");
    drop(dead);
    let known =
        Peers::parse_list(&format!("n2=http://{n2},n3=http://{dead_addr}")).expect("a peer list");
    // The second node lives as long as the test: its task holds its router.
    let n1 = Server::new(
        ServeOptions {
            node_id: "n1".parse().expect("a node id"),
            peers: Peers {
                known,
                ..Peers::default()
            },
            ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
        },
        Arc::new(NoBots),
    );
    n1.set_ready();
    n1
}

async fn answering_node(server: &Server, request: Request<Body>) -> (StatusCode, String, Value) {
    let response = server.router().oneshot(request).await.expect("an answer");
    let status = response.status();
    let node = response.headers()["x-voxide-node"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("a body");
    (
        status,
        node,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn every_answer_names_its_node_and_ids_carry_it() {
    let server = server(4);
    server.set_ready();
    let (_, node, _) = answering_node(&server, get("/healthz")).await;
    assert_eq!(node, "test");
    let (status, node, body) = answering_node(&server, json_request("POST", "/start", "")).await;
    assert_eq!((status, node.as_str()), (StatusCode::OK, "test"));
    let id = body["sessionId"].as_str().expect("a session id");
    assert!(
        id.starts_with("test.") && id.len() == "test.".len() + 36,
        "{id}"
    );
}

#[tokio::test]
async fn a_request_for_another_nodes_connection_is_answered_by_that_node() {
    let n1 = two_nodes().await;
    let trickle = r#"{"pc_id": "n2.0000", "candidates": []}"#;
    let (status, node, body) =
        answering_node(&n1, json_request("PATCH", "/api/offer", trickle)).await;
    assert_eq!(node, "n2", "{body}");
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("n2.0000")
    );
    // A session another node's /start began: its offer goes there, which knows no such
    // start.
    let offer = r#"{"sdp": "v=0", "type": "offer"}"#;
    let request = json_request("POST", "/sessions/n2.0000/api/offer", offer);
    let (status, node, body) = answering_node(&n1, request).await;
    assert_eq!(node, "n2");
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "not_found"),
        "{body}"
    );
    // Its own: answered here.
    let trickle = r#"{"pc_id": "n1.0000", "candidates": []}"#;
    let (status, node, _) = answering_node(&n1, json_request("PATCH", "/api/offer", trickle)).await;
    assert_eq!((status, node.as_str()), (StatusCode::NOT_FOUND, "n1"));
}

#[tokio::test]
async fn a_request_for_an_unknown_or_dead_node_is_a_bad_gateway_not_a_404() {
    let n1 = two_nodes().await;
    for (pc_id, why) in [("n9.0000", "unknown_node"), ("n3.0000", "node_unreachable")] {
        let trickle = format!(r#"{{"pc_id": "{pc_id}", "candidates": []}}"#);
        let (status, node, body) =
            answering_node(&n1, json_request("PATCH", "/api/offer", &trickle)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_GATEWAY, why),
            "{body}"
        );
        assert_eq!(node, "n1");
    }
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

#[tokio::test]
async fn the_bots_a_client_may_ask_for_are_listed_and_recordings_are_not_found_where_none_are_kept()
{
    let server = server(1);
    let (status, _, body) = send(&server, get("/bots")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"bots": []}), "one unnamed bot");
    let (status, _, body) = send(&server, get("/admin/sessions/ws-1/report")).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
}

fn guarded_server(access: AccessOptions) -> Server {
    let options = ServeOptions {
        node_id: "test".parse().expect("a node id"),
        access,
        ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
    };
    let server = Server::new(options, Arc::new(NoBots));
    server.set_ready();
    server
}

fn with_header(mut request: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    request
        .headers_mut()
        .insert(name, value.parse().expect("a header value"));
    request
}

#[tokio::test]
async fn without_the_token_every_guarded_endpoint_answers_401_and_health_stays_open() {
    let server = guarded_server(AccessOptions {
        auth_token: Some("s3cret".into()),
        ..AccessOptions::default()
    });
    let offer = r#"{"sdp": "v=0", "type": "offer"}"#;
    let guarded = || {
        [
            json_request("POST", "/start", ""),
            json_request("POST", "/api/offer", offer),
            json_request(
                "PATCH",
                "/api/offer",
                r#"{"pc_id": "test.1", "candidates": []}"#,
            ),
            json_request("POST", "/sessions/test.1/api/offer", offer),
            get("/ws"),
            get("/ws/twilio"),
            get("/bots"),
            get("/admin/sessions/ws-1/report"),
            json_request("POST", "/admin/drain", ""),
        ]
    };
    for request in guarded() {
        let uri = request.uri().clone();
        let (status, _, body) = send(&server, request).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::UNAUTHORIZED, "unauthorized"),
            "{uri}"
        );
    }
    for request in guarded() {
        let uri = request.uri().clone();
        let wrong = with_header(request, "authorization", "Bearer s3creT");
        assert_eq!(
            send(&server, wrong).await.0,
            StatusCode::UNAUTHORIZED,
            "{uri}"
        );
    }
    for request in guarded() {
        let uri = request.uri().clone();
        let right = with_header(request, "authorization", "Bearer s3cret");
        assert_ne!(
            send(&server, right).await.0,
            StatusCode::UNAUTHORIZED,
            "{uri}"
        );
    }
    // A browser's WebSocket cannot set a header: the token may come in the query.
    let (status, _, _) = send(&server, get("/ws?token=s3cret")).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "past the guard: not an upgrade"
    );
    // Open, though the node now drains (the right token asked it to).
    for open in ["/healthz", "/readyz", "/metrics", "/status"] {
        assert_ne!(
            send(&server, get(open)).await.0,
            StatusCode::UNAUTHORIZED,
            "{open}"
        );
    }
}

#[tokio::test]
async fn a_twilio_stream_may_prove_itself_by_its_signature_instead() {
    let server = guarded_server(AccessOptions {
        auth_token: Some("s3cret".into()),
        twilio_auth_token: Some("twilio-token".into()),
        public_url: Some("wss://voice.example.com".into()),
        ..AccessOptions::default()
    });
    let signature = voxide::server::access::twilio_signature(
        "twilio-token",
        "wss://voice.example.com/ws/twilio",
    );
    let signed = with_header(get("/ws/twilio"), "x-twilio-signature", &signature);
    assert_eq!(
        send(&server, signed).await.0,
        StatusCode::BAD_REQUEST,
        "past the guard"
    );
    let forged = with_header(get("/ws/twilio"), "x-twilio-signature", "AAAA");
    assert_eq!(send(&server, forged).await.0, StatusCode::UNAUTHORIZED);
    let elsewhere = with_header(get("/ws"), "x-twilio-signature", &signature);
    assert_eq!(
        send(&server, elsewhere).await.0,
        StatusCode::UNAUTHORIZED,
        "only Twilio's route"
    );
}

#[tokio::test]
async fn a_twilio_token_alone_still_requires_twilios_signature() {
    let server = guarded_server(AccessOptions {
        twilio_auth_token: Some("twilio-token".into()),
        public_url: Some("wss://voice.example.com".into()),
        ..AccessOptions::default()
    });
    assert_eq!(
        send(&server, get("/ws/twilio")).await.0,
        StatusCode::UNAUTHORIZED,
        "unsigned"
    );
    // Signed over the URL with its standard port, as some of Twilio's requests are.
    let signature = voxide::server::access::twilio_signature(
        "twilio-token",
        "wss://voice.example.com:443/ws/twilio",
    );
    let signed = with_header(get("/ws/twilio"), "x-twilio-signature", &signature);
    assert_eq!(
        send(&server, signed).await.0,
        StatusCode::BAD_REQUEST,
        "past the guard"
    );
    // The other routes stay as open as the server's own token leaves them.
    assert_eq!(
        send(&server, get("/ws")).await.0,
        StatusCode::BAD_REQUEST,
        "past the guard"
    );
}

#[tokio::test]
async fn browsers_on_an_allowed_origin_get_cors_and_others_do_not() {
    let server = guarded_server(AccessOptions {
        cors_origins: vec!["https://app.example.com".into()],
        ..AccessOptions::default()
    });
    let preflight = Request::builder()
        .method("OPTIONS")
        .uri("/api/offer")
        .header("origin", "https://app.example.com")
        .header("access-control-request-method", "PATCH")
        .body(Body::empty())
        .expect("a request");
    let response = server.router().oneshot(preflight).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let headers = response.headers();
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert!(
        headers["access-control-allow-methods"]
            .to_str()
            .unwrap_or_default()
            .contains("PATCH")
    );
    let other = with_header(get("/status"), "origin", "https://evil.example.com");
    let response = server.router().oneshot(other).await.expect("an answer");
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}

#[tokio::test]
async fn a_client_opening_sessions_in_a_loop_is_slowed_down_and_others_are_not() {
    let server = guarded_server(AccessOptions {
        sessions_per_minute: 2,
        trust_forwarded_for: true,
        ..AccessOptions::default()
    });
    let start = |ip: &str| with_header(json_request("POST", "/start", ""), "x-forwarded-for", ip);
    for _ in 0..2 {
        assert_eq!(send(&server, start("203.0.113.7")).await.0, StatusCode::OK);
    }
    let (status, retry, body) = send(&server, start("203.0.113.7")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
    );
    assert_eq!(retry.as_deref(), Some("5"));
    assert_eq!(
        send(&server, start("198.51.100.1, 203.0.113.9")).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_session_started_before_a_drain_still_gets_its_offer_taken() {
    let server = server(4);
    server.set_ready();
    let (_, _, started) = send(&server, json_request("POST", "/start", "")).await;
    let id = started["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned();
    send(&server, json_request("POST", "/admin/drain", "")).await;
    let offer = r#"{"sdp": "v=0", "type": "offer"}"#;
    let promised = format!("/sessions/{id}/api/offer");
    let (status, _, body) = send(&server, json_request("POST", &promised, offer)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "past admission, to the SDP: {body}"
    );
    // Each start's id takes one offer; an id no start minted takes none.
    let (status, _, body) = send(&server, json_request("POST", &promised, offer)).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let unknown = "/sessions/test.0000/api/offer";
    let (status, _, body) = send(&server, json_request("POST", unknown, offer)).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    // And no new start while draining.
    let (status, _, body) = send(&server, json_request("POST", "/start", "")).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
}

/// A listener that counts the connections it gets, for the probes that must reach nothing.
async fn tripwire() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((_stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (addr, hits)
}

#[tokio::test]
async fn a_pc_id_naming_an_address_is_refused_before_any_request() {
    let (listener, hits) = tripwire().await;
    let server = Server::new(
        ServeOptions {
            node_id: "n1".parse().expect("a node id"),
            peers: Peers {
                template: Some("http://{node}.voxide-nodes:7860".into()),
                ..Peers::default()
            },
            ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
        },
        Arc::new(NoBots),
    );
    server.set_ready();
    let port = listener.port();
    for pc_id in [
        format!("localhost:{port}/leak?x=.y"),
        format!("[::1]:{port}/leak?x=.y"),
        format!("localhost:{port}#.y"),
    ] {
        let trickle = json!({"pc_id": pc_id, "candidates": []}).to_string();
        let (status, _, body) = send(&server, json_request("PATCH", "/api/offer", &trickle)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "bad_request"),
            "{pc_id}: {body}"
        );
        let path = format!("/sessions/{}/api/offer", pc_id.replace('/', "%2F"));
        let offer = r#"{"sdp": "v=0", "type": "offer"}"#;
        let (status, _, _) = send(&server, json_request("POST", &path, offer)).await;
        assert!(status.is_client_error(), "{path}: {status}");
    }
    tokio::task::yield_now().await;
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_forged_forwarded_header_is_refused_and_counted_like_any_clients_request() {
    for secret in [None, Some("cluster-s3cret".into())] {
        let server = Server::new(
            ServeOptions {
                node_id: "test".parse().expect("a node id"),
                access: AccessOptions {
                    sessions_per_minute: 2,
                    trust_forwarded_for: true,
                    ..AccessOptions::default()
                },
                peers: Peers {
                    secret: secret.clone(),
                    ..Peers::default()
                },
                ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
            },
            Arc::new(NoBots),
        );
        server.set_ready();
        let mut statuses = Vec::new();
        for _ in 0..6 {
            let forged = with_header(
                json_request("POST", "/start", ""),
                "x-voxide-forwarded-by",
                "n2",
            );
            let forged = with_header(forged, "x-voxide-signature", "t=1,v1=00");
            let forged = with_header(forged, "x-forwarded-for", "203.0.113.7");
            statuses.push(send(&server, forged).await.0.as_u16());
        }
        let expected = match secret {
            // No secret: the claim is not believed, and the request counts like any other.
            None => [200, 200, 429, 429, 429, 429],
            // A secret: a false claim is refused, and still counted.
            Some(_) => [401, 401, 429, 429, 429, 429],
        };
        assert_eq!(statuses, expected, "secret: {secret:?}");
    }
}

#[tokio::test]
async fn an_offer_for_a_session_no_start_minted_counts_against_the_limit() {
    let server = guarded_server(AccessOptions {
        sessions_per_minute: 2,
        trust_forwarded_for: true,
        ..AccessOptions::default()
    });
    let offer = r#"{"sdp": "v=0", "type": "offer"}"#;
    let mut statuses = Vec::new();
    for n in 0..4 {
        let path = format!("/sessions/test.{n:04}/api/offer");
        let request = with_header(
            json_request("POST", &path, offer),
            "x-forwarded-for",
            "203.0.113.7",
        );
        statuses.push(send(&server, request).await.0.as_u16());
    }
    assert_eq!(statuses, [404, 404, 429, 429]);
}

#[tokio::test]
async fn start_keeps_at_most_16_kb_for_its_session() {
    let server = server(4);
    server.set_ready();
    let big = json!({"body": {"notes": "x".repeat(20 * 1024)}}).to_string();
    let (status, _, body) = send(&server, json_request("POST", "/start", &big)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
    );
    let fits = json!({"body": {"notes": "x".repeat(15 * 1024)}}).to_string();
    assert_eq!(
        send(&server, json_request("POST", "/start", &fits)).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn nodes_that_share_a_secret_forward_to_each_other_and_others_are_refused() {
    let secret = Some(voxide::secret::Secret::new("cluster-s3cret"));
    let with_secret = Peers {
        secret: secret.clone(),
        ..Peers::default()
    };
    let (_n2, n2) = node_on_a_socket("n2", with_secret.clone()).await;
    let node = |peers: Peers| {
        Server::new(
            ServeOptions {
                node_id: "n1".parse().expect("a node id"),
                peers,
                ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
            },
            Arc::new(NoBots),
        )
    };
    let known = Peers::parse_list(&format!("n2=http://{n2}")).expect("a peer list");
    let trickle = r#"{"pc_id": "n2.0000", "candidates": []}"#;
    // Signed: n2 takes it as forwarded and answers for its connection.
    let n1 = node(Peers {
        known: known.clone(),
        secret,
        ..Peers::default()
    });
    n1.set_ready();
    let (status, node_name, body) =
        answering_node(&n1, json_request("PATCH", "/api/offer", trickle)).await;
    assert_eq!(
        (status, node_name.as_str(), code(&body)),
        (StatusCode::NOT_FOUND, "n2", "not_found"),
        "{body}"
    );
    // A node without the secret: its claim is refused.
    let stranger = node(Peers {
        known,
        ..Peers::default()
    });
    stranger.set_ready();
    let forwarded = with_header(
        json_request("PATCH", "/api/offer", trickle),
        "x-voxide-forwarded-by",
        "n1",
    );
    let response = reqwest_free_send(n2, forwarded).await;
    assert_eq!(response, 401);
}

/// Sends `request` to a node on a socket; its status.
async fn reqwest_free_send(addr: std::net::SocketAddr, request: Request<Body>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.expect("a body");
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        parts.method,
        parts.uri,
        body.len()
    );
    for (name, value) in &parts.headers {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().expect("ASCII")));
    }
    head.push_str("\r\n");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    stream.write_all(&body).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Counts the bots asked for; builds none (a session that got this far ends at once).
#[derive(Default)]
struct CountedBots(std::sync::atomic::AtomicUsize);

impl BotFactory for CountedBots {
    fn preload(&self) -> Result<(), BotError> {
        Ok(())
    }

    fn find(&self, _: &str) -> Result<(), BotError> {
        Ok(())
    }

    fn build(&self, _: &SessionInfo, _: u32, _: Box<dyn AudioSink>) -> Result<Bot, BotError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(BotError::Config("no bot in this test".into()))
    }
}

#[tokio::test]
async fn a_websocket_client_that_leaves_at_once_or_breaks_the_limits_costs_no_bot() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let bots = Arc::new(CountedBots::default());
    let server = Server::new(
        ServeOptions {
            node_id: "test".parse().expect("a node id"),
            ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
        },
        bots.clone(),
    );
    server.set_ready();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let router = server.router();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
    });
    let url = format!("ws://{addr}/ws");
    // Opened and dropped at once, as a loop of them would.
    for _ in 0..5 {
        let (socket, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("upgrade");
        drop(socket);
    }
    // A first message over the limit.
    let (mut socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let huge = "a".repeat(voxide::server::MAX_WS_MESSAGE + 1);
    let _ = socket.send(Message::text(huge)).await;
    while let Some(Ok(_)) = socket.next().await {}
    tokio::time::sleep(Duration::from_millis(500)).await;
    let built = || bots.0.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(built(), 0, "no bot for clients that never stayed");
    // A client that stays quiet gets its bot (for a greeting) a moment after it connects.
    let (mut quiet, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade");
    let said = tokio::time::timeout(Duration::from_secs(5), quiet.next()).await;
    assert!(matches!(said, Ok(Some(Ok(Message::Text(_))))), "{said:?}");
    assert_eq!(built(), 1);
}
