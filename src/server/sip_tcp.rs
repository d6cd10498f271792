//! SIP over TCP (`--sip-transport udp,tcp`): each connection's bytes are cut into messages by
//! `transports::sip::stream` and handed to the SIP loop with the way back to their sender, a
//! [`Wire`]. What voxide sends on a call that came over TCP goes back on its connection.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections, [`MAX_PER_ADDRESS`] from one address; a
//! message begun must be whole within [`PARTIAL_FOR`]; a connection no call uses is closed
//! after [`IDLE_FOR`] without a message.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;

use crate::transports::sip::call::Transport;
use crate::transports::sip::message::SipMessage;
use crate::transports::sip::stream::{Framed, Framer};

/// Connections open at once, from everyone.
const MAX_CONNECTIONS: usize = 512;
/// Connections open at once from one address.
const MAX_PER_ADDRESS: usize = 16;
/// How long a message begun may take to arrive whole.
const PARTIAL_FOR: Duration = Duration::from_secs(10);
/// How long a connection no call uses stays open without a message.
const IDLE_FOR: Duration = Duration::from_secs(60);
/// Messages queued for one connection's writer; past it a message is dropped (SIP resends).
const OUTBOX: usize = 32;
/// Bytes read at a time.
const READ: usize = 16 * 1024;

/// The way a SIP message goes to the other side: the shared UDP socket to its address, or the
/// TCP connection it opened.
#[derive(Debug, Clone)]
pub(super) enum Wire {
    Udp(Arc<UdpSocket>, SocketAddr),
    Tcp(mpsc::Sender<Vec<u8>>),
}

impl Wire {
    /// Sends `bytes`; a message that cannot go is lost, as a datagram may be.
    pub(super) async fn send(&self, bytes: &[u8]) {
        match self {
            Wire::Udp(socket, peer) => {
                let _ = socket.send_to(bytes, *peer).await;
            }
            Wire::Tcp(outbox) => {
                if outbox.try_send(bytes.to_vec()).is_err() {
                    tracing::debug!(
                        "a SIP connection's outbox is full or closed: a message dropped"
                    );
                }
            }
        }
    }

    /// The transport it is.
    pub(super) fn transport(&self) -> Transport {
        match self {
            Wire::Udp(..) => Transport::Udp,
            Wire::Tcp(_) => Transport::Tcp,
        }
    }
}

/// A message read, who sent it, and the way back.
pub(super) type Heard = (SipMessage, SocketAddr, Wire);

/// The connections open, by address.
#[derive(Debug, Default)]
pub(super) struct Connections(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection's place among those open; given back when dropped.
struct Slot {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl Connections {
    /// Reads `stream` from `peer` into `heard` on a task of its own, if there is room for it;
    /// else it is closed at once.
    pub(super) fn take(&self, stream: TcpStream, peer: SocketAddr, heard: mpsc::Sender<Heard>) {
        let slot = {
            let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
            let total: usize = open.values().sum();
            let from_peer = open.get(&peer.ip()).copied().unwrap_or(0);
            if total >= MAX_CONNECTIONS || from_peer >= MAX_PER_ADDRESS {
                tracing::info!(%peer, total, from_peer, "a SIP connection refused: too many open");
                return;
            }
            *open.entry(peer.ip()).or_default() += 1;
            Slot {
                open: self.0.clone(),
                ip: peer.ip(),
            }
        };
        tokio::spawn(connection(stream, peer, heard, slot));
    }
}

/// The next connection on `listener`; never, without one.
pub(super) async fn accept(
    listener: Option<&TcpListener>,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Reads one connection's messages until it closes, breaks the framing, stalls inside a
/// message, or stays idle with no call on it. Its writer lives on while a call holds its wire.
async fn connection(stream: TcpStream, peer: SocketAddr, heard: mpsc::Sender<Heard>, _slot: Slot) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let (outbox, mut queued) = mpsc::channel::<Vec<u8>>(OUTBOX);
    tokio::spawn(async move {
        while let Some(bytes) = queued.recv().await {
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    let wire = Wire::Tcp(outbox.clone());
    let mut framer = Framer::default();
    let mut buffer = vec![0u8; READ];
    loop {
        let wait = if framer.partial() {
            PARTIAL_FOR
        } else {
            IDLE_FOR
        };
        let n = match tokio::time::timeout(wait, reader.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
            Err(_) if framer.partial() => {
                tracing::debug!(%peer, "a SIP message begun was not finished: connection closed");
                break;
            }
            // Idle: a call on this connection keeps it (its BYE comes here); else it goes.
            Err(_) if outbox.strong_count() > 2 => continue,
            Err(_) => break,
        };
        if let Err(e) = framer.push(&buffer[..n]) {
            tracing::debug!(%peer, error = %e, "a SIP stream overflowed: connection closed");
            break;
        }
        loop {
            match framer.take() {
                Ok(Some(Framed::Ping)) => {
                    let _ = outbox.try_send(b"\r\n".to_vec());
                }
                Ok(Some(Framed::Message(bytes))) => match SipMessage::parse(&bytes) {
                    Ok(message) => {
                        if heard.send((message, peer, wire.clone())).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "an unreadable SIP message dropped")
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "a SIP stream cannot be read on: connection closed");
                    return;
                }
            }
        }
    }
}
