//! Operators' rollouts (issue 59) as placement keeps them: a start is checked against what the
//! cluster places (the model placed, both versions in its directory, no rollout of it open), the
//! other commands move the stored rollout through the rollout's own transitions, the leader's guard
//! judges each step from the routers' tallies of answers, both versions are placed while it runs
//! (the version policy widened, restored after), and the leader stores the outcome with the rest
//! of the intent. Applying the split to requests is the dispatch's.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use mesh::config::ModelConfig;
use mesh::error::Code;
use mesh::proto::model_version_policy::{PolicyChoice, Specific};
use mesh::proto::{ModelParameter, ModelVersionPolicy};
use mesh::{Error, Result};

use super::Reconcile;
use crate::membership::NodeSummary;
use crate::repository::RepoModel;
use crate::rollout::{Command, Decision, Phase, Start, Stored, Tally};

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
            Command::Start(start) => {
                let stored = self.start(model, start, repo, nodes)?;
                self.rollout_failed.remove(model);
                stored
            }
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
        let detail = format!(
            "{}: version {} to {}, {} ({}%)",
            command.name(),
            stored.serving,
            stored.candidate,
            stored.state(),
            stored.share()
        );
        self.placer.rollout_event(now, model, &detail);
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

    /// The leader's guard at `now`: adds the routers' `tallies` of answers to each running
    /// rollout's step and carries out what it decides (advance, promote, roll back), stored with
    /// the intent. Answers the decisions made, by model. A router that does not lead judges nothing
    /// (its tallies go to the leader).
    pub fn judge(&mut self, tallies: &[(String, Tally)], now: Instant) -> Vec<(String, Decision)> {
        if self.epoch.is_none() {
            self.live.clear();
            return Vec::new();
        }
        let open: Vec<(String, Stored)> = self
            .rollouts
            .iter()
            .filter(|(_, r)| r.is_open())
            .map(|(m, r)| (m.clone(), r.clone()))
            .collect();
        self.live.retain(|m, _| open.iter().any(|(o, _)| o == m));
        let mut decided = Vec::new();
        for (model, stored) in open {
            // The operator's pause and resume go through the live rollout's own transitions (a
            // resume at 100% keeps the serving version's answers as the baseline); any other
            // change (another leader's, a new start) starts the step over.
            let kept = match self.live.get_mut(&model) {
                Some((l, started)) if *started == stored.started && l.spec == stored.spec(&model) => {
                    match (&l.phase, &stored.phase) {
                        (a, b) if a == b => true,
                        (Phase::Running { step: a }, Phase::Paused { step: b }) if a == b => l.pause(),
                        (Phase::Paused { step: a }, Phase::Running { step: b }) if a == b => l.resume(now),
                        _ => false,
                    }
                }
                _ => false,
            };
            if !kept {
                self.live
                    .insert(model.clone(), (stored.rollout(&model, now), stored.started));
            }
            let Some((live, _)) = self.live.get_mut(&model) else {
                continue;
            };
            let ours = |t: &Tally| t.counts(&stored.serving, &stored.candidate, stored.started);
            for (_, tally) in tallies.iter().filter(|(m, t)| *m == model && ours(t)) {
                live.add(tally);
            }
            // A node answered a Place of both versions with a failure (the candidate does not load,
            // or the node cannot hold both): roll back, saying where and why.
            let decision = match self.rollout_failed.remove(&model) {
                Some((node, why)) => live.roll_back(format!(
                    "versions {} and {} could not be placed on node '{node}': {why}",
                    stored.serving, stored.candidate
                )),
                None => live.tick(now),
            };
            if decision != Decision::Stay {
                tracing::info!(
                    model = %model,
                    serving = %stored.serving,
                    candidate = %stored.candidate,
                    share = live.share(),
                    "rollout: {}",
                    describe(&decision)
                );
                let phase = live.phase.clone();
                if let Some(r) = self.rollouts.get_mut(&model) {
                    r.phase = phase;
                }
                self.placer.rollout_event(now, &model, &describe(&decision));
                decided.push((model, decision));
            }
        }
        decided
    }

    /// The config override `m` is placed with: while a rollout of it runs, its version policy
    /// serves both versions; once over, the version that won if its own policy would not serve it,
    /// else its own config again. A model placed with its config.pbtxt gets only the version policy
    /// (the node reads its own config, `--model-config-name` and auto-complete as ever, and takes
    /// the policy from this); one placed with a load's config override gets that override with the
    /// policy in it.
    pub fn placed_config(&self, m: &RepoModel) -> String {
        let Some(r) = self.rollouts.get(&m.name) else {
            return m.config_override.clone();
        };
        let version = |v: &str| v.parse::<i64>().unwrap_or(0);
        let serve = match &r.phase {
            Phase::Running { .. } | Phase::Paused { .. } => vec![version(&r.serving), version(&r.candidate)],
            phase => {
                let won = version(if *phase == Phase::Promoted {
                    &r.candidate
                } else {
                    &r.serving
                });
                if policy_serves(&m.config, &versions(m), won) {
                    return m.config_override.clone();
                }
                vec![won]
            }
        };
        let policy = Some(ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Specific(Specific { versions: serve })),
        });
        let config = if m.config_override.is_empty() {
            let mut only = ModelConfig {
                name: m.name.clone(),
                version_policy: policy,
                ..ModelConfig::default()
            };
            only.parameters.insert(
                mesh::config::VERSION_POLICY_ONLY.into(),
                ModelParameter {
                    string_value: "true".into(),
                },
            );
            only
        } else {
            ModelConfig {
                version_policy: policy,
                ..m.config.clone()
            }
        };
        mesh::config::config_to_json(&config).to_string()
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

/// A decision in the words of the log.
fn describe(d: &Decision) -> String {
    match d {
        Decision::Stay => "stays".into(),
        Decision::Advance { step, share } => format!("advanced to step {} ({share}%)", step + 1),
        Decision::Promote => "promoted: the candidate serves every request that names no version".into(),
        Decision::RollBack { reason } => format!("rolled back: {reason}"),
    }
}

/// Whether `config`'s own version policy serves version `v` of the versions `held` (Triton's
/// default: the latest one).
fn policy_serves(config: &ModelConfig, held: &BTreeSet<u64>, v: i64) -> bool {
    let newest = |n: usize| held.iter().rev().take(n.max(1)).any(|h| i64::try_from(*h) == Ok(v));
    match config.version_policy.as_ref().and_then(|p| p.policy_choice.as_ref()) {
        None => newest(1),
        Some(PolicyChoice::Latest(l)) => newest(l.num_versions as usize),
        Some(PolicyChoice::All(_)) => held.iter().any(|h| i64::try_from(*h) == Ok(v)),
        Some(PolicyChoice::Specific(s)) => s.versions.contains(&v),
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
