//! Instance supervision: health that routing and readiness read, and restarts with exponential backoff.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge};

use crate::backend::Backend;

/// Builds a fresh backend session for an instance (the same file, config and device).
pub type BackendFactory = Arc<dyn Fn() -> Result<Box<dyn Backend>, String> + Send + Sync>;

/// Delays between restart attempts: doubling from `first` up to `cap`. Sans-IO.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        Backoff { next: first, cap }
    }

    /// The delay before the next attempt; each call doubles the following one, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        d
    }
}

/// Whether an instance can take work, with its metrics.
pub struct Health {
    ready: AtomicBool,
    restarts: Counter,
    ready_gauge: Gauge,
}

impl Health {
    pub fn new(labels: &[(&'static str, String)]) -> Self {
        let ready_gauge = metrics::gauge!("mesh_instance_ready", labels);
        ready_gauge.set(1.0);
        Health {
            ready: AtomicBool::new(true),
            restarts: metrics::counter!("mesh_instance_restarts_total", labels),
            ready_gauge,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Takes the instance out of routing at once, before the failed batch is answered.
    pub fn mark_failed(&self) {
        self.set(false);
    }

    fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
        self.ready_gauge.set(if ready { 1.0 } else { 0.0 });
    }
}

/// Marks the instance failed, then rebuilds its backend until it succeeds, sleeping per `backoff`.
/// Runs on the instance's executor thread, so nothing else uses the backend meanwhile.
pub fn restart(label: &str, factory: &BackendFactory, health: &Health, mut backoff: Backoff) -> Box<dyn Backend> {
    health.set(false);
    loop {
        let delay = backoff.next_delay();
        tracing::warn!(instance = %label, delay_ms = delay.as_millis() as u64, "instance failed; restarting");
        std::thread::sleep(delay);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory())) {
            Ok(Ok(backend)) => {
                health.restarts.increment(1);
                health.set(true);
                tracing::info!(instance = %label, "instance restarted");
                return backend;
            }
            Ok(Err(e)) => tracing::error!(instance = %label, "restart failed: {e}"),
            Err(_) => tracing::error!(instance = %label, "restart panicked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let got: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }
}
