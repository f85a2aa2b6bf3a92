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
fn step_request(step: &Step, tensors: &HashMap<String, Tensor>, id: &str, params: &Params) -> InferRequest {
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

/// The `timeout` request parameter (µs), which bounds the whole ensemble.
fn timeout_of(params: &Params) -> Option<Duration> {
    params
        .iter()
        .find(|(k, _)| k == "timeout")
        .and_then(|(_, v)| v.as_u64())
        .filter(|&us| us > 0)
        .map(Duration::from_micros)
}

/// Runs the request through the plan. A failed step fails the request with a message that names
/// the step and model; when it fails, times out or the caller drops this future, the steps still
/// running are dropped (their queued work is withdrawn) and the rest never start.
pub async fn run<D: Dispatch + ?Sized>(plan: &Plan, dispatch: &D, request: InferRequest) -> Result<InferResponse> {
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
        let at = || format!("ensemble '{}' step {n} (model '{}')", plan.name, step.model);
        // The step's code stays: bad client data found by a step is still the client's error.
        let response = answer.map_err(|e| Error::new(e.code, format!("{}: {}", at(), e.message)))?;
        let mut produced = response.outputs;
        for (output, tensor) in &step.outputs {
            let pos = produced
                .iter()
                .position(|o| &o.name == output)
                .ok_or_else(|| Error::internal(format!("{} returned no output '{output}'", at())))?;
            tensors.insert(tensor.clone(), produced.swap_remove(pos).tensor);
        }
        for next in progress.step_done(plan, n) {
            let req = step_request(&plan.steps[next], &tensors, &id, &parameters);
            running.push(call(dispatch, next, req));
        }
    }
    let names: Vec<&String> = if wanted.is_empty() {
        plan.outputs.iter().collect()
    } else {
        wanted.iter().map(|o| &o.name).collect()
    };
    let outputs = names
        .into_iter()
        .map(|name| {
            let tensor = tensors.remove(name).ok_or_else(|| {
                Error::internal(format!(
                    "ensemble '{}' produced no '{name}': a step it needs never ran (an optional input was absent)",
                    plan.name
                ))
            })?;
            Ok(NamedTensor {
                name: name.clone(),
                tensor,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(InferResponse {
        model_name,
        model_version,
        id,
        outputs,
        parameters: Vec::new(),
    })
}
