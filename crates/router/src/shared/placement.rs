//! Placement as the request path and the router's API see it: the cluster repository, the
//! PlacementActor's mailbox (load, unload, scale, drain, rollout), its last published view, and
//! which models requests use (for least-recently-used eviction).
use mesh::sync::{Locked, ReadWrite};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use mesh::{LoadOptions, Result};

use crate::lead::forward::Forward;
use crate::lead::{Lead, Role};
use crate::messages::{Mailbox, PlacementMsg};
pub use crate::place::PlacementView;
use crate::place::ReplicaState;
use crate::repository::ClusterRepo;
use crate::rollout::{Arm, Tally};

/// The shared handle of placement.
pub struct Placement {
    pub repo: Arc<ClusterRepo>,
    /// `--model-control-mode`: repository load/unload only in explicit mode.
    pub mode: mesh::control::ControlMode,
    /// This router's `--http-restricted-api`: a change forwarded to the leader carries the header
    /// of its group, as the client had to give it here.
    rules: Arc<mesh::restrict::Restrictions>,
    /// Whether this router decides placement (always, without etcd).
    pub lead: Arc<Lead>,
    /// The PlacementActor.
    actor: Mailbox<PlacementMsg>,
    view: RwLock<Arc<PlacementView>>,
    /// Last use of each cluster-repository model, in ms since `started`.
    usage: RwLock<HashMap<String, Arc<AtomicU64>>>,
    started: Instant,
    /// Answers of each rolled-out model's two versions since placement last took them (for the
    /// leader's guard); only models with a rollout are counted, each in a bounded tally.
    tallies: std::sync::Mutex<HashMap<String, Tally>>,
    /// A follower's tallies waiting to go to the leader, and when the last ones went.
    outbox: std::sync::Mutex<(HashMap<String, Tally>, Option<Instant>)>,
    /// When a report last failed to reach the leader with a log line, in ms since `started`.
    tally_warned: Arc<AtomicU64>,
}

/// How often a follower sends its tallies to the leader.
const REPORT_EVERY: Duration = Duration::from_secs(1);

impl Placement {
    pub fn new(
        repo: Arc<ClusterRepo>,
        lead: Arc<Lead>,
        mode: mesh::control::ControlMode,
        rules: Arc<mesh::restrict::Restrictions>,
        actor: Mailbox<PlacementMsg>,
    ) -> Self {
        Placement {
            repo,
            mode,
            rules,
            lead,
            actor,
            view: RwLock::default(),
            usage: RwLock::default(),
            started: Instant::now(),
            tallies: Default::default(),
            outbox: Default::default(),
            tally_warned: Arc::default(),
        }
    }

    /// Places a model of the cluster repository (or places it again after a change); answers once
    /// a replica is ready, or why none can be.
    pub async fn load(&self, name: &str, options: LoadOptions, wait: Duration) -> Result<()> {
        if let Some((leader, http)) = self.leader_elsewhere() {
            return Forward::load(name, &options)
                .send(&leader, &http, wait, &self.rules)
                .await
                .map(drop);
        }
        let name = name.to_string();
        self.actor.ask(wait, |r| PlacementMsg::Load(name, options, r)).await
    }

    /// Removes a model from every node; answers once no node holds it.
    pub async fn unload(&self, name: &str, wait: Duration) -> Result<()> {
        if let Some((leader, http)) = self.leader_elsewhere() {
            return Forward::unload(name)
                .send(&leader, &http, wait, &self.rules)
                .await
                .map(drop);
        }
        let name = name.to_string();
        self.actor.ask(wait, |r| PlacementMsg::Unload(name, r)).await
    }

    /// Changes a model's replica bounds at run time; answers the bounds in effect.
    pub async fn scale(&self, name: &str, min: Option<u32>, max: Option<u32>) -> Result<(u32, u32)> {
        if let Some((leader, http)) = self.leader_elsewhere() {
            let answer = Forward::scale(name, min, max)
                .send(&leader, &http, Duration::from_secs(10), &self.rules)
                .await?;
            let bound = |k: &str| answer.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as u32;
            return Ok((bound("min"), bound("max")));
        }
        let name = name.to_string();
        self.actor
            .ask(Duration::from_secs(10), |r| PlacementMsg::Scale(name, min, max, r))
            .await
    }

    /// Moves every placed model off a node, then tells it it may stop; answers once it is empty.
    pub async fn drain(&self, node: &str, wait: Duration) -> Result<()> {
        if let Some((leader, http)) = self.leader_elsewhere() {
            return Forward::drain(node, wait)
                .send(&leader, &http, wait, &self.rules)
                .await
                .map(drop);
        }
        let node = node.to_string();
        self.actor.ask(wait, |r| PlacementMsg::Drain(node, r)).await
    }

    /// An operator's rollout command for a model (made by the leader); answers the rollout as it
    /// is then, as the API shows it.
    pub async fn rollout(&self, model: &str, command: crate::rollout::Command) -> Result<serde_json::Value> {
        let wait = Duration::from_secs(10);
        if let Some((leader, http)) = self.leader_elsewhere() {
            return Forward::rollout(model, &command)
                .send(&leader, &http, wait, &self.rules)
                .await;
        }
        let name = model.to_string();
        let stored = self
            .actor
            .ask(wait, |r| PlacementMsg::Rollout(name, command, r))
            .await?;
        Ok(stored.status(model))
    }

    /// A model's rollout as this router's view holds it (a follower's: what the leader stored).
    pub fn rollout_status(&self, model: &str) -> Option<serde_json::Value> {
        let view = self.view();
        view.rollouts.iter().find(|(m, _)| m == model).map(|(m, r)| r.status(m))
    }

    /// The leader to hand an operator's change to, when another router leads: (name, HOST:PORT).
    fn leader_elsewhere(&self) -> Option<(String, String)> {
        match self.lead.role() {
            Role::Follower { leader, http, .. } if !http.is_empty() => Some((leader, http)),
            _ => None,
        }
    }

    pub fn view(&self) -> Arc<PlacementView> {
        self.view.reading().clone()
    }

    pub(crate) fn publish(&self, view: PlacementView) {
        *self.view.writing() = Arc::new(view);
    }

    /// Whether a model is one the cluster places and wants now (a request for it may wait for a
    /// replica instead of failing as unknown).
    pub fn is_placing(&self, model: &str) -> bool {
        self.view().models.iter().any(|m| m.name == model)
    }

    /// Adds to the repository index the cluster's models no node reports yet (with why), and those
    /// the router cannot read.
    pub fn index_rows(&self, rows: &mut Vec<mesh::IndexEntry>) {
        let view = self.view();
        for m in &view.models {
            if !rows.iter().any(|r| r.name == m.name) {
                rows.push(mesh::IndexEntry {
                    name: m.name.clone(),
                    version: String::new(),
                    state: if m.replicas.iter().any(|r| r.state == ReplicaState::Loading) {
                        "LOADING"
                    } else {
                        "UNAVAILABLE"
                    }
                    .into(),
                    reason: if m.reason.is_empty() {
                        "being placed".into()
                    } else {
                        m.reason.clone()
                    },
                    nodes: Vec::new(),
                });
            } else if !m.reason.is_empty() {
                for r in rows.iter_mut().filter(|r| r.name == m.name && r.reason.is_empty()) {
                    r.reason = m.reason.clone();
                }
            }
        }
        for (name, why) in &view.errors {
            if !rows.iter().any(|r| r.name == *name) {
                rows.push(mesh::IndexEntry {
                    name: name.clone(),
                    version: String::new(),
                    state: "UNAVAILABLE".into(),
                    reason: why.clone(),
                    nodes: Vec::new(),
                });
            }
        }
    }

    /// Counts one answer of a rolled-out model's version (`arm` of the rollout from `serving` to
    /// `candidate`): `ok` unless it failed, after `took`.
    pub fn tally(&self, model: &str, rollout: (&str, &str, u64), arm: Arm, ok: bool, took: Duration) {
        Tally::of(&mut self.tallies.locked(), model, rollout).record(arm, ok, took);
    }

    /// Adds a follower's reported `tally` of `model` to this router's, for its guard: taken only
    /// by the leader, for a model whose rollout runs between those versions.
    pub fn merge_tally(&self, model: &str, tally: &Tally) -> Result<()> {
        if self.lead.role().epoch().is_none() {
            return Err(mesh::Error::unavailable(
                "this router does not lead placement: a rollout's tallies go to the leader",
            ));
        }
        let view = self.view();
        let runs = view
            .rollouts
            .iter()
            .any(|(m, r)| m == model && r.is_open() && tally.counts(&r.serving, &r.candidate, r.started));
        if !runs {
            return Err(mesh::Error::not_found(format!(
                "model '{model}' has no running rollout from version {} to {}",
                tally.serving, tally.candidate
            )));
        }
        Tally::of(&mut self.tallies.locked(), model, tally.rollout()).merge(tally);
        Ok(())
    }

    /// A follower's tallies (`taken` this tick, at `now`) go to the leader, gathered for a second
    /// at a time; a report the leader does not take is dropped with a log line (the guard judges
    /// on the answers it has). Nothing for a router that leads.
    pub(crate) fn hand_over(&self, taken: Vec<(String, Tally)>, now: Instant) {
        let Some((leader, http)) = self.leader_elsewhere() else {
            // Leading (or alone): nothing waits to go to another leader any more.
            self.outbox.locked().0.clear();
            return;
        };
        let due = {
            let mut outbox = self.outbox.locked();
            let (pending, sent) = &mut *outbox;
            for (model, tally) in taken {
                Tally::of(pending, &model, tally.rollout()).merge(&tally);
            }
            if pending.is_empty() || sent.is_some_and(|at| now.saturating_duration_since(at) < REPORT_EVERY) {
                return;
            }
            *sent = Some(now);
            std::mem::take(pending)
        };
        let rules = self.rules.clone();
        let warned = self.tally_warned.clone();
        let now_ms = self.started.elapsed().as_millis() as u64;
        tokio::spawn(async move {
            for (model, tally) in due {
                let report = Forward::tally(&model, &tally);
                if let Err(e) = report.send(&leader, &http, Duration::from_secs(5), &rules).await {
                    // Once a minute at most: a leader that refuses every report would fill the log.
                    let last = warned.load(Ordering::Relaxed);
                    if last == 0 || now_ms.saturating_sub(last) >= 60_000 {
                        warned.store(now_ms.max(1), Ordering::Relaxed);
                        tracing::warn!(model = %model, "a rollout tally did not reach the leader: {e}");
                    }
                }
            }
        });
    }

    /// Takes every tally counted since the last time.
    pub(crate) fn take_tallies(&self) -> Vec<(String, Tally)> {
        std::mem::take(&mut *self.tallies.locked()).into_iter().collect()
    }

    /// Notes that a request for `model` was routed (cheap: an atomic store for known models).
    pub fn touch(&self, model: &str) {
        let now = self.started.elapsed().as_millis() as u64;
        if let Some(at) = self.usage.reading().get(model) {
            at.store(now, Ordering::Relaxed);
            return;
        }
        // Only models of the cluster repository are tracked, so request names cannot grow the map.
        if self.repo.contains(model) {
            self.usage
                .writing()
                .entry(model.to_string())
                .or_default()
                .store(now, Ordering::Relaxed);
        }
    }

    /// When each tracked model was last used.
    pub(crate) fn last_used(&self) -> Vec<(String, Instant)> {
        self.usage
            .reading()
            .iter()
            .map(|(m, at)| {
                (
                    m.clone(),
                    self.started + Duration::from_millis(at.load(Ordering::Relaxed)),
                )
            })
            .collect()
    }

    pub(crate) fn forget_usage(&self, model: &str) {
        self.usage.writing().remove(model);
    }
}
