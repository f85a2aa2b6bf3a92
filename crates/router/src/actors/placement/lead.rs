//! The PlacementActor's side of leadership: only the router that leads (the only one, without
//! etcd) sends placement commands, each stamped with its epoch; a new leader first tells every node
//! its epoch (so a deposed leader's late commands are refused), then carries on from the intent
//! the previous one stored; followers shadow that intent so their index and status agree.
use std::collections::{BTreeMap, BTreeSet};

use mesh::cluster::msg::{self, Message};
use mesh::{Error, Result};
use ractor::RpcReplyPort;

use super::{ControlMode, PlacementState};
use crate::lead::{Desired, Role};
use crate::membership::NodeSummary;
use crate::repository;

impl PlacementState {
    /// Follows the role this tick: applies the stored intent on taking over (or as a follower,
    /// when it changed); answers the epoch to act with, None when this router must not act.
    pub(super) async fn lead(&mut self) -> Option<u64> {
        let role = self.handle.lead.role();
        let epoch = role.epoch();
        match &role {
            Role::Leader { epoch, state } if self.epoch != Some(*epoch) => {
                tracing::info!(epoch, "taking over placement from what etcd holds");
                self.fenced.clear();
                self.apply(state).await;
                // The autoscaler's decisions lived on the old leader: keep the replicas there are
                // (within the bounds) until this one's own autoscaler decides, after its delays.
                for m in self.placer.view() {
                    let ready = self.placer.ready(&m.name);
                    if ready > 0 {
                        self.placer.set_desired(&m.name, ready);
                    }
                }
            }
            Role::Follower { state, .. } if self.applied.as_ref() != Some(&**state) => self.apply(state).await,
            _ => {}
        }
        self.epoch = epoch;
        epoch
    }

    /// Takes the stored intent as this router's own.
    async fn apply(&mut self, state: &Desired) {
        self.applied = Some(state.clone());
        if self.settings.mode == ControlMode::Explicit {
            let (dirs, _) = repository::scan(&self.handle.repo.roots);
            for (name, config) in &state.wanted {
                let unchanged = self.wanted.contains(name)
                    && self.handle.repo.get(name).is_some_and(|m| m.config_override == *config);
                if unchanged {
                    continue;
                }
                match dirs.get(name) {
                    Some(dir) => {
                        let previous = self.handle.repo.get(name);
                        if self.read(name, dir.clone(), config.clone(), None, previous).await {
                            self.wanted.insert(name.clone());
                        }
                    }
                    None => {
                        let why = "loaded by an earlier leader, but not in this router's cluster repository";
                        tracing::error!(model = %name, "{why}");
                        self.errors.insert(name.clone(), why.into());
                    }
                }
            }
            self.wanted.retain(|m| state.wanted.contains_key(m));
        }
        self.scaled = state.bounds.clone();
        self.drains = state.drains.clone();
        self.drained.clear();
    }

    /// Replica bounds set by `scale` (here or by an earlier leader), kept across model reloads.
    pub(super) fn apply_bounds(&mut self) {
        for (model, (lo, hi)) in &self.scaled {
            if self.placer.bounds(model) != Some((*lo, *hi)) {
                let _ = self.placer.set_bounds(model, Some(*lo), Some(*hi));
            }
        }
    }

    /// A new leader tells every connected node its epoch once per node process.
    pub(super) fn fence(&mut self, nodes: &[NodeSummary], epoch: u64) {
        let live: BTreeSet<(String, u64)> = nodes
            .iter()
            .filter(|n| n.link.is_some())
            .map(|n| (n.name.clone(), n.incarnation))
            .collect();
        self.fenced.retain(|n| live.contains(n));
        for (node, incarnation) in live {
            if !self.fenced.contains(&(node.clone(), incarnation))
                && self.send(&node, Message::Fence(msg::Fence { epoch }))
            {
                self.fenced.insert((node, incarnation));
            }
        }
    }

    /// The leader stores the operator's intent for the next one.
    pub(super) fn save(&self) -> u64 {
        let wanted = match self.settings.mode {
            ControlMode::Explicit => self
                .wanted
                .iter()
                .map(|m| {
                    let config = self.handle.repo.get(m).map(|r| r.config_override.clone());
                    (m.clone(), config.unwrap_or_default())
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        self.handle.lead.save(&Desired {
            wanted,
            bounds: self.scaled.clone(),
            drains: self.drains.clone(),
        })
    }

    /// Answers an operator's change once etcd holds it (at once without etcd); a failed change is
    /// answered at once.
    pub(super) fn confirm<T: Send + 'static>(&self, reply: RpcReplyPort<Result<T>>, result: Result<T>) {
        if result.is_err() || !self.handle.lead.elected() {
            let _ = reply.send(result);
            return;
        }
        let seq = self.save();
        let lead = self.handle.lead.clone();
        tokio::spawn(async move {
            let stored = lead.stored(seq).await;
            let _ = reply.send(stored.and(result));
        });
    }

    /// Why an operator's change cannot be made on this router now, if it cannot.
    pub(super) fn refuse(&self) -> Result<()> {
        match self.handle.lead.role() {
            Role::Single | Role::Leader { .. } => Ok(()),
            Role::Follower { leader, .. } => Err(Error::unavailable(format!(
                "this router ({}) does not lead placement; {leader} does: send load, unload, scale and drain there",
                self.handle.lead.id
            ))),
            Role::Unknown { why } => Err(Error::unavailable(format!(
                "no placement leader is known ({why}); routing goes on, placement changes wait"
            ))),
        }
    }
}
