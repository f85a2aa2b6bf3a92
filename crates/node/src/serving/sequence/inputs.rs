//! The tensors the node adds to a sequence request (controls and implicit state) and takes back
//! from its answer (the next state).
use bytes::Bytes;
use mesh::proto::model_sequence_batching::control::Kind;
use mesh::{DataType, Error, NamedTensor, Result, Tensor};

use super::setup::{ControlKind, SequenceSetup};
use super::{Flags, SequenceId};

/// One value of a control input with the batch dim when the model batches (a sequence request is
/// one row).
fn one(dtype: DataType, data: Bytes, batched: bool) -> Result<Tensor> {
    let shape = if batched { vec![1, 1] } else { vec![1] };
    Tensor::new(dtype, shape, data)
}

fn corrid(model: &str, input: &str, id: &SequenceId, dtype: DataType) -> Result<Bytes> {
    let out_of_range = || {
        Error::invalid(format!(
            "model '{model}': correlation ID {id} does not fit control input '{input}' ({dtype})"
        ))
    };
    let bytes = match (id, dtype) {
        (SequenceId::Str(s), DataType::Bytes) => mesh::tensor::encode_bytes_elements([s.as_bytes()]),
        (SequenceId::Int(i), DataType::Bytes) => mesh::tensor::encode_bytes_elements([i.to_string().as_bytes()]),
        (SequenceId::Str(_), _) => {
            return Err(Error::invalid(format!(
            "model '{model}' takes integer correlation IDs (control input '{input}' is {dtype}), got the string {id}"
        )))
        }
        (SequenceId::Int(i), DataType::Uint64) => Bytes::copy_from_slice(&i.to_le_bytes()),
        (SequenceId::Int(i), DataType::Int64) => {
            Bytes::copy_from_slice(&i64::try_from(*i).map_err(|_| out_of_range())?.to_le_bytes())
        }
        (SequenceId::Int(i), DataType::Uint32) => {
            Bytes::copy_from_slice(&u32::try_from(*i).map_err(|_| out_of_range())?.to_le_bytes())
        }
        (SequenceId::Int(i), DataType::Int32) => {
            Bytes::copy_from_slice(&i32::try_from(*i).map_err(|_| out_of_range())?.to_le_bytes())
        }
        _ => return Err(out_of_range()),
    };
    Ok(bytes)
}

/// Adds the control inputs and the current `state` to a request's inputs.
pub fn add(
    model: &str,
    setup: &SequenceSetup,
    flags: &Flags,
    state: Vec<Tensor>,
    batched: bool,
    inputs: &mut Vec<NamedTensor>,
) -> Result<()> {
    for c in &setup.controls {
        let tensor = match &c.kind {
            ControlKind::Flag { kind, dtype, values } => {
                let on = match kind {
                    Kind::ControlSequenceStart => flags.start,
                    Kind::ControlSequenceEnd => flags.end,
                    // Only a request that is ready runs: the node never pads a batch.
                    Kind::ControlSequenceReady | Kind::ControlSequenceCorrid => true,
                };
                one(*dtype, values[on as usize].clone(), batched)?
            }
            ControlKind::CorrId { dtype } => one(*dtype, corrid(model, &c.input, &flags.id, *dtype)?, batched)?,
        };
        inputs.push(NamedTensor {
            name: c.input.clone(),
            tensor,
        });
    }
    for (spec, mut tensor) in setup.states.iter().zip(state) {
        if batched {
            tensor.shape.insert(0, 1);
        }
        inputs.push(NamedTensor {
            name: spec.input.clone(),
            tensor,
        });
    }
    Ok(())
}

/// The output names to ask the backend for: the client's (all of the config's when it named
/// none) and the state outputs.
pub fn outputs(setup: &SequenceSetup, requested: Vec<String>, config_outputs: &[String]) -> Vec<String> {
    if setup.states.is_empty() {
        return requested;
    }
    let mut names = if requested.is_empty() {
        config_outputs.to_vec()
    } else {
        requested
    };
    names.extend(setup.states.iter().map(|s| s.output.clone()));
    names
}

/// Takes the state outputs out of an answer: the next state of the sequence, one row each.
pub fn take_states(setup: &SequenceSetup, outputs: &mut Vec<NamedTensor>, batched: bool) -> Result<Vec<Tensor>> {
    let mut states = Vec::with_capacity(setup.states.len());
    for spec in &setup.states {
        let i = outputs
            .iter()
            .position(|o| o.name == spec.output)
            .ok_or_else(|| Error::internal(format!("the model did not produce its state output '{}'", spec.output)))?;
        let mut tensor = outputs.remove(i).tensor;
        if batched && tensor.shape.first() == Some(&1) {
            tensor.shape.remove(0);
        }
        // A copy: the answer's bytes may be a slice of the whole batch's output.
        tensor.data = bytes::Bytes::copy_from_slice(&tensor.data);
        states.push(tensor);
    }
    Ok(states)
}
