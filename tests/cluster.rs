//! A node among others, on real sockets and without models: draining, and HAProxy's agent
//! check.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use voxide::bot::{Bot, BotError, SessionInfo};
use voxide::context::{ContextHandle, LlmContext};
use voxide::frames::StartParams;
use voxide::pipeline::{AppResources, Pipeline};
use voxide::server::{BotFactory, ServeError, ServeOptions, serve_with};
use voxide::transports::AudioSink;

/// A bot that hears the user and says nothing: a session that lasts until its client leaves.
struct Silent;

impl BotFactory for Silent {
    fn preload(&self) -> Result<(), BotError> {
        Ok(())
    }

    fn find(&self, _: &str) -> Result<(), BotError> {
        Ok(())
    }

    fn build(&self, _: &SessionInfo, _: u32, _: Box<dyn AudioSink>) -> Result<Bot, BotError> {
        Ok(Bot {
            pipeline: Pipeline::new(),
            context: ContextHandle::new(LlmContext::default()),
            params: StartParams::default(),
            resources: AppResources::default(),
            report_level: Default::default(),
        })
    }
}

struct Node {
    addr: SocketAddr,
    agent: SocketAddr,
    task: JoinHandle<Result<(), ServeError>>,
    http: reqwest::Client,
}

impl Node {
    /// A node that drains only when asked over HTTP, ready.
    async fn start(max_sessions: usize) -> Self {
        // The agent's port is found free, let go and bound again by the node: a test running
        // beside this one may take it in between, and the node then starts on another.
        for _ in 0..10 {
            let agent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
            let agent_addr = agent.local_addr().expect("an address");
            drop(agent);
            let options = ServeOptions {
                max_sessions,
                node_id: "n1".parse().expect("a node id"),
                agent_addr: Some(agent_addr),
                ..ServeOptions::new(([127, 0, 0, 1], 0).into(), Vec::new())
            };
            let (addr_tx, addr_rx) = oneshot::channel();
            let task = tokio::spawn(serve_with(
                options,
                Arc::new(Silent),
                std::future::pending(),
                move |addr| {
                    let _ = addr_tx.send(addr);
                },
            ));
            let Ok(addr) = addr_rx.await else {
                match task.await.expect("joined") {
                    Err(ServeError::BindAgent { .. }) => continue,
                    other => panic!("the node did not listen: {other:?}"),
                }
            };
            return Self {
                addr,
                agent: agent_addr,
                task,
                http: reqwest::Client::new(),
            }
            .ready()
            .await;
        }
        panic!("no free port for the agent in ten tries");
    }

    /// The node, once it says it is ready.
    async fn ready(self) -> Self {
        for _ in 0..200 {
            if self.status("/readyz").await == 200 {
                return self;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the node never became ready");
    }

    async fn status(&self, path: &str) -> u16 {
        self.http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .map_or(0, |r| r.status().as_u16())
    }

    async fn agent_says(&self) -> String {
        let mut stream = tokio::net::TcpStream::connect(self.agent)
            .await
            .expect("the agent port answers");
        let mut line = String::new();
        stream.read_to_string(&mut line).await.expect("a line");
        line
    }

    async fn call(&self) -> Result<WebSocket, u16> {
        match tokio_tungstenite::connect_async(format!("ws://{}/ws", self.addr)).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                Err(response.status().as_u16())
            }
            Err(e) => panic!("the socket failed: {e}"),
        }
    }
}

type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_keeps_its_call_takes_no_new_one_and_exits_when_it_ends() {
    let mut node = Node::start(4).await;
    assert_eq!(node.agent_says().await, "ready up 100%\n");
    let mut call = node.call().await.expect("a session");
    assert_eq!(node.agent_says().await, "ready up 75%\n");

    let drained = node
        .http
        .post(format!("http://{}/admin/drain", node.addr))
        .send()
        .await
        .expect("an answer");
    assert_eq!(drained.status().as_u16(), 202);
    assert_eq!(drained.headers()["x-voxide-node"], "n1");
    assert_eq!(node.status("/readyz").await, 503);
    assert_eq!(node.agent_says().await, "drain\n");
    assert_eq!(node.call().await.err(), Some(503), "no new session");
    // The call goes on: the node is still there for it.
    assert_eq!(node.status("/healthz").await, 200);
    assert!(!node.task.is_finished());

    call.close(None).await.expect("closed");
    let ended = tokio::time::timeout(Duration::from_secs(20), &mut node.task)
        .await
        .expect("the node exits once its last call ends");
    ended.expect("joined").expect("a clean exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_nat_webrtc_offers_the_public_address_on_a_port_of_the_range() {
    // Bound everywhere, reached at 127.0.0.2: the only host candidate the answer gives is the
    // public one, so a caller that connects got there through it.
    let free = std::net::UdpSocket::bind("0.0.0.0:0").expect("a port");
    let port = free.local_addr().expect("an address").port();
    drop(free);
    let options = ServeOptions {
        webrtc_udp_ports: Some(port..=port),
        webrtc_public_ip: Some([127, 0, 0, 2].into()),
        node_id: "n1".parse().expect("a node id"),
        ..ServeOptions::new(([0, 0, 0, 0], 0).into(), Vec::new())
    };
    let (addr_tx, addr_rx) = oneshot::channel();
    let node = tokio::spawn(serve_with(
        options,
        Arc::new(Silent),
        std::future::pending(),
        move |addr| {
            let _ = addr_tx.send(addr);
        },
    ));
    let addr = addr_rx.await.expect("listening");
    let options = voxide::loadtest::LoadtestOptions {
        target: format!("http://127.0.0.1:{}", addr.port()),
        protocol: voxide::loadtest::Protocol::WebRtc,
        audio: vec![concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test/hello_16k.wav").into()],
        sessions: 1,
        concurrency: 1,
        turns: 1,
        think: Duration::from_millis(100),
        barge_in_at: None,
        ramp: Duration::ZERO,
        stages: Vec::new(),
        seed: 1,
        // The silent bot never answers: only the connection counts here.
        response_timeout: Duration::from_millis(500),
        slos: Vec::new(),
        out: None,
        max_pacing_lag: Duration::from_secs(1),
        auth_token: None,
        room: None,
        network: Default::default(),
        received: Default::default(),
        red: 1,
    };
    let summary = voxide::loadtest::run(options).await.expect("runs");
    assert_eq!(summary.sessions.connected, 1, "{summary:?}");
    assert_eq!(summary.nodes.get("n1"), Some(&1));
    node.abort();
}
