//! The executor thread of a model with dynamic batching: the requests sent to it wait in the
//! instance's batcher (sans-IO, `batching`), and the thread that runs each batch also decides it, so
//! a batched request crosses no more threads than an unbatched one. Under load the thread takes
//! what arrived while a batch ran and decides the next batch without sleeping in between.
use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use mesh::Error;

use super::batching::{BatchConfig, BatchRequest, Batcher, RejectReason, TIMED_OUT_MESSAGE};
use super::executor::{precise_timers, run_batch, ExecMsg, Executor, Job};
use super::supervision::Health;

/// The batcher's queue and the jobs it names, by id.
pub(crate) struct Queue {
    label: String,
    batcher: Batcher<u64>,
    jobs: HashMap<u64, Job>,
    health: Arc<Health>,
}

impl Queue {
    pub(crate) fn new(label: &str, config: BatchConfig, health: Arc<Health>) -> Self {
        Queue {
            label: label.to_string(),
            batcher: Batcher::new(config),
            jobs: HashMap::new(),
            health,
        }
    }

    /// Queues a request, or answers it at once when the batcher refuses it (a full queue is
    /// UNAVAILABLE, anything else INVALID_ARG).
    pub(crate) fn submit(&mut self, job: Job, id: u64, shape_key: u64) {
        let req = BatchRequest {
            id,
            batch_size: job.sub.rows,
            shape_key,
            priority: job.sub.priority,
            timeout: job.sub.timeout,
        };
        match self.batcher.enqueue(req, job.enqueued) {
            Ok(()) => {
                self.jobs.insert(id, job);
            }
            Err(rejected) => {
                let e = match rejected.reason {
                    RejectReason::QueueFull { .. } => {
                        Error::overloaded(format!("request rejected: {}", rejected.reason))
                    }
                    other => Error::invalid(format!("request rejected: {other}")),
                };
                let _ = job.reply.send(Err(e));
            }
        }
    }

    /// Drops a queued request whose caller went away.
    pub(crate) fn cancel(&mut self, id: u64) {
        if self.batcher.cancel(&id) {
            self.jobs.remove(&id);
            tracing::debug!(instance = %self.label, "cancelled request removed from the queue");
        }
    }

    /// What is due at `now`: requests that timed out are answered, a restarting instance answers
    /// every queued request at once instead of letting it hang, and the next batch is returned
    /// (those of its requests whose clients are still there), with when to look again.
    pub(crate) fn due(&mut self, now: Instant) -> (Vec<Job>, Option<Instant>) {
        if !self.health.is_ready() {
            self.fail_all(&format!("instance {} is restarting", self.label));
            return (Vec::new(), None);
        }
        loop {
            let decision = self.batcher.poll(now, true);
            for id in decision.rejected {
                if let Some(job) = self.jobs.remove(&id) {
                    let _ = job.reply.send(Err(Error::unavailable(TIMED_OUT_MESSAGE)));
                }
            }
            let Some(ids) = decision.batch else {
                return (Vec::new(), decision.wake_at);
            };
            let jobs: Vec<Job> = ids
                .iter()
                .filter_map(|id| self.jobs.remove(id))
                .filter(|j| !j.reply.is_closed())
                .collect();
            // A batch whose every client went away is dropped; the next may be due already.
            if !jobs.is_empty() {
                return (jobs, decision.wake_at);
            }
        }
    }

    /// Answers every queued request with UNAVAILABLE and `why`.
    pub(crate) fn fail_all(&mut self, why: &str) {
        for (id, job) in self.jobs.drain() {
            self.batcher.cancel(&id);
            let _ = job.reply.send(Err(Error::unavailable(why.to_string())));
        }
    }
}

/// The executor thread of a model with dynamic batching. It ends when every sender of `rx` is gone
/// (the instance's handle), answering what is still queued.
pub(crate) fn batching_loop(label: &str, exec: &Executor, rx: &mpsc::Receiver<ExecMsg>, config: BatchConfig) {
    let _may_block = crate::backend::enter_may_block();
    precise_timers();
    let mut queue = Queue::new(label, config, exec.health.clone());
    let mut wake_at: Option<Instant> = None;
    loop {
        // Sleep until a request comes or the batcher's next deadline.
        let first = match wake_at {
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            },
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
        };
        for msg in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            take(label, exec, &mut queue, msg);
        }
        wake_at = run_due(label, exec, &mut queue, rx);
    }
    queue.fail_all(&format!("instance {label} is shutting down"));
}

/// Runs every batch that is due, taking what arrives while each runs before deciding the next
/// (a burst forms one batch); returns when to look again. With the rate limiter on, each batch
/// waits for its turn, and a turn ends asking for the next one when another batch is due.
fn run_due(label: &str, exec: &Executor, queue: &mut Queue, rx: &mpsc::Receiver<ExecMsg>) -> Option<Instant> {
    let mut due = queue.due(Instant::now());
    loop {
        let (jobs, wake_at) = due;
        if jobs.is_empty() {
            return wake_at;
        }
        let turn = exec.limit.as_ref().map(|m| m.wait_turn());
        run_batch(label, exec, jobs);
        for msg in std::iter::from_fn(|| rx.try_recv().ok()) {
            take(label, exec, queue, msg);
        }
        due = queue.due(Instant::now());
        if let Some(turn) = turn {
            turn.end(!due.0.is_empty());
        }
    }
}

/// One message to the thread: a request is queued, a cancellation dequeues one.
fn take(label: &str, exec: &Executor, queue: &mut Queue, msg: ExecMsg) {
    match msg {
        ExecMsg::Submit(boxed) => {
            let (job, id, shape_key) = *boxed;
            queue.submit(job, id, shape_key);
        }
        ExecMsg::Cancel(id) => queue.cancel(id),
        // Requests of models without dynamic batching never come here; one that did runs alone.
        ExecMsg::Direct(job) => run_batch(label, exec, vec![job]),
        ExecMsg::Wake => {}
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
