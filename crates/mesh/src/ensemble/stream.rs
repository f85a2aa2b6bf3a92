//! Ensembles with decoupled steps: each answer of a decoupled step carries the request on through
//! the steps after it as a branch of its own, and every branch that reaches the end is one answer
//! of the ensemble (Triton's behaviour for a decoupled model inside an ensemble). Branches fork
//! only once the steps running beside the decoupled one are done, so each fork sees their outputs.
//!
//! A decoupled step streams into the client's window: each of its answers carries a credit through
//! its branch to the ensemble's answer, so a client that stops reading stops the step (a branch that
//! runs a decoupled step of its own gives its credit back, since its forks answer in its place).
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;

use futures::stream::{FuturesUnordered, SelectAll, StreamExt};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::step::{outputs_of, step_error, step_request, store_outputs, timeout_of};
use super::{Plan, Progress};
use crate::dispatch::Dispatch;
use crate::error::{Error, Result};
use crate::request::{Client, InferRequest, InferResponse, Params};
use crate::stream::{stream_channel, Credit, Window};
use crate::stream::{StreamItem, StreamSender};
use crate::tensor::Tensor;

impl Branch {
    fn new(tensors: HashMap<String, Tensor>, progress: Progress) -> Self {
        Branch {
            tensors,
            progress,
            calls: 0,
            streams: 0,
            pending: VecDeque::new(),
            forked: false,
            credit: None,
        }
    }
}

/// One way through the plan: its tensors, its progress and what it still waits for.
struct Branch {
    tensors: HashMap<String, Tensor>,
    progress: Progress,
    /// Single-answer steps running.
    calls: usize,
    /// Decoupled steps still answering (at most one at a time).
    streams: usize,
    /// Answers of the decoupled step, waiting for `calls` to reach zero before they fork.
    pending: VecDeque<(usize, InferResponse, Option<Credit>)>,
    /// Whether a decoupled step ran here: its forks answer, this branch does not.
    forked: bool,
    /// The client-window credit of the answer this branch came from, sent on with its own answer.
    credit: Option<Credit>,
}

type Call<'a> = Pin<Box<dyn Future<Output = (usize, usize, Result<InferResponse>)> + Send + 'a>>;
type Driver<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
type Items = futures::stream::Map<
    UnboundedReceiverStream<StreamItem>,
    Box<dyn FnMut(StreamItem) -> (usize, usize, StreamItem) + Send>,
>;

/// Runs a request through a plan with decoupled steps, sending each answer of the ensemble to
/// `sink` and the final flag last. A step's error ends the request with that error.
pub async fn run_stream<D: Dispatch + ?Sized>(plan: &Plan, dispatch: &D, request: InferRequest, sink: StreamSender) {
    let limit = timeout_of(&request.parameters);
    let name = plan.name.clone();
    let work = branches(plan, dispatch, request, &sink);
    let result = match limit {
        Some(limit) => tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
            Err(Error::unavailable(format!(
                "ensemble '{name}' did not finish within its timeout of {} µs; its remaining steps were stopped",
                limit.as_micros()
            )))
        }),
        None => work.await,
    };
    let _ = match result {
        Ok(()) => sink.send(StreamItem::new(None, true)),
        Err(e) => sink.send(StreamItem::new(Some(Err(e)), true)),
    };
}

struct Run<'a, D: Dispatch + ?Sized> {
    plan: &'a Plan,
    dispatch: &'a D,
    id: String,
    params: Params,
    client: Client,
    branches: Vec<Option<Branch>>,
    /// The client's window, which decoupled steps stream into.
    window: std::sync::Arc<Window>,
    calls: FuturesUnordered<Call<'a>>,
    drivers: FuturesUnordered<Driver<'a>>,
    items: SelectAll<Items>,
}

impl<'a, D: Dispatch + ?Sized> Run<'a, D> {
    /// Starts the steps of branch `b` that are ready.
    fn launch(&mut self, b: usize, ready: Vec<usize>) -> Result<()> {
        for n in ready {
            let step = &self.plan.steps[n];
            let branch = self.branches[b].as_mut().expect("a live branch");
            let req = step_request(step, &branch.tensors, (&self.id, &self.params, self.client));
            if !step.decoupled {
                branch.calls += 1;
                let answer = self.dispatch.infer(req);
                self.calls.push(Box::pin(async move { (b, n, answer.await) }));
                continue;
            }
            if branch.streams > 0 {
                return Err(Error::unsupported(format!(
                    "ensemble '{}': step {n} (model '{}') is decoupled and would run beside another decoupled step; \
                     decoupled steps must follow one another",
                    self.plan.name, step.model
                )));
            }
            branch.streams += 1;
            branch.forked = true;
            branch.credit = None;
            let (tx, rx) = stream_channel(self.window.clone());
            self.drivers.push(Box::pin(self.dispatch.infer_stream(req, tx)));
            let tag: Box<dyn FnMut(StreamItem) -> (usize, usize, StreamItem) + Send> =
                Box::new(move |item| (b, n, item));
            self.items.push(UnboundedReceiverStream::new(rx).map(tag));
        }
        Ok(())
    }

    /// A new branch from `b` with the decoupled step `n`'s answer; its next steps start.
    fn fork(&mut self, b: usize, n: usize, response: InferResponse, credit: Option<Credit>) -> Result<usize> {
        let parent = self.branches[b].as_ref().expect("a live branch");
        let mut tensors = parent.tensors.clone();
        let mut progress = parent.progress.clone();
        store_outputs(&self.plan.steps[n], response.outputs, &mut tensors);
        let ready = progress.step_done(self.plan, n);
        let mut branch = Branch::new(tensors, progress);
        branch.credit = credit;
        self.branches.push(Some(branch));
        let child = self.branches.len() - 1;
        self.launch(child, ready)?;
        Ok(child)
    }

    /// Forks what waited and answers for branches that reached the end.
    fn settle(&mut self, b: usize, sink: &StreamSender, wanted: &[String], template: &InferResponse) -> Result<()> {
        let mut todo = vec![b];
        while let Some(b) = todo.pop() {
            let Some(branch) = self.branches[b].as_mut() else {
                continue;
            };
            if branch.calls > 0 {
                continue;
            }
            if let Some((n, response, credit)) = branch.pending.pop_front() {
                let child = self.fork(b, n, response, credit)?;
                todo.extend([child, b]);
                continue;
            }
            if branch.streams > 0 {
                continue;
            }
            let branch = self.branches[b].take().expect("a live branch");
            if !branch.forked {
                let outputs = outputs_of(self.plan, wanted, branch.tensors)?;
                let response = InferResponse {
                    outputs,
                    ..template.clone()
                };
                let _ = sink.send(StreamItem {
                    response: Some(Ok(response)),
                    last: false,
                    credit: branch.credit,
                });
            }
        }
        Ok(())
    }
}

async fn branches<D: Dispatch + ?Sized>(
    plan: &Plan,
    dispatch: &D,
    request: InferRequest,
    sink: &StreamSender,
) -> Result<()> {
    let InferRequest {
        model_name,
        model_version,
        id,
        inputs,
        outputs,
        parameters,
        client,
    } = request;
    let wanted: Vec<String> = outputs.into_iter().map(|o| o.name).collect();
    let template = InferResponse {
        model_name,
        model_version,
        id: id.clone(),
        outputs: Vec::new(),
        parameters: Vec::new(),
    };
    let tensors: HashMap<String, Tensor> = inputs.into_iter().map(|t| (t.name, t.tensor)).collect();
    let mut progress = Progress::new(plan, plan.inputs.iter().map(String::as_str));
    let ready = progress.take_ready();
    let mut run = Run {
        plan,
        dispatch,
        id,
        params: parameters,
        client,
        branches: vec![Some(Branch::new(tensors, progress))],
        window: sink.window().clone(),
        calls: FuturesUnordered::new(),
        drivers: FuturesUnordered::new(),
        items: SelectAll::new(),
    };
    run.launch(0, ready)?;
    run.settle(0, sink, &wanted, &template)?;
    loop {
        tokio::select! {
            Some((b, n, answer)) = run.calls.next(), if !run.calls.is_empty() => {
                let response = answer.map_err(|e| step_error(plan, n, e))?;
                let branch = run.branches[b].as_mut().expect("a live branch");
                branch.calls -= 1;
                store_outputs(&plan.steps[n], response.outputs, &mut branch.tensors);
                let ready = branch.progress.step_done(plan, n);
                run.launch(b, ready)?;
                run.settle(b, sink, &wanted, &template)?;
            }
            Some((b, n, mut item)) = run.items.next(), if !run.items.is_empty() => {
                let credit = item.credit.take();
                let answer = item
                    .response
                    .map(|a| a.map_err(|e| step_error(plan, n, e)))
                    .transpose()?;
                let branch = run.branches[b].as_mut().expect("a live branch");
                if let Some(response) = answer {
                    branch.pending.push_back((n, response, credit));
                }
                if item.last {
                    branch.streams -= 1;
                }
                run.settle(b, sink, &wanted, &template)?;
            }
            Some(()) = run.drivers.next(), if !run.drivers.is_empty() => {}
            else => break,
        }
    }
    Ok(())
}
