//! Several nodes behind one load balancer. Each node mints the ids of what it holds as
//! `<node>.<uuid>` (`/start`'s `sessionId`, a connection's `pc_id`), so any node, or a proxy
//! rule on the path, can tell which node owns a request. A node that gets a SmallWebRTC
//! request for a connection or session another node holds (trickled candidates, a
//! renegotiation, a `restart_pc`, the offer of a session another node's `/start` began)
//! forwards it to that node, found in `--peers` or by `--peer-url` (a headless Service's DNS),
//! and answers with the owner's answer: it never says 404 for a session that lives elsewhere.
//!
//! Nothing a client sends chooses the address: the node part of an id must be a node id, the
//! URL is a known peer's or the template with that id as its host's first DNS label, redirects
//! are not followed, and both bodies are capped. With `--cluster-secret` each forwarded request
//! carries an HMAC-SHA256 over its method, path, body digest and time; a request that claims to
//! be forwarded without a valid one is refused and counted like any client's.

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
use crate::ids::random_u32;
use crate::secret::{Secret, same_secret};

/// The header every answer carries: the node that answered (for a forwarded request, the
/// owner).
pub const NODE_HEADER: &str = "x-voxide-node";
/// The header on a forwarded request: the node that forwarded it. A node never forwards such
/// a request again.
pub const FORWARDED_HEADER: &str = "x-voxide-forwarded-by";

/// The header that proves a forwarded request came from a node of the cluster:
/// `t=<unix seconds>,v1=<hex HMAC-SHA256>` (see [`signature`]).
pub const SIGNATURE_HEADER: &str = "x-voxide-signature";

/// How long a forwarded request may take (a renegotiation's answer included).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest answer a peer's body may be (an SDP answer is a few kilobytes).
const MAX_FORWARDED_ANSWER: usize = 256 * 1024;
/// How far a signed request's time may be from this node's clock.
const SIGNATURE_WINDOW_SECS: u64 = 30;

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

/// Where the other nodes answer, and how they prove they are nodes of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peers {
    /// By node id, each node's base URL (`http://10.0.0.7:7860`).
    pub known: HashMap<String, String>,
    /// For a node not in `known`: a URL with `{node}` as its host's first label, e.g.
    /// `http://{node}.voxide-nodes.default.svc:7860` (a headless Service).
    pub template: Option<String>,
    /// The secret the nodes share: forwarded requests are signed with it, and a request that
    /// claims to be forwarded is trusted only with a valid signature.
    pub secret: Option<Secret>,
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

    /// Checks `--peer-url`: http(s), with `{node}` as the first label of its host.
    pub fn check_template(template: &str) -> Result<(), String> {
        let probe = template.replace("{node}", "node0");
        let url = reqwest::Url::parse(&probe)
            .map_err(|e| format!("--peer-url {template:?} is not a URL: {e}"))?;
        let first_label = url.host_str().and_then(|h| h.split('.').next());
        if !matches!(url.scheme(), "http" | "https") || first_label != Some("node0") {
            return Err(format!(
                "--peer-url {template:?}: an http(s) URL whose host starts with {{node}} \
                 (http://{{node}}.voxide-nodes:7860)"
            ));
        }
        Ok(())
    }

    /// The base URL of `node`, if it can be found: a known peer's, or the template's with the
    /// node as its host's first label (only where the node id is a DNS label).
    pub fn url(&self, node: &NodeId) -> Option<String> {
        if let Some(url) = self.known.get(node.as_str()) {
            return Some(url.clone());
        }
        let template = self.template.as_ref()?;
        let label = node.as_str();
        let dns_label = label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !dns_label {
            return None;
        }
        let url = template.replace("{node}", label);
        let parsed = reqwest::Url::parse(&url).ok()?;
        let host = parsed.host_str()?;
        (host.split('.').next() == Some(label)).then(|| url.trim_end_matches('/').to_owned())
    }
}

/// For [`crate::fuzz`]: a node id, a peer list, a URL template and a signature header from
/// the outside, split at `0xff`, read as the forwarder reads them.
pub(crate) fn fuzz_peers(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut parts = text.split('\u{fffd}');
    let id = parts.next().unwrap_or_default();
    let list = parts.next().unwrap_or_default();
    let template = parts.next().unwrap_or_default();
    let header = parts.next().unwrap_or_default();
    let _ = Peers::parse_list(list);
    let node = id.parse::<NodeId>();
    if Peers::check_template(template).is_ok()
        && let Ok(node) = &node
    {
        let peers = Peers {
            template: Some(template.to_owned()),
            ..Peers::default()
        };
        let _ = peers.url(node);
    }
    let _ = signed("secret", header, "POST", id, list.as_bytes(), 1_800_000_000);
}

/// `t=<time>,v1=<hex HMAC-SHA256(secret, "METHOD\nPATH\nhex(SHA-256(body))\nTIME")>`.
pub fn signature(secret: &str, method: &str, path: &str, body: &[u8], time: u64) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, body);
    let message = format!("{method}\n{path}\n{}\n{time}", hex(digest.as_ref()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, message.as_bytes());
    format!("t={time},v1={}", hex(tag.as_ref()))
}

/// Whether `header` signs this request with `secret`, within the window around `now`.
pub fn signed(secret: &str, header: &str, method: &str, path: &str, body: &[u8], now: u64) -> bool {
    let Some(time) = header
        .split(',')
        .find_map(|p| p.strip_prefix("t="))
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return false;
    };
    if time.abs_diff(now) > SIGNATURE_WINDOW_SECS {
        return false;
    }
    let expected = signature(secret, method, path, body, time);
    same_secret(header.trim().as_bytes(), expected.as_bytes())
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request another node of the cluster forwarded, its signature checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forwarded;

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
            .redirect(reqwest::redirect::Policy::none())
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

    /// The secret forwarded requests are signed with, if the cluster has one.
    pub(crate) fn secret(&self) -> Option<&str> {
        self.peers.secret.as_ref().map(Secret::expose)
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
    /// in them (from a single-node deployment), are this node's. An id whose node part is not
    /// a node id is refused before anything else.
    fn elsewhere(&self, id: &str) -> Result<Option<NodeId>, ApiError> {
        let Some((node, _)) = id.split_once('.') else {
            return Ok(None);
        };
        let node: NodeId = node.parse().map_err(|why| {
            ApiError::BadRequest(format!("the id {id:.80?} names no node: {why}"))
        })?;
        Ok((node != self.node).then_some(node))
    }

    /// Sends `parts` and `body` on to `node` and hands back its answer.
    async fn forward(
        &self,
        node: &NodeId,
        parts: &Parts,
        body: Bytes,
    ) -> Result<Response, ApiError> {
        let unknown = || ApiError::UnknownNode {
            node: node.to_string(),
        };
        let base = self.peers.url(node).ok_or_else(unknown)?;
        let path = parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |p| p.as_str());
        let url = reqwest::Url::parse(&format!("{base}{path}")).map_err(|_| unknown())?;
        let base_host = reqwest::Url::parse(&base)
            .ok()
            .and_then(|b| b.host_str().map(str::to_owned));
        if url.host_str().map(str::to_owned) != base_host {
            return Err(unknown());
        }
        let mut request = self
            .client
            .request(parts.method.clone(), url)
            .header(FORWARDED_HEADER, self.node_header.clone());
        if let Some(secret) = self.secret() {
            let signed = signature(secret, parts.method.as_str(), path, &body, unix_now());
            request = request.header(SIGNATURE_HEADER, signed);
        }
        let mut request = request.body(body);
        // Twilio's signature too: its status callbacks for a call placed elsewhere come here.
        let twilio = HeaderName::from_static("x-twilio-signature");
        for name in [header::CONTENT_TYPE, header::AUTHORIZATION, twilio] {
            if let Some(value) = parts.headers.get(&name) {
                request = request.header(name, value.clone());
            }
        }
        let unreachable = |why: String| ApiError::NodeUnreachable {
            node: node.to_string(),
            why,
        };
        let mut answer = request
            .send()
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = answer.status();
        let mut headers = answer.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| unreachable(e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_FORWARDED_ANSWER {
                return Err(unreachable(format!(
                    "its answer is over {MAX_FORWARDED_ANSWER} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
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

/// The id whose node owns a signalling request: the session in `/sessions/{id}/...` or
/// `/calls/{id}`, else the `pc_id` in the body.
pub(super) fn owning_id(path: &str, body: &[u8]) -> Option<String> {
    if let Some(rest) = path
        .strip_prefix("/sessions/")
        .or_else(|| path.strip_prefix("/calls/"))
    {
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
    if request.extensions().get::<Forwarded>().is_some() {
        // The node that sent it found this one the owner: it is answered here, found or not.
        return Ok(next.run(request).await);
    }
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| ApiError::TooLarge(format!("the request body is too large: {e}")))?;
    let owner = match owning_id(parts.uri.path(), &body) {
        Some(id) => app.cluster.elsewhere(&id)?,
        None => None,
    };
    match owner {
        Some(node) => {
            tracing::debug!(%node, path = parts.uri.path(), "forwarded to its node");
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
        Cluster::new(node_id(node), Peers::default())
    }

    fn node_id(node: &str) -> NodeId {
        node.parse().expect("a node id")
    }

    #[test]
    fn a_pc_id_naming_an_address_is_refused_before_any_request() {
        let n1 = cluster("n1");
        for id in ["localhost:8080/leak?x=.y", "[::1]:7860.x", "n2/../admin.x"] {
            assert!(
                matches!(n1.elsewhere(id), Err(ApiError::BadRequest(_))),
                "{id}"
            );
        }
    }

    #[test]
    fn the_peer_template_takes_only_a_dns_label_as_its_hosts_first_label() {
        let peers = Peers {
            template: Some("http://{node}.voxide-nodes:7860".into()),
            ..Peers::default()
        };
        assert_eq!(
            peers.url(&node_id("voxide-7f9c")).as_deref(),
            Some("http://voxide-7f9c.voxide-nodes:7860")
        );
        // An address's first part is only a label in the template's host.
        assert_eq!(
            peers.url(&node_id("169")).as_deref(),
            Some("http://169.voxide-nodes:7860")
        );
        // Valid node ids that are not DNS labels are not pasted into a host name.
        for odd in ["Upper", "under_score", "-lead", "trail-"] {
            assert_eq!(peers.url(&node_id(odd)), None, "{odd}");
        }
        assert!(Peers::check_template("http://{node}.voxide-nodes:7860").is_ok());
        for bad in [
            "http://voxide-nodes:7860/{node}",
            "http://x.{node}.svc",
            "ftp://{node}.x",
            "not a url {node}",
        ] {
            assert!(Peers::check_template(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_signature_covers_method_path_body_and_time() {
        let now = 1_767_225_600;
        let signed_here = signature("s3cret", "PATCH", "/api/offer", b"{}", now);
        assert!(signed(
            "s3cret",
            &signed_here,
            "PATCH",
            "/api/offer",
            b"{}",
            now + 5
        ));
        assert!(!signed(
            "other",
            &signed_here,
            "PATCH",
            "/api/offer",
            b"{}",
            now
        ));
        assert!(!signed(
            "s3cret",
            &signed_here,
            "POST",
            "/api/offer",
            b"{}",
            now
        ));
        assert!(!signed(
            "s3cret",
            &signed_here,
            "PATCH",
            "/start",
            b"{}",
            now
        ));
        assert!(!signed(
            "s3cret",
            &signed_here,
            "PATCH",
            "/api/offer",
            b"{ }",
            now
        ));
        assert!(
            !signed(
                "s3cret",
                &signed_here,
                "PATCH",
                "/api/offer",
                b"{}",
                now + 31
            ),
            "too old"
        );
        assert!(!signed(
            "s3cret",
            "t=1,v1=00",
            "PATCH",
            "/api/offer",
            b"{}",
            1
        ));
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
        assert_eq!(n1.elsewhere(&id), Ok(None));
        assert_eq!(cluster("n2").elsewhere(&id), Ok(Some(node_id("n1"))));
        assert_eq!(
            cluster("n2").elsewhere("pc-0123"),
            Ok(None),
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
            secret: None,
        };
        assert_eq!(
            peers.url(&node_id("n1")).as_deref(),
            Some("http://127.0.0.11:7860")
        );
        assert_eq!(
            peers.url(&node_id("n7")).as_deref(),
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
