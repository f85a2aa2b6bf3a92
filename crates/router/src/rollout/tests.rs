//! Tests of a rollout's decisions on a fake clock: steps held for their time and requests, the
//! guard's rollbacks (errors, latency) and what it ignores, the operator's commands, the split's
//! shares and stickiness.
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::split::{arm_of_bucket, arm_of_key, bucket, choose, retry_on_serving, Key, Pins, BUCKETS};
use super::*;
use mesh::Code;

const MS: Duration = Duration::from_millis(1);
const STEP: Duration = Duration::from_secs(30);

fn spec() -> Spec {
    Spec {
        model: "m".into(),
        serving: "1".into(),
        candidate: "2".into(),
        steps: vec![5, 25, 50, 100],
        min_step_time: STEP,
        min_step_requests: 50,
        guard: Guard {
            min_requests: 40,
            ..Guard::default()
        },
        shadow: 0,
    }
}

/// `n` answers of each version: the candidate failing `bad` in 100 of them (spread evenly) after
/// `slow` times the serving version's 10 ms.
fn feed(r: &mut Rollout, n: u64, bad: u64, slow: u32) {
    for i in 0..n {
        if r.share() < 100 {
            r.record(Arm::Serving, true, 10 * MS); // at 100% versionless requests go to the candidate
        }
        r.record(Arm::Candidate, (i * bad) % 100 >= bad, 10 * MS * slow);
    }
}

#[test]
fn a_spec_is_checked_in_an_operators_words() {
    let bad = |f: fn(&mut Spec)| {
        let mut s = spec();
        f(&mut s);
        s.check().unwrap_err()
    };
    assert!(spec().check().is_ok());
    assert!(bad(|s| s.candidate = "1".into()).contains("is the serving version 1"));
    assert!(bad(|s| s.steps = vec![5, 50]).contains("end at 100"));
    assert!(bad(|s| s.steps = vec![50, 25, 100]).contains("must rise"));
    assert!(bad(|s| s.steps = vec![0, 100]).contains("must rise"));
    assert!(bad(|s| s.guard.max_p99_ratio = 0.5).contains("at least 1"));
    assert!(bad(|s| s.guard.max_error_rate_increase = f64::NAN).contains("between 0 and 1"));
    assert!(Rollout::start(spec(), Instant::now()).is_ok());
}

#[test]
fn a_healthy_candidate_goes_step_by_step_to_promotion() {
    let t0 = Instant::now();
    let mut r = Rollout::start(spec(), t0).unwrap();
    assert_eq!(r.share(), 5);
    let mut now = t0;
    for (step, share) in [(1, 25), (2, 50), (3, 100)] {
        feed(&mut r, 60, 0, 1);
        assert_eq!(r.tick(now + STEP - MS), Decision::Stay, "held for its time");
        now += STEP;
        assert_eq!(r.tick(now), Decision::Advance { step, share });
        assert_eq!(r.share(), share);
        assert_eq!(r.tick(now + STEP), Decision::Stay, "a new step counts again");
    }
    feed(&mut r, 60, 0, 1);
    assert_eq!(r.tick(now + STEP), Decision::Promote);
    assert_eq!((r.share(), r.is_open()), (100, false));
    assert_eq!(r.tick(now + 10 * STEP), Decision::Stay, "over");
}

#[test]
fn a_step_waits_for_its_requests() {
    let t0 = Instant::now();
    let mut r = Rollout::start(spec(), t0).unwrap();
    feed(&mut r, 45, 0, 1);
    assert_eq!(r.tick(t0 + 10 * STEP), Decision::Stay, "45 of 50 candidate requests");
    feed(&mut r, 5, 0, 1);
    assert_eq!(r.tick(t0 + 10 * STEP), Decision::Advance { step: 1, share: 25 });
}

#[test]
fn a_candidate_failing_a_fifth_of_its_requests_rolls_back_with_the_reason() {
    let t0 = Instant::now();
    let mut r = Rollout::start(spec(), t0).unwrap();
    feed(&mut r, 30, 20, 1);
    assert_eq!(r.tick(t0), Decision::Stay, "not judged under 40 requests");
    feed(&mut r, 70, 20, 1);
    let Decision::RollBack { reason } = r.tick(t0 + MS) else {
        panic!("rolled back");
    };
    assert!(
        reason.contains("version 2 failed 20.0% of 100 requests against 0.0% for version 1"),
        "{reason}"
    );
    assert_eq!(r.share(), 0);
    assert_eq!(r.phase, Phase::RolledBack { reason });
    assert!(!r.resume(t0) && !r.promote() && !r.abort(), "over");
}

#[test]
fn a_candidate_five_times_slower_rolls_back_and_noise_does_not() {
    let t0 = Instant::now();
    let mut r = Rollout::start(spec(), t0).unwrap();
    feed(&mut r, 50, 0, 5);
    let Decision::RollBack { reason } = r.tick(t0) else {
        panic!("rolled back");
    };
    assert!(
        reason.contains("p99 latency") && reason.contains("over 1.50×"),
        "{reason}"
    );

    // Twice as slow, but by microseconds: under the floor.
    let mut r = Rollout::start(spec(), t0).unwrap();
    for _ in 0..60 {
        r.record(Arm::Serving, true, Duration::from_micros(100));
        r.record(Arm::Candidate, true, Duration::from_micros(200));
    }
    assert_eq!(r.tick(t0 + STEP), Decision::Advance { step: 1, share: 25 });
    // Errors within the margin: one in a hundred against none.
    let mut r = Rollout::start(spec(), t0).unwrap();
    feed(&mut r, 100, 1, 1);
    assert_eq!(r.tick(t0 + STEP), Decision::Advance { step: 1, share: 25 });
}

#[test]
fn the_operator_pauses_resumes_promotes_and_aborts() {
    let t0 = Instant::now();
    let mut r = Rollout::start(spec(), t0).unwrap();
    assert!(r.pause());
    feed(&mut r, 100, 50, 9);
    assert_eq!(r.tick(t0 + STEP), Decision::Stay, "paused: no decision of its own");
    assert_eq!(r.share(), 5, "a pause keeps the share");
    assert!(r.resume(t0 + STEP));
    assert_eq!(r.candidate.requests(), 0, "resumed, the step counts again");
    feed(&mut r, 60, 0, 1);
    assert_eq!(r.tick(t0 + STEP), Decision::Stay, "its time starts over");
    assert!(r.promote());
    assert_eq!(r.share(), 100);
    let mut r = Rollout::start(spec(), t0).unwrap();
    assert!(r.abort());
    assert_eq!((r.share(), r.phase.clone()), (0, Phase::Aborted));
    assert!(!r.pause());
}

#[test]
fn a_restored_rollout_keeps_its_step_and_counts_it_again() {
    let t0 = Instant::now();
    let r = Rollout::at(spec(), Phase::Running { step: 2 }, t0);
    assert_eq!((r.share(), r.serving.requests()), (50, 0));
    // Restored at 100%, with no serving answers to compare: promoted on time and count.
    let mut r = Rollout::at(spec(), Phase::Running { step: 3 }, t0);
    feed(&mut r, 60, 0, 1);
    assert_eq!(r.serving.requests(), 0);
    assert_eq!(r.tick(t0 + STEP), Decision::Promote);
}

#[test]
fn at_100_percent_the_candidate_is_judged_against_the_step_before() {
    let t0 = Instant::now();
    let mut r = Rollout::at(spec(), Phase::Running { step: 2 }, t0);
    feed(&mut r, 60, 0, 1);
    assert_eq!(r.tick(t0 + STEP), Decision::Advance { step: 3, share: 100 });
    assert_eq!(r.serving.requests(), 60, "the baseline is kept");
    feed(&mut r, 60, 20, 1);
    assert!(
        matches!(r.tick(t0 + 2 * STEP), Decision::RollBack { .. }),
        "{:?}",
        r.phase
    );
}

#[test]
fn draws_split_at_the_share_within_statistical_bounds() {
    let mut rng = StdRng::seed_from_u64(59);
    for share in [5u8, 25, 50, 100] {
        let n = 20_000;
        let to_candidate = (0..n)
            .filter(|_| arm_of_bucket(rng.random_range(0..BUCKETS), share) == Arm::Candidate)
            .count() as f64;
        let p = f64::from(share) / 100.0;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (to_candidate - n as f64 * p).abs() <= 5.0 * sd + 1.0,
            "{share}%: {to_candidate} of {n}"
        );
    }
    assert_eq!(arm_of_bucket(0, 0), Arm::Serving);
}

#[test]
fn a_clients_key_stays_on_its_side_as_the_share_rises() {
    assert_eq!(
        (bucket("client-1"), bucket("a"), bucket("")),
        (6904, 1996, 6037),
        "the same in every build"
    );
    for k in 0..2_000 {
        let key = format!("client-{k}");
        let mut was = Arm::Serving;
        for share in [5u8, 25, 50, 100] {
            let now = arm_of_key(&key, share);
            assert!(
                !(was == Arm::Candidate && now == Arm::Serving),
                "{key} went back at {share}%"
            );
            was = now;
        }
        assert_eq!(was, Arm::Candidate);
    }
}

#[test]
fn a_sequence_keeps_its_version_until_it_ends_or_goes_idle() {
    let t0 = Instant::now();
    let idle = Duration::from_secs(60);
    let mut pins = Pins::new(4, idle);
    // Sequences whose ids fall on the serving side at 5% and the candidate's at 100%.
    let seqs: Vec<String> = (0..100)
        .map(|i| format!("seq-{i}"))
        .filter(|s| arm_of_key(s, 5) == Arm::Serving)
        .take(3)
        .collect();
    for s in &seqs {
        assert_eq!(pins.arm(s, (true, false), 5, t0).0, Arm::Serving);
    }
    for s in &seqs {
        assert_eq!(
            pins.arm(s, (false, false), 100, t0 + MS).0,
            Arm::Serving,
            "mid-sequence"
        );
    }
    assert_eq!(
        pins.arm(&seqs[0], (false, true), 100, t0 + MS).0,
        Arm::Serving,
        "its END too"
    );
    assert_eq!(pins.len(), 2, "an ended sequence is let go");
    assert_eq!(
        pins.arm(&seqs[0], (true, false), 100, t0 + MS).0,
        Arm::Candidate,
        "a new START"
    );
    assert_eq!(
        pins.arm(&seqs[1], (false, false), 100, t0 + MS + idle).0,
        Arm::Serving,
        "idle: forgotten, taken for one under way on the serving version"
    );
}

#[test]
fn pins_are_bounded_and_expired_ones_make_room() {
    let t0 = Instant::now();
    let idle = Duration::from_secs(60);
    let mut pins = Pins::new(2, idle);
    pins.arm("a", (true, false), 50, t0);
    pins.arm("b", (true, false), 50, t0);
    pins.arm("c", (true, false), 50, t0);
    assert_eq!((pins.len(), pins.unpinned), (2, 1), "no room for c");
    pins.arm("d", (true, false), 50, t0 + idle);
    assert_eq!((pins.len(), pins.unpinned), (1, 1), "the idle ones were swept");
    // A START without room goes to the serving version and stays there, whatever the replicas.
    let full = (0..100)
        .map(|i| format!("s{i}"))
        .find(|k| arm_of_key(k, 50) == Arm::Candidate)
        .unwrap();
    pins.arm("e", (true, false), 50, t0 + idle);
    assert_eq!(pins.arm(&full, (true, false), 50, t0 + idle), (Arm::Serving, true));
    // A request of a sequence never pinned here (begun before): one under way on the serving version.
    assert_eq!(pins.arm("older", (false, false), 100, t0 + idle), (Arm::Serving, true));
    pins.clear();
    assert!(pins.is_empty());
}

#[test]
fn a_side_without_a_replica_gives_its_requests_to_the_other() {
    let t0 = Instant::now();
    let mut pins = Pins::new(10, Duration::from_secs(60));
    let both = |_: Arm| true;
    let only = |a: Arm| move |b: Arm| a == b;
    assert_eq!(choose(Key::Drawn(0), 50, &mut pins, t0, both), Arm::Candidate);
    assert_eq!(choose(Key::Drawn(9_999), 50, &mut pins, t0, both), Arm::Serving);
    // The candidate still loading: its share goes to the serving version.
    assert_eq!(
        choose(Key::Drawn(0), 50, &mut pins, t0, only(Arm::Serving)),
        Arm::Serving
    );
    // The serving version gone (promoted, its replicas unloaded): the candidate takes it.
    assert_eq!(
        choose(Key::Drawn(9_999), 50, &mut pins, t0, only(Arm::Candidate)),
        Arm::Candidate
    );
    // Rolled back (share 0): never the candidate, even while the serving version reloads.
    assert_eq!(
        choose(Key::Drawn(0), 0, &mut pins, t0, only(Arm::Candidate)),
        Arm::Serving
    );
    // Neither: the serving version, which routing waits for.
    assert_eq!(choose(Key::Drawn(0), 100, &mut pins, t0, |_| false), Arm::Serving);
    let key = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| arm_of_key(k, 50) == Arm::Candidate)
        .unwrap();
    assert_eq!(choose(Key::Client(&key), 50, &mut pins, t0, both), Arm::Candidate);
    assert_eq!(choose(Key::Client(&key), 25, &mut pins, t0, both), arm_of_key(&key, 25));
}

#[test]
fn a_sequence_that_went_to_the_other_side_stays_there() {
    let t0 = Instant::now();
    let mut pins = Pins::new(10, Duration::from_secs(60));
    let id = (0..100)
        .map(|i| format!("s{i}"))
        .find(|k| arm_of_key(k, 50) == Arm::Candidate)
        .unwrap();
    let seq = |start, end| Key::Sequence { id: &id, start, end };
    // Its START found the candidate without a replica: it runs on the serving version...
    assert_eq!(
        choose(seq(true, false), 50, &mut pins, t0, |a| a == Arm::Serving),
        Arm::Serving
    );
    // ...and stays there once the candidate is ready, to its END.
    assert_eq!(
        choose(seq(false, false), 50, &mut pins, t0 + MS, |_| true),
        Arm::Serving
    );
    assert_eq!(choose(seq(false, true), 50, &mut pins, t0 + MS, |_| true), Arm::Serving);
    assert!(pins.is_empty(), "its END lets it go");
    // A sequence under way on the candidate stays there when its replicas go (its state is
    // there: routing waits or fails), and after a rollback too, to its END.
    assert_eq!(choose(seq(true, false), 50, &mut pins, t0, |_| true), Arm::Candidate);
    assert_eq!(
        choose(seq(false, false), 50, &mut pins, t0, |a| a == Arm::Serving),
        Arm::Candidate
    );
    assert_eq!(choose(seq(false, false), 0, &mut pins, t0, |_| true), Arm::Candidate);
    // A new one at share 0 never goes there.
    assert_eq!(choose(seq(true, false), 0, &mut pins, t0, |_| true), Arm::Serving);
}

#[test]
fn the_guard_counts_what_a_client_cannot_steer() {
    use super::split::counted;
    assert_eq!(counted(Ok(()), false, false), Some(true));
    assert_eq!(
        counted(Err(Code::Internal), false, false),
        Some(false),
        "the server's, keyed or not"
    );
    assert_eq!(counted(Err(Code::Unavailable), true, false), Some(false));
    assert_eq!(
        counted(Err(Code::InvalidArgument), true, false),
        Some(false),
        "drawn: on both alike"
    );
    assert_eq!(
        counted(Err(Code::InvalidArgument), false, false),
        None,
        "keyed: the client chose the side"
    );
    assert_eq!(
        counted(Err(Code::Unavailable), false, true),
        Some(true),
        "its own deadline: a latency sample"
    );
}

#[test]
fn only_the_servers_failures_of_a_request_that_may_run_again_go_to_the_serving_version() {
    for code in [
        Code::Internal,
        Code::Unavailable,
        Code::Overloaded,
        Code::Unknown,
        Code::NotFound,
    ] {
        assert!(retry_on_serving(code, false, 0, true), "{code:?}");
    }
    for code in [
        Code::InvalidArgument,
        Code::Unsupported,
        Code::AlreadyExists,
        Code::Cancelled,
        Code::PayloadTooLarge,
    ] {
        assert!(!retry_on_serving(code, false, 0, true), "{code:?} is the client's");
    }
    assert!(
        !retry_on_serving(Code::Internal, true, 0, true),
        "a sequence's state is on the candidate"
    );
    assert!(
        !retry_on_serving(Code::Internal, false, 1, true),
        "a stream that answered"
    );
    assert!(
        !retry_on_serving(Code::Internal, false, 0, false),
        "it ran, and may not run twice"
    );
    assert!(
        retry_on_serving(Code::Overloaded, false, 0, false),
        "refused: it never ran"
    );
}
