//! Backends run a model version's computation; the instance seam owns one and feeds it requests.
pub mod onnx;
pub mod onnx_gpu;
pub mod ort_env;
mod ort_values;
pub mod python;
pub mod torch;

use std::time::{Duration, Instant};

use mesh::{Error, InferResponse, NamedTensor, Params, Result, StreamItem, StreamSender};

/// Time spent in each phase of one execution, for statistics and metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

impl Timings {
    /// The phases between four instants: start, inputs ready, inference done, outputs ready.
    pub fn from_marks(start: Instant, inputs: Instant, inferred: Instant, outputs: Instant) -> Self {
        Timings {
            input: inputs - start,
            infer: inferred - inputs,
            output: outputs - inferred,
        }
    }
}

/// One request of a batch, for backends that take requests one by one (Python's `execute(requests)`).
#[derive(Clone, Copy)]
pub struct RequestView<'a> {
    pub inputs: &'a [NamedTensor],
    /// Requested outputs; empty means all.
    pub outputs: &'a [String],
    pub id: &'a str,
    pub parameters: &'a Params,
    /// The request's trace id when it is traced.
    pub trace: Option<u64>,
    /// Set for decoupled models: the request's answers go here as the model sends them.
    pub sink: Option<&'a ResponseSink>,
    /// Whether the request's client went away (for `is_cancelled()` during a long `execute`).
    pub cancelled: Option<&'a (dyn Fn() -> bool + Sync)>,
}

/// What runs when a client took an answer.
pub type Taken = Box<dyn FnOnce() + Send>;

/// Where a decoupled model's answers to one request go, as they are sent. Clones share the
/// request's stream and its client's window.
#[derive(Clone)]
pub struct ResponseSink {
    tx: StreamSender,
    /// Model name, version and request id every answer carries.
    template: InferResponse,
}

impl ResponseSink {
    pub fn new(tx: StreamSender, template: InferResponse) -> Self {
        ResponseSink { tx, template }
    }

    /// Sends one answer (None: only the final flag); a client that went away is not an error. Never
    /// waits: the answer counts against the client's window even past it (the stub that sends it is
    /// held back by its own allowance), and `taken` runs once the client took it, which returns that
    /// allowance.
    pub fn send(&self, outputs: Option<Result<Vec<NamedTensor>>>, last: bool, taken: Option<Taken>) {
        // The backend sends only the requested outputs (the stub leaves the rest out).
        let response = outputs.map(|r| {
            r.map(|outputs| InferResponse {
                outputs,
                ..self.template.clone()
            })
        });
        let mut credit = self.tx.window().force();
        if let Some(Ok(r)) = &response {
            credit.charge(mesh::stream::response_bytes(r));
        }
        if let Some(taken) = taken {
            credit.on_return(taken);
        }
        // A client that went away drops the answer here, which returns its credit (and allowance) at once.
        let _ = self.tx.send(StreamItem {
            response,
            last,
            credit: Some(credit),
        });
    }

    /// True once nobody reads the answers any more (the client cancelled or disconnected).
    pub fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The outputs (or the error) of each request of a batch, in order.
pub type PerRequest = Vec<Result<Vec<NamedTensor>>>;

/// Where `Backend::execute_each` hands the answer of the request at a place, as soon as it is ready.
pub type Deliver<'d> = &'d mut dyn FnMut(usize, Result<Vec<NamedTensor>>);

/// `Backend::execute_each` one request after another, each answer delivered as its execution ends.
pub fn each_in_turn<B: Backend + ?Sized>(b: &mut B, requests: &[RequestView<'_>], deliver: Deliver<'_>) -> Result<()> {
    for (i, r) in requests.iter().enumerate() {
        let (mut one, _) = b.execute_requests(std::slice::from_ref(r))?;
        deliver(
            i,
            one.pop()
                .unwrap_or_else(|| Err(Error::internal("the backend gave no response"))),
        );
    }
    Ok(())
}

/// One loaded model session; `execute` runs on the instance's own thread.
pub trait Backend: Send {
    /// Runs the inputs and returns the outputs named in `outputs` (all config outputs when empty).
    fn execute(&mut self, inputs: &[NamedTensor], outputs: &[String]) -> Result<(Vec<NamedTensor>, Timings)>;

    /// True for backends that see a batch as separate requests instead of merged tensors.
    fn takes_requests(&self) -> bool {
        false
    }

    /// Runs a batch as separate requests (only called when `takes_requests`).
    fn execute_requests(&mut self, requests: &[RequestView<'_>]) -> Result<(PerRequest, Timings)> {
        let _ = requests;
        Err(Error::internal("this backend takes merged batches"))
    }

    /// True for backends that take requests of a model without dynamic batching together
    /// (`execute_each`); the executor then sends them the requests that queued while it was busy.
    fn groups_executions(&self) -> bool {
        false
    }

    /// Runs each request in an execution of its own (the model sees one request per execution, as
    /// Triton runs a model without dynamic batching) and hands each answer to `deliver` as it is
    /// ready, once per request. Backends that `groups_executions` do it in one exchange; this
    /// default runs them one after another. On an error, the requests not delivered yet fail with it.
    fn execute_each(&mut self, requests: &[RequestView<'_>], deliver: Deliver<'_>) -> Result<()> {
        each_in_turn(self, requests, deliver)
    }

    /// False for backends that wait on another process (Python): a BLS call they wait for may need
    /// the async runtime's threads, so on one they run only as `may_wait_inline` allows.
    fn may_run_inline(&self) -> bool {
        true
    }

    /// For backends that wait on another process: true when a request that finds its instance idle
    /// may still run on an async runtime worker, while another worker stays free for the sockets
    /// and the BLS calls it makes (decoupled Python models never do: their answers outlive the call).
    fn may_wait_inline(&self) -> bool {
        false
    }

    /// For such a backend: executions averaging under this run on an async runtime worker (as
    /// `may_wait_inline` allows); None takes the instance's default for its kind.
    fn inline_limit(&self) -> Option<std::time::Duration> {
        None
    }

    /// False once the backend cannot serve again (its process died or hung): the instance is rebuilt.
    fn healthy(&mut self) -> bool {
        true
    }
}

thread_local! {
    /// True on executor threads: they may block, so a backend that must stay off the async runtime
    /// (Python) can run inline there, as for a BLS call from another model's instance.
    static MAY_BLOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the current thread may block: an executor thread, not an async runtime worker.
pub(crate) fn thread_may_block() -> bool {
    MAY_BLOCK.with(|b| b.get())
}

/// Marks the current thread one that may block until the returned guard drops (an executor thread
/// keeps its guard for its whole life).
pub(crate) fn enter_may_block() -> MayBlockGuard {
    MayBlockGuard(MAY_BLOCK.with(|b| b.replace(true)))
}

/// Restores the thread's previous mark when dropped.
pub(crate) struct MayBlockGuard(bool);

impl Drop for MayBlockGuard {
    fn drop(&mut self) {
        MAY_BLOCK.with(|b| b.set(self.0));
    }
}
