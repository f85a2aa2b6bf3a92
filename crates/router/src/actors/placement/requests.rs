//! The PlacementActor's answers to operators: repository loads and unloads, drains, each answered
//! once the cluster got there (or why it cannot).
use std::sync::Arc;
use std::time::Instant;

use mesh::{Error, LoadOptions, Result};
use ractor::RpcReplyPort;

use super::PlacementState;
use crate::membership::NodeSummary;
use crate::place::{ModelView, ReplicaState};
use crate::repository::{self, RepoModel};

/// A load waiting for its outcome.
pub(super) struct LoadWaiter {
    model: String,
    since: Instant,
    /// What the model served before, restored if this load fails (None: it did not serve).
    previous: Option<Arc<RepoModel>>,
    reply: RpcReplyPort<Result<()>>,
}

impl PlacementState {
    pub(super) fn answer_waiters(&mut self, view: &[ModelView], nodes: &[NodeSummary]) {
        let find = |name: &str| view.iter().find(|m| m.name == name);
        let mut waiting = Vec::new();
        for waiter in std::mem::take(&mut self.load_waiters) {
            let LoadWaiter {
                model: name,
                since,
                previous,
                reply,
            } = waiter;
            let answering = !self.pending.iter().any(|(model, _)| *model == name);
            let failed = self
                .failed
                .get(&name)
                .filter(|(at, _)| *at >= since)
                .map(|(_, why)| why.clone());
            let outcome = match (find(&name), self.errors.get(&name)) {
                (_, Some(why)) => Some(Err(Error::invalid(format!("failed to load '{name}': {why}")))),
                // A node failed the load (or reload) asked for: the versions already serving stay.
                (_, None) if answering && failed.is_some() => Some(Err(Error::invalid(format!(
                    "failed to load '{name}': {}",
                    failed.unwrap_or_default()
                )))),
                // Ready somewhere, and every replica shipped again (a reload) has answered.
                (Some(m), _) if answering && m.replicas.iter().any(|r| r.state == ReplicaState::Ready) => Some(Ok(())),
                (Some(m), _)
                    if !m.reason.is_empty() && !m.replicas.iter().any(|r| r.state == ReplicaState::Loading) =>
                {
                    Some(Err(Error::unavailable(format!(
                        "failed to load '{name}': {}",
                        m.reason
                    ))))
                }
                _ => None,
            };
            match outcome {
                Some(r) => {
                    if let (Err(_), Some(previous)) = (&r, previous) {
                        // The model keeps what served before: a node that joins later gets that,
                        // not the files or config that failed.
                        self.handle.repo.set(previous);
                    }
                    self.confirm(reply, r);
                }
                None => waiting.push(LoadWaiter {
                    model: name,
                    since,
                    previous,
                    reply,
                }),
            }
        }
        self.load_waiters = waiting;
        let mut waiting = Vec::new();
        for (name, reply) in std::mem::take(&mut self.unload_waiters) {
            let held = nodes
                .iter()
                .any(|n| n.models.iter().any(|m| m.placed && m.name == name));
            if find(&name).is_none_or(|m| m.replicas.is_empty()) && !held {
                self.confirm(reply, Ok(()));
            } else {
                waiting.push((name, reply));
            }
        }
        self.unload_waiters = waiting;
        let mut waiting = Vec::new();
        for (node, reply) in std::mem::take(&mut self.drain_waiters) {
            if self.drained.contains(&node) {
                self.confirm(reply, Ok(()));
            } else {
                waiting.push((node, reply));
            }
        }
        self.drain_waiters = waiting;
    }

    pub(super) async fn load(&mut self, name: String, options: LoadOptions, reply: RpcReplyPort<Result<()>>) {
        let (dirs, _) = repository::scan(&self.handle.repo.roots);
        let config = options.config.clone().unwrap_or_default();
        let (dir, files) = if options.files.is_empty() {
            match dirs.get(&name) {
                Some(d) => (d.clone(), None),
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
        if !self.read(&name, dir, config, files, previous.clone()).await {
            let why = self.errors.get(&name).cloned().unwrap_or_default();
            let _ = reply.send(Err(Error::invalid(format!("failed to load '{name}': {why}"))));
            return;
        }
        let previous = previous.filter(|_| self.wanted.contains(&name));
        self.wanted.insert(name.clone());
        self.load_waiters.push(LoadWaiter {
            model: name,
            since: Instant::now(),
            previous,
            reply,
        });
    }

    pub(super) fn unload(&mut self, name: String, reply: RpcReplyPort<Result<()>>) {
        if !self.wanted.remove(&name) {
            let _ = reply.send(Err(Error::not_found(format!(
                "failed to unload '{name}': it is not loaded in the cluster repository"
            ))));
            return;
        }
        tracing::info!(model = %name, "unloading from every node");
        self.scaled.remove(&name);
        self.scaler.forget(&name);
        self.handle.forget_usage(&name);
        self.unload_waiters.push((name, reply));
    }

    pub(super) fn drain(&mut self, node: String, reply: RpcReplyPort<Result<()>>) {
        let found = self
            .view
            .membership()
            .nodes(Instant::now())
            .into_iter()
            .find(|n| n.name == node && n.link.is_some());
        let Some(n) = found else {
            let _ = reply.send(Err(Error::not_found(format!("no connected node is named '{node}'"))));
            return;
        };
        tracing::info!(node = %node, "draining: moving every placed model off the node");
        self.drains.insert(node.clone(), n.incarnation);
        self.drained.remove(&node);
        self.drain_waiters.push((node, reply));
    }
}
