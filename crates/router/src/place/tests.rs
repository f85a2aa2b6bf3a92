//! Tests of the placement rules (bounds, eligibility, loads, scale down, lost nodes, foreign models, removal,
//! idempotence, events), on a fake clock, and the helpers the other placement tests share.
use std::time::{Duration, Instant};

use super::*;

pub(super) const MB: u64 = 1_000_000;

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A CPU node offering `mb` megabytes.
pub(super) fn node(name: &str, mb: u64) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        gpus: 0,
        memory: mb * MB,
        state: NodeState::Up,
    }
}

pub(super) fn draining(mut n: NodeSpec) -> NodeSpec {
    n.state = NodeState::Draining;
    n
}

/// A CPU model of `mb` megabytes with `min` replicas.
pub(super) fn model(name: &str, min: u32, mb: u64) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        min: Some(min),
        max: None,
        footprint: mb * MB,
        needs_gpu: false,
    }
}

pub(super) fn settings() -> PlaceSettings {
    PlaceSettings {
        history: 1000,
        ..PlaceSettings::default()
    }
}

pub(super) fn placer(nodes: Vec<NodeSpec>, models: Vec<ModelSpec>, t0: Instant) -> Placer {
    let mut p = Placer::new(settings());
    p.set_nodes(nodes, t0);
    p.set_models(models, t0);
    p
}

/// Actions as short strings: "load m@a", "unload m@a", "drained a".
pub(super) fn show(actions: &[Action]) -> Vec<String> {
    let mut out: Vec<String> = actions
        .iter()
        .map(|a| match a {
            Action::Load { model, node } => format!("load {model}@{node}"),
            Action::Unload { model, node } => format!("unload {model}@{node}"),
            Action::Drained { node } => format!("drained {node}"),
        })
        .collect();
    out.sort();
    out
}

/// Every Load answered Ready and every Unload answered Absent at `now`.
pub(super) fn settle(p: &mut Placer, actions: &[Action], now: Instant) {
    for a in actions {
        match a {
            Action::Load { model, node } => p.observed(node, model, Observed::Ready, now),
            Action::Unload { model, node } => p.observed(node, model, Observed::Absent, now),
            Action::Drained { .. } => {}
        }
    }
}

/// Ticks every 200 ms from `t` for `rounds`, answering every action at once; returns the last `now`.
pub(super) fn run(p: &mut Placer, t: Instant, rounds: u32) -> Instant {
    let mut now = t;
    for _ in 0..rounds {
        now += ms(200);
        let actions = p.tick(now);
        settle(p, &actions, now);
    }
    now
}

pub(super) fn view_of(p: &Placer, name: &str) -> ModelView {
    p.view().into_iter().find(|v| v.name == name).expect("model in view")
}

/// The model's replicas as "node:state", sorted by node.
pub(super) fn replicas(p: &Placer, name: &str) -> Vec<String> {
    view_of(p, name)
        .replicas
        .iter()
        .map(|r| format!("{}:{}", r.node, r.state.as_str()))
        .collect()
}

#[test]
fn wanted_is_the_desired_count_clamped_into_the_bounds() {
    let t0 = Instant::now();
    let mut spec = model("m", 0, 100);
    spec.min = None;
    let mut p = placer(vec![], vec![spec, model("odd", 3, 100)], t0);
    assert_eq!(p.bounds("m"), Some((2, 4)), "the defaults");
    assert_eq!(p.wanted("m"), Some(2), "min without a desired count");
    p.set_desired("m", 10);
    assert_eq!(p.wanted("m"), Some(4));
    p.set_desired("m", 0);
    assert_eq!(p.wanted("m"), Some(2));
    p.set_desired("m", 3);
    assert_eq!(p.wanted("m"), Some(3));
    // A spec whose max is below its min: max = min.
    let mut odd = model("odd", 3, 100);
    odd.max = Some(1);
    p.set_models(vec![model("m", 2, 100), odd], t0);
    assert_eq!(p.bounds("odd"), Some((3, 3)));
    assert_eq!(p.bounds("nope"), None);
}

#[test]
fn set_bounds_overrides_and_rejects_min_above_max() {
    let t0 = Instant::now();
    let mut p = placer(vec![], vec![model("m", 2, 100)], t0);
    assert!(p
        .set_bounds("nope", Some(1), None)
        .unwrap_err()
        .contains("unknown model"));
    assert!(p.set_bounds("m", Some(5), Some(3)).is_err());
    assert!(
        p.set_bounds("m", None, Some(1)).is_err(),
        "min 2 from the spec is above 1"
    );
    assert_eq!(p.bounds("m"), Some((2, 4)), "a rejected override changes nothing");
    p.set_bounds("m", Some(1), Some(1)).unwrap();
    assert_eq!(p.bounds("m"), Some((1, 1)));
    p.set_desired("m", 3);
    assert_eq!(p.wanted("m"), Some(1));
    p.set_bounds("m", None, None).unwrap();
    assert_eq!(p.bounds("m"), Some((2, 4)), "None keeps the spec's and the defaults");
    assert_eq!(p.wanted("m"), Some(3));
}

#[test]
fn min_above_the_nodes_that_can_hold_it_places_what_fits_and_says_why() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 1000)], vec![model("m", 2, 100)], t0);
    assert_eq!(show(&p.tick(t0)), ["load m@a"]);
    assert_eq!(view_of(&p, "m").reason, "wants 2 replicas, only 1 node can hold it");
    assert_eq!(view_of(&p, "m").wanted, 2);
}

#[test]
fn replicas_go_to_distinct_nodes_with_the_most_free_memory() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 4000), node("b", 8000), node("c", 6000)];
    let mut p = placer(nodes, vec![model("m", 2, 1000)], t0);
    assert_eq!(show(&p.tick(t0)), ["load m@b", "load m@c"]);
    assert_eq!(view_of(&p, "m").reason, "");
    // Equal free memory: the node with fewer replicas, then the name.
    let nodes = vec![node("a", 2000), node("b", 1500), node("c", 2000)];
    let mut p = placer(nodes, vec![model("x", 1, 500)], t0);
    assert_eq!(show(&p.tick(t0)), ["load x@a"]);
    p.set_models(vec![model("x", 1, 500), model("y", 1, 1000)], t0);
    // a: 1500 free with 1 replica, b: 1500 free with none, c: 2000 free.
    assert_eq!(show(&p.tick(t0)), ["load y@c"]);
    p.set_models(vec![model("x", 1, 500), model("y", 1, 1000), model("z", 1, 500)], t0);
    assert_eq!(
        show(&p.tick(t0)),
        ["load z@b"],
        "b and a both have 1500 free; b holds none"
    );
}

#[test]
fn a_gpu_model_goes_only_to_gpu_nodes() {
    let t0 = Instant::now();
    let mut spec = model("g", 1, 100);
    spec.needs_gpu = true;
    let mut p = placer(vec![node("big", 9000)], vec![spec.clone()], t0);
    assert!(p.tick(t0).is_empty());
    assert_eq!(
        view_of(&p, "g").reason,
        "wants 1 replica, 0 placed: needs a GPU and no node has one"
    );
    let mut gpu = node("small", 1000);
    gpu.gpus = 1;
    p.set_nodes(vec![node("big", 9000), gpu], t0);
    assert_eq!(show(&p.tick(t0)), ["load g@small"]);
}

#[test]
fn a_node_too_small_never_gets_the_model_and_the_reason_says_why() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("tiny", 100)], vec![model("m", 1, 500)], t0);
    assert!(p.tick(t0).is_empty());
    assert_eq!(
        view_of(&p, "m").reason,
        "wants 1 replica, 0 placed: needs 500 MB and no node has that much (largest: 100 MB)"
    );
}

#[test]
fn capacity_is_never_exceeded_and_the_reason_names_the_largest_free() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 2000), node("b", 2000)], vec![model("x", 2, 1500)], t0);
    let now = run(&mut p, t0, 2);
    p.set_models(vec![model("x", 2, 1500), model("y", 1, 1000)], now);
    let now = run(&mut p, now, 400);
    assert_eq!(
        replicas(&p, "y"),
        Vec::<String>::new(),
        "x has no spare replica to evict"
    );
    assert_eq!(
        view_of(&p, "y").reason,
        "wants 1 replica, 0 placed: no node has 1 GB free (largest free: 500 MB)"
    );
    // A node reporting a bigger footprint after loading counts from then on.
    p.measured("x", 1900 * MB);
    p.tick(now);
    assert!(view_of(&p, "y").reason.contains("largest free: 100 MB"));
}

#[test]
fn a_failed_load_goes_to_another_node_and_the_failure_is_visible() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 3000), node("b", 2000), node("c", 1000)];
    let mut p = placer(nodes, vec![model("m", 1, 500)], t0);
    assert_eq!(show(&p.tick(t0)), ["load m@a"]);
    p.observed("a", "m", Observed::Failed("bad weights".into()), t0 + ms(100));
    assert_eq!(show(&p.tick(t0 + ms(200))), ["load m@b"]);
    let v = view_of(&p, "m");
    assert_eq!(v.reason, "last failure on a: bad weights");
    assert!(v.replicas.contains(&ReplicaView {
        node: "a".into(),
        state: ReplicaState::Failed,
        reason: "bad weights".into()
    }));
    assert!(p
        .events()
        .iter()
        .any(|e| e.kind == EventKind::Failed && e.node == "a" && e.detail == "bad weights"));
    // b fails too: c next, and a again only after retry_after.
    p.observed("b", "m", Observed::Failed("oom".into()), t0 + ms(300));
    assert_eq!(show(&p.tick(t0 + ms(400))), ["load m@c"]);
    p.observed("c", "m", Observed::Failed("oom".into()), t0 + ms(500));
    assert!(p.tick(t0 + ms(600)).is_empty());
    assert!(
        view_of(&p, "m").reason.contains("3 node(s) failed it lately"),
        "{}",
        view_of(&p, "m").reason
    );
    assert!(p.tick(t0 + secs(60)).is_empty());
    assert_eq!(show(&p.tick(t0 + secs(60) + ms(100))), ["load m@a"]);
}

#[test]
fn a_load_that_times_out_fails_is_unloaded_and_goes_elsewhere() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 3000), node("b", 2000)], vec![model("m", 1, 500)], t0);
    assert_eq!(show(&p.tick(t0)), ["load m@a"]);
    assert!(p.tick(t0 + secs(119)).is_empty());
    assert_eq!(show(&p.tick(t0 + secs(120))), ["load m@b", "unload m@a"]);
    assert_eq!(replicas(&p, "m"), ["a:unloading", "b:loading"]);
    assert_eq!(view_of(&p, "m").replicas[0].reason, "load timed out after 120s");
    assert!(view_of(&p, "m").reason.contains("a: load timed out after 120s"));
    // A late Ready for the abandoned load changes nothing; the unload stands.
    p.observed("a", "m", Observed::Ready, t0 + secs(121));
    assert_eq!(replicas(&p, "m"), ["a:unloading", "b:loading"]);
}

#[test]
fn scale_down_unloads_ready_replicas_beyond_wanted_from_the_fullest_node_first() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000)];
    let mut p = placer(nodes, vec![model("m", 1, 1000)], t0);
    p.set_desired("m", 3);
    let now = run(&mut p, t0, 3);
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:ready", "c:ready"]);
    p.set_desired("m", 1);
    assert_eq!(
        show(&p.tick(now)),
        ["unload m@c"],
        "one step per tick, least free memory first"
    );
    assert_eq!(show(&p.tick(now + ms(200))), ["unload m@b"]);
    assert!(p.tick(now + ms(400)).is_empty());
    assert!(p
        .events()
        .iter()
        .any(|e| e.kind == EventKind::Scale && e.detail == "3 → 1"));
}

#[test]
fn scale_down_prefers_draining_nodes() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000)];
    let mut p = placer(nodes, vec![model("m", 1, 1000)], t0);
    p.set_desired("m", 2);
    let now = run(&mut p, t0, 3);
    p.set_desired("m", 1);
    p.set_nodes(vec![draining(node("a", 5000)), node("b", 4000)], now);
    assert_eq!(show(&p.tick(now)), ["unload m@a"]);
}

#[test]
fn loading_replicas_are_not_replicas_yet() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000)];
    let mut p = placer(nodes, vec![model("m", 1, 1000)], t0);
    p.set_desired("m", 2);
    let now = run(&mut p, t0, 3);
    p.set_desired("m", 3);
    assert_eq!(show(&p.tick(now)), ["load m@c"]);
    // Back to 2 while c loads: the load is cancelled, no Ready replica goes.
    p.set_desired("m", 2);
    assert_eq!(show(&p.tick(now + ms(200))), ["unload m@c"]);
    // 1 wanted while one Ready and one Loading: the loading one goes, the Ready one stays.
    let mut p = placer(vec![node("a", 5000), node("b", 4000)], vec![model("m", 1, 1000)], t0);
    p.set_desired("m", 2);
    assert_eq!(show(&p.tick(t0)), ["load m@a", "load m@b"]);
    p.observed("a", "m", Observed::Ready, t0 + ms(100));
    p.set_desired("m", 1);
    assert_eq!(show(&p.tick(t0 + ms(200))), ["unload m@b"]);
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:unloading"]);
    // More Ready than wanted while one loads: a Ready one goes (the fullest node's), then the load.
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000), node("d", 2500)];
    let mut p = placer(nodes, vec![model("m", 1, 1000)], t0);
    p.set_desired("m", 3);
    let now = run(&mut p, t0, 3);
    p.set_desired("m", 4);
    assert_eq!(show(&p.tick(now)), ["load m@d"]);
    p.set_desired("m", 2);
    assert_eq!(show(&p.tick(now + ms(200))), ["unload m@c"]);
    assert_eq!(show(&p.tick(now + ms(400))), ["unload m@d"]);
    assert!(p.tick(now + ms(600)).is_empty());
}

#[test]
fn a_lost_node_is_replaced_on_the_next_tick() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000)];
    let mut p = placer(nodes, vec![model("m", 2, 1000)], t0);
    let now = run(&mut p, t0, 3);
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:ready"]);
    p.set_nodes(vec![node("b", 4000), node("c", 3000)], now);
    assert!(p
        .events()
        .iter()
        .any(|e| e.kind == EventKind::Lost && e.node == "a" && e.model == "m"));
    assert_eq!(replicas(&p, "m"), ["b:ready"]);
    assert_eq!(show(&p.tick(now + ms(200))), ["load m@c"]);
}

#[test]
fn a_replica_the_node_stops_serving_is_replaced() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 5000), node("b", 4000)], vec![model("m", 1, 1000)], t0);
    let now = run(&mut p, t0, 2);
    p.observed("a", "m", Observed::Absent, now);
    assert_eq!(show(&p.tick(now + ms(200))), ["load m@b"]);
}

#[test]
fn a_node_own_model_is_ignored_and_never_placed_over() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000), node("c", 3000)];
    let mut p = placer(nodes, vec![model("m", 2, 1000)], t0);
    p.observed("a", "m", Observed::Ready, t0);
    p.observed("zzz", "other", Observed::Absent, t0);
    assert_eq!(show(&p.tick(t0)), ["load m@b", "load m@c"]);
    assert_eq!(
        replicas(&p, "m"),
        ["b:loading", "c:loading"],
        "a's own m is not a replica"
    );
    // The node's own model goes away: a is eligible again.
    p.observed("a", "m", Observed::Absent, t0 + ms(100));
    p.set_desired("m", 3);
    assert_eq!(show(&p.tick(t0 + ms(200))), ["load m@a"]);
}

#[test]
fn a_replica_the_placer_forgot_is_taken_back_when_reported_ready() {
    let t0 = Instant::now();
    let mut p = placer(vec![node("a", 5000), node("b", 4000)], vec![model("m", 1, 1000)], t0);
    let now = run(&mut p, t0, 2);
    // a's link drops and comes back with the replica still loaded.
    p.set_nodes(vec![node("b", 4000)], now);
    assert_eq!(show(&p.tick(now + ms(200))), ["load m@b"]);
    p.set_nodes(vec![node("a", 5000), node("b", 4000)], now + ms(300));
    p.observed("a", "m", Observed::Ready, now + ms(300));
    p.observed("b", "m", Observed::Ready, now + ms(400));
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:ready"]);
    assert_eq!(
        show(&p.tick(now + ms(600))),
        ["unload m@b"],
        "one too many: the fuller node's goes"
    );
}

#[test]
fn a_removed_model_is_unloaded_everywhere_and_never_placed_again() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000)];
    let mut p = placer(nodes, vec![model("m", 2, 1000), model("k", 1, 1000)], t0);
    let now = run(&mut p, t0, 2);
    p.set_models(vec![model("k", 1, 1000)], now);
    assert_eq!(show(&p.tick(now)), ["unload m@a", "unload m@b"]);
    let v = view_of(&p, "m");
    assert_eq!((v.wanted, v.replicas.len()), (0, 2));
    assert!(p.bounds("m").is_none());
    p.observed("a", "m", Observed::Absent, now + ms(100));
    p.observed("b", "m", Observed::Absent, now + ms(100));
    assert!(p.tick(now + ms(200)).is_empty());
    assert!(p.view().iter().all(|v| v.name != "m"));
    // A late Ready for a pair of the removed model: unloaded again.
    p.observed("a", "m", Observed::Ready, now + ms(300));
    assert_eq!(show(&p.tick(now + ms(400))), ["unload m@a"]);
}

#[test]
fn ticking_again_without_news_emits_nothing_and_unloads_are_outstanding_until_answered() {
    let t0 = Instant::now();
    let nodes = vec![node("a", 5000), node("b", 4000)];
    let mut p = placer(nodes, vec![model("m", 1, 1000)], t0);
    p.set_desired("m", 2);
    assert_eq!(p.tick(t0).len(), 2);
    assert!(p.tick(t0).is_empty());
    assert!(p.tick(t0 + ms(200)).is_empty(), "loads outstanding");
    p.observed("a", "m", Observed::Absent, t0 + ms(300));
    assert!(
        p.tick(t0 + ms(400)).is_empty(),
        "an Absent older than the load changes nothing"
    );
    assert_eq!(replicas(&p, "m"), ["a:loading", "b:loading"]);
    settle(
        &mut p,
        &[Action::Load {
            model: "m".into(),
            node: "a".into(),
        }],
        t0 + ms(500),
    );
    settle(
        &mut p,
        &[Action::Load {
            model: "m".into(),
            node: "b".into(),
        }],
        t0 + ms(500),
    );
    p.set_desired("m", 1);
    assert_eq!(show(&p.tick(t0 + secs(1))), ["unload m@b"]);
    assert!(p.tick(t0 + secs(1)).is_empty());
    assert!(p.tick(t0 + secs(100)).is_empty(), "the unload is outstanding");
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:unloading"]);
    // Never answered: forgotten after load_timeout.
    p.tick(t0 + secs(121));
    assert_eq!(replicas(&p, "m"), ["a:ready"]);
}

#[test]
fn events_are_a_bounded_ring_oldest_first() {
    let t0 = Instant::now();
    let mut p = Placer::new(PlaceSettings {
        history: 3,
        ..PlaceSettings::default()
    });
    p.set_nodes(vec![node("a", 5000), node("b", 4000), node("c", 3000)], t0);
    p.set_models(vec![model("m", 1, 1000)], t0);
    let now = run(&mut p, t0, 2);
    p.set_desired("m", 3);
    p.tick(now + ms(200));
    let kinds: Vec<(EventKind, String, String)> = p.events().into_iter().map(|e| (e.kind, e.node, e.detail)).collect();
    assert_eq!(
        kinds,
        [
            (EventKind::Scale, String::new(), "1 → 3".to_string()),
            (EventKind::Place, "b".into(), String::new()),
            (EventKind::Place, "c".into(), String::new()),
        ]
    );
    assert_eq!(p.events()[0].at, now + ms(200));
}

#[test]
fn a_restarted_router_adopts_the_replicas_nodes_report_and_places_only_what_is_missing() {
    let t0 = Instant::now();
    // A fresh placer (the router restarted) that wants 2 replicas of m and 1 of k.
    let mut p = placer(
        vec![node("a", 1000), node("b", 1000), node("c", 1000)],
        vec![model("m", 2, 10), model("k", 1, 10)],
        t0,
    );
    // The nodes report what the old router placed: m on a and b, k on a and c (one too many).
    for (n, m) in [("a", "m"), ("b", "m"), ("a", "k"), ("c", "k")] {
        p.adopt(n, m, t0);
    }
    p.adopt("a", "m", t0); // reported again: no change
    assert_eq!(replicas(&p, "m"), ["a:ready", "b:ready"]);
    let actions = show(&p.tick(t0 + ms(200)));
    assert!(
        !actions.iter().any(|a| a.starts_with("load")),
        "nothing placed again: {actions:?}"
    );
    assert_eq!(
        actions.iter().filter(|a| a.starts_with("unload k@")).count(),
        1,
        "{actions:?}"
    );
    // A model the new router does not want is unloaded where a node still holds it.
    p.adopt("b", "gone", t0 + ms(300));
    let actions = show(&p.tick(t0 + ms(400)));
    assert!(actions.contains(&"unload gone@b".to_string()), "{actions:?}");
}
