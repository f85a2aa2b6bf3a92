//! The routing rules the dispatcher runs, simulated under faults: sequence pinning and placement
//! waits, each run for several seeds (a failing run names its seed).
use std::collections::BTreeMap;
use std::time::Duration;

use mesh::Code;

use super::*;

const SEEDS: [u64; 5] = [11, 12, 13, 14, 15];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn sequences_stay_on_their_node_and_only_those_of_a_killed_node_fail() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed);
        for name in ["a", "b", "c"] {
            sim.add_node(name, &[("m", 15)], 8);
        }
        let b = 1;
        let mut of_sequence: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for s in 0..24 {
            let seq = format!("{}", s + 1);
            let mut t = ms(100 + s * 7);
            while t < ms(3000) {
                let r = sim.request_in("m", Some(&seq), t, secs(5));
                of_sequence.entry(seq.clone()).or_default().push(r);
                t += ms(60);
            }
        }
        sim.at(ms(1500), move |sim| sim.kill(b));
        sim.run_until(secs(8));
        sim.assert_one_answer_each();
        let mut on_b = 0;
        for (seq, reqs) in &of_sequence {
            // Before b was killed, every request of the sequence went to one node.
            let before: Vec<&str> = reqs
                .iter()
                .flat_map(|&r| &sim.requests[r].sends)
                .filter(|(t, _)| *t < ms(1500))
                .map(|(_, n)| n.as_str())
                .collect();
            let home = before[0];
            assert!(
                before.iter().all(|n| *n == home),
                "seed {seed}: sequence {seq} moved: {before:?}"
            );
            for &r in reqs {
                let req = &sim.requests[r];
                assert_eq!(req.sequence.as_deref(), Some(seq.as_str()));
                assert!(req.sends.len() <= 1, "seed {seed}: a sequence request was sent twice");
                if home != "b" {
                    // A sequence on a staying node never notices the fault.
                    assert_eq!(req.sends[0].1, home, "seed {seed}: sequence {seq}");
                    assert!(matches!(req.outcome, Some(Ok(_))), "seed {seed}: {:?}", req.outcome);
                }
            }
            if home == "b" {
                on_b += 1;
                // Its requests on b when b died fail and say so; none ran elsewhere meanwhile.
                let failed: Vec<&Error> = reqs
                    .iter()
                    .filter_map(|&r| sim.requests[r].outcome.as_ref().unwrap().as_ref().err())
                    .collect();
                assert!(!failed.is_empty(), "seed {seed}: sequence {seq} lost nothing on b");
                for e in failed {
                    assert_eq!(e.code, Code::Unavailable, "seed {seed}");
                    assert!(e.message.contains("stays on its node"), "seed {seed}: {e}");
                }
                // Once b is lost, the sequence is pinned to a node that stays.
                let last = sim.requests[*reqs.last().unwrap()].sends.last().unwrap();
                assert_ne!(
                    last.1, "b",
                    "seed {seed}: sequence {seq} still went to b at {:?}",
                    last.0
                );
            }
        }
        assert!(on_b > 0, "seed {seed}: some sequences were pinned to b");
    }
}

#[test]
fn requests_for_a_model_being_placed_wait_for_its_replicas_through_faults() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed);
        sim.add_node("other", &[("o", 5)], 4);
        sim.placing("p");
        sim.load("p", ms(20), ms(100), ms(4000), secs(5));
        // The first replica comes at 1 s and dies at 2 s; the second comes at 3 s.
        sim.at(ms(1000), |sim| {
            sim.add_node("n1", &[("p", 30)], 4);
        });
        sim.at(ms(2000), |sim| sim.kill(1));
        sim.at(ms(3000), |sim| {
            sim.add_node("n2", &[("p", 30)], 4);
        });
        sim.run_until(secs(12));
        sim.assert_one_answer_each();
        let errors = sim.errors();
        assert!(errors.is_empty(), "seed {seed}: {:?}", errors.first());
        let early = &sim.requests[0];
        assert_eq!(early.sends[0].1, "n1", "seed {seed}: the first request waited for n1");
        assert!(early.sends[0].0 >= ms(1000), "seed {seed}");
        assert!(sim.sends_to("n2", ms(3000)) > 0, "seed {seed}");

        // A model nobody places is unknown at once.
        let mut sim = Sim::new(seed);
        sim.add_node("other", &[("o", 5)], 4);
        let r = sim.request("p", ms(100), secs(5));
        sim.run_until(secs(1));
        let e = sim.requests[r].outcome.as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(e.code, Code::NotFound, "seed {seed}: {e}");
    }
}
