//! The membership table: which nodes are in the cluster, what they serve and how loaded they are, fed with link events.
//!
//! Sans-IO: every event carries `now`, nothing here reads a clock or touches a socket. The router's link
//! actors convert wire messages into these calls and republish [`Membership::routing_table`] whenever
//! [`Membership::generation`] moves.
mod table;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

pub use table::{IndexRow, Replica, ResolveError, Resolved, RoutingTable};

/// The router's name for one QUIC connection to a node; unique for the life of the router process.
pub type LinkId = u64;

/// What a node says first on a new link.
#[derive(Debug, Clone)]
pub struct NodeHello {
    /// The node's name, its identity in the cluster.
    pub name: String,
    /// A random id fresh per process start: a new one means the node restarted.
    pub incarnation: u64,
    /// The node's address as the router sees it.
    pub address: String,
    /// The devices the node runs models on, as it names them.
    pub devices: Vec<String>,
    /// Every model version the node serves, ready or not.
    pub models: Vec<ModelStatus>,
    /// Bytes of memory the node offers for placed models.
    pub memory: u64,
    /// SHA-256 of the public key of the certificate that proved the name (None in the development mode).
    pub key: Option<[u8; 32]>,
}

pub use mesh::cluster::session::router::{ModelEvent, ModelLoad, ModelStatus};

/// One model version's load in a node's periodic report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Requests the node is executing.
    pub inflight: u32,
    /// Requests waiting in the node's queues.
    pub queued: u32,
    /// Recent execution time per request, in microseconds.
    pub exec_us: u64,
}

/// Where a node stands; only `Up` nodes are routable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeState {
    Up,
    /// The node is stopping cleanly: no new requests, its in-flight ones finish.
    Draining,
    /// Nothing heard from the node for `silence_after`; routable again once it speaks.
    Silent,
    /// The link is gone; the entry is kept for status until `forget_lost_after`.
    Lost,
    /// The node said goodbye (a clean stop, such as a restart); kept like a lost node, so requests
    /// for models only it served wait for it to come back instead of failing as unknown at once.
    Left,
}

impl NodeState {
    /// The state as status output writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Draining => "draining",
            NodeState::Silent => "silent",
            NodeState::Lost => "lost",
            NodeState::Left => "left",
        }
    }
}

/// Timings of the membership table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembershipSettings {
    /// A node not heard from for this long is Silent (not routable). Nodes report every ~250 ms.
    pub silence_after: Duration,
    /// A Lost node is forgotten this long after its link went.
    pub forget_lost_after: Duration,
}

impl Default for MembershipSettings {
    fn default() -> Self {
        MembershipSettings {
            silence_after: Duration::from_secs(2),
            forget_lost_after: Duration::from_secs(60),
        }
    }
}

/// What a hello meant; the caller must close [`Joined::link_to_close`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// A node name the table did not hold.
    New,
    /// The same process (same name and incarnation) over a new link, for example after a partition healed.
    Rejoined { old_link: Option<LinkId> },
    /// The same name with another incarnation: the process restarted and replaces the old member.
    Replaced {
        old_incarnation: u64,
        old_link: Option<LinkId>,
    },
}

impl Joined {
    /// The old link the caller must close (None when it was already lost or is the same link).
    pub fn link_to_close(&self) -> Option<LinkId> {
        match *self {
            Joined::New => None,
            Joined::Rejoined { old_link } | Joined::Replaced { old_link, .. } => old_link,
        }
    }
}

/// One model version as a node reports it, for status output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeModel {
    pub name: String,
    pub version: i64,
    pub ready: bool,
    pub reason: String,
    pub placed: bool,
    /// Requests of this version running or queued on the node, as it last reported.
    pub inflight: u32,
}

/// One node as status output shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSummary {
    pub name: String,
    pub incarnation: u64,
    pub address: String,
    /// The live link (None once Lost).
    pub link: Option<LinkId>,
    pub state: NodeState,
    pub devices: Vec<String>,
    pub memory: u64,
    pub models: Vec<NodeModel>,
    /// Time since the router received the node's last load report (None: no report yet).
    pub last_report_age: Option<Duration>,
}

struct Served {
    status: ModelStatus,
    load: Load,
}

struct Node {
    incarnation: u64,
    key: Option<[u8; 32]>,
    address: String,
    devices: Vec<String>,
    memory: u64,
    link: Option<LinkId>,
    draining: bool,
    silent: bool,
    lost_at: Option<Instant>,
    /// The link went away after a goodbye (a clean stop), not a failure.
    left: bool,
    /// Any message from the node proves it alive.
    last_heard: Instant,
    last_report: Option<Instant>,
    models: BTreeMap<(String, i64), Served>,
}

impl Node {
    fn state(&self) -> NodeState {
        if self.lost_at.is_some() {
            if self.left {
                NodeState::Left
            } else {
                NodeState::Lost
            }
        } else if self.draining {
            NodeState::Draining
        } else if self.silent {
            NodeState::Silent
        } else {
            NodeState::Up
        }
    }

    /// Records that the node spoke; returns true when that brought it back from Silent.
    fn heard(&mut self, now: Instant) -> bool {
        self.last_heard = now;
        std::mem::replace(&mut self.silent, false)
    }
}

/// The cluster's members, keyed by node name, with the live link of each.
pub struct Membership {
    settings: MembershipSettings,
    nodes: BTreeMap<String, Node>,
    /// Live links only: a lost or replaced link is absent, so its late events are ignored.
    links: HashMap<LinkId, String>,
    generation: u64,
}

impl Membership {
    /// An empty table.
    pub fn new(settings: MembershipSettings) -> Self {
        Membership {
            settings,
            nodes: BTreeMap::new(),
            links: HashMap::new(),
            generation: 0,
        }
    }

    /// Moves whenever the routing view changes; republish the routing table when it does.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self, changed: bool) -> bool {
        if changed {
            self.generation += 1;
        }
        changed
    }

    fn node_mut(&mut self, link: LinkId) -> Option<&mut Node> {
        let name = self.links.get(&link)?;
        self.nodes.get_mut(name)
    }

    /// Whether a node proving `key` may take `name`: not while a live member holds the name with another key
    /// (a restart of the same node shows the same key; another certificate for the name waits until the member
    /// leaves or is lost).
    pub fn admits(&self, name: &str, key: Option<&[u8; 32]>) -> Result<(), String> {
        let Some(node) = self.nodes.get(name) else {
            return Ok(());
        };
        let live = node.link.is_some() && node.lost_at.is_none();
        match (node.key.as_ref(), key) {
            (Some(held), Some(shown)) if live && held != shown => Err(format!(
                "node name '{name}' is held by a live member with another certificate key; a certificate cannot \
                 take over a live member's name (it may join once that member leaves or is lost)"
            )),
            _ => Ok(()),
        }
    }

    /// A node said hello on `link`. The last hello for a name wins, unless [`Membership::admits`] refuses it (then
    /// nothing changes); the old link, if any, must be closed.
    pub fn join(&mut self, link: LinkId, hello: NodeHello, now: Instant) -> Result<Joined, String> {
        self.admits(&hello.name, hello.key.as_ref())?;
        // A second hello on a link that carried another name: that other node is gone.
        if let Some(previous) = self.links.get(&link).filter(|n| **n != hello.name).cloned() {
            self.nodes.remove(&previous);
            self.links.remove(&link);
        }
        let joined = match self.nodes.get(&hello.name) {
            None => Joined::New,
            Some(old) => {
                let old_link = old.link.filter(|&l| l != link);
                if old.incarnation == hello.incarnation {
                    Joined::Rejoined { old_link }
                } else {
                    Joined::Replaced {
                        old_incarnation: old.incarnation,
                        old_link,
                    }
                }
            }
        };
        if let Some(old) = joined.link_to_close() {
            self.links.remove(&old);
        }
        let models = hello
            .models
            .into_iter()
            .map(|status| {
                let key = (status.name.clone(), status.version);
                (
                    key,
                    Served {
                        status,
                        load: Load::default(),
                    },
                )
            })
            .collect();
        let node = Node {
            incarnation: hello.incarnation,
            key: hello.key,
            address: hello.address,
            devices: hello.devices,
            memory: hello.memory,
            link: Some(link),
            draining: false,
            silent: false,
            lost_at: None,
            left: false,
            last_heard: now,
            last_report: None,
            models,
        };
        self.links.insert(link, hello.name.clone());
        self.nodes.insert(hello.name, node);
        self.changed(true);
        Ok(joined)
    }

    /// A model version was added, changed or removed on the node behind `link`; returns whether the view changed.
    pub fn model_event(&mut self, link: LinkId, event: ModelEvent, now: Instant) -> bool {
        let Some(node) = self.node_mut(link) else {
            return false;
        };
        let woke = node.heard(now);
        let changed = match event {
            ModelEvent::Update(status) => {
                let key = (status.name.clone(), status.version);
                let load = node.models.get(&key).map(|s| s.load).unwrap_or_default();
                node.models.insert(key, Served { status, load });
                true
            }
            ModelEvent::Removed { name, version } => node.models.remove(&(name, version)).is_some(),
        };
        self.changed(changed || woke)
    }

    /// A load report from the node behind `link`. A report is complete: versions it omits have no load.
    /// Returns whether the view changed (a load number moved, or the node came back from Silent).
    pub fn report(&mut self, link: LinkId, loads: Vec<ModelLoad>, now: Instant) -> bool {
        let Some(node) = self.node_mut(link) else {
            return false;
        };
        let mut changed = node.heard(now);
        node.last_report = Some(now);
        let mut fresh: HashMap<(String, i64), Load> = loads
            .into_iter()
            .map(|l| {
                let load = Load {
                    inflight: l.inflight,
                    queued: l.queued,
                    exec_us: l.exec_us,
                };
                ((l.name, l.version), load)
            })
            .collect();
        for (key, served) in node.models.iter_mut() {
            let load = fresh.remove(key).unwrap_or_default();
            changed |= served.load != load;
            served.load = load;
        }
        self.changed(changed)
    }

    /// The node behind `link` is stopping cleanly: it takes no new requests.
    pub fn draining(&mut self, link: LinkId, now: Instant) -> bool {
        let Some(node) = self.node_mut(link) else {
            return false;
        };
        node.heard(now);
        let changed = !std::mem::replace(&mut node.draining, true);
        self.changed(changed)
    }

    /// The node behind `link` left cleanly: Left (not routable), kept like a lost node for a while,
    /// so requests for models only it served wait for it to come back.
    pub fn goodbye(&mut self, link: LinkId, now: Instant) -> bool {
        self.gone(link, now, true)
    }

    /// The transport lost `link`: its node is Lost (not routable) and kept for status for a while.
    pub fn link_lost(&mut self, link: LinkId, now: Instant) -> bool {
        self.gone(link, now, false)
    }

    /// The node of `link` is gone (`left`: after a goodbye): not routable, kept for a while.
    fn gone(&mut self, link: LinkId, now: Instant, left: bool) -> bool {
        let Some(name) = self.links.remove(&link) else {
            return false;
        };
        let Some(node) = self.nodes.get_mut(&name) else {
            return false;
        };
        node.link = None;
        node.lost_at = Some(now);
        node.left = left;
        self.changed(true)
    }

    /// Marks nodes not heard from for `silence_after` as Silent and forgets old Lost entries.
    pub fn tick(&mut self, now: Instant) -> bool {
        let settings = self.settings;
        let mut changed = false;
        self.nodes.retain(|_, node| match node.lost_at {
            Some(lost) => {
                let keep = now.saturating_duration_since(lost) < settings.forget_lost_after;
                changed |= !keep;
                keep
            }
            None => {
                if !node.silent && now.saturating_duration_since(node.last_heard) >= settings.silence_after {
                    node.silent = true;
                    changed = true;
                }
                true
            }
        });
        self.changed(changed)
    }

    /// The state of the node named `name`, if the table holds it.
    pub fn state(&self, name: &str) -> Option<NodeState> {
        self.nodes.get(name).map(Node::state)
    }

    /// The live link of the node named `name`.
    pub fn link_of(&self, name: &str) -> Option<LinkId> {
        self.nodes.get(name).and_then(|n| n.link)
    }

    /// The name of the node behind a live link.
    pub fn node_of(&self, link: LinkId) -> Option<&str> {
        self.links.get(&link).map(String::as_str)
    }

    /// Whether at least one Up node serves at least one ready model.
    pub fn ready(&self) -> bool {
        self.nodes
            .values()
            .any(|n| n.state() == NodeState::Up && n.models.values().any(|s| s.status.ready))
    }

    /// Every node, sorted by name, for status output.
    pub fn nodes(&self, now: Instant) -> Vec<NodeSummary> {
        self.nodes
            .iter()
            .map(|(name, n)| NodeSummary {
                name: name.clone(),
                incarnation: n.incarnation,
                address: n.address.clone(),
                link: n.link,
                state: n.state(),
                devices: n.devices.clone(),
                memory: n.memory,
                models: n
                    .models
                    .values()
                    .map(|s| NodeModel {
                        name: s.status.name.clone(),
                        version: s.status.version,
                        ready: s.status.ready,
                        reason: s.status.reason.clone(),
                        placed: s.status.placed,
                        inflight: s.load.inflight,
                    })
                    .collect(),
                last_report_age: n.last_report.map(|t| now.saturating_duration_since(t)),
            })
            .collect()
    }

    /// An immutable snapshot for request tasks: routable replicas per model version, and what every node holds.
    pub fn routing_table(&self) -> RoutingTable {
        let mut builder = table::Builder::new(self.generation);
        for (name, node) in &self.nodes {
            let state = node.state();
            for served in node.models.values() {
                builder.add(name, node.link, state, &served.status, served.load);
            }
        }
        builder.finish()
    }
}
