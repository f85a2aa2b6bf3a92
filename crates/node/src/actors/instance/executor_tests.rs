//! The executor without a model: the inline policy, and groups of requests answered once each.
use super::*;

#[test]
fn inline_only_after_short_measurements() {
    let p = InlinePolicy::new(Duration::from_micros(200));
    assert!(!p.allows_inline(), "unknown cost must not run inline");
    p.record(Duration::from_micros(20));
    assert!(p.allows_inline());
    for _ in 0..40 {
        p.record(Duration::from_millis(50));
    }
    assert!(!p.allows_inline(), "a model that became slow moves to its thread");
    for _ in 0..200 {
        p.record(Duration::from_micros(10));
    }
    assert!(p.allows_inline());
}

/// Delivers the places in `order`, then fails with `then` (or succeeds).
struct Scripted {
    order: Vec<usize>,
    then: Option<Error>,
}

impl Backend for Scripted {
    fn execute(&mut self, _: &[NamedTensor], _: &[String]) -> Result<(Vec<NamedTensor>, Timings)> {
        Err(Error::internal("unused"))
    }

    fn execute_each(&mut self, requests: &[RequestView<'_>], deliver: crate::backend::Deliver<'_>) -> Result<()> {
        for &i in &self.order {
            let value = requests[i].id.parse::<i32>().unwrap_or_default();
            let t = mesh::Tensor::from_values(vec![1], &[value]);
            deliver(
                i,
                Ok(vec![NamedTensor {
                    name: "y".into(),
                    tensor: t,
                }]),
            );
            deliver(i, Err(Error::internal("a second answer is dropped")));
        }
        self.then.clone().map_or(Ok(()), Err)
    }
}

fn scripted_executor(order: Vec<usize>, then: Option<Error>) -> Executor {
    test_executor(Box::new(Scripted { order, then }))
}

fn job(id: usize) -> (Job, oneshot::Receiver<Result<Executed>>) {
    let (reply, rx) = oneshot::channel();
    let sub = Submission {
        inputs: Vec::new(),
        outputs: Vec::new(),
        rows: 1,
        priority: 0,
        timeout: None,
        id: id.to_string(),
        parameters: Params::new(),
        trace: None,
        sink: None,
    };
    let job = Job {
        sub,
        enqueued: Instant::now(),
        reply,
    };
    (job, rx)
}

fn value(answer: Result<Executed>) -> Result<i32> {
    let out = answer?.outputs.remove(0);
    Ok(i32::from_le_bytes(out.tensor.data[..4].try_into().unwrap()))
}

#[test]
fn each_request_of_a_group_gets_its_own_answer_once_in_any_order() {
    let exec = scripted_executor(vec![2, 0, 1], None);
    let (jobs, mut rxs): (Vec<_>, Vec<_>) = (0..3).map(job).unzip();
    run_each("t", &exec, jobs);
    for (i, rx) in rxs.iter_mut().enumerate() {
        let answer = rx.try_recv().expect("answered");
        assert_eq!(value(answer).unwrap(), i as i32);
    }
}

#[test]
fn a_failing_exchange_fails_only_the_requests_not_answered_yet() {
    let exec = scripted_executor(vec![1], Some(Error::unavailable("the stub died")));
    let (jobs, mut rxs): (Vec<_>, Vec<_>) = (0..3).map(job).unzip();
    run_each("t", &exec, jobs);
    assert_eq!(value(rxs[1].try_recv().unwrap()).unwrap(), 1);
    for i in [0, 2] {
        let e = value(rxs[i].try_recv().unwrap()).unwrap_err();
        assert!(e.message.contains("the stub died"), "{}", e.message);
    }
}

#[test]
fn a_request_the_backend_never_answers_gets_an_error() {
    let exec = scripted_executor(vec![0], None);
    let (jobs, mut rxs): (Vec<_>, Vec<_>) = (0..2).map(job).unzip();
    run_each("t", &exec, jobs);
    assert!(value(rxs[0].try_recv().unwrap()).is_ok());
    assert!(value(rxs[1].try_recv().unwrap()).is_err());
}

#[test]
fn groups_are_bounded_by_count_and_bytes() {
    assert!(joins_group(1, 0, 64));
    assert!(joins_group(GROUP_MAX - 1, 0, 64));
    assert!(!joins_group(GROUP_MAX, 0, 64), "no more than GROUP_MAX requests");
    assert!(joins_group(1, GROUP_MAX_BYTES - 64, 64));
    assert!(
        !joins_group(1, GROUP_MAX_BYTES - 63, 64),
        "no more than GROUP_MAX_BYTES of inputs"
    );
    assert!(!joins_group(1, usize::MAX, 1), "no overflow");
}

#[test]
fn first_slow_measurement_keeps_it_off_the_runtime() {
    let p = InlinePolicy::new(Duration::from_micros(200));
    p.record(Duration::from_millis(80));
    assert!(!p.allows_inline());
}

#[test]
fn the_executor_threads_timers_have_a_slack_of_one_nanosecond() {
    let slack = std::thread::spawn(|| {
        super::precise_timers();
        // SAFETY: PR_GET_TIMERSLACK reads the calling thread's slack.
        unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) }
    })
    .join()
    .unwrap();
    assert_eq!(slack, 1);
}
