//! Placement's side of leadership, sans-IO: only the router that leads (the only one, without etcd)
//! sends placement commands, each stamped with its epoch; a new leader first tells every node its
//! epoch (so a deposed leader's late commands are refused), then carries on from the intent the
//! previous one stored; followers shadow that intent so their index and status agree.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use mesh::control::ControlMode;
use mesh::{Error, Result};

use super::{Command, Output, Read, Reconcile};
use crate::lead::{Desired, Role};
use crate::membership::NodeSummary;
use crate::repository::RepoModel;

impl Reconcile {
    /// Follows this tick's role: takes over the stored intent on becoming leader (or as a follower,
    /// when it changed). Answers the model directories to read for it (explicit mode: the models
    /// the intent loads that this router does not hold with that config).
    pub fn follow(&mut self, role: &Role, repo: &[Arc<RepoModel>]) -> Vec<Read> {
        let mut reads = Vec::new();
        match role {
            Role::Leader { epoch, state } if self.epoch != Some(*epoch) => {
                tracing::info!(epoch, "taking over placement from what etcd holds");
                self.fenced.clear();
                reads = self.apply(state, repo);
                self.taking_over = true;
            }
            Role::Follower { state, .. } if self.applied.as_ref() != Some(&**state) => reads = self.apply(state, repo),
            _ => {}
        }
        self.epoch = role.epoch();
        reads
    }

    /// Takes the stored intent as this router's own.
    fn apply(&mut self, state: &Desired, repo: &[Arc<RepoModel>]) -> Vec<Read> {
        self.applied = Some(state.clone());
        let mut reads = Vec::new();
        if self.settings.mode == ControlMode::Explicit {
            for (name, config) in &state.wanted {
                let unchanged =
                    self.wanted.contains(name) && repo.iter().any(|m| m.name == *name && m.config_override == *config);
                if !unchanged {
                    reads.push(Read {
                        model: name.clone(),
                        config: config.clone(),
                        intent: true,
                    });
                }
            }
            // A model to read joins `wanted` once read well (`read_done`); one wanted already keeps
            // what it serves if the read fails.
            self.wanted.retain(|m| state.wanted.contains_key(m));
        }
        self.scaled = state.bounds.clone();
        self.drains = state.drains.clone();
        self.rollouts = state.rollouts.clone();
        self.drained.clear();
        reads
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
    pub(super) fn fence(&mut self, nodes: &[NodeSummary], epoch: u64, out: &mut Output) {
        let live: BTreeSet<(String, u64)> = nodes
            .iter()
            .filter(|n| n.link.is_some())
            .map(|n| (n.name.clone(), n.incarnation))
            .collect();
        self.fenced.retain(|n| live.contains(n));
        for (node, incarnation) in live {
            if self.fenced.insert((node.clone(), incarnation)) {
                out.commands.push(Command::Fence { node, epoch });
            }
        }
    }

    /// The operator's intent, as the leader stores it for the next one.
    pub fn intent(&self, repo: &[Arc<RepoModel>]) -> Desired {
        let wanted = match self.settings.mode {
            ControlMode::Explicit => self
                .wanted
                .iter()
                .map(|m| {
                    let config = repo.iter().find(|r| r.name == *m).map(|r| r.config_override.clone());
                    (m.clone(), config.unwrap_or_default())
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        Desired {
            wanted,
            bounds: self.scaled.clone(),
            drains: self.drains.clone(),
            rollouts: self.rollouts.clone(),
        }
    }
}

/// Why an operator's change cannot be made on router `me` in this role, if it cannot.
pub fn refuse(role: &Role, me: &str) -> Result<()> {
    match role {
        Role::Single | Role::Leader { .. } => Ok(()),
        Role::Follower { leader, .. } => Err(Error::unavailable(format!(
            "this router ({me}) does not lead placement; {leader} does: send load, unload, scale, drain and rollout there"
        ))),
        Role::Unknown { why } => Err(Error::unavailable(format!(
            "no placement leader is known ({why}); routing goes on, placement changes wait"
        ))),
    }
}
