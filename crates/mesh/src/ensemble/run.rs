//! Runs one request through an ensemble plan over any `Dispatch`: each step starts as soon as its
//! inputs exist (independent branches overlap), and tensors pass between steps by reference count.
use std::collections::HashMap;
use std::future::Future;

use futures::stream::{FuturesUnordered, StreamExt};

use super::step::{outputs_of, step_error, step_request, store_outputs, timeout_of};
use super::{Plan, Progress};
use crate::dispatch::Dispatch;
use crate::error::{Error, Result};
use crate::request::{InferRequest, InferResponse};
use crate::tensor::Tensor;

fn call<'a, D: Dispatch + ?Sized>(
    dispatch: &'a D,
    n: usize,
    request: InferRequest,
) -> impl Future<Output = (usize, Result<InferResponse>)> + Send + 'a {
    let answer = dispatch.infer(request);
    async move { (n, answer.await) }
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
        client,
    } = request;
    let mut tensors: HashMap<String, Tensor> = inputs.into_iter().map(|t| (t.name, t.tensor)).collect();
    // Every ensemble input counts as there: an absent optional one is left out of the steps it feeds.
    let mut progress = Progress::new(plan, plan.inputs.iter().map(String::as_str));
    let mut running = FuturesUnordered::new();
    for n in progress.take_ready() {
        let req = step_request(&plan.steps[n], &tensors, (&id, &parameters, client));
        running.push(call(dispatch, n, req));
    }
    while let Some((n, answer)) = running.next().await {
        let step = &plan.steps[n];
        let response = answer.map_err(|e| step_error(plan, n, e))?;
        store_outputs(step, response.outputs, &mut tensors);
        for next in progress.step_done(plan, n) {
            let req = step_request(&plan.steps[next], &tensors, (&id, &parameters, client));
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
