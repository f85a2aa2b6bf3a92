//! Triton's dynamic batching policy as a sans-IO struct: the instance actor feeds it requests and
//! the time, and carries out what it decides (DESIGN.md §3 "Policies are sans-IO").
//!
//! Semantics chosen where Triton's docs leave room:
//! - Batch size is counted as `max(1, batch_size)`, as Triton does; with `max_batch_size` 0 it is ignored.
//! - A request priority of 0 uses `default_priority_level`; when that is 0 or out of range, the lowest
//!   level (`priority_levels`) is used. With `priority_levels` 0 every priority goes to one queue.
//! - A candidate that cannot grow (the next queued request has another shape key or would overflow
//!   `max_batch_size`, or it already reaches the largest preferred size) is sent without waiting.
//! - A timeout fires when `now >= arrival + timeout`; timeouts are applied before a batch is formed.
//! - A request delayed by a DELAY timeout still counts towards its level's `max_queue_size`.
//! - Without `dynamic_batching` no request timeouts are applied (Triton's default scheduler has none).
//! - `wake_at` covers time-driven events only; the caller polls again itself when the instance goes idle.
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
        }
    }

    /// Builds the batcher's config from the model's protobuf config, once at load time.
    pub fn from_model_config(cfg: &mesh::config::ModelConfig) -> Self {
        let max_batch_size = cfg.max_batch_size.max(0) as usize;
        let Some(SchedulingChoice::DynamicBatching(db)) = &cfg.scheduling_choice else {
            return Self::unbatched(max_batch_size);
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
        }
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
        let mut batch = None;
        if instance_idle {
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

    /// Decides how many requests from the front of the order to send now, or until when to wait.
    fn plan(&self, now: Instant) -> Plan {
        let mut it = self.order();
        let Some(first) = it.next() else {
            return Plan::Empty;
        };
        if self.cfg.alone() {
            return Plan::Ready(1);
        }
        let max = self.cfg.max_batch_size;
        let (mut sums, mut oldest, mut blocked) = (vec![first.rows], first.arrival, false);
        for e in it {
            let total = *sums.last().expect("non-empty");
            if e.key != first.key || total + e.rows > max {
                blocked = true;
                break;
            }
            sums.push(total + e.rows);
            oldest = oldest.min(e.arrival);
        }
        let (n, total) = (sums.len(), sums[sums.len() - 1]);
        let pref = &self.cfg.preferred_batch_sizes;
        if total >= max || pref.contains(&total) || self.cfg.max_queue_delay.is_zero() {
            return Plan::Ready(n);
        }
        let can_grow = !blocked && pref.last().is_none_or(|&m| total < m);
        let expiry = oldest + self.cfg.max_queue_delay;
        if can_grow && now < expiry {
            return Plan::WaitUntil(expiry);
        }
        let best_preferred = sums.iter().rposition(|s| pref.contains(s));
        Plan::Ready(best_preferred.map_or(n, |i| i + 1))
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
mod tests {
    use super::*;
    use mesh::proto::{ModelConfig, ModelDynamicBatching};
    use TimeoutAction::{Delay, Reject};

    type Polled = (Vec<u32>, Option<Vec<u32>>, Option<Instant>);

    /// Fake clock: the base instant plus `micros`.
    fn at(t0: Instant, micros: u64) -> Instant {
        t0 + Duration::from_micros(micros)
    }

    /// A dynamic-batching batcher, with `tweak` adjusting the config before it is built.
    fn mk(max: usize, pref: &[usize], delay_us: u64, tweak: impl FnOnce(&mut BatchConfig)) -> Batcher<u32> {
        let mut c = BatchConfig::unbatched(max);
        (c.dynamic, c.preferred_batch_sizes) = (true, pref.to_vec());
        c.max_queue_delay = Duration::from_micros(delay_us);
        tweak(&mut c);
        Batcher::new(c)
    }

    fn policy(action: TimeoutAction, timeout_us: u64, allow: bool, max: usize) -> QueuePolicy {
        let default_timeout = (timeout_us > 0).then(|| Duration::from_micros(timeout_us));
        QueuePolicy {
            timeout_action: action,
            default_timeout,
            allow_timeout_override: allow,
            max_queue_size: max,
        }
    }

    /// Enqueues one request: (id, rows, shape key, priority, own timeout in µs).
    fn enq(b: &mut Batcher<u32>, now: Instant, r: (u32, usize, u64, u32, Option<u64>)) -> Result<(), Rejected<u32>> {
        let timeout = r.4.map(Duration::from_micros);
        b.enqueue(
            BatchRequest {
                id: r.0,
                batch_size: r.1,
                shape_key: r.2,
                priority: r.3,
                timeout,
            },
            now,
        )
    }

    /// Enqueues one-row requests with shape key 7 and default priority.
    fn push(b: &mut Batcher<u32>, now: Instant, ids: impl IntoIterator<Item = u32>) {
        ids.into_iter().for_each(|id| enq(b, now, (id, 1, 7, 0, None)).unwrap());
    }

    fn poll(b: &mut Batcher<u32>, now: Instant, idle: bool) -> Polled {
        let d = b.poll(now, idle);
        (d.rejected, d.batch, d.wake_at)
    }

    fn take(b: &mut Batcher<u32>, now: Instant) -> Option<Vec<u32>> {
        b.poll(now, true).batch
    }

    fn drain(b: &mut Batcher<u32>, now: Instant) -> Vec<u32> {
        std::iter::from_fn(|| take(b, now)).flatten().collect()
    }

    #[test]
    fn preferred_sizes_dispatch_immediately() {
        let t0 = Instant::now();
        let mut b = mk(8, &[4], 1000, |_| {});
        push(&mut b, t0, 1..=3);
        assert_eq!(poll(&mut b, t0, true), (vec![], None, Some(at(t0, 1000))));
        push(&mut b, at(t0, 5), [4]);
        assert_eq!(poll(&mut b, at(t0, 5), true), (vec![], Some(vec![1, 2, 3, 4]), None));
        // A smaller preferred total goes at once; a candidate past the largest preferred size is cut there.
        let mut b = mk(8, &[4, 2], 1000, |_| {});
        push(&mut b, t0, 1..=2);
        assert_eq!(take(&mut b, t0), Some(vec![1, 2]));
        push(&mut b, t0, 1..=6);
        assert_eq!(take(&mut b, t0), Some(vec![1, 2, 3, 4]));
        assert_eq!(take(&mut b, t0), Some(vec![5, 6]));
    }

    #[test]
    fn max_batch_size_caps_the_batch() {
        let t0 = Instant::now();
        let mut b = mk(4, &[], 1000, |_| {});
        push(&mut b, t0, 1..=6);
        assert_eq!(take(&mut b, t0), Some(vec![1, 2, 3, 4]));
        assert_eq!(poll(&mut b, at(t0, 1), true), (vec![], None, Some(at(t0, 1000))));
        enq(&mut b, t0, (7, 3, 7, 0, None)).unwrap();
        assert_eq!((b.len(), b.pending_count()), (3, 5));
        assert_eq!(take(&mut b, at(t0, 2)), Some(vec![5, 6]), "7 would overflow: no wait");
    }

    #[test]
    fn delay_expiry_dispatches_partial_batch_exactly_at_deadline() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 100, |_| {});
        push(&mut b, t0, [1]);
        push(&mut b, at(t0, 30), [2]);
        assert_eq!(poll(&mut b, at(t0, 99), true), (vec![], None, Some(at(t0, 100))));
        assert_eq!(poll(&mut b, at(t0, 100), true), (vec![], Some(vec![1, 2]), None));
    }

    #[test]
    fn largest_preferred_size_chosen_at_expiry_but_not_with_zero_delay() {
        let t0 = Instant::now();
        let mut b = mk(8, &[2, 4], 100, |_| {});
        push(&mut b, t0, 1..=3);
        assert_eq!(take(&mut b, at(t0, 99)), None);
        assert_eq!(take(&mut b, at(t0, 100)), Some(vec![1, 2]));
        assert_eq!(take(&mut b, at(t0, 100)), Some(vec![3]), "already waited its delay");
        let mut b = mk(8, &[2, 4], 0, |_| {});
        push(&mut b, t0, 1..=3);
        assert_eq!(poll(&mut b, t0, true), (vec![], Some(vec![1, 2, 3]), None));
    }

    #[test]
    fn shape_keys_split_batches() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 100, |_| {});
        for (id, key) in [(1, 10), (2, 10), (3, 20), (4, 10)] {
            enq(&mut b, t0, (id, 1, key, 0, None)).unwrap();
        }
        assert_eq!(take(&mut b, t0), Some(vec![1, 2]), "blocked by another key: no wait");
        assert_eq!(take(&mut b, t0), Some(vec![3]));
        assert_eq!(take(&mut b, at(t0, 99)), None);
        assert_eq!(take(&mut b, at(t0, 100)), Some(vec![4]));
    }

    #[test]
    fn priorities_reorder_and_default_level() {
        let t0 = Instant::now();
        let mut b = mk(2, &[], 0, |c| (c.priority_levels, c.default_priority_level) = (2, 2));
        enq(&mut b, t0, (1, 1, 7, 2, None)).unwrap();
        enq(&mut b, t0, (2, 1, 7, 0, None)).unwrap();
        enq(&mut b, at(t0, 1), (3, 1, 7, 1, None)).unwrap();
        assert_eq!(take(&mut b, at(t0, 1)), Some(vec![3, 1]));
        assert_eq!(take(&mut b, at(t0, 1)), Some(vec![2]));
        // default_priority_level 0 means the lowest level.
        let mut b = mk(1, &[], 0, |c| c.priority_levels = 3);
        for (id, prio) in [(1, 0), (2, 3), (3, 2)] {
            enq(&mut b, t0, (id, 1, 7, prio, None)).unwrap();
        }
        assert_eq!(drain(&mut b, t0), vec![3, 1, 2]);
    }

    #[test]
    fn max_queue_size_rejects_with_reason_while_other_levels_accept() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 100, |c| {
            c.priority_levels = 2;
            c.level_policies.insert(1, policy(Reject, 0, false, 1));
        });
        enq(&mut b, t0, (1, 1, 7, 1, None)).unwrap();
        let err = enq(&mut b, t0, (2, 1, 7, 1, None)).unwrap_err();
        assert_eq!(err.id, 2);
        assert_eq!(
            err.reason.to_string(),
            "queue full at priority level 1 (max_queue_size 1)"
        );
        (3..10).for_each(|id| enq(&mut b, t0, (id, 1, 7, 2, None)).unwrap());
        let err = enq(&mut b, t0, (10, 1, 7, 3, None)).unwrap_err();
        assert_eq!(err.reason.to_string(), "priority 3 is outside 1..=2");
        assert!(b.cancel(&1));
        enq(&mut b, t0, (11, 1, 7, 1, None)).unwrap();
        assert_eq!(b.len(), 8);
    }

    #[test]
    fn reject_timeout_is_returned_in_rejected() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 1000, |c| c.default_policy = policy(Reject, 50, false, 0));
        push(&mut b, t0, [1]);
        assert_eq!(poll(&mut b, at(t0, 49), false), (vec![], None, Some(at(t0, 50))));
        assert_eq!(poll(&mut b, at(t0, 50), true), (vec![1], None, None));
        assert!(b.is_empty());
    }

    #[test]
    fn delay_timeout_moves_request_to_the_back_and_stops_timing_it() {
        let t0 = Instant::now();
        let mut b = mk(1, &[], 0, |c| {
            c.priority_levels = 2;
            c.level_policies.insert(1, policy(Delay, 50, false, 0));
        });
        enq(&mut b, t0, (1, 1, 7, 1, None)).unwrap();
        enq(&mut b, at(t0, 40), (2, 1, 7, 1, None)).unwrap();
        enq(&mut b, t0, (3, 1, 7, 2, None)).unwrap();
        assert_eq!(poll(&mut b, at(t0, 60), false), (vec![], None, Some(at(t0, 90))));
        assert_eq!(
            drain(&mut b, at(t0, 60)),
            vec![2, 3, 1],
            "1 timed out and went behind level 2"
        );
        let mut b = mk(8, &[], 0, |c| c.default_policy = policy(Delay, 50, false, 0));
        push(&mut b, t0, [1]);
        assert_eq!(poll(&mut b, at(t0, 50), false), (vec![], None, None));
        assert_eq!(take(&mut b, at(t0, 1_000_000)), Some(vec![1]));
    }

    #[test]
    fn timeout_override_honoured_only_when_allowed() {
        let t0 = Instant::now();
        for (allow, fires) in [(true, 20), (false, 100)] {
            let mut b = mk(8, &[], 10_000, |c| c.default_policy = policy(Reject, 100, allow, 0));
            enq(&mut b, t0, (1, 1, 7, 0, Some(20))).unwrap();
            assert_eq!(b.poll(at(t0, fires - 1), false).wake_at, Some(at(t0, fires)));
            assert_eq!(b.poll(at(t0, fires), false).rejected, vec![1]);
        }
    }

    #[test]
    fn wake_at_is_earliest_of_delay_and_timeout() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 100, |c| c.default_policy = policy(Reject, 0, true, 0));
        push(&mut b, t0, [1]);
        enq(&mut b, at(t0, 10), (2, 1, 7, 0, Some(30))).unwrap();
        assert_eq!(poll(&mut b, at(t0, 10), true), (vec![], None, Some(at(t0, 40))));
        assert_eq!(poll(&mut b, at(t0, 40), true), (vec![2], None, Some(at(t0, 100))));
    }

    #[test]
    fn cancel_removes_queued_request() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 0, |_| {});
        push(&mut b, t0, 1..=3);
        assert!(b.cancel(&2));
        assert!(!b.cancel(&2));
        assert_eq!(b.len(), 2);
        assert_eq!(take(&mut b, t0), Some(vec![1, 3]));
    }

    #[test]
    fn no_dynamic_batching_sends_each_request_alone() {
        let t0 = Instant::now();
        let c = BatchConfig::from_model_config(&ModelConfig {
            max_batch_size: 8,
            ..Default::default()
        });
        assert!(!c.dynamic);
        let mut b = Batcher::new(c);
        (0..1000).for_each(|id| enq(&mut b, t0, (id, 2, id as u64 % 3, 5, Some(1))).unwrap());
        assert_eq!(poll(&mut b, at(t0, 100), true), (vec![], Some(vec![0]), None));
        assert_eq!(take(&mut b, at(t0, 100)), Some(vec![1]));
        assert!(enq(&mut b, t0, (9, 9, 0, 0, None)).is_err());
        // A model with max_batch_size 0 never combines requests, whatever their first dimension.
        let mut b = mk(0, &[], 1000, |_| {});
        enq(&mut b, t0, (1, 50, 7, 0, None)).unwrap();
        push(&mut b, t0, [2]);
        assert_eq!(take(&mut b, t0), Some(vec![1]));
    }

    #[test]
    fn busy_instance_gets_no_batch_but_rejections_happen() {
        let t0 = Instant::now();
        let mut b = mk(8, &[], 0, |c| c.default_policy = policy(Reject, 0, true, 0));
        enq(&mut b, t0, (1, 1, 7, 0, Some(10))).unwrap();
        push(&mut b, t0, [2]);
        assert_eq!(poll(&mut b, at(t0, 10), false), (vec![1], None, None));
        assert_eq!(take(&mut b, at(t0, 11)), Some(vec![2]));
    }

    #[test]
    fn oversized_request_rejected() {
        let mut b = mk(4, &[], 0, |_| {});
        let err = enq(&mut b, Instant::now(), (1, 5, 7, 0, None)).unwrap_err();
        assert_eq!(err.reason.to_string(), "batch size 5 exceeds max_batch_size 4");
        assert!(b.is_empty());
    }

    #[test]
    fn from_model_config_reads_dynamic_batching() {
        let default = ModelQueuePolicy {
            max_queue_size: 5,
            ..Default::default()
        };
        let delay = ModelQueuePolicy {
            timeout_action: ProtoTimeoutAction::Delay as i32,
            default_timeout_microseconds: 250,
            allow_timeout_override: true,
            max_queue_size: 0,
        };
        let db = ModelDynamicBatching {
            preferred_batch_size: vec![8, 2, 4, 2, 64],
            max_queue_delay_microseconds: 300,
            preserve_ordering: true,
            priority_levels: 3,
            default_priority_level: 0,
            default_queue_policy: Some(default),
            priority_queue_policy: HashMap::from([(1, delay)]),
        };
        let scheduling_choice = Some(SchedulingChoice::DynamicBatching(db));
        let mc = ModelConfig {
            max_batch_size: 16,
            scheduling_choice,
            ..Default::default()
        };
        let b = Batcher::<u32>::new(BatchConfig::from_model_config(&mc));
        let c = b.config();
        assert!(c.dynamic && c.preserve_ordering);
        assert_eq!(c.preferred_batch_sizes, vec![2, 4, 8]);
        assert_eq!((c.max_batch_size, c.max_queue_delay.as_micros()), (16, 300));
        assert_eq!((c.priority_levels, c.default_priority_level), (3, 0));
        assert_eq!(c.default_policy, policy(Reject, 0, false, 5));
        assert_eq!(c.level_policies[&1], policy(Delay, 250, true, 0));
        assert_eq!((b.policies[0].timeout_action, b.policies[2].max_queue_size), (Delay, 5));
    }
}
