//! The join handshake on a new cluster connection: read the node's hello, and check that its
//! certificate proves the name it claims.
use std::time::Duration;

use mesh::cluster::io::read_frame;
use mesh::cluster::msg::Message;
use mesh::cluster::transport::close;
use mesh::cluster::{FrameError, Limits};
use quinn::{Connection, VarInt};

use mesh::cluster::identity::{self, Role};

use crate::membership::Membership;
use crate::messages::Joining;

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
