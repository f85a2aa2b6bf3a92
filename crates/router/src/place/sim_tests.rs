//! End-to-end placement scenarios on a simulated cluster: nodes that load in 500 ms and unload in 100 ms,
//! a placer ticked every 200 ms, all on a fake clock, with the cluster's invariants checked at every step.
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::tests::{draining, node, secs, MB};
use super::*;

const LOAD: Duration = Duration::from_millis(500);
const UNLOAD: Duration = Duration::from_millis(100);
const TICK: Duration = Duration::from_millis(200);

/// A node's answer to a command, due at a time.
#[derive(Debug, Clone)]
struct Due {
    at: Instant,
    node: String,
    model: String,
    seen: Observed,
}

struct Sim {
    placer: Placer,
    now: Instant,
    specs: BTreeMap<String, NodeSpec>,
    footprints: BTreeMap<String, u64>,
    /// What each node holds: model → Ready since (None while loading).
    held: BTreeMap<String, BTreeMap<String, Option<Instant>>>,
    /// (node, model) pairs whose loads fail.
    fails: BTreeSet<(String, String)>,
    due: Vec<Due>,
    drained: Vec<String>,
    /// Unloads of replicas that had been Ready less than min_age.
    young_evictions: usize,
    evictions: usize,
}

impl Sim {
    fn new(nodes: Vec<NodeSpec>, models: Vec<ModelSpec>) -> Sim {
        let now = Instant::now();
        let mut placer = Placer::new(PlaceSettings {
            history: 10_000,
            ..PlaceSettings::default()
        });
        placer.set_nodes(nodes.clone(), now);
        placer.set_models(models.clone(), now);
        Sim {
            placer,
            now,
            specs: nodes.iter().map(|n| (n.name.clone(), n.clone())).collect(),
            footprints: models.iter().map(|m| (m.name.clone(), m.footprint)).collect(),
            held: nodes.iter().map(|n| (n.name.clone(), BTreeMap::new())).collect(),
            fails: BTreeSet::new(),
            due: Vec::new(),
            drained: Vec::new(),
            young_evictions: 0,
            evictions: 0,
        }
    }

    /// One round: answers that are due, a tick, the actions carried out; checks capacity.
    fn step(&mut self) -> Vec<Action> {
        self.now += TICK;
        let now = self.now;
        let (due, later): (Vec<Due>, Vec<Due>) = self.due.drain(..).partition(|d| d.at <= now);
        self.due = later;
        for d in due {
            let held = self.held.get_mut(&d.node).expect("live node");
            match d.seen {
                Observed::Ready => *held.get_mut(&d.model).expect("loading") = Some(d.at),
                Observed::Failed(_) | Observed::Absent => {
                    held.remove(&d.model);
                }
            }
            self.placer.observed(&d.node, &d.model, d.seen, d.at);
        }
        let events_before = self.placer.events().len();
        let actions = self.placer.tick(now);
        let evicted: BTreeSet<(String, String)> = self.placer.events()[events_before..]
            .iter()
            .filter(|e| e.kind == EventKind::Evict)
            .map(|e| (e.node.clone(), e.model.clone()))
            .collect();
        for a in &actions {
            match a {
                Action::Load { model, node } => {
                    let held = self.held.get_mut(node).expect("a load for a live node");
                    assert!(
                        held.insert(model.clone(), None).is_none(),
                        "{model} loaded twice on {node}"
                    );
                    let key = (node.clone(), model.clone());
                    let seen = match self.fails.contains(&key) {
                        true => Observed::Failed("simulated failure".into()),
                        false => Observed::Ready,
                    };
                    self.answer(node, model, now + LOAD, seen);
                }
                Action::Unload { model, node } => {
                    let since = self.held[node].get(model).expect("an unload for a held model");
                    if evicted.contains(&(node.clone(), model.clone())) {
                        self.evictions += 1;
                        let age = since.map(|s| now - s).unwrap_or_default();
                        if age < PlaceSettings::default().min_age {
                            self.young_evictions += 1;
                        }
                    }
                    // The node drops a load in progress for it.
                    self.due.retain(|d| !(d.node == *node && d.model == *model));
                    self.answer(node, model, now + UNLOAD, Observed::Absent);
                }
                Action::Drained { node } => self.drained.push(node.clone()),
            }
        }
        for (name, held) in &self.held {
            let used: u64 = held.keys().map(|m| self.footprints[m]).sum();
            assert!(used <= self.specs[name].memory, "{name} over capacity: {held:?}");
        }
        actions
    }

    fn answer(&mut self, node: &str, model: &str, at: Instant, seen: Observed) {
        self.due.push(Due {
            at,
            node: node.into(),
            model: model.into(),
            seen,
        });
    }

    /// Steps until `done` holds (true) or `limit` passes (false).
    fn until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        while self.now < end {
            self.step();
            if done(self) {
                return true;
            }
        }
        false
    }

    fn set_node(&mut self, spec: Option<NodeSpec>, name: &str) {
        match spec {
            Some(spec) => {
                self.held.entry(name.into()).or_default();
                self.specs.insert(name.into(), spec);
            }
            None => {
                self.specs.remove(name);
                self.held.remove(name);
                self.due.retain(|d| d.node != name);
            }
        }
        self.placer.set_nodes(self.specs.values().cloned().collect(), self.now);
    }

    /// Nodes holding the model Ready.
    fn ready_on(&self, model: &str) -> Vec<&str> {
        self.held
            .iter()
            .filter(|(_, h)| h.get(model).is_some_and(|s| s.is_some()))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    fn all_ready(&self, n: usize) -> bool {
        self.footprints.keys().all(|m| self.ready_on(m).len() >= n)
    }

    fn loads_for_moves(&self) -> usize {
        let view = self.placer.view();
        view.iter()
            .flat_map(|v| &v.replicas)
            .filter(|r| r.state == ReplicaState::Loading && r.reason.starts_with("replaces"))
            .count()
    }
}

fn models(n: usize, min: u32, mb: u64) -> Vec<ModelSpec> {
    (0..n).map(|i| super::tests::model(&format!("m{i}"), min, mb)).collect()
}

fn nodes(names: &[&str], mb: u64) -> Vec<NodeSpec> {
    names.iter().map(|n| node(n, mb)).collect()
}

#[test]
fn three_empty_nodes_place_four_models_on_distinct_nodes_within_capacity() {
    let mut sim = Sim::new(nodes(&["a", "b", "c"], 1000), models(4, 2, 300));
    assert!(sim.until(secs(2), |s| s.all_ready(2)));
    for m in sim.footprints.keys() {
        assert_eq!(sim.ready_on(m).len(), 2, "{m} on distinct nodes");
    }
    assert!(sim.placer.view().iter().all(|v| v.reason.is_empty()));
    // Settled: nothing more happens.
    for _ in 0..50 {
        assert!(sim.step().is_empty());
    }
}

#[test]
fn a_killed_node_is_replaced_within_five_seconds() {
    let mut sim = Sim::new(nodes(&["a", "b", "c"], 2000), models(4, 2, 300));
    assert!(sim.until(secs(2), |s| s.all_ready(2)));
    sim.until(secs(10), |_| false);
    assert!(!sim.held["a"].is_empty());
    sim.set_node(None, "a");
    assert!(!sim.all_ready(2));
    let killed = sim.now;
    assert!(sim.until(secs(5), |s| s.all_ready(2)), "not re-placed within 5 s");
    assert!(sim.now - killed <= secs(2), "took {:?}", sim.now - killed);
    assert!(sim
        .placer
        .events()
        .iter()
        .any(|e| e.kind == EventKind::Lost && e.node == "a"));
}

#[test]
fn a_joining_node_gets_replicas_gradually_without_losing_ready_replicas() {
    let mut sim = Sim::new(nodes(&["a", "b", "c"], 5000), models(6, 2, 300));
    assert!(sim.until(secs(2), |s| s.all_ready(2)));
    sim.set_node(Some(node("d", 5000)), "d");
    let joined = sim.now;
    let mut most = 0;
    let balanced = sim.until(secs(120), |s| {
        assert!(s.all_ready(2), "a model dropped below its Ready count during a move");
        most = most.max(s.loads_for_moves());
        let counts: Vec<usize> = s.held.values().map(BTreeMap::len).collect();
        counts.iter().max() == counts.iter().min()
    });
    assert!(balanced, "{:?}", sim.held);
    assert!((1..=2).contains(&most), "moves in flight at most max_moves ({most})");
    assert!(sim.now - joined >= secs(29), "replicas younger than min_age moved");
    assert_eq!(sim.held["d"].len(), 3);
    for m in sim.footprints.keys() {
        assert_eq!(sim.ready_on(m).len(), 2);
    }
}

#[test]
fn a_drained_node_ends_empty_without_dropping_below_min() {
    let mut sim = Sim::new(nodes(&["a", "b", "c", "d"], 2000), models(5, 2, 300));
    assert!(sim.until(secs(2), |s| s.all_ready(2)));
    let held = sim.held["b"].len();
    assert!(held > 0);
    sim.set_node(Some(draining(node("b", 2000))), "b");
    let mut most = 0;
    let done = sim.until(secs(30), |s| {
        assert!(s.all_ready(2), "a model dropped below min during the drain");
        most = most.max(s.loads_for_moves());
        !s.drained.is_empty()
    });
    assert!(done);
    assert_eq!(sim.drained, ["b"]);
    assert!(sim.held["b"].is_empty());
    assert!(most <= 2);
    for _ in 0..20 {
        sim.step();
    }
    assert_eq!(sim.drained, ["b"], "Drained once");
}

#[test]
fn a_node_too_small_never_gets_the_model() {
    let mut cluster = nodes(&["a", "b"], 2000);
    cluster.push(node("tiny", 400));
    let mut sim = Sim::new(cluster, models(1, 3, 500));
    sim.until(secs(60), |_| false);
    assert_eq!(sim.ready_on("m0"), ["a", "b"]);
    assert!(sim.held["tiny"].is_empty());
    let view = sim.placer.view();
    assert_eq!(view[0].reason, "wants 3 replicas, only 2 nodes can hold it");
}

#[test]
fn a_node_failing_a_load_is_skipped_and_the_failure_shows() {
    let mut sim = Sim::new(nodes(&["a", "b", "c"], 2000), models(1, 2, 300));
    sim.fails.insert(("a".into(), "m0".into()));
    assert!(sim.until(secs(3), |s| s.all_ready(2)));
    assert_eq!(sim.ready_on("m0"), ["b", "c"]);
    let view = sim.placer.view();
    assert_eq!(view[0].reason, "last failure on a: simulated failure");
    assert!(view[0]
        .replicas
        .iter()
        .any(|r| r.node == "a" && r.state == ReplicaState::Failed));
    // The failure ages out of the reason after retry_after.
    sim.until(secs(61), |_| false);
    assert_eq!(sim.placer.view()[0].reason, "");
}

#[test]
fn eviction_picks_the_least_recently_used_model_with_spare_replicas() {
    // Three nodes of four 300 MB slots, full: p, q, r with 3 replicas each (min 1), s with 3 (min 3).
    let mut specs = Vec::new();
    for name in ["p", "q", "r"] {
        specs.push(super::tests::model(name, 1, 300));
    }
    specs.push(super::tests::model("s", 3, 300));
    let mut sim = Sim::new(nodes(&["a", "b", "c"], 1200), specs);
    for name in ["p", "q", "r"] {
        sim.placer.set_desired(name, 3);
    }
    assert!(sim.until(secs(2), |s| s.all_ready(3)));
    let t = sim.now;
    sim.placer.used("r", t + secs(10));
    sim.placer.used("q", t + secs(5));
    sim.placer.used("p", t + secs(20));
    sim.until(secs(40), |_| false);
    // A new model: q (used longest ago, with spare replicas) makes room; s (at its min) is never touched.
    sim.footprints.insert("n".into(), 300 * MB);
    let mut specs: Vec<ModelSpec> = ["p", "q", "r", "n"]
        .iter()
        .map(|m| super::tests::model(m, 1, 300))
        .collect();
    specs.push(super::tests::model("s", 3, 300));
    sim.placer.set_models(specs, sim.now);
    assert!(sim.until(secs(3), |s| s.ready_on("n").len() == 1));
    let evicted: Vec<String> = sim
        .placer
        .events()
        .iter()
        .filter(|e| e.kind == EventKind::Evict)
        .map(|e| e.model.clone())
        .collect();
    assert_eq!(evicted, ["q"]);
    assert_eq!(sim.ready_on("q").len(), 2);
    assert_eq!(sim.ready_on("s").len(), 3);
}

#[test]
fn alternating_demand_does_not_evict_replicas_younger_than_min_age() {
    // Room for three replicas; x and y each want two and take turns being the busy one.
    let specs: Vec<ModelSpec> = ["x", "y"].iter().map(|m| super::tests::model(m, 1, 300)).collect();
    let mut sim = Sim::new(vec![node("a", 600), node("b", 300)], specs);
    sim.placer.set_desired("x", 2);
    sim.placer.set_desired("y", 2);
    assert!(sim.until(secs(2), |s| s.all_ready(1)));
    let start = sim.now;
    while sim.now < start + secs(300) {
        let phase = (sim.now - start).as_secs() / 5 % 2;
        let hot = if phase == 0 { "x" } else { "y" };
        sim.placer.used(hot, sim.now);
        sim.step();
        assert!(
            !sim.ready_on("x").is_empty() && !sim.ready_on("y").is_empty(),
            "a model lost its last replica"
        );
    }
    assert!(
        sim.evictions > 0,
        "the busy model does take the idle one's spare replica"
    );
    assert_eq!(sim.young_evictions, 0, "a replica younger than min_age was evicted");
    assert!(sim.evictions <= 300 / 30 + 1, "thrashing: {} evictions", sim.evictions);
}
