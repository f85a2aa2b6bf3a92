//! Tests of one request's routing rules on a fake clock, against a real membership table.
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::config::ModelConfig;
use mesh::proto::ModelParameter;
use mesh::{Code, Error};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::membership::{Membership, MembershipSettings, ModelStatus, NodeHello};
use crate::route::BalanceSettings;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn status(name: &str, version: i64, idempotent: bool) -> ModelStatus {
    let mut config = ModelConfig {
        name: name.into(),
        ..ModelConfig::default()
    };
    if !idempotent {
        let flag = ModelParameter {
            string_value: "False".into(),
        };
        config.parameters.insert("mesh.idempotent".into(), flag);
    }
    ModelStatus {
        name: name.into(),
        version,
        ready: true,
        reason: String::new(),
        config: Arc::new(config),
        placed: false,
    }
}

fn hello(name: &str, models: Vec<ModelStatus>) -> NodeHello {
    NodeHello {
        name: name.into(),
        incarnation: 1,
        address: format!("{name}:7000"),
        devices: vec![],
        models,
        memory: 0,
        key: None,
    }
}

/// A cluster of nodes (link ids 1, 2, ...) each serving the given models.
fn table(nodes: &[(&str, Vec<ModelStatus>)], t0: Instant) -> RoutingTable {
    let mut m = Membership::new(MembershipSettings::default());
    for (i, (name, models)) in nodes.iter().enumerate() {
        m.join(i as u64 + 1, hello(name, models.clone()), t0).unwrap();
    }
    m.routing_table()
}

fn no_placing(_: &str) -> bool {
    false
}

fn view<'a>(table: &'a RoutingTable, placing: &'a dyn Fn(&str) -> bool) -> View<'a, impl Fn(LinkId) -> u32> {
    View {
        table,
        placing,
        inflight: |_| 0,
    }
}

fn request(t0: Instant, sequence: Option<&str>) -> Attempts {
    Attempts::new("m", "", sequence.map(str::to_string), t0, t0 + ms(1000), ms(300))
}

fn sent_to(step: &Step) -> LinkId {
    match step {
        Step::Send { link, .. } => *link,
        other => panic!("expected a send, got {other:?}"),
    }
}

#[test]
fn a_sequence_stays_on_its_node_and_only_its_node_leaving_moves_it() {
    let replica = |link: u64, node: &str| Replica {
        link,
        node: node.into(),
        inflight: 0,
        queued: 0,
        exec_us: 0,
    };
    let three = [replica(1, "a"), replica(2, "b"), replica(3, "c")];
    let mut on = std::collections::BTreeMap::new();
    for seq in 0..300 {
        let seq = seq.to_string();
        let first = pinned(&seq, &three).unwrap();
        assert_eq!(pinned(&seq, &three), Some(first), "the same node every time");
        // The order replicas come in does not matter.
        let reversed: Vec<Replica> = three.iter().rev().cloned().collect();
        assert_eq!(pinned(&seq, &reversed), Some(first));
        *on.entry(first).or_insert(0) += 1;
        // Node c leaving moves only c's sequences; a and b keep theirs.
        let two = [replica(1, "a"), replica(2, "b")];
        if first != 3 {
            assert_eq!(
                pinned(&seq, &two),
                Some(first),
                "sequence {seq} moved off a staying node"
            );
        }
    }
    assert!(on.values().all(|&n| n > 60), "sequences spread over the nodes: {on:?}");
    assert_eq!(pinned("7", &[]), None);
}

#[test]
fn a_sequence_goes_to_its_pinned_node_and_is_never_moved() {
    let t0 = Instant::now();
    let t = table(
        &[("a", vec![status("m", 1, true)]), ("b", vec![status("m", 1, true)])],
        t0,
    );
    let balancer = Balancer::default();
    let mut rng = StdRng::seed_from_u64(1);
    for seq in ["1", "2", "'s'", "40"] {
        let replicas = t.resolve("m", "").unwrap().replicas.to_vec();
        let mut r = request(t0, Some(seq));
        let link = sent_to(&r.next(&view(&t, &no_placing), &balancer, t0, &mut rng));
        assert_eq!(Some(link), pinned(seq, &replicas), "sequence {seq}");
        r.sent(link, "x");
        let mut b = Balancer::default();
        let d = r.failed(
            link,
            Failure::NotSent("reset".into()),
            &mut b,
            &RetryPolicy::default(),
            t0,
        );
        let Decision::GiveUp(e) = d else {
            panic!("a sequence was moved")
        };
        assert!(e.message.contains("stays on its node"), "{e}");
    }
}

#[test]
fn a_request_stays_on_the_version_it_first_resolved_to() {
    let t0 = Instant::now();
    let t1 = table(&[("a", vec![status("m", 1, true)])], t0);
    let (balancer, mut rng) = (Balancer::default(), StdRng::seed_from_u64(1));
    let mut r = request(t0, None);
    let Step::Send { link, version } = r.next(&view(&t1, &no_placing), &balancer, t0, &mut rng) else {
        panic!("not sent")
    };
    assert_eq!(version, "1");
    r.sent(link, "a");
    let mut b = Balancer::default();
    assert_eq!(
        r.failed(
            link,
            Failure::Refused(Error::unavailable("draining")),
            &mut b,
            &RetryPolicy::default(),
            t0
        ),
        Decision::Retry
    );
    // Version 2 appears on another node; the retry still asks for version 1, which only a served.
    let t2 = table(
        &[("a", vec![status("m", 1, true)]), ("b", vec![status("m", 2, true)])],
        t0,
    );
    match r.next(&view(&t2, &no_placing), &b, t0 + ms(1), &mut rng) {
        Step::Wait { reason, .. } => assert!(reason.contains("every replica was tried"), "{reason}"),
        other => panic!("expected a wait, got {other:?}"),
    }
    assert_eq!(r.version(), Some("1"));
}

#[test]
fn an_unknown_model_fails_at_once_unless_it_is_being_placed() {
    let t0 = Instant::now();
    let t = table(&[("a", vec![status("other", 1, true)])], t0);
    let (balancer, mut rng) = (Balancer::default(), StdRng::seed_from_u64(1));
    match request(t0, None).next(&view(&t, &no_placing), &balancer, t0, &mut rng) {
        Step::Fail(e) => assert_eq!(e.code, Code::NotFound, "{e}"),
        other => panic!("expected NOT_FOUND, got {other:?}"),
    }
    let placing = |m: &str| m == "m";
    let mut r = request(t0, None);
    match r.next(&view(&t, &placing), &balancer, t0, &mut rng) {
        Step::Wait { reason, until } => {
            assert!(reason.contains("being placed"), "{reason}");
            assert_eq!(until, t0 + ms(300), "waits at most the route wait");
        }
        other => panic!("expected a wait, got {other:?}"),
    }
    // Still nothing when the route wait is over: UNAVAILABLE, saying why it waited.
    match r.next(&view(&t, &placing), &balancer, t0 + ms(300), &mut rng) {
        Step::Fail(e) => {
            assert_eq!(e.code, Code::Unavailable);
            assert!(e.message.contains("being placed"), "{e}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn the_wait_is_bounded_by_the_deadline_and_a_vanished_link_is_looked_at_again_soon() {
    let t0 = Instant::now();
    let t = table(&[("a", vec![status("m", 1, true)])], t0);
    let (balancer, mut rng) = (Balancer::default(), StdRng::seed_from_u64(1));
    let mut r = Attempts::new("m", "", None, t0, t0 + ms(100), ms(300));
    sent_to(&r.next(&view(&t, &no_placing), &balancer, t0, &mut rng));
    assert_eq!(
        r.vanished(t0 + ms(10)),
        Step::Wait {
            reason: "a chosen node just left".into(),
            until: t0 + ms(15)
        }
    );
    match r.vanished(t0 + ms(100)) {
        Step::Fail(e) => assert!(e.message.contains("deadline passed"), "{e}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn each_outcome_reaches_the_balancer_once_and_the_last_failure_is_named() {
    let t0 = Instant::now();
    let t = table(&[("a", vec![status("m", 1, true)])], t0);
    let retry = RetryPolicy::default();
    let mut rng = StdRng::seed_from_u64(1);
    let cases = [
        (Failure::NotSent("no stream".into()), true, false, true),
        (Failure::Lost("reset".into()), true, false, true),
        (Failure::Overloaded(Error::overloaded("queue full")), false, true, false),
        (Failure::Refused(Error::unavailable("draining")), false, false, false),
    ];
    for (failure, quarantined, busy, failover) in cases {
        let mut b = Balancer::new(BalanceSettings::default());
        let mut r = request(t0, None);
        let link = sent_to(&r.next(&view(&t, &no_placing), &b, t0, &mut rng));
        r.sent(link, "a");
        let text = failure.to_string();
        assert_eq!(r.failed(link, failure, &mut b, &retry, t0), Decision::Retry, "{text}");
        assert_eq!(b.is_quarantined(link, t0), quarantined, "{text}");
        assert_eq!(b.is_busy(link, t0), busy, "{text}");
        assert_eq!(r.failed_over(), failover, "{text}");
        // The only replica was tried: the request waits, and gives up naming the last failure.
        assert!(matches!(
            r.next(&view(&t, &no_placing), &b, t0, &mut rng),
            Step::Wait { .. }
        ));
        match r.next(&view(&t, &no_placing), &b, t0 + ms(300), &mut rng) {
            Step::Fail(e) => assert!(e.message.ends_with(&format!("last failure: {text}")), "{e}"),
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}

#[test]
fn a_model_marked_non_idempotent_is_not_retried_after_a_loss() {
    let t0 = Instant::now();
    let retry = RetryPolicy::default();
    let mut rng = StdRng::seed_from_u64(1);
    for (idempotent, retried) in [(true, true), (false, false)] {
        let t = table(
            &[
                ("a", vec![status("m", 1, idempotent)]),
                ("b", vec![status("m", 1, idempotent)]),
            ],
            t0,
        );
        let mut b = Balancer::default();
        let mut r = request(t0, None);
        let link = sent_to(&r.next(&view(&t, &no_placing), &b, t0, &mut rng));
        r.sent(link, "a");
        let d = r.failed(link, Failure::Lost("reset".into()), &mut b, &retry, t0);
        assert_eq!(d == Decision::Retry, retried, "{d:?}");
    }
}
