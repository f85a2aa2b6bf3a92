//! ONNX Runtime backend: session set-up, Triton-style auto-complete, and execution.
use std::path::Path;
use std::time::Instant;

use mesh::config::ModelConfig;
use mesh::proto::{ModelInput, ModelOutput, ModelTensorReshape};
use mesh::{DataType, Error, NamedTensor, Result};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

use super::ort_values::{self, InputList};
use super::{Backend, Timings};
use crate::actors::instance::ragged::Ragged;
use crate::serving::sequence::SequenceSetup;

/// Batch size Triton's ONNX backend gives a batchable model whose config omits max_batch_size.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// Model parameters (config `parameters`) this backend reads, with Triton's ONNX backend names.
pub const PARAM_INTRA_OP_THREADS: &str = "intra_op_thread_count";
pub const PARAM_INTER_OP_THREADS: &str = "inter_op_thread_count";

/// Where an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu(i32),
}

struct IoSpec {
    name: String,
    /// The shape ONNX Runtime sees, when config `reshape` differs from `dims`.
    reshape: Option<Vec<i64>>,
    dims: Vec<i64>,
}

/// One ONNX Runtime session bound to a config.
pub struct OnnxBackend {
    session: Session,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    /// Implicit state outputs of a sequence model: produced only when named.
    state_outputs: Vec<IoSpec>,
    batched: bool,
    /// Test-only (cargo feature `fault-injection`): panic on a batch of this many rows, from the
    /// model parameter `mesh_fault_panic_on_batch`, so supervision can be shown on a real failure.
    #[cfg(feature = "fault-injection")]
    panic_on_rows: Option<i64>,
}

/// The model parameter the `fault-injection` feature reads.
pub const PARAM_FAULT_PANIC_ON_BATCH: &str = "mesh_fault_panic_on_batch";

fn thread_param(config: &ModelConfig, key: &str) -> Result<Option<usize>, String> {
    match config.parameters.get(key) {
        None => Ok(None),
        Some(p) => p.string_value.trim().parse::<usize>().map(Some).map_err(|_| {
            format!(
                "parameter '{key}' must be a non-negative integer, got '{}'",
                p.string_value
            )
        }),
    }
}

/// Whether the loaded ONNX Runtime has its CUDA execution provider (the PyPI `onnxruntime` wheel does
/// not; `onnxruntime-gpu` does). Asked once; when it has none, one line says what follows.
pub fn cuda_available() -> bool {
    static CUDA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CUDA.get_or_init(|| {
        use ort::ep::ExecutionProvider;
        let available = ort::ep::CUDA::is_available().unwrap_or(false);
        if !available {
            tracing::info!(
                "this ONNX Runtime has no CUDA execution provider: ONNX models with KIND_AUTO instances (or no \
                 instance_group) run on CPU, and KIND_GPU ones fail to load; for GPUs run scripts/setup.sh \
                 on a host whose NVIDIA driver runs CUDA 13 (it installs onnxruntime-gpu), or point \
                 --backend-config onnxruntime,library= (or ORT_DYLIB_PATH) at an onnxruntime-gpu library"
            );
        }
        available
    })
}

/// The execution providers of an instance on GPU `id`, with the model's settings (`onnx_gpu`):
/// TensorRT first when the config asks for it and this ONNX Runtime has it, then CUDA.
fn gpu_providers(config: &ModelConfig, id: i32) -> Result<Vec<ort::ep::ExecutionProviderDispatch>, String> {
    use ort::ep::{ArbitrarilyConfigurableExecutionProvider, ExecutionProvider};
    let settings = super::onnx_gpu::read(config)?;
    super::ort_env::load_cuda_libraries();
    let mut providers = Vec::new();
    if let Some(options) = &settings.tensorrt {
        if ort::ep::TensorRT::is_available().unwrap_or(false) {
            let trt = options
                .iter()
                .fold(ort::ep::TensorRT::default().with_device_id(id), |ep, (k, v)| {
                    ep.with_arbitrary_config(k, v)
                });
            providers.push(trt.build().error_on_failure());
        } else {
            tracing::warn!(
                model = %config.name,
                "the model asks for the TensorRT execution accelerator, which this ONNX Runtime cannot load \
                 (its TensorRT libraries are not found); the CUDA execution provider runs it"
            );
        }
    }
    let cuda = settings
        .cuda
        .iter()
        .fold(ort::ep::CUDA::default().with_device_id(id), |ep, (k, v)| {
            ep.with_arbitrary_config(k, v)
        });
    providers.push(cuda.build().error_on_failure());
    Ok(providers)
}

/// Opens an ONNX Runtime session on the given device.
pub fn open_session(
    env: &ort::environment::Environment,
    config: &ModelConfig,
    file: &Path,
    device: Device,
) -> Result<Session, String> {
    let fail = |e: ort::Error| format!("ONNX Runtime could not load {}: {e}", file.display());
    let mut builder = Session::builder(env).map_err(fail)?;
    builder = builder
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| fail(ort::Error::from(e)))?;
    if let Some(n) = thread_param(config, PARAM_INTRA_OP_THREADS)? {
        builder = builder.with_intra_threads(n).map_err(|e| fail(ort::Error::from(e)))?;
    }
    if let Some(n) = thread_param(config, PARAM_INTER_OP_THREADS)? {
        builder = builder.with_inter_threads(n).map_err(|e| fail(ort::Error::from(e)))?;
    }
    if let Device::Gpu(id) = device {
        builder = builder
            .with_execution_providers(gpu_providers(config, id)?)
            .map_err(|e| {
                format!("KIND_GPU instance on GPU {id} needs ONNX Runtime's CUDA execution provider, which failed: {e}")
            })?;
    }
    builder.commit_from_file(file).map_err(fail)
}

/// Fills what the config omits from the model's own metadata, as Triton's auto-complete does.
/// `sets_max_batch_size` says whether the config file named `max_batch_size` at all.
pub fn auto_complete(config: &mut ModelConfig, session: &Session, sets_max_batch_size: bool) -> Result<(), String> {
    let ins: Vec<_> = session
        .inputs()
        .iter()
        .map(|o| (o.name().to_string(), ort_values::outlet_shape(o.dtype())))
        .collect();
    let outs: Vec<_> = session
        .outputs()
        .iter()
        .map(|o| (o.name().to_string(), ort_values::outlet_shape(o.dtype())))
        .collect();
    let all_dynamic_first = ins
        .iter()
        .chain(&outs)
        .all(|(_, t)| matches!(t, Some((_, s)) if s.first() == Some(&-1)));
    if !sets_max_batch_size && config.max_batch_size == 0 && all_dynamic_first && !ins.is_empty() {
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE;
    }
    if config.platform.is_empty() && config.backend.is_empty() {
        config.platform = "onnxruntime_onnx".into();
    }
    if config.backend.is_empty() {
        config.backend = "onnxruntime".into();
    }
    let batched = config.max_batch_size > 0;
    let dims_of = |name: &str, shape: &[i64]| -> Result<Vec<i64>, String> {
        let dims = if batched {
            shape.get(1..).unwrap_or(&[]).to_vec()
        } else {
            shape.to_vec()
        };
        if dims.is_empty() {
            return Err(format!(
                "cannot auto-complete '{name}': the model gives it no non-batch dimensions; list it in config.pbtxt"
            ));
        }
        Ok(dims)
    };
    let ty =
        |name: &str, t: &Option<(ort::value::TensorElementType, Vec<i64>)>| -> Result<(DataType, Vec<i64>), String> {
            let (et, shape) = t
                .clone()
                .ok_or_else(|| format!("model tensor '{name}' is not a tensor"))?;
            let d = ort_values::mesh_type(et)
                .ok_or_else(|| format!("model tensor '{name}' has type {et:?}, which Triton cannot serve"))?;
            Ok((d, shape))
        };
    let supplied = SequenceSetup::supplied_inputs(config);
    let state_outputs: Vec<String> = SequenceSetup::state_outputs(config)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    if config.input.is_empty() {
        for (name, t) in ins.iter().filter(|(n, _)| !supplied.contains(n)) {
            let (d, shape) = ty(name, t)?;
            config.input.push(ModelInput {
                name: name.clone(),
                data_type: d.to_config(),
                dims: dims_of(name, &shape)?,
                ..Default::default()
            });
        }
    }
    if config.output.is_empty() {
        for (name, t) in outs.iter().filter(|(n, _)| !state_outputs.contains(n)) {
            let (d, shape) = ty(name, t)?;
            config.output.push(ModelOutput {
                name: name.clone(),
                data_type: d.to_config(),
                dims: dims_of(name, &shape)?,
                ..Default::default()
            });
        }
    }
    Ok(())
}

/// Checks the (completed) config against the model: names, types, ranks and fixed dims.
pub fn check_against_model(config: &ModelConfig, session: &Session) -> Result<(), String> {
    let batched = config.max_batch_size > 0;
    let ragged = Ragged::from_config(config)?;
    let check = |kind: &str,
                 name: &str,
                 data_type: i32,
                 dims: &[i64],
                 reshape: &Option<ModelTensorReshape>,
                 outlets: &[ort::value::Outlet]|
     -> Result<(), String> {
        let Some(outlet) = outlets.iter().find(|o| o.name() == name) else {
            let known: Vec<_> = outlets.iter().map(|o| o.name()).collect();
            return Err(format!(
                "{kind} '{name}' is not in the model; the model's {kind}s are {known:?}"
            ));
        };
        let (et, shape) = ort_values::outlet_shape(outlet.dtype())
            .ok_or_else(|| format!("{kind} '{name}' is not a tensor in the model"))?;
        let want = DataType::from_config(data_type);
        if want != ort_values::mesh_type(et) {
            return Err(format!(
                "{kind} '{name}' is {} in config but {et:?} in the model",
                want.map_or("invalid", |d| d.wire_name())
            ));
        }
        if ragged
            .as_ref()
            .is_some_and(|r| r.is_scattered(name) || r.is_ragged(name))
        {
            // The node flattens ragged inputs and scatters these outputs: the model sees them flat.
            return Ok(());
        }
        let inner = reshape.as_ref().map_or(dims, |r| &r.shape[..]);
        let mut expect = Vec::with_capacity(inner.len() + 1);
        if batched {
            if shape.first().is_some_and(|&d| d != -1) {
                return Err(format!(
                    "max_batch_size is {} but the model's {kind} '{name}' has a fixed first dimension {} (batching needs it dynamic); set max_batch_size: 0",
                    config.max_batch_size, shape[0]
                ));
            }
            expect.push(-1);
        }
        expect.extend_from_slice(inner);
        let fits =
            expect.len() == shape.len() && expect.iter().zip(&shape).all(|(&c, &m)| c == -1 || m == -1 || c == m);
        if !fits {
            return Err(format!(
                "{kind} '{name}' has dims {expect:?} in config (batch included) but the model's shape is {shape:?}"
            ));
        }
        Ok(())
    };
    // Graph inputs that have an initializer (a default) are left out of `inputs()`; a config input
    // naming one is an input the client may send or leave out (Triton's `optional: true`).
    let defaults = session.overridable_initializers();
    let inputs: Vec<ort::value::Outlet> = session
        .inputs()
        .iter()
        .map(|o| (o.name(), o.dtype()))
        .chain(defaults.iter().map(|d| (d.name(), d.dtype())))
        .map(|(name, dtype)| ort::value::Outlet::new(name, dtype.clone()))
        .collect();
    for i in &config.input {
        check("input", &i.name, i.data_type, &i.dims, &i.reshape, &inputs)?;
    }
    for o in &config.output {
        check("output", &o.name, o.data_type, &o.dims, &o.reshape, session.outputs())?;
    }
    // Sequence control and state inputs, and batch inputs, are the node's to supply.
    let mut supplied = SequenceSetup::supplied_inputs(config);
    supplied.extend(ragged.iter().flat_map(|r| r.made_inputs().map(String::from)));
    for outlet in session.inputs() {
        if !config.input.iter().any(|i| i.name == outlet.name()) && !supplied.iter().any(|s| s == outlet.name()) {
            return Err(format!(
                "the model needs input '{}', which config.pbtxt does not list",
                outlet.name()
            ));
        }
    }
    Ok(())
}

impl OnnxBackend {
    pub fn new(session: Session, config: &ModelConfig) -> Self {
        let spec = |name: &str, dims: &[i64], reshape: &Option<ModelTensorReshape>| IoSpec {
            name: name.to_string(),
            reshape: reshape.as_ref().map(|r| r.shape.clone()),
            dims: dims.to_vec(),
        };
        OnnxBackend {
            session,
            inputs: config
                .input
                .iter()
                .map(|i| spec(&i.name, &i.dims, &i.reshape))
                .collect(),
            outputs: config
                .output
                .iter()
                .map(|o| spec(&o.name, &o.dims, &o.reshape))
                .collect(),
            state_outputs: SequenceSetup::state_outputs(config)
                .into_iter()
                .map(|(name, dims)| spec(&name, &dims, &None))
                .collect(),
            batched: config.max_batch_size > 0,
            #[cfg(feature = "fault-injection")]
            panic_on_rows: config
                .parameters
                .get(PARAM_FAULT_PANIC_ON_BATCH)
                .and_then(|p| p.string_value.parse().ok()),
        }
    }
}

/// Resolves a target shape (with at most one -1) for `count` elements, keeping the batch dim.
fn resolve_shape(batch: Option<i64>, target: &[i64], count: usize) -> Vec<i64> {
    let mut shape: Vec<i64> = batch.into_iter().chain(target.iter().copied()).collect();
    let known: i64 = shape.iter().filter(|&&d| d >= 0).product::<i64>().max(1);
    if let Some(slot) = shape.iter_mut().find(|d| **d < 0) {
        *slot = count as i64 / known;
    }
    shape
}

impl Backend for OnnxBackend {
    fn execute(&mut self, inputs: &[NamedTensor], outputs: &[String]) -> Result<(Vec<NamedTensor>, Timings)> {
        let t0 = Instant::now();
        let batch = if self.batched {
            inputs.first().and_then(|i| i.tensor.shape.first().copied())
        } else {
            None
        };
        #[cfg(feature = "fault-injection")]
        if self.panic_on_rows.is_some() && self.panic_on_rows == batch {
            panic!("fault injection: a batch of {batch:?} rows");
        }
        let mut values: InputList = Vec::with_capacity(inputs.len());
        for input in inputs {
            let spec = self.inputs.iter().find(|s| s.name == input.name);
            let shape = match spec.and_then(|s| s.reshape.as_ref()) {
                Some(r) => resolve_shape(batch, r, input.tensor.element_count()),
                None => input.tensor.shape.clone(),
            };
            values.push((
                input.name.as_str().into(),
                ort_values::to_input(&input.name, &input.tensor, shape)?,
            ));
        }
        let t1 = Instant::now();
        let mut result = self
            .session
            .run(values)
            .map_err(|e| Error::internal(format!("ONNX Runtime failed: {e}")))?;
        let t2 = Instant::now();
        let wanted: Vec<&IoSpec> = if outputs.is_empty() {
            self.outputs.iter().collect()
        } else {
            outputs
                .iter()
                .filter_map(|n| self.outputs.iter().chain(&self.state_outputs).find(|s| &s.name == n))
                .collect()
        };
        let mut out = Vec::with_capacity(wanted.len());
        for spec in wanted {
            let value = result
                .remove(spec.name.as_str())
                .ok_or_else(|| Error::internal(format!("the model did not produce output '{}'", spec.name)))?;
            let mut tensor = ort_values::from_output(&spec.name, value, None)?;
            if spec.reshape.is_some() {
                let b = if self.batched {
                    tensor.shape.first().copied()
                } else {
                    None
                };
                tensor.shape = resolve_shape(b, &spec.dims, tensor.element_count());
            }
            out.push(NamedTensor {
                name: spec.name.clone(),
                tensor,
            });
        }
        Ok((out, Timings::from_marks(t0, t1, t2, Instant::now())))
    }
}

#[cfg(test)]
mod tests {
    use super::resolve_shape;

    #[test]
    fn reshape_resolution_keeps_batch_and_fills_one_wildcard() {
        assert_eq!(resolve_shape(Some(2), &[-1, 2], 8), vec![2, 2, 2]);
        assert_eq!(resolve_shape(None, &[4], 4), vec![4]);
        assert_eq!(resolve_shape(Some(3), &[], 3), vec![3]);
    }
}
