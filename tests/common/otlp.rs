//! An OpenTelemetry collector's OTLP/HTTP traces endpoint, as far as a test needs one: it
//! decodes each export with the official protobuf definitions and keeps the spans.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// What the collector received.
#[derive(Clone, Default)]
pub struct Received {
    /// Each span with its resource's `service.name`.
    pub spans: Arc<Mutex<Vec<(String, Span)>>>,
    /// Requests whose content type was not protobuf.
    pub wrong_type: Arc<Mutex<u32>>,
}

impl Received {
    pub fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().expect("lock").clone()
    }
}

/// The collector on a free loopback port; its traces URL's base.
pub async fn collector() -> (String, Received) {
    let received = Received::default();
    let state = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let state = state.clone();
            async move {
                if headers.get("content-type").and_then(|v| v.to_str().ok())
                    != Some("application/x-protobuf")
                {
                    *state.wrong_type.lock().expect("lock") += 1;
                    return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
                }
                let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                    return (StatusCode::BAD_REQUEST, Vec::new());
                };
                let mut spans = state.spans.lock().expect("lock");
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .and_then(string)
                        .unwrap_or_default();
                    for scope in resource.scope_spans {
                        spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
                    }
                }
                (
                    StatusCode::OK,
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), received)
}

/// A string attribute's value.
pub fn string(kv: &KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// A span's attribute by key.
pub fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}
