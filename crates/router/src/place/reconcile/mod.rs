//! Placement reconciliation, sans-IO: a snapshot of the cluster goes in (nodes and what they report, the
//! cluster repository, request usage, `now`), and commands for the nodes plus answers to waiting operators
//! come out.
//!
//! [`Reconcile`] holds everything the PlacementActor decides with: the [`Placer`] and [`Autoscaler`], the
//! models the cluster wants, what each replica was shipped with, places and evicts in flight, drains,
//! fencing and the operators' waiting requests (by [`WaiterId`]). The actor only does the I/O around it:
//! - it scans the repositories and reads model directories off the async threads when [`Reconcile`] asks
//!   ([`Reconcile::scan_due`], [`Reconcile::scanned`], [`Reconcile::follow`] answer the [`Read`]s to do,
//!   and [`Reconcile::read_done`] takes each outcome);
//! - every tick it feeds a [`Snapshot`] to [`Reconcile::tick`] and carries out the [`Output`]: it sends the
//!   [`Command`]s on the nodes' control streams (telling [`Reconcile::unsent`] about a node whose link went
//!   away meanwhile), answers the waiters, and publishes the view.
//!
//! Nothing here reads a clock, touches a file or a socket.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use mesh::control::ControlMode;

use super::{
    Action, Autoscaler, EventKind, ModelSpec, ModelView, NodeSpec, NodeState, Observed, PlaceEvent, PlacementSettings,
    Placer, ReplicaState,
};
use crate::membership::{NodeState as Member, NodeSummary};
use crate::repository::RepoModel;

mod lead;
mod requests;
mod rollouts;
#[cfg(test)]
mod rollouts_tests;
#[cfg(test)]
mod tests;

pub use lead::refuse;
pub use requests::WaiterId;

/// The PlacementActor's published state, for status and the repository index.
#[derive(Debug, Clone, Default)]
pub struct PlacementView {
    pub models: Vec<ModelView>,
    pub events: Vec<PlaceEvent>,
    /// Models of the cluster repository that cannot be read (bad config, unreadable files).
    pub errors: Vec<(String, String)>,
    /// Nodes an operator drains (`mesh-ops drain`), and whether each is empty yet.
    pub drains: Vec<(String, bool)>,
    /// Each model's rollout (`mesh-ops rollout`), as the intent holds it.
    pub rollouts: Vec<(String, crate::rollout::Stored)>,
}

/// What one tick decides with.
pub struct Snapshot<'a> {
    pub now: Instant,
    /// Every node membership knows (a node with no live link is not sent anything).
    pub nodes: &'a [NodeSummary],
    /// The cluster repository as read so far.
    pub repo: &'a [Arc<RepoModel>],
    /// When requests last used each model.
    pub used: &'a [(String, Instant)],
}

impl Snapshot<'_> {
    fn model(&self, name: &str) -> Option<&Arc<RepoModel>> {
        self.repo.iter().find(|m| m.name == name)
    }
}

/// A message for one node's control stream.
#[derive(Debug, Clone)]
pub enum Command {
    /// Load `model` (its manifest) with `config` (Triton's JSON config override; "" for its
    /// config.pbtxt) stamped with `epoch`; `again`: a replica there holds an older copy.
    Place {
        node: String,
        model: Arc<RepoModel>,
        config: String,
        epoch: u64,
        again: bool,
    },
    Evict {
        node: String,
        model: String,
        epoch: u64,
    },
    /// A drained node may stop.
    MayStop {
        node: String,
        epoch: u64,
    },
    /// This leader's epoch, told once per node process.
    Fence {
        node: String,
        epoch: u64,
    },
}

impl Command {
    pub fn node(&self) -> &str {
        match self {
            Command::Place { node, .. }
            | Command::Evict { node, .. }
            | Command::MayStop { node, .. }
            | Command::Fence { node, .. } => node,
        }
    }
}

/// A model directory to read (off the async threads) before the next tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub model: String,
    /// The config override to read it with ("" for config.pbtxt).
    pub config: String,
    /// Asked by the intent a leader stored (a model the directory of which may be missing here).
    pub intent: bool,
}

/// What a tick asks of the actor.
#[derive(Debug, Default)]
pub struct Output {
    pub commands: Vec<Command>,
    /// Operators' requests answered this tick.
    pub answers: Vec<(WaiterId, mesh::Result<()>)>,
    /// Loads that failed: what the model served before goes back into the repository view.
    pub restore: Vec<Arc<RepoModel>>,
    /// Models no longer wanted and held by no node: out of the repository view and usage.
    pub forget: Vec<String>,
    /// Placement events new since the last tick (to log and count).
    pub events: Vec<PlaceEvent>,
    /// The operator's intent, to store in etcd for the next leader (set when this router acted as
    /// the elected leader).
    pub intent: Option<crate::lead::Desired>,
    pub view: PlacementView,
}

/// The PlacementActor's decisions and what they remember.
pub struct Reconcile {
    settings: PlacementSettings,
    /// Whether routers share placement through etcd (intent is stored, changes confirmed there).
    elected: bool,
    placer: Placer,
    scaler: Autoscaler,
    /// Models the cluster wants (explicit mode: those loaded).
    wanted: BTreeSet<String>,
    /// Models of the repository that cannot be read, with why.
    errors: BTreeMap<String, String>,
    /// Evicts sent and not yet seen gone.
    evicting: BTreeSet<(String, String)>,
    /// What each replica was last shipped with ([`shipment`]; a change ships again).
    shipped: HashMap<(String, String), String>,
    /// Places sent and not answered yet.
    pending: BTreeSet<(String, String)>,
    /// Operator drains: node name → incarnation drained (a restarted node is not drained).
    drains: BTreeMap<String, u64>,
    drained: BTreeSet<String>,
    waiters: requests::Waiters,
    /// The last failed placement of each model: when, and why.
    failed: HashMap<String, (Instant, String)>,
    last_scan: Option<Instant>,
    /// The last event already handed out.
    logged: Option<(Instant, EventKind, String, String)>,
    /// Until when nothing is placed (see `PlacementSettings::startup_grace`).
    settle_until: Instant,
    /// The epoch this router acts with this tick (None: it does not lead).
    epoch: Option<u64>,
    /// Set when this router just took over: keep the replicas there are until its autoscaler decides.
    taking_over: bool,
    /// Nodes (name, incarnation) told this leader's epoch.
    fenced: BTreeSet<(String, u64)>,
    /// The stored intent last applied (from etcd).
    applied: Option<crate::lead::Desired>,
    /// Replica bounds set at run time (`scale`), kept for the next leader.
    scaled: BTreeMap<String, (u32, u32)>,
    /// Each model's rollout, kept for the next leader (the operator's and the guard's decisions).
    rollouts: BTreeMap<String, crate::rollout::Stored>,
    /// The leader's running rollouts with their step's answers (the guard's state; a new leader
    /// starts each step's count over), each with when it started (names it among the model's).
    live: BTreeMap<String, (crate::rollout::Rollout, u64)>,
    /// Replicas shipped with a rollout's config and not answered yet, and each model's latest
    /// failure to place one: (node, why).
    rollout_ships: BTreeSet<(String, String)>,
    rollout_failed: BTreeMap<String, (String, String)>,
}

/// What a replica holds: the files' content key and the config it was placed with.
pub fn shipment(m: &RepoModel, config: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    config.hash(&mut h);
    format!("{}/{:016x}", m.manifest.key, h.finish())
}

impl Reconcile {
    /// `wanted`: in explicit mode, the models loaded at start; `elected`: routers share placement
    /// through etcd.
    pub fn new(settings: PlacementSettings, wanted: BTreeSet<String>, elected: bool, now: Instant) -> Self {
        Reconcile {
            placer: Placer::new(settings.place.clone()),
            scaler: Autoscaler::new(settings.scale),
            settle_until: now + settings.startup_grace,
            settings,
            elected,
            wanted,
            errors: BTreeMap::new(),
            evicting: BTreeSet::new(),
            shipped: HashMap::new(),
            pending: BTreeSet::new(),
            drains: BTreeMap::new(),
            drained: BTreeSet::new(),
            waiters: requests::Waiters::default(),
            failed: HashMap::new(),
            last_scan: None,
            logged: None,
            epoch: None,
            taking_over: false,
            fenced: BTreeSet::new(),
            applied: None,
            scaled: BTreeMap::new(),
            rollouts: BTreeMap::new(),
            live: BTreeMap::new(),
            rollout_ships: BTreeSet::new(),
            rollout_failed: BTreeMap::new(),
        }
    }

    /// Whether the repositories are to be scanned before this tick (first tick; then every
    /// `poll_every` in poll mode).
    pub fn scan_due(&self, now: Instant) -> bool {
        match self.last_scan {
            None => true,
            Some(t) => self.settings.mode == ControlMode::Poll && now.duration_since(t) >= self.settings.poll_every,
        }
    }

    /// Takes a scan's outcome: the model directories found and the names that cannot be served
    /// (found twice). Outside explicit mode what is found is what the cluster wants. Answers the
    /// directories to read (hashing them; a model loaded with overrides is kept until loaded again).
    pub fn scanned(
        &mut self,
        now: Instant,
        found: BTreeSet<String>,
        errors: BTreeMap<String, String>,
        repo: &[Arc<RepoModel>],
    ) -> Vec<Read> {
        self.last_scan = Some(now);
        self.errors = errors;
        if self.settings.mode != ControlMode::Explicit {
            for gone in self.wanted.difference(&found) {
                tracing::info!(model = %gone, "removed from the cluster repository; unloading it everywhere");
            }
            self.wanted = found.clone();
        }
        found
            .into_iter()
            .filter(|name| self.wanted.contains(name))
            .filter(|name| {
                !repo
                    .iter()
                    .any(|m| m.name == *name && (m.override_files.is_some() || !m.config_override.is_empty()))
            })
            .map(|model| Read {
                model,
                config: String::new(),
                intent: false,
            })
            .collect()
    }

    /// A read's outcome (the actor put a model read well into the repository view).
    pub fn read_done(&mut self, read: &Read, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.errors.remove(&read.model);
                if read.intent {
                    self.wanted.insert(read.model.clone());
                }
            }
            Err(why) => {
                self.errors.insert(read.model.clone(), why);
            }
        }
    }

    /// One pass: what nodes report, the repository and usage go into the placer and autoscaler; when
    /// this router leads (and the start-up grace is over), their decisions come out as commands.
    pub fn tick(&mut self, snap: &Snapshot) -> Output {
        let now = snap.now;
        let mut out = Output::default();
        let live: BTreeSet<&str> = snap
            .nodes
            .iter()
            .filter(|n| n.link.is_some())
            .map(|n| n.name.as_str())
            .collect();
        self.pending.retain(|(_, node)| live.contains(node.as_str()));
        self.shipped.retain(|(_, node), _| live.contains(node.as_str()));
        self.placer.set_nodes(self.node_specs(snap.nodes), now);
        if std::mem::take(&mut self.taking_over) {
            // The autoscaler's decisions lived on the old leader: keep the replicas there are
            // (within the bounds) until this one's own autoscaler decides, after its delays.
            for m in self.placer.view() {
                let ready = self.placer.ready(&m.name);
                if ready > 0 {
                    self.placer.set_desired(&m.name, ready);
                }
            }
        }
        self.placer.set_models(self.specs(snap.repo), now);
        self.apply_bounds();
        self.observe(snap.nodes, now);
        for (model, at) in snap.used {
            self.placer.used(model, *at);
        }
        self.autoscale(snap, now);
        if let Some(epoch) = self.epoch.filter(|_| now >= self.settle_until) {
            if self.elected {
                self.fence(snap.nodes, epoch, &mut out);
            }
            let actions = self.placer.tick(now);
            self.act(actions, snap, epoch, &mut out);
            self.reship(snap, epoch, &mut out);
            if self.elected {
                out.intent = Some(self.intent(snap.repo));
            }
        }
        // One view of the placer serves the answers, the clean-up and what is published.
        let view = self.placer.view();
        self.answer_waiters(&view, snap.nodes, &mut out);
        self.forget_unwanted(&view, snap, &mut out);
        self.publish(view, &mut out);
        out
    }

    /// A command the actor could not send (the node's link went away since the snapshot).
    pub fn unsent(&mut self, command: &Command, now: Instant) {
        match command {
            Command::Place { node, model, again, .. } => {
                let pair = (model.name.clone(), node.clone());
                self.shipped.remove(&pair);
                self.pending.remove(&pair);
                if !again {
                    let why = Observed::Failed("the node is not connected".into());
                    self.placer.observed(node, &model.name, why, now);
                }
            }
            Command::Evict { node, model, .. } => {
                self.evicting.remove(&(model.clone(), node.clone()));
            }
            Command::Fence { node, .. } => self.fenced.retain(|(n, _)| n != node),
            Command::MayStop { .. } => {}
        }
    }

    fn specs(&self, repo: &[Arc<RepoModel>]) -> Vec<ModelSpec> {
        repo.iter()
            // A model whose directory became unreadable keeps what it was last read as (a failed
            // reload keeps the versions serving); one never read is not in the repository view.
            .filter(|m| self.wanted.contains(&m.name))
            .map(|m| ModelSpec {
                name: m.name.clone(),
                min: m.min,
                max: m.max,
                footprint: m.footprint,
                needs_gpu: m.needs_gpu,
            })
            .collect()
    }

    fn node_specs(&self, nodes: &[NodeSummary]) -> Vec<NodeSpec> {
        nodes
            .iter()
            .filter(|n| n.link.is_some() && matches!(n.state, Member::Up | Member::Draining | Member::Silent))
            .map(|n| {
                let drained = self.drains.get(&n.name) == Some(&n.incarnation);
                NodeSpec {
                    name: n.name.clone(),
                    gpus: n.devices.iter().filter(|d| d.starts_with("gpu")).count() as u32,
                    memory: n.memory,
                    state: if n.state == Member::Draining || drained {
                        NodeState::Draining
                    } else {
                        NodeState::Up
                    },
                }
            })
            .collect()
    }

    /// Feeds the placer what nodes report: a placed replica ready or gone, an eviction done, a
    /// model the node serves from its own repository (never placed over).
    fn observe(&mut self, nodes: &[NodeSummary], now: Instant) {
        let known: BTreeSet<(String, String)> = self
            .placer
            .view()
            .iter()
            .flat_map(|m| m.replicas.iter().map(move |r| (m.name.clone(), r.node.clone())))
            .collect();
        for n in nodes.iter().filter(|n| n.link.is_some()) {
            let mut reported: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
            for m in &n.models {
                let e = reported.entry(m.name.as_str()).or_default();
                e.0 |= m.ready;
                e.1 |= m.placed;
            }
            for (model, (ready, placed)) in &reported {
                let pair = (model.to_string(), n.name.clone());
                if *placed && !known.contains(&pair) && !self.evicting.contains(&pair) {
                    // Placed by this router before it restarted, or by another router.
                    self.placer.adopt(&n.name, model, now);
                } else if *ready || !*placed {
                    self.placer.observed(&n.name, model, Observed::Ready, now);
                }
            }
            for (model, node) in known.iter().filter(|(_, node)| *node == n.name) {
                if !reported.contains_key(model.as_str()) {
                    self.placer.observed(node, model, Observed::Absent, now);
                }
            }
        }
        self.evicting.retain(|(model, node)| {
            nodes
                .iter()
                .any(|n| n.name == *node && n.link.is_some() && n.models.iter().any(|m| m.name == *model))
        });
    }

    fn autoscale(&mut self, snap: &Snapshot, now: Instant) {
        let mut load: BTreeMap<String, (f64, u32)> = BTreeMap::new();
        for n in snap.nodes.iter().filter(|n| n.state == Member::Up) {
            for m in n.models.iter().filter(|m| m.placed) {
                let e = load.entry(m.name.clone()).or_default();
                e.0 += f64::from(m.inflight);
                e.1 += u32::from(m.ready);
            }
        }
        for spec in self.specs(snap.repo) {
            let (inflight, ready) = load.get(&spec.name).copied().unwrap_or_default();
            self.scaler.observe(&spec.name, inflight, ready, now);
            let Some((min, max)) = self.placer.bounds(&spec.name) else {
                continue;
            };
            if let Some(n) = self.scaler.desired(&spec.name, min, max, now) {
                self.placer.set_desired(&spec.name, n);
            }
        }
    }

    fn connected(nodes: &[NodeSummary], node: &str) -> bool {
        nodes.iter().any(|n| n.name == node && n.link.is_some())
    }

    /// A Place for `node`, remembering what it ships; None when the model is not in the repository
    /// view.
    fn ship(&mut self, model: &str, node: &str, snap: &Snapshot, epoch: u64, again: bool) -> Option<Command> {
        let m = snap.model(model)?.clone();
        let config = self.placed_config(&m);
        let pair = (model.to_string(), node.to_string());
        if config != m.config_override {
            self.rollout_ships.insert(pair.clone());
        } else {
            self.rollout_ships.remove(&pair);
        }
        self.shipped.insert(pair, shipment(&m, &config));
        Some(Command::Place {
            node: node.to_string(),
            model: m,
            config,
            epoch,
            again,
        })
    }

    fn act(&mut self, actions: Vec<Action>, snap: &Snapshot, epoch: u64, out: &mut Output) {
        for action in actions {
            match action {
                Action::Load { model, node } => {
                    if !Self::connected(snap.nodes, &node) {
                        let why = Observed::Failed("the node is not connected".into());
                        self.placer.observed(&node, &model, why, snap.now);
                    } else if let Some(c) = self.ship(&model, &node, snap, epoch, false) {
                        out.commands.push(c);
                    }
                }
                Action::Unload { model, node } => {
                    let pair = (model, node);
                    self.shipped.remove(&pair);
                    self.pending.remove(&pair);
                    if Self::connected(snap.nodes, &pair.1) {
                        out.commands.push(Command::Evict {
                            node: pair.1.clone(),
                            model: pair.0.clone(),
                            epoch,
                        });
                        self.evicting.insert(pair);
                    }
                }
                Action::Drained { node } => {
                    tracing::info!(node = %node, "drained: every placed model moved off the node");
                    if self.drains.contains_key(&node) {
                        if Self::connected(snap.nodes, &node) {
                            out.commands.push(Command::MayStop {
                                node: node.clone(),
                                epoch,
                            });
                        }
                        self.drained.insert(node);
                    }
                }
            }
        }
    }

    /// Ships a model again to replicas holding an older copy (its files or config changed).
    fn reship(&mut self, snap: &Snapshot, epoch: u64, out: &mut Output) {
        // A ready replica this router did not ship (adopted: placed before it led) holds the model
        // as its own config places it; only a rollout's config differs, and ships it again.
        let rolled_out = if self.rollouts.is_empty() {
            Vec::new()
        } else {
            self.placer.view()
        };
        for v in rolled_out.iter().filter(|v| self.rollouts.contains_key(&v.name)) {
            let Some(m) = snap.model(&v.name) else { continue };
            for r in v.replicas.iter().filter(|r| r.state == ReplicaState::Ready) {
                let pair = (v.name.clone(), r.node.clone());
                if !self.evicting.contains(&pair) {
                    self.shipped
                        .entry(pair)
                        .or_insert_with(|| shipment(m, &m.config_override));
                }
            }
        }
        // What each model ships now, once per model (a rollout's config is made anew each time).
        let mut shipping: HashMap<&str, String> = HashMap::new();
        let stale: Vec<(String, String)> = self
            .shipped
            .iter()
            .filter(|((model, _), was)| {
                snap.model(model).is_some_and(|m| {
                    let current = shipping
                        .entry(model.as_str())
                        .or_insert_with(|| shipment(m, &self.placed_config(m)));
                    current != *was
                })
            })
            .map(|(pair, _)| pair.clone())
            .collect();
        for (model, node) in stale {
            tracing::info!(model = %model, node = %node, "the model changed; shipping it again");
            if let Some(c) = self.ship(&model, &node, snap, epoch, true) {
                // A reload's load request waits for this node's answer.
                self.pending.insert((model, node));
                out.commands.push(c);
            }
        }
    }

    /// Drops a model no longer wanted from the repository view once no node holds it.
    fn forget_unwanted(&mut self, view: &[ModelView], snap: &Snapshot, out: &mut Output) {
        for m in snap.repo {
            let held = view.iter().any(|v| v.name == m.name)
                || snap
                    .nodes
                    .iter()
                    .any(|n| n.models.iter().any(|x| x.placed && x.name == m.name));
            if !self.wanted.contains(&m.name) && !held {
                self.failed.remove(&m.name);
                out.forget.push(m.name.clone());
            }
        }
    }

    fn publish(&mut self, models: Vec<ModelView>, out: &mut Output) {
        let events = self.placer.events();
        let fresh = match &self.logged {
            Some(last) => events
                .iter()
                .position(|e| (e.at, e.kind, e.model.clone(), e.node.clone()) == *last)
                .map_or(0, |i| i + 1),
            None => 0,
        };
        out.events = events[fresh..].to_vec();
        if let Some(e) = events.last() {
            self.logged = Some((e.at, e.kind, e.model.clone(), e.node.clone()));
        }
        out.view = PlacementView {
            models,
            events,
            errors: self.errors.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            drains: self
                .drains
                .keys()
                .map(|n| (n.clone(), self.drained.contains(n)))
                .collect(),
            rollouts: self.rollouts(),
        };
    }
}
