//! Fake-clock tests of the dynamic batching policy.
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
fn a_preferred_batch_goes_at_once_and_at_expiry_everything_pending_goes() {
    let t0 = Instant::now();
    // Triton: a preferred size found while the delay runs is sent at once, delay or not.
    for delay in [100, 0] {
        let mut b = mk(8, &[2, 4], delay, |_| {});
        push(&mut b, t0, 1..=3);
        assert_eq!(take(&mut b, t0), Some(vec![1, 2]), "delay {delay}");
        let rest = if delay == 0 {
            take(&mut b, t0)
        } else {
            take(&mut b, at(t0, 99))
        };
        assert_eq!(rest, if delay == 0 { Some(vec![3]) } else { None });
    }
    // Once the delay is over, every pending request goes, past a preferred size too.
    let mut b = mk(8, &[2, 4], 100, |_| {});
    push(&mut b, t0, [1]);
    enq(&mut b, at(t0, 1), (2, 2, 7, 0, None)).unwrap();
    assert_eq!(
        take(&mut b, at(t0, 99)),
        None,
        "3 rows: no preferred size, and it can grow to 4"
    );
    assert_eq!(take(&mut b, at(t0, 100)), Some(vec![1, 2]));
}

#[test]
fn a_batch_does_not_grow_past_the_largest_preferred_size() {
    // L0_batcher's test_multi_batch_sum_gt_max_preferred: preferred [2, 6], max 8; a 3-row request,
    // then a 4-row one: the 3 goes alone as soon as the 4 arrives (7 would pass 6), and the 4
    // waits its own delay.
    let t0 = Instant::now();
    let mut b = mk(8, &[2, 6], 10_000, |_| {});
    enq(&mut b, t0, (1, 3, 7, 0, None)).unwrap();
    assert_eq!(poll(&mut b, t0, true), (vec![], None, Some(at(t0, 10_000))));
    enq(&mut b, at(t0, 1000), (2, 4, 7, 0, None)).unwrap();
    assert_eq!(take(&mut b, at(t0, 1000)), Some(vec![1]));
    assert_eq!(poll(&mut b, at(t0, 1000), true), (vec![], None, Some(at(t0, 11_000))));
    assert_eq!(take(&mut b, at(t0, 11_000)), Some(vec![2]));
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

#[test]
fn the_delay_hook_holds_every_batch_until_its_count_is_queued_once() {
    let t0 = Instant::now();
    let mut b = mk(8, &[2, 6], 10_000_000, |c| c.hold = 6);
    assert_eq!(b.config().hold, 6, "the hook holds until six are queued");
    push(&mut b, t0, 1..=5);
    assert_eq!(take(&mut b, at(t0, 20_000_000)), None, "held even past the queue delay");
    push(&mut b, t0, [6]);
    assert_eq!(
        take(&mut b, at(t0, 1)),
        Some(vec![1, 2, 3, 4, 5, 6]),
        "the preferred 6 at once"
    );
    assert_eq!(b.config().hold, 0, "the hook is spent once its count was queued");
    push(&mut b, t0, [7, 8]);
    assert_eq!(take(&mut b, at(t0, 2)), Some(vec![7, 8]), "then it batches as usual");
    // Only dynamic batching takes the hook.
    let sequence: mesh::config::ModelConfig =
        mesh::config::parse_pbtxt("name: \"s\" max_batch_size: 4 sequence_batching { }").unwrap();
    assert_eq!(
        BatchConfig::from_model_config(&sequence).with_hold(&sequence, 3).hold,
        0
    );
    let dynamic: mesh::config::ModelConfig =
        mesh::config::parse_pbtxt("name: \"d\" max_batch_size: 4 dynamic_batching { }").unwrap();
    assert_eq!(BatchConfig::from_model_config(&dynamic).with_hold(&dynamic, 3).hold, 3);
}
