//! The routing view: membership (written only by the MembershipActor), the routing snapshot
//! requests read without a hop, the live links, the balancer, and how the router routes.
use mesh::sync::{Locked, ReadWrite};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use mesh::cluster::Limits;
use tokio::sync::watch;

use super::links::{Link, Links};
use crate::membership::{LinkId, Membership, MembershipSettings, RoutingTable};
use crate::route::Balancer;

/// How the router routes, from its flags.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Deadline of a request without a `timeout` parameter.
    pub request_timeout: Duration,
    pub max_attempts: u32,
    /// Longest wait for a ready replica, within the deadline.
    pub route_wait: Duration,
}

pub struct RoutingView {
    membership: RwLock<Membership>,
    routing: RwLock<Arc<RoutingTable>>,
    changed: watch::Sender<u64>,
    pub links: Links,
    balancer: Mutex<Balancer>,
    pub limits: Limits,
    pub route: RouteSettings,
    pub started: Instant,
    /// This router's id, told to nodes in the welcome.
    pub id: String,
}

impl RoutingView {
    pub fn new(
        id: String,
        membership: MembershipSettings,
        balancer: Balancer,
        limits: Limits,
        route: RouteSettings,
    ) -> Self {
        let membership = Membership::new(membership);
        let routing = Arc::new(membership.routing_table());
        RoutingView {
            membership: RwLock::new(membership),
            routing: RwLock::new(routing),
            changed: watch::channel(0).0,
            links: Links::default(),
            balancer: Mutex::new(balancer),
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

    pub fn balancer(&self) -> MutexGuard<'_, Balancer> {
        self.balancer.locked()
    }

    /// The link `id`, while it is live.
    pub fn link(&self, id: LinkId) -> Option<Arc<Link>> {
        self.links.get(id)
    }

    /// Removes an ended link, and the balancer's memory of it.
    pub(crate) fn remove_link(&self, id: LinkId) -> Option<Arc<Link>> {
        let gone = self.links.remove(id);
        self.balancer().forget(id);
        gone
    }
}
