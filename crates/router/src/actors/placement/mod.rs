//! PlacementActor: a thin driver of the sans-IO `place::Reconcile`. Every tick it scans and reads the
//! cluster repository when asked (off the async threads), feeds the reconciler a snapshot of
//! membership, the repository and request usage, then sends the commands on the nodes' control
//! streams, answers the operators' requests and publishes the view.
//! It keeps no state that matters across a restart: placed replicas are read back from what nodes
//! report (a node says which of its models the router placed), and the intent from etcd.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mesh::cluster::msg::{self, Message};
use mesh::{Error, LoadOptions, Result};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::messages::{LinkMsg, PlacementMsg};
use crate::place::reconcile::{self, Command, Read, Snapshot, WaiterId};
use crate::place::PlacementSettings;
use crate::repository;
use crate::shared::{Placement, RoutingView};

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
    reconcile: reconcile::Reconcile,
    /// The operators' requests the reconciler answers later.
    replies: HashMap<WaiterId, RpcReplyPort<Result<()>>>,
}

pub struct PlacementActor;

/// Scans the repositories off the async threads: model directories by name, and names found twice.
async fn scan(roots: Vec<PathBuf>) -> (BTreeMap<String, PathBuf>, BTreeMap<String, String>) {
    tokio::task::spawn_blocking(move || repository::scan(&roots))
        .await
        .unwrap_or_default()
}

impl PlacementState {
    /// Reads one model directory off the async threads into the repository view; why not, if not.
    async fn read(
        &self,
        name: &str,
        dir: PathBuf,
        config: String,
        files: Option<mesh::overrides::OverrideDir>,
    ) -> std::result::Result<(), String> {
        let (n, previous) = (name.to_string(), self.handle.repo.get(name));
        let read =
            tokio::task::spawn_blocking(move || repository::read_model(&n, &dir, config, files, previous.as_ref()))
                .await
                .unwrap_or_else(|e| Err(format!("reading the model failed: {e}")));
        match read {
            Ok(m) => {
                self.handle.repo.set(m);
                Ok(())
            }
            Err(why) => {
                tracing::error!(model = %name, "cannot place: {why}");
                Err(why)
            }
        }
    }

    /// Does the reads the reconciler asked for.
    async fn read_all(&mut self, reads: Vec<Read>, dirs: Option<BTreeMap<String, PathBuf>>) {
        if reads.is_empty() {
            return;
        }
        let dirs = match dirs {
            Some(d) => d,
            None => scan(self.handle.repo.roots.clone()).await.0,
        };
        for read in reads {
            let outcome = match dirs.get(&read.model) {
                Some(dir) => self.read(&read.model, dir.clone(), read.config.clone(), None).await,
                None => {
                    let why = "loaded by an earlier leader, but not in this router's cluster repository";
                    tracing::error!(model = %read.model, "{why}");
                    Err(why.to_string())
                }
            };
            self.reconcile.read_done(&read, outcome);
        }
    }

    async fn tick(&mut self, now: Instant) {
        if self.reconcile.scan_due(now) {
            let (dirs, dup) = scan(self.handle.repo.roots.clone()).await;
            let found = dirs.keys().cloned().collect();
            let reads = self.reconcile.scanned(now, found, dup, &self.handle.repo.all());
            self.read_all(reads, Some(dirs)).await;
        }
        let reads = self.reconcile.follow(&self.handle.lead.role(), &self.handle.repo.all());
        self.read_all(reads, None).await;
        let nodes = self.view.membership().nodes(now);
        // The leader's guard judges the answers counted here and those followers reported; a
        // follower sends its own to the leader.
        let tallies = self.handle.take_tallies();
        for (model, decision) in self.reconcile.judge(&tallies, now) {
            crate::metrics::rollout_event(&model, decision.event());
        }
        self.handle.hand_over(tallies, now);
        let (repo, used) = (self.handle.repo.all(), self.handle.last_used());
        let out = self.reconcile.tick(&Snapshot {
            now,
            nodes: &nodes,
            repo: &repo,
            used: &used,
        });
        for command in out.commands {
            if !self.send(&command) {
                self.reconcile.unsent(&command, now);
            }
        }
        if let Some(intent) = out.intent {
            self.handle.lead.save(&intent);
        }
        for previous in out.restore {
            self.handle.repo.set(previous);
        }
        for (id, result) in out.answers {
            if let Some(reply) = self.replies.remove(&id) {
                self.confirm(reply, result);
            }
        }
        for model in out.forget {
            self.handle.repo.remove(&model);
            self.handle.forget_usage(&model);
        }
        for e in &out.events {
            tracing::info!(kind = e.kind.as_str(), model = %e.model, node = %e.node, "placement: {}", e.detail);
            crate::metrics::placement_event(e.kind.as_str());
        }
        crate::metrics::replicas(&out.view.models);
        let shares: Vec<(String, u8)> = out.view.rollouts.iter().map(|(m, r)| (m.clone(), r.share())).collect();
        crate::metrics::rollout_shares(&shares);
        self.handle.publish(out.view);
    }

    /// Sends a command on its node's control stream; false when the node has no live link.
    fn send(&self, command: &Command) -> bool {
        let message = match command {
            Command::Place {
                model, config, epoch, ..
            } => Message::Place(msg::Place {
                model: model.name.clone(),
                key: model.manifest.key.clone(),
                files: model.manifest.files.clone(),
                config: config.clone(),
                epoch: *epoch,
            }),
            Command::Evict { model, epoch, .. } => Message::Evict(msg::Evict {
                model: model.clone(),
                epoch: *epoch,
            }),
            Command::MayStop { epoch, .. } => Message::MayStop(msg::Fence { epoch: *epoch }),
            Command::Fence { epoch, .. } => Message::Fence(msg::Fence { epoch: *epoch }),
        };
        let link = self.view.membership().link_of(command.node());
        let Some(link) = link.and_then(|l| self.view.link(l)) else {
            return false;
        };
        link.control.tell(LinkMsg::Send(message))
    }

    /// A repository load: reads the model (with its overrides) now, and waits for a replica.
    async fn load(&mut self, name: String, options: LoadOptions, reply: RpcReplyPort<Result<()>>) {
        let config = options.config.clone().unwrap_or_default();
        let (dir, files) = if options.files.is_empty() {
            match scan(self.handle.repo.roots.clone()).await.0.remove(&name) {
                Some(d) => (d, None),
                None => {
                    let _ = reply.send(Err(Error::not_found(format!(
                        "failed to load '{name}': no such model directory in the cluster repository"
                    ))));
                    return;
                }
            }
        } else {
            if config.is_empty() {
                let _ = reply.send(Err(Error::invalid("file overrides need a 'config' parameter as well")));
                return;
            }
            match mesh::overrides::write_override_dir(&name, &options.files) {
                Ok((guard, dir)) => (dir, Some(guard)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return;
                }
            }
        };
        let previous = self.handle.repo.get(&name);
        let read = Read {
            model: name.clone(),
            config: config.clone(),
            intent: false,
        };
        let outcome = self.read(&name, dir, config, files).await;
        self.reconcile.read_done(&read, outcome.clone());
        if let Err(why) = outcome {
            let _ = reply.send(Err(Error::invalid(format!("failed to load '{name}': {why}"))));
            return;
        }
        let id = self.reconcile.load(&name, previous, Instant::now());
        self.replies.insert(id, reply);
    }

    /// Answers an operator's change once etcd holds it (at once without etcd); a failed change is
    /// answered at once.
    fn confirm<T: Send + 'static>(&self, reply: RpcReplyPort<Result<T>>, result: Result<T>) {
        if result.is_err() || !self.handle.lead.elected() {
            let _ = reply.send(result);
            return;
        }
        let seq = self.handle.lead.save(&self.reconcile.intent(&self.handle.repo.all()));
        let lead = self.handle.lead.clone();
        tokio::spawn(async move {
            let stored = lead.stored(seq).await;
            let _ = reply.send(stored.and(result));
        });
    }

    /// Registers a request the reconciler answers later, or answers its refusal now.
    fn wait(&mut self, waiter: Result<WaiterId>, reply: RpcReplyPort<Result<()>>) {
        match waiter {
            Ok(id) => {
                self.replies.insert(id, reply);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
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
                let (dirs, _) = scan(args.handle.repo.roots.clone()).await;
                let all = args.settings.load_at_start.iter().any(|m| m == "*");
                dirs.into_keys()
                    .filter(|n| all || args.settings.load_at_start.contains(n))
                    .collect()
            }
            _ => BTreeSet::new(),
        };
        let elected = args.handle.lead.elected();
        Ok(PlacementState {
            reconcile: reconcile::Reconcile::new(args.settings, wanted, elected, Instant::now()),
            handle: args.handle,
            view: args.view,
            replies: HashMap::new(),
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
            PlacementMsg::Load(..)
                | PlacementMsg::Unload(..)
                | PlacementMsg::Scale(..)
                | PlacementMsg::Drain(..)
                | PlacementMsg::Rollout(..)
        );
        let lead = &state.handle.lead;
        if let Some(why) = change
            .then(|| reconcile::refuse(&lead.role(), &lead.id).err())
            .flatten()
        {
            match msg {
                PlacementMsg::Load(_, _, reply) | PlacementMsg::Unload(_, reply) | PlacementMsg::Drain(_, reply) => {
                    let _ = reply.send(Err(why));
                }
                PlacementMsg::Scale(_, _, _, reply) => {
                    let _ = reply.send(Err(why));
                }
                PlacementMsg::Rollout(_, _, reply) => {
                    let _ = reply.send(Err(why));
                }
                _ => {}
            }
            return Ok(());
        }
        match msg {
            PlacementMsg::Tick => state.tick(now).await,
            PlacementMsg::Placed(node, answer) => state.reconcile.placed(&node, answer, now),
            PlacementMsg::Load(name, options, reply) => state.load(name, options, reply).await,
            PlacementMsg::Unload(name, reply) => {
                let waiter = state.reconcile.unload(&name);
                if waiter.is_ok() {
                    state.handle.forget_usage(&name);
                }
                state.wait(waiter, reply);
            }
            PlacementMsg::Scale(name, min, max, reply) => {
                let result = state.reconcile.scale(&name, min, max);
                state.confirm(reply, result);
            }
            PlacementMsg::Drain(node, reply) => {
                let waiter = state.reconcile.drain(&node, &state.view.membership().nodes(now));
                state.wait(waiter, reply);
            }
            PlacementMsg::Rollout(model, command, reply) => {
                let nodes = state.view.membership().nodes(now);
                let repo = state.handle.repo.all();
                let result = state.reconcile.rollout(&model, &command, &repo, &nodes, now);
                if result.is_ok() {
                    crate::metrics::rollout_event(&model, command.name());
                    // Shown at once, not at the next tick: a GET right after the change sees it.
                    let mut view = (*state.handle.view()).clone();
                    view.rollouts = state.reconcile.rollouts();
                    state.handle.publish(view);
                }
                state.confirm(reply, result);
            }
        }
        Ok(())
    }
}
