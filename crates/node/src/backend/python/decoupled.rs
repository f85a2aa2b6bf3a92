//! Decoupled Python models: each request's answers stream back as the model sends them (from
//! `execute` or from its own threads), and a client that goes away reaches `is_cancelled()`
//! through a flag byte in shared memory, with no round trip.
use std::time::{Duration, Instant};

use mesh::{Error, Result};
use serde_json::{json, Value};

use super::{stub_error, PythonBackend};
use crate::backend::{PerRequest, RequestView, Timings};

/// How often a running decoupled execution looks for requests whose client went away.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Triton's TRITONSERVER_RESPONSE_COMPLETE_FINAL.
const FINAL: u64 = 1;

/// Where one execution stands: which requests still wait for their final flag.
struct Progress {
    open: Vec<bool>,
    executed: bool,
}

impl Progress {
    fn done(&self) -> bool {
        self.executed && !self.open.contains(&true)
    }

    /// Fails every request still open (execute raised, or the stub broke) and closes it.
    fn fail_open(&mut self, results: &mut PerRequest, error: &Error) {
        for (open, result) in self.open.iter_mut().zip(results.iter_mut()) {
            if *open {
                *result = Err(error.clone());
                *open = false;
            }
        }
    }
}

impl PythonBackend {
    /// Runs one execute of a decoupled model: it is finished once `execute` has returned and every
    /// request has sent its final flag, so the instance takes no other work meanwhile. Requests with
    /// no sink (warm-up) keep their last answer as their result.
    pub(super) fn execute_decoupled(&mut self, requests: &[RequestView<'_>]) -> Result<(PerRequest, Timings)> {
        let t0 = Instant::now();
        self.seq += 1;
        let seq = self.seq;
        self.stub.shm.reset();
        let flags = self.stub.shm.alloc_flags(requests.len());
        let (encoded, blob) = self.encode_requests(requests);
        let header = json!({
            "op": "execute", "seq": seq, "decoupled": true, "cancel_flags": flags, "requests": encoded,
        });
        self.send(&header, &blob)?;
        let t1 = Instant::now();
        let mut progress = Progress {
            open: vec![true; requests.len()],
            executed: false,
        };
        let mut results: PerRequest = requests.iter().map(|_| Ok(Vec::new())).collect();
        let timeout = self.ctx.settings.execute_timeout;
        let mut deadline = Instant::now() + timeout;
        while !progress.done() {
            if let Some(off) = flags {
                for (i, r) in requests.iter().enumerate() {
                    if progress.open[i] && r.sink.is_some_and(|s| s.is_cancelled()) {
                        self.stub.shm.raise_flag(off + i); // raising it again changes nothing
                    }
                }
            }
            let now = Instant::now();
            let wait = CANCEL_POLL.min(deadline.saturating_duration_since(now));
            if now < deadline && !self.stub.readable_within(wait).unwrap_or(true) {
                continue;
            }
            let (frame, blob) = match self.next_reply(deadline) {
                Ok(f) => f,
                Err(e) => {
                    progress.fail_open(&mut results, &e); // finished requests keep their answers
                    break;
                }
            };
            deadline = Instant::now() + timeout; // the timeout is on silence, not on the stream
            if frame["op"] == "error" {
                progress.fail_open(&mut results, &stub_error(&frame));
                break;
            }
            if frame["seq"].as_u64() != Some(seq) {
                continue; // a late frame of an earlier execution
            }
            match frame["op"].as_str() {
                Some("stream") => self.take_answer(requests, &frame, &blob, &mut progress, &mut results),
                Some("executed") => {
                    progress.executed = true;
                    if let Some(message) = frame["error"].as_str() {
                        progress.fail_open(&mut results, &Error::internal(message.trim_end().to_string()));
                    }
                }
                other => {
                    let e = Error::internal(format!("unexpected frame from the python stub: {other:?}"));
                    progress.fail_open(&mut results, &e);
                    break;
                }
            }
        }
        let timings = Timings {
            input: t1 - t0,
            infer: t1.elapsed(),
            output: Duration::ZERO,
        };
        Ok((results, timings))
    }

    /// One answer a request's response sender sent: streamed to its client as it arrives.
    fn take_answer(
        &self,
        requests: &[RequestView<'_>],
        frame: &Value,
        blob: &[u8],
        progress: &mut Progress,
        results: &mut PerRequest,
    ) {
        let index = frame["index"].as_u64().map(|i| i as usize);
        let Some(i) = index.filter(|&i| i < requests.len() && progress.open[i]) else {
            tracing::warn!(instance = %self.stub.label, "ignoring an answer for request {index:?}, which is not open");
            return;
        };
        let last = frame["flags"].as_u64().unwrap_or(0) & FINAL != 0;
        let answer = match &frame["response"] {
            Value::Null => None,
            response => Some(self.response_from(response, blob)),
        };
        match requests[i].sink {
            Some(sink) => sink.send(answer, last),
            None => {
                if let Some(answer) = answer {
                    results[i] = answer;
                }
            }
        }
        if last {
            progress.open[i] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_execution_ends_when_executed_and_every_request_is_final() {
        let mut p = Progress {
            open: vec![true, true],
            executed: false,
        };
        assert!(!p.done());
        p.open[0] = false;
        p.executed = true;
        assert!(!p.done(), "request 1 has not sent its final flag");
        let mut results: PerRequest = vec![Ok(Vec::new()), Ok(Vec::new())];
        p.fail_open(&mut results, &Error::internal("boom"));
        assert!(p.done());
        assert!(results[0].is_ok(), "a finished request keeps its result");
        assert_eq!(results[1].as_ref().unwrap_err().message, "boom");
    }
}
