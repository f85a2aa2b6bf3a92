//! How the node waits for its stub's next frame: polled for first while polls pay (`spin.rs`), and
//! watching meanwhile for requests whose client went away.
use std::time::{Duration, Instant};

use mesh::Result;
use metrics::Counter;
use serde_json::{json, Value};

use super::PythonBackend;
use crate::backend::RequestView;

/// How often a running `execute` looks for requests whose client went away.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// How an instance's waits for its stub went, counted in `mesh_python_stub_waits_total` by `poll`:
/// `none` (the policy said sleep at once), `caught` (the poll caught the answer) or `missed`.
pub(super) struct WaitCounts {
    none: Counter,
    caught: Counter,
    missed: Counter,
}

impl WaitCounts {
    pub(super) fn new(model: &str, version: i64, instance: &str) -> Self {
        let counter = |poll: &'static str| {
            let labels = [
                ("model", model.to_string()),
                ("version", version.to_string()),
                ("instance", instance.to_string()),
                ("poll", poll.to_string()),
            ];
            metrics::counter!("mesh_python_stub_waits_total", &labels)
        };
        WaitCounts {
            none: counter("none"),
            caught: counter("caught"),
            missed: counter("missed"),
        }
    }
}

impl PythonBackend {
    /// Polls for the stub's next frame for as long as the spin policy says; true once it has
    /// started to arrive. Only real polls count for the policy: not a frame already buffered, nor
    /// a stub read by its own thread (which waits instead).
    pub(super) fn poll(&mut self) -> std::io::Result<bool> {
        if self.stub.is_routed() {
            return Ok(false);
        }
        if self.stub.has_buffered() {
            return Ok(true);
        }
        let spin = self.spin.next();
        if spin.is_zero() {
            self.waits.none.increment(1);
            return Ok(false);
        }
        let caught = self.stub.spin_for_data(spin)?;
        self.spin.record(caught);
        if caught { &self.waits.caught } else { &self.waits.missed }.increment(1);
        Ok(caught)
    }

    /// The stub's next frame, waiting at most until `deadline`; polled for first where
    /// `may_poll` and the spin policy say so. A socket that fails while polled fails the read.
    pub(super) fn recv_polled(&mut self, deadline: Instant, may_poll: bool) -> std::io::Result<(Value, Vec<u8>)> {
        if may_poll {
            self.poll()?;
        }
        self.stub.recv(Some(deadline))
    }

    /// While the stub is silent, tells it which requests' clients went away (`cancel` frames,
    /// read by `request.is_cancelled()`), each once; returns as soon as a frame arrives (the
    /// reply, or a BLS call the caller serves) or the deadline passes.
    pub(super) fn watch_cancels(
        &mut self,
        requests: &[RequestView<'_>],
        told: &mut [bool],
        deadline: Instant,
    ) -> Result<()> {
        // A quick answer is taken by polling first, as `recv_polled` would, with no wake-up.
        match self.poll() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(self.fail(format!("python stub {} is gone: {e}", self.stub.label))),
        }
        loop {
            let now = Instant::now();
            if now >= deadline || self.stub.readable_by((now + CANCEL_POLL).min(deadline)) {
                return Ok(());
            }
            for (i, r) in requests.iter().enumerate() {
                if !told[i] && r.cancelled.is_some_and(|gone| gone()) {
                    told[i] = true;
                    self.send(&json!({"op": "cancel", "seq": self.seq, "index": i}), &[])?;
                }
            }
        }
    }
}
