//! One model instance: a ractor actor, its supervision edge, that owns an executor thread, which owns
//! the instance's backend session and, for a model with dynamic batching, its batcher (`queue`): the
//! thread that runs a batch also decides it. Short executions of unbatched models run inline when
//! the instance is idle. A failed backend is reported to the model's supervisor, which rebuilds it
//! and `install`s it.
pub mod batch_io;
pub mod batching;
pub mod executor;
mod queue;
pub mod ragged;
pub mod rate_limit;
pub mod supervision;
pub mod waits;

use mesh::sync::Locked;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::{Error, Result};
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::backend::Backend;
use batching::BatchConfig;
use executor::{executor_loop, ExecMsg, Executor, InstanceMsg, Job};
pub use executor::{Executed, FailureNotice, InlinePolicy, Submission};
use supervision::{BackendFactory, Health};

struct InstanceActor;

struct InstanceArgs {
    label: String,
    exec: Arc<Executor>,
    /// The executor thread's end of the channel the handle sends requests on.
    rx: mpsc::Receiver<ExecMsg>,
    config: BatchConfig,
}

impl Actor for InstanceActor {
    type Msg = InstanceMsg;
    type State = ();
    type Arguments = InstanceArgs;

    /// Starts the executor thread; it ends once the instance's handle (every sender) is gone.
    async fn pre_start(&self, _: ActorRef<InstanceMsg>, args: InstanceArgs) -> Result<(), ActorProcessingErr> {
        let InstanceArgs {
            label,
            exec,
            rx,
            config,
        } = args;
        std::thread::Builder::new().name(label.clone()).spawn(move || {
            if config.dynamic {
                queue::batching_loop(&label, &exec, &rx, config);
            } else {
                executor_loop(&label, &exec, &rx);
            }
        })?;
        Ok(())
    }

    async fn handle(&self, _: ActorRef<InstanceMsg>, msg: InstanceMsg, _: &mut ()) -> Result<(), ActorProcessingErr> {
        match msg {
            #[cfg(feature = "fault-injection")]
            InstanceMsg::Fault => panic!("fault injection: instance actor got a request of the fault's rows"),
        }
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
    /// The executor thread's channel: requests of a model with dynamic batching are submitted to
    /// its batcher, the others run in the order they come.
    tx: mpsc::Sender<ExecMsg>,
    batched: bool,
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
            #[cfg(feature = "fault-injection")]
            fault_rows: panic_actor_on_rows,
        });
        let inline = match (config.dynamic, config.max_queue_delay.is_zero()) {
            // Triton's test hook holds every request in the batcher until its count is queued.
            _ if config.hold > 0 => Inline::Never,
            (false, _) => Inline::WhenIdle,
            (true, true) => Inline::WhenAlone,
            (true, false) => Inline::Never,
        };
        let (tx, rx) = mpsc::channel::<ExecMsg>();
        let batched = config.dynamic;
        let args = InstanceArgs {
            label: label.clone(),
            exec: exec.clone(),
            rx,
            config,
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
            tx,
            batched,
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
        let old = std::mem::replace(&mut *self.exec.backend.locked(), backend);
        self.exec.health.mark_restarted();
        let _ = self.tx.send(ExecMsg::Wake);
        // The failed backend goes on a thread of its own: a Python stub still alive gets its
        // finalize() (up to --exit-timeout-secs), which must hold neither this caller (an async
        // worker) nor the instance's lock.
        let _ = std::thread::Builder::new()
            .name("backend-drop".into())
            .spawn(move || drop(old));
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
        #[cfg(feature = "fault-injection")]
        if self.exec.fault_rows == Some(sub.rows) {
            // Test-only: the instance's actor panics, and this request is never answered by it.
            let _ = self.actor.cast(InstanceMsg::Fault);
            return Err(Error::unavailable(format!(
                "instance {} stopped before answering",
                self.label
            )));
        }
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
                        // Anything queued meanwhile is answered by the executor thread instead of waiting.
                        let _ = self.tx.send(ExecMsg::Wake);
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
        if !self.batched {
            let (reply, rx) = oneshot::channel();
            let job = Job {
                sub,
                enqueued: Instant::now(),
                reply,
            };
            self.tx
                .send(ExecMsg::Direct(job))
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
        self.tx
            .send(ExecMsg::Submit(Box::new((job, id, shape_key))))
            .map_err(|_| Error::unavailable(format!("instance {} has stopped", self.label)))?;
        // Queued: the executor thread takes submissions in the order they were sent.
        mesh::queued::fire();
        let mut cancel = CancelOnDrop {
            tx: &self.tx,
            id,
            armed: true,
        };
        let result = rx.await;
        cancel.armed = false;
        result.map_err(|_| Error::unavailable(format!("instance {} stopped before answering", self.label)))?
    }
}

/// Tells the executor thread to drop a queued job when the caller's future is dropped (client
/// disconnect or cancel).
struct CancelOnDrop<'a> {
    tx: &'a mpsc::Sender<ExecMsg>,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.tx.send(ExecMsg::Cancel(self.id));
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
