//! The link registry: each connected node's QUIC connection as the request path sees it, with the
//! router's in-flight count (held by permits) and the mailbox of the link's actor.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use mesh::cluster::shm::Outbound;
use mesh::cluster::Limits;
use mesh::sync::ReadWrite;
use quinn::{Connection, VarInt};

use crate::membership::LinkId;
use crate::messages::{LinkMsg, Mailbox};

/// One connected node: its connection, the router's in-flight count, and its actor.
pub struct Link {
    pub id: LinkId,
    pub name: String,
    pub conn: Connection,
    pub address: SocketAddr,
    inflight: AtomicU32,
    /// The link's actor, which owns the control stream (placement sends commands through it).
    pub control: Mailbox<LinkMsg>,
    /// The node's shared-memory arena, when it runs on this host (set once, before the node is
    /// welcomed and routed to).
    pub out: OnceLock<Arc<Outbound>>,
    /// What frames from this node are read under: a receive budget of the link's own, within the
    /// router's ([`Limits::for_link`]), so one node's streams cannot take the others' room.
    pub limits: Limits,
}

impl Link {
    pub fn new(id: LinkId, name: String, conn: Connection, control: Mailbox<LinkMsg>, limits: Limits) -> Self {
        Link {
            id,
            name,
            address: conn.remote_address(),
            conn,
            inflight: AtomicU32::new(0),
            control,
            out: OnceLock::new(),
            limits,
        }
    }

    /// The node's arena, if it shares this host.
    pub fn out(&self) -> Option<&Outbound> {
        self.out.get().map(|o| &**o)
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

/// The live links by id. The supervisor adds a link before membership hears of its node, so the
/// routing view never names a link the request path cannot find.
#[derive(Default)]
pub struct Links {
    links: RwLock<HashMap<LinkId, Arc<Link>>>,
    next: AtomicU64,
}

impl Links {
    pub fn next_id(&self) -> LinkId {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn get(&self, id: LinkId) -> Option<Arc<Link>> {
        self.links.reading().get(&id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Link>> {
        self.links.reading().values().cloned().collect()
    }

    pub(crate) fn add(&self, link: Arc<Link>) {
        self.links.writing().insert(link.id, link);
    }

    pub(crate) fn remove(&self, id: LinkId) -> Option<Arc<Link>> {
        self.links.writing().remove(&id)
    }
}
