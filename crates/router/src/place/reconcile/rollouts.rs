//! Operators' rollouts (issue 59) as placement keeps them: a start is checked against what the
//! cluster places (the model placed, both versions in its directory, no rollout of it open), the
//! other commands move the stored rollout through the rollout's own transitions, and the leader
//! stores the outcome with the rest of the intent. Applying the split to requests is the dispatch's.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use mesh::error::Code;
use mesh::{Error, Result};

use super::Reconcile;
use crate::membership::NodeSummary;
use crate::repository::RepoModel;
use crate::rollout::{Command, Phase, Start, Stored};

/// The versions a model directory holds: its numbered subdirectories with files.
pub fn versions(model: &RepoModel) -> BTreeSet<u64> {
    model
        .manifest
        .files
        .iter()
        .filter_map(|f| f.path.split_once('/'))
        .filter(|(dir, _)| !dir.is_empty() && dir.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|(dir, _)| dir.parse::<u64>().ok())
        .filter(|v| *v > 0)
        .collect()
}

impl Reconcile {
    /// Carries out an operator's rollout command for `model`; answers the rollout as it is now.
    pub fn rollout(
        &mut self,
        model: &str,
        command: &Command,
        repo: &[Arc<RepoModel>],
        nodes: &[NodeSummary],
        now: Instant,
    ) -> Result<Stored> {
        let stored = match command {
            Command::Start(start) => self.start(model, start, repo, nodes)?,
            other => {
                let Some(r) = self.rollouts.get_mut(model) else {
                    return Err(Error::not_found(format!(
                        "model '{model}' has no rollout to {}; start one with {{\"action\": \"start\", \
                         \"candidate\": VERSION}}",
                        other.name()
                    )));
                };
                r.act(model, other, now)?;
                r.clone()
            }
        };
        tracing::info!(
            model = %model,
            serving = %stored.serving,
            candidate = %stored.candidate,
            state = stored.state(),
            share = stored.share(),
            "rollout: {}",
            command.name()
        );
        self.rollouts.insert(model.to_string(), stored.clone());
        Ok(stored)
    }

    /// A new rollout of a placed model to a version its directory holds, from the version given or
    /// the one served now.
    fn start(&self, model: &str, start: &Start, repo: &[Arc<RepoModel>], nodes: &[NodeSummary]) -> Result<Stored> {
        let placed = self.placer.bounds(model).is_some();
        let Some(m) = repo.iter().find(|m| m.name == model).filter(|_| placed) else {
            return Err(Error::not_found(format!(
                "model '{model}' is not placed by the cluster: load it (mesh-ops load) before rolling out a version"
            )));
        };
        if let Some(open) = self.rollouts.get(model).filter(|r| r.is_open()) {
            return Err(Error::new(
                Code::AlreadyExists,
                format!(
                    "model '{model}' has a rollout {} already (version {} to {}, {}%): promote or abort it first",
                    open.state(),
                    open.serving,
                    open.candidate,
                    open.share()
                ),
            ));
        }
        let held = versions(m);
        let listed = || {
            let all: Vec<String> = held.iter().map(u64::to_string).collect();
            if all.is_empty() {
                "none".to_string()
            } else {
                all.join(", ")
            }
        };
        let has = |v: &str| v.parse::<u64>().is_ok_and(|v| held.contains(&v));
        if !has(&start.candidate) {
            return Err(Error::not_found(format!(
                "model '{model}' has no version {} in the cluster repository (its versions: {})",
                start.candidate,
                listed()
            )));
        }
        let serving = match &start.serving {
            Some(s) if !has(s) => {
                return Err(Error::not_found(format!(
                    "model '{model}' has no version {s} in the cluster repository (its versions: {})",
                    listed()
                )))
            }
            Some(s) => s.clone(),
            None => serving_now(model, &start.candidate, &held, nodes).ok_or_else(|| {
                Error::invalid(format!(
                    "model '{model}' serves no version other than {} that its directory holds: give 'serving'",
                    start.candidate
                ))
            })?,
        };
        let spec = start.spec(model, &serving)?;
        Ok(Stored::new(&spec, Phase::Running { step: 0 }))
    }

    /// The model's rollout, as this router's intent holds it (a follower's: the leader's, as stored).
    pub fn rollout_of(&self, model: &str) -> Option<&Stored> {
        self.rollouts.get(model)
    }

    /// Every model's rollout, as the view publishes them.
    pub fn rollouts(&self) -> Vec<(String, Stored)> {
        self.rollouts.iter().map(|(m, r)| (m.clone(), r.clone())).collect()
    }
}

/// The version a start that names none rolls out from: the newest the nodes serve ready (not the
/// candidate) that the directory holds, else the newest the directory holds below the candidate.
fn serving_now(model: &str, candidate: &str, held: &BTreeSet<u64>, nodes: &[NodeSummary]) -> Option<String> {
    let candidate: u64 = candidate.parse().ok()?;
    let served = nodes
        .iter()
        .flat_map(|n| &n.models)
        .filter(|m| m.name == model && m.ready)
        .filter_map(|m| u64::try_from(m.version).ok())
        .filter(|v| *v != candidate && held.contains(v))
        .max();
    served
        .or_else(|| held.range(..candidate).next_back().copied())
        .map(|v| v.to_string())
}
