//! Tests of the balancer on a fake clock with a seeded RNG.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

fn replica(link: LinkId, queued: u32) -> Replica {
    Replica {
        link,
        node: format!("n{link}"),
        inflight: 0,
        queued,
        exec_us: 0,
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn none(_: LinkId) -> u32 {
    0
}

/// Counts how often each link is picked over `n` picks.
fn tally(
    b: &Balancer,
    replicas: &[Replica],
    inflight: impl Fn(LinkId) -> u32,
    now: Instant,
    n: usize,
) -> HashMap<LinkId, usize> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut counts = HashMap::new();
    for _ in 0..n {
        match b.pick(replicas, &inflight, &[], now, &mut rng) {
            Pick::Routed(l) => *counts.entry(l).or_insert(0) += 1,
            other => panic!("expected a route, got {other:?}"),
        }
    }
    counts
}

#[test]
fn one_replica_is_picked_without_drawing() {
    let b = Balancer::default();
    let now = Instant::now();
    // An RNG that would panic if drawn from is hard to build; instead check the RNG state is untouched.
    let mut rng = StdRng::seed_from_u64(1);
    let before = rng.clone();
    assert_eq!(b.pick(&[replica(4, 9)], none, &[], now, &mut rng), Pick::Routed(4));
    let mut a = before;
    assert_eq!(rand::Rng::random::<u64>(&mut a), rand::Rng::random::<u64>(&mut rng));
}

#[test]
fn two_choices_take_the_less_loaded() {
    let b = Balancer::default();
    let now = Instant::now();
    // With two replicas both are always drawn, so the lower score always wins.
    let counts = tally(&b, &[replica(1, 5), replica(2, 0)], none, now, 200);
    assert_eq!(counts.get(&2), Some(&200));
    // The router's own in-flight count weighs the same as the reported queue.
    let counts = tally(
        &b,
        &[replica(1, 0), replica(2, 0)],
        |l| if l == 2 { 3 } else { 0 },
        now,
        200,
    );
    assert_eq!(counts.get(&1), Some(&200));
    // Score is the sum: 2 in flight + 1 queued = 3 > 0 + 2 = 2.
    let counts = tally(
        &b,
        &[replica(1, 1), replica(2, 2)],
        |l| if l == 1 { 2 } else { 0 },
        now,
        200,
    );
    assert_eq!(counts.get(&2), Some(&200));
    assert_eq!(score(&replica(1, 4), 3), 7);
}

#[test]
fn the_most_loaded_of_many_is_never_picked_and_ties_spread() {
    let b = Balancer::default();
    let now = Instant::now();
    let replicas = [replica(1, 0), replica(2, 0), replica(3, 0), replica(4, 100)];
    let counts = tally(&b, &replicas, none, now, 3000);
    assert_eq!(counts.get(&4), None, "{counts:?}");
    for l in 1..=3 {
        let c = counts[&l];
        assert!(
            (700..1300).contains(&c),
            "link {l} picked {c} times of 3000: {counts:?}"
        );
    }
}

#[test]
fn tried_links_are_excluded_and_all_tried_waits_for_another() {
    let b = Balancer::default();
    let now = Instant::now();
    let mut rng = StdRng::seed_from_u64(3);
    let replicas = [replica(1, 0), replica(2, 9)];
    assert_eq!(b.pick(&replicas, none, &[1], now, &mut rng), Pick::Routed(2));
    match b.pick(&replicas, none, &[2, 1], now, &mut rng) {
        Pick::Wait { reason, until: None } => assert_eq!(reason, "every replica was tried (2 tried: n1, n2)"),
        other => panic!("expected a wait, got {other:?}"),
    }
}

#[test]
fn no_replica_is_a_wait() {
    let b = Balancer::default();
    let mut rng = StdRng::seed_from_u64(3);
    assert!(matches!(
        b.pick(&[], none, &[], Instant::now(), &mut rng),
        Pick::Wait { until: None, .. }
    ));
}

#[test]
fn quarantine_keeps_a_link_out_until_it_expires() {
    let mut b = Balancer::default();
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(5);
    let replicas = [replica(1, 0), replica(2, 50)];
    b.transport_failed(1, t0);
    assert!(b.is_quarantined(1, t0 + ms(2999)));
    for _ in 0..20 {
        assert_eq!(b.pick(&replicas, none, &[], t0 + ms(100), &mut rng), Pick::Routed(2));
    }
    // Default quarantine is 3 s; after it the less loaded link wins again.
    assert!(!b.is_quarantined(1, t0 + ms(3000)));
    assert_eq!(b.pick(&replicas, none, &[], t0 + ms(3000), &mut rng), Pick::Routed(1));
}

#[test]
fn only_quarantined_untried_replicas_mean_wait_until_the_first_expires() {
    let mut b = Balancer::new(BalanceSettings {
        quarantine: ms(1000),
        busy: ms(250),
    });
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(5);
    let replicas = [replica(1, 0), replica(2, 0), replica(3, 0)];
    b.transport_failed(1, t0);
    b.transport_failed(2, t0 + ms(200));
    match b.pick(&replicas, none, &[3], t0 + ms(300), &mut rng) {
        Pick::Wait { reason, until } => {
            assert_eq!(until, Some(t0 + ms(1000)));
            assert!(reason.contains("quarantined"), "{reason}");
        }
        other => panic!("expected wait, got {other:?}"),
    }
    // A tried link does not count, even when quarantined: the untried one is the answer after expiry.
    assert_eq!(
        b.pick(&replicas, none, &[2, 3], t0 + ms(1000), &mut rng),
        Pick::Routed(1)
    );
}

#[test]
fn busy_links_are_a_last_resort_and_never_quarantined() {
    let mut b = Balancer::default();
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(9);
    let replicas = [replica(1, 0), replica(2, 40)];
    b.overloaded(1, t0);
    assert!(b.is_busy(1, t0 + ms(10)));
    assert!(!b.is_quarantined(1, t0 + ms(10)));
    // Busy: the more loaded idle link is preferred.
    for _ in 0..20 {
        assert_eq!(b.pick(&replicas, none, &[], t0 + ms(10), &mut rng), Pick::Routed(2));
    }
    // But a busy link is used when it is the only untried one left.
    assert_eq!(b.pick(&replicas, none, &[2], t0 + ms(10), &mut rng), Pick::Routed(1));
    // Busy expires by itself after 250 ms.
    assert_eq!(b.pick(&replicas, none, &[], t0 + ms(250), &mut rng), Pick::Routed(1));
}

#[test]
fn success_clears_busy_and_forget_drops_marks() {
    let mut b = Balancer::default();
    let t0 = Instant::now();
    b.overloaded(1, t0);
    b.succeeded(1);
    assert!(!b.is_busy(1, t0));
    b.transport_failed(2, t0);
    b.succeeded(2);
    assert!(b.is_quarantined(2, t0), "success does not lift a quarantine");
    b.forget(2);
    assert!(!b.is_quarantined(2, t0));
}

#[test]
fn expired_marks_are_pruned() {
    let mut b = Balancer::default();
    let t0 = Instant::now();
    b.transport_failed(1, t0);
    b.overloaded(2, t0);
    b.overloaded(3, t0 + Duration::from_secs(10));
    assert_eq!(b.marks.len(), 1, "expired marks of links 1 and 2 are dropped");
}
