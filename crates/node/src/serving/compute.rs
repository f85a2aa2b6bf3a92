//! An admitted request's computation: on the model's instance (its budget, its sequence's step, the execution, the statistics) or through an ensemble's steps, and its trace written with the timestamps of what ran.
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::budget::FairBudget;
use mesh::ensemble::{Plan, Served};
use mesh::{Dispatch, Error, InferRequest, InferResponse, Result, StreamSender};

use crate::actors::instance::{Executed, Submission};
use crate::actors::model::LoadedVersion;
use crate::backend::{ResponseSink, Timings};
use crate::serving::admit::Work;
use crate::serving::sequence;

/// Counts a request as pending while it runs; if its future is dropped first (the client went
/// away), records it as a CANCELED failure so the gauge and statistics stay true.
struct InFlight<'a> {
    model: &'a LoadedVersion,
    start: Instant,
    finished: bool,
}

impl<'a> InFlight<'a> {
    fn begin(model: &'a LoadedVersion, start: Instant) -> Self {
        model.stats.metrics.pending.increment(1.0);
        InFlight {
            model,
            start,
            finished: false,
        }
    }

    /// It ran to its end (whatever the outcome, which the caller records).
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.model.stats.metrics.pending.decrement(1.0);
        if !self.finished {
            self.model.stats.failure("CANCELED", self.start.elapsed());
        }
    }
}

/// Rows of a request: its batch dimension for batching models, else 1.
fn request_rows(model: &LoadedVersion, request: &InferRequest) -> usize {
    if model.config.max_batch_size > 0 {
        request
            .inputs
            .first()
            .and_then(|i| i.tensor.shape.first())
            .copied()
            .unwrap_or(1)
            .max(1) as usize
    } else {
        1
    }
}

/// Runs an admitted request on the model's instance, or through its ensemble's steps, each a
/// request to `dispatch` (this node's, so the composing models keep their own statistics).
/// `stream`: where a decoupled model's answers go. Ok(None): the answers went to `stream`.
pub(crate) async fn run<D: Dispatch + ?Sized>(
    dispatch: &D,
    budget: &Arc<FairBudget>,
    work: Work,
    stream: Option<StreamSender>,
) -> Result<Option<InferResponse>> {
    match work.model.ensemble.clone() {
        Some(plan) => ensemble(dispatch, &plan, work, stream).await,
        None => instance(budget, work, stream).await,
    }
}

/// Runs a request through an ensemble's steps; the ensemble records its own statistics. Traced
/// as Triton traces an ensemble: its own trace (no compute of its own), its steps that trace's
/// children; an untraced ensemble's steps are not traced.
async fn ensemble<D: Dispatch + ?Sized>(
    dispatch: &D,
    plan: &Plan,
    work: Work,
    stream: Option<StreamSender>,
) -> Result<Option<InferResponse>> {
    let Work {
        request,
        model,
        start,
        mut trace,
        ..
    } = work;
    // An ensemble queues its request as it begins (Triton's ensemble scheduler).
    if let Some(trace) = trace.as_mut() {
        trace.queued(start);
    }
    let rows = request_rows(&model, &request);
    let running = InFlight::begin(&model, start);
    let serve = mesh::ensemble::serve(plan, dispatch, request, &model.version_label, stream);
    let served = mesh::trace::child(trace.as_ref().map(|t| t.id()), serve).await;
    running.finish();
    record_ensemble(&model, rows, start, served.failed());
    if let Some(trace) = trace {
        let end = mesh::trace::ns(Instant::now());
        let start = mesh::trace::ns(start);
        trace.finish(vec![
            ("REQUEST_START", start),
            ("QUEUE_START", start),
            ("REQUEST_END", end),
            ("INFER_RESPONSE_COMPLETE", end),
        ]);
    }
    match served {
        Served::Answered(answer) => answer.map(Some),
        Served::Streamed { .. } => Ok(None),
    }
}

/// Runs a request on one of the model's instances: admitted to the budget, then (a sequence
/// model's request) to its sequence, whose instance runs it in its turn with its controls and state.
async fn instance(budget: &Arc<FairBudget>, work: Work, stream: Option<StreamSender>) -> Result<Option<InferResponse>> {
    let Work {
        mut request,
        model,
        controls,
        decoupled,
        start,
        mut trace,
    } = work;
    let model = &*model;
    let rows = request_rows(model, &request);
    let batched = model.config.max_batch_size > 0;
    let mut outputs: Vec<String> = request.outputs.iter().map(|o| o.name.clone()).collect();
    let failed = |e: Error| {
        model.stats.failure(e.metric_reason(), start.elapsed());
        e
    };
    // Admitted before it waits for anything (a sequence's slot or turn, the instance's queue),
    // so whatever waits is bounded by the budget.
    let _admitted = budget.admit_request(&request).map_err(failed)?;
    let step = match &model.sequences {
        Some(table) => {
            let ready: Vec<&str> = model
                .instances
                .iter()
                .filter(|i| i.is_ready())
                .map(|i| &*i.label)
                .collect();
            Some(
                sequence::Step::admit(table, &request.model_name, &controls.sequence, rows, &ready)
                    .await
                    .map_err(failed)?,
            )
        }
        None => None,
    };
    let _turn = match &step {
        Some(step) => {
            let turn = step.ticket.turn.clone().lock_owned().await;
            step.add_inputs(&request.model_name, batched, &mut request.inputs)
                .map_err(failed)?;
            let config_outputs: Vec<String> = model.config.output.iter().map(|o| o.name.clone()).collect();
            outputs = step.outputs(outputs, &config_outputs);
            Some(turn)
        }
        None => None,
    };
    let submission = Submission {
        inputs: std::mem::take(&mut request.inputs),
        outputs,
        rows,
        priority: controls.priority,
        timeout: controls.timeout,
        id: request.id.clone(),
        parameters: std::mem::take(&mut request.parameters),
        trace: trace.as_ref().map(|t| t.handle()),
        sink: stream.filter(|_| decoupled).map(|tx| {
            let template = InferResponse {
                model_name: request.model_name.clone(),
                model_version: model.version_label.clone(),
                id: request.id.clone(),
                ..Default::default()
            };
            Box::new(ResponseSink::new(tx, template))
        }),
    };
    let instance = match &step {
        Some(step) => model
            .instances
            .iter()
            .find(|i| i.label == step.ticket.instance)
            .map(|i| &**i),
        None => model.pick(),
    };
    let instance = instance.ok_or_else(|| match &step {
        Some(step) => Error::unavailable(format!(
            "model '{}': instance {} that held sequence {} is gone; start the sequence again",
            request.model_name, step.ticket.instance, step.flags.id
        )),
        None => Error::unavailable(format!("model '{}' has no instances", request.model_name)),
    })?;
    let streamed = submission.sink.is_some();
    let running = InFlight::begin(model, start);
    // Queued at its instance: dropped from here on (its client went away), its trace keeps
    // QUEUE_START, and its compute if the instance started it (see `serving::traced`).
    if let Some(trace) = trace.as_mut() {
        trace.queued(Instant::now());
    }
    let result = instance.execute(submission).await;
    running.finish();
    if let Some(trace) = trace {
        trace.finish(execution_stamps(start, result.as_ref().ok()));
    }
    match result {
        Ok(mut done) => {
            if let Some(step) = step {
                if !streamed {
                    step.finish(batched, &mut done.outputs).map_err(failed)?;
                }
            }
            let execution = done.counts_execution.then_some(done.batch_rows as u64);
            model
                .stats
                .success(rows as u64, start.elapsed(), done.queued, &done.timings, execution);
            if streamed {
                return Ok(None);
            }
            Ok(Some(InferResponse {
                model_name: request.model_name,
                model_version: model.version_label.clone(),
                id: request.id,
                outputs: done.outputs,
                parameters: Vec::new(),
            }))
        }
        Err(e) => {
            model.stats.failure(e.metric_reason(), start.elapsed());
            Err(e)
        }
    }
}

/// An ensemble's own statistics for one request: a success over its whole time, or a failure.
fn record_ensemble(model: &LoadedVersion, rows: usize, start: Instant, failed: Option<&'static str>) {
    let took = start.elapsed();
    match failed {
        Some(reason) => model.stats.failure(reason, took),
        None => {
            let timings = Timings {
                infer: took,
                ..Default::default()
            };
            model
                .stats
                .success(rows as u64, took, Duration::ZERO, &timings, Some(rows as u64));
        }
    }
}

/// A traced request's timestamps, as Triton names them. The execution's own instants are placed
/// back from its durations (the instance reports durations, not instants).
fn execution_stamps(start: Instant, done: Option<&Executed>) -> Vec<(&'static str, u64)> {
    use mesh::trace::ns;
    let end = Instant::now();
    let mut stamps = vec![("REQUEST_START", ns(start))];
    if let Some(done) = done {
        let t = &done.timings;
        let compute_start = end
            .checked_sub(t.input + t.infer + t.output)
            .map_or(start, |c| c.max(start));
        let queue_start = compute_start.checked_sub(done.queued).map_or(start, |q| q.max(start));
        stamps.extend([
            ("QUEUE_START", ns(queue_start)),
            ("COMPUTE_START", ns(compute_start)),
            ("COMPUTE_INPUT_END", ns((compute_start + t.input).min(end))),
            ("COMPUTE_OUTPUT_START", ns((compute_start + t.input + t.infer).min(end))),
            ("COMPUTE_END", ns(end)),
        ]);
    }
    stamps.extend([("REQUEST_END", ns(end)), ("INFER_RESPONSE_COMPLETE", ns(end))]);
    stamps
}
