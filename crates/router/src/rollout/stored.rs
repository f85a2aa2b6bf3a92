//! A rollout as placement's intent keeps it (issue 59): its spec and where the operator and the
//! guard left it, stored in etcd with the rest of the intent so that a restarted router or a new
//! leader carries on from there; the operator's commands applied to it through [`Rollout`]'s own
//! transitions; and the JSON that status and the API show of it.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mesh::error::Code;
use mesh::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};

use super::{Command, Guard, Phase, Rollout, Spec};

/// The longest rollback reason a stored rollout may carry.
const MAX_REASON_BYTES: usize = 4096;

/// One model's rollout as the intent stores it (the model is its key there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The version that served when it started.
    pub serving: String,
    pub candidate: String,
    /// The candidate's share at each step, in percent.
    pub steps: Vec<u8>,
    pub min_step_seconds: u64,
    pub min_step_requests: u64,
    pub min_requests: u64,
    pub max_error_rate_increase: f64,
    pub max_p99_ratio: f64,
    #[serde(default)]
    pub shadow: u8,
    pub phase: Phase,
    /// When it started, in ms since the Unix epoch (names this rollout among the model's; 0 in one
    /// stored by an older build).
    #[serde(default)]
    pub started: u64,
}

impl Stored {
    /// A rollout of `spec` at `phase`.
    pub fn new(spec: &Spec, phase: Phase) -> Stored {
        Stored {
            serving: spec.serving.clone(),
            candidate: spec.candidate.clone(),
            steps: spec.steps.clone(),
            min_step_seconds: spec.min_step_time.as_secs(),
            min_step_requests: spec.min_step_requests,
            min_requests: spec.guard.min_requests,
            max_error_rate_increase: spec.guard.max_error_rate_increase,
            max_p99_ratio: spec.guard.max_p99_ratio,
            shadow: spec.shadow,
            phase,
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// Its spec, for `model`.
    pub fn spec(&self, model: &str) -> Spec {
        Spec {
            model: model.to_string(),
            serving: self.serving.clone(),
            candidate: self.candidate.clone(),
            steps: self.steps.clone(),
            min_step_time: Duration::from_secs(self.min_step_seconds),
            min_step_requests: self.min_step_requests,
            guard: Guard {
                min_requests: self.min_requests,
                max_error_rate_increase: self.max_error_rate_increase,
                max_p99_ratio: self.max_p99_ratio,
            },
            shadow: self.shadow,
        }
    }

    /// Whether a stored rollout can be carried on: it holds to every rule a start through the API
    /// is checked against (stored intent is read as hostile as a client's body), and its step is
    /// one of its steps.
    pub fn is_sound(&self) -> bool {
        use super::command::{version, MAX_REQUESTS, MAX_STEPS, MAX_STEP_SECONDS};
        let plain = |v: &String| version(&Value::String(v.clone()), "version").is_ok_and(|p| p == *v);
        let step_known = match &self.phase {
            Phase::Running { step } | Phase::Paused { step } => *step < self.steps.len(),
            Phase::RolledBack { reason } => reason.len() <= MAX_REASON_BYTES,
            Phase::Promoted | Phase::Aborted => true,
        };
        step_known
            && plain(&self.serving)
            && plain(&self.candidate)
            && self.serving != self.candidate
            && self.steps.len() <= MAX_STEPS
            && self.min_step_seconds <= MAX_STEP_SECONDS
            && self.min_step_requests <= MAX_REQUESTS
            && (1..=MAX_REQUESTS).contains(&self.min_requests)
            && self.shadow <= 100
            && self.spec("").check().is_ok()
    }

    /// The state machine of this rollout, its step starting at `now`.
    pub fn rollout(&self, model: &str, now: Instant) -> Rollout {
        Rollout::at(self.spec(model), self.phase.clone(), now)
    }

    /// Whether it runs or is paused (both versions stay placed; no second one may start).
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Running { .. } | Phase::Paused { .. })
    }

    /// The candidate's share of requests that name no version now, in percent.
    pub fn share(&self) -> u8 {
        match self.phase {
            Phase::Running { step } | Phase::Paused { step } => self.steps.get(step).copied().unwrap_or(0),
            Phase::Promoted => 100,
            Phase::RolledBack { .. } | Phase::Aborted => 0,
        }
    }

    /// Applies an operator's pause, resume, promote or abort of `model`'s rollout; a rollout that
    /// is over takes none of them (a conflict, HTTP 409).
    pub fn act(&mut self, model: &str, command: &Command, now: Instant) -> Result<()> {
        let mut r = self.rollout(model, now);
        let done = match command {
            Command::Pause => r.pause(),
            Command::Resume => r.resume(now),
            Command::Promote => r.promote(),
            Command::Abort => r.abort(),
            Command::Start(_) => {
                return Err(Error::internal("a start is not an action on a rollout"));
            }
        };
        if !done {
            return Err(Error::new(
                Code::AlreadyExists,
                format!(
                    "the rollout of '{model}' to version {} is over ({}): it cannot {}; start a new one",
                    self.candidate,
                    self.state(),
                    command.name()
                ),
            ));
        }
        self.phase = r.phase;
        Ok(())
    }

    /// Its state's name: running, paused, promoted, rolled_back or aborted.
    pub fn state(&self) -> &'static str {
        match self.phase {
            Phase::Running { .. } => "running",
            Phase::Paused { .. } => "paused",
            Phase::Promoted => "promoted",
            Phase::RolledBack { .. } => "rolled_back",
            Phase::Aborted => "aborted",
        }
    }

    /// What status and the API show of `model`'s rollout.
    pub fn status(&self, model: &str) -> Value {
        let (step, reason) = match &self.phase {
            Phase::Running { step } | Phase::Paused { step } => (Some(*step), ""),
            Phase::RolledBack { reason } => (None, reason.as_str()),
            _ => (None, ""),
        };
        json!({
            "model": model,
            "serving": self.serving,
            "candidate": self.candidate,
            "state": self.state(),
            "step": step,
            "steps": self.steps,
            "share": self.share(),
            "reason": reason,
            "min_step_seconds": self.min_step_seconds,
            "min_step_requests": self.min_step_requests,
            "min_requests": self.min_requests,
            "max_error_rate_increase": self.max_error_rate_increase,
            "max_p99_ratio": self.max_p99_ratio,
            "shadow": self.shadow,
            "started_ms": self.started,
        })
    }
}

/// Reads the stored rollouts leniently: an entry this build cannot read or carry on (another
/// build's, or damaged) is left out with a log line, never the rest of placement's intent with it.
pub fn lenient<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<BTreeMap<String, Stored>, D::Error> {
    let raw = match Option::<Value>::deserialize(d)? {
        Some(Value::Object(entries)) => entries,
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(other) => {
            let kind = match other {
                Value::Array(_) => "list",
                Value::String(_) => "string",
                _ => "scalar",
            };
            tracing::error!("the stored rollouts are not a map of models (a {kind}); leaving them out");
            serde_json::Map::new()
        }
    };
    Ok(raw
        .into_iter()
        .filter_map(|(model, v)| match serde_json::from_value::<Stored>(v) {
            Ok(s) if s.is_sound() => Some((model, s)),
            Ok(_) => {
                tracing::error!(model = %model, "the stored rollout cannot be carried on; leaving it out");
                None
            }
            Err(e) => {
                tracing::error!(model = %model, "the stored rollout cannot be read ({e}); leaving it out");
                None
            }
        })
        .collect())
}

#[cfg(test)]
#[path = "stored_tests.rs"]
mod tests;
