//! Loads one model directory: config (parsed or auto-completed), version policy, sessions, instances.
use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use mesh::config::{parse_pbtxt_with_fields, validate_config, ModelConfig};

use crate::backend::onnx::{self, OnnxBackend};
use crate::batching::BatchConfig;
use crate::instance::InstanceHandle;
use crate::placement;
use crate::repository::{self, ModelDir};
use crate::stats::ModelStats;
use crate::supervision::BackendFactory;

/// A loaded, servable model version.
pub struct LoadedVersion {
    pub config: Arc<ModelConfig>,
    pub version: i64,
    pub version_label: String,
    pub instances: Vec<InstanceHandle>,
    /// Rotates the starting point of instance selection so ties spread.
    pub rotation: AtomicUsize,
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
    adopt_name(&mut config, &dir.name, "config.pbtxt")?;
    Ok((config, fields.iter().any(|f| f == "max_batch_size")))
}

/// Gives a nameless config the model's name; a different name is an error, as Triton requires.
fn adopt_name(config: &mut ModelConfig, name: &str, source: &str) -> Result<(), String> {
    if config.name.is_empty() {
        config.name = name.to_string();
    } else if config.name != name {
        return Err(format!(
            "{source} names the model '{}', but it is loaded as '{name}'; they must match",
            config.name
        ));
    }
    Ok(())
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

/// Loads every version the policy selects, one session per placed instance; any failure fails the model with a reason.
pub async fn load_model(
    env: &Arc<ort::environment::Environment>,
    dir: &ModelDir,
    gpus: &[i32],
    override_config: Option<ModelConfig>,
) -> Result<BTreeMap<i64, Arc<LoadedVersion>>, String> {
    let (mut config, sets_mbs) = match override_config {
        Some(mut c) => {
            adopt_name(&mut c, &dir.name, "the config override")?;
            (c, true)
        }
        None => read_config(dir)?,
    };
    check_backend(&config)?;
    validate_config(&config)?;
    let versions = repository::select_versions(&config, &dir.versions)?;
    let placements = placement::place_instances(&config, gpus)?;
    let mut sessions = Vec::with_capacity(versions.len());
    for &v in &versions {
        let file = dir.path.join(v.to_string()).join(repository::model_file_name(&config));
        if !file.is_file() {
            return Err(format!("version {v} has no model file {}", file.display()));
        }
        let mut per_instance = Vec::with_capacity(placements.len());
        for p in &placements {
            let session = tokio::task::block_in_place(|| onnx::open_session(env, &config, &file, p.device))
                .map_err(|e| format!("version {v}, instance {}: {e}", p.name))?;
            per_instance.push(session);
        }
        sessions.push((v, per_instance));
    }
    if let Some(first) = sessions.first().and_then(|(_, s)| s.first()) {
        onnx::auto_complete(&mut config, first, sets_mbs)?;
    }
    validate_config(&config)?;
    for (v, per_instance) in &sessions {
        if let Some(s) = per_instance.first() {
            onnx::check_against_model(&config, s).map_err(|e| format!("version {v}: {e}"))?;
        }
    }
    let config = Arc::new(config);
    let batch_config = BatchConfig::from_model_config(&config);
    let mut loaded = BTreeMap::new();
    for (v, per_instance) in sessions {
        let file = dir.path.join(v.to_string()).join(repository::model_file_name(&config));
        let mut instances = Vec::with_capacity(per_instance.len());
        for (p, session) in placements.iter().zip(per_instance) {
            // The first session was opened above; restarts open a new one from the same file.
            let first = Mutex::new(Some(session));
            let (env, cfg, file, device) = (env.clone(), config.clone(), file.clone(), p.device);
            let factory: BackendFactory = Arc::new(move || {
                let session = match first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    Some(s) => s,
                    None => onnx::open_session(&env, &cfg, &file, device)?,
                };
                Ok(Box::new(OnnxBackend::new(session, &cfg)) as Box<dyn crate::backend::Backend>)
            });
            let label = format!("{}_v{v}", p.name);
            tracing::debug!(instance = %label, device = ?p.device, "instance starting");
            instances.push(InstanceHandle::spawn(label, (&dir.name, v), batch_config.clone(), factory).await?);
        }
        crate::warmup::run(&config, &dir.path, &instances)
            .await
            .map_err(|e| format!("version {v}: {e}"))?;
        loaded.insert(
            v,
            Arc::new(LoadedVersion {
                config: config.clone(),
                version: v,
                version_label: v.to_string(),
                instances,
                rotation: AtomicUsize::new(0),
                stats: ModelStats::new(&dir.name, v),
            }),
        );
    }
    Ok(loaded)
}
