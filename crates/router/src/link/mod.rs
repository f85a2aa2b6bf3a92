//! The router's side of the cluster link: the QUIC listener, the join handshake, one `NodeLink`
//! actor per connected node, and single request attempts over a link.
pub mod actor;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mesh::cluster::io::read_frame;
use mesh::cluster::msg::{Hello, Message};
use mesh::cluster::transport::close;
use mesh::cluster::{FrameError, Limits};
use quinn::{Connection, RecvStream, SendStream, VarInt};

use mesh::cluster::identity::{self, Role};

use crate::membership::{LinkId, Membership};

/// One connected node as the request path sees it: its connection and the router's in-flight count.
pub struct Link {
    pub id: LinkId,
    pub name: String,
    pub conn: Connection,
    pub address: SocketAddr,
    inflight: AtomicU32,
    /// The link's actor, which owns the control stream (placement sends commands through it).
    control: std::sync::OnceLock<ractor::ActorRef<actor::LinkMsg>>,
}

impl Link {
    pub fn new(id: LinkId, name: String, conn: Connection) -> Self {
        Link {
            id,
            name,
            address: conn.remote_address(),
            conn,
            inflight: AtomicU32::new(0),
            control: std::sync::OnceLock::new(),
        }
    }

    /// The link's actor, once started.
    pub fn control(&self) -> Option<ractor::ActorRef<actor::LinkMsg>> {
        self.control.get().cloned()
    }

    pub(crate) fn set_control(&self, actor: ractor::ActorRef<actor::LinkMsg>) {
        let _ = self.control.set(actor);
    }

    /// Requests of this router in flight on this link.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }

    /// Counts one request in flight until the permit drops (answered, failed or cancelled alike).
    pub fn permit(self: &Arc<Self>) -> InflightPermit {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        InflightPermit(self.clone())
    }

    /// Closes the link with a code and a reason the node logs.
    pub fn close(&self, code: u32, reason: &str) {
        self.conn.close(VarInt::from_u32(code), reason.as_bytes());
    }
}

/// One request in flight on a link; dropping it releases the count.
pub struct InflightPermit(Arc<Link>);

impl Drop for InflightPermit {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A node whose hello was read: what the NodeLink actor starts from.
pub struct Joining {
    pub conn: Connection,
    pub control: (SendStream, RecvStream),
    pub hello: Hello,
}

/// Checks who a joining node is. With certificates, it must show a node certificate whose name is the name in
/// its hello, and a name a live member holds with another key is refused ([`Membership::admits`]); returns the
/// key that proves the name. In the development mode nobody shows a certificate and nothing is checked.
pub fn check_identity(name: &str, conn: &Connection, membership: &Membership) -> Result<Option<[u8; 32]>, String> {
    let Some(shown) = identity::of_peer(conn) else {
        return Ok(None);
    };
    shown.require(Role::Node)?;
    if shown.name != name {
        return Err(format!(
            "the hello names node '{name}' but its certificate is '{}'s: a node's name in the cluster is the name in \
             its certificate (give --node-name {} or leave it out)",
            shown.name, shown.name
        ));
    }
    membership.admits(name, Some(&shown.key))?;
    Ok(Some(shown.key))
}

/// How long a new connection may take to open its control stream and say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

fn refuse(conn: &Connection, code: u32, reason: String) {
    tracing::warn!(peer = %conn.remote_address(), "refused a node: {reason}");
    conn.close(VarInt::from_u32(code), reason.as_bytes());
}

/// Reads the hello on a new connection's first stream. A node speaking another protocol version,
/// or anything else than a hello, is refused with a reason it can log.
pub async fn handshake(conn: Connection, limits: &Limits) -> Option<Joining> {
    let opened = tokio::time::timeout(HELLO_TIMEOUT, async {
        let (tx, mut rx) = conn.accept_bi().await.map_err(|e| FrameError::Io(e.to_string()))?;
        let first = read_frame(&mut rx, limits).await?;
        Ok::<_, FrameError>((tx, rx, first))
    })
    .await;
    let (tx, rx, first) = match opened {
        Err(_) => {
            refuse(&conn, close::PROTOCOL, format!("no hello within {HELLO_TIMEOUT:?}"));
            return None;
        }
        Ok(Err(FrameError::Io(e))) => {
            tracing::debug!(peer = %conn.remote_address(), "a connection closed before its hello: {e}");
            return None;
        }
        Ok(Err(e @ FrameError::Version { .. })) => {
            refuse(&conn, close::REFUSED, format!("cannot join: {e}"));
            return None;
        }
        Ok(Err(e)) => {
            refuse(&conn, close::PROTOCOL, format!("bad hello: {e}"));
            return None;
        }
        Ok(Ok(v)) => v,
    };
    match first.map(|f| f.message) {
        Some(Message::Hello(hello)) if hello.name.is_empty() => {
            refuse(&conn, close::REFUSED, "cannot join: the hello names no node".into());
            None
        }
        Some(Message::Hello(hello)) => Some(Joining {
            conn,
            control: (tx, rx),
            hello,
        }),
        Some(other) => {
            let what = mesh::cluster::answer::message_name(&other);
            refuse(&conn, close::PROTOCOL, format!("expected a hello, got a {what}"));
            None
        }
        None => {
            refuse(&conn, close::PROTOCOL, "the control stream ended before a hello".into());
            None
        }
    }
}
