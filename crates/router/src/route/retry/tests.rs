//! Tests of every retry rule and its message, on a fake clock.
use std::time::{Duration, Instant};

use mesh::{Code, Error};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn request(t0: Instant) -> RequestState {
    let mut r = RequestState::new("m", t0, t0 + ms(1000));
    r.sent(11, "a");
    r
}

fn given_up(d: Decision) -> Error {
    match d {
        Decision::GiveUp(e) => e,
        Decision::Retry => panic!("expected a give-up"),
    }
}

#[test]
fn not_started_and_overloaded_are_retried_even_when_unsafe_to_rerun() {
    let t0 = Instant::now();
    let p = RetryPolicy::default();
    for r in [request(t0), request(t0).non_idempotent()] {
        assert_eq!(p.decide(&r, Failure::NotSent("draining".into()), t0), Decision::Retry);
        assert_eq!(
            p.decide(&r, Failure::Overloaded(Error::overloaded("queue full")), t0),
            Decision::Retry
        );
    }
}

#[test]
fn lost_is_retried_for_an_idempotent_stateless_request() {
    let t0 = Instant::now();
    let r = request(t0);
    assert_eq!(
        RetryPolicy::default().decide(&r, Failure::Lost("connection closed".into()), t0 + ms(5)),
        Decision::Retry
    );
}

#[test]
fn answered_errors_go_to_the_client_untouched() {
    let t0 = Instant::now();
    let e = Error::invalid("input 'x' has the wrong shape");
    let d = RetryPolicy::default().decide(&request(t0), Failure::Answered(e.clone()), t0);
    assert_eq!(d, Decision::GiveUp(e));
}

#[test]
fn a_stream_that_answered_is_not_retried_after_loss() {
    let t0 = Instant::now();
    let mut r = request(t0);
    r.answered();
    r.answered();
    assert_eq!(r.answers(), 2);
    let e = given_up(RetryPolicy::default().decide(&r, Failure::Lost("idle timeout".into()), t0));
    assert_eq!(e.code, Code::Unavailable);
    assert_eq!(
        e.message,
        "model 'm': node 'a' was lost after 2 of the stream's answers (idle timeout); \
         a stream that already answered is not retried"
    );
    // A stream that answered is still retried when the node refused before running it.
    assert_eq!(
        RetryPolicy::default().decide(&r, Failure::NotSent("draining".into()), t0),
        Decision::Retry
    );
}

#[test]
fn a_non_idempotent_request_is_not_retried_after_loss() {
    let t0 = Instant::now();
    let r = request(t0).non_idempotent();
    let e = given_up(RetryPolicy::default().decide(&r, Failure::Lost("connection closed".into()), t0));
    assert_eq!(e.code, Code::Unavailable);
    assert_eq!(
        e.message,
        "model 'm': node 'a' was lost while it had the request (connection closed); the request may have run \
         and the model is marked non-idempotent, so it is not retried"
    );
}

#[test]
fn a_sequence_request_never_moves_to_another_node() {
    let t0 = Instant::now();
    let r = request(t0).in_sequence();
    for failure in [
        Failure::Lost("reset".into()),
        Failure::NotSent("draining".into()),
        Failure::Overloaded(Error::overloaded("queue full")),
    ] {
        let e = given_up(RetryPolicy::default().decide(&r, failure, t0));
        assert_eq!(e.code, Code::Unavailable);
        assert!(
            e.message.contains("a sequence request stays on its node"),
            "{}",
            e.message
        );
        assert!(e.message.ends_with("it is not moved to another node"), "{}", e.message);
    }
}

#[test]
fn attempts_are_bounded() {
    let t0 = Instant::now();
    let p = RetryPolicy::default();
    let mut r = request(t0);
    r.sent(12, "b");
    assert_eq!(p.decide(&r, Failure::Lost("closed".into()), t0), Decision::Retry);
    r.sent(13, "c");
    assert_eq!(r.attempts(), 3);
    assert_eq!(r.tried(), &[11, 12, 13]);
    let e = given_up(p.decide(&r, Failure::Overloaded(Error::overloaded("busy")), t0));
    assert_eq!(e.code, Code::Unavailable);
    assert_eq!(
        e.message,
        "model 'm': gave up after 3 attempts (nodes tried: a, b, c); last failure: node 'c' is overloaded: busy"
    );
    // The bound is configurable.
    let p5 = RetryPolicy::new(RetrySettings { max_attempts: 5 });
    assert_eq!(
        p5.decide(&r, Failure::Overloaded(Error::overloaded("busy")), t0),
        Decision::Retry
    );
    let p1 = RetryPolicy::new(RetrySettings { max_attempts: 1 });
    assert!(matches!(
        p1.decide(&request(t0), Failure::NotSent("x".into()), t0),
        Decision::GiveUp(_)
    ));
}

#[test]
fn the_deadline_ends_retries() {
    let t0 = Instant::now();
    let r = request(t0);
    let p = RetryPolicy::default();
    assert_eq!(
        p.decide(&r, Failure::NotSent("draining".into()), t0 + ms(999)),
        Decision::Retry
    );
    let e = given_up(p.decide(&r, Failure::NotSent("draining".into()), t0 + ms(1000)));
    assert_eq!(e.code, Code::Unavailable);
    assert_eq!(
        e.message,
        "model 'm': the request's deadline passed after 1000 ms and 1 attempt (nodes tried: a); \
         last failure: node 'a' did not start it: draining"
    );
}

#[test]
fn waiting_out_the_deadline_names_the_reason() {
    let t0 = Instant::now();
    let r = RequestState::new("m", t0, t0 + ms(500));
    assert!(!r.expired(t0 + ms(499)));
    assert!(r.expired(t0 + ms(500)));
    let e = r.waited_out("model 'm' has no available replica", t0 + ms(500));
    assert_eq!(e.code, Code::Unavailable);
    assert_eq!(
        e.message,
        "model 'm': the request's deadline passed after 500 ms waiting for a replica (0 attempts; no node \
         tried): model 'm' has no available replica"
    );
}
