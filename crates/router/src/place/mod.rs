//! Placement: which nodes hold which models, and when to load, unload, move or evict a replica, as a pure decision.
//!
//! Sans-IO like `membership` and `route`: the router's actor feeds [`Placer`] the nodes it has
//! ([`Placer::set_nodes`]), the models the cluster repository wants ([`Placer::set_models`]), what nodes
//! report ([`Placer::observed`]) and which models requests use ([`Placer::used`]); every ~200 ms it calls
//! [`Placer::tick`] and carries out the [`Action`]s. Nothing here reads a clock or touches a socket.
//!
//! The policy, in the order a tick applies it:
//! - Timeouts: a load not Ready within `load_timeout` failed (and is unloaded); an unload not answered
//!   within `load_timeout` is forgotten; a failed (model, node) pair may be tried again after `retry_after`.
//! - Scale down: Ready replicas beyond `wanted` are unloaded one per model per tick, from draining nodes
//!   first, then from the node with the least free memory. A Loading replica is not a replica yet, so a
//!   Ready one is never unloaded to make up for it.
//! - Scale up: missing replicas go to eligible nodes (Up, a GPU if the model needs one, not holding the
//!   model, not failed for it lately, not serving its own model of that name, enough free memory), the one
//!   with the most free memory first. Models with fewer replicas are served first. When no node has room,
//!   the least recently used models with spare replicas (more Ready than their min, Ready for `min_age`) are
//!   evicted from one node; the new replica goes there once the victims' unloads are answered.
//! - Moves (make-before-break, at most `max_moves` loads for moves at once): replicas on draining nodes
//!   first, then rebalancing from the fullest node to the emptiest while their replica counts differ by
//!   more than one. The old replica is unloaded only once the new one is Ready.
//! - A draining node that holds nothing any more is reported [`Action::Drained`] once.
mod moves;
mod observe;
mod report;
mod tick;

pub mod autoscale;
pub mod reconcile;
pub use autoscale::{Autoscaler, ScaleSettings};
pub use reconcile::{PlacementView, Reconcile};

#[cfg(test)]
mod move_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// What the PlacementActor runs with, from the router's flags.
#[derive(Debug, Clone)]
pub struct PlacementSettings {
    pub place: PlaceSettings,
    pub scale: ScaleSettings,
    pub mode: mesh::control::ControlMode,
    /// Explicit mode: loaded at start (`*` for every model).
    pub load_at_start: Vec<String>,
    pub poll_every: Duration,
    pub tick: Duration,
    /// After the router starts, nodes rejoin and report what an earlier router placed; nothing is
    /// placed or unloaded for this long, so those replicas are adopted, not placed again.
    pub startup_grace: Duration,
}

/// The placement policy's knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceSettings {
    /// Replicas per model when its spec says none.
    pub default_min: u32,
    pub default_max: u32,
    /// A replica is not evicted (to make room) or moved (to rebalance) before it has been Ready this long.
    pub min_age: Duration,
    /// Loads started for a move (drain or rebalance) and not yet Ready, at most, across the cluster.
    pub max_moves: usize,
    /// A load not Ready within this failed ("load timed out"); an unload not answered within this is forgotten.
    pub load_timeout: Duration,
    /// A (model, node) pair that failed is not tried again before this.
    pub retry_after: Duration,
    /// How many recent events [`Placer::events`] keeps.
    pub history: usize,
}

impl Default for PlaceSettings {
    fn default() -> Self {
        PlaceSettings {
            default_min: 2,
            default_max: 4,
            min_age: Duration::from_secs(30),
            max_moves: 2,
            load_timeout: Duration::from_secs(120),
            retry_after: Duration::from_secs(60),
            history: 64,
        }
    }
}

/// Whether a node takes new replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeState {
    Up,
    /// An operator drain or a stopping node: move everything off, place nothing new.
    Draining,
}

/// One node as placement sees it. A node that is gone is absent from [`Placer::set_nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    /// 0: CPU only.
    pub gpus: u32,
    /// Bytes this node offers for models.
    pub memory: u64,
    pub state: NodeState,
}

/// One model the cluster repository wants served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub name: String,
    /// `mesh.min_replicas`; None: the settings' default.
    pub min: Option<u32>,
    /// `mesh.max_replicas`; None: the settings' default. A max below min is taken as min.
    pub max: Option<u32>,
    /// Estimated bytes per replica, until a node reports the measured size ([`Placer::measured`]).
    pub footprint: u64,
    /// KIND_GPU: only nodes with a GPU may hold it.
    pub needs_gpu: bool,
}

/// What the router must do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Load {
        model: String,
        node: String,
    },
    Unload {
        model: String,
        node: String,
    },
    /// Everything this node held has been moved off (or nothing needs it): it may stop.
    Drained {
        node: String,
    },
}

/// What a node reports about one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Ready,
    Failed(String),
    Absent,
}

/// One model for status output and the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelView {
    pub name: String,
    pub min: u32,
    pub max: u32,
    pub wanted: u32,
    pub replicas: Vec<ReplicaView>,
    /// Why the model is not fully placed, or its last failure; empty when fine.
    pub reason: String,
}

/// One replica (or a recent failure on a node) for status output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    pub node: String,
    pub state: ReplicaState,
    pub reason: String,
}

/// What a placement event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Place,
    Ready,
    Failed,
    Evict,
    Move,
    Unload,
    Lost,
    Scale,
    Drained,
    /// A rollout's command or its guard's decision.
    Rollout,
}

impl EventKind {
    /// The kind as status output, logs and metrics write it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Place => "place",
            EventKind::Ready => "ready",
            EventKind::Failed => "failed",
            EventKind::Evict => "evict",
            EventKind::Move => "move",
            EventKind::Unload => "unload",
            EventKind::Lost => "lost",
            EventKind::Scale => "scale",
            EventKind::Drained => "drained",
            EventKind::Rollout => "rollout",
        }
    }
}

/// Where one replica is, as status output shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    Loading,
    Ready,
    Unloading,
    /// A recent failed placement on the node (no replica there).
    Failed,
}

impl ReplicaState {
    /// The state as status output writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Loading => "loading",
            ReplicaState::Ready => "ready",
            ReplicaState::Unloading => "unloading",
            ReplicaState::Failed => "failed",
        }
    }
}

/// A past decision or observation, for status output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceEvent {
    pub at: Instant,
    pub kind: EventKind,
    pub model: String,
    pub node: String,
    pub detail: String,
}

/// Where one replica stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Load sent at `since`.
    Loading { since: Instant },
    /// Observed Ready at `since`.
    Ready { since: Instant },
    /// Unload decided; `sent` is when the Unload action went out (None: on the next tick).
    Unloading { sent: Option<Instant>, why: String },
}

#[derive(Debug, Clone)]
struct Replica {
    state: State,
    /// Bytes this replica takes on its node.
    bytes: u64,
    /// While Loading: this load replaces the Ready replica of the same model on that node (a move).
    move_from: Option<String>,
}

impl Replica {
    fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready { .. })
    }
    fn is_loading(&self) -> bool {
        matches!(self.state, State::Loading { .. })
    }
    fn is_unloading(&self) -> bool {
        matches!(self.state, State::Unloading { .. })
    }
    /// Ready for at least `age` at `now`.
    fn ready_for(&self, age: Duration, now: Instant) -> bool {
        matches!(self.state, State::Ready { since } if now.saturating_duration_since(since) >= age)
    }
}

#[derive(Debug, Clone)]
struct Failure {
    at: Instant,
    reason: String,
}

#[derive(Debug, Clone)]
struct Node {
    spec: NodeSpec,
    /// Action::Drained went out for the current drain.
    drained_sent: bool,
}

#[derive(Debug, Clone)]
struct Model {
    spec: ModelSpec,
    min_override: Option<u32>,
    max_override: Option<u32>,
    /// From the autoscaler.
    desired: Option<u32>,
    measured: Option<u64>,
    last_used: Option<Instant>,
    first_placed: Option<Instant>,
    /// `wanted` as the last tick saw it, for "scale" events.
    wanted_seen: Option<u32>,
    /// The last failure: when, and "node: reason".
    last_failure: Option<(Instant, String)>,
    /// Set by the last tick.
    reason: String,
    /// This tick's note about a replica that cannot leave a draining node.
    stuck: Option<String>,
}

impl Model {
    fn footprint(&self) -> u64 {
        self.measured.unwrap_or(self.spec.footprint)
    }
}

/// A (model, node) pair.
type Key = (String, String);

fn key(model: &str, node: &str) -> Key {
    (model.to_string(), node.to_string())
}

/// The cluster's placement state and policy; see the module docs.
#[derive(Debug, Clone)]
pub struct Placer {
    settings: PlaceSettings,
    nodes: BTreeMap<String, Node>,
    models: BTreeMap<String, Model>,
    replicas: BTreeMap<Key, Replica>,
    /// Pairs that failed lately: not tried again before `retry_after`.
    failures: BTreeMap<Key, Failure>,
    /// Pairs a node reported without being asked (its own model of that name): never placed there.
    foreign: BTreeSet<Key>,
    /// Pairs a Load went out for, ever: a Ready report for one the placer forgot is its own replica back.
    asked: BTreeSet<Key>,
    events: VecDeque<PlaceEvent>,
}

impl Placer {
    pub fn new(settings: PlaceSettings) -> Placer {
        Placer {
            settings,
            nodes: BTreeMap::new(),
            models: BTreeMap::new(),
            replicas: BTreeMap::new(),
            failures: BTreeMap::new(),
            foreign: BTreeSet::new(),
            asked: BTreeSet::new(),
            events: VecDeque::new(),
        }
    }

    /// The full current set of nodes. Replicas on a node no longer in it are forgotten at once (lost).
    pub fn set_nodes(&mut self, nodes: Vec<NodeSpec>, now: Instant) {
        let mut next: BTreeMap<String, Node> = BTreeMap::new();
        for spec in nodes {
            let drained_sent = match self.nodes.get(&spec.name) {
                Some(old) => old.drained_sent && spec.state == NodeState::Draining,
                None => false,
            };
            next.insert(spec.name.clone(), Node { spec, drained_sent });
        }
        let gone: Vec<Key> = self
            .replicas
            .keys()
            .filter(|(_, n)| !next.contains_key(n))
            .cloned()
            .collect();
        for k in gone {
            let r = self.replicas.remove(&k).expect("listed");
            if !r.is_unloading() {
                self.event(now, EventKind::Lost, &k.0, &k.1, "node gone");
            }
        }
        self.foreign.retain(|(_, n)| next.contains_key(n));
        self.nodes = next;
    }

    /// The full set of models wanted. A model no longer in it is unloaded everywhere.
    pub fn set_models(&mut self, models: Vec<ModelSpec>, now: Instant) {
        let mut next: BTreeMap<String, Model> = BTreeMap::new();
        for spec in models {
            let model = match self.models.remove(&spec.name) {
                Some(mut old) => {
                    old.spec = spec;
                    old
                }
                None => Model {
                    spec,
                    min_override: None,
                    max_override: None,
                    desired: None,
                    measured: None,
                    last_used: None,
                    first_placed: None,
                    wanted_seen: None,
                    last_failure: None,
                    reason: String::new(),
                    stuck: None,
                },
            };
            next.insert(model.spec.name.clone(), model);
        }
        let removed: Vec<Key> = self
            .replicas
            .keys()
            .filter(|(m, _)| !next.contains_key(m))
            .cloned()
            .collect();
        for k in removed {
            self.unload(&k, "model removed", EventKind::Unload, now);
        }
        self.failures.retain(|(m, _), _| next.contains_key(m));
        self.models = next;
    }

    /// A run-time override of a model's bounds (None keeps the spec's or the default).
    pub fn set_bounds(&mut self, model: &str, min: Option<u32>, max: Option<u32>) -> Result<(), String> {
        let default = (self.settings.default_min, self.settings.default_max);
        let Some(m) = self.models.get_mut(model) else {
            return Err(format!("unknown model '{model}'"));
        };
        let lo = min.or(m.spec.min).unwrap_or(default.0);
        let hi = max.or(m.spec.max).unwrap_or(default.1);
        if (min.is_some() || max.is_some()) && lo > hi {
            return Err(format!(
                "min replicas {lo} is more than max replicas {hi} for model '{model}'"
            ));
        }
        m.min_override = min;
        m.max_override = max;
        Ok(())
    }

    /// The replica count the autoscaler wants; clamped into the model's bounds.
    pub fn set_desired(&mut self, model: &str, replicas: u32) {
        if let Some(m) = self.models.get_mut(model) {
            m.desired = Some(replicas);
        }
    }

    /// The model's effective (min, max) replicas.
    pub fn bounds(&self, model: &str) -> Option<(u32, u32)> {
        self.models.get(model).map(|m| self.bounds_of(m))
    }

    /// The model's Ready replicas (what the autoscaler compares against).
    pub fn ready(&self, model: &str) -> u32 {
        self.replicas
            .iter()
            .filter(|((m, _), r)| m == model && r.is_ready())
            .count() as u32
    }

    /// The replica count the placer aims for: the autoscaler's wish (else min), within the bounds.
    pub fn wanted(&self, model: &str) -> Option<u32> {
        self.models.get(model).map(|m| self.wanted_of(m))
    }

    fn bounds_of(&self, m: &Model) -> (u32, u32) {
        let min = m.min_override.or(m.spec.min).unwrap_or(self.settings.default_min);
        let max = m.max_override.or(m.spec.max).unwrap_or(self.settings.default_max);
        (min, max.max(min))
    }

    fn wanted_of(&self, m: &Model) -> u32 {
        let (min, max) = self.bounds_of(m);
        m.desired.unwrap_or(min).clamp(min, max)
    }

    /// Marks a replica for unloading (the Unload goes out on the next tick); a move from it is no move any more.
    fn unload(&mut self, k: &Key, why: &str, kind: EventKind, now: Instant) {
        let Some(r) = self.replicas.get_mut(k) else { return };
        if r.is_unloading() {
            return;
        }
        r.state = State::Unloading {
            sent: None,
            why: why.to_string(),
        };
        r.move_from = None;
        for ((m, _), t) in self.replicas.iter_mut() {
            if *m == k.0 && t.move_from.as_deref() == Some(k.1.as_str()) {
                t.move_from = None;
            }
        }
        self.event(now, kind, &k.0, &k.1, why);
    }

    /// Records a failed load (or a replica that failed): the pair waits `retry_after`.
    fn fail(&mut self, k: Key, why: String, kind: EventKind, now: Instant) {
        self.event(now, kind, &k.0, &k.1, &why);
        if let Some(m) = self.models.get_mut(&k.0) {
            m.last_failure = Some((now, format!("{}: {why}", k.1)));
        }
        self.failures.insert(k, Failure { at: now, reason: why });
    }

    /// Records a rollout's command or decision of `model` among the events.
    pub fn rollout_event(&mut self, at: Instant, model: &str, detail: &str) {
        self.event(at, EventKind::Rollout, model, "", detail);
    }

    fn event(&mut self, at: Instant, kind: EventKind, model: &str, node: &str, detail: &str) {
        if self.settings.history == 0 {
            return;
        }
        while self.events.len() >= self.settings.history {
            self.events.pop_front();
        }
        self.events.push_back(PlaceEvent {
            at,
            kind,
            model: model.into(),
            node: node.into(),
            detail: detail.into(),
        });
    }
}
