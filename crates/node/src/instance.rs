//! One model instance: a dedicated thread that owns a backend session and runs the jobs sent to it.
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
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

/// Handle to an instance thread; dropping it lets the thread finish its queue and exit.
pub struct InstanceHandle {
    tx: mpsc::Sender<Job>,
}

impl InstanceHandle {
    /// Starts the instance thread that owns `backend`.
    pub fn spawn(label: String, mut backend: Box<dyn Backend>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new().name(label.clone()).spawn(move || {
            while let Ok(job) = rx.recv() {
                let queued = job.enqueued.elapsed();
                let run = std::panic::catch_unwind(AssertUnwindSafe(|| backend.execute(&job.inputs, &job.outputs)));
                let result = match run {
                    Ok(r) => r.map(|(outputs, timings)| Executed { outputs, timings, queued }),
                    Err(_) => {
                        tracing::error!(instance = %label, "backend panicked while executing a request");
                        Err(Error::internal(format!("instance {label} failed while executing the request")))
                    }
                };
                let _ = job.reply.send(result);
            }
            tracing::debug!(instance = %label, "instance stopped");
        })?;
        Ok(InstanceHandle { tx })
    }

    /// Queues a request on this instance and waits for its result.
    pub async fn execute(
        &self,
        inputs: Vec<NamedTensor>,
        outputs: Vec<String>,
    ) -> Result<Executed> {
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
