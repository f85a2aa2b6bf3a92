//! A model's rollout from its serving version to a candidate (issue 59), as plain decisions fed
//! with counts and `now`: steps of traffic share, each held for a minimum time and request count,
//! a guard that compares the candidate's error rate and p99 latency with the serving version's
//! over the same step, and the operator's pause, resume, promote and abort. The router's actors
//! only carry the decisions out (placement keeps both versions placed, the dispatch splits
//! requests by [`split`]); the state is small enough to be stored where placement's intent is.
//!
//! The rules:
//! - Steps are percentages of the requests that name no version, strictly rising, the last 100.
//! - A step advances once it has run `min_step_time`, the candidate has answered
//!   `min_step_requests` requests in it, and the guard holds; the last step's advance promotes.
//!   At the last step (100%) the serving version gets no versionless requests: the candidate is
//!   judged against the serving version's answers of the step before.
//! - The guard judges a step once both versions have answered `guard.min_requests` in it: the
//!   rollout rolls back by itself (share 0, with its reason) when the candidate's error rate
//!   exceeds the serving version's by more than `max_error_rate_increase`, or its p99 latency is
//!   more than `max_p99_ratio` times the serving version's (and more than [`P99_FLOOR`] above it,
//!   so that microseconds of noise never roll back).
//! - Paused, the share stays where it is and nothing advances or rolls back by itself; resumed,
//!   the step starts over. Promoted, rolled back or aborted, it is over.
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub mod command;
pub mod report;
pub mod shadow;
pub mod split;
pub mod stored;
mod window;

pub use command::{Command, Start};
pub use stored::Stored;
pub use window::{Tally, Window};

/// The smallest p99 difference the guard counts as slower.
pub const P99_FLOOR: Duration = Duration::from_millis(1);

/// What the operator asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub model: String,
    /// The version that serves now.
    pub serving: String,
    /// The version rolled out.
    pub candidate: String,
    /// The candidate's share at each step, in percent.
    pub steps: Vec<u8>,
    pub min_step_time: Duration,
    pub min_step_requests: u64,
    pub guard: Guard,
    /// Percent of the serving version's requests also sent to the candidate as shadows.
    pub shadow: u8,
}

/// When the candidate is worse than the serving version.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Guard {
    /// Requests each version must have answered in a step before it is judged.
    pub min_requests: u64,
    /// The largest error rate increase taken (0.01: one point of percentage).
    pub max_error_rate_increase: f64,
    /// The largest ratio of the candidate's p99 latency to the serving version's.
    pub max_p99_ratio: f64,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            min_requests: 100,
            max_error_rate_increase: 0.01,
            max_p99_ratio: 1.5,
        }
    }
}

impl Spec {
    /// The spec's mistakes, in words an operator can act on.
    pub fn check(&self) -> Result<(), String> {
        if self.serving == self.candidate {
            return Err(format!(
                "model '{}': the candidate is the serving version {}",
                self.model, self.serving
            ));
        }
        if self.steps.is_empty() || self.steps.last() != Some(&100) {
            return Err("the steps must end at 100 (percent)".into());
        }
        if self.steps.windows(2).any(|w| w[0] >= w[1]) || self.steps[0] == 0 {
            return Err(format!("the steps must rise from above 0 to 100, not {:?}", self.steps));
        }
        if self.shadow > 100 {
            return Err(format!("the shadow share is a percentage, not {}", self.shadow));
        }
        let g = &self.guard;
        if !(g.max_error_rate_increase >= 0.0 && g.max_error_rate_increase <= 1.0) {
            return Err("the error rate margin must be between 0 and 1".into());
        }
        if !(g.max_p99_ratio >= 1.0 && g.max_p99_ratio.is_finite()) {
            return Err("the p99 latency margin must be a ratio of at least 1".into());
        }
        Ok(())
    }
}

/// Which version a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arm {
    Serving,
    Candidate,
}

/// Where a rollout is (stored with placement's intent as `{"state": "running", "step": 1}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Phase {
    /// At step `step` (an index into the steps).
    Running { step: usize },
    /// Held by the operator at step `step`.
    Paused { step: usize },
    /// The candidate serves everything.
    Promoted,
    /// The guard found the candidate worse; the serving version serves everything.
    RolledBack { reason: String },
    /// The operator stopped it; the serving version serves everything.
    Aborted,
}

/// What a tick decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Stay,
    /// On to step `step`, the candidate's share now `share` percent.
    Advance {
        step: usize,
        share: u8,
    },
    Promote,
    RollBack {
        reason: String,
    },
}

impl Decision {
    /// Its name in the rollout event metric.
    pub fn event(&self) -> &'static str {
        match self {
            Decision::Stay => "stay",
            Decision::Advance { .. } => "advance",
            Decision::Promote => "auto_promote",
            Decision::RollBack { .. } => "roll_back",
        }
    }
}

/// One rollout's state.
#[derive(Debug, Clone)]
pub struct Rollout {
    pub spec: Spec,
    pub phase: Phase,
    step_started: Instant,
    /// Each version's answers in the current step.
    pub serving: Window,
    pub candidate: Window,
}

impl Rollout {
    /// Starts at the first step at `now`.
    pub fn start(spec: Spec, now: Instant) -> Result<Rollout, String> {
        spec.check()?;
        Ok(Rollout::at(spec, Phase::Running { step: 0 }, now))
    }

    /// A rollout restored in `phase` (a router that took over): its step starts over at `now`.
    pub fn at(spec: Spec, phase: Phase, now: Instant) -> Rollout {
        Rollout {
            spec,
            phase,
            step_started: now,
            serving: Window::default(),
            candidate: Window::default(),
        }
    }

    /// The candidate's share of requests that name no version now, in percent.
    pub fn share(&self) -> u8 {
        match &self.phase {
            Phase::Running { step } | Phase::Paused { step } => self.spec.steps[*step],
            Phase::Promoted => 100,
            Phase::RolledBack { .. } | Phase::Aborted => 0,
        }
    }

    /// Whether it still runs (or is paused): both versions must stay placed.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Running { .. } | Phase::Paused { .. })
    }

    /// A request answered by `arm` (`ok`: not an error), after `latency`.
    pub fn record(&mut self, arm: Arm, ok: bool, latency: Duration) {
        match arm {
            Arm::Serving => self.serving.record(ok, latency),
            Arm::Candidate => self.candidate.record(ok, latency),
        }
    }

    /// A router's tally of this rollout's answers (the caller checks it counts this rollout:
    /// [`Tally::counts`]).
    pub fn add(&mut self, tally: &Tally) {
        self.serving.merge(&tally.serving_answers);
        self.candidate.merge(&tally.candidate_answers);
    }

    /// Rolls it back for `reason` while it runs (a paused or finished one stays as it is).
    pub fn roll_back(&mut self, reason: String) -> Decision {
        if !matches!(self.phase, Phase::Running { .. }) {
            return Decision::Stay;
        }
        self.phase = Phase::RolledBack { reason: reason.clone() };
        Decision::RollBack { reason }
    }

    /// What to do at `now`: roll back, advance, promote, or nothing.
    pub fn tick(&mut self, now: Instant) -> Decision {
        let Phase::Running { step } = self.phase else {
            return Decision::Stay;
        };
        if let Some(reason) = self.judge() {
            return self.roll_back(reason);
        }
        // At 100% the serving version gets no versionless requests: its window is the last step's
        // (kept as the baseline), or none for a rollout restored there, judged on time and count.
        let min = self.spec.guard.min_requests;
        let baseline = self.serving.requests() >= min || (self.share() == 100 && self.serving.requests() == 0);
        let judged = baseline && self.candidate.requests() >= min;
        let held = now.saturating_duration_since(self.step_started) >= self.spec.min_step_time;
        if !(judged && held && self.candidate.requests() >= self.spec.min_step_requests) {
            return Decision::Stay;
        }
        if step + 1 == self.spec.steps.len() {
            self.phase = Phase::Promoted;
            return Decision::Promote;
        }
        self.phase = Phase::Running { step: step + 1 };
        self.new_step(now);
        Decision::Advance {
            step: step + 1,
            share: self.spec.steps[step + 1],
        }
    }

    /// Why the candidate is worse than the serving version in this step, once both have answered
    /// enough requests.
    fn judge(&self) -> Option<String> {
        let (s, c, g) = (&self.serving, &self.candidate, &self.spec.guard);
        if s.requests() < g.min_requests || c.requests() < g.min_requests {
            return None;
        }
        let (se, ce) = (s.error_rate(), c.error_rate());
        if ce > se + g.max_error_rate_increase {
            return Some(format!(
                "version {} failed {:.1}% of {} requests against {:.1}% for version {} (margin {:.1} points)",
                self.spec.candidate,
                ce * 100.0,
                c.requests(),
                se * 100.0,
                self.spec.serving,
                g.max_error_rate_increase * 100.0
            ));
        }
        let (sp, cp) = (s.p99(), c.p99());
        if cp.as_secs_f64() > sp.as_secs_f64() * g.max_p99_ratio && cp > sp + P99_FLOOR {
            return Some(format!(
                "version {}'s p99 latency {:.1} ms is over {:.2}× version {}'s {:.1} ms",
                self.spec.candidate,
                cp.as_secs_f64() * 1e3,
                g.max_p99_ratio,
                self.spec.serving,
                sp.as_secs_f64() * 1e3
            ));
        }
        None
    }

    /// Starts the current step's count at `now`; at 100% the serving version's window is kept as
    /// the baseline the candidate is judged against (it gets no versionless requests there).
    fn new_step(&mut self, now: Instant) {
        self.step_started = now;
        if self.share() < 100 {
            self.serving = Window::default();
        }
        self.candidate = Window::default();
    }

    /// Holds it where it is (an operator's pause); false when it is over.
    pub fn pause(&mut self) -> bool {
        match self.phase {
            Phase::Running { step } => {
                self.phase = Phase::Paused { step };
                true
            }
            Phase::Paused { .. } => true,
            _ => false,
        }
    }

    /// Runs it again from a pause, its step started over at `now`; false when it is over.
    pub fn resume(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::Paused { step } => {
                self.phase = Phase::Running { step };
                self.new_step(now);
                true
            }
            Phase::Running { .. } => true,
            _ => false,
        }
    }

    /// The operator's promotion: the candidate serves everything now; false when it is over.
    pub fn promote(&mut self) -> bool {
        self.is_open() && {
            self.phase = Phase::Promoted;
            true
        }
    }

    /// The operator's abort: the serving version serves everything; false when it is over.
    pub fn abort(&mut self) -> bool {
        self.is_open() && {
            self.phase = Phase::Aborted;
            true
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "sim_tests.rs"]
mod sim_tests;
