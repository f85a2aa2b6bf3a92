//! Tests of eviction (LRU, spare replicas, `min_age`), drains and rebalancing moves (make-before-break,
//! `max_moves`), on a fake clock.
use std::collections::BTreeMap;
use std::time::Instant;

use super::tests::{draining, model, ms, node, placer, replicas, run, secs, settle, show, view_of};
use super::*;

/// Replicas per node, any state.
fn per_node(p: &Placer) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for v in p.view() {
        for r in v.replicas {
            *out.entry(r.node).or_default() += 1;
        }
    }
    out
}

fn spec(name: &str, min: u32) -> ModelSpec {
    model(name, min, 100)
}

#[test]
fn a_draining_node_is_emptied_make_before_break_then_reported_drained_once() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000)];
    let mut p = placer(nodes.clone(), vec![spec("m", 2)], t0);
    let now = run(&mut p, t0, 2);
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:ready"]);
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 4000), node("c", 3000)], now);
    assert_eq!(show(&p.tick(now)), ["load m@c"], "the new replica first");
    assert!(p
        .events()
        .iter()
        .any(|e| e.kind == EventKind::Move && e.node == "c" && e.detail == "from a"));
    assert!(p.tick(now + ms(200)).is_empty(), "a stays until c is Ready");
    assert_eq!(view_of(&p, "m").replicas[2].reason, "replaces the copy on a");
    p.observed("c", "m", Observed::Ready, now + ms(300));
    assert_eq!(show(&p.tick(now + ms(400))), ["unload m@a"]);
    assert!(
        p.tick(now + ms(600)).is_empty(),
        "not drained while the unload is outstanding"
    );
    p.observed("a", "m", Observed::Absent, now + ms(700));
    assert_eq!(show(&p.tick(now + ms(800))), ["drained a"]);
    assert!(p.tick(now + secs(1)).is_empty(), "once");
    assert!(p.events().iter().any(|e| e.kind == EventKind::Drained && e.node == "a"));
    // Up again, then draining again: reported again.
    p.set_nodes(nodes, now + secs(2));
    assert!(p.tick(now + secs(2)).is_empty());
    p.set_nodes(
        vec![draining(node("a", 5000)), node("b", 4000), node("c", 3000)],
        now + secs(3),
    );
    assert_eq!(show(&p.tick(now + secs(3))), ["drained a"]);
}

#[test]
fn a_node_holding_nothing_drains_at_once_and_gets_nothing_new() {
    let t0 = Instant::now();
    let mut p = placer(vec![draining(node("a", 9000)), node("b", 1000)], vec![spec("m", 2)], t0);
    assert_eq!(show(&p.tick(t0)), ["drained a", "load m@b"]);
    assert_eq!(view_of(&p, "m").reason, "wants 2 replicas, only 1 node can hold it");
}

#[test]
fn drain_moves_respect_max_moves() {
    let t0 = Instant::now();
    let models: Vec<ModelSpec> = ["m1", "m2", "m3", "m4", "m5"].iter().map(|m| spec(m, 1)).collect();
    let mut p = placer(vec![node("a", 5000)], models.clone(), t0);
    let now = run(&mut p, t0, 2);
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 5000)], now);
    let first = p.tick(now);
    assert_eq!(show(&first), ["load m1@b", "load m2@b"]);
    assert!(view_of(&p, "m3").reason.contains("waiting to move off draining node a"));
    assert!(p.tick(now + ms(200)).is_empty());
    // One move done: its old copy goes and one more move starts.
    p.observed("b", "m1", Observed::Ready, now + ms(300));
    let second = p.tick(now + ms(400));
    assert_eq!(show(&second), ["load m3@b", "unload m1@a"]);
    settle(&mut p, &first, now + ms(500));
    settle(&mut p, &second, now + ms(500));
    let end = run(&mut p, now + ms(500), 20);
    assert!(p.events().iter().any(|e| e.kind == EventKind::Drained && e.node == "a"));
    assert_eq!(per_node(&p), BTreeMap::from([("b".to_string(), 5)]));
    assert!(p.tick(end + ms(200)).is_empty());
}

#[test]
fn a_replica_no_other_node_can_hold_stays_on_a_draining_node() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 5000), node("b", 5000)], vec![spec("m", 2)], t0);
    let now = run(&mut p, t0, 2);
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 5000)], now);
    let now = run(&mut p, now, 10);
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:ready"]);
    assert_eq!(
        view_of(&p, "m").reason,
        "cannot move off draining node a: no other node can hold it"
    );
    assert!(p.events().iter().all(|e| e.kind != EventKind::Drained));
    // A node joins: the move happens and the drain completes.
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 5000), node("c", 5000)], now);
    run(&mut p, now, 5);
    assert_eq!(replicas(&p, "m"), ["b:ready", "c:ready"]);
    assert!(p.events().iter().any(|e| e.kind == EventKind::Drained && e.node == "a"));
}

#[test]
fn a_load_on_a_node_that_starts_draining_is_cancelled() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 5000), node("b", 4000)], vec![spec("m", 1)], t0);
    assert_eq!(show(&p.tick(t0)), ["load m@a"]);
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 4000)], t0 + ms(100));
    assert_eq!(show(&p.tick(t0 + ms(200))), ["load m@b", "unload m@a"]);
}

#[test]
fn a_failed_move_keeps_the_old_replica_and_tries_another_node() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000)];
    let mut p = placer(nodes, vec![spec("m", 1)], t0);
    let now = run(&mut p, t0, 2);
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 4000), node("c", 3000)], now);
    assert_eq!(show(&p.tick(now)), ["load m@b"]);
    p.observed("b", "m", Observed::Failed("no space".into()), now + ms(100));
    assert_eq!(show(&p.tick(now + ms(200))), ["load m@c"]);
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:failed", "c:loading"]);
    assert_eq!(view_of(&p, "m").reason, "last failure on b: no space");
}

#[test]
fn a_new_node_gets_replicas_gradually_until_the_spread_is_at_most_one() {
    let t0 = Instant::now();
    let models: Vec<ModelSpec> = (0..6).map(|i| spec(&format!("m{i}"), 2)).collect();
    let three = vec![node("a", 5000), node("b", 5000), node("c", 5000)];
    let mut p = placer(three.clone(), models, t0);
    let now = run(&mut p, t0, 2);
    assert_eq!(per_node(&p).values().copied().collect::<Vec<_>>(), [4, 4, 4]);
    let mut four = three;
    four.push(node("d", 5000));
    p.set_nodes(four, now);
    // Nothing moves before the replicas have been Ready for min_age (30 s).
    let now = run(&mut p, now, 100);
    assert_eq!(per_node(&p).get("d"), None);
    let mut now = now + secs(10);
    let mut moves_seen = 0;
    for _ in 0..50 {
        let actions = p.tick(now);
        let loads = actions.iter().filter(|a| matches!(a, Action::Load { .. })).count();
        moves_seen += loads;
        let in_flight = p
            .view()
            .iter()
            .flat_map(|v| v.replicas.clone())
            .filter(|r| r.state == ReplicaState::Loading)
            .count();
        assert!(in_flight <= 2, "at most max_moves moves at once");
        // Every model keeps both Ready replicas while its move is under way.
        for v in p.view() {
            assert!(
                v.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count() >= 2,
                "{v:?}"
            );
        }
        settle(&mut p, &actions, now + ms(100));
        now += ms(200);
    }
    assert_eq!(moves_seen, 3);
    assert_eq!(per_node(&p).values().copied().collect::<Vec<_>>(), [3, 3, 3, 3]);
    for v in p.view() {
        let nodes: Vec<&str> = v.replicas.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes.len(), 2, "{v:?}");
        assert_ne!(nodes[0], nodes[1]);
    }
    assert!(p.tick(now + secs(100)).is_empty(), "balanced: no more moves");
}

#[test]
fn counts_that_differ_by_one_are_balanced() {
    let t0 = Instant::now();
    let mut p = placer(
        vec![node("a", 5000), node("b", 5000)],
        vec![spec("m", 1), spec("k", 1)],
        t0,
    );
    let now = run(&mut p, t0, 2);
    p.set_models(vec![spec("m", 1), spec("k", 1), spec("j", 1)], now);
    let now = run(&mut p, now, 2);
    assert_eq!(per_node(&p).values().copied().collect::<Vec<_>>(), [2, 1]);
    assert!(p.tick(now + secs(100)).is_empty());
}

#[test]
fn a_full_cluster_evicts_the_least_recently_used_spare_replica() {
    let t0 = Instant::now();
    let models = vec![model("p", 1, 1000), model("q", 1, 1000)];
    let mut p = placer(vec![node("a", 2000), node("b", 2000)], models, t0);
    p.set_desired("p", 2);
    p.set_desired("q", 2);
    let now = run(&mut p, t0, 5);
    assert_eq!(replicas(&p, "p"), ["a:ready", "b:ready"]);
    assert_eq!(replicas(&p, "q"), ["a:ready", "b:ready"]);
    p.used("q", now + secs(50));
    p.used("p", now + secs(60));
    let now = now + secs(60);
    p.set_models(vec![model("p", 1, 1000), model("q", 1, 1000), model("r", 1, 1000)], now);
    let evict = p.tick(now);
    assert_eq!(show(&evict), ["unload q@a"], "q is the least recently used");
    assert!(p
        .events()
        .iter()
        .any(|e| e.kind == EventKind::Evict && e.model == "q" && e.detail == "evicted for r"));
    // Nothing more while the unload is outstanding: no second victim, no load over capacity.
    assert!(p.tick(now + ms(200)).is_empty());
    p.observed("a", "q", Observed::Absent, now + ms(300));
    assert_eq!(show(&p.tick(now + ms(400))), ["load r@a"]);
    // q (above its min, used less lately than p) does not evict p to get its second replica back.
    let now = run(&mut p, now + ms(400), 50);
    assert_eq!(replicas(&p, "p"), ["a:ready", "b:ready"]);
    assert_eq!(replicas(&p, "q"), ["b:ready"]);
    assert!(view_of(&p, "q").reason.starts_with("wants 2 replicas, 1 placed"));
    assert!(p.tick(now + secs(100)).is_empty());
}

#[test]
fn eviction_spares_young_replicas_and_models_at_their_min() {
    let t0 = Instant::now();
    let models = vec![model("p", 1, 1000), model("q", 2, 1000)];
    let mut p = placer(vec![node("a", 2000), node("b", 2000)], models, t0);
    p.set_desired("p", 2);
    let now = run(&mut p, t0, 5);
    // p has a spare replica but it is younger than min_age; q is at its min.
    p.set_models(vec![model("p", 1, 1000), model("q", 2, 1000), model("r", 1, 1000)], now);
    for s in 1..29 {
        assert!(p.tick(now + secs(s)).is_empty(), "nothing before min_age ({s} s)");
    }
    assert!(view_of(&p, "r").reason.contains("no node has 1 GB free"));
    let actions = p.tick(now + secs(31));
    assert_eq!(actions.len(), 1);
    assert!(show(&actions)[0].starts_with("unload p@"), "{actions:?}");
}

#[test]
fn a_never_used_model_counts_as_used_when_first_placed() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 2000)], vec![model("old", 0, 1000)], t0);
    p.set_desired("old", 1);
    let now = run(&mut p, t0, 2);
    p.set_models(vec![model("old", 0, 1000), model("new", 0, 1000)], now + secs(100));
    p.set_desired("new", 1);
    let now = run(&mut p, now + secs(100), 2);
    p.used("new", now);
    p.set_models(
        vec![model("old", 0, 1000), model("new", 0, 1000), model("c", 1, 1000)],
        now + secs(100),
    );
    // Both are spare (min 0) and old enough; "old" was placed first and never used.
    assert_eq!(show(&p.tick(now + secs(100))), ["unload old@a"]);
}
