//! PlacementActor: every tick it feeds the sans-IO `place::Placer` and `Autoscaler` with the
//! cluster repository, membership (nodes, what they report, their load) and request usage, then
//! carries out the decisions as Place / Evict / MayStop commands on the nodes' control streams.
//! It keeps no state that matters across a restart: placed replicas are read back from what nodes
//! report (a node says which of its models the router placed).
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mesh::cluster::msg::{self, Message};
use mesh::{Error, Result};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::membership::{NodeState as Member, NodeSummary};
use crate::messages::{LinkMsg, PlacementMsg};
use crate::place::{
    Action, Autoscaler, EventKind, ModelSpec, ModelView, NodeSpec, NodeState, Observed, PlacementSettings, Placer,
    ReplicaState,
};
use crate::repository::{self, RepoModel};
use crate::shared::{Placement, PlacementView, RoutingView};

mod lead;
mod requests;

pub use mesh::control::ControlMode;

/// What the PlacementActor is built with.
pub struct PlacementArgs {
    pub handle: Arc<Placement>,
    pub view: Arc<RoutingView>,
    pub settings: PlacementSettings,
}

pub struct PlacementState {
    handle: Arc<Placement>,
    view: Arc<RoutingView>,
    settings: PlacementSettings,
    placer: Placer,
    scaler: Autoscaler,
    /// Models the cluster wants (explicit mode: those loaded).
    wanted: BTreeSet<String>,
    /// Models of the repository that cannot be read, with why.
    errors: BTreeMap<String, String>,
    /// Evicts sent and not yet seen gone.
    evicting: BTreeSet<(String, String)>,
    /// What each replica was last shipped with (content key and config override; a change ships
    /// again).
    shipped: HashMap<(String, String), String>,
    /// Places sent and not answered yet.
    pending: BTreeSet<(String, String)>,
    /// Operator drains: node name → incarnation drained (a restarted node is not drained).
    drains: BTreeMap<String, u64>,
    drained: BTreeSet<String>,
    load_waiters: Vec<requests::LoadWaiter>,
    /// The last failed placement of each model: when, on which node, why.
    failed: HashMap<String, (Instant, String)>,
    unload_waiters: Vec<(String, RpcReplyPort<Result<()>>)>,
    drain_waiters: Vec<(String, RpcReplyPort<Result<()>>)>,
    last_scan: Option<Instant>,
    logged: Option<(Instant, EventKind, String, String)>,
    /// Until when nothing is placed (see `PlacementSettings::startup_grace`).
    settle_until: Instant,
    /// The epoch this router last acted with (None: it did not lead).
    epoch: Option<u64>,
    /// Nodes (name, incarnation) told this leader's epoch.
    fenced: BTreeSet<(String, u64)>,
    /// The stored intent last applied (from etcd).
    applied: Option<crate::lead::Desired>,
    /// Replica bounds set at run time (`scale`), kept for the next leader.
    scaled: BTreeMap<String, (u32, u32)>,
}

pub struct PlacementActor;

impl PlacementState {
    /// Reads the repositories again: new and changed models (hashing their files), removed ones.
    async fn scan(&mut self, now: Instant) {
        self.last_scan = Some(now);
        let roots = self.handle.repo.roots.clone();
        let (dirs, dup) = tokio::task::spawn_blocking(move || repository::scan(&roots))
            .await
            .unwrap_or_default();
        self.errors = dup;
        if self.settings.mode != ControlMode::Explicit {
            let now_wanted: BTreeSet<String> = dirs.keys().cloned().collect();
            for gone in self.wanted.difference(&now_wanted) {
                tracing::info!(model = %gone, "removed from the cluster repository; unloading it everywhere");
            }
            self.wanted = now_wanted;
        }
        for (name, dir) in dirs {
            if self.wanted.contains(&name) {
                let previous = self.handle.repo.get(&name);
                if previous
                    .as_ref()
                    .is_some_and(|p| p.override_files.is_some() || !p.config_override.is_empty())
                {
                    continue; // loaded with overrides: kept until loaded again
                }
                self.read(&name, dir, String::new(), None, previous).await;
            }
        }
    }

    async fn read(
        &mut self,
        name: &str,
        dir: PathBuf,
        config: String,
        files: Option<mesh::overrides::OverrideDir>,
        previous: Option<Arc<RepoModel>>,
    ) -> bool {
        let n = name.to_string();
        let read =
            tokio::task::spawn_blocking(move || repository::read_model(&n, &dir, config, files, previous.as_ref()))
                .await
                .unwrap_or_else(|e| Err(format!("reading the model failed: {e}")));
        match read {
            Ok(m) => {
                self.errors.remove(name);
                self.handle.repo.set(m);
                true
            }
            Err(why) => {
                tracing::error!(model = %name, "cannot place: {why}");
                self.errors.insert(name.to_string(), why);
                false
            }
        }
    }

    fn specs(&self) -> Vec<ModelSpec> {
        self.handle
            .repo
            .all()
            .into_iter()
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
        let live: BTreeSet<&str> = nodes
            .iter()
            .filter(|n| n.link.is_some())
            .map(|n| n.name.as_str())
            .collect();
        self.evicting.retain(|(model, node)| {
            live.contains(node.as_str())
                && nodes
                    .iter()
                    .any(|n| n.name == *node && n.models.iter().any(|m| m.name == *model))
        });
    }

    fn autoscale(&mut self, nodes: &[NodeSummary], now: Instant) {
        let mut load: BTreeMap<String, (f64, u32)> = BTreeMap::new();
        for n in nodes.iter().filter(|n| n.state == Member::Up) {
            for m in n.models.iter().filter(|m| m.placed) {
                let e = load.entry(m.name.clone()).or_default();
                e.0 += f64::from(m.inflight);
                e.1 += u32::from(m.ready);
            }
        }
        for spec in self.specs() {
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

    /// Sends a control message to a node's link actor; false when the node has no live link.
    fn send(&self, node: &str, message: Message) -> bool {
        let link = self.view.membership().link_of(node);
        let Some(link) = link.and_then(|l| self.view.link(l)) else {
            return false;
        };
        link.control.tell(LinkMsg::Send(message))
    }

    fn place_message(&self, model: &str) -> Option<(Message, String)> {
        let m = self.handle.repo.get(model)?;
        let place = msg::Place {
            model: m.name.clone(),
            key: m.manifest.key.clone(),
            files: m.manifest.files.clone(),
            config: m.config_override.clone(),
            epoch: self.epoch.unwrap_or(0),
        };
        Some((Message::Place(place), shipment(&m)))
    }

    /// Sends a Place and remembers what it shipped; None when the model is not in the repository
    /// view, false when the node has no live link.
    fn ship(&mut self, model: &str, node: &str) -> Option<bool> {
        let (message, shipped) = self.place_message(model)?;
        if !self.send(node, message) {
            return Some(false);
        }
        self.shipped.insert((model.to_string(), node.to_string()), shipped);
        Some(true)
    }

    fn act(&mut self, actions: Vec<Action>, now: Instant) {
        for action in actions {
            match action {
                Action::Load { model, node } => {
                    if self.ship(&model, &node) == Some(false) {
                        self.placer
                            .observed(&node, &model, Observed::Failed("the node is not connected".into()), now);
                    }
                }
                Action::Unload { model, node } => {
                    self.shipped.remove(&(model.clone(), node.clone()));
                    self.pending.remove(&(model.clone(), node.clone()));
                    if self.send(
                        &node,
                        Message::Evict(msg::Evict {
                            model: model.clone(),
                            epoch: self.epoch.unwrap_or(0),
                        }),
                    ) {
                        self.evicting.insert((model, node));
                    }
                }
                Action::Drained { node } => {
                    tracing::info!(node = %node, "drained: every placed model moved off the node");
                    if self.drains.contains_key(&node) {
                        let epoch = self.epoch.unwrap_or(0);
                        self.send(&node, Message::MayStop(msg::Fence { epoch }));
                        self.drained.insert(node);
                    }
                }
            }
        }
    }

    /// Ships a model again to replicas holding an older copy (its files or config changed).
    fn reship(&mut self) {
        let stale: Vec<(String, String)> = self
            .shipped
            .iter()
            .filter(|((model, _), was)| self.handle.repo.get(model).is_some_and(|m| shipment(&m) != **was))
            .map(|(pair, _)| pair.clone())
            .collect();
        for (model, node) in stale {
            tracing::info!(model = %model, node = %node, "the model changed; shipping it again");
            if self.ship(&model, &node) == Some(true) {
                // A reload's load request waits for this node's answer.
                self.pending.insert((model, node));
            }
        }
    }

    async fn tick(&mut self, now: Instant) {
        let due = match self.last_scan {
            None => true,
            Some(t) => self.settings.mode == ControlMode::Poll && now.duration_since(t) >= self.settings.poll_every,
        };
        if due {
            self.scan(now).await;
        }
        let nodes = self.view.membership().nodes(now);
        let live: BTreeSet<String> = nodes
            .iter()
            .filter(|n| n.link.is_some())
            .map(|n| n.name.clone())
            .collect();
        self.pending.retain(|(_, node)| live.contains(node));
        self.shipped.retain(|(_, node), _| live.contains(node));
        self.placer.set_nodes(self.node_specs(&nodes), now);
        let epoch = self.lead().await;
        self.placer.set_models(self.specs(), now);
        self.apply_bounds();
        self.observe(&nodes, now);
        for (model, at) in self.handle.last_used() {
            self.placer.used(&model, at);
        }
        self.autoscale(&nodes, now);
        if let Some(epoch) = epoch.filter(|_| now >= self.settle_until) {
            if self.handle.lead.elected() {
                self.fence(&nodes, epoch);
            }
            let actions = self.placer.tick(now);
            self.act(actions, now);
            self.reship();
            self.save();
        }
        // One view of the placer serves the answers, the clean-up and what is published.
        let view = self.placer.view();
        self.answer_waiters(&view, &nodes);
        self.forget_unwanted(&view, &nodes);
        self.publish(view);
    }

    /// Drops a model no longer wanted from the repository view once no node holds it.
    fn forget_unwanted(&mut self, view: &[ModelView], nodes: &[NodeSummary]) {
        for m in self.handle.repo.all() {
            let held = view.iter().any(|v| v.name == m.name)
                || nodes
                    .iter()
                    .any(|n| n.models.iter().any(|x| x.placed && x.name == m.name));
            if !self.wanted.contains(&m.name) && !held {
                self.handle.repo.remove(&m.name);
                self.handle.forget_usage(&m.name);
                self.failed.remove(&m.name);
            }
        }
    }

    fn publish(&mut self, models: Vec<ModelView>) {
        let events = self.placer.events();
        let fresh = match &self.logged {
            Some(last) => events
                .iter()
                .position(|e| (e.at, e.kind, e.model.clone(), e.node.clone()) == *last)
                .map_or(0, |i| i + 1),
            None => 0,
        };
        for e in &events[fresh..] {
            tracing::info!(kind = e.kind.as_str(), model = %e.model, node = %e.node, "placement: {}", e.detail);
            crate::metrics::placement_event(e.kind.as_str());
        }
        if let Some(e) = events.last() {
            self.logged = Some((e.at, e.kind, e.model.clone(), e.node.clone()));
        }
        for m in &models {
            let ready = m.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count();
            crate::metrics::replicas(&m.name, m.wanted, ready);
        }
        self.handle.publish(PlacementView {
            models,
            events,
            errors: self.errors.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            drains: self
                .drains
                .keys()
                .map(|n| (n.clone(), self.drained.contains(n)))
                .collect(),
        });
    }
}

/// What a replica holds: the files' content key and the config override it was placed with.
fn shipment(m: &RepoModel) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.config_override.hash(&mut h);
    format!("{}/{:016x}", m.manifest.key, h.finish())
}

impl Actor for PlacementActor {
    type Msg = PlacementMsg;
    type State = PlacementState;
    type Arguments = PlacementArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PlacementMsg>,
        args: PlacementArgs,
    ) -> std::result::Result<PlacementState, ActorProcessingErr> {
        ractor::time::send_interval(args.settings.tick, myself.get_cell(), || PlacementMsg::Tick);
        let wanted = match args.settings.mode {
            ControlMode::Explicit => {
                let (dirs, _) = repository::scan(&args.handle.repo.roots);
                let all = args.settings.load_at_start.iter().any(|m| m == "*");
                dirs.into_keys()
                    .filter(|n| all || args.settings.load_at_start.contains(n))
                    .collect()
            }
            _ => BTreeSet::new(),
        };
        let settle_until = Instant::now() + args.settings.startup_grace;
        Ok(PlacementState {
            placer: Placer::new(args.settings.place.clone()),
            scaler: Autoscaler::new(args.settings.scale),
            handle: args.handle,
            view: args.view,
            settings: args.settings,
            wanted,
            errors: BTreeMap::new(),
            evicting: BTreeSet::new(),
            shipped: HashMap::new(),
            pending: BTreeSet::new(),
            drains: BTreeMap::new(),
            drained: BTreeSet::new(),
            load_waiters: Vec::new(),
            failed: HashMap::new(),
            unload_waiters: Vec::new(),
            drain_waiters: Vec::new(),
            last_scan: None,
            logged: None,
            settle_until,
            epoch: None,
            fenced: BTreeSet::new(),
            applied: None,
            scaled: BTreeMap::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<PlacementMsg>,
        msg: PlacementMsg,
        state: &mut PlacementState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let now = Instant::now();
        // An operator's change on a router that must not make it now: refused once, with why.
        let change = matches!(
            msg,
            PlacementMsg::Load(..) | PlacementMsg::Unload(..) | PlacementMsg::Scale(..) | PlacementMsg::Drain(..)
        );
        if let Some(why) = change.then(|| state.refuse().err()).flatten() {
            match msg {
                PlacementMsg::Load(_, _, reply) | PlacementMsg::Unload(_, reply) | PlacementMsg::Drain(_, reply) => {
                    let _ = reply.send(Err(why));
                }
                PlacementMsg::Scale(_, _, _, reply) => {
                    let _ = reply.send(Err(why));
                }
                _ => {}
            }
            return Ok(());
        }
        match msg {
            PlacementMsg::Tick => state.tick(now).await,
            PlacementMsg::Placed(node, p) => {
                state.pending.remove(&(p.model.clone(), node.clone()));
                // Readiness comes from membership (what the node reports), never from this answer:
                // the two travel apart, and membership is what Absent is judged against.
                if p.error.is_empty() {
                    state.placer.measured(&p.model, p.footprint);
                } else {
                    state
                        .failed
                        .insert(p.model.clone(), (now, format!("on {node}: {}", p.error)));
                    state.placer.observed(&node, &p.model, Observed::Failed(p.error), now);
                }
            }
            PlacementMsg::Load(name, options, reply) => state.load(name, options, reply).await,
            PlacementMsg::Unload(name, reply) => state.unload(name, reply),
            PlacementMsg::Scale(name, min, max, reply) => {
                let result = state
                    .placer
                    .set_bounds(&name, min, max)
                    .map_err(Error::invalid)
                    .and_then(|()| {
                        state
                            .placer
                            .bounds(&name)
                            .ok_or_else(|| Error::not_found(format!("model '{name}' is not placed")))
                    });
                if let Ok((lo, hi)) = result {
                    tracing::info!(model = %name, min = lo, max = hi, "replica bounds changed");
                    state.scaled.insert(name.clone(), (lo, hi));
                }
                state.confirm(reply, result);
            }
            PlacementMsg::Drain(node, reply) => state.drain(node, reply),
        }
        Ok(())
    }
}
