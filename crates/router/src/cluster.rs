//! The router's shared view of the cluster: membership (written only by the MembershipActor), the
//! routing snapshot requests read without a hop, the live links, and the balancer.
use mesh::sync::{Locked, ReadWrite};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use mesh::cluster::Limits;
use tokio::sync::watch;

use crate::link::Link;
use crate::membership::{LinkId, Membership, MembershipSettings, RoutingTable};
use crate::membership_actor::MembershipMsg;
use crate::route::Balancer;
use ractor::ActorRef;

/// How the router routes, from its flags.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Deadline of a request without a `timeout` parameter.
    pub request_timeout: Duration,
    pub max_attempts: u32,
    /// Longest wait for a ready replica, within the deadline.
    pub route_wait: Duration,
}

pub struct Cluster {
    membership: RwLock<Membership>,
    routing: RwLock<Arc<RoutingTable>>,
    changed: watch::Sender<u64>,
    links: RwLock<HashMap<LinkId, Arc<Link>>>,
    balancer: Mutex<Balancer>,
    membership_actor: RwLock<Option<ActorRef<MembershipMsg>>>,
    next_link: AtomicU64,
    pub limits: Limits,
    pub route: RouteSettings,
    pub started: Instant,
    /// This router's id, told to nodes in the welcome.
    pub id: String,
}

impl Cluster {
    pub fn new(
        id: String,
        membership: MembershipSettings,
        balancer: Balancer,
        limits: Limits,
        route: RouteSettings,
    ) -> Self {
        let membership = Membership::new(membership);
        let routing = Arc::new(membership.routing_table());
        Cluster {
            membership: RwLock::new(membership),
            routing: RwLock::new(routing),
            changed: watch::channel(0).0,
            links: RwLock::new(HashMap::new()),
            balancer: Mutex::new(balancer),
            membership_actor: RwLock::new(None),
            next_link: AtomicU64::new(1),
            limits,
            route,
            started: Instant::now(),
            id,
        }
    }

    /// The routing snapshot of the moment (an `Arc`, so a request reads it without holding a lock).
    pub fn routing(&self) -> Arc<RoutingTable> {
        self.routing.reading().clone()
    }

    /// Reads membership (queries only: the MembershipActor is its one writer).
    pub fn membership(&self) -> RwLockReadGuard<'_, Membership> {
        self.membership.reading()
    }

    /// Changes membership and, when `f` says the view changed, publishes the new routing snapshot
    /// and wakes the requests waiting for one; only the MembershipActor calls it.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Membership) -> bool) {
        let table = {
            let mut m = self.membership.writing();
            if !f(&mut m) {
                return;
            }
            Arc::new(m.routing_table())
        };
        *self.routing.writing() = table;
        self.changed.send_modify(|g| *g += 1);
    }

    /// Wakes when the routing snapshot changes (requests waiting for a replica watch it).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Sends a membership change to the MembershipActor (the current one, if it was restarted).
    pub fn tell(&self, msg: MembershipMsg) {
        let actor = self.membership_actor.reading().clone();
        match actor {
            Some(a) => {
                let _ = a.cast(msg);
            }
            None => tracing::warn!("membership actor is not running; a membership event was dropped"),
        }
    }

    pub(crate) fn set_membership_actor(&self, actor: ActorRef<MembershipMsg>) {
        *self.membership_actor.writing() = Some(actor);
    }

    pub fn balancer(&self) -> MutexGuard<'_, Balancer> {
        self.balancer.locked()
    }

    pub fn next_link_id(&self) -> LinkId {
        self.next_link.fetch_add(1, Ordering::Relaxed)
    }

    pub fn link(&self, id: LinkId) -> Option<Arc<Link>> {
        self.links.reading().get(&id).cloned()
    }

    pub fn links(&self) -> Vec<Arc<Link>> {
        self.links.reading().values().cloned().collect()
    }

    pub(crate) fn add_link(&self, link: Arc<Link>) {
        self.links.writing().insert(link.id, link);
    }

    pub(crate) fn remove_link(&self, id: LinkId) -> Option<Arc<Link>> {
        let gone = self.links.writing().remove(&id);
        self.balancer().forget(id);
        gone
    }
}
