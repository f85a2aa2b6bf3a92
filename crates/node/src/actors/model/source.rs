//! What every instance of one model version is built from: the backend kind and files, and the
//! factory that opens (and after a failure reopens) an instance's backend.
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mesh::config::ModelConfig;

use crate::actors::instance::supervision::BackendFactory;
use crate::backend::onnx::{self, Device, OnnxBackend};
use crate::backend::python::{InstanceInfo, PythonBackend, PythonContext};
use crate::backend::Backend;

/// Which backend serves a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Onnx,
    Python,
    Torch,
    /// TensorFlow SavedModel or GraphDef, run by the bundled runner in a Python stub.
    TensorFlow,
}

/// What every instance of one model version is built from.
#[derive(Clone)]
pub struct VersionSource {
    pub kind: BackendKind,
    pub env: crate::backend::ort_env::Ort,
    pub python: Arc<PythonContext>,
    /// The node's rate limiter, which each instance joins.
    pub limiter: Arc<crate::actors::instance::rate_limit::Limiter>,
    pub model: String,
    pub version: i64,
    /// The model directory (warmup files live under it).
    pub dir: PathBuf,
    pub file: PathBuf,
}

impl VersionSource {
    /// A factory for one instance; `first` is a backend opened at load, used by the first build.
    pub fn factory(
        &self,
        config: &Arc<ModelConfig>,
        label: &str,
        placement: &crate::placement::InstancePlacement,
        first: Option<Box<dyn Backend>>,
    ) -> BackendFactory {
        let device = placement.device;
        if matches!(self.kind, BackendKind::Python | BackendKind::TensorFlow) {
            let (source, cfg, label) = (self.clone(), config.clone(), label.to_string());
            let triton_name = placement.triton_name.clone();
            return Arc::new(move || {
                // A TensorFlow model's file is its SavedModel or GraphDef; the stub runs the runner.
                let runner = match source.kind {
                    BackendKind::TensorFlow => Some(crate::backend::python::stub::tensorflow_runner()?),
                    _ => None,
                };
                let info = InstanceInfo {
                    name: &label,
                    triton_name: &triton_name,
                    gpu: match device {
                        Device::Gpu(i) => Some(i),
                        Device::Cpu => None,
                    },
                    version: source.version,
                    model_dir: &source.dir,
                    file: runner.as_deref().unwrap_or(&source.file),
                    artifact: runner.is_some().then_some(source.file.as_path()),
                };
                let backend = PythonBackend::start(source.python.clone(), &cfg, &info)?;
                Ok(Box::new(backend) as Box<dyn Backend>)
            });
        }
        let first = Mutex::new(first);
        let (kind, env, cfg, file) = (self.kind, self.env.clone(), config.clone(), self.file.clone());
        Arc::new(move || {
            if let Some(backend) = first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Ok(backend);
            }
            match kind {
                BackendKind::Torch => open_torch(&cfg, &file, device),
                _ => {
                    let session = onnx::open_session(env.env()?, &cfg, &file, device)?;
                    Ok(Box::new(OnnxBackend::new(session, &cfg)) as Box<dyn Backend>)
                }
            }
        })
    }
}

/// Opens one TorchScript instance.
#[cfg(feature = "torch")]
pub(crate) fn open_torch(
    config: &ModelConfig,
    file: &std::path::Path,
    device: Device,
) -> Result<Box<dyn Backend>, String> {
    Ok(Box::new(crate::backend::torch::TorchBackend::open(
        config, file, device,
    )?))
}

/// Without the `torch` feature a TorchScript model fails its load with how to enable it.
#[cfg(not(feature = "torch"))]
pub(crate) fn open_torch(_: &ModelConfig, _: &std::path::Path, _: Device) -> Result<Box<dyn Backend>, String> {
    Err(crate::backend::torch::NOT_BUILT.into())
}
