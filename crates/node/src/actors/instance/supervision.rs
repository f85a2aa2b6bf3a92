//! Instance supervision: health that routing and readiness read, and when to retry a failed instance.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge};

use crate::backend::Backend;

/// Builds a fresh backend session for an instance (the same file, config and device).
pub type BackendFactory = Arc<dyn Fn() -> Result<Box<dyn Backend>, String> + Send + Sync>;

/// Restart delays of one instance: doubling from `first` up to `cap`, back to `first` once the
/// instance has stayed healthy for `reset_after`. Sans-IO: the caller passes the time.
#[derive(Debug, Clone)]
pub struct RestartPolicy {
    first: Duration,
    cap: Duration,
    reset_after: Duration,
    next: Duration,
    healthy_since: Option<Instant>,
}

impl RestartPolicy {
    pub fn new(first: Duration, cap: Duration, reset_after: Duration) -> Self {
        RestartPolicy {
            first,
            cap,
            reset_after,
            next: first,
            healthy_since: None,
        }
    }

    /// 100 ms doubling to 10 s; a minute of health forgives earlier failures.
    pub fn standard() -> Self {
        Self::new(
            Duration::from_millis(100),
            Duration::from_secs(10),
            Duration::from_secs(60),
        )
    }

    /// A failure (or a failed rebuild) at `now`: how long to wait before the next rebuild.
    pub fn on_failure(&mut self, now: Instant) -> Duration {
        if self
            .healthy_since
            .take()
            .is_some_and(|t| now.saturating_duration_since(t) >= self.reset_after)
        {
            self.next = self.first;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.cap);
        delay
    }

    /// The instance was rebuilt at `now` and serves again.
    pub fn on_restarted(&mut self, now: Instant) {
        self.healthy_since = Some(now);
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

    /// Takes the instance out of routing at once; true only for the call that changed it, so a
    /// failure is reported to the supervisor once.
    pub fn mark_failed(&self) -> bool {
        let was = self.ready.swap(false, Ordering::AcqRel);
        self.ready_gauge.set(0.0);
        was
    }

    /// The backend was rebuilt: count the restart and route to the instance again.
    pub fn mark_restarted(&self) {
        self.restarts.increment(1);
        self.ready.store(true, Ordering::Release);
        self.ready_gauge.set(1.0);
    }
}

/// Calls `factory`, turning a panic into an error so a rebuild can never take its caller down.
pub fn build(factory: &BackendFactory) -> Result<Box<dyn Backend>, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory()))
        .unwrap_or_else(|_| Err("building the backend panicked".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let mut p = RestartPolicy::new(ms(100), ms(500), Duration::from_secs(60));
        let t = Instant::now();
        let got: Vec<u128> = (0..5).map(|_| p.on_failure(t).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn a_short_recovery_keeps_backing_off() {
        let mut p = RestartPolicy::new(ms(100), ms(10_000), Duration::from_secs(60));
        let t = Instant::now();
        assert_eq!(p.on_failure(t), ms(100));
        p.on_restarted(t + ms(100));
        // Crashes again 1 s after coming back: a crash loop, so the delay keeps growing.
        assert_eq!(p.on_failure(t + ms(1100)), ms(200));
        p.on_restarted(t + ms(1300));
        assert_eq!(p.on_failure(t + ms(2000)), ms(400));
    }

    #[test]
    fn a_long_healthy_run_resets_the_delay() {
        let mut p = RestartPolicy::new(ms(100), ms(10_000), Duration::from_secs(60));
        let t = Instant::now();
        for _ in 0..4 {
            p.on_failure(t);
        }
        p.on_restarted(t);
        assert_eq!(p.on_failure(t + Duration::from_secs(61)), ms(100));
        assert_eq!(
            p.on_failure(t + Duration::from_secs(61)),
            ms(200),
            "a failed rebuild doubles again"
        );
    }

    #[test]
    fn a_panicking_factory_is_an_error() {
        let f: BackendFactory = Arc::new(|| panic!("boom"));
        let err = build(&f).err().expect("a panic must come back as an error");
        assert!(err.contains("panicked"), "{err}");
    }
}
