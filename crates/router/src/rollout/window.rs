//! One version's answers in a rollout's step: how many, how many failed, and their latency
//! (a bounded histogram, so a step of any length holds a fixed size).
use std::time::Duration;

use crate::metrics::histogram::Histogram;

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
