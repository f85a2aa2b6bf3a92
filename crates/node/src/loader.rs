//! Loads one model directory: config (parsed or auto-completed), version policy, sessions, instances.
use std::collections::BTreeMap;
use std::sync::Arc;

use mesh::config::{parse_pbtxt_with_fields, validate_config, ModelConfig};
use mesh::proto::model_instance_group::Kind;

use crate::backend::onnx::{self, Device, OnnxBackend};
use crate::instance::InstanceHandle;
use crate::repository::{self, ModelDir};
use crate::stats::ModelStats;

/// A loaded, servable model version.
pub struct LoadedVersion {
    pub config: Arc<ModelConfig>,
    pub version: i64,
    pub version_label: String,
    pub instance: InstanceHandle,
    pub stats: ModelStats,
}

/// Reads config.pbtxt (if any) and checks its name against the directory.
fn read_config(dir: &ModelDir) -> Result<(ModelConfig, bool), String> {
    let path = dir.path.join("config.pbtxt");
    let (mut config, fields) = match std::fs::read_to_string(&path) {
        Ok(text) => parse_pbtxt_with_fields(&text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (ModelConfig::default(), Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if config.name.is_empty() {
        config.name = dir.name.clone();
    } else if config.name != dir.name {
        return Err(format!(
            "config.pbtxt names the model '{}', but its directory is '{}'; they must match",
            config.name, dir.name
        ));
    }
    Ok((config, fields.iter().any(|f| f == "max_batch_size")))
}

fn check_backend(config: &ModelConfig) -> Result<(), String> {
    match (config.platform.as_str(), config.backend.as_str()) {
        ("" | "onnxruntime_onnx", "" | "onnxruntime") => Ok(()),
        ("ensemble", _) => Err("ensemble models are not supported by this build yet".into()),
        (_, "python") => Err("the python backend is not supported by this build yet".into()),
        ("pytorch_libtorch", _) | (_, "pytorch") => {
            Err("the pytorch backend is not supported by this build yet".into())
        }
        (p, b) => Err(format!(
            "unsupported platform '{p}' / backend '{b}'; this node serves onnxruntime models"
        )),
    }
}

/// The device for the model's instance: KIND_GPU asks for a GPU; everything else runs on CPU.
fn device_for(config: &ModelConfig) -> Device {
    config
        .instance_group
        .iter()
        .find(|g| g.kind == Kind::Gpu as i32)
        .map_or(Device::Cpu, |g| {
            Device::Gpu(g.gpus.first().copied().unwrap_or(0))
        })
}

/// Loads every version the policy selects; any failure fails the whole model with a reason.
pub fn load_model(
    env: &ort::environment::Environment,
    dir: &ModelDir,
) -> Result<BTreeMap<i64, Arc<LoadedVersion>>, String> {
    let (mut config, sets_mbs) = read_config(dir)?;
    check_backend(&config)?;
    validate_config(&config)?;
    let versions = repository::select_versions(&config, &dir.versions)?;
    let device = device_for(&config);
    let mut sessions = Vec::with_capacity(versions.len());
    for &v in &versions {
        let file = dir
            .path
            .join(v.to_string())
            .join(repository::model_file_name(&config));
        if !file.is_file() {
            return Err(format!("version {v} has no model file {}", file.display()));
        }
        let session = onnx::open_session(env, &config, &file, device)
            .map_err(|e| format!("version {v}: {e}"))?;
        sessions.push((v, session));
    }
    if let Some((_, first)) = sessions.first() {
        onnx::auto_complete(&mut config, first, sets_mbs)?;
    }
    validate_config(&config)?;
    for (v, session) in &sessions {
        onnx::check_against_model(&config, session).map_err(|e| format!("version {v}: {e}"))?;
    }
    let config = Arc::new(config);
    let mut loaded = BTreeMap::new();
    for (v, session) in sessions {
        let backend = Box::new(OnnxBackend::new(session, &config));
        let instance = InstanceHandle::spawn(format!("{}_{v}", dir.name), backend)
            .map_err(|e| format!("cannot start the instance thread: {e}"))?;
        loaded.insert(
            v,
            Arc::new(LoadedVersion {
                config: config.clone(),
                version: v,
                version_label: v.to_string(),
                instance,
                stats: ModelStats::new(&dir.name, v),
            }),
        );
    }
    Ok(loaded)
}
