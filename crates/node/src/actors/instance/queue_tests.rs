//! The batching executor thread's queue on a fake clock, and its loop on a real thread with a backend
//! that records the batches it ran.
use std::sync::Mutex;
use std::time::Duration;

use mesh::{NamedTensor, Params, Result, Tensor};
use tokio::sync::oneshot;

use super::*;
use crate::actors::instance::executor::{test_executor, Executed, Submission};
use crate::backend::{Backend, Timings};

fn config(max_batch_size: usize, delay: Duration) -> BatchConfig {
    BatchConfig {
        dynamic: true,
        max_queue_delay: delay,
        ..BatchConfig::unbatched(max_batch_size)
    }
}

/// A request of `rows` rows whose one input holds `value` in each row.
fn job(rows: usize, value: f32, at: Instant) -> (Job, oneshot::Receiver<Result<Executed>>) {
    let (reply, rx) = oneshot::channel();
    let sub = Submission {
        inputs: vec![NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_values(vec![rows as i64, 1], &vec![value; rows]),
        }],
        outputs: Vec::new(),
        rows,
        priority: 0,
        timeout: None,
        id: String::new(),
        parameters: Params::new(),
        trace: None,
        sink: None,
    };
    let job = Job {
        sub,
        enqueued: at,
        reply,
    };
    (job, rx)
}

fn queue(max_batch_size: usize, delay: Duration) -> (Queue, Arc<Health>) {
    let health = Arc::new(Health::new(&[]));
    (Queue::new("q", config(max_batch_size, delay), health.clone()), health)
}

#[test]
fn a_full_batch_is_due_at_once_and_a_partial_one_at_its_delay() {
    let t0 = Instant::now();
    let delay = Duration::from_millis(1);
    let (mut q, _) = queue(4, delay);
    let mut replies = Vec::new();
    for id in 0..2 {
        let (j, rx) = job(1, 1.0, t0);
        q.submit(j, id, 0);
        replies.push(rx);
    }
    let (jobs, wake_at) = q.due(t0);
    assert!(jobs.is_empty(), "two of four rows wait for the delay");
    assert_eq!(wake_at, Some(t0 + delay));
    let (jobs, _) = q.due(t0 + delay);
    assert_eq!(jobs.len(), 2, "the delay passed: the two go together");
    for id in 2..6 {
        let (j, rx) = job(1, 1.0, t0 + delay);
        q.submit(j, id, 0);
        replies.push(rx);
    }
    let (jobs, _) = q.due(t0 + delay);
    assert_eq!(jobs.len(), 4, "a full batch does not wait");
}

#[test]
fn a_restarting_instance_answers_its_queue_at_once() {
    let t0 = Instant::now();
    let (mut q, health) = queue(4, Duration::from_secs(60));
    let (j, mut rx) = job(1, 1.0, t0);
    q.submit(j, 0, 0);
    health.mark_failed();
    let (jobs, wake_at) = q.due(t0);
    assert!(jobs.is_empty() && wake_at.is_none());
    let Err(e) = rx.try_recv().expect("answered") else {
        panic!("a restarting instance ran a request")
    };
    assert!(e.message.contains("restarting"), "{}", e.message);
}

#[test]
fn cancelled_requests_and_those_whose_clients_left_are_not_run() {
    let t0 = Instant::now();
    let (mut q, _) = queue(2, Duration::ZERO);
    let (a, _gone) = job(1, 1.0, t0);
    let (b, b_rx) = job(1, 2.0, t0);
    let (c, _c_rx) = job(1, 3.0, t0);
    q.submit(a, 0, 0);
    q.submit(b, 1, 0);
    q.submit(c, 2, 0);
    q.cancel(0);
    drop(b_rx);
    let (jobs, _) = q.due(t0);
    assert_eq!(
        jobs.len(),
        1,
        "a cancelled request and one whose client left are dropped"
    );
    assert_eq!(jobs[0].sub.inputs[0].tensor.data[..4], 3.0f32.to_ne_bytes());
}

#[test]
fn a_full_queue_refuses_as_overloaded() {
    let t0 = Instant::now();
    let mut cfg = config(4, Duration::from_secs(60));
    cfg.default_policy.max_queue_size = 1;
    let mut q = Queue::new("q", cfg, Arc::new(Health::new(&[])));
    let (a, _a) = job(1, 1.0, t0);
    let (b, mut b_rx) = job(1, 1.0, t0);
    q.submit(a, 0, 0);
    q.submit(b, 1, 0);
    let Err(e) = b_rx.try_recv().expect("refused at once") else {
        panic!("a request past the queue's size ran")
    };
    assert_eq!(e.code, mesh::Code::Overloaded, "{}", e.message);
}

/// Returns its input; says the rows of each execution as it starts, then waits for the gate.
struct Recorder {
    started: mpsc::Sender<usize>,
    gate: Arc<Mutex<()>>,
}

impl Backend for Recorder {
    fn execute(&mut self, inputs: &[NamedTensor], _: &[String]) -> Result<(Vec<NamedTensor>, Timings)> {
        let _ = self.started.send(inputs[0].tensor.shape[0] as usize);
        let _held = self.gate.lock().unwrap();
        Ok((inputs.to_vec(), Timings::default()))
    }
}

fn recording_executor() -> (Executor, mpsc::Receiver<usize>, Arc<Mutex<()>>) {
    let (started, batches) = mpsc::channel();
    let gate = Arc::new(Mutex::new(()));
    let backend = Recorder {
        started,
        gate: Arc::clone(&gate),
    };
    let exec = test_executor(Box::new(backend));
    (exec, batches, gate)
}

/// Waits (at most a minute, a guard against a hang) for a request's answer.
fn answer(rx: &mut oneshot::Receiver<Result<Executed>>) -> Result<Executed> {
    let guard = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(a) = rx.try_recv() {
            return a;
        }
        assert!(Instant::now() < guard, "a request was never answered");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn requests_that_arrive_while_a_batch_runs_form_the_next_one() {
    // No delay: the thread runs whatever is queued as soon as it is free. The first request runs
    // alone, held in the backend by the test; the six sent meanwhile are one batch after it.
    let (exec, batches, gate) = recording_executor();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || batching_loop("q", &exec, &rx, config(8, Duration::ZERO)));
    let held = gate.lock().unwrap();
    let (first, mut first_rx) = job(1, 0.0, Instant::now());
    tx.send(ExecMsg::Submit(Box::new((first, 0, 0)))).unwrap();
    let rows = batches
        .recv_timeout(Duration::from_secs(60))
        .expect("the first request runs");
    assert_eq!(rows, 1);
    let mut rest = Vec::new();
    for id in 1..7u64 {
        let (j, rx) = job(1, id as f32, Instant::now());
        tx.send(ExecMsg::Submit(Box::new((j, id, 0)))).unwrap();
        rest.push(rx);
    }
    drop(held);
    assert!(answer(&mut first_rx).is_ok());
    for (i, rx) in rest.iter_mut().enumerate() {
        let out = answer(rx).expect("answered").outputs.remove(0);
        assert_eq!(
            out.tensor.data[..4],
            ((i + 1) as f32).to_ne_bytes(),
            "each gets its own row"
        );
    }
    assert_eq!(batches.try_iter().collect::<Vec<_>>(), vec![6], "one batch of the six");
    drop(tx);
    thread.join().unwrap();
}

#[test]
fn a_partial_batch_runs_at_its_delay_and_the_thread_ends_with_its_handle() {
    let (exec, batches, _gate) = recording_executor();
    let (tx, rx) = mpsc::channel();
    let delay = Duration::from_millis(20);
    let thread = std::thread::spawn(move || batching_loop("q", &exec, &rx, config(8, delay)));
    let sent = Instant::now();
    let mut replies = Vec::new();
    for id in 0..3u64 {
        let (j, rx) = job(1, id as f32, Instant::now());
        tx.send(ExecMsg::Submit(Box::new((j, id, 0)))).unwrap();
        replies.push(rx);
    }
    for rx in &mut replies {
        assert!(answer(rx).is_ok());
    }
    assert!(sent.elapsed() >= delay, "a partial batch waits for its delay");
    assert_eq!(batches.try_iter().collect::<Vec<_>>(), vec![3]);
    // A request still queued when the handle goes is answered, not left hanging.
    let (j, mut last) = job(1, 9.0, Instant::now());
    tx.send(ExecMsg::Submit(Box::new((j, 9, 0)))).unwrap();
    drop(tx);
    thread.join().unwrap();
    assert!(last.try_recv().is_ok(), "answered before the thread ended");
}
