//! Decoupled Python models: an `execute` returns as soon as the model's `execute` does, and each
//! request's answers reach its client whenever the model sends them, from `execute` or later from
//! its own threads, while the instance already runs its next `execute`. A reading thread takes
//! every frame of the stub: stream answers go straight to their requests, BLS calls to the node,
//! and the rest to the instance's thread. A client that goes away reaches `is_cancelled()` as a
//! `cancel` frame.
use mesh::sync::Locked;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::{Error, NamedTensor, Result};
use serde_json::{json, Value};

use super::bls::{self, Answers};
use super::ipc::read_frame;
use super::{decode_response, log, stub_error, PythonBackend, PythonContext};
use crate::backend::{PerRequest, RequestView, ResponseSink, Taken, Timings};

/// How often the reading thread looks for requests whose client went away.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Triton's TRITONSERVER_RESPONSE_COMPLETE_FINAL.
const FINAL: u64 = 1;

/// A request by its execution's number and its place in it.
type Key = (u64, usize);

struct Open {
    sink: ResponseSink,
    cancel_sent: bool,
    /// A warm-up request with no client, read only once execute returns: its stub gets its
    /// allowance back at once, or an execute that streams many answers would wait on itself.
    local: bool,
}

/// The requests of a decoupled instance that have not sent their final flag yet.
#[derive(Default)]
pub(super) struct Streams {
    open: Mutex<HashMap<Key, Open>>,
}

impl Streams {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Open>> {
        self.open.locked()
    }

    fn insert(&self, key: Key, sink: ResponseSink, local: bool) {
        self.open().insert(
            key,
            Open {
                sink,
                cancel_sent: false,
                local,
            },
        );
    }

    /// Sends one answer to its request; `taken` (for answers before the final one) returns the stub's
    /// allowance once the client took the answer (at once for a request with no client).
    fn deliver(&self, key: Key, answer: Option<Result<Vec<NamedTensor>>>, last: bool, taken: Option<Taken>) -> bool {
        let open = {
            let mut open = self.open();
            match last {
                true => open.remove(&key).map(|o| (o.sink, o.local)),
                false => open.get(&key).map(|o| (o.sink.clone(), o.local)),
            }
        };
        match open {
            Some((sink, local)) => {
                let taken = match (local, taken) {
                    (true, Some(taken)) => {
                        taken();
                        None
                    }
                    (_, taken) => taken,
                };
                sink.send(answer, last, taken);
                true
            }
            None => false,
        }
    }

    /// Closes a request that is still open; false when it had already finished.
    fn close(&self, key: Key) -> bool {
        self.open().remove(&key).is_some()
    }

    /// Requests whose client went away since the last look.
    fn newly_cancelled(&self) -> Vec<Key> {
        let mut open = self.open();
        open.iter_mut()
            .filter(|(_, o)| !o.cancel_sent && o.sink.is_cancelled())
            .map(|(k, o)| {
                o.cancel_sent = true;
                *k
            })
            .collect()
    }

    /// Ends every open request with `error` (the stub died).
    fn fail_all(&self, error: &Error) {
        let all: Vec<Open> = self.open().drain().map(|(_, o)| o).collect();
        for o in all {
            o.sink.send(Some(Err(error.clone())), true, None);
        }
    }
}

/// Whether a frame has started arriving within `wait` (nothing is consumed, so no frame is cut).
fn readable_within(reader: &mut BufReader<UnixStream>, wait: Duration) -> std::io::Result<bool> {
    if !reader.buffer().is_empty() {
        return Ok(true);
    }
    reader.get_ref().set_read_timeout(Some(wait))?;
    match reader.fill_buf() {
        Ok(_) => Ok(true), // data, or end of stream, which the next read reports
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The reading thread of a decoupled instance's stub; ends when the stub's socket closes.
pub(super) fn read_stub(
    mut reader: BufReader<UnixStream>,
    streams: Arc<Streams>,
    replies: mpsc::Sender<std::io::Result<(Value, Vec<u8>)>>,
    ctx: Arc<PythonContext>,
    answers: Answers,
    label: String,
    credits: mpsc::Sender<Key>,
) {
    let failed = |e: std::io::Error| {
        streams.fail_all(&Error::unavailable(format!("python stub {label} is gone ({e})")));
        let _ = replies.send(Err(e));
    };
    let mut looked = Instant::now();
    loop {
        // Cancellations are looked for every CANCEL_POLL, whether the stub is quiet or streaming.
        let readable = readable_within(&mut reader, CANCEL_POLL);
        if looked.elapsed() >= CANCEL_POLL {
            looked = Instant::now();
            for (seq, index) in streams.newly_cancelled() {
                let frame = json!({"op": "cancel", "seq": seq, "index": index});
                let mut w = answers.writer.locked();
                let _ = super::ipc::write_frame(&mut *w, &frame, &[]);
            }
        }
        match readable {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => return failed(e),
        }
        let frame = reader
            .get_ref()
            .set_read_timeout(None)
            .and_then(|()| read_frame(&mut reader));
        let (frame, blob) = match frame {
            Ok(f) => f,
            Err(e) => return failed(e),
        };
        match frame["op"].as_str() {
            Some("stream") => {
                let key = (
                    frame["seq"].as_u64().unwrap_or(0),
                    frame["index"].as_u64().unwrap_or(0) as usize,
                );
                let last = frame["flags"].as_u64().unwrap_or(0) & FINAL != 0;
                let answer = match &frame["response"] {
                    Value::Null => None,
                    response => Some(decode_response(&answers.shm, response, &blob)),
                };
                // Each answer before the final one gives the stub back one of its allowance once its
                // client took it (the stub holds its own threads at zero; see mesh_stub.py).
                // The hook runs wherever the answer is taken (often an async task), so it only queues
                // the credit for the instance's credit thread, which writes it to the stub.
                let taken = (!last).then(|| {
                    let credits = credits.clone();
                    Box::new(move || {
                        let _ = credits.send(key);
                    }) as Taken
                });
                if !streams.deliver(key, answer, last, taken) {
                    tracing::warn!(instance = %label, "ignoring an answer for request {key:?}, which is not open");
                }
            }
            Some("bls" | "model_control") => bls::start(&ctx, &answers, frame, &blob),
            Some("bls_cancel") => bls::cancel(&answers, &frame),
            Some("log") => log(&label, &frame),
            Some("metric") => super::metric(&answers, &frame),
            _ => {
                if replies.send(Ok((frame, blob))).is_err() {
                    return; // the instance is gone
                }
            }
        }
    }
}

impl PythonBackend {
    /// Hands the stub's socket to its reading thread (once, after `initialize`).
    pub(super) fn route_frames(&mut self) -> std::result::Result<(), String> {
        let (tx, rx) = mpsc::channel();
        let reader = self.stub.route(rx).ok_or("the stub is already routed")?;
        let (streams, ctx, answers, label) = (
            self.streams.clone(),
            self.ctx.clone(),
            self.stub.answers(),
            self.stub.label.clone(),
        );
        // Credits go back to the stub from their own thread: writing to the stub must never block an
        // async task, nor the reading thread (the stub may be writing to us at the same moment).
        let (credits, returned) = mpsc::channel::<Key>();
        let writer = answers.writer.clone();
        std::thread::Builder::new()
            .name(format!("{label}-credit"))
            .spawn(move || {
                while let Ok((seq, index)) = returned.recv() {
                    let frame = json!({"op": "credit", "seq": seq, "index": index});
                    if super::ipc::write_frame(&mut *writer.locked(), &frame, &[]).is_err() {
                        return; // the stub is gone
                    }
                }
            })
            .map_err(|e| format!("cannot start the stub's credit thread: {e}"))?;
        std::thread::Builder::new()
            .name(format!("{label}-reader"))
            .spawn(move || read_stub(reader, streams, tx, ctx, answers, label, credits))
            .map(|_| ())
            .map_err(|e| format!("cannot start the stub's reading thread: {e}"))
    }

    /// Runs one execute of a decoupled model, returning once the model's `execute` has: answers
    /// still to come reach their clients from the reading thread. Requests with no client
    /// (warm-up) wait here for their final flag and keep their last answer as their result.
    pub(super) fn execute_decoupled(
        &mut self,
        requests: &[RequestView<'_>],
    ) -> Result<(PerRequest, Timings, Vec<usize>)> {
        let t0 = Instant::now();
        self.seq += 1;
        let seq = self.seq;
        self.stub.shm.reset(); // the stub copies its inputs before execute() sees them
        let (encoded, blob) = self.encode_requests(requests);
        let mut local = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let sink = match r.sink {
                Some(sink) => sink.clone(),
                None => {
                    // Collected here once execute returns: no window (the model's answers are kept whole).
                    let (tx, rx) = mesh::stream::stream_channel(mesh::stream::Window::new(usize::MAX, u64::MAX));
                    local.push((i, rx));
                    ResponseSink::new(tx, Default::default())
                }
            };
            self.streams.insert((seq, i), sink, r.sink.is_none());
        }
        let close_all = |streams: &Streams| {
            for i in 0..requests.len() {
                streams.close((seq, i));
            }
        };
        let header = json!({"op": "execute", "seq": seq, "decoupled": true, "requests": encoded});
        if let Err(e) = self.send(&header, &blob) {
            close_all(&self.streams);
            return Err(e);
        }
        let t1 = Instant::now();
        let deadline = t1 + self.ctx.settings.execute_timeout;
        let mut results: PerRequest = requests.iter().map(|_| Ok(Vec::new())).collect();
        let again;
        loop {
            let frame = match self.next_reply(deadline) {
                Ok((frame, _)) => frame,
                Err(e) => {
                    close_all(&self.streams);
                    return Err(e);
                }
            };
            if frame["op"] == "error" {
                close_all(&self.streams);
                return Err(stub_error(&frame));
            }
            if frame["op"] != "executed" || frame["seq"].as_u64() != Some(seq) {
                continue; // a late frame of an earlier execution
            }
            // Rescheduled requests run again in the next execution: their stream stays open there.
            again = super::rescheduled(&frame, requests.len());
            for &i in &again {
                self.streams.close((seq, i));
            }
            if let Some(message) = frame["error"].as_str() {
                // execute() raised: the requests it left open fail with its message.
                let e = Error::internal(message.trim_end().to_string());
                for (i, result) in results.iter_mut().enumerate() {
                    if self.streams.close((seq, i)) {
                        *result = Err(e.clone());
                    }
                }
            }
            break;
        }
        for (i, mut rx) in local {
            let mut last = None;
            while let Some(item) = rx.blocking_recv() {
                if let Some(answer) = item.response {
                    last = Some(answer.map(|r| r.outputs));
                }
                if item.last {
                    break;
                }
            }
            if let (Some(answer), Ok(_)) = (last, &results[i]) {
                results[i] = answer;
            }
        }
        let timings = Timings {
            input: t1 - t0,
            infer: t1.elapsed(),
            output: Duration::ZERO,
        };
        Ok((results, timings, again))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream with the default window's count of answers.
    fn window_sink() -> (mesh::StreamSender, mesh::stream::StreamReceiver) {
        mesh::stream::stream_channel(mesh::stream::Window::new(mesh::stream::STREAM_WINDOW_ANSWERS, u64::MAX))
    }

    fn sink() -> (ResponseSink, tokio::sync::mpsc::UnboundedReceiver<mesh::StreamItem>) {
        let (tx, rx) = window_sink();
        (ResponseSink::new(tx, Default::default()), rx)
    }

    #[test]
    fn answers_reach_open_requests_until_their_final_flag() {
        let streams = Streams::default();
        let (a, mut rx) = sink();
        streams.insert((1, 0), a, false);
        assert!(streams.deliver((1, 0), Some(Ok(vec![])), false, None));
        assert!(streams.deliver((1, 0), None, true, None));
        assert!(
            !streams.deliver((1, 0), Some(Ok(vec![])), false, None),
            "closed by its final flag"
        );
        let first = rx.try_recv().unwrap();
        assert!(!first.last && first.response.is_some());
        assert!(rx.try_recv().unwrap().last);
        assert!(rx.try_recv().is_err(), "the sender is dropped with the request");
    }

    #[test]
    fn a_cancelled_request_is_reported_once_and_a_dead_stub_fails_the_rest() {
        let streams = Streams::default();
        let (a, rx_a) = sink();
        let (b, mut rx_b) = sink();
        streams.insert((1, 0), a, false);
        streams.insert((2, 0), b, false);
        drop(rx_a);
        assert_eq!(streams.newly_cancelled(), vec![(1, 0)]);
        assert!(streams.newly_cancelled().is_empty());
        streams.fail_all(&Error::unavailable("gone"));
        let item = rx_b.try_recv().unwrap();
        assert!(item.last && item.response.unwrap().unwrap_err().message == "gone");
        assert!(!streams.close((2, 0)));
    }

    /// A hook that counts how many answers were taken.
    fn counter() -> (Arc<std::sync::atomic::AtomicUsize>, impl Fn() -> Option<Taken>) {
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = n.clone();
        let hook = move || {
            let m = m.clone();
            Some(Box::new(move || {
                m.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }) as Taken)
        };
        (n, hook)
    }

    #[test]
    fn answers_never_wait_and_return_the_stubs_allowance_as_the_client_takes_them() {
        let streams = Streams::default();
        let (tx, mut rx) = window_sink();
        let window = tx.window().clone();
        streams.insert((1, 0), ResponseSink::new(tx, Default::default()), false);
        let (taken, hook) = counter();
        // Past the client's window: delivered at once (the reading thread never waits), and counted.
        for _ in 0..mesh::stream::STREAM_WINDOW_ANSWERS + 5 {
            assert!(streams.deliver((1, 0), Some(Ok(vec![])), false, hook()));
        }
        assert_eq!(window.out(), mesh::stream::STREAM_WINDOW_ANSWERS + 5);
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing taken yet");
        let first = rx.try_recv().unwrap();
        drop(first);
        assert_eq!(
            taken.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one taken: one credit back"
        );
        drop(rx); // the client goes away: what it held is dropped, and every allowance comes back
        assert_eq!(
            taken.load(std::sync::atomic::Ordering::SeqCst),
            mesh::stream::STREAM_WINDOW_ANSWERS + 5
        );
        assert_eq!(window.out(), 0);
    }

    #[test]
    fn a_request_without_a_client_returns_allowance_at_once() {
        let streams = Streams::default();
        let (tx, _rx) = window_sink();
        streams.insert((1, 0), ResponseSink::new(tx, Default::default()), true);
        let (taken, hook) = counter();
        for _ in 0..3 {
            assert!(streams.deliver((1, 0), Some(Ok(vec![])), false, hook()));
        }
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
