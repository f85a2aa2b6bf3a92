//! One model instance: a ractor actor that owns the instance's batcher, and an executor thread that owns
//! its backend session. Short executions of unbatched models run inline when the instance is idle.
//! A failed backend is reported to the model's supervisor, which rebuilds it and `install`s it.
pub mod batch_io;
pub mod batching;
pub mod executor;
pub mod ragged;
pub mod rate_limit;
pub mod supervision;
pub mod waits;

use mesh::sync::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::{Error, Result};
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::backend::Backend;
use batching::{BatchConfig, BatchRequest, Batcher, RejectReason, TIMED_OUT_MESSAGE};
use executor::{executor_loop, ExecMsg, Executor, InstanceMsg, Job, PRECISE_WAKE_BELOW};
pub use executor::{Executed, FailureNotice, InlinePolicy, Submission};
use supervision::{BackendFactory, Health};

struct InstanceActor;

struct InstanceArgs {
    label: String,
    exec: Arc<Executor>,
    /// The executor thread's channel, made by the handle (which keeps a sender for the direct path).
    channel: (mpsc::Sender<ExecMsg>, mpsc::Receiver<ExecMsg>),
    config: BatchConfig,
    #[cfg(feature = "fault-injection")]
    panic_on_rows: Option<usize>,
}

struct InstanceState {
    label: String,
    health: Arc<Health>,
    batcher: Batcher<u64>,
    jobs: HashMap<u64, Job>,
    busy: bool,
    exec: Option<mpsc::Sender<ExecMsg>>,
    wake_at: Option<Instant>,
    /// The rate limiter decides when this instance runs: its executor waits for an answer to Done.
    limited: bool,
    #[cfg(feature = "fault-injection")]
    panic_on_rows: Option<usize>,
}

impl InstanceState {
    /// Feeds the clock to the batcher and carries out what it decides.
    fn drive(&mut self, myself: &ActorRef<InstanceMsg>) {
        if !self.health.is_ready() {
            // A restarting instance answers at once instead of letting requests hang.
            for (id, job) in self.jobs.drain() {
                self.batcher.cancel(&id);
                let _ = job.reply.send(Err(Error::unavailable(format!(
                    "instance {} is restarting",
                    self.label
                ))));
            }
            return;
        }
        let now = Instant::now();
        let decision = self.batcher.poll(now, !self.busy);
        for id in decision.rejected {
            if let Some(job) = self.jobs.remove(&id) {
                let _ = job.reply.send(Err(Error::unavailable(TIMED_OUT_MESSAGE)));
            }
        }
        if let Some(ids) = decision.batch {
            // Requests whose client went away are dropped here instead of being executed.
            let jobs: Vec<Job> = ids
                .iter()
                .filter_map(|id| self.jobs.remove(id))
                .filter(|j| !j.reply.is_closed())
                .collect();
            if !jobs.is_empty() {
                match &self.exec {
                    Some(tx) if tx.send(ExecMsg::Batch(jobs)).is_ok() => self.busy = true,
                    _ => tracing::error!(instance = %self.label, "executor thread is gone"),
                }
            } else if !self.batcher.is_empty() {
                let _ = myself.cast(InstanceMsg::Wake);
            }
        }
        if let Some(at) = decision.wake_at {
            if self.wake_at.is_none_or(|w| at < w || w <= now) {
                self.wake_at = Some(at);
                let wait = at.saturating_duration_since(now);
                let precise = wait < PRECISE_WAKE_BELOW
                    && self
                        .exec
                        .as_ref()
                        .is_some_and(|tx| tx.send(ExecMsg::WakeAt(at)).is_ok());
                if !precise {
                    myself.send_after(wait, || InstanceMsg::Wake);
                }
            }
        }
    }
}

impl Actor for InstanceActor {
    type Msg = InstanceMsg;
    type State = InstanceState;
    type Arguments = InstanceArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<InstanceMsg>,
        args: InstanceArgs,
    ) -> Result<InstanceState, ActorProcessingErr> {
        let (tx, rx) = args.channel;
        let label = args.label.clone();
        let exec = args.exec.clone();
        let me = myself.clone();
        std::thread::Builder::new()
            .name(args.label.clone())
            .spawn(move || executor_loop(&label, &exec, &rx, &me))?;
        Ok(InstanceState {
            label: args.label,
            health: args.exec.health.clone(),
            batcher: Batcher::new(args.config),
            jobs: HashMap::new(),
            busy: false,
            exec: Some(tx),
            wake_at: None,
            limited: args.exec.limit.is_some(),
            #[cfg(feature = "fault-injection")]
            panic_on_rows: args.panic_on_rows,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<InstanceMsg>,
        msg: InstanceMsg,
        state: &mut InstanceState,
    ) -> Result<(), ActorProcessingErr> {
        let done = matches!(msg, InstanceMsg::Done);
        match msg {
            InstanceMsg::Submit(boxed) => {
                let (job, id, shape_key) = *boxed;
                #[cfg(feature = "fault-injection")]
                if state.panic_on_rows == Some(job.sub.rows) {
                    panic!("fault injection: instance actor got a request of {} rows", job.sub.rows);
                }
                let req = BatchRequest {
                    id,
                    batch_size: job.sub.rows,
                    shape_key,
                    priority: job.sub.priority,
                    timeout: job.sub.timeout,
                };
                match state.batcher.enqueue(req, job.enqueued) {
                    Ok(()) => {
                        state.jobs.insert(id, job);
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
            InstanceMsg::Cancel(id) => {
                if state.batcher.cancel(&id) {
                    state.jobs.remove(&id);
                    tracing::debug!(instance = %state.label, "cancelled request removed from the queue");
                }
            }
            InstanceMsg::Wake => state.wake_at = None,
            InstanceMsg::Done => state.busy = false,
        }
        state.drive(&myself);
        if done && !state.busy && state.limited {
            // A rate-limited executor waits for this answer before it ends its turn.
            if let Some(tx) = &state.exec {
                let _ = tx.send(ExecMsg::Idle);
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<InstanceMsg>, state: &mut InstanceState) -> Result<(), ActorProcessingErr> {
        state.exec = None;
        for (_, job) in state.jobs.drain() {
            let _ = job.reply.send(Err(Error::unavailable(format!(
                "instance {} is shutting down",
                state.label
            ))));
        }
        Ok(())
    }
}

/// When the inline fast path may be taken (see `InstanceHandle::inline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inline {
    WhenIdle,
    WhenAlone,
    Never,
}

/// Handle to a running instance; dropping it stops the actor, and the executor thread after its batch.
pub struct InstanceHandle {
    actor: ActorRef<InstanceMsg>,
    exec: Arc<Executor>,
    /// When a short request may run directly on an idle instance: always without dynamic batching
    /// (its batcher would run each request alone), and with zero-delay batching only when nothing
    /// else is outstanding (else the batcher could have merged it).
    inline: Inline,
    /// For backends that block on another process (Python): inline from an executor thread (a BLS
    /// call), and on an async runtime worker only as `wait_inline` allows.
    inline_off_runtime_only: bool,
    /// Such a backend may run a request that finds its instance idle on an async runtime worker,
    /// holding one of the node's `waits::runtime_slots` (one worker always stays free): the hand-off
    /// to the executor thread and back would cost two of the request's four wake-ups.
    wait_inline: bool,
    outstanding: AtomicUsize,
    next_id: AtomicU64,
    /// For models without dynamic batching: the executor thread's channel, bypassing the actor.
    direct: Option<mpsc::Sender<ExecMsg>>,
    pub label: String,
    /// Rebuilds this instance's backend (same file, config and device).
    pub factory: BackendFactory,
}

/// Everything needed to start one instance.
pub struct InstanceSpec {
    /// `<instance name>_v<version>`, as logs and metrics show it.
    pub label: String,
    pub model: String,
    pub version: i64,
    pub batch: BatchConfig,
    pub factory: BackendFactory,
    pub on_failure: FailureNotice,
    /// Ragged inputs, batch inputs and batch outputs of the model, if it has any.
    pub ragged: Option<Arc<ragged::Ragged>>,
    /// Its place in the node's rate limiter; None when nothing limits it.
    pub limit: Option<Arc<rate_limit::Enrolled>>,
    /// Test-only (`fault-injection`): the actor itself panics on a request of this many rows
    /// (model parameter `mesh_fault_panic_actor_on_rows`), to show instance actors are restarted.
    #[cfg(feature = "fault-injection")]
    pub panic_actor_on_rows: Option<usize>,
}

impl InstanceHandle {
    /// Starts the instance actor (linked to `supervisor`, if given) and its executor thread.
    pub async fn spawn(spec: InstanceSpec, supervisor: Option<ActorCell>) -> Result<Self, String> {
        let InstanceSpec {
            label,
            model,
            version,
            batch: config,
            factory,
            on_failure,
            ragged,
            limit,
            #[cfg(feature = "fault-injection")]
            panic_actor_on_rows,
        } = spec;
        let metric_labels = [
            ("model", model),
            ("version", version.to_string()),
            ("instance", label.clone()),
        ];
        let backend = supervision::build(&factory)?;
        let inline_off_runtime_only = !backend.may_run_inline();
        let wait_inline = inline_off_runtime_only && backend.may_wait_inline();
        let inline_limit = backend.inline_limit().unwrap_or(if inline_off_runtime_only {
            InlinePolicy::WAIT_LIMIT
        } else {
            InlinePolicy::DEFAULT_LIMIT
        });
        let exec = Arc::new(Executor {
            backend: Arc::new(Mutex::new(backend)),
            policy: Arc::new(InlinePolicy::new(inline_limit)),
            executions: metrics::counter!("mesh_instance_executions_total", &metric_labels),
            grouped: metrics::counter!("mesh_instance_grouped_requests_total", &metric_labels),
            inline: metrics::counter!("mesh_instance_inline_executions_total", &metric_labels),
            health: Arc::new(Health::new(&metric_labels)),
            on_failure,
            ragged,
            limit,
        });
        let inline = match (config.dynamic, config.max_queue_delay.is_zero()) {
            // Triton's test hook holds every request in the batcher until its count is queued.
            _ if config.hold > 0 => Inline::Never,
            (false, _) => Inline::WhenIdle,
            (true, true) => Inline::WhenAlone,
            (true, false) => Inline::Never,
        };
        let (tx, rx) = mpsc::channel::<ExecMsg>();
        let direct = (!config.dynamic).then(|| tx.clone());
        let args = InstanceArgs {
            label: label.clone(),
            exec: exec.clone(),
            channel: (tx, rx),
            config,
            #[cfg(feature = "fault-injection")]
            panic_on_rows: panic_actor_on_rows,
        };
        let spawned = match supervisor {
            Some(sup) => Actor::spawn_linked(None, InstanceActor, args, sup).await,
            None => Actor::spawn(None, InstanceActor, args).await,
        };
        let (actor, _) = spawned.map_err(|e| format!("cannot start instance {label}: {e}"))?;
        let outstanding = AtomicUsize::new(0);
        Ok(InstanceHandle {
            actor,
            exec,
            inline,
            inline_off_runtime_only,
            wait_inline,
            outstanding,
            next_id: AtomicU64::new(0),
            direct,
            label,
            factory,
        })
    }

    /// Its place in the node's rate limiter, for an instance started again in its stead.
    pub fn rate_limit(&self) -> Option<Arc<rate_limit::Enrolled>> {
        self.exec.limit.clone()
    }

    /// Puts a rebuilt backend in place and routes to the instance again.
    pub fn install(&self, backend: Box<dyn Backend>) {
        *self.exec.backend.locked() = backend;
        self.exec.health.mark_restarted();
        let _ = self.actor.cast(InstanceMsg::Wake);
    }

    /// Marks the instance not ready (its actor died), so routing prefers its siblings until it is replaced.
    pub fn take_out_of_routing(&self) {
        self.exec.health.mark_failed();
    }

    /// The instance actor's id, to match supervision events.
    pub fn actor_id(&self) -> ActorId {
        self.actor.get_id()
    }

    /// Detaches the instance actor from its supervisor, so stopping the supervisor leaves it to
    /// finish the work it holds.
    pub fn detach_from(&self, supervisor: &ActorCell) {
        self.actor.get_cell().unlink(supervisor.clone());
    }

    /// Whether the instance can take work (false while it restarts).
    pub fn is_ready(&self) -> bool {
        self.exec.health.is_ready()
    }

    /// Requests queued or running on this instance, for least-outstanding-work routing.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Runs a request on this instance and waits for its result.
    pub async fn execute(&self, sub: Submission) -> Result<Executed> {
        let alone = self.outstanding.fetch_add(1, Ordering::Relaxed) == 0;
        let _guard = Outstanding(&self.outstanding);
        let may_inline = match self.inline {
            Inline::WhenIdle => true,
            Inline::WhenAlone => alone,
            Inline::Never => false,
        };
        // An executor thread may block, so there the execution time does not matter; on an async
        // runtime worker only short executions do, and those of a backend that waits on another
        // process only alone and while another worker stays free (the slot is held until it ends).
        let mut wait_slot = None;
        let may_inline = may_inline
            && if crate::backend::thread_may_block() {
                true
            } else if !self.exec.policy.allows_inline() {
                false
            } else if !self.inline_off_runtime_only {
                true
            } else {
                if self.wait_inline && alone {
                    wait_slot = waits::runtime_slots().try_take();
                }
                wait_slot.is_some()
            };
        // A rate-limited instance runs inline only when its resources are free now.
        let turn = match &self.exec.limit {
            Some(m) if may_inline => m.try_turn(),
            _ => None,
        };
        let may_inline = may_inline && (self.exec.limit.is_none() || turn.is_some());
        if may_inline && self.exec.health.is_ready() {
            if let Ok(mut b) = self.exec.backend.try_lock() {
                // Read under the lock: a Python model that made a BLS call stops waiting inline.
                if wait_slot.is_none() || b.may_wait_inline() {
                    mesh::queued::fire();
                    self.exec.inline.increment(1);
                    let result = self.exec.run_one(&self.label, &mut **b, &sub);
                    drop(b);
                    drop(turn);
                    drop(wait_slot);
                    if !self.exec.health.is_ready() {
                        // Anything queued meanwhile is answered by the actor instead of waiting.
                        let _ = self.actor.cast(InstanceMsg::Wake);
                    }
                    let (outputs, timings) = result?;
                    return Ok(Executed {
                        outputs,
                        timings,
                        queued: Duration::ZERO,
                        batch_rows: sub.rows,
                        counts_execution: true,
                    });
                }
            }
        }
        drop(turn);
        drop(wait_slot);
        if let Some(tx) = &self.direct {
            let (reply, rx) = oneshot::channel();
            let job = Job {
                sub,
                enqueued: Instant::now(),
                reply,
            };
            tx.send(ExecMsg::Direct(job))
                .map_err(|_| Error::unavailable(format!("instance {} has stopped", self.label)))?;
            mesh::queued::fire();
            return rx
                .await
                .map_err(|_| Error::unavailable(format!("instance {} stopped before answering", self.label)))?;
        }
        let shape_key = batch_io::shape_key(&sub.inputs, |name| {
            self.exec.ragged.as_ref().is_some_and(|r| r.is_ragged(name))
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        let job = Job {
            sub,
            enqueued: Instant::now(),
            reply,
        };
        self.actor
            .cast(InstanceMsg::Submit(Box::new((job, id, shape_key))))
            .map_err(|_| Error::unavailable(format!("instance {} has stopped", self.label)))?;
        // Queued: the actor takes submissions in the order they were cast.
        mesh::queued::fire();
        let mut cancel = CancelOnDrop {
            actor: &self.actor,
            id,
            armed: true,
        };
        let result = rx.await;
        cancel.armed = false;
        result.map_err(|_| Error::unavailable(format!("instance {} stopped before answering", self.label)))?
    }
}

/// Tells the actor to drop a queued job when the caller's future is dropped (client disconnect or cancel).
struct CancelOnDrop<'a> {
    actor: &'a ActorRef<InstanceMsg>,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.actor.cast(InstanceMsg::Cancel(self.id));
        }
    }
}

struct Outstanding<'a>(&'a AtomicUsize);

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for InstanceHandle {
    fn drop(&mut self) {
        self.actor.stop(None);
    }
}

/// Picks a ready instance with the least outstanding work, rotating among ties so idle instances share load.
pub fn pick<'a>(instances: &'a [Arc<InstanceHandle>], rotation: &AtomicUsize) -> Option<&'a InstanceHandle> {
    let n = instances.len();
    let start = rotation.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .map(|i| &*instances[(start + i) % n])
        .min_by_key(|inst| (!inst.is_ready(), inst.outstanding()))
}
