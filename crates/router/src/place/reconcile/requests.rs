//! Operators' requests to placement (repository loads and unloads, drains, replica bounds) and a
//! node's answer to a Place; each waiting request is answered once the cluster got there, or with why
//! it cannot.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use mesh::cluster::msg;
use mesh::{Error, Result};

use super::{Output, Reconcile};
use crate::membership::NodeSummary;
use crate::place::{ModelView, Observed, ReplicaState};
use crate::repository::RepoModel;

/// Names one waiting request; the actor keeps its reply port under it.
pub type WaiterId = u64;

/// A load waiting for its outcome.
struct LoadWaiter {
    id: WaiterId,
    model: String,
    since: Instant,
    /// What the model served before, restored if this load fails (None: it did not serve).
    previous: Option<Arc<RepoModel>>,
}

/// The requests waiting, by kind.
#[derive(Default)]
pub(super) struct Waiters {
    next: WaiterId,
    loads: Vec<LoadWaiter>,
    /// Unloads: the model.
    unloads: BTreeMap<WaiterId, String>,
    /// Drains: the node.
    drains: BTreeMap<WaiterId, String>,
}

impl Waiters {
    fn id(&mut self) -> WaiterId {
        self.next += 1;
        self.next
    }
}

impl Reconcile {
    /// A repository load whose model the actor read well (and put in the repository view):
    /// `previous` is what served before. Answered by a later tick.
    pub fn load(&mut self, model: &str, previous: Option<Arc<RepoModel>>, now: Instant) -> WaiterId {
        let previous = previous.filter(|_| self.wanted.contains(model));
        self.wanted.insert(model.to_string());
        // A load places the model as its config says again: a finished rollout's outcome (the
        // version that won, pinned) ends here; one still running goes on.
        self.rollouts.retain(|m, r| m != model || r.is_open());
        let id = self.waiters.id();
        self.waiters.loads.push(LoadWaiter {
            id,
            model: model.to_string(),
            since: now,
            previous,
        });
        id
    }

    /// A repository unload: answered once no node holds the model.
    pub fn unload(&mut self, model: &str) -> Result<WaiterId> {
        if !self.wanted.remove(model) {
            return Err(Error::not_found(format!(
                "failed to unload '{model}': it is not loaded in the cluster repository"
            )));
        }
        tracing::info!(model = %model, "unloading from every node");
        self.scaled.remove(model);
        self.rollouts.remove(model);
        self.scaler.forget(model);
        let id = self.waiters.id();
        self.waiters.unloads.insert(id, model.to_string());
        Ok(id)
    }

    /// An operator's drain of a connected node: answered once it holds nothing placed.
    pub fn drain(&mut self, node: &str, nodes: &[NodeSummary]) -> Result<WaiterId> {
        let Some(n) = nodes.iter().find(|n| n.name == node && n.link.is_some()) else {
            return Err(Error::not_found(format!("no connected node is named '{node}'")));
        };
        tracing::info!(node = %node, "draining: moving every placed model off the node");
        self.drains.insert(node.to_string(), n.incarnation);
        self.drained.remove(node);
        let id = self.waiters.id();
        self.waiters.drains.insert(id, node.to_string());
        Ok(id)
    }

    /// New replica bounds for a placed model; answers the bounds in effect.
    pub fn scale(&mut self, model: &str, min: Option<u32>, max: Option<u32>) -> Result<(u32, u32)> {
        if self.placer.bounds(model).is_none() {
            return Err(Error::not_found(format!("model '{model}' is not placed")));
        }
        self.placer.set_bounds(model, min, max).map_err(Error::invalid)?;
        let (lo, hi) = self.placer.bounds(model).unwrap_or_default();
        tracing::info!(model = %model, min = lo, max = hi, "replica bounds changed");
        self.scaled.insert(model.to_string(), (lo, hi));
        Ok((lo, hi))
    }

    /// A node answered a Place. Readiness comes from membership (what the node reports), never
    /// from this answer: the two travel apart, and membership is what Absent is judged against.
    pub fn placed(&mut self, node: &str, answer: msg::Placed, now: Instant) {
        let pair = (answer.model.clone(), node.to_string());
        self.pending.remove(&pair);
        if self.rollout_ships.remove(&pair) && !answer.error.is_empty() {
            // A rollout's placement failed: its guard rolls it back.
            let why = (node.to_string(), answer.error.clone());
            self.rollout_failed.insert(answer.model.clone(), why);
        }
        if answer.error.is_empty() {
            self.placer.measured(&answer.model, answer.footprint);
        } else {
            self.failed
                .insert(answer.model.clone(), (now, format!("on {node}: {}", answer.error)));
            self.placer
                .observed(node, &answer.model, Observed::Failed(answer.error), now);
        }
    }

    pub(super) fn answer_waiters(&mut self, view: &[ModelView], nodes: &[NodeSummary], out: &mut Output) {
        let find = |name: &str| view.iter().find(|m| m.name == name);
        for waiter in std::mem::take(&mut self.waiters.loads) {
            match self.load_outcome(find(&waiter.model), &waiter) {
                Some(r) => {
                    if let (Err(_), Some(previous)) = (&r, &waiter.previous) {
                        // The model keeps what served before: a node that joins later gets that,
                        // not the files or config that failed.
                        out.restore.push(previous.clone());
                    }
                    out.answers.push((waiter.id, r));
                }
                None => self.waiters.loads.push(waiter),
            }
        }
        let held = |name: &str| {
            nodes
                .iter()
                .any(|n| n.models.iter().any(|m| m.placed && m.name == name))
        };
        self.waiters.unloads.retain(|id, name| {
            let gone = find(name).is_none_or(|m| m.replicas.is_empty()) && !held(name);
            if gone {
                out.answers.push((*id, Ok(())));
            }
            !gone
        });
        let drained = &self.drained;
        self.waiters.drains.retain(|id, node| {
            let done = drained.contains(node);
            if done {
                out.answers.push((*id, Ok(())));
            }
            !done
        });
    }

    fn load_outcome(&self, model: Option<&ModelView>, waiter: &LoadWaiter) -> Option<Result<()>> {
        let name = &waiter.model;
        let answering = !self.pending.iter().any(|(m, _)| m == name);
        let failed = self
            .failed
            .get(name)
            .filter(|(at, _)| *at >= waiter.since)
            .map(|(_, why)| why);
        match (model, self.errors.get(name)) {
            (_, Some(why)) => Some(Err(Error::invalid(format!("failed to load '{name}': {why}")))),
            // A node failed the load (or reload) asked for: the versions already serving stay.
            (_, None) if answering && failed.is_some() => Some(Err(Error::invalid(format!(
                "failed to load '{name}': {}",
                failed.map_or("", |w| w.as_str())
            )))),
            // Ready somewhere, and every replica shipped again (a reload) has answered.
            (Some(m), _) if answering && m.replicas.iter().any(|r| r.state == ReplicaState::Ready) => Some(Ok(())),
            (Some(m), _) if !m.reason.is_empty() && !m.replicas.iter().any(|r| r.state == ReplicaState::Loading) => {
                Some(Err(Error::unavailable(format!(
                    "failed to load '{name}': {}",
                    m.reason
                ))))
            }
            _ => None,
        }
    }
}
