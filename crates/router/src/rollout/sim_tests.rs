//! Rollouts in a simulated cluster on a fake clock: three routers splitting requests with the
//! split's own code (client keys, sequences, draws), tallying answers and sending them to the
//! leader each second (some reports lost), the leader's guard ([`Rollout`]) deciding, and every
//! router seeing its decision a tick later; a leader change mid-rollout restores the rollout from
//! what was stored. A candidate is healthy, fails a fifth of its requests, or is five times slower;
//! each scenario runs for several seeds (a failing run names its seed).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mesh::Code;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::split::{choose, retry_on_serving, Key, Pins};
use super::*;

const SEEDS: [u64; 4] = [59, 60, 61, 62];
const ROUTERS: usize = 3;
/// How long a router takes to see the leader's decision (its placement tick).
const PROPAGATION: Duration = Duration::from_millis(200);
/// A request arrives every this long, at a router drawn at random.
const EVERY: Duration = Duration::from_millis(2);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Candidate {
    Healthy,
    FailsAFifth,
    FiveTimesSlower,
}

/// One simulated router: its pins and its tally since its last report.
struct Router {
    pins: Pins,
    tally: Tally,
}

/// What the clients saw, and what the run decided.
#[derive(Default)]
struct Seen {
    /// Failures clients saw: only a sequence's (its state is on the candidate; never retried).
    sequence_errors: u64,
    /// Each client key's sides, in order.
    keys: BTreeMap<String, Vec<Arm>>,
    /// Each sequence's sides.
    sequences: BTreeMap<String, Vec<Arm>>,
    /// Requests (outside sequences, which finish where they began) the candidate got after the
    /// rollout was rolled back and every router knew it.
    candidate_after_end: u64,
    /// (when, share, phase) at each decision.
    decisions: Vec<(Duration, u8, Phase)>,
    ended_at: Option<Duration>,
}

fn spec() -> Spec {
    Spec {
        model: "m".into(),
        serving: "1".into(),
        candidate: "2".into(),
        steps: vec![10, 50, 100],
        min_step_time: Duration::from_secs(5),
        min_step_requests: 300,
        guard: Guard {
            min_requests: 200,
            ..Guard::default()
        },
        shadow: 0,
    }
}

/// Runs 60 simulated seconds of traffic through a rollout of `candidate`; the leader changes at
/// `leader_change` (when given).
fn run(seed: u64, candidate: Candidate, leader_change: Option<Duration>) -> Seen {
    eprintln!("simulated rollout, seed {seed}, {candidate:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let base = Instant::now();
    let mut leader = Rollout::start(spec(), base).unwrap();
    // What every router acts on: the leader's phase as stored, seen PROPAGATION later.
    let mut stored = leader.phase.clone();
    let mut published: Vec<(Duration, Phase)> = vec![(Duration::ZERO, stored.clone())];
    let mut routers: Vec<Router> = (0..ROUTERS)
        .map(|_| Router {
            pins: Pins::new(1000, Duration::from_secs(60)),
            tally: Tally::new("1", "2", 0),
        })
        .collect();
    let mut seen = Seen::default();
    let mut open_sequences: Vec<(String, u32, usize)> = Vec::new();
    let (mut t, mut next_report, mut next_seq) = (Duration::ZERO, Duration::from_secs(1), 0);
    while t < Duration::from_secs(60) {
        let now = base + t;
        let phase = published
            .iter()
            .rev()
            .find(|(at, _)| *at + PROPAGATION <= t)
            .map(|(_, p)| p.clone());
        let share = phase
            .as_ref()
            .map_or(0, |p| Rollout::at(spec(), p.clone(), now).share());
        let mut r = rng.random_range(0..ROUTERS);
        // 30% of requests carry one of 200 client keys, 10% belong to a sequence of 5 requests.
        let roll = rng.random_range(0..100);
        let (key_name, key) = if roll < 30 {
            let k = format!("client-{}", rng.random_range(0..200));
            (Some(k.clone()), Some(k))
        } else {
            (None, None)
        };
        let sequence = if (30..40).contains(&roll) {
            if open_sequences.len() < 20 {
                next_seq += 1;
                open_sequences.push((format!("seq-{next_seq}"), 0, 0));
            }
            let i = rng.random_range(0..open_sequences.len());
            open_sequences[i].1 += 1;
            let (id, n, via) = open_sequences[i].clone();
            if n == 1 {
                open_sequences[i].2 = r;
            } else {
                // A sequence's requests come through the router its first one did (one connection).
                r = via;
            }
            if n == 5 {
                open_sequences.swap_remove(i);
            }
            Some((id, n == 1, n == 5))
        } else {
            None
        };
        let k = match (&sequence, &key) {
            (Some((id, start, end)), _) => Key::Sequence {
                id,
                start: *start,
                end: *end,
            },
            (None, Some(k)) => Key::Client(k),
            (None, None) => Key::Drawn(rng.random()),
        };
        let arm = choose(k, share, &mut routers[r].pins, now, |_| true);
        if let Some(k) = key_name {
            seen.keys.entry(k).or_default().push(arm);
        }
        if let Some((id, ..)) = &sequence {
            seen.sequences.entry(id.clone()).or_default().push(arm);
        }
        let after_end = seen.ended_at.is_some_and(|at| t > at + PROPAGATION + EVERY);
        if after_end && arm == Arm::Candidate && share == 0 && sequence.is_none() {
            seen.candidate_after_end += 1;
        }
        // The version answers; a candidate failure is retried on the serving version where safe.
        let jitter = Duration::from_micros(rng.random_range(8_000..12_000));
        let (ok, latency) = match (arm, candidate) {
            (Arm::Serving, _) | (Arm::Candidate, Candidate::Healthy) => (true, jitter),
            (Arm::Candidate, Candidate::FailsAFifth) => (rng.random_range(0..5) != 0, jitter),
            (Arm::Candidate, Candidate::FiveTimesSlower) => (true, jitter * 5),
        };
        routers[r].tally.record(arm, ok, latency);
        if !ok {
            if retry_on_serving(Code::Internal, sequence.is_some(), 0, true) {
                routers[r].tally.record(Arm::Serving, true, jitter);
            } else {
                assert!(sequence.is_some(), "only a sequence's request is not retried");
                seen.sequence_errors += 1;
            }
        }
        // Each second every router reports its tally (one report in ten is lost); the leader judges.
        if t >= next_report {
            next_report += Duration::from_secs(1);
            for router in &mut routers {
                let tally = std::mem::replace(&mut router.tally, Tally::new("1", "2", 0));
                if rng.random_range(0..10) != 0 {
                    leader.add(&tally);
                }
            }
            if leader_change.is_some_and(|at| t >= at && t < at + Duration::from_secs(1)) {
                // A new leader carries on from what was stored; its step's count starts over.
                leader = Rollout::at(spec(), stored.clone(), now);
            }
            let decision = leader.tick(now);
            if decision != Decision::Stay {
                stored = leader.phase.clone();
                published.push((t, stored.clone()));
                seen.decisions.push((t, leader.share(), stored.clone()));
                if !leader.is_open() {
                    seen.ended_at = Some(t);
                }
            }
        }
        t += EVERY;
    }
    seen
}

fn assert_sticky(seed: u64, seen: &Seen) {
    for (key, arms) in &seen.keys {
        let back = arms.windows(2).any(|w| w[0] == Arm::Candidate && w[1] == Arm::Serving);
        let ended = seen.decisions.last().is_some_and(|(_, share, _)| *share == 0);
        assert!(
            !back || ended,
            "seed {seed}: client {key} went back to the serving version: {arms:?}"
        );
    }
    for (id, arms) in &seen.sequences {
        assert!(
            arms.iter().all(|a| *a == arms[0]),
            "seed {seed}: sequence {id} changed version: {arms:?}"
        );
    }
}

#[test]
fn a_healthy_candidate_is_promoted_step_by_step_on_every_router() {
    for seed in SEEDS {
        let seen = run(seed, Candidate::Healthy, None);
        let shares: Vec<u8> = seen.decisions.iter().map(|(_, s, _)| *s).collect();
        assert_eq!(shares, [50, 100, 100], "seed {seed}: {:?}", seen.decisions);
        assert_eq!(seen.decisions.last().unwrap().2, Phase::Promoted, "seed {seed}");
        assert_eq!(seen.sequence_errors, 0);
        assert_sticky(seed, &seen);
    }
}

#[test]
fn a_candidate_failing_a_fifth_is_rolled_back_early_and_clients_see_no_error() {
    for seed in SEEDS {
        let seen = run(seed, Candidate::FailsAFifth, None);
        let [(at, 0, Phase::RolledBack { reason })] = seen.decisions.as_slice() else {
            panic!("seed {seed}: {:?}", seen.decisions)
        };
        assert!(reason.contains("version 2 failed"), "seed {seed}: {reason}");
        // At 10% the candidate needs about 2 000 requests (4 s of traffic) for its 200 answers,
        // reported each second: rolled back in the first step, well before its 5 s are up.
        assert!(*at < Duration::from_secs(8), "seed {seed}: rolled back at {at:?}");
        // Every failure outside a sequence was answered by the serving version (the run would
        // have stopped at its assertion); a sequence on the candidate sees its failures.
        assert!(seen.sequence_errors < 20, "seed {seed}: {}", seen.sequence_errors);
        assert_eq!(seen.candidate_after_end, 0, "seed {seed}");
        assert_sticky(seed, &seen);
    }
}

#[test]
fn a_candidate_five_times_slower_is_rolled_back_for_its_latency() {
    for seed in SEEDS {
        let seen = run(seed, Candidate::FiveTimesSlower, None);
        let [(_, 0, Phase::RolledBack { reason })] = seen.decisions.as_slice() else {
            panic!("seed {seed}: {:?}", seen.decisions)
        };
        assert!(reason.contains("p99 latency"), "seed {seed}: {reason}");
        assert_eq!(seen.candidate_after_end, 0, "seed {seed}");
    }
}

#[test]
fn a_leader_change_keeps_the_step_and_only_restarts_its_count() {
    for seed in SEEDS {
        let seen = run(seed, Candidate::Healthy, Some(Duration::from_secs(10)));
        let shares: Vec<u8> = seen.decisions.iter().map(|(_, s, _)| *s).collect();
        assert_eq!(shares, [50, 100, 100], "seed {seed}: {:?}", seen.decisions);
        // The change came during the 50% step (after its first advance), which started over then
        // and ran its 5 s again: it would have advanced by about 13 s otherwise.
        let (advanced, ..) = seen.decisions[0];
        assert!(advanced < Duration::from_secs(10), "seed {seed}: {:?}", seen.decisions);
        let (next, ..) = seen.decisions[1];
        assert!(next >= Duration::from_secs(15), "seed {seed}: {next:?}");
        assert_sticky(seed, &seen);
    }
}
