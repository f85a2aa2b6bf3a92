//! Tests of rollouts in placement: a start checked against what the cluster places, the
//! operator's commands, the intent that carries them to etcd, and a new leader or a follower
//! taking them from the stored intent.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use mesh::cluster::msg::FileEntry;
use mesh::control::ControlMode;
use mesh::error::Code;
use mesh::Result;

use super::*;
use crate::lead::{Desired, Role};
use crate::membership::{NodeModel, NodeSummary};
use crate::rollout::{Arm, Command, Decision, Phase, Start, Stored, Tally};
use std::time::Duration;

/// Model `m` with versions 1, 2 and 3.
fn repo() -> Vec<Arc<RepoModel>> {
    let file = |path: &str| FileEntry {
        path: path.into(),
        size: 10,
    };
    let files = ["config.pbtxt", "1/model.onnx", "2/model.onnx", "3/a/b.bin"];
    vec![super::tests::repo_model_of("m", "k", files.map(file).to_vec())]
}

fn intent(rollouts: &[(&str, Stored)]) -> Arc<Desired> {
    Arc::new(Desired {
        wanted: [("m".to_string(), String::new())].into(),
        rollouts: rollouts.iter().map(|(m, r)| (m.to_string(), r.clone())).collect(),
        ..Default::default()
    })
}

/// A router in `role` whose placer holds `m` (explicitly loaded).
fn router(role: &Role) -> (Reconcile, Instant) {
    let now = Instant::now();
    let mut rc = Reconcile::new(
        super::tests::settings(ControlMode::Explicit),
        BTreeSet::from(["m".to_string()]),
        true,
        now,
    );
    assert!(rc.follow(role, &repo()).is_empty());
    tick(&mut rc, now);
    (rc, now)
}

fn tick(rc: &mut Reconcile, now: Instant) -> Output {
    rc.tick(&Snapshot {
        now,
        nodes: &[],
        repo: &repo(),
        used: &[],
    })
}

fn leader(epoch: u64, rollouts: &[(&str, Stored)]) -> Role {
    Role::Leader {
        epoch,
        state: intent(rollouts),
    }
}

fn start(candidate: &str, serving: Option<&str>) -> Command {
    let Command::Start(mut s) = Command::parse(br#"{"action": "start", "candidate": "1"}"#).unwrap() else {
        unreachable!()
    };
    s.candidate = candidate.into();
    s.serving = serving.map(str::to_string);
    Command::Start(Start {
        steps: vec![5, 50, 100],
        ..s
    })
}

fn run(rc: &mut Reconcile, model: &str, c: Command, nodes: &[NodeSummary]) -> Result<Stored> {
    rc.rollout(model, &c, &repo(), nodes, Instant::now())
}

#[test]
fn a_start_is_checked_against_what_the_cluster_places() {
    let (mut rc, _) = router(&leader(1, &[]));
    let e = run(&mut rc, "x", start("2", None), &[]).unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert!(e.message.contains("model 'x' is not placed"), "{e}");
    let e = run(&mut rc, "m", start("7", None), &[]).unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert!(
        e.message
            .contains("no version 7 in the cluster repository (its versions: 1, 2, 3)"),
        "{e}"
    );
    let e = run(&mut rc, "m", start("2", Some("9")), &[]).unwrap_err();
    assert!(e.message.contains("no version 9"), "{e}");
    let e = run(&mut rc, "m", Command::Pause, &[]).unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert!(e.message.contains("has no rollout to pause"), "{e}");

    // No node serves it yet: it rolls out from the newest version below the candidate.
    let r = run(&mut rc, "m", start("3", None), &[]).unwrap();
    assert_eq!(
        (r.serving.as_str(), r.candidate.as_str(), r.phase.clone(), r.share()),
        ("2", "3", Phase::Running { step: 0 }, 5)
    );
    let e = run(&mut rc, "m", start("2", Some("1")), &[]).unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists);
    assert!(
        e.message.contains("has a rollout running already (version 2 to 3, 5%)"),
        "{e}"
    );
    assert_eq!(rc.rollout_of("m"), Some(&r), "the refused start changed nothing");
}

#[test]
fn a_start_that_names_no_serving_version_takes_the_one_nodes_serve() {
    let (mut rc, _) = router(&leader(1, &[]));
    let serving = |version: i64, ready: bool| NodeSummary {
        models: vec![NodeModel {
            name: "m".into(),
            version,
            ready,
            reason: String::new(),
            placed: true,
            inflight: 0,
        }],
        ..super::tests::node("n1", 1)
    };
    let r = run(&mut rc, "m", start("3", None), &[serving(1, true)]).unwrap();
    assert_eq!(r.serving, "1");
    run(&mut rc, "m", Command::Abort, &[]).unwrap();
    let r = run(&mut rc, "m", start("3", None), &[serving(1, false)]).unwrap();
    assert_eq!(r.serving, "2", "a replica not ready serves nothing");
    run(&mut rc, "m", Command::Abort, &[]).unwrap();
    let e = run(&mut rc, "m", start("1", None), &[]).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e.message.contains("give 'serving'"), "{e}");
}

#[test]
fn the_operators_commands_are_stored_in_the_intent_and_shown() {
    let (mut rc, now) = router(&leader(1, &[]));
    run(&mut rc, "m", start("2", Some("1")), &[]).unwrap();
    let paused = run(&mut rc, "m", Command::Pause, &[]).unwrap();
    assert_eq!(paused.phase, Phase::Paused { step: 0 });
    let out = tick(&mut rc, now);
    let stored = out.intent.expect("a leader stores its intent");
    assert_eq!(stored.rollouts.get("m"), Some(&paused));
    assert_eq!(out.view.rollouts, vec![("m".to_string(), paused.clone())]);
    assert_eq!(
        run(&mut rc, "m", Command::Resume, &[]).unwrap().phase,
        Phase::Running { step: 0 }
    );
    assert_eq!(run(&mut rc, "m", Command::Promote, &[]).unwrap().phase, Phase::Promoted);
    let e = run(&mut rc, "m", Command::Abort, &[]).unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists);
    // Over, it may be followed by a new one.
    let next = run(&mut rc, "m", start("3", Some("2")), &[]).unwrap();
    assert_eq!(rc.intent(&repo()).rollouts["m"], next);
    // Unloaded, the model's rollout goes with it.
    rc.unload("m").unwrap();
    assert!(rc.intent(&repo()).rollouts.is_empty());
}

#[test]
fn a_new_leader_and_a_follower_carry_on_from_the_stored_intent() {
    let (mut first, _) = router(&leader(1, &[]));
    run(&mut first, "m", start("2", Some("1")), &[]).unwrap();
    let paused = run(&mut first, "m", Command::Pause, &[]).unwrap();
    let stored = first.intent(&repo());

    // Another router takes over from what etcd holds: the rollout is where it was.
    let (mut next, now) = router(&leader(2, &[("m", paused.clone())]));
    assert_eq!(next.rollout_of("m"), Some(&paused));
    assert_eq!(tick(&mut next, now).intent.unwrap().rollouts, stored.rollouts);
    assert_eq!(
        run(&mut next, "m", Command::Resume, &[]).unwrap().phase,
        Phase::Running { step: 0 }
    );

    // A follower shows the leader's rollout, and picks up its changes.
    let follower = |rollouts: &[(&str, Stored)]| Role::Follower {
        leader: "r1".into(),
        http: "10.0.0.1:8000".into(),
        state: intent(rollouts),
    };
    let (mut f, now) = router(&follower(&[("m", paused.clone())]));
    assert_eq!(tick(&mut f, now).view.rollouts, vec![("m".to_string(), paused.clone())]);
    let mut promoted = paused.clone();
    promoted.phase = Phase::Promoted;
    f.follow(&follower(&[("m", promoted.clone())]), &repo());
    assert_eq!(f.rollout_of("m"), Some(&promoted));
    assert!(tick(&mut f, now).intent.is_none(), "a follower stores nothing");
}

/// A start of `m` from 1 to 2 in steps 50, 100 that judges after 10 answers, with no minimum time.
fn quick_start() -> Command {
    Command::parse(
        br#"{"action": "start", "candidate": "2", "serving": "1", "steps": [50, 100],
             "min_step_seconds": 0, "min_step_requests": 10, "min_requests": 10}"#,
    )
    .unwrap()
}

/// A router's tally of `n` answers of each version, `bad` of the candidate's failing.
fn tally(versions: (&str, &str, u64), n: u32, bad: u32) -> Vec<(String, Tally)> {
    let mut t = Tally::new(versions.0, versions.1, versions.2);
    for i in 0..n {
        t.record(Arm::Serving, true, Duration::from_millis(10));
        t.record(Arm::Candidate, i >= bad, Duration::from_millis(10));
    }
    vec![("m".to_string(), t)]
}

#[test]
fn the_leaders_guard_advances_on_the_routers_tallies_and_stores_each_step() {
    let (mut rc, now) = router(&leader(1, &[]));
    let started = run(&mut rc, "m", quick_start(), &[]).unwrap().started;
    assert_eq!(
        rc.judge(&tally(("1", "2", started), 5, 0), now),
        vec![],
        "too few answers yet"
    );
    assert_eq!(
        rc.judge(&tally(("1", "2", started + 1), 50, 0), now),
        vec![],
        "an earlier or later rollout of the same versions counts for nothing"
    );
    assert_eq!(
        rc.judge(&tally(("2", "3", started), 50, 0), now),
        vec![],
        "another rollout's tally counts for nothing"
    );
    assert_eq!(
        rc.judge(&tally(("1", "2", started), 5, 0), now),
        vec![("m".to_string(), Decision::Advance { step: 1, share: 100 })]
    );
    assert_eq!(rc.rollout_of("m").unwrap().phase, Phase::Running { step: 1 });
    assert_eq!(
        tick(&mut rc, now).intent.unwrap().rollouts["m"].phase,
        Phase::Running { step: 1 }
    );
    assert_eq!(
        rc.judge(&tally(("1", "2", started), 10, 0), now),
        vec![("m".to_string(), Decision::Promote)]
    );
    assert_eq!(rc.rollout_of("m").unwrap().phase, Phase::Promoted);
    assert_eq!(
        rc.judge(&tally(("1", "2", started), 10, 10), now),
        vec![],
        "over: nothing to judge"
    );
}

#[test]
fn a_failing_candidate_is_rolled_back_with_why_and_a_follower_judges_nothing() {
    let (mut rc, now) = router(&leader(1, &[]));
    let started = run(&mut rc, "m", quick_start(), &[]).unwrap().started;
    let decided = rc.judge(&tally(("1", "2", started), 10, 2), now);
    let [(_, Decision::RollBack { reason })] = decided.as_slice() else {
        panic!("{decided:?}")
    };
    assert!(reason.contains("version 2 failed 20.0% of 10 requests"), "{reason}");
    assert_eq!(rc.rollout_of("m").unwrap().share(), 0);
    let out = tick(&mut rc, now);
    assert_eq!(
        out.intent.unwrap().rollouts["m"].phase,
        Phase::RolledBack { reason: reason.clone() }
    );
    let events: Vec<&str> = out
        .view
        .events
        .iter()
        .filter(|e| e.kind == crate::place::EventKind::Rollout)
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(events[0], "start: version 1 to 2, running (50%)");
    assert!(events[1].starts_with("rolled back: version 2 failed"), "{events:?}");

    let running = rc.rollout_of("m").map(|r| Stored {
        phase: Phase::Running { step: 0 },
        ..r.clone()
    });
    let follower = Role::Follower {
        leader: "r1".into(),
        http: "10.0.0.1:8000".into(),
        state: intent(&[("m", running.clone().unwrap())]),
    };
    let (mut f, now) = router(&follower);
    assert_eq!(f.judge(&tally(("1", "2", started), 10, 10), now), vec![]);
    assert_eq!(f.rollout_of("m"), running.as_ref());
}

#[test]
fn a_model_is_placed_with_both_versions_while_its_rollout_runs() {
    let (mut rc, _) = router(&leader(1, &[]));
    let own = || Arc::try_unwrap(repo().remove(0)).expect("one holder");
    let m = own();
    assert_eq!(rc.placed_config(&m), "", "no rollout: its own config");
    run(&mut rc, "m", start("2", Some("1")), &[]).unwrap();
    let placed = mesh::config::config_from_json(&rc.placed_config(&m)).unwrap();
    assert_eq!(
        format!("{:?}", placed.version_policy.unwrap().policy_choice.unwrap()),
        "Specific(Specific { versions: [1, 2] })"
    );
    assert!(
        placed.parameters.contains_key(mesh::config::VERSION_POLICY_ONLY) && placed.backend.is_empty(),
        "the policy only: the node reads its own config"
    );
    // Placed with a load's config override: that override, the policy in it.
    let overridden = RepoModel {
        config_override: r#"{"name": "m", "backend": "python", "max_batch_size": 4}"#.into(),
        config: mesh::config::config_from_json(r#"{"name": "m", "backend": "python", "max_batch_size": 4}"#).unwrap(),
        ..own()
    };
    let placed = mesh::config::config_from_json(&rc.placed_config(&overridden)).unwrap();
    assert_eq!((placed.backend.as_str(), placed.max_batch_size), ("python", 4));
    assert!(placed.parameters.is_empty() && placed.version_policy.is_some());
    // Rolled back: version 1 is not what its own policy serves (the latest, 3), so it is pinned.
    run(&mut rc, "m", Command::Abort, &[]).unwrap();
    let placed = mesh::config::config_from_json(&rc.placed_config(&m)).unwrap();
    assert_eq!(
        format!("{:?}", placed.version_policy.unwrap().policy_choice.unwrap()),
        "Specific(Specific { versions: [1] })"
    );
    // A load places it as its config says again.
    rc.load("m", None, Instant::now());
    assert_eq!(rc.placed_config(&m), "");
}
