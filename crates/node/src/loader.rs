//! Loads one model directory: config (parsed or auto-completed), version policy, sessions, instances.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mesh::config::{parse_pbtxt_with_fields, validate_config, ModelConfig};
use ort::session::Session;
use ractor::ActorCell;

use crate::backend::onnx::{self, Device, OnnxBackend};
use crate::model::ModelHandle;
use crate::placement;
use crate::repository::{self, ModelDir};
use crate::supervision::BackendFactory;

/// What every instance of one model version is built from.
#[derive(Clone)]
pub struct VersionSource {
    pub env: Arc<ort::environment::Environment>,
    pub model: String,
    pub version: i64,
    /// The model directory (warmup files live under it).
    pub dir: PathBuf,
    pub file: PathBuf,
}

impl VersionSource {
    /// A factory for one instance; `first` is a session already opened, used by the first build.
    pub fn factory(&self, config: &Arc<ModelConfig>, device: Device, first: Option<Session>) -> BackendFactory {
        let first = Mutex::new(first);
        let (env, cfg, file) = (self.env.clone(), config.clone(), self.file.clone());
        Arc::new(move || {
            let session = match first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(s) => s,
                None => onnx::open_session(&env, &cfg, &file, device)?,
            };
            Ok(Box::new(OnnxBackend::new(session, &cfg)) as Box<dyn crate::backend::Backend>)
        })
    }
}

/// A model loaded from its directory, with what decides whether a later change applies in place.
pub struct LoadedModel {
    pub versions: BTreeMap<i64, Arc<ModelHandle>>,
    /// The config as written (before auto-complete) and the final one all versions share.
    pub written: ModelConfig,
    pub config: Arc<ModelConfig>,
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

/// Reads the config a load uses: the override if given, else config.pbtxt. Returns it with
/// whether it sets max_batch_size itself.
pub fn written_config(dir: &ModelDir, override_config: Option<ModelConfig>) -> Result<(ModelConfig, bool), String> {
    match override_config {
        Some(mut c) => {
            adopt_name(&mut c, &dir.name, "the config override")?;
            Ok((c, true))
        }
        None => read_config(dir),
    }
}

/// Loads every version the policy selects, each under its own ModelActor linked to `supervisor`;
/// any failure fails the model with a reason.
pub async fn load_model(
    env: &Arc<ort::environment::Environment>,
    dir: &ModelDir,
    gpus: &[i32],
    (written, sets_mbs): (ModelConfig, bool),
    supervisor: &ActorCell,
) -> Result<LoadedModel, String> {
    let mut config = written.clone();
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
            per_instance.push((p.clone(), Some(session)));
        }
        sessions.push((v, file, per_instance));
    }
    if let Some(Some(first)) = sessions
        .first()
        .and_then(|(_, _, s)| s.first())
        .map(|(_, s)| s.as_ref())
    {
        onnx::auto_complete(&mut config, first, sets_mbs)?;
    }
    validate_config(&config)?;
    for (v, _, per_instance) in &sessions {
        if let Some((_, Some(s))) = per_instance.first() {
            onnx::check_against_model(&config, s).map_err(|e| format!("version {v}: {e}"))?;
        }
    }
    let config = Arc::new(config);
    let mut loaded = BTreeMap::new();
    for (v, file, per_instance) in sessions {
        let source = VersionSource {
            env: env.clone(),
            model: dir.name.clone(),
            version: v,
            dir: dir.path.clone(),
            file,
        };
        let handle = crate::model::start(source, config.clone(), per_instance, supervisor.clone()).await?;
        loaded.insert(v, handle);
    }
    Ok(LoadedModel {
        versions: loaded,
        written,
        config,
    })
}

/// Whether `next` differs from `current` only in `instance_group`, so the instances can change in place.
pub fn only_instances_differ(current: &ModelConfig, next: &ModelConfig) -> bool {
    let strip = |c: &ModelConfig| ModelConfig {
        instance_group: Vec::new(),
        ..c.clone()
    };
    current.instance_group != next.instance_group && strip(current) == strip(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::proto::ModelInstanceGroup;

    fn with_count(count: i32) -> ModelConfig {
        ModelConfig {
            name: "m".into(),
            max_batch_size: 8,
            instance_group: vec![ModelInstanceGroup {
                count,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_count_change_alone_applies_in_place() {
        assert!(only_instances_differ(&with_count(1), &with_count(3)));
        assert!(
            !only_instances_differ(&with_count(2), &with_count(2)),
            "no change is not a resize"
        );
        let mut other = with_count(3);
        other.max_batch_size = 4;
        assert!(
            !only_instances_differ(&with_count(1), &other),
            "any other change reloads"
        );
    }
}
