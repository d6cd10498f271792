//! Several nodes behind one load balancer. Each node mints the ids of what it holds as
//! `<node>.<uuid>` (`/start`'s `sessionId`, a connection's `pc_id`), so any node, or a proxy
//! rule on the path, can tell which node owns a request. A node that gets a SmallWebRTC
//! request for a connection or session another node holds (trickled candidates, a
//! renegotiation, a `restart_pc`, the offer of a session another node's `/start` began)
//! forwards it to that node, found in `--peers` or by `--peer-url` (a headless Service's DNS),
//! and answers with the owner's answer: it never says 404 for a session that lives elsewhere.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{ApiError, App, MAX_BODY_BYTES};
use crate::transports::webrtc::random_u32;

/// The header every answer carries: the node that answered (for a forwarded request, the
/// owner).
pub const NODE_HEADER: &str = "x-voxide-node";
/// The header on a forwarded request: the node that forwarded it. A node never forwards such
/// a request again.
pub const FORWARDED_HEADER: &str = "x-voxide-forwarded-by";

/// How long a forwarded request may take (a renegotiation's answer included).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

/// A node's name: letters, digits, `-` and `_` (it is the first part of every id the node
/// mints, before the `.`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeId(String);

impl NodeId {
    /// The machine's host name, or `voxide` where it has none that fits.
    pub fn from_hostname() -> Self {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .unwrap_or_default();
        // A fully qualified name: its first label.
        let label = name.trim().split('.').next().unwrap_or_default();
        label.parse().unwrap_or_else(|_| Self("voxide".into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for NodeId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fits = !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if fits {
            Ok(Self(s.to_owned()))
        } else {
            Err(format!(
                "node id {s:?}: 1 to 63 letters, digits, '-' or '_' (it prefixes every id the node mints)"
            ))
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where the other nodes answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peers {
    /// By node id, each node's base URL (`http://10.0.0.7:7860`).
    pub known: HashMap<String, String>,
    /// For a node not in `known`: a URL with `{node}` in it, e.g.
    /// `http://{node}.voxide-nodes.default.svc:7860` (a headless Service).
    pub template: Option<String>,
}

impl Peers {
    /// Parses `--peers`: `n1=http://127.0.0.11:7860,n2=http://127.0.0.12:7860`.
    pub fn parse_list(list: &str) -> Result<HashMap<String, String>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let (node, url) = entry
                    .split_once('=')
                    .ok_or_else(|| format!("--peers entry {entry:?} is not NODE=URL"))?;
                let node: NodeId = node.trim().parse()?;
                let url = url.trim().trim_end_matches('/');
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!("--peers entry {entry:?}: the URL must be http(s)"));
                }
                Ok((node.0, url.to_owned()))
            })
            .collect()
    }

    /// The base URL of `node`, if it can be found.
    pub fn url(&self, node: &str) -> Option<String> {
        self.known.get(node).cloned().or_else(|| {
            self.template
                .as_ref()
                .map(|t| t.replace("{node}", node).trim_end_matches('/').to_owned())
        })
    }
}

/// This node among the others.
pub(crate) struct Cluster {
    node: NodeId,
    node_header: HeaderValue,
    peers: Peers,
    client: reqwest::Client,
}

impl Cluster {
    pub(crate) fn new(node: NodeId, peers: Peers) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(FORWARD_TIMEOUT)
            .build()
            .unwrap_or_default();
        // A node id is ASCII letters, digits, '-' and '_': always a valid header value.
        let node_header = HeaderValue::from_str(node.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("voxide"));
        Self {
            node,
            node_header,
            peers,
            client,
        }
    }

    pub(crate) fn node(&self) -> &NodeId {
        &self.node
    }

    /// A new id this node owns: `<node>.<uuid v4>`.
    pub(crate) fn mint(&self) -> String {
        let [a, b, c, d] = std::array::from_fn(|_| random_u32());
        // Version 4, variant 1.
        let b = (b & 0xffff_0fff) | 0x0000_4000;
        let c = (c & 0x3fff_ffff) | 0x8000_0000;
        format!(
            "{}.{a:08x}-{:04x}-{:04x}-{:04x}-{:04x}{d:08x}",
            self.node,
            b >> 16,
            b & 0xffff,
            c >> 16,
            c & 0xffff
        )
    }

    /// The node that owns `id`, when it is another: ids this node minted, and ids with no node
    /// in them (from a single-node deployment), are this node's.
    fn elsewhere<'a>(&self, id: &'a str) -> Option<&'a str> {
        let (node, _) = id.split_once('.')?;
        (node != self.node.as_str()).then_some(node)
    }

    /// Sends `parts` and `body` on to `node` and hands back its answer.
    async fn forward(&self, node: &str, parts: &Parts, body: Bytes) -> Result<Response, ApiError> {
        let base = self.peers.url(node).ok_or_else(|| ApiError::UnknownNode {
            node: node.to_owned(),
        })?;
        let path = parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |p| p.as_str());
        let mut request = self
            .client
            .request(parts.method.clone(), format!("{base}{path}"))
            .header(FORWARDED_HEADER, self.node_header.clone())
            .body(body);
        for name in [header::CONTENT_TYPE, header::AUTHORIZATION] {
            if let Some(value) = parts.headers.get(&name) {
                request = request.header(name, value.clone());
            }
        }
        let unreachable = |e: reqwest::Error| ApiError::NodeUnreachable {
            node: node.to_owned(),
            why: e.to_string(),
        };
        let answer = request.send().await.map_err(unreachable)?;
        let status = answer.status();
        let mut headers = answer.headers().clone();
        let body = answer.bytes().await.map_err(unreachable)?;
        let mut response = (status, body).into_response();
        for name in [header::CONTENT_TYPE, header::RETRY_AFTER] {
            if let Some(value) = headers.remove(&name) {
                response.headers_mut().insert(name, value);
            }
        }
        if let Some(owner) = headers.remove(NODE_HEADER) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(NODE_HEADER), owner);
        }
        Ok(response)
    }
}

/// What a signalling body says about the connection it is for.
#[derive(Deserialize)]
struct ForConnection {
    pc_id: Option<String>,
}

/// The id whose node owns a signalling request: the session in `/sessions/{id}/...`, else the
/// `pc_id` in the body.
pub(super) fn owning_id(path: &str, body: &[u8]) -> Option<String> {
    if let Some(rest) = path.strip_prefix("/sessions/") {
        return rest.split('/').next().map(str::to_owned);
    }
    serde_json::from_slice::<ForConnection>(body)
        .ok()
        .and_then(|c| c.pc_id)
}

/// Middleware on the signalling routes: a request for another node's connection or session
/// goes to that node; any other goes on here.
pub(crate) async fn route_to_owner(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if request.headers().contains_key(FORWARDED_HEADER) {
        // The node that sent it found this one the owner: it is answered here, found or not.
        return Ok(next.run(request).await);
    }
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| ApiError::TooLarge(format!("the request body is too large: {e}")))?;
    let owner = owning_id(parts.uri.path(), &body)
        .and_then(|id| app.cluster.elsewhere(&id).map(str::to_owned));
    match owner {
        Some(node) => {
            tracing::debug!(node, path = parts.uri.path(), "forwarded to its node");
            app.cluster.forward(&node, &parts, body).await
        }
        None => Ok(next.run(Request::from_parts(parts, Body::from(body))).await),
    }
}

/// Middleware on every route: the answer says which node gave it.
pub(crate) async fn name_the_node(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    response
        .headers_mut()
        .entry(HeaderName::from_static(NODE_HEADER))
        .or_insert_with(|| app.cluster.node_header.clone());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(node: &str) -> Cluster {
        Cluster::new(node.parse().expect("a node id"), Peers::default())
    }

    #[test]
    fn ids_name_their_node_and_are_uuids() {
        let n1 = cluster("n1");
        let id = n1.mint();
        let (node, uuid) = id.split_once('.').expect("node.uuid");
        assert_eq!(node, "n1");
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
        assert_eq!(&uuid[14..15], "4", "version 4: {uuid}");
        assert_ne!(n1.mint(), id);
        assert_eq!(n1.elsewhere(&id), None);
        assert_eq!(cluster("n2").elsewhere(&id), Some("n1"));
        assert_eq!(
            cluster("n2").elsewhere("pc-0123"),
            None,
            "a single node's id"
        );
    }

    #[test]
    fn a_node_id_that_could_not_prefix_an_id_is_refused() {
        assert!("n1".parse::<NodeId>().is_ok());
        assert!("voxide-7f9c_2".parse::<NodeId>().is_ok());
        for bad in ["", "a.b", "a/b", "ü", &"x".repeat(64)] {
            assert!(bad.parse::<NodeId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn peers_come_from_a_list_or_a_template() {
        let known = Peers::parse_list("n1=http://127.0.0.11:7860/, n2=http://127.0.0.12:7860")
            .expect("a list");
        let peers = Peers {
            known,
            template: Some("http://{node}.voxide-nodes:7860".into()),
        };
        assert_eq!(peers.url("n1").as_deref(), Some("http://127.0.0.11:7860"));
        assert_eq!(
            peers.url("n7").as_deref(),
            Some("http://n7.voxide-nodes:7860")
        );
        assert!(Peers::parse_list("n1").is_err());
        assert!(Peers::parse_list("n1=ftp://x").is_err());
        assert!(Peers::parse_list("a.b=http://x").is_err());
    }

    #[test]
    fn the_owner_is_read_from_the_session_path_or_the_pc_id() {
        assert_eq!(
            owning_id("/sessions/n2.abc/api/offer", b"").as_deref(),
            Some("n2.abc")
        );
        assert_eq!(
            owning_id("/api/offer", br#"{"pc_id": "n3.x", "candidates": []}"#).as_deref(),
            Some("n3.x")
        );
        assert_eq!(owning_id("/api/offer", br#"{"sdp": "v=0"}"#), None);
        assert_eq!(owning_id("/api/offer", b"not json"), None);
    }
}
