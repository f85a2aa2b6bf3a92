//! Tests of a stored rollout: its spec round trip, the operator's commands through the rollout's
//! own transitions (a rollout that is over takes none), its share and what status shows.
use super::*;

fn stored(phase: Phase) -> Stored {
    let spec = Spec {
        model: "m".into(),
        serving: "1".into(),
        candidate: "2".into(),
        steps: vec![5, 25, 100],
        min_step_time: Duration::from_secs(30),
        min_step_requests: 50,
        guard: Guard::default(),
        shadow: 0,
    };
    let s = Stored::new(&spec, phase);
    assert_eq!(s.spec("m"), spec);
    s
}

#[test]
fn the_operators_commands_move_it_and_one_that_is_over_takes_none() {
    let now = Instant::now();
    let mut s = stored(Phase::Running { step: 1 });
    assert_eq!((s.share(), s.state(), s.is_open()), (25, "running", true));
    s.act("m", &Command::Pause, now).unwrap();
    assert_eq!((s.phase.clone(), s.share()), (Phase::Paused { step: 1 }, 25));
    s.act("m", &Command::Pause, now).unwrap();
    s.act("m", &Command::Resume, now).unwrap();
    assert_eq!(s.phase, Phase::Running { step: 1 });
    s.act("m", &Command::Promote, now).unwrap();
    assert_eq!((s.state(), s.share(), s.is_open()), ("promoted", 100, false));
    for c in [Command::Pause, Command::Resume, Command::Promote, Command::Abort] {
        let e = s.act("m", &c, now).unwrap_err();
        assert_eq!(e.code, Code::AlreadyExists, "{e}");
        assert!(e.message.contains("is over (promoted)"), "{e}");
        assert!(e.message.contains(&format!("cannot {}", c.name())), "{e}");
    }
    let mut s = stored(Phase::Paused { step: 0 });
    s.act("m", &Command::Abort, now).unwrap();
    assert_eq!((s.state(), s.share()), ("aborted", 0));
    let mut back = stored(Phase::RolledBack { reason: "slow".into() });
    assert_eq!(
        back.act("m", &Command::Resume, now).unwrap_err().code,
        Code::AlreadyExists
    );
}

#[test]
fn status_shows_its_state_step_share_and_reason() {
    let v = stored(Phase::Paused { step: 1 }).status("m");
    assert_eq!(
        (
            &v["model"],
            &v["state"],
            &v["step"],
            &v["share"],
            &v["serving"],
            &v["candidate"]
        ),
        (
            &json!("m"),
            &json!("paused"),
            &json!(1),
            &json!(25),
            &json!("1"),
            &json!("2")
        )
    );
    assert_eq!(v["steps"], json!([5, 25, 100]));
    let v = stored(Phase::RolledBack {
        reason: "version 2 failed 20.0%".into(),
    })
    .status("m");
    assert_eq!(
        (&v["state"], &v["step"], &v["share"]),
        (&json!("rolled_back"), &Value::Null, &json!(0))
    );
    assert_eq!(v["reason"], "version 2 failed 20.0%");
}

#[test]
fn only_a_rollout_that_can_be_carried_on_is_sound() {
    assert!(stored(Phase::Running { step: 2 }).is_sound());
    assert!(!stored(Phase::Running { step: 3 }).is_sound());
    let mut s = stored(Phase::Aborted);
    assert!(s.is_sound());
    s.steps = vec![50, 100, 25];
    assert!(!s.is_sound());
    let mut s = stored(Phase::Promoted);
    s.max_p99_ratio = f64::NAN;
    assert!(!s.is_sound());
}
