//! Tests of placement reconciliation on a fake clock: snapshots in, commands and answers out, with
//! nodes simulated by carrying out the commands (loads, reloads that fail, unloads, drains,
//! fencing, leadership, start-up grace, links that vanish).
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::cluster::msg;
use mesh::cluster::ship::Manifest;
use mesh::control::ControlMode;
use mesh::error::Code;

use super::*;
use crate::lead::{Desired, Role};
use crate::membership::{NodeModel, NodeState as Member, NodeSummary};
use crate::place::{PlaceSettings, ScaleSettings};
use mesh::proto::model_version_policy::PolicyChoice;

pub(super) fn settings(mode: ControlMode) -> PlacementSettings {
    PlacementSettings {
        place: PlaceSettings {
            default_min: 1,
            default_max: 1,
            min_age: Duration::ZERO,
            ..Default::default()
        },
        scale: ScaleSettings::default(),
        mode,
        load_at_start: Vec::new(),
        poll_every: Duration::from_secs(5),
        tick: Duration::from_millis(200),
        startup_grace: Duration::ZERO,
    }
}

fn repo_model(name: &str, key: &str) -> Arc<RepoModel> {
    repo_model_of(name, key, Vec::new())
}

/// Model `name` of the repository, its files listed in its manifest (`key`).
pub(super) fn repo_model_of(name: &str, key: &str, files: Vec<msg::FileEntry>) -> Arc<RepoModel> {
    Arc::new(RepoModel {
        name: name.into(),
        dir: PathBuf::from("/repo").join(name),
        manifest: Manifest { key: key.into(), files },
        config_override: String::new(),
        config: Default::default(),
        min: None,
        max: None,
        needs_gpu: false,
        footprint: 1_000,
        stat: 0,
        override_files: None,
    })
}

pub(super) fn node(name: &str, link: u64) -> NodeSummary {
    NodeSummary {
        name: name.into(),
        incarnation: 1,
        address: String::new(),
        link: Some(link),
        state: Member::Up,
        devices: Vec::new(),
        memory: 1_000_000_000,
        models: Vec::new(),
        last_report_age: None,
    }
}

/// A reconciler, the cluster it sees, and nodes that do what they are told.
struct World {
    rc: Reconcile,
    nodes: Vec<NodeSummary>,
    repo: Vec<Arc<RepoModel>>,
    now: Instant,
    /// Every command sent so far.
    sent: Vec<Command>,
    /// Places a node fails, with why (model → error).
    failing: BTreeMap<String, String>,
    /// Answers received: waiter → outcome.
    answers: BTreeMap<WaiterId, mesh::Result<()>>,
    /// The role each tick follows.
    role: Role,
}

impl World {
    fn new(settings: PlacementSettings, wanted: &[&str], elected: bool) -> Self {
        let now = Instant::now();
        let wanted = wanted.iter().map(|m| m.to_string()).collect();
        World {
            rc: Reconcile::new(settings, wanted, elected, now),
            nodes: vec![node("n1", 1), node("n2", 2)],
            repo: Vec::new(),
            now,
            sent: Vec::new(),
            failing: BTreeMap::new(),
            answers: BTreeMap::new(),
            role: Role::Single,
        }
    }

    /// One tick ~200 ms after the last; the nodes carry out its commands. Answers what it output.
    fn tick(&mut self) -> Output {
        self.now += Duration::from_millis(200);
        let reads = self.rc.follow(&self.role, &self.repo);
        assert!(reads.is_empty(), "the role's intent is applied already: {reads:?}");
        let used = Vec::new();
        let out = self.rc.tick(&Snapshot {
            now: self.now,
            nodes: &self.nodes,
            repo: &self.repo,
            used: &used,
        });
        for c in &out.commands {
            self.carry_out(c);
        }
        for (id, r) in &out.answers {
            assert!(
                self.answers.insert(*id, r.clone()).is_none(),
                "waiter {id} answered twice"
            );
        }
        for m in &out.restore {
            self.repo.retain(|r| r.name != m.name);
            self.repo.push(m.clone());
        }
        for m in &out.forget {
            self.repo.retain(|r| r.name != *m);
        }
        self.sent.extend(out.commands.iter().cloned());
        out
    }

    fn ticks(&mut self, n: usize) {
        for _ in 0..n {
            self.tick();
        }
    }

    fn carry_out(&mut self, c: &Command) {
        let Some(n) = self.nodes.iter_mut().find(|n| n.name == c.node()) else {
            return;
        };
        let name = n.name.clone();
        match c {
            Command::Place { model, .. } => {
                let error = self.failing.get(&model.name).cloned().unwrap_or_default();
                if error.is_empty() && !n.models.iter().any(|m| m.name == model.name) {
                    n.models.push(NodeModel {
                        name: model.name.clone(),
                        version: 1,
                        ready: true,
                        reason: String::new(),
                        placed: true,
                        inflight: 0,
                    });
                }
                let answer = msg::Placed {
                    model: model.name.clone(),
                    key: model.manifest.key.clone(),
                    error,
                    footprint: 1_000,
                };
                self.rc.placed(&name, answer, self.now);
            }
            Command::Evict { model, .. } => n.models.retain(|m| m.name != *model),
            Command::MayStop { .. } | Command::Fence { .. } => {}
        }
    }

    fn holders(&self, model: &str) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|n| n.models.iter().any(|m| m.name == model))
            .map(|n| n.name.clone())
            .collect()
    }

    fn places(&self) -> Vec<(String, String, u64)> {
        self.sent
            .iter()
            .filter_map(|c| match c {
                Command::Place { node, model, epoch, .. } => Some((model.name.clone(), node.clone(), *epoch)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_load_is_answered_once_a_replica_is_ready() {
    let mut w = World::new(settings(ControlMode::Explicit), &[], false);
    w.repo.push(repo_model("m", "k1"));
    let id = w.rc.load("m", None, w.now);
    w.ticks(3);
    assert_eq!(w.answers.get(&id).map(|r| r.is_ok()), Some(true), "{:?}", w.answers);
    assert_eq!(w.holders("m").len(), 1);
    assert_eq!(w.places().len(), 1, "one Place, not one per tick: {:?}", w.places());
}

#[test]
fn a_reload_that_fails_answers_why_and_restores_what_served() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    let v1 = repo_model("m", "k1");
    w.repo.push(v1.clone());
    w.ticks(3);
    let holder = w.holders("m").into_iter().next().expect("placed");
    // The operator loads a changed model; the node refuses it.
    w.repo = vec![repo_model("m", "k2")];
    w.failing.insert("m".into(), "bad weights".into());
    let id = w.rc.load("m", Some(v1.clone()), w.now);
    w.ticks(3);
    let answer = w.answers.get(&id).expect("answered");
    let err = answer.as_ref().expect_err("the reload failed");
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains(&format!("on {holder}: bad weights")), "{err}");
    assert_eq!(
        w.repo.iter().map(|m| m.manifest.key.clone()).collect::<Vec<_>>(),
        ["k1"]
    );
    assert!(w.holders("m").contains(&holder), "the old replica keeps serving");
}

#[test]
fn a_changed_model_is_shipped_again_to_its_replicas() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    w.repo.push(repo_model("m", "k1"));
    w.ticks(3);
    w.repo = vec![repo_model("m", "k2")];
    w.ticks(1);
    let again: Vec<_> = w
        .sent
        .iter()
        .filter_map(|c| match c {
            Command::Place { model, again: true, .. } => Some(model.manifest.key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(again, ["k2"]);
    w.ticks(3);
    assert_eq!(w.places().len(), 2, "shipped once more, not every tick");
}

#[test]
fn nothing_is_placed_during_the_start_up_grace() {
    let mut s = settings(ControlMode::Explicit);
    s.startup_grace = Duration::from_secs(2);
    let mut w = World::new(s, &["m"], false);
    w.repo.push(repo_model("m", "k1"));
    w.ticks(9);
    assert!(w.sent.is_empty(), "{:?}", w.sent);
    w.ticks(2);
    assert_eq!(w.places().len(), 1);
}

#[test]
fn a_follower_sends_nothing_and_refuses_changes() {
    let mut w = World::new(settings(ControlMode::Explicit), &[], true);
    w.repo.push(repo_model("m", "k1"));
    let state = Arc::new(Desired {
        wanted: [("m".to_string(), String::new())].into(),
        ..Default::default()
    });
    let role = Role::Follower {
        leader: "r2".into(),
        http: "10.0.0.2:8000".into(),
        state,
    };
    let reads = w.rc.follow(&role, &w.repo);
    assert_eq!(reads.len(), 1, "a follower reads the intent it shadows: {reads:?}");
    w.rc.read_done(&reads[0], Ok(()));
    w.role = role.clone();
    w.ticks(3);
    assert!(w.sent.is_empty(), "{:?}", w.sent);
    let err = refuse(&role, "r1").expect_err("a follower refuses");
    assert_eq!(err.code, Code::Unavailable);
    assert!(err.message.contains("r2 does"), "{err}");
    // Its view still lists the model the leader places.
    let out = w.tick();
    assert_eq!(
        out.view.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["m"]
    );
    assert!(refuse(&Role::Single, "r1").is_ok());
}

#[test]
fn a_new_leader_fences_every_node_process_once_and_stamps_its_epoch() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], true);
    w.repo.push(repo_model("m", "k1"));
    let role = Role::Leader {
        epoch: 7,
        state: Arc::new(Desired {
            wanted: [("m".to_string(), String::new())].into(),
            ..Default::default()
        }),
    };
    assert!(
        w.rc.follow(&role, &w.repo).is_empty(),
        "m is wanted with that config already"
    );
    w.role = role.clone();
    w.ticks(3);
    let fences = |w: &World| {
        w.sent
            .iter()
            .filter_map(|c| match c {
                Command::Fence { node, epoch } => Some((node.clone(), *epoch)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(fences(&w), [("n1".to_string(), 7), ("n2".to_string(), 7)]);
    assert!(w.places().iter().all(|(_, _, epoch)| *epoch == 7), "{:?}", w.places());
    // n2 restarts: its new process is told the epoch; n1 is not told again.
    w.nodes[1].incarnation = 2;
    w.nodes[1].models.clear();
    w.ticks(2);
    assert_eq!(fences(&w).len(), 3);
    assert_eq!(fences(&w)[2], ("n2".to_string(), 7));
    let intent = w.tick().intent.expect("a leader stores its intent");
    assert_eq!(intent.wanted.keys().collect::<Vec<_>>(), ["m"]);
}

#[test]
fn an_unsent_place_counts_as_failed_and_goes_to_another_node() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    w.repo.push(repo_model("m", "k1"));
    w.rc.follow(&Role::Single, &w.repo);
    let out = w.rc.tick(&Snapshot {
        now: w.now,
        nodes: &w.nodes,
        repo: &w.repo,
        used: &[],
    });
    let [first @ Command::Place { .. }] = out.commands.as_slice() else {
        panic!("one Place: {:?}", out.commands)
    };
    // The node's link went away between the snapshot and the send.
    w.rc.unsent(first, w.now);
    w.ticks(3);
    let other = if first.node() == "n1" { "n2" } else { "n1" };
    assert_eq!(w.holders("m"), BTreeSet::from([other.to_string()]));
}

#[test]
fn a_node_without_a_link_is_sent_nothing() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    w.repo.push(repo_model("m", "k1"));
    w.nodes[0].link = None;
    w.ticks(3);
    assert!(w.sent.iter().all(|c| c.node() == "n2"), "{:?}", w.sent);
    assert_eq!(w.holders("m"), BTreeSet::from(["n2".to_string()]));
}

#[test]
fn a_model_removed_from_the_repository_is_evicted_then_forgotten() {
    let mut w = World::new(settings(ControlMode::Poll), &[], false);
    assert!(w.rc.scan_due(w.now));
    let reads =
        w.rc.scanned(w.now, BTreeSet::from(["m".to_string()]), BTreeMap::new(), &w.repo);
    assert_eq!(reads.iter().map(|r| r.model.as_str()).collect::<Vec<_>>(), ["m"]);
    w.repo.push(repo_model("m", "k1"));
    w.rc.read_done(&reads[0], Ok(()));
    w.ticks(3);
    assert_eq!(w.holders("m").len(), 1);
    assert!(!w.rc.scan_due(w.now), "poll mode scans every 5 s");
    w.now += Duration::from_secs(5);
    assert!(w.rc.scan_due(w.now));
    assert!(w
        .rc
        .scanned(w.now, BTreeSet::new(), BTreeMap::new(), &w.repo)
        .is_empty());
    let mut forgotten = false;
    for _ in 0..5 {
        forgotten |= w.tick().forget.contains(&"m".to_string());
    }
    assert!(w.holders("m").is_empty());
    assert!(forgotten, "dropped from the repository view once no node holds it");
    assert!(w.repo.is_empty());
}

#[test]
fn an_unload_is_answered_once_no_node_holds_the_model() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    w.repo.push(repo_model("m", "k1"));
    w.ticks(3);
    let id = w.rc.unload("m").expect("loaded");
    assert!(!w.answers.contains_key(&id));
    w.ticks(3);
    assert!(w.holders("m").is_empty());
    assert!(matches!(w.answers.get(&id), Some(Ok(()))));
    let err = w.rc.unload("m").expect_err("not loaded any more");
    assert_eq!(err.code, Code::NotFound);
}

#[test]
fn a_drain_moves_the_models_off_then_lets_the_node_stop() {
    let mut s = settings(ControlMode::Explicit);
    s.place.default_min = 1;
    let mut w = World::new(s, &["a", "b"], false);
    w.repo.extend([repo_model("a", "ka"), repo_model("b", "kb")]);
    w.nodes.truncate(1);
    w.ticks(3);
    assert_eq!(w.holders("a"), BTreeSet::from(["n1".to_string()]));
    w.nodes.push(node("n2", 2));
    let id = w.rc.drain("n1", &w.nodes).expect("connected");
    assert!(w.rc.drain("n9", &w.nodes).is_err());
    for _ in 0..20 {
        w.tick();
        if w.answers.contains_key(&id) {
            break;
        }
    }
    assert!(matches!(w.answers.get(&id), Some(Ok(()))), "{:?}", w.answers);
    for m in ["a", "b"] {
        assert_eq!(w.holders(m), BTreeSet::from(["n2".to_string()]), "{m} moved");
    }
    assert!(w
        .sent
        .iter()
        .any(|c| matches!(c, Command::MayStop { node, .. } if node == "n1")));
    let out = w.tick();
    assert_eq!(out.view.drains, [("n1".to_string(), true)]);
    assert_eq!(out.intent, None, "no etcd: a single router stores nothing");
    assert_eq!(w.rc.intent(&w.repo).drains, BTreeMap::from([("n1".to_string(), 1)]));
}

#[test]
fn reads_skip_models_loaded_with_overrides_and_a_bad_one_is_reported() {
    let mut w = World::new(settings(ControlMode::Poll), &[], false);
    let mut m = Arc::try_unwrap(repo_model("m", "k1")).unwrap();
    m.config_override = "{\"backend\":\"onnxruntime\"}".into();
    w.repo.push(Arc::new(m));
    let found = BTreeSet::from(["m".to_string(), "bad".to_string()]);
    let reads = w.rc.scanned(w.now, found, BTreeMap::new(), &w.repo);
    assert_eq!(reads.iter().map(|r| r.model.as_str()).collect::<Vec<_>>(), ["bad"]);
    w.rc.read_done(&reads[0], Err("config.pbtxt: bad".into()));
    let out = w.tick();
    assert_eq!(out.view.errors, [("bad".to_string(), "config.pbtxt: bad".to_string())]);
}

#[test]
fn a_load_of_a_bad_model_is_answered_with_why() {
    let mut w = World::new(settings(ControlMode::Explicit), &[], false);
    let read = Read {
        model: "m".into(),
        config: String::new(),
        intent: false,
    };
    w.rc.read_done(&read, Err("cannot read config.pbtxt".into()));
    let id = w.rc.load("m", None, w.now);
    w.tick();
    let err = w.answers[&id].as_ref().expect_err("refused");
    assert!(
        err.message.contains("failed to load 'm': cannot read config.pbtxt"),
        "{err}"
    );
}

#[test]
fn scale_sets_bounds_that_the_intent_keeps() {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    w.repo.push(repo_model("m", "k1"));
    w.ticks(2);
    assert_eq!(w.rc.scale("m", Some(2), Some(3)).unwrap(), (2, 3));
    assert!(w.rc.scale("m", Some(4), Some(3)).is_err());
    assert_eq!(w.rc.scale("x", Some(1), None).unwrap_err().code, Code::NotFound);
    w.ticks(3);
    assert_eq!(w.holders("m").len(), 2);
    assert_eq!(w.rc.intent(&w.repo).bounds, BTreeMap::from([("m".to_string(), (2, 3))]));
}

/// A world whose repository holds m with versions 1 and 2.
fn two_versions() -> World {
    let mut w = World::new(settings(ControlMode::Explicit), &["m"], false);
    let files = ["config.pbtxt", "1/model.onnx", "2/model.onnx"]
        .map(|p| msg::FileEntry {
            path: p.into(),
            size: 10,
        })
        .to_vec();
    w.repo.push(repo_model_of("m", "k1", files));
    w
}

impl World {
    /// An operator's rollout command (its body) for m, made now.
    fn rollout(&mut self, body: &[u8]) {
        let command = crate::rollout::Command::parse(body).unwrap();
        let (repo, nodes) = (self.repo.clone(), self.nodes.clone());
        self.rc.rollout("m", &command, &repo, &nodes, self.now).unwrap();
    }
}

#[test]
fn a_rollout_places_both_versions_and_its_end_restores_the_config() {
    let mut w = two_versions();
    w.ticks(3);
    let holders = w.holders("m").len();
    assert!(holders > 0);
    let again = |w: &World| -> Vec<String> {
        w.sent
            .iter()
            .filter_map(|c| match c {
                Command::Place {
                    config, again: true, ..
                } => Some(config.clone()),
                _ => None,
            })
            .collect()
    };
    w.rollout(br#"{"action": "start", "candidate": "2", "serving": "1"}"#);
    w.ticks(3);
    let shipped = again(&w);
    assert_eq!(shipped.len(), holders, "each replica placed again once");
    let config = mesh::config::config_from_json(&shipped[0]).unwrap();
    assert_eq!(config.name, "m");
    let policy = config.version_policy.and_then(|p| p.policy_choice);
    let Some(PolicyChoice::Specific(s)) = policy else {
        panic!("{policy:?}")
    };
    assert_eq!(s.versions, [1, 2]);
    // Promoted: version 2 is what the config's own policy (the latest) serves: its config again.
    w.rollout(br#"{"action": "promote"}"#);
    w.ticks(3);
    assert_eq!(again(&w)[holders..], vec![String::new(); holders]);
}

#[test]
fn a_candidate_that_cannot_be_placed_rolls_its_rollout_back_saying_where_and_why() {
    let mut w = two_versions();
    w.ticks(3);
    w.rollout(br#"{"action": "start", "candidate": "2", "serving": "1"}"#);
    assert!(w.rc.judge(&[], w.now).is_empty(), "the guard starts judging");
    w.failing.insert("m".into(), "version 2 has no model file".into());
    w.ticks(3);
    let decided = w.rc.judge(&[], w.now);
    let [(model, crate::rollout::Decision::RollBack { reason })] = decided.as_slice() else {
        panic!("{decided:?}")
    };
    assert_eq!(model, "m");
    assert!(
        reason.starts_with("versions 1 and 2 could not be placed on node 'n") && reason.contains("no model file"),
        "{reason}"
    );
    assert_eq!(w.rc.rollout_of("m").unwrap().share(), 0);
}

#[test]
fn a_rollout_reaches_replicas_placed_before_this_router_led() {
    // The nodes hold m already (placed by a router before this one): this router adopts them.
    let mut w = two_versions();
    let held = crate::membership::NodeModel {
        name: "m".into(),
        version: 1,
        ready: true,
        reason: String::new(),
        placed: true,
        inflight: 0,
    };
    for n in &mut w.nodes {
        n.models = vec![held.clone()];
    }
    w.ticks(5);
    assert!(w.places().is_empty(), "adopted, not placed again: {:?}", w.places());
    w.sent.clear();
    w.rollout(br#"{"action": "start", "candidate": "2", "serving": "1"}"#);
    w.ticks(3);
    let widened: Vec<String> = w
        .sent
        .iter()
        .filter_map(|c| match c {
            Command::Place {
                node,
                config,
                again: true,
                ..
            } if !config.is_empty() => Some(node.clone()),
            _ => None,
        })
        .collect();
    let kept: Vec<String> = w.holders("m").into_iter().collect();
    assert!(!kept.is_empty());
    assert_eq!(
        widened, kept,
        "each adopted replica kept placed again with both versions"
    );
}
