//! Tests of the autoscaler on a fake clock.
use std::time::{Duration, Instant};

use super::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn scaler() -> Autoscaler {
    Autoscaler::new(ScaleSettings {
        target_inflight: 2.0,
        up_delay: secs(30),
        down_delay: secs(600),
    })
}

/// Observes `inflight` every second over `[from, to)` seconds after `t0` (with `ready` replicas), asking for a
/// decision after each observation; returns the first decision and its second.
fn feed(a: &mut Autoscaler, t0: Instant, from: u64, to: u64, inflight: f64, ready: u32) -> Option<(u64, u32)> {
    for s in from..to {
        let now = t0 + secs(s);
        a.observe("m", inflight, ready, now);
        if let Some(n) = a.desired("m", 1, 10, now) {
            return Some((s, n));
        }
    }
    None
}

#[test]
fn ramp_up_scales_after_the_up_delay_and_not_before() {
    let t0 = Instant::now();
    let mut a = scaler();
    assert_eq!(feed(&mut a, t0, 0, 60, 4.0, 2), None, "2 replicas carry 4 in flight");
    // 9 in flight asks for 5 replicas: only after 30 s of it.
    assert_eq!(feed(&mut a, t0, 60, 200, 9.0, 2), Some((90, 5)));
    // The decision is the new current: the same load asks for nothing more.
    assert_eq!(feed(&mut a, t0, 91, 300, 9.0, 5), None);
}

#[test]
fn load_stopping_scales_down_after_the_down_delay_and_not_before() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 12.0, 6, t0);
    assert_eq!(a.desired("m", 1, 10, t0), None);
    assert_eq!(feed(&mut a, t0, 1, 601, 0.0, 6), None, "not before 600 s");
    assert_eq!(
        feed(&mut a, t0, 601, 700, 0.0, 6),
        Some((601, 1)),
        "zero load: down to min"
    );
    assert_eq!(feed(&mut a, t0, 602, 2000, 0.0, 1), None, "stays at min");
}

#[test]
fn scaling_down_takes_the_highest_load_seen_during_the_delay() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 16.0, 8, t0);
    assert_eq!(feed(&mut a, t0, 1, 300, 2.0, 8), None);
    assert_eq!(
        feed(&mut a, t0, 300, 301, 7.0, 8),
        None,
        "7 in flight (4 replicas) is still below 8"
    );
    assert_eq!(feed(&mut a, t0, 301, 700, 2.0, 8), Some((601, 4)));
}

#[test]
fn a_dip_restarts_the_up_delay_and_the_target_is_the_latest_load() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 4.0, 2, t0);
    assert_eq!(feed(&mut a, t0, 1, 20, 9.0, 2), None);
    // One observation at the current level: the streak ends.
    assert_eq!(feed(&mut a, t0, 20, 21, 3.0, 2), None);
    // Load back up, and growing: no decision 30 s after the first rise, one 30 s after the dip, to the
    // latest level (7 replicas), not the one before the dip.
    assert_eq!(feed(&mut a, t0, 21, 40, 9.0, 2), None);
    assert_eq!(feed(&mut a, t0, 40, 100, 13.0, 2), Some((51, 7)));
}

#[test]
fn a_spike_shorter_than_the_delay_changes_nothing() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 4.0, 2, t0);
    for round in 0..20u64 {
        let base = 1 + round * 30;
        assert_eq!(feed(&mut a, t0, base, base + 29, 40.0, 2), None);
        assert_eq!(feed(&mut a, t0, base + 29, base + 30, 4.0, 2), None);
    }
}

#[test]
fn decisions_are_clamped_to_the_bounds() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 100.0, 2, t0);
    assert_eq!(a.desired("m", 1, 4, t0 + secs(10)), None);
    a.observe("m", 100.0, 2, t0 + secs(30));
    assert_eq!(a.desired("m", 1, 4, t0 + secs(30)), Some(4), "50 wanted, max 4");
    a.observe("m", 100.0, 4, t0 + secs(70));
    assert_eq!(a.desired("m", 1, 4, t0 + secs(70)), None, "at max: nothing more");
    // Bounds that exclude the current count correct it at once.
    assert_eq!(a.desired("m", 1, 3, t0 + secs(71)), Some(3));
    assert_eq!(a.desired("m", 5, 8, t0 + secs(72)), Some(5));
    // max below min is taken as min.
    assert_eq!(a.desired("m", 6, 2, t0 + secs(73)), Some(6));
}

#[test]
fn zero_load_keeps_min() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 0.0, 0, t0);
    assert_eq!(a.desired("m", 2, 4, t0), Some(2), "nothing ready yet: min");
    for s in 1..3000 {
        let now = t0 + secs(s);
        a.observe("m", 0.0, 2, now);
        assert_eq!(a.desired("m", 2, 4, now), None);
    }
}

#[test]
fn a_model_with_no_replica_scales_up_at_the_first_request() {
    let t0 = Instant::now();
    let mut a = scaler();
    a.observe("m", 0.0, 0, t0);
    assert_eq!(a.desired("m", 0, 4, t0), None);
    a.observe("m", 3.0, 0, t0 + secs(1));
    assert_eq!(a.desired("m", 0, 4, t0 + secs(1)), Some(2));
}

#[test]
fn unknown_and_forgotten_models_have_no_decision() {
    let t0 = Instant::now();
    let mut a = scaler();
    assert_eq!(a.desired("m", 1, 4, t0), None);
    a.observe("m", 0.0, 0, t0);
    a.forget("m");
    assert_eq!(a.desired("m", 1, 4, t0), None);
}

#[test]
fn an_unusable_target_is_taken_as_the_default() {
    let t0 = Instant::now();
    let mut a = Autoscaler::new(ScaleSettings {
        target_inflight: 0.0,
        ..ScaleSettings::default()
    });
    a.observe("m", 8.0, 0, t0);
    assert_eq!(a.desired("m", 0, 10, t0), Some(4));
    a.observe("m", f64::NAN, 4, t0 + secs(1));
    a.observe("m", f64::INFINITY, 4, t0 + secs(2));
    assert_eq!(
        a.desired("m", 0, 10, t0 + secs(40)),
        Some(10),
        "infinite load saturates to max"
    );
}
