//! Tests of reading the operator's rollout commands: defaults, every field's checks and bounds in
//! words naming the field, and a command handed on to the leader reading back as itself.
use super::*;

fn parse(body: &str) -> Result<Command> {
    Command::parse(body.as_bytes())
}

fn refused(body: &str) -> String {
    let e = parse(body).expect_err(body);
    assert_eq!(e.code, Code::InvalidArgument, "{body}: {e}");
    e.message
}

#[test]
fn a_start_takes_defaults_and_reads_back_as_itself() {
    let Command::Start(s) = parse(r#"{"action": "start", "candidate": "2"}"#).unwrap() else {
        panic!("a start")
    };
    assert_eq!(
        s,
        Start {
            candidate: "2".into(),
            serving: None,
            steps: DEFAULT_STEPS.to_vec(),
            min_step_seconds: DEFAULT_STEP_SECONDS,
            min_step_requests: DEFAULT_STEP_REQUESTS,
            guard: Guard::default(),
            shadow: 0,
        }
    );
    let full = r#"{"action": "start", "candidate": 3, "serving": "01", "steps": [10, 100],
        "min_step_seconds": 0, "min_step_requests": 5, "min_requests": 7,
        "max_error_rate_increase": 0.05, "max_p99_ratio": 2, "shadow": 10}"#;
    let c = parse(full).unwrap();
    let Command::Start(s) = &c else { panic!("a start") };
    assert_eq!(
        (s.candidate.as_str(), s.serving.as_deref(), s.shadow),
        ("3", Some("1"), 10)
    );
    assert_eq!(
        (s.steps.clone(), s.min_step_seconds, s.min_step_requests),
        (vec![10, 100], 0, 5)
    );
    assert_eq!(
        s.guard,
        Guard {
            min_requests: 7,
            max_error_rate_increase: 0.05,
            max_p99_ratio: 2.0
        }
    );
    assert_eq!(Command::parse(c.body().to_string().as_bytes()).unwrap(), c);
    for (body, command) in [
        ("pause", Command::Pause),
        ("resume", Command::Resume),
        ("promote", Command::Promote),
        ("abort", Command::Abort),
    ] {
        let c = parse(&format!(r#"{{"action": "{body}"}}"#)).unwrap();
        assert_eq!(c, command);
        assert_eq!(c.name(), body);
        assert_eq!(Command::parse(c.body().to_string().as_bytes()).unwrap(), c);
    }
}

#[test]
fn versions_are_positive_integers_as_triton_names_them() {
    for bad in [
        r#""0""#, "0", "-1", r#""v2""#, r#""""#, "1.5", r#""1.5""#, r#"" 2""#, "null", "[2]",
    ] {
        let m = refused(&format!(r#"{{"action": "start", "candidate": {bad}}}"#));
        assert!(m.contains("'candidate' must be a version"), "{bad}: {m}");
    }
    let m = refused(r#"{"action": "start", "candidate": "99999999999999999999"}"#);
    assert!(m.contains("positive integer"), "{m}");
    let m = refused(r#"{"action": "start", "candidate": "2", "serving": "x"}"#);
    assert!(m.contains("'serving' must be a version"), "{m}");
    assert!(refused(r#"{"action": "start"}"#).contains("needs 'candidate'"));
    assert_eq!(version(&serde_json::json!("0042"), "c").unwrap(), "42");
    let m = refused(r#"{"action": "start", "candidate": "2", "serving": "2"}"#);
    assert!(m.contains("'serving' and 'candidate' are both version 2"), "{m}");
}

#[test]
fn steps_and_margins_are_checked_and_bounded() {
    let start = |extra: &str| refused(&format!(r#"{{"action": "start", "candidate": "2", {extra}}}"#));
    for bad in [
        "[]",
        "[0, 100]",
        "[5, 101]",
        "[-5, 100]",
        "[5.5, 100]",
        "\"5,100\"",
        "[\"5\", 100]",
    ] {
        assert!(
            start(&format!(r#""steps": {bad}"#)).contains("'steps' must be"),
            "{bad}"
        );
    }
    let many: Vec<String> = (1..=21).map(|i| i.to_string()).collect();
    assert!(start(&format!(r#""steps": [{},100]"#, many.join(","))).contains("at most 20"));
    assert!(start(r#""steps": [50, 25, 100]"#).contains("must rise"));
    assert!(start(r#""steps": [5, 50]"#).contains("end at 100"));
    assert!(start(r#""steps": [5, 5, 100]"#).contains("must rise"));
    assert!(start(r#""min_step_seconds": -1"#).contains("'min_step_seconds' must be a whole number from 0"));
    assert!(start(r#""min_step_seconds": 604801"#).contains("to 604800"));
    assert!(start(r#""min_step_requests": 1.5"#).contains("'min_step_requests'"));
    assert!(start(r#""min_requests": 0"#).contains("'min_requests' must be a whole number from 1"));
    assert!(start(r#""max_error_rate_increase": 1.5"#).contains("between 0 and 1"));
    assert!(start(r#""max_error_rate_increase": -0.1"#).contains("between 0 and 1"));
    assert!(start(r#""max_error_rate_increase": "x""#).contains("must be a number"));
    assert!(start(r#""max_p99_ratio": 0.9"#).contains("at least 1"));
    assert!(
        start(r#""max_p99_ratio": 1e400"#).contains("rollout request"),
        "JSON's own limit"
    );
}

#[test]
fn bodies_are_objects_with_a_known_action_and_known_fields_only() {
    assert!(refused("[]").contains("a JSON object"));
    assert!(refused("not json").contains("failed to parse the rollout request"));
    assert!(refused("{}").contains("give 'action'"));
    assert!(refused(r#"{"action": 1}"#).contains("give 'action'"));
    assert!(refused(r#"{"action": "restart"}"#).contains("unknown rollout action 'restart'"));
    let m = refused(r#"{"action": "restart", "candidate": "2"}"#);
    assert!(m.contains("unknown rollout action"), "{m}");
    let m = refused(r#"{"action": "pause", "candidate": "2"}"#);
    assert!(
        m.contains("'candidate' is not a field of the rollout action 'pause'"),
        "{m}"
    );
    let m = refused(r#"{"action": "start", "candidate": "2", "shadow": 101}"#);
    assert!(m.contains("'shadow' must be a whole number from 0 to 100"), "{m}");
    let long = format!(r#"{{"action": "{}"}}"#, "x".repeat(500));
    assert!(refused(&long).len() < 200, "a client's text is cut short in errors");
    let huge = format!(r#"{{"action": "pause", "pad": "{}"}}"#, " ".repeat(MAX_BODY_BYTES));
    assert_eq!(parse(&huge).unwrap_err().code, Code::PayloadTooLarge);
}

#[test]
fn mangled_bodies_are_refused_never_a_panic() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let good = [
        r#"{"action": "start", "candidate": 3, "serving": "1", "steps": [10, 100], "min_step_seconds": 0,
            "min_step_requests": 5, "min_requests": 7, "max_error_rate_increase": 0.05, "max_p99_ratio": 2,
            "shadow": 10}"#
            .to_string(),
        super::super::report::body(&super::super::Tally::new("1", "2", 7)).to_string(),
        r#"{"action": "pause"}"#.to_string(),
    ];
    let mut rng = StdRng::seed_from_u64(59);
    for _ in 0..20_000 {
        let mut b = good[rng.random_range(0..good.len())].clone().into_bytes();
        for _ in 0..rng.random_range(1..6) {
            let at = rng.random_range(0..b.len().max(1));
            let last = b.len().saturating_sub(1);
            let symbol = b"0123456789-.e\"{}[],:"[rng.random_range(0..20)];
            match rng.random_range(0..4) {
                0 if !b.is_empty() => b[at.min(last)] = rng.random(),
                1 => b.insert(at.min(b.len()), symbol),
                2 if !b.is_empty() => {
                    b.remove(at.min(last));
                }
                _ => b.truncate(at),
            }
        }
        let _ = Command::parse(&b);
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) {
            let _ = super::super::report::parse(&v);
        }
    }
}
