//! The join handshake on a new cluster connection: admit it among the handshakes in flight (a
//! bound overall and per address), read the node's hello (small, under a budget of its own), and
//! check that its certificate proves the name it claims.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh::cluster::frame::Budget;
use mesh::sync::Locked;

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

/// Connections in their handshake at once (TLS and hello), overall; more are refused at once.
pub const MAX_HANDSHAKES: usize = 16;
/// Connections in their handshake at once from one address.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 4;
/// Largest hello header: the node's models' configs must fit (thousands of ordinary ones do).
pub const MAX_HELLO: u32 = 4 << 20;

/// The limits hellos are read under: at most [`MAX_HELLO`] bytes, no payload, and a budget of their
/// own that every handshake in flight fits in, so hellos never take room from links, nor links from them.
pub fn hello_limits(limits: &Limits) -> Limits {
    Limits {
        max_header: MAX_HELLO,
        max_payload: 0,
        budget: Arc::new(Budget::new(MAX_HANDSHAKES as u64 * u64::from(MAX_HELLO))),
        ..limits.clone()
    }
}

/// The handshakes in flight, by address (sans-IO: the caller says who arrives).
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// A handshake's place at the gate; given back when dropped.
#[derive(Debug)]
pub struct Pass {
    gate: Arc<Gate>,
    from: IpAddr,
}

impl Gate {
    /// A place for a handshake from `from`, if fewer than the bounds are in flight.
    pub fn enter(self: &Arc<Self>, from: IpAddr) -> Option<Pass> {
        let mut state = self.state.locked();
        let (all, by) = &mut *state;
        let mine = by.get(&from).copied().unwrap_or(0);
        if *all >= MAX_HANDSHAKES || mine >= MAX_HANDSHAKES_PER_ADDRESS {
            return None;
        }
        *all += 1;
        by.insert(from, mine + 1);
        Some(Pass {
            gate: self.clone(),
            from,
        })
    }

    /// Handshakes in flight.
    pub fn in_flight(&self) -> usize {
        self.state.locked().0
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut state = self.gate.state.locked();
        let (all, by) = &mut *state;
        *all = all.saturating_sub(1);
        if let Some(n) = by.get_mut(&self.from) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.from);
            }
        }
    }
}

fn refuse(conn: &Connection, code: u32, reason: String) {
    tracing::warn!(peer = %conn.remote_address(), "refused a node: {reason}");
    conn.close(VarInt::from_u32(code), reason.as_bytes());
}

/// Reads the hello on a new connection's first stream, under [`hello_limits`]. A node speaking
/// another protocol version, or anything else than a hello, is refused with a reason it can log.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_bounds_handshakes_overall_and_per_address() {
        let gate = Arc::new(Gate::default());
        let a: IpAddr = [127, 0, 0, 2].into();
        let mine: Vec<Pass> = (0..MAX_HANDSHAKES_PER_ADDRESS)
            .map(|_| gate.enter(a).expect("room"))
            .collect();
        assert!(gate.enter(a).is_none(), "one address past its bound");
        let others: Vec<Pass> = (0..MAX_HANDSHAKES - MAX_HANDSHAKES_PER_ADDRESS)
            .map(|i| gate.enter([10, 0, (i / 4) as u8, 1].into()).expect("room"))
            .collect();
        assert_eq!(gate.in_flight(), MAX_HANDSHAKES);
        assert!(gate.enter([10, 9, 9, 9].into()).is_none(), "past the overall bound");
        drop(mine);
        assert!(gate.enter(a).is_some(), "places are given back");
        drop(others);
        assert_eq!(gate.in_flight(), 0);
        assert!(
            gate.state.locked().1.is_empty(),
            "no address is kept once its handshakes end"
        );
    }

    #[test]
    fn hellos_are_small_and_carry_no_payload() {
        let limits = hello_limits(&Limits::default());
        assert_eq!(limits.max_header, MAX_HELLO);
        assert_eq!(limits.max_payload, 0);
        assert!(limits.budget.reserve(u64::from(MAX_HELLO)).is_ok());
    }
}
