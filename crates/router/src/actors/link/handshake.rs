//! The join handshake on a new cluster connection: its address validated, a place among the TLS
//! handshakes in flight (bounded overall and per address), the TLS handshake within a deadline, a
//! place among the hellos being read (bounded overall and per certificate name, so a peer holding
//! a valid certificate cannot take the places of others), the node's hello (small, under a budget
//! of its own), and a check that its certificate proves the name it claims.
use std::collections::HashMap;
use std::hash::Hash;
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
/// How long a new connection's TLS handshake may take.
pub const TLS_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections in their TLS handshake at once, overall; more are refused at once.
pub const MAX_TLS_HANDSHAKES: usize = 32;
/// Connections in their TLS handshake at once from one address.
pub const MAX_TLS_HANDSHAKES_PER_ADDRESS: usize = 8;
/// Hellos being read at once, overall.
pub const MAX_HELLOS: usize = 32;
/// Hellos being read at once for one certificate's name (a node that redials may briefly have two).
pub const MAX_HELLOS_PER_NAME: usize = 2;
/// Largest hello header: the node's models' configs must fit (thousands of ordinary ones do).
pub const MAX_HELLO: u32 = 4 << 20;

/// The limits hellos are read under: at most [`MAX_HELLO`] bytes, no payload, and a budget of their
/// own that every hello in flight fits in, so hellos never take room from links, nor links from them.
pub fn hello_limits(limits: &Limits) -> Limits {
    Limits {
        max_header: MAX_HELLO,
        max_payload: 0,
        budget: Arc::new(Budget::new(MAX_HELLOS as u64 * u64::from(MAX_HELLO))),
        ..limits.clone()
    }
}

/// Handshakes in flight, at most `all` and `each` per key (sans-IO: the caller says who arrives).
#[derive(Debug)]
pub struct Gate<K> {
    state: Mutex<(usize, HashMap<K, usize>)>,
    all: usize,
    each: usize,
}

/// A handshake's place at a gate; given back when dropped.
#[derive(Debug)]
pub struct Pass<K: Hash + Eq> {
    gate: Arc<Gate<K>>,
    key: K,
}

impl<K: Hash + Eq + Clone> Gate<K> {
    pub fn new(all: usize, each: usize) -> Arc<Self> {
        Arc::new(Gate {
            state: Mutex::new((0, HashMap::new())),
            all,
            each,
        })
    }

    /// A place for a handshake of `key`, if fewer than the bounds are in flight.
    pub fn enter(self: &Arc<Self>, key: K) -> Option<Pass<K>> {
        let mut state = self.state.locked();
        let (all, by) = &mut *state;
        let mine = by.get(&key).copied().unwrap_or(0);
        if *all >= self.all || mine >= self.each {
            return None;
        }
        *all += 1;
        by.insert(key.clone(), mine + 1);
        Some(Pass {
            gate: self.clone(),
            key,
        })
    }

    /// Handshakes in flight.
    pub fn in_flight(&self) -> usize {
        self.state.locked().0
    }
}

impl<K: Hash + Eq> Drop for Pass<K> {
    fn drop(&mut self) {
        let mut state = self.gate.state.locked();
        let (all, by) = &mut *state;
        *all = all.saturating_sub(1);
        if let Some(n) = by.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.key);
            }
        }
    }
}

/// The router's two gates: TLS handshakes by address, hellos by certificate name.
pub struct Gates {
    tls: Arc<Gate<IpAddr>>,
    hellos: Arc<Gate<String>>,
}

impl Default for Gates {
    fn default() -> Self {
        Gates {
            tls: Gate::new(MAX_TLS_HANDSHAKES, MAX_TLS_HANDSHAKES_PER_ADDRESS),
            hellos: Gate::new(MAX_HELLOS, MAX_HELLOS_PER_NAME),
        }
    }
}

/// A new connection that passed [`screen`]: on its way to its TLS handshake.
pub struct Screened {
    incoming: quinn::Incoming,
    pass: Pass<IpAddr>,
}

/// What the accept loop does with a new connection at once: an address not yet validated gets a
/// stateless retry (it must prove it receives at its address, so spoofed packets hold nothing), and
/// one past its address's bound of TLS handshakes in flight is refused. None: handled here.
pub fn screen(incoming: quinn::Incoming, gates: &Gates) -> Option<Screened> {
    let peer = incoming.remote_address();
    if !incoming.remote_address_validated() && incoming.may_retry() {
        let _ = incoming.retry();
        return None;
    }
    let Some(pass) = gates.tls.enter(peer.ip()) else {
        // Logged at debug: a flood of connections must not become a flood of log lines.
        tracing::debug!(%peer, "refused a cluster connection: too many TLS handshakes in flight");
        incoming.refuse();
        return None;
    };
    Some(Screened { incoming, pass })
}

/// The rest of a join: the TLS handshake within [`TLS_TIMEOUT`], a place among the hellos of the
/// certificate's name (the address's in the development mode), and the hello ([`handshake`]).
pub async fn join(screened: Screened, gates: &Gates, limits: &Limits) -> Option<Joining> {
    let peer = screened.incoming.remote_address();
    let conn = match tokio::time::timeout(TLS_TIMEOUT, screened.incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::warn!(%peer, "refused a cluster connection: {e}");
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, "a cluster connection's TLS handshake did not finish within {TLS_TIMEOUT:?}");
            return None;
        }
    };
    drop(screened.pass);
    let name = identity::of_peer(&conn).map_or_else(|| peer.ip().to_string(), |shown| shown.name);
    let Some(_pass) = gates.hellos.enter(name.clone()) else {
        let why = format!("too many handshakes in flight for '{name}'; dial again");
        tracing::debug!(%peer, "{why}");
        conn.close(VarInt::from_u32(close::BUSY), why.as_bytes());
        return None;
    };
    handshake(conn, limits).await
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
    fn a_gate_bounds_handshakes_overall_and_per_key() {
        let gate: Arc<Gate<IpAddr>> = Gate::new(16, 4);
        let a: IpAddr = [127, 0, 0, 2].into();
        let mine: Vec<_> = (0..4).map(|_| gate.enter(a).expect("room")).collect();
        assert!(gate.enter(a).is_none(), "one address past its bound");
        let others: Vec<_> = (0..12)
            .map(|i| gate.enter([10, 0, (i / 4) as u8, 1].into()).expect("room"))
            .collect();
        assert_eq!(gate.in_flight(), 16);
        assert!(gate.enter([10, 9, 9, 9].into()).is_none(), "past the overall bound");
        drop(mine);
        assert!(gate.enter(a).is_some(), "places are given back");
        drop(others);
        assert_eq!(gate.in_flight(), 0);
        assert!(
            gate.state.locked().1.is_empty(),
            "no key is kept once its handshakes end"
        );
    }

    #[test]
    fn one_certificate_holds_few_hello_places_whatever_its_addresses() {
        let gates = Gates::default();
        let greedy: Vec<_> = (0..MAX_HELLOS_PER_NAME)
            .map(|_| gates.hellos.enter("node-greedy".to_string()).expect("room"))
            .collect();
        assert!(gates.hellos.enter("node-greedy".to_string()).is_none());
        assert!(
            gates.hellos.enter("node-good".to_string()).is_some(),
            "another name still gets in"
        );
        drop(greedy);
    }

    #[test]
    fn hellos_are_small_and_carry_no_payload() {
        let limits = hello_limits(&Limits::default());
        assert_eq!(limits.max_header, MAX_HELLO);
        assert_eq!(limits.max_payload, 0);
        assert!(limits.budget.reserve(u64::from(MAX_HELLO)).is_ok());
    }
}
