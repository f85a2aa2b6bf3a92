//! One version's answers in a rollout's step: how many, how many failed, and their latency
//! (a bounded histogram, so a step of any length holds a fixed size); and a router's [`Tally`] of
//! both versions' answers, which the leader's guard adds to the step's windows.
use std::collections::HashMap;
use std::time::Duration;

use super::Arm;
use crate::metrics::histogram::Histogram;

/// Both versions' answers counted on a router since the tally was last taken, for the versions
/// they were counted for (the rollout may have changed since).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub serving: String,
    pub candidate: String,
    /// When the rollout started (names it among the model's).
    pub started: u64,
    pub serving_answers: Window,
    pub candidate_answers: Window,
}

impl Tally {
    /// An empty tally of the rollout from `serving` to `candidate` that started at `started`.
    pub fn new(serving: &str, candidate: &str, started: u64) -> Tally {
        Tally {
            serving: serving.to_string(),
            candidate: candidate.to_string(),
            started,
            ..Tally::default()
        }
    }

    /// One answer of `arm`.
    pub fn record(&mut self, arm: Arm, ok: bool, latency: Duration) {
        match arm {
            Arm::Serving => self.serving_answers.record(ok, latency),
            Arm::Candidate => self.candidate_answers.record(ok, latency),
        }
    }

    /// The rollout it counts: (serving, candidate, started).
    pub fn rollout(&self) -> (&str, &str, u64) {
        (&self.serving, &self.candidate, self.started)
    }

    /// `model`'s tally in `tallies`, of `rollout` (serving, candidate, started): empty if it held
    /// another rollout's (which is dropped).
    pub fn of<'a>(
        tallies: &'a mut HashMap<String, Tally>,
        model: &str,
        (serving, candidate, started): (&str, &str, u64),
    ) -> &'a mut Tally {
        let t = tallies
            .entry(model.to_string())
            .or_insert_with(|| Tally::new(serving, candidate, started));
        if !t.counts(serving, candidate, started) {
            *t = Tally::new(serving, candidate, started);
        }
        t
    }

    /// Whether it counts the rollout from `serving` to `candidate` that started at `started`.
    pub fn counts(&self, serving: &str, candidate: &str, started: u64) -> bool {
        self.serving == serving && self.candidate == candidate && self.started == started
    }

    /// Adds another tally of the same rollout to this one.
    pub fn merge(&mut self, other: &Tally) {
        self.serving_answers.merge(&other.serving_answers);
        self.candidate_answers.merge(&other.candidate_answers);
    }
}

/// Answers counted in one step.
#[derive(Debug, Clone, Default)]
pub struct Window {
    requests: u64,
    errors: u64,
    latency: Histogram,
}

impl Window {
    /// One answer (`ok`: not an error) after `latency`.
    pub fn record(&mut self, ok: bool, latency: Duration) {
        self.requests += 1;
        if !ok {
            self.errors += 1;
        }
        self.latency.add(latency);
    }

    /// A window of `requests` answers, `errors` of them failed, with their `latency`.
    pub fn from_parts(requests: u64, errors: u64, latency: Histogram) -> Window {
        Window {
            requests,
            errors,
            latency,
        }
    }

    /// Its latency histogram.
    pub fn latency(&self) -> &Histogram {
        &self.latency
    }

    /// Adds another window's answers to these.
    pub fn merge(&mut self, other: &Window) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.latency.merge(&other.latency);
    }

    pub fn requests(&self) -> u64 {
        self.requests
    }

    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// The share of answers that were errors (0 with none).
    pub fn error_rate(&self) -> f64 {
        match self.requests {
            0 => 0.0,
            n => self.errors as f64 / n as f64,
        }
    }

    /// The 99th percentile latency, within 12.5% (0 with none).
    pub fn p99(&self) -> Duration {
        Duration::from_micros(u64::from(self.latency.quantile(0.99)))
    }
}
