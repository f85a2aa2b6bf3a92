//! What runs an instance's work: requests and their results, the guarded execution (a panic or a dead
//! backend marks the instance failed), batches merged or per request, and the executor thread of a
//! model without dynamic batching (`queue` has the one of a model with it).
use mesh::sync::Locked;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::{Error, NamedTensor, Params, Result};
use metrics::Counter;
use tokio::sync::oneshot;

use crate::actors::instance::batch_io;
use crate::actors::instance::supervision::Health;
use crate::backend::{Backend, PerRequest, RequestView, ResponseSink, Timings};
use crate::serving::traced::TraceHandle;

/// Messages of the instance actor, which owns the executor thread and is its supervision edge; the
/// requests themselves go to the thread (`ExecMsg`).
pub(crate) enum InstanceMsg {
    /// Test-only (`fault-injection`): the actor panics, to show instance actors are restarted.
    #[cfg(feature = "fault-injection")]
    Fault,
}

/// Tells the instance's supervisor that its backend failed (called once per failure).
pub type FailureNotice = Arc<dyn Fn() + Send + Sync>;

/// A finished execution as one request sees it.
pub struct Executed {
    pub outputs: Vec<NamedTensor>,
    pub timings: Timings,
    pub queued: Duration,
    /// Rows of the whole execution this request was part of.
    pub batch_rows: usize,
    /// True for exactly one request per execution, so executions are counted once.
    pub counts_execution: bool,
}

/// What a caller hands an instance.
pub struct Submission {
    pub inputs: Vec<NamedTensor>,
    /// Requested outputs; empty means all.
    pub outputs: Vec<String>,
    pub rows: usize,
    pub priority: u32,
    pub timeout: Option<Duration>,
    /// The request id and parameters, for backends that see requests (Python).
    pub id: String,
    pub parameters: Params,
    /// The request's trace when it is traced: its id (a Python model's `request.trace()`), and
    /// where the instance notes when its compute starts and ends.
    pub trace: Option<TraceHandle>,
    /// Set for decoupled models: where the request's answers stream to.
    pub sink: Option<Box<ResponseSink>>,
}

pub(crate) struct Job {
    pub sub: Submission,
    pub enqueued: Instant,
    pub reply: oneshot::Sender<Result<Executed>>,
}

/// Decides whether an execution may run on the caller's (async) thread: only when recent
/// executions were short, so a slow model never stalls the network runtime. Sans-IO.
#[derive(Debug)]
pub struct InlinePolicy {
    /// Moving average of execution time in ns; u64::MAX until measured.
    average_ns: AtomicU64,
    limit_ns: u64,
}

impl InlinePolicy {
    /// Executions averaging under this run inline; a thread hand-off costs tens of µs on small VMs.
    pub const DEFAULT_LIMIT: Duration = Duration::from_micros(200);
    /// The limit for backends that wait on another process (Python) on a runtime worker: their
    /// executions include the other process's wake-up, and a worker stays free meanwhile.
    pub const WAIT_LIMIT: Duration = Duration::from_millis(2);

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

pub(crate) type Shared = Arc<Mutex<Box<dyn Backend>>>;

/// Tells whether a request's client went away.
type Probe<'a> = &'a (dyn Fn() -> bool + Sync);

/// The requests of a batch as backends that take them one by one see them, with a probe each for
/// whether its client went away (none on the inline path, whose caller is the client's task).
fn views<'a>(subs: &[&'a Submission], probes: &[Option<Probe<'a>>]) -> Vec<RequestView<'a>> {
    subs.iter()
        .enumerate()
        .map(|(i, s)| RequestView {
            inputs: &s.inputs,
            outputs: &s.outputs,
            id: &s.id,
            parameters: &s.parameters,
            trace: s.trace.as_ref().map(TraceHandle::id),
            sink: s.sink.as_deref(),
            cancelled: probes.get(i).copied().flatten(),
        })
        .collect()
}

/// Runs merged tensors for the whole batch and splits the outputs back per request (ragged
/// models through their `Ragged`, even for one request).
fn run_merged(
    label: &str,
    exec: &Executor,
    backend: &mut dyn Backend,
    subs: &[&Submission],
) -> Result<(PerRequest, Timings)> {
    let rows: Vec<usize> = subs.iter().map(|s| s.rows).collect();
    let wanted: Vec<String> = if subs.iter().any(|s| s.outputs.is_empty()) {
        Vec::new()
    } else {
        let mut all: Vec<String> = subs.iter().flat_map(|s| s.outputs.iter().cloned()).collect();
        all.sort_unstable();
        all.dedup();
        all
    };
    let inputs: Vec<&[NamedTensor]> = subs.iter().map(|s| &s.inputs[..]).collect();
    let (parts, timings) = if let Some(ragged) = &exec.ragged {
        let merged = ragged.merge(&inputs)?;
        let (outputs, timings) = exec.run(label, backend, &merged, &wanted)?;
        (ragged.split(outputs, &inputs, &rows)?, timings)
    } else if subs.len() == 1 {
        let (outputs, timings) = exec.run(label, backend, &subs[0].inputs, &wanted)?;
        (vec![outputs], timings)
    } else {
        let merged = batch_io::merge(&inputs)?;
        let (outputs, timings) = exec.run(label, backend, &merged, &wanted)?;
        (batch_io::split(outputs, &rows)?, timings)
    };
    Ok((parts.into_iter().map(Ok).collect(), timings))
}

/// Runs one batch on the backend and answers every request in it.
pub(crate) fn run_batch(label: &str, exec: &Executor, jobs: Vec<Job>) {
    let started = Instant::now();
    for job in &jobs {
        compute_started(&job.sub, started);
    }
    let total: usize = jobs.iter().map(|j| j.sub.rows).sum();
    let result = {
        let mut b = exec.backend.locked();
        let subs: Vec<&Submission> = jobs.iter().map(|j| &j.sub).collect();
        if b.takes_requests() {
            let closed: Vec<_> = jobs.iter().map(|j| move || j.reply.is_closed()).collect();
            let probes: Vec<Option<Probe<'_>>> = closed.iter().map(|c| Some(c as Probe<'_>)).collect();
            exec.run_requests(label, &mut **b, &views(&subs, &probes))
        } else {
            run_merged(label, exec, &mut **b, &subs)
        }
    };
    let ended = Instant::now();
    let timings = result.as_ref().map_or(Timings::default(), |r| r.1);
    for job in &jobs {
        compute_ended(&job.sub, &timings, ended);
    }
    match result {
        Ok((parts, timings)) => {
            for (i, (job, outs)) in jobs.into_iter().zip(parts).enumerate() {
                let answer = outs.map(|mut outs| {
                    if !job.sub.outputs.is_empty() {
                        outs.retain(|o| job.sub.outputs.contains(&o.name));
                    }
                    Executed {
                        outputs: outs,
                        timings,
                        queued: started.saturating_duration_since(job.enqueued),
                        batch_rows: total,
                        counts_execution: i == 0,
                    }
                });
                let _ = job.reply.send(answer);
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

/// A traced request's compute starts: the backend gets it (its trace notes it, see `serving::traced`).
fn compute_started(sub: &Submission, at: Instant) {
    if let Some(trace) = &sub.trace {
        trace.compute_started(at);
    }
}

/// A traced request's compute ended, whether or not its caller still waits.
fn compute_ended(sub: &Submission, timings: &Timings, at: Instant) {
    if let Some(trace) = &sub.trace {
        trace.compute_ended(timings, at);
    }
}

/// At most this many requests of a model without dynamic batching travel to a backend that takes
/// them together (`Backend::groups_executions`), with at most this many input bytes: grouping saves
/// the wake-ups of small requests; large ones gain nothing from it.
pub(crate) const GROUP_MAX: usize = 8;
pub(crate) const GROUP_MAX_BYTES: usize = 1 << 20;

/// Whether a request with `bytes` of inputs joins a group of `count` requests holding `held` bytes. Sans-IO.
pub(crate) fn joins_group(count: usize, held: usize, bytes: usize) -> bool {
    count < GROUP_MAX && held.saturating_add(bytes) <= GROUP_MAX_BYTES
}

fn input_bytes(sub: &Submission) -> usize {
    sub.inputs.iter().map(|t| t.tensor.data.len()).sum()
}

/// Takes the requests queued behind `first` that may travel with it (`joins_group`), and the first
/// message that may not (it is handled next).
fn gather(first: Job, rx: &mpsc::Receiver<ExecMsg>) -> (Vec<Job>, Option<ExecMsg>) {
    let mut held = input_bytes(&first.sub);
    let mut jobs = vec![first];
    while jobs.len() < GROUP_MAX {
        match rx.try_recv() {
            // A request whose client went away is dropped here, as the Direct path drops it.
            Ok(ExecMsg::Direct(job)) if job.reply.is_closed() => {}
            Ok(ExecMsg::Direct(job)) => {
                let bytes = input_bytes(&job.sub);
                if !joins_group(jobs.len(), held, bytes) {
                    return (jobs, Some(ExecMsg::Direct(job)));
                }
                held += bytes;
                jobs.push(job);
            }
            Ok(other) => return (jobs, Some(other)),
            Err(_) => break,
        }
    }
    (jobs, None)
}

/// Runs requests of a model without dynamic batching, each as an execution of its own, in one
/// exchange with the backend (`Backend::execute_each`), and answers each request as soon as its
/// answer is ready (an early request does not wait for the group).
fn run_each(label: &str, exec: &Executor, jobs: Vec<Job>) {
    let started = Instant::now();
    let count = jobs.len();
    let mut subs = Vec::with_capacity(count);
    let mut waiting = Vec::with_capacity(count);
    for job in jobs {
        compute_started(&job.sub, started);
        subs.push(job.sub);
        waiting.push(Some((job.reply, job.enqueued)));
    }
    // Taken once per request: by its answer, or by the error that ends the exchange.
    let waiting = Mutex::new(waiting);
    let mut last = started;
    let result = {
        let mut b = exec.backend.locked();
        let refs: Vec<&Submission> = subs.iter().collect();
        let closed: Vec<_> = (0..count)
            .map(|i| {
                let waiting = &waiting;
                move || waiting.locked()[i].as_ref().is_none_or(|(reply, _)| reply.is_closed())
            })
            .collect();
        let probes: Vec<Option<Probe<'_>>> = closed.iter().map(|c| Some(c as Probe<'_>)).collect();
        let mut deliver = |i: usize, outs: Result<Vec<NamedTensor>>| {
            let now = Instant::now();
            // Each request's execution ran from the previous answer to its own.
            let took = now.saturating_duration_since(last);
            last = now;
            let Some((reply, enqueued)) = waiting.locked().get_mut(i).and_then(Option::take) else {
                return;
            };
            let sub = &subs[i];
            compute_ended(sub, &Timings::default(), now);
            let answer = outs.map(|mut outs| {
                if !sub.outputs.is_empty() {
                    outs.retain(|o| sub.outputs.contains(&o.name));
                }
                Executed {
                    outputs: outs,
                    timings: Timings {
                        infer: took,
                        ..Timings::default()
                    },
                    queued: started.saturating_duration_since(enqueued),
                    batch_rows: sub.rows,
                    counts_execution: true,
                }
            });
            let _ = reply.send(answer);
        };
        exec.guarded(label, &mut **b, |b| {
            b.execute_each(&views(&refs, &probes), &mut deliver)
        })
    };
    // `guarded` counted one execution; each request had its own.
    exec.executions.increment(count.saturating_sub(1) as u64);
    if count > 1 {
        exec.grouped.increment(count as u64);
    }
    let unanswered = waiting.into_inner().unwrap_or_else(|e| e.into_inner());
    let error = result
        .err()
        .unwrap_or_else(|| Error::internal("the backend gave no response"));
    let ended = Instant::now();
    for (i, unanswered) in unanswered.into_iter().enumerate() {
        if let Some((reply, _)) = unanswered {
            compute_ended(&subs[i], &Timings::default(), ended);
            let _ = reply.send(Err(error.clone()));
        }
    }
}

/// An instance's backend and what every execution updates; shared by the executor thread and the inline path.
pub(crate) struct Executor {
    pub backend: Shared,
    pub policy: Arc<InlinePolicy>,
    pub executions: Counter,
    /// Requests that travelled to the backend with others (`run_each`).
    pub grouped: Counter,
    /// Requests run on their caller's thread instead of the executor thread (the inline path).
    pub inline: Counter,
    pub health: Arc<Health>,
    pub on_failure: FailureNotice,
    /// Set for models with ragged inputs, batch inputs or batch outputs.
    pub ragged: Option<Arc<crate::actors::instance::ragged::Ragged>>,
    /// Set when the node's rate limiter decides when this instance runs.
    pub limit: Option<Arc<crate::actors::instance::rate_limit::Enrolled>>,
    /// Test-only (`fault-injection`): a request of this many rows makes the instance's actor panic
    /// (model parameter `mesh_fault_panic_actor_on_rows`).
    #[cfg(feature = "fault-injection")]
    pub fault_rows: Option<usize>,
}

impl Executor {
    /// Runs `f` on the backend once, guarded: a panic, or a backend that reports itself dead (a
    /// Python stub that exited or hung), marks the instance failed (routing skips it and its
    /// supervisor rebuilds it); a panic answers the callers UNAVAILABLE.
    fn guarded<T>(
        &self,
        label: &str,
        backend: &mut dyn Backend,
        f: impl FnOnce(&mut dyn Backend) -> Result<T>,
    ) -> Result<T> {
        let t = Instant::now();
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut *backend)));
        self.policy.record(t.elapsed());
        self.executions.increment(1);
        let healthy = run.is_ok() && backend.healthy();
        if !healthy && self.health.mark_failed() {
            (self.on_failure)();
        }
        run.unwrap_or_else(|_| {
            tracing::error!(instance = %label, "backend panicked while executing");
            Err(Error::unavailable(format!(
                "instance {label} failed while executing the request; it is restarting"
            )))
        })
    }

    /// Runs merged inputs once.
    pub(crate) fn run(
        &self,
        label: &str,
        backend: &mut dyn Backend,
        inputs: &[NamedTensor],
        outputs: &[String],
    ) -> Result<(Vec<NamedTensor>, Timings)> {
        self.guarded(label, backend, |b| b.execute(inputs, outputs))
    }

    /// Runs a batch as separate requests once.
    pub(crate) fn run_requests(
        &self,
        label: &str,
        backend: &mut dyn Backend,
        requests: &[RequestView<'_>],
    ) -> Result<(PerRequest, Timings)> {
        self.guarded(label, backend, |b| b.execute_requests(requests))
    }

    /// Runs one submission on the caller's thread (the inline path).
    pub(crate) fn run_one(
        &self,
        label: &str,
        backend: &mut dyn Backend,
        sub: &Submission,
    ) -> Result<(Vec<NamedTensor>, Timings)> {
        let (mut results, timings) = match (backend.takes_requests(), &self.ragged) {
            (true, _) => self.run_requests(label, backend, &views(&[sub], &[]))?,
            (false, None) => return self.run(label, backend, &sub.inputs, &sub.outputs),
            (false, Some(_)) => run_merged(label, self, backend, &[sub])?,
        };
        let outputs = results
            .pop()
            .unwrap_or_else(|| Err(Error::internal("the backend gave no response")))?;
        Ok((outputs, timings))
    }
}

/// Work for the executor thread, sent by the instance's handle.
pub(crate) enum ExecMsg {
    /// A request of a model with dynamic batching, with its id and shape key: it waits in the
    /// thread's batcher until a batch takes it (`queue`).
    Submit(Box<(Job, u64, u64)>),
    /// The caller of a submitted request went away: drop it if it is still queued.
    Cancel(u64),
    /// A request of a model without dynamic batching: its queue is this channel (FIFO).
    Direct(Job),
    /// Look at the instance's health and queue again (its backend was installed again).
    Wake,
}

/// The executor thread of a model without dynamic batching: runs each request as it comes (those
/// that queued while it was busy together, for a backend that groups them). It ends when every
/// sender of `rx` is gone.
pub(crate) fn executor_loop(label: &str, exec: &Executor, rx: &mpsc::Receiver<ExecMsg>) {
    let _may_block = crate::backend::enter_may_block();
    precise_timers();
    // A rate-limited instance asks for a turn per request, so its requests never travel together.
    let groups = exec.limit.is_none() && exec.backend.locked().groups_executions();
    let mut next: Option<ExecMsg> = None;
    loop {
        let msg = match next.take() {
            Some(m) => Some(m),
            None => rx.recv().ok(),
        };
        match msg {
            None => return,
            Some(ExecMsg::Wake | ExecMsg::Cancel(_)) => {}
            // Models with dynamic batching run on `queue::batching_loop`; one that came here runs alone.
            Some(ExecMsg::Submit(boxed)) => run_batch(label, exec, vec![boxed.0]),
            Some(ExecMsg::Direct(job)) => {
                let runs = exec.health.is_ready() && !job.reply.is_closed();
                if !runs {
                    // A turn asked for this job as the last one ended is given up.
                    if let Some(m) = &exec.limit {
                        m.withdraw();
                    }
                }
                if !exec.health.is_ready() {
                    let _ = job
                        .reply
                        .send(Err(Error::unavailable(format!("instance {label} is restarting"))));
                } else if runs && groups {
                    // Requests that queued while the instance was busy travel together.
                    let (jobs, after) = gather(job, rx);
                    next = after;
                    if jobs.len() == 1 {
                        run_batch(label, exec, jobs);
                    } else {
                        run_each(label, exec, jobs);
                    }
                } else if runs {
                    let turn = exec.limit.as_ref().map(|m| m.wait_turn());
                    run_batch(label, exec, vec![job]);
                    if let Some(turn) = turn {
                        next = rx.try_recv().ok();
                        turn.end(matches!(next, Some(ExecMsg::Direct(_))));
                    }
                }
            }
        }
    }
}

/// Makes the calling thread's timed waits end when asked: Linux lets a timer fire up to the
/// thread's timer slack late (50 µs by default), which a batch's deadline would add to every
/// batched request's latency. The executor thread waits for deadlines, so its slack is 1 ns.
pub(crate) fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only the calling thread's slack.
    let set = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if set != 0 {
        tracing::debug!(
            "cannot set the executor thread's timer slack: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// An executor of `backend` with no metrics, limits or supervisor, for tests.
#[cfg(test)]
pub(crate) fn test_executor(backend: Box<dyn Backend>) -> Executor {
    Executor {
        backend: Arc::new(Mutex::new(backend)),
        policy: Arc::new(InlinePolicy::new(InlinePolicy::DEFAULT_LIMIT)),
        executions: Counter::noop(),
        grouped: Counter::noop(),
        inline: Counter::noop(),
        health: Arc::new(Health::new(&[])),
        on_failure: Arc::new(|| {}),
        ragged: None,
        limit: None,
        #[cfg(feature = "fault-injection")]
        fault_rows: None,
    }
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
