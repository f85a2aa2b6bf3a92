//! One TorchScript module bound to a config: loads it on its device and runs batches through it.
use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

use mesh::config::ModelConfig;
use mesh::{DataType, Error, NamedTensor, Result};
use tch::{CModule, IValue};

use super::archive::{self, Signature};
use super::binding::{self, Binding, TensorSpec};
use super::signature::ArgType;
use super::values::{self, Leaf};
use super::Settings;
use crate::backend::onnx::Device;
use crate::backend::{Backend, Timings};

/// A loaded TorchScript module and how requests reach its forward().
pub struct TorchBackend {
    module: CModule,
    device: tch::Device,
    binding: Binding,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    batched: bool,
    settings: Settings,
}

/// The torch device of an instance; KIND_GPU needs torch to see that CUDA device.
fn torch_device(device: Device) -> Result<tch::Device, String> {
    match device {
        Device::Cpu => Ok(tch::Device::Cpu),
        Device::Gpu(id) => {
            let count = if tch::Cuda::is_available() {
                tch::Cuda::device_count()
            } else {
                0
            };
            if (id as i64) < count {
                Ok(tch::Device::Cuda(id as usize))
            } else {
                Err(format!(
                    "KIND_GPU instance on GPU {id} needs CUDA, but torch sees {count} CUDA device(s); \
                     use KIND_CPU or run on a machine whose driver torch can use"
                ))
            }
        }
    }
}

/// A config input or output as the backend keeps it: torch must have its dtype (BYTES: strings).
fn spec(kind: &str, name: &str, data_type: i32, dims: &[i64]) -> Result<TensorSpec, String> {
    let dtype = DataType::from_config(data_type).ok_or_else(|| format!("{kind} '{name}' has an invalid data_type"))?;
    if dtype != DataType::Bytes && values::kind_of(dtype).is_none() {
        return Err(format!(
            "{kind} '{name}' is {dtype}, which torch has no tensor kind for"
        ));
    }
    Ok(TensorSpec {
        name: name.to_string(),
        dtype,
        dims: dims.to_vec(),
    })
}

/// Applies the process-wide thread settings once each (torch has one pool per process).
fn apply_threads(settings: &Settings) {
    static INTER: OnceLock<i32> = OnceLock::new();
    if let Some(n) = settings.intra_op_threads {
        tch::set_num_threads(n);
    }
    if let Some(n) = settings.inter_op_threads {
        let first = *INTER.get_or_init(|| {
            // torch refuses once its inter-op pool has started, and tch turns that into a panic.
            if std::panic::catch_unwind(|| tch::set_num_interop_threads(n)).is_err() {
                tracing::warn!("INTER_OP_THREAD_COUNT {n} ignored: torch's inter-op pool has already started");
            }
            n
        });
        if first != n {
            tracing::warn!(
                "INTER_OP_THREAD_COUNT {n} ignored: torch's inter-op pool is process-wide and already has {first} threads"
            );
        }
    }
}

/// The useful part of a libtorch error: the raised error's line, without the C++ backtrace.
pub fn torch_message(e: &tch::TchError) -> String {
    let text = match e {
        tch::TchError::Torch(m) => m.as_str(),
        other => return other.to_string(),
    };
    let before_cpp: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Exception raised from"))
        .filter(|l| !l.trim().is_empty())
        .collect();
    let raised = before_cpp
        .iter()
        .rev()
        .find(|l| l.contains("Error: ") || l.contains("Exception: "))
        .or(before_cpp.first());
    raised.map_or(text, |l| l.trim()).chars().take(600).collect()
}

impl TorchBackend {
    /// Loads `file` on `device` and binds it to `config`; every error says what to fix.
    pub fn open(config: &ModelConfig, file: &Path, device: Device) -> Result<Self, String> {
        // Everything the config and the archive's code can tell is checked before torch loads the
        // weights.
        let settings = Settings::from_config(config)?;
        let device = torch_device(device)?;
        if config.output.is_empty() {
            return Err(
                "config.pbtxt must list the outputs: TorchScript does not declare its output names \
                        (for a model returning a dict, list its keys)"
                    .into(),
            );
        }
        let reshaped = config.input.iter().find(|i| i.reshape.is_some()).map(|i| &i.name);
        if let Some(name) = reshaped.or_else(|| config.output.iter().find(|o| o.reshape.is_some()).map(|o| &o.name)) {
            return Err(format!(
                "'{name}' has a reshape, which TorchScript models do not support; reshape inside forward()"
            ));
        }
        let batched = config.max_batch_size > 0;
        let inputs = config
            .input
            .iter()
            .map(|i| spec("input", &i.name, i.data_type, &i.dims))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = config
            .output
            .iter()
            .map(|o| spec("output", &o.name, o.data_type, &o.dims))
            .collect::<Result<Vec<_>, _>>()?;
        let signature = match archive::read(file)? {
            Signature::Known(args) => Some(args),
            Signature::Unknown(why) => {
                tracing::warn!(
                    "{}: forward()'s signature is unknown ({why}); inputs bind by <name>__<index> or config order",
                    file.display()
                );
                None
            }
        };
        let binding = binding::bind_inputs(&inputs, signature.as_deref(), batched)?;
        let mut module = CModule::load_on_device(file, device)
            .map_err(|e| format!("torch could not load {}: {}", file.display(), torch_message(&e)))?;
        module.f_set_eval().map_err(|e| torch_message(&e))?;
        apply_threads(&settings);
        Ok(TorchBackend {
            module,
            device,
            binding,
            inputs,
            outputs,
            batched,
            settings,
        })
    }

    /// The forward() arguments for one (merged) batch of inputs.
    fn arguments(&self, given: &[NamedTensor]) -> Result<Vec<IValue>> {
        let find = |name: &str| given.iter().find(|g| g.name == name).map(|g| &g.tensor);
        let slots = match &self.binding {
            Binding::Dict => {
                let mut dict = Vec::with_capacity(given.len());
                for spec in &self.inputs {
                    if let Some(t) = find(&spec.name) {
                        let value = values::to_torch(&spec.name, t, self.device)?;
                        dict.push((IValue::String(spec.name.clone()), IValue::Tensor(value)));
                    }
                }
                return Ok(vec![IValue::GenericDict(dict)]);
            }
            Binding::Positional(slots) => slots,
        };
        let mut args: Vec<Option<IValue>> = Vec::with_capacity(slots.len());
        for slot in slots {
            let spec = slot.input.map(|i| &self.inputs[i]);
            let value = match spec.and_then(|s| find(&s.name).map(|t| (s, t))) {
                None => None,
                Some((s, t)) => Some(match &slot.ty {
                    ArgType::StrList => IValue::StringList(values::strings(&s.name, t)?),
                    ty if ty.is_scalar() => values::to_scalar(&s.name, t, ty)?,
                    _ => IValue::Tensor(values::to_torch(&s.name, t, self.device)?),
                }),
            };
            args.push(value);
        }
        while args.last().is_some_and(|a| a.is_none()) && slots[args.len() - 1].has_default {
            args.pop();
        }
        args.into_iter()
            .zip(slots)
            .map(|(a, slot)| match a {
                Some(v) => Ok(v),
                None if slot.ty == ArgType::OptionalTensor => Ok(IValue::None),
                None => Err(Error::invalid(format!(
                    "forward() argument '{}' needs a value: send input '{}'",
                    slot.arg,
                    slot.input.map_or(slot.arg.as_str(), |i| &self.inputs[i].name)
                ))),
            })
            .collect()
    }
}

impl Backend for TorchBackend {
    fn execute(&mut self, inputs: &[NamedTensor], outputs: &[String]) -> Result<(Vec<NamedTensor>, Timings)> {
        let t0 = Instant::now();
        let args = self.arguments(inputs)?;
        let t1 = Instant::now();
        let result = {
            let _no_grad = tch::no_grad_guard();
            // Per call, as Triton does: the setting is torch's, not the module's.
            tch::jit::f_set_graph_executor_optimize(!self.settings.disable_optimized_execution)
                .and_then(|()| self.module.forward_is(&args))
        }
        .map_err(|e| Error::internal(format!("the TorchScript model failed: {}", torch_message(&e))))?;
        let mut leaves = Vec::new();
        let produced = values::walk(result, &mut leaves)?;
        let all: Vec<&str> = self.outputs.iter().map(|o| o.name.as_str()).collect();
        let wanted: Vec<&str> = if outputs.is_empty() {
            all.clone()
        } else {
            outputs.iter().map(String::as_str).collect()
        };
        let picked = binding::assign_outputs(&produced, &wanted, &all).map_err(Error::internal)?;
        // On a GPU, kernels and copies run asynchronously: every wanted output's copy to pinned host
        // memory is queued behind them, then one synchronisation waits for all of it, so
        // compute_infer holds the device's work (and the copy out of it), compute_output the rest.
        if let tch::Device::Cuda(index) = self.device {
            // Every device an output came from (a model may answer from another GPU than its own).
            let mut devices = vec![index];
            for (name, &leaf) in wanted.iter().zip(&picked) {
                if let Leaf::Tensor(t) = &leaves[leaf] {
                    if let tch::Device::Cuda(other) = t.device() {
                        if !devices.contains(&other) {
                            devices.push(other);
                        }
                    }
                    let staged = values::stage_to_host(name, t)?;
                    leaves[leaf] = Leaf::Tensor(staged);
                }
            }
            for device in devices {
                tch::Cuda::synchronize(device as i64);
            }
        }
        let t2 = Instant::now();
        let batch = if self.batched {
            inputs.first().and_then(|i| i.tensor.shape.first().copied())
        } else {
            None
        };
        let mut out = Vec::with_capacity(wanted.len());
        for (name, leaf) in wanted.iter().zip(picked) {
            let spec = self
                .outputs
                .iter()
                .find(|o| o.name == *name)
                .ok_or_else(|| Error::invalid(format!("unknown output '{name}'")))?;
            let tensor = match &leaves[leaf] {
                Leaf::Tensor(t) => values::from_torch(name, t, spec.dtype)?,
                Leaf::Strings(s) => values::from_strings(name, s, spec.dtype, batch, &spec.dims)?,
            };
            out.push(NamedTensor {
                name: name.to_string(),
                tensor,
            });
        }
        Ok((out, Timings::from_marks(t0, t1, t2, Instant::now())))
    }
}
