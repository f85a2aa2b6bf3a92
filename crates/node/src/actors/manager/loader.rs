//! Loads one model directory: config (parsed or auto-completed), version policy, sessions, instances.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use mesh::config::{parse_pbtxt_with_fields, validate_config, ModelConfig};
use mesh::ensemble::{Plan, StepModel};
use mesh::proto::model_config::SchedulingChoice;
use ractor::ActorCell;

use crate::actors::model::source::{open_torch, BackendKind, VersionSource};
use crate::actors::model::ModelHandle;
use crate::actors::table::ModelTable;
use crate::backend::onnx::{self, Device, OnnxBackend};
use crate::backend::python::{self, PythonContext};
use crate::backend::Backend;
use crate::cli::ControlMode;
use crate::placement;
use crate::repository::placed::PlacedModels;
use crate::repository::{self, ModelDir};

/// tritonserver's flags about how models load.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    /// `--model-config-name`: `<model>/configs/<name>.pbtxt` is read where it exists.
    pub config_name: Option<String>,
    /// False with `--disable-auto-complete-config` or `--strict-model-config true`: configs are
    /// used as written, never filled from the model.
    pub auto_complete: bool,
    /// `--model-load-retry-count`: a failed load is tried again this many times.
    pub retries: u32,
    /// `--model-load-thread-count`: how many models load at once at start-up (default 4, as
    /// Triton's).
    pub threads: usize,
    /// `--model-namespacing`: each repository is a namespace, so one name may be served from several.
    pub namespacing: bool,
    /// `--model-load-gpu-limit <gpu>:<fraction>`: a model whose instances leave more than this
    /// fraction of a GPU's memory in use fails to load.
    pub gpu_limits: BTreeMap<i32, f64>,
}

impl LoadSettings {
    /// From the tritonserver flags; a config name that is not a plain file name is refused.
    pub fn from_flags(flags: &mesh::compat::TritonFlags) -> Result<Self, String> {
        if let Some(name) = &flags.model_config_name {
            mesh::repository::check_path_component("--model-config-name", name).map_err(|e| {
                format!(
                    "--model-config-name must be a plain name, read as configs/<name>.pbtxt: {}",
                    e.message
                )
            })?;
        }
        let threads = flags.model_load_thread_count.unwrap_or(4);
        if threads == 0 {
            return Err("--model-load-thread-count must be at least 1".into());
        }
        Ok(LoadSettings {
            threads: threads as usize,
            config_name: flags.model_config_name.clone(),
            auto_complete: !(flags.disable_auto_complete_config == Some(true)
                || flags.strict_model_config == Some(true)),
            retries: flags.model_load_retry_count.unwrap_or(0),
            namespacing: flags.model_namespacing == Some(true),
            gpu_limits: gpu_limits(&flags.model_load_gpu_limit)?,
        })
    }
}

/// Reads `--model-load-gpu-limit` entries, `<device_id>:<fraction>` as tritonserver takes them.
fn gpu_limits(given: &[String]) -> Result<BTreeMap<i32, f64>, String> {
    given
        .iter()
        .map(|entry| {
            let parsed = entry.split_once(':').and_then(|(gpu, fraction)| {
                let fraction: f64 = fraction.trim().parse().ok()?;
                Some((gpu.trim().parse::<i32>().ok()?, fraction))
            });
            match parsed {
                Some((gpu, fraction)) if gpu >= 0 && fraction.is_finite() && fraction >= 0.0 => Ok((gpu, fraction)),
                _ => Err(format!(
                    "--model-load-gpu-limit '{entry}' must be <device_id>:<fraction>, for example 0:0.8"
                )),
            }
        })
        .collect()
}

/// The load check of `--model-load-gpu-limit`, made as tritonserver makes it once a model's GPU
/// instances exist: more memory in use than `fraction` of the GPU's rejects the model. Sans-IO.
pub fn check_gpu_limit(model: &str, gpu: i32, fraction: f64, (total, used): (u64, u64)) -> Result<(), String> {
    let allowed = total as f64 * fraction;
    if used as f64 > allowed {
        return Err(format!(
            "can not create model '{model}': memory limit set for GPU {gpu} has exceeded, model loading is \
             rejected ({used} of {total} bytes in use, limit {fraction})"
        ));
    }
    Ok(())
}

/// What the node needs to (re)load models after start-up.
pub struct Repositories {
    pub env: crate::backend::ort_env::Ort,
    pub roots: Vec<PathBuf>,
    pub gpus: Vec<i32>,
    /// The UUID of each of `gpus`, in the same order (NVML finds a GPU by it).
    pub gpu_uuids: Vec<String>,
    pub mode: ControlMode,
    pub python: Arc<PythonContext>,
    pub loading: LoadSettings,
    /// `--rate-limit`: decides when rate-limited instances run.
    pub limiter: Arc<crate::actors::instance::rate_limit::Limiter>,
    /// Models the cluster's router placed here, loaded from its shipments instead of `roots`.
    pub placed: Arc<PlacedModels>,
}

/// A model loaded from its directory, with what decides whether a later change applies in place.
pub struct LoadedModel {
    pub versions: BTreeMap<i64, Arc<ModelHandle>>,
    /// The config as written (before auto-complete) and the final one all versions share.
    pub written: ModelConfig,
    pub config: Arc<ModelConfig>,
}

/// Reads `configs/<name>.pbtxt` where `--model-config-name` names one that exists, else
/// config.pbtxt (if any), and checks its name against the directory.
fn read_config(dir: &ModelDir, config_name: Option<&str>) -> Result<(ModelConfig, bool), String> {
    let custom = config_name
        .map(|n| dir.path.join("configs").join(format!("{n}.pbtxt")))
        .filter(|p| p.is_file());
    let path = custom.unwrap_or_else(|| dir.path.join("config.pbtxt"));
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

/// The model's instances on this node's GPUs (`repos.gpus`). KIND_AUTO takes the GPUs only when the model's
/// backend can run there (an ONNX Runtime or torch without CUDA runs such a model on CPU, as the
/// log's one line at the first such model says); KIND_GPU always asks for one.
pub(super) fn placements(
    config: &ModelConfig,
    repos: &Repositories,
) -> Result<Vec<placement::InstancePlacement>, String> {
    let gpus = &repos.gpus;
    let auto_on_gpu = !gpus.is_empty()
        && match backend_kind(config)? {
            BackendKind::Onnx => repos.env.loaded() && crate::backend::onnx::cuda_available(),
            BackendKind::Torch => crate::backend::torch::cuda_available(),
            BackendKind::Python | BackendKind::TensorFlow => true,
        };
    placement::place_instances(config, gpus, auto_on_gpu)
}

fn backend_kind(config: &ModelConfig) -> Result<BackendKind, String> {
    match (config.platform.as_str(), config.backend.as_str()) {
        ("" | "onnxruntime_onnx", "" | "onnxruntime") => Ok(BackendKind::Onnx),
        ("", "python") => Ok(BackendKind::Python),
        ("ensemble", _) => Err("an ensemble is planned, not loaded on a backend".into()),
        ("pytorch_libtorch", "" | "pytorch") | ("", "pytorch") => Ok(BackendKind::Torch),
        ("tensorflow_savedmodel" | "tensorflow_graphdef", "" | "tensorflow") => Ok(BackendKind::TensorFlow),
        ("", "tensorflow") => Err(
            "backend 'tensorflow' needs platform \"tensorflow_savedmodel\" or \"tensorflow_graphdef\" to say which format".into(),
        ),
        (p, b) => Err(format!(
            "unsupported platform '{p}' / backend '{b}'; this node serves onnxruntime, pytorch (TorchScript), \
             tensorflow (SavedModel, GraphDef), python and ensemble models"
        )),
    }
}

/// Whether a config describes an ensemble (`platform: "ensemble"`).
pub fn is_ensemble(config: &ModelConfig) -> bool {
    config.platform == "ensemble"
}

/// Plans an ensemble against the models serving now (their configs check its wiring); it starts
/// nothing of its own, and every version shares the plan.
pub fn load_ensemble(
    table: &ModelTable,
    dir: &ModelDir,
    (written, _): (ModelConfig, bool),
    step_key: &dyn Fn(&str) -> String,
) -> Result<LoadedModel, String> {
    validate_config(&written)?;
    // The plan calls each step by its table key (the step's own name unless namespacing serves
    // that name from several repositories); clients keep seeing the config as written.
    let mut planned = written.clone();
    if let Some(SchedulingChoice::EnsembleScheduling(e)) = planned.scheduling_choice.as_mut() {
        for step in &mut e.step {
            step.model_name = step_key(&step.model_name);
        }
    }
    let lookup = |name: &str, version: &str| -> Result<StepModel, String> {
        let m = table.resolve(name, version).map_err(|e| e.message)?;
        Ok(StepModel {
            // A nested ensemble with a decoupled step answers any number of times too.
            decoupled: m.config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled)
                || m.ensemble.as_ref().is_some_and(|plan| plan.decoupled),
            config: (*m.config).clone(),
        })
    };
    let plan = Arc::new(Plan::build(&planned, &lookup)?);
    // A decoupled step makes the ensemble decoupled, which the response cache refuses (Triton's rule).
    if plan.decoupled && written.response_cache.as_ref().is_some_and(|c| c.enable) {
        return Err(format!(
            "Response Cache does not currently support model {} with 'decoupled' transaction policy. Please \
             disable the response cache.",
            written.name
        ));
    }
    if let Some(path) = calls_itself(table, &dir.key, &plan.models()) {
        return Err(format!(
            "the ensemble calls itself ({}); ensembles must form no cycle",
            path.join(" -> ")
        ));
    }
    let config = Arc::new(written.clone());
    let mut labels = mesh::classify::Labels::load(&dir.path, &written).map_err(|e| e.message)?;
    // An output without labels of its own takes those of the step output that makes it.
    if let Some(SchedulingChoice::EnsembleScheduling(e)) = &planned.scheduling_choice {
        for step in &e.step {
            let version = if step.model_version < 0 {
                String::new()
            } else {
                step.model_version.to_string()
            };
            let Ok(m) = table.resolve(&step.model_name, &version) else {
                continue;
            };
            for (theirs, ours) in &step.output_map {
                if written.output.iter().any(|o| &o.name == ours) {
                    labels.adopt(ours, &m.labels, theirs);
                }
            }
        }
    }
    let labels = Arc::new(labels);
    let versions = repository::select_versions(&written, &dir.versions)?
        .into_iter()
        .map(|v| {
            (
                v,
                ModelHandle::ensemble(config.clone(), v, plan.clone(), labels.clone()),
            )
        })
        .collect();
    Ok(LoadedModel {
        versions,
        written,
        config,
    })
}

/// The chain of serving ensembles through which `name`'s steps lead back to `name`, if any (a cycle
/// would recurse without end on the first request).
fn calls_itself(table: &ModelTable, name: &str, steps: &[String]) -> Option<Vec<String>> {
    let mut stack: Vec<Vec<String>> = steps.iter().map(|s| vec![name.to_string(), s.clone()]).collect();
    let mut seen = std::collections::HashSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last()?.clone();
        if last == name {
            return Some(path);
        }
        if seen.insert(last.clone()) {
            for next in table.ensemble_models(&last) {
                let mut longer = path.clone();
                longer.push(next);
                stack.push(longer);
            }
        }
    }
    None
}

/// Reads the config a load uses: the override if given, else config.pbtxt. Returns it with
/// whether it sets max_batch_size itself.
pub fn written_config(
    dir: &ModelDir,
    override_config: Option<ModelConfig>,
    settings: &LoadSettings,
) -> Result<(ModelConfig, bool), String> {
    let (mut config, sets_mbs) = match override_config {
        // A router's rollout: the model's own config, serving the versions the override names.
        Some(c) if c.parameters.contains_key(mesh::config::VERSION_POLICY_ONLY) => {
            let (mut own, sets_mbs) = read_config(dir, settings.config_name.as_deref())?;
            own.version_policy = c.version_policy;
            (own, sets_mbs)
        }
        Some(mut c) => {
            adopt_name(&mut c, &dir.name, "the config override")?;
            (c, true)
        }
        None => read_config(dir, settings.config_name.as_deref())?,
    };
    detect_platform(&mut config, dir);
    Ok((config, sets_mbs))
}

/// A config that names neither platform nor backend gets them from the model file in the latest
/// version directory, as Triton detects them (model.onnx keeps the ONNX default).
fn detect_platform(config: &mut ModelConfig, dir: &ModelDir) {
    if !config.platform.is_empty() || !config.backend.is_empty() || !config.default_model_filename.is_empty() {
        return;
    }
    let Some(latest) = dir.versions.last() else { return };
    let version = dir.path.join(latest.to_string());
    let has = |name: &str| version.join(name).exists();
    if has("model.onnx") {
        return;
    }
    if has("model.savedmodel") {
        config.platform = "tensorflow_savedmodel".into();
    } else if has("model.graphdef") {
        config.platform = "tensorflow_graphdef".into();
    } else if has("model.py") {
        config.backend = "python".into();
    } else if has("model.pt") {
        config.platform = "pytorch_libtorch".into();
    }
}

/// Loads every version the policy selects, each under its own ModelActor linked to `supervisor`;
/// any failure fails the model with a reason.
pub async fn load_model(
    repos: &Repositories,
    dir: &ModelDir,
    (written, sets_mbs): (ModelConfig, bool),
    supervisor: &ActorCell,
) -> Result<LoadedModel, String> {
    let kind = backend_kind(&written)?;
    validate_config(&written)?;
    let versions = repository::select_versions(&written, &dir.versions)?;
    let placements = placements(&written, repos)?;
    let mut files = Vec::with_capacity(versions.len());
    for &v in &versions {
        let file = dir.path.join(v.to_string()).join(repository::model_file_name(&written));
        // A SavedModel is a directory.
        if !(file.is_file() || (kind == BackendKind::TensorFlow && file.is_dir())) {
            return Err(format!("version {v} has no model file {}", file.display()));
        }
        files.push((v, file));
    }
    let (config, prepared) = match kind {
        BackendKind::Onnx | BackendKind::Torch | BackendKind::TensorFlow
            if written.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) =>
        {
            return Err(format!(
                "model_transaction_policy {{ decoupled: true }} needs a backend that can send several \
                 responses per request (python); {} answers each request once",
                if written.backend.is_empty() {
                    &written.platform
                } else {
                    &written.backend
                }
            ));
        }
        BackendKind::Onnx => open_onnx(
            repos.env.env()?,
            written.clone(),
            (sets_mbs, repos.loading.auto_complete),
            &placements,
            files,
        )?,
        BackendKind::Torch => open_all_torch(written.clone(), &placements, files)?,
        BackendKind::Python | BackendKind::TensorFlow => {
            let first = files.first().map(|(_, f)| f.clone()).unwrap_or_default();
            let (file, artifact) = match kind {
                BackendKind::TensorFlow => (python::stub::tensorflow_runner()?, Some(first.as_path())),
                _ => (first.clone(), None),
            };
            let config = if repos.loading.auto_complete {
                tokio::task::block_in_place(|| {
                    python::auto_complete(&repos.python, &written, &dir.path, &file, artifact)
                })?
            } else {
                written.clone()
            };
            validate_config(&config)?;
            let prepared = files
                .into_iter()
                .map(|(v, f)| (v, f, placements.iter().map(|p| (p.clone(), None)).collect()))
                .collect();
            (config, prepared)
        }
    };
    let config = Arc::new(config);
    let mut loaded = BTreeMap::new();
    for (v, file, per_instance) in prepared {
        let source = VersionSource {
            kind,
            env: repos.env.clone(),
            python: repos.python.clone(),
            limiter: repos.limiter.clone(),
            model: dir.name.clone(),
            version: v,
            dir: dir.path.clone(),
            file,
        };
        let handle = crate::actors::model::start(source, config.clone(), per_instance, supervisor.clone()).await?;
        loaded.insert(v, handle);
    }
    // Dropping what was started on failure stops those instances again.
    within_gpu_limits(repos, &dir.name, &placements)?;
    Ok(LoadedModel {
        versions: loaded,
        written,
        config,
    })
}

/// Checks `--model-load-gpu-limit` for each GPU the model's instances run on. A limit that cannot be
/// checked (no NVML) rejects the load, as tritonserver's does when it cannot read the device.
fn within_gpu_limits(
    repos: &Repositories,
    model: &str,
    placements: &[placement::InstancePlacement],
) -> Result<(), String> {
    let used: std::collections::BTreeSet<i32> = placements
        .iter()
        .filter_map(|p| match p.device {
            Device::Gpu(g) => Some(g),
            Device::Cpu => None,
        })
        .collect();
    for gpu in used {
        let Some(&fraction) = repos.loading.gpu_limits.get(&gpu) else {
            continue;
        };
        let uuid = repos
            .gpus
            .iter()
            .position(|&g| g == gpu)
            .and_then(|i| repos.gpu_uuids.get(i))
            .ok_or_else(|| format!("GPU {gpu} has no UUID to check --model-load-gpu-limit with"))?;
        let memory = crate::telemetry::gpu::memory(uuid)
            .map_err(|e| format!("cannot check --model-load-gpu-limit for GPU {gpu}: {e}"))?;
        check_gpu_limit(model, gpu, fraction, memory)?;
    }
    Ok(())
}

/// Each version's files with the instances to start: placement and the backend already open.
type Prepared = Vec<(
    i64,
    PathBuf,
    Vec<(placement::InstancePlacement, Option<Box<dyn Backend>>)>,
)>;

/// Opens every TorchScript instance now, so a bad file, binding or device fails the load with its
/// reason (TorchScript configs are not auto-completed: the file names no outputs).
fn open_all_torch(
    config: ModelConfig,
    placements: &[placement::InstancePlacement],
    files: Vec<(i64, PathBuf)>,
) -> Result<(ModelConfig, Prepared), String> {
    validate_config(&config)?;
    let prepared = open_instances(placements, files, |file, device| open_torch(&config, file, device))?
        .into_iter()
        .map(|(v, file, opened)| (v, file, opened.into_iter().map(|(p, b)| (p, Some(b))).collect()))
        .collect();
    Ok((config, prepared))
}

/// Each version's files with what `open` made for each instance placement, opened off the async
/// runtime (loads block); the first failure names its version and instance.
type Opened<T> = Vec<(i64, PathBuf, Vec<(placement::InstancePlacement, T)>)>;

fn open_instances<T>(
    placements: &[placement::InstancePlacement],
    files: Vec<(i64, PathBuf)>,
    open: impl Fn(&std::path::Path, Device) -> Result<T, String>,
) -> Result<Opened<T>, String> {
    let mut opened = Vec::with_capacity(files.len());
    for (v, file) in files {
        let mut per_instance = Vec::with_capacity(placements.len());
        for p in placements {
            let made = tokio::task::block_in_place(|| open(&file, p.device))
                .map_err(|e| format!("version {v}, instance {}: {e}", p.name))?;
            per_instance.push((p.clone(), made));
        }
        opened.push((v, file, per_instance));
    }
    Ok(opened)
}

/// Opens one ONNX session per instance, auto-completes the config from the first and checks it against all versions.
fn open_onnx(
    env: &Arc<ort::environment::Environment>,
    mut config: ModelConfig,
    (sets_mbs, auto_complete): (bool, bool),
    placements: &[placement::InstancePlacement],
    files: Vec<(i64, PathBuf)>,
) -> Result<(ModelConfig, Prepared), String> {
    let sessions = open_instances(placements, files, |file, device| {
        onnx::open_session(env, &config, file, device)
    })?;
    if let Some((_, first)) = sessions
        .first()
        .and_then(|(_, _, s)| s.first())
        .filter(|_| auto_complete)
    {
        onnx::auto_complete(&mut config, first, sets_mbs)?;
    }
    validate_config(&config)?;
    for (v, _, per_instance) in &sessions {
        if let Some((_, s)) = per_instance.first() {
            onnx::check_against_model(&config, s).map_err(|e| format!("version {v}: {e}"))?;
        }
    }
    let prepared = sessions
        .into_iter()
        .map(|(v, file, per_instance)| {
            let backends = per_instance
                .into_iter()
                .map(|(p, s)| (p, Some(Box::new(OnnxBackend::new(s, &config)) as Box<dyn Backend>)))
                .collect();
            (v, file, backends)
        })
        .collect();
    Ok((config, prepared))
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
#[path = "loader_tests.rs"]
mod tests;
