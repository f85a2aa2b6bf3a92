//! Triton's dynamic batching policy as a sans-IO struct: the instance actor feeds it requests and
//! the time, and carries out what it decides (DESIGN.md §3 "Policies are sans-IO").
//!
//! Semantics chosen where Triton's docs leave room:
//! - Batch size is counted as `max(1, batch_size)`, as Triton does; with `max_batch_size` 0 it is ignored.
//! - A request priority of 0 uses `default_priority_level`; when that is 0 or out of range, the lowest
//!   level (`priority_levels`) is used. With `priority_levels` 0 every priority goes to one queue.
//! - As Triton's dynamic batcher (its `GetDynamicBatch`): while the oldest request's delay runs, a
//!   batch of a preferred size goes at once, and so does the largest batch that does not pass the
//!   largest preferred size (`max_batch_size` when none is given) once the next request would pass
//!   it; a candidate that cannot grow (the next request has another shape key or would overflow
//!   `max_batch_size`) or whose delay is over goes whole.
//! - A timeout fires when `now >= arrival + timeout`; timeouts are applied before a batch is formed.
//! - A request delayed by a DELAY timeout still counts towards its level's `max_queue_size`.
//! - Without `dynamic_batching` no request timeouts are applied (Triton's default scheduler has none).
//! - `wake_at` covers time-driven events only; the caller polls again itself when the instance goes idle.
//! - `hold` is Triton's test hook `TRITONSERVER_DELAY_SCHEDULER=N` (its qa suites rely on it): no
//!   batch forms until N requests are queued, once; then the batcher runs as usual. Triton counts its
//!   model's one queue, the mesh each instance's queue (the same for a model with one instance).
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use mesh::proto::model_config::SchedulingChoice;
use mesh::proto::model_queue_policy::TimeoutAction as ProtoTimeoutAction;
use mesh::proto::ModelQueuePolicy;

/// Error text the caller answers a REJECT-timed-out request with.
pub const TIMED_OUT_MESSAGE: &str = "request timed out in the queue";

/// What happens to a request whose queue timeout passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeoutAction {
    /// Answer it with an error (Triton's default).
    #[default]
    Reject,
    /// Move it behind every other queued request and stop timing it.
    Delay,
}

/// One priority level's queue policy, in Rust types; the default (reject, no timeout, unbounded) changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueuePolicy {
    pub timeout_action: TimeoutAction,
    /// `None` when the policy sets no default timeout.
    pub default_timeout: Option<Duration>,
    /// Whether a request's own timeout replaces the default.
    pub allow_timeout_override: bool,
    /// 0 means unbounded.
    pub max_queue_size: usize,
}

impl QueuePolicy {
    /// Converts the protobuf policy so the batcher never touches prost types on the hot path.
    pub fn from_proto(p: &ModelQueuePolicy) -> Self {
        let timeout_action = match ProtoTimeoutAction::try_from(p.timeout_action) {
            Ok(ProtoTimeoutAction::Delay) => TimeoutAction::Delay,
            _ => TimeoutAction::Reject,
        };
        Self {
            timeout_action,
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            max_queue_size: p.max_queue_size as usize,
        }
    }
}

/// Everything the batcher needs from a model's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchConfig {
    /// The model's `max_batch_size`; 0 means the model does not batch.
    pub max_batch_size: usize,
    /// False without `dynamic_batching`: every request is sent alone, at once.
    pub dynamic: bool,
    /// Each in `1..=max_batch_size`; [`Batcher::new`] sorts and dedups them.
    pub preferred_batch_sizes: Vec<usize>,
    pub max_queue_delay: Duration,
    /// Kept for completeness: one batcher per instance sending FIFO batches already returns responses in order.
    pub preserve_ordering: bool,
    /// 0 disables priorities; otherwise levels are 1..=N with 1 the highest.
    pub priority_levels: u32,
    /// Level for requests with priority 0; 0 means the lowest level.
    pub default_priority_level: u32,
    pub default_policy: QueuePolicy,
    /// Per-level overrides of `default_policy`.
    pub level_policies: HashMap<u32, QueuePolicy>,
    /// Triton's test hook: no batch until this many requests are queued (0: none).
    pub hold: usize,
}

impl BatchConfig {
    /// The config of a model without dynamic batching: each request alone, immediately, no limits.
    pub fn unbatched(max_batch_size: usize) -> Self {
        Self {
            max_batch_size,
            dynamic: false,
            preferred_batch_sizes: Vec::new(),
            max_queue_delay: Duration::ZERO,
            preserve_ordering: false,
            priority_levels: 0,
            default_priority_level: 0,
            default_policy: QueuePolicy::default(),
            level_policies: HashMap::new(),
            hold: 0,
        }
    }

    /// Builds the batcher's config from the model's protobuf config, once at load time.
    pub fn from_model_config(cfg: &mesh::config::ModelConfig) -> Self {
        let max_batch_size = cfg.max_batch_size.max(0) as usize;
        let db = match &cfg.scheduling_choice {
            Some(SchedulingChoice::DynamicBatching(db)) => db,
            // Sequences batch with each other (one request of each at a time), after the
            // strategy's delay, towards its preferred sizes.
            Some(SchedulingChoice::SequenceBatching(sb)) if max_batch_size > 0 => {
                let (delay, preferred) = crate::serving::sequence::setup::strategy(sb, max_batch_size);
                return Self {
                    dynamic: true,
                    preferred_batch_sizes: preferred
                        .into_iter()
                        .filter(|&s| s > 0 && s <= max_batch_size)
                        .collect(),
                    max_queue_delay: delay,
                    ..Self::unbatched(max_batch_size)
                };
            }
            _ => return Self::unbatched(max_batch_size),
        };
        let sizes = db.preferred_batch_size.iter().map(|&s| s.max(0) as usize);
        let preferred = sizes.filter(|&s| s > 0 && s <= max_batch_size).collect();
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Self {
            max_batch_size,
            dynamic: true,
            preferred_batch_sizes: preferred,
            max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            priority_levels: clamp(db.priority_levels),
            default_priority_level: clamp(db.default_priority_level),
            default_policy: db
                .default_queue_policy
                .as_ref()
                .map(QueuePolicy::from_proto)
                .unwrap_or_default(),
            level_policies: db
                .priority_queue_policy
                .iter()
                .map(|(&l, p)| (clamp(l), QueuePolicy::from_proto(p)))
                .collect(),
            hold: 0,
        }
    }

    /// Applies Triton's test hook `TRITONSERVER_DELAY_SCHEDULER` (`hold`, read by the caller) to a
    /// model with dynamic batching; sequence batching does not take it (it admits one request of
    /// a sequence at a time, so the count might never be reached).
    pub fn with_hold(mut self, cfg: &mesh::config::ModelConfig, hold: usize) -> Self {
        if matches!(cfg.scheduling_choice, Some(SchedulingChoice::DynamicBatching(_))) && !self.alone() {
            self.hold = hold;
        }
        self
    }

    /// True when requests are never combined, so the batcher skips batch formation.
    fn alone(&self) -> bool {
        !self.dynamic || self.max_batch_size == 0
    }
}

/// A request handed to [`Batcher::enqueue`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest<T> {
    /// Opaque handle the caller uses to find the request again.
    pub id: T,
    /// First dimension of the inputs (>= 1).
    pub batch_size: usize,
    /// Signature of the non-batch shapes and dtypes; only equal keys share a batch.
    pub shape_key: u64,
    /// 0 = use the default level.
    pub priority: u32,
    /// The client's own queue timeout, honoured only when the level allows overrides.
    pub timeout: Option<Duration>,
}

/// Why a request was refused at enqueue time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    QueueFull { level: u32, max_queue_size: usize },
    PriorityOutOfRange { priority: u32, levels: u32 },
    TooLarge { batch_size: usize, max_batch_size: usize },
}

impl fmt::Display for RejectReason {
    /// Renders the reason as the error message the client sees.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::QueueFull { level, max_queue_size } => {
                write!(
                    f,
                    "queue full at priority level {level} (max_queue_size {max_queue_size})"
                )
            }
            Self::PriorityOutOfRange { priority, levels } => {
                write!(f, "priority {priority} is outside 1..={levels}")
            }
            Self::TooLarge {
                batch_size,
                max_batch_size,
            } => {
                write!(f, "batch size {batch_size} exceeds max_batch_size {max_batch_size}")
            }
        }
    }
}

/// A refused request, handed back with its reason so the caller can answer it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected<T> {
    pub id: T,
    pub reason: RejectReason,
}

/// What the caller must do after a [`Batcher::poll`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<T> {
    /// Timed out under a REJECT policy: answer each with [`TIMED_OUT_MESSAGE`].
    pub rejected: Vec<T>,
    /// Requests to execute together now (only when the instance was idle).
    pub batch: Option<Vec<T>>,
    /// When to poll again at the latest; `None` when nothing time-driven is pending.
    pub wake_at: Option<Instant>,
}

struct Entry<T> {
    id: T,
    rows: usize,
    key: u64,
    arrival: Instant,
    deadline: Option<Instant>,
    level: usize,
}

enum Plan {
    Empty,
    Ready(usize),
    WaitUntil(Instant),
}

/// Dynamic batching queue of one model instance.
pub struct Batcher<T> {
    cfg: BatchConfig,
    policies: Vec<QueuePolicy>,
    queues: Vec<VecDeque<Entry<T>>>,
    delayed: VecDeque<Entry<T>>,
    counts: Vec<usize>,
}

impl<T> Batcher<T> {
    /// Creates an empty queue with one FIFO per priority level.
    pub fn new(mut cfg: BatchConfig) -> Self {
        cfg.preferred_batch_sizes.sort_unstable();
        cfg.preferred_batch_sizes.dedup();
        let n = cfg.priority_levels.max(1) as usize;
        let level = |i: usize| {
            if cfg.priority_levels == 0 {
                0
            } else {
                i as u32 + 1
            }
        };
        let policy = |i| cfg.level_policies.get(&level(i)).unwrap_or(&cfg.default_policy);
        let policies = (0..n).map(|i| policy(i).clone()).collect();
        Self {
            cfg,
            policies,
            queues: (0..n).map(|_| VecDeque::new()).collect(),
            delayed: VecDeque::new(),
            counts: vec![0; n],
        }
    }

    /// The config, so the caller can report it or read `preserve_ordering`.
    pub fn config(&self) -> &BatchConfig {
        &self.cfg
    }

    /// Number of queued requests, for queue-depth metrics and load reports.
    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum::<usize>() + self.delayed.len()
    }

    /// Whether nothing is queued, so the actor can go quiet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queued rows (sum of batch sizes), the load measure the router compares across nodes.
    pub fn pending_count(&self) -> usize {
        self.order().map(|e| e.rows).sum()
    }

    /// Queues a request, or refuses it at once so the client is not left waiting on a hopeless request.
    pub fn enqueue(&mut self, req: BatchRequest<T>, now: Instant) -> Result<(), Rejected<T>> {
        let idx = match self.admit(&req) {
            Ok(idx) => idx,
            Err(reason) => return Err(Rejected { id: req.id, reason }),
        };
        let policy = &self.policies[idx];
        let own = req.timeout.filter(|t| !t.is_zero() && policy.allow_timeout_override);
        let timeout = own.or(policy.default_timeout).filter(|_| self.cfg.dynamic);
        self.counts[idx] += 1;
        self.queues[idx].push_back(Entry {
            id: req.id,
            rows: req.batch_size.max(1),
            key: req.shape_key,
            arrival: now,
            deadline: timeout.map(|t| now + t),
            level: idx,
        });
        Ok(())
    }

    /// Picks the request's level queue (an index), or the reason it may not join one.
    fn admit(&self, req: &BatchRequest<T>) -> Result<usize, RejectReason> {
        let (max, levels) = (self.cfg.max_batch_size, self.cfg.priority_levels);
        if max > 0 && req.batch_size > max {
            let (batch_size, max_batch_size) = (req.batch_size, max);
            return Err(RejectReason::TooLarge {
                batch_size,
                max_batch_size,
            });
        }
        let default = self.cfg.default_priority_level;
        let level = match req.priority {
            _ if levels == 0 => 0,
            0 if (1..=levels).contains(&default) => default,
            0 => levels,
            p if p <= levels => p,
            priority => return Err(RejectReason::PriorityOutOfRange { priority, levels }),
        };
        let idx = level.max(1) as usize - 1;
        let max_queue_size = self.policies[idx].max_queue_size;
        if max_queue_size > 0 && self.counts[idx] >= max_queue_size {
            return Err(RejectReason::QueueFull { level, max_queue_size });
        }
        Ok(idx)
    }

    /// Removes a queued request whose client went away, so it is never executed.
    pub fn cancel(&mut self, id: &T) -> bool
    where
        T: PartialEq,
    {
        let delayed = std::iter::once(&mut self.delayed);
        for q in self.queues.iter_mut().chain(delayed) {
            if let Some(pos) = q.iter().position(|e| &e.id == id) {
                let e = q.remove(pos).expect("position is in range");
                self.counts[e.level] -= 1;
                return true;
            }
        }
        false
    }

    /// Applies timeouts, forms a batch if the instance is idle, and says when to poll next.
    pub fn poll(&mut self, now: Instant, instance_idle: bool) -> Decision<T> {
        let rejected = self.expire(now);
        if self.cfg.hold > 0 && self.len() >= self.cfg.hold {
            self.cfg.hold = 0;
        }
        let mut batch = None;
        if instance_idle && self.cfg.hold == 0 {
            if let Plan::Ready(n) = self.plan(now) {
                batch = Some(self.pop(n));
            }
        }
        let deadlines = self.queues.iter().flatten().filter_map(|e| e.deadline);
        let delay_expiry = match self.plan(now) {
            Plan::WaitUntil(t) => Some(t),
            _ => None,
        };
        let wake_at = deadlines.chain(delay_expiry).min();
        Decision {
            rejected,
            batch,
            wake_at,
        }
    }

    /// Dispatch order: level 1 first, FIFO within a level, DELAY-timed-out requests last.
    fn order(&self) -> impl Iterator<Item = &Entry<T>> {
        self.queues.iter().flatten().chain(self.delayed.iter())
    }

    /// Handles timed-out requests per their level's action and returns the REJECTed ones.
    fn expire(&mut self, now: Instant) -> Vec<T> {
        let mut rejected = Vec::new();
        for idx in 0..self.queues.len() {
            let due = |e: &Entry<T>| e.deadline.is_some_and(|d| d <= now);
            if !self.queues[idx].iter().any(due) {
                continue;
            }
            let action = self.policies[idx].timeout_action;
            for mut e in std::mem::take(&mut self.queues[idx]) {
                match e.deadline {
                    Some(d) if d <= now && action == TimeoutAction::Reject => {
                        self.counts[idx] -= 1;
                        rejected.push(e.id);
                    }
                    Some(d) if d <= now => {
                        e.deadline = None;
                        self.delayed.push_back(e);
                    }
                    _ => self.queues[idx].push_back(e),
                }
            }
        }
        rejected
    }

    /// Decides how many requests from the front of the order to send now, or until when to wait,
    /// as Triton's dynamic batcher does: a preferred batch size, or the batch as large as it gets
    /// without passing the largest preferred size (max_batch_size when none is given), goes at
    /// once while the delay runs; once the delay is over, or the batch cannot grow, everything
    /// that fits goes.
    fn plan(&self, now: Instant) -> Plan {
        let mut it = self.order();
        let Some(first) = it.next() else {
            return Plan::Empty;
        };
        if self.cfg.alone() {
            return Plan::Ready(1);
        }
        let max = self.cfg.max_batch_size;
        let pref = &self.cfg.preferred_batch_sizes;
        let largest = pref.last().copied().unwrap_or(max);
        let (mut total, mut n, mut oldest) = (first.rows, 1, first.arrival);
        let mut best = pref.contains(&total).then_some(1);
        let mut full = false;
        for e in it {
            if total + e.rows > largest && best.is_none() {
                best = Some(n);
            }
            if e.key != first.key || total + e.rows > max {
                full = true;
                break;
            }
            total += e.rows;
            n += 1;
            oldest = oldest.min(e.arrival);
            if pref.contains(&total) {
                best = Some(n);
            }
        }
        let delay = self.cfg.max_queue_delay;
        let delayed = !delay.is_zero() && now >= oldest + delay;
        match best {
            Some(b) if !delayed => Plan::Ready(b),
            _ if full || total >= largest || delay.is_zero() || delayed => Plan::Ready(n),
            _ => Plan::WaitUntil(oldest + delay),
        }
    }

    /// Takes the first `n` requests in dispatch order off the queues.
    fn pop(&mut self, n: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let q = match self.queues.iter_mut().find(|q| !q.is_empty()) {
                Some(q) => q,
                None => &mut self.delayed,
            };
            let Some(e) = q.pop_front() else { break };
            self.counts[e.level] -= 1;
            out.push(e.id);
        }
        out
    }
}

#[cfg(test)]
mod tests;
