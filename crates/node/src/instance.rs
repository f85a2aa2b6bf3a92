//! One model instance: a backend session behind a dedicated thread, with a fast path that runs
//! short executions directly on the caller's thread when the instance is idle.
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::{Error, NamedTensor, Result};
use tokio::sync::oneshot;

use crate::backend::{Backend, Timings};

/// A finished execution with its phase timings and time spent waiting.
pub struct Executed {
    pub outputs: Vec<NamedTensor>,
    pub timings: Timings,
    pub queued: Duration,
}

struct Job {
    inputs: Vec<NamedTensor>,
    outputs: Vec<String>,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Executed>>,
}

/// Decides whether an execution may run on the caller's (async) thread: only when recent
/// executions were short, so a slow model never stalls the network runtime. Sans-IO.
#[derive(Debug)]
pub struct InlinePolicy {
    /// Moving average of execution time in ns; starts at "unknown" (u64::MAX) until measured.
    average_ns: AtomicU64,
    limit_ns: u64,
}

impl InlinePolicy {
    /// Executions averaging under this run inline; a thread hand-off costs tens of µs on small VMs.
    pub const DEFAULT_LIMIT: Duration = Duration::from_micros(200);

    pub fn new(limit: Duration) -> Self {
        InlinePolicy {
            average_ns: AtomicU64::new(u64::MAX),
            limit_ns: limit.as_nanos() as u64,
        }
    }

    pub fn allows_inline(&self) -> bool {
        self.average_ns.load(Ordering::Relaxed) < self.limit_ns
    }

    /// Folds one measured execution time into the average (weight 1/8; the first sets it).
    pub fn record(&self, took: Duration) {
        let took = took.as_nanos().min(u64::MAX as u128 / 2) as u64;
        let old = self.average_ns.load(Ordering::Relaxed);
        let new = if old == u64::MAX {
            took
        } else {
            old - old / 8 + took / 8
        };
        self.average_ns.store(new, Ordering::Relaxed);
    }
}

type Shared = Arc<Mutex<Box<dyn Backend>>>;

/// Handle to an instance; dropping it lets the thread finish its queue and exit.
pub struct InstanceHandle {
    tx: mpsc::Sender<Job>,
    backend: Shared,
    policy: Arc<InlinePolicy>,
    label: String,
}

fn run(
    label: &str,
    backend: &mut dyn Backend,
    policy: &InlinePolicy,
    job: (&[NamedTensor], &[String]),
    queued: Duration,
) -> Result<Executed> {
    let start = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| backend.execute(job.0, job.1)));
    policy.record(start.elapsed());
    match result {
        Ok(r) => r.map(|(outputs, timings)| Executed {
            outputs,
            timings,
            queued,
        }),
        Err(_) => {
            tracing::error!(instance = %label, "backend panicked while executing a request");
            Err(Error::internal(format!(
                "instance {label} failed while executing the request"
            )))
        }
    }
}

impl InstanceHandle {
    /// Starts the instance thread that owns `backend`.
    pub fn spawn(label: String, backend: Box<dyn Backend>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let backend: Shared = Arc::new(Mutex::new(backend));
        let policy = Arc::new(InlinePolicy::new(InlinePolicy::DEFAULT_LIMIT));
        let (shared, thread_policy, name) = (backend.clone(), policy.clone(), label.clone());
        std::thread::Builder::new()
            .name(label.clone())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let queued = job.enqueued.elapsed();
                    let mut b = shared.lock().unwrap_or_else(|p| p.into_inner());
                    let r = run(
                        &name,
                        &mut **b,
                        &thread_policy,
                        (&job.inputs, &job.outputs),
                        queued,
                    );
                    let _ = job.reply.send(r);
                }
            })?;
        Ok(InstanceHandle {
            tx,
            backend,
            policy,
            label,
        })
    }

    /// Runs a request on this instance: inline when it is idle and fast, else on its thread.
    pub async fn execute(
        &self,
        inputs: Vec<NamedTensor>,
        outputs: Vec<String>,
    ) -> Result<Executed> {
        if self.policy.allows_inline() {
            if let Ok(mut b) = self.backend.try_lock() {
                return run(
                    &self.label,
                    &mut **b,
                    &self.policy,
                    (&inputs, &outputs),
                    Duration::ZERO,
                );
            }
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job {
                inputs,
                outputs,
                enqueued: Instant::now(),
                reply,
            })
            .map_err(|_| Error::unavailable("the model instance has stopped"))?;
        rx.await
            .map_err(|_| Error::unavailable("the model instance stopped before answering"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_only_after_short_measurements() {
        let p = InlinePolicy::new(Duration::from_micros(200));
        assert!(!p.allows_inline(), "unknown cost must not run inline");
        p.record(Duration::from_micros(20));
        assert!(p.allows_inline());
        for _ in 0..40 {
            p.record(Duration::from_millis(50));
        }
        assert!(
            !p.allows_inline(),
            "a model that became slow moves to its thread"
        );
        for _ in 0..200 {
            p.record(Duration::from_micros(10));
        }
        assert!(p.allows_inline());
    }

    #[test]
    fn first_slow_measurement_keeps_it_off_the_runtime() {
        let p = InlinePolicy::new(Duration::from_micros(200));
        p.record(Duration::from_millis(80));
        assert!(!p.allows_inline());
    }
}
