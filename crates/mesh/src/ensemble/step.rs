//! What every way of running an ensemble does with one step: its request from the ensemble's
//! tensors, its error named as the ensemble's, its outputs kept, and the ensemble's outputs.
use std::collections::HashMap;
use std::time::Duration;

use super::{fitted, Plan, Step};
use crate::error::{Error, Result};
use crate::request::{Client, InferRequest, Params, RequestedOutput};
use crate::tensor::{NamedTensor, Tensor};

/// One step's request: its inputs renamed from the ensemble's tensors (shared bytes, no copy), each
/// shaped for the model where one side batches and the other does not; sent for the ensemble's `client`.
pub(super) fn step_request(
    step: &Step,
    tensors: &HashMap<String, Tensor>,
    (id, params, client): (&str, &Params, Client),
) -> InferRequest {
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
                    tensor: fitted(t, step.fits.get(input)),
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
        client,
    }
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
                tensor: fitted(&tensor, plan.output_fits.get(name)),
            })
        })
        .collect()
}
