//! The node's Dispatch: finds the model version, checks the request, runs it on the instance, records metrics.
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use async_trait::async_trait;
use mesh::proto::ModelStatisticsResponse;
use mesh::validate::check_request;
use mesh::{Dispatch, Error, IndexEntry, InferRequest, InferResponse, LoadOptions, ModelView, Result};

use crate::cli::ControlMode;

use crate::instance::{self, Submission};
use crate::loader::LoadedVersion;

/// Counts a request as pending while it runs; if its future is dropped first (the client went
/// away), records it as a CANCELED failure so the gauge and statistics stay true.
struct InFlight<'a> {
    model: &'a LoadedVersion,
    start: Instant,
    finished: bool,
}

impl InFlight<'_> {
    fn begin(model: &LoadedVersion) {
        model.stats.metrics.pending.increment(1.0);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.model.stats.metrics.pending.decrement(1.0);
        if !self.finished {
            self.model.stats.failure("CANCELED", self.start.elapsed());
        }
    }
}

/// Reads Triton's `priority` and `timeout` (µs) request parameters.
fn scheduling_params(request: &InferRequest) -> Result<(u32, Option<std::time::Duration>)> {
    let mut priority = 0;
    let mut timeout = None;
    for (key, value) in &request.parameters {
        match key.as_str() {
            "priority" => {
                priority = value.as_u64().and_then(|p| u32::try_from(p).ok()).ok_or_else(|| {
                    Error::invalid(format!(
                        "parameter 'priority' must be a small non-negative integer, got {value:?}"
                    ))
                })?;
            }
            "timeout" => {
                let us = value.as_u64().ok_or_else(|| {
                    Error::invalid(format!(
                        "parameter 'timeout' must be a non-negative integer (µs), got {value:?}"
                    ))
                })?;
                timeout = (us > 0).then(|| std::time::Duration::from_micros(us));
            }
            _ => {}
        }
    }
    Ok((priority, timeout))
}

/// A model as the repository manager knows it.
pub enum ModelState {
    Ready(BTreeMap<i64, Arc<LoadedVersion>>),
    Failed(String),
    Unloaded,
}

/// What the node needs to (re)load models after start-up.
pub struct Repositories {
    pub env: Arc<ort::environment::Environment>,
    pub roots: Vec<PathBuf>,
    pub gpus: Vec<i32>,
    pub mode: ControlMode,
}

/// Serves the models loaded on this node.
pub struct NodeDispatch {
    models: RwLock<BTreeMap<String, ModelState>>,
    strict_readiness: bool,
    pub(crate) repos: Repositories,
    /// Serializes loads and unloads, so concurrent repository calls cannot interleave.
    pub(crate) load_lock: tokio::sync::Mutex<()>,
    /// Fingerprints of model directories as last loaded, for poll mode.
    pub(crate) fingerprints: Mutex<HashMap<String, u64>>,
}

impl NodeDispatch {
    pub fn new(strict_readiness: bool, repos: Repositories) -> Self {
        NodeDispatch {
            models: RwLock::new(BTreeMap::new()),
            strict_readiness,
            repos,
            load_lock: tokio::sync::Mutex::new(()),
            fingerprints: Mutex::new(HashMap::new()),
        }
    }

    /// The ready versions of a model, if it has any.
    pub(crate) fn ready_versions(&self, name: &str) -> Option<BTreeMap<i64, Arc<LoadedVersion>>> {
        match self.models.read().expect("models lock").get(name) {
            Some(ModelState::Ready(v)) => Some(v.clone()),
            _ => None,
        }
    }

    /// Names of every model this node has a state for.
    pub(crate) fn known_models(&self) -> Vec<String> {
        self.models.read().expect("models lock").keys().cloned().collect()
    }

    pub fn set_model(&self, name: String, state: ModelState) {
        self.models.write().expect("models lock").insert(name, state);
    }

    /// Drops every model, which stops their instance threads once in-flight work ends.
    pub fn clear(&self) {
        self.models.write().expect("models lock").clear();
    }

    /// Finds a ready model version (empty `version`: the highest) and hands it, with all ready
    /// versions, to `f` under one read lock.
    fn lookup<R>(
        &self,
        name: &str,
        version: &str,
        f: impl FnOnce(&Arc<LoadedVersion>, &BTreeMap<i64, Arc<LoadedVersion>>) -> R,
    ) -> Result<R> {
        let models = self.models.read().expect("models lock");
        let versions = match models.get(name) {
            None => return Err(Error::not_found(format!("unknown model: '{name}' is not found"))),
            Some(ModelState::Failed(reason)) => {
                return Err(Error::unavailable(format!("model '{name}' is not ready: {reason}")))
            }
            Some(ModelState::Unloaded) => return Err(Error::unavailable(format!("model '{name}' is unloaded"))),
            Some(ModelState::Ready(v)) => v,
        };
        let chosen = if version.is_empty() {
            versions.values().next_back()
        } else {
            let v: i64 = version
                .parse()
                .map_err(|_| Error::invalid(format!("model version '{version}' is not a number")))?;
            versions.get(&v)
        };
        let chosen =
            chosen.ok_or_else(|| Error::not_found(format!("version {version} of model '{name}' is not available")))?;
        Ok(f(chosen, versions))
    }

    /// The model version a request names; the hot path needs nothing else.
    fn resolve(&self, name: &str, version: &str) -> Result<Arc<LoadedVersion>> {
        self.lookup(name, version, |m, _| m.clone())
    }
}

#[async_trait]
impl Dispatch for NodeDispatch {
    async fn infer(&self, mut request: InferRequest) -> Result<InferResponse> {
        let start = Instant::now();
        let model = self.resolve(&request.model_name, &request.model_version)?;
        if let Err(e) = check_request(&model.config, &request) {
            model.stats.failure(e.metric_reason(), start.elapsed());
            return Err(e);
        }
        let rows = if model.config.max_batch_size > 0 {
            request
                .inputs
                .first()
                .and_then(|i| i.tensor.shape.first())
                .copied()
                .unwrap_or(1)
                .max(1) as usize
        } else {
            1
        };
        let (priority, timeout) = scheduling_params(&request)?;
        let submission = Submission {
            inputs: std::mem::take(&mut request.inputs),
            outputs: request.outputs.iter().map(|o| o.name.clone()).collect(),
            rows,
            priority,
            timeout,
        };
        let instance = instance::pick(&model.instances, &model.rotation)
            .ok_or_else(|| Error::unavailable(format!("model '{}' has no instances", request.model_name)))?;
        InFlight::begin(&model);
        let mut guard = InFlight {
            model: &model,
            start,
            finished: false,
        };
        let result = instance.execute(submission).await;
        guard.finished = true;
        drop(guard);
        match result {
            Ok(done) => {
                let execution = done.counts_execution.then_some(done.batch_rows as u64);
                model
                    .stats
                    .success(rows as u64, start.elapsed(), done.queued, &done.timings, execution);
                Ok(InferResponse {
                    model_name: request.model_name,
                    model_version: model.version_label.clone(),
                    id: request.id,
                    outputs: done.outputs,
                    parameters: Vec::new(),
                })
            }
            Err(e) => {
                model.stats.failure(e.metric_reason(), start.elapsed());
                Err(e)
            }
        }
    }

    fn ready(&self) -> bool {
        !self.strict_readiness
            || self
                .models
                .read()
                .expect("models lock")
                .values()
                .all(|m| !matches!(m, ModelState::Failed(_)))
    }

    fn model(&self, name: &str, version: &str) -> Result<ModelView> {
        let (m, ready_versions) = self.lookup(name, version, |m, all| (m.clone(), all.keys().copied().collect()))?;
        let ready = m.instances.iter().any(|i| i.is_ready());
        Ok(ModelView {
            config: m.config.clone(),
            version: m.version,
            ready_versions,
            ready,
        })
    }

    fn model_statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        let models = self.models.read().expect("models lock");
        let ready = |state: &ModelState| match state {
            ModelState::Ready(v) => v.values().cloned().collect::<Vec<_>>(),
            ModelState::Failed(_) | ModelState::Unloaded => Vec::new(),
        };
        let chosen: Vec<Arc<LoadedVersion>> = if name.is_empty() {
            models.values().flat_map(ready).collect()
        } else if version.is_empty() {
            let state = models
                .get(name)
                .ok_or_else(|| Error::not_found(format!("unknown model: '{name}' is not found")))?;
            ready(state)
        } else {
            drop(models);
            vec![self.resolve(name, version)?]
        };
        Ok(ModelStatisticsResponse {
            model_stats: chosen.iter().map(|m| m.stats.snapshot()).collect(),
        })
    }

    async fn load_model(&self, name: &str, options: LoadOptions) -> Result<()> {
        self.check_explicit("load", name)?;
        self.load(name, options).await
    }

    async fn unload_model(&self, name: &str, _unload_dependents: bool) -> Result<()> {
        self.check_explicit("unload", name)?;
        self.unload(name).await
    }

    fn extensions(&self) -> Vec<&'static str> {
        let mut e = vec![
            "binary_tensor_data",
            "model_configuration",
            "parameters",
            "statistics",
            "schedule_policy",
        ];
        if self.repos.mode == ControlMode::Explicit {
            e.push("model_repository");
        }
        e
    }

    fn repository_index(&self) -> Vec<IndexEntry> {
        let (dirs, _) = crate::repository::scan(&self.repos.roots);
        let models = self.models.read().expect("models lock");
        let mut out: Vec<IndexEntry> = dirs
            .iter()
            .filter(|d| !models.contains_key(&d.name))
            .map(|d| IndexEntry {
                name: d.name.clone(),
                version: String::new(),
                state: String::new(),
                reason: String::new(),
            })
            .collect();
        for (name, state) in models.iter() {
            match state {
                ModelState::Ready(versions) => out.extend(versions.keys().map(|v| IndexEntry {
                    name: name.clone(),
                    version: v.to_string(),
                    state: "READY".into(),
                    reason: String::new(),
                })),
                ModelState::Failed(reason) => out.push(IndexEntry {
                    name: name.clone(),
                    version: String::new(),
                    state: "UNAVAILABLE".into(),
                    reason: reason.clone(),
                }),
                ModelState::Unloaded => out.push(IndexEntry {
                    name: name.clone(),
                    version: String::new(),
                    state: "UNAVAILABLE".into(),
                    reason: "unloaded".into(),
                }),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.version.cmp(&b.version)));
        out
    }
}
