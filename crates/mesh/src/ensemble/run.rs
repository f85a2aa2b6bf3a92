//! Runs one request through an ensemble plan over any `Dispatch`: each step starts as soon as its
//! inputs exist (independent branches overlap), and tensors pass between steps by reference count.
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

use super::{Plan, Progress, Step};
use crate::dispatch::Dispatch;
use crate::error::{Error, Result};
use crate::request::{InferRequest, InferResponse, Params, RequestedOutput};
use crate::tensor::{NamedTensor, Tensor};

/// One step's request: its inputs renamed from the ensemble's tensors (shared bytes, no copy).
pub(super) fn step_request(step: &Step, tensors: &HashMap<String, Tensor>, id: &str, params: &Params) -> InferRequest {
    InferRequest {
        model_name: step.model.clone(),
        model_version: step.version.clone(),
        id: id.to_string(),
        inputs: step
            .inputs
            .iter()
            .filter_map(|(input, tensor)| {
                let t = tensors.get(tensor)?;
                Some(NamedTensor {
                    name: input.clone(),
                    tensor: t.clone(),
                })
            })
            .collect(),
        outputs: step
            .outputs
            .iter()
            .map(|(o, _)| RequestedOutput::named(o.clone()))
            .collect(),
        // The ensemble applies the timeout as a whole.
        parameters: params.iter().filter(|(k, _)| k != "timeout").cloned().collect(),
    }
}

fn call<'a, D: Dispatch + ?Sized>(
    dispatch: &'a D,
    n: usize,
    request: InferRequest,
) -> impl Future<Output = (usize, Result<InferResponse>)> + Send + 'a {
    let answer = dispatch.infer(request);
    async move { (n, answer.await) }
}

/// The `timeout` request parameter (µs), which bounds the whole ensemble ([`crate::params`]; a bad
/// one was refused before the ensemble ran).
pub(super) fn timeout_of(params: &Params) -> Option<Duration> {
    crate::params::timeout(params).ok().flatten()
}

/// A step's error as the ensemble's, naming the step and its model. The step's code stays: bad
/// client data found by a step is still the client's error.
pub(super) fn step_error(plan: &Plan, n: usize, e: Error) -> Error {
    let model = &plan.steps[n].model;
    Error::new(
        e.code,
        format!("ensemble '{}' step {n} (model '{model}'): {}", plan.name, e.message),
    )
}

/// Keeps a step's outputs as the ensemble's tensors. An output the step left out (an optional
/// one) is absent: the steps it feeds run without it, and fail as their model says if they need it.
pub(super) fn store_outputs(step: &Step, mut produced: Vec<NamedTensor>, tensors: &mut HashMap<String, Tensor>) {
    for (output, tensor) in &step.outputs {
        if let Some(pos) = produced.iter().position(|o| &o.name == output) {
            tensors.insert(tensor.clone(), produced.swap_remove(pos).tensor);
        }
    }
}

/// The ensemble's outputs (those `wanted`, or all) from its tensors.
pub(super) fn outputs_of(
    plan: &Plan,
    wanted: &[String],
    mut tensors: HashMap<String, Tensor>,
) -> Result<Vec<NamedTensor>> {
    let names = if wanted.is_empty() { &plan.outputs } else { wanted };
    names
        .iter()
        .map(|name| {
            let tensor = tensors.remove(name).ok_or_else(|| {
                Error::internal(format!(
                    "ensemble '{}' produced no '{name}': a step it needs never ran (an optional input was \
                     absent) or left it out",
                    plan.name
                ))
            })?;
            Ok(NamedTensor {
                name: name.clone(),
                tensor,
            })
        })
        .collect()
}

/// Runs the request through the plan. A failed step fails the request with a message that names
/// the step and model; when it fails, times out or the caller drops this future, the steps still
/// running are dropped (their queued work is withdrawn) and the rest never start. A plan with
/// decoupled steps must give exactly one answer here (the stream path takes any number).
pub async fn run<D: Dispatch + ?Sized>(plan: &Plan, dispatch: &D, request: InferRequest) -> Result<InferResponse> {
    if plan.decoupled {
        return single_answer(plan, dispatch, request).await;
    }
    match timeout_of(&request.parameters) {
        Some(limit) => {
            let name = plan.name.clone();
            tokio::time::timeout(limit, run_steps(plan, dispatch, request))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::unavailable(format!(
                        "ensemble '{name}' did not finish within its timeout of {} µs; its remaining steps were stopped",
                        limit.as_micros()
                    )))
                })
        }
        None => run_steps(plan, dispatch, request).await,
    }
}

async fn run_steps<D: Dispatch + ?Sized>(plan: &Plan, dispatch: &D, request: InferRequest) -> Result<InferResponse> {
    let InferRequest {
        model_name,
        model_version,
        id,
        inputs,
        outputs: wanted,
        parameters,
    } = request;
    let mut tensors: HashMap<String, Tensor> = inputs.into_iter().map(|t| (t.name, t.tensor)).collect();
    // Every ensemble input counts as there: an absent optional one is left out of the steps it feeds.
    let mut progress = Progress::new(plan, plan.inputs.iter().map(String::as_str));
    let mut running = FuturesUnordered::new();
    for n in progress.take_ready() {
        let req = step_request(&plan.steps[n], &tensors, &id, &parameters);
        running.push(call(dispatch, n, req));
    }
    while let Some((n, answer)) = running.next().await {
        let step = &plan.steps[n];
        let response = answer.map_err(|e| step_error(plan, n, e))?;
        store_outputs(step, response.outputs, &mut tensors);
        for next in progress.step_done(plan, n) {
            let req = step_request(&plan.steps[next], &tensors, &id, &parameters);
            running.push(call(dispatch, next, req));
        }
    }
    let wanted: Vec<String> = wanted.into_iter().map(|o| o.name).collect();
    let outputs = outputs_of(plan, &wanted, tensors)?;
    Ok(InferResponse {
        model_name,
        model_version,
        id,
        outputs,
        parameters: Vec::new(),
    })
}

/// A plan with decoupled steps answered on a single-answer path: its one answer, or an error
/// saying how many it gave.
async fn single_answer<D: Dispatch + ?Sized>(
    plan: &Plan,
    dispatch: &D,
    request: InferRequest,
) -> Result<InferResponse> {
    let (tx, mut rx) = crate::stream::stream_channel(crate::stream::Window::for_stream());
    // Answers are taken as they come (their credits return at once); only the first is kept.
    let collect = async {
        let (mut first, mut count) = (None, 0usize);
        while let Some(item) = rx.recv().await {
            if let Some(answer) = item.response {
                count += 1;
                match (answer, &first) {
                    (Err(e), _) => return Err(e),
                    (Ok(a), None) => first = Some(a),
                    (Ok(_), Some(_)) => {}
                }
            }
            if item.last {
                break;
            }
        }
        Ok((first, count))
    };
    let ((), collected) = tokio::join!(super::stream::run_stream(plan, dispatch, request, tx), collect);
    match collected? {
        (Some(answer), 1) => Ok(answer),
        (_, n) => Err(Error::unsupported(format!(
            "ensemble '{}' has decoupled steps and gave {n} responses; a single-answer request needs exactly 1 \
             (use the gRPC stream or generate_stream for several)",
            plan.name
        ))),
    }
}
