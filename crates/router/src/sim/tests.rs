//! Fault scenarios on the simulated cluster, each run for several seeds.
use std::time::Duration;

use mesh::Code;

use super::*;
use crate::membership::NodeState;

const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn assert_no_errors(sim: &Sim) {
    sim.assert_one_answer_each();
    let errors = sim.errors();
    assert!(
        errors.is_empty(),
        "seed {}: {} requests failed, the first: {:?}",
        sim.seed,
        errors.len(),
        errors.first()
    );
}

/// The node that answered request `r` (panics, naming the seed, when it failed).
fn answered_by(sim: &Sim, r: &Req) -> String {
    match &r.outcome {
        Some(Ok(node)) => node.clone(),
        other => panic!("seed {}: expected an answer, got {other:?}", sim.seed),
    }
}

/// Requests whose first attempt went to `node` at or after `from`.
fn first_sent_to<'a>(sim: &'a Sim, node: &str, from: Duration) -> Vec<&'a Req> {
    sim.requests
        .iter()
        .filter(|r| r.sends.first().is_some_and(|(t, n)| n == node && *t >= from))
        .collect()
}

fn two_replicas(seed: u64, service_ms: u64) -> (Sim, usize, usize) {
    let mut sim = Sim::new(seed);
    let a = sim.add_node("a", &[("m", service_ms)], 8);
    let b = sim.add_node("b", &[("m", service_ms)], 8);
    (sim, a, b)
}

#[test]
fn a_killed_replica_loses_no_request() {
    for seed in SEEDS {
        let (mut sim, a, _) = two_replicas(seed, 20);
        sim.add_node("c", &[("other", 5)], 8);
        sim.load("m", ms(5), ms(100), ms(3000), secs(5));
        sim.load("other", ms(50), ms(100), ms(3000), secs(5));
        sim.at(ms(1500), move |sim| sim.kill(a));
        sim.run_until(secs(10));
        assert_no_errors(&sim);
        let caught = first_sent_to(&sim, "a", ms(1500));
        assert!(!caught.is_empty(), "seed {seed}: some requests went to the dead node");
        assert!(
            caught.iter().all(|r| r.sends.len() == 2),
            "seed {seed}: each was retried once"
        );
        // Retried: those sent after the kill and those running on the node when it died, nothing else.
        assert!(sim.retried() >= caught.len(), "seed {seed}");
        for r in sim.requests.iter().filter(|r| r.sends.len() > 1) {
            assert_eq!(r.sends[0].1, "a", "seed {seed}");
            assert!(r.sends[0].0 >= ms(1400), "seed {seed}: sent at {:?}", r.sends[0].0);
            assert!(
                r.sends[1].0 >= ms(2500),
                "seed {seed}: retried only once the link was lost"
            );
            assert_eq!(answered_by(&sim, r), "b", "seed {seed}");
        }
        assert_eq!(sim.sends_to("a", ms(2500)), 0, "seed {seed}: a lost node gets no picks");
        assert_eq!(sim.membership.state("a"), Some(NodeState::Lost), "seed {seed}");
    }
}

#[test]
fn a_frozen_node_is_retried_around_after_its_link_idles_out() {
    for seed in SEEDS {
        let (mut sim, a, _) = two_replicas(seed, 20);
        sim.load("m", ms(5), ms(100), ms(3000), secs(5));
        sim.at(ms(1200), move |sim| sim.freeze(a));
        sim.run_until(secs(10));
        assert_no_errors(&sim);
        let stuck = first_sent_to(&sim, "a", ms(1200));
        assert!(!stuck.is_empty(), "seed {seed}: some requests went to the frozen node");
        for r in stuck {
            assert_eq!(r.sends.len(), 2, "seed {seed}");
            assert!(
                r.sends[1].0 >= ms(2200),
                "seed {seed}: retried after the loss, not before"
            );
            assert_eq!(answered_by(&sim, r), "b", "seed {seed}");
        }
        // The router's own in-flight count steers picks away from the node that stopped answering.
        let window = sim.sends_to("a", ms(1200)) - sim.sends_to("a", ms(2200));
        assert!(
            window < 40,
            "seed {seed}: {window} of ~200 picks went to the frozen node"
        );
    }
}

#[test]
fn a_silent_node_gets_no_picks_before_its_link_idles_out() {
    for seed in SEEDS {
        let (mut sim, a, _) = two_replicas(seed, 20);
        sim.idle_timeout = secs(4);
        sim.load("m", ms(5), ms(100), ms(4000), secs(8));
        sim.at(ms(1000), move |sim| sim.freeze(a));
        sim.at(ms(3100), |sim| {
            assert_eq!(sim.membership.state("a"), Some(NodeState::Silent), "seed {}", sim.seed)
        });
        sim.run_until(secs(12));
        assert_no_errors(&sim);
        // The last report left before 1 s; silence (2 s) is declared by the 3.01 s tick at the latest.
        assert_eq!(sim.sends_to("a", ms(3010)), 0, "seed {}", seed);
        for r in first_sent_to(&sim, "a", ms(1000)) {
            assert!(r.sends[1].0 >= ms(5000), "seed {seed}: retried when the link was lost");
        }
    }
}

#[test]
fn a_draining_node_gets_no_new_picks_and_finishes_its_work() {
    for seed in SEEDS {
        let (mut sim, a, _) = two_replicas(seed, 50);
        sim.load("m", ms(5), ms(100), ms(3000), secs(5));
        sim.at(ms(1000), move |sim| sim.drain(a));
        sim.run_until(secs(10));
        assert_no_errors(&sim);
        // The router hears of draining 1 ms after the node starts it.
        assert_eq!(sim.sends_to("a", ms(1002)), 0, "seed {seed}");
        let finished_on_a = sim
            .requests
            .iter()
            .filter(|r| r.sends.len() == 1 && r.sends[0].1 == "a" && r.sends[0].0 < ms(1000))
            .filter(|r| r.finished_at.unwrap() > ms(1000))
            .inspect(|r| assert_eq!(answered_by(&sim, r), "a", "seed {seed}"))
            .count();
        assert!(
            finished_on_a > 0,
            "seed {seed}: requests in flight at the drain finished on a"
        );
        assert_eq!(
            sim.membership.state("a"),
            Some(NodeState::Left),
            "seed {seed}: left after its goodbye"
        );
    }
}

#[test]
fn rejoin_and_restart_end_routable_with_the_old_links_closed() {
    for seed in SEEDS {
        let (mut sim, a, _) = two_replicas(seed, 20);
        sim.load("m", ms(5), ms(100), ms(4000), secs(5));
        sim.at(ms(1000), move |sim| sim.partition(a));
        sim.at(ms(1300), move |sim| sim.dial(a));
        sim.at(ms(2000), move |sim| sim.kill(a));
        sim.at(ms(2200), move |sim| sim.start_process(a, 2));
        sim.at(ms(1500), move |sim| {
            assert_eq!(sim.membership.state("a"), Some(NodeState::Up), "seed {}", sim.seed);
            assert_eq!(
                sim.closed_on_join.len(),
                1,
                "seed {}: the partitioned link closed",
                sim.seed
            );
        });
        sim.run_until(secs(10));
        assert_no_errors(&sim);
        let current = sim.nodes[a].link.unwrap();
        assert_eq!(sim.closed_on_join.len(), 2, "seed {seed}");
        for &old in &sim.closed_on_join {
            assert!(!sim.link_open(old), "seed {seed}: link {old} closed");
            assert_ne!(old, current, "seed {seed}");
        }
        // The old links' idle timeouts fired after they were replaced and changed nothing.
        assert_eq!(sim.membership.state("a"), Some(NodeState::Up), "seed {seed}");
        assert_eq!(sim.membership.node_of(current), Some("a"), "seed {seed}");
        assert!(
            sim.sends_to("a", ms(2300)) > 20,
            "seed {seed}: the restarted node takes traffic"
        );
        assert!(
            sim.sends_to("a", ms(1400)) > sim.sends_to("a", ms(2000)),
            "seed {seed}: rejoined took traffic"
        );
        let incarnation = sim
            .membership
            .nodes(sim.now())
            .into_iter()
            .find(|n| n.name == "a")
            .unwrap()
            .incarnation;
        assert_eq!(incarnation, 2, "seed {seed}");
    }
}

#[test]
fn a_non_idempotent_request_lost_with_its_node_fails_clearly_and_runs_once() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed);
        sim.non_idempotent("once");
        let a = sim.add_node("a", &[("once", 500)], 8);
        sim.add_node("b", &[("once", 500)], 8);
        sim.load("once", ms(20), ms(100), ms(290), secs(5));
        sim.at(ms(300), move |sim| sim.kill(a));
        sim.run_until(secs(5));
        sim.assert_one_answer_each();
        let mut lost = 0;
        for (i, r) in sim.requests.iter().enumerate() {
            assert!(r.executions <= 1, "seed {seed}: request {i} ran {} times", r.executions);
            assert_eq!(r.sends.len(), 1, "seed {seed}: request {i} was sent again");
            match (&r.outcome, r.sends[0].1.as_str()) {
                (Some(Ok(node)), "b") => assert_eq!(node, "b"),
                (Some(Err(e)), "a") => {
                    lost += 1;
                    assert_eq!(e.code, Code::Unavailable, "seed {seed}");
                    assert!(
                        e.message
                            .contains("may have run and the model is marked non-idempotent"),
                        "seed {seed}: {}",
                        e.message
                    );
                }
                other => panic!("seed {seed}: request {i}: unexpected {other:?}"),
            }
        }
        assert!(lost > 0, "seed {seed}: some requests were on the killed node");
    }
}

#[test]
fn an_overloaded_node_is_busy_not_quarantined_and_gets_traffic_again() {
    for seed in SEEDS {
        let (mut sim, a, _) = two_replicas(seed, 10);
        sim.run_until(ms(50));
        let link = sim.nodes[a].link.unwrap();
        sim.load("m", ms(5), ms(100), ms(3000), secs(5));
        sim.at(ms(500), move |sim| sim.overload(a, ms(1500)));
        for t in (600..1500).step_by(100) {
            sim.at(ms(t), move |sim| {
                let now = sim.now();
                assert!(!sim.balancer.is_quarantined(link, now), "seed {}", sim.seed);
            });
        }
        sim.run_until(secs(10));
        assert_no_errors(&sim);
        let refused: Vec<&Req> = first_sent_to(&sim, "a", ms(500))
            .into_iter()
            .filter(|r| r.sends[0].0 < ms(1500))
            .collect();
        assert!(!refused.is_empty(), "seed {seed}: the overloaded node refused some");
        for r in &refused {
            assert_eq!(answered_by(&sim, r), "b", "seed {seed}: retried elsewhere");
        }
        // Busy for 250 ms after each refusal: a few probes, not half of ~200 picks.
        let during = sim.sends_to("a", ms(600)) - sim.sends_to("a", ms(1500));
        assert!(during < 20, "seed {seed}: {during} picks of a busy node");
        assert!(
            sim.sends_to("a", ms(1800)) > 100,
            "seed {seed}: a gets traffic once no longer busy"
        );
    }
}

#[test]
fn with_the_only_replica_gone_a_request_waits_to_its_deadline() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed);
        let a = sim.add_node("a", &[("m", 10)], 2);
        // Killed at 0.5 s, lost at 1.5 s (idle timeout): the model is still known, so requests wait.
        sim.at(ms(500), move |sim| sim.kill(a));
        let r = sim.request("m", ms(1600), secs(1));
        sim.run_until(secs(4));
        sim.assert_one_answer_each();
        let req = &sim.requests[r];
        let e = req.outcome.as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(e.code, Code::Unavailable, "seed {seed}");
        assert!(e.message.contains("deadline passed"), "seed {seed}: {}", e.message);
        assert!(e.message.contains("node 'a' was lost"), "seed {seed}: {}", e.message);
        let at = req.finished_at.unwrap();
        assert!(
            at >= ms(2600) && at <= ms(2600) + TICK,
            "seed {seed}: gave up at {at:?}"
        );
        assert!(req.sends.is_empty(), "seed {seed}");
        // An unknown model is answered at once, without waiting.
        let mut sim = Sim::new(seed);
        sim.add_node("a", &[("m", 10)], 2);
        let r = sim.request("nope", ms(100), secs(1));
        sim.run_until(secs(2));
        let req = &sim.requests[r];
        assert_eq!(req.outcome.as_ref().unwrap().as_ref().unwrap_err().code, Code::NotFound);
        assert_eq!(req.finished_at, Some(ms(100)), "seed {seed}");
    }
}

#[test]
fn a_waiting_request_succeeds_when_a_replica_joins_before_its_deadline() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed);
        let a = sim.add_node("a", &[("m", 300)], 2);
        // One request arrives after the only replica was lost; one is in flight on it when it dies.
        sim.at(ms(500), move |sim| sim.kill(a));
        let waiting = sim.request("m", ms(1600), secs(3));
        let mut sim2 = Sim::new(seed);
        let a2 = sim2.add_node("a", &[("m", 300)], 2);
        let in_flight = sim2.request("m", ms(100), secs(5));
        sim2.at(ms(200), move |sim| sim.kill(a2));
        for s in [&mut sim, &mut sim2] {
            s.at(ms(2000), |sim| {
                sim.add_node("c", &[("m", 10)], 2);
            });
            s.run_until(secs(6));
            s.assert_one_answer_each();
        }
        assert_eq!(answered_by(&sim, &sim.requests[waiting]), "c", "seed {seed}");
        let r = &sim2.requests[in_flight];
        assert_eq!(answered_by(&sim2, r), "c", "seed {seed}");
        assert_eq!(
            r.sends.iter().map(|s| s.1.as_str()).collect::<Vec<_>>(),
            ["a", "c"],
            "seed {seed}"
        );
    }
}
