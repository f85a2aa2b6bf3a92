//! The node's model table: every model's state, read by each request and written only by the RepositoryManager.
use mesh::sync::ReadWrite;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use mesh::config::ModelConfig;
use mesh::{Error, IndexEntry, Result};

use crate::actors::model::{LoadedVersion, ModelHandle};

/// A model as the repository manager knows it.
pub enum ModelState {
    Ready(BTreeMap<i64, Arc<ModelHandle>>),
    Failed(String),
    Unloaded,
}

/// What a ready model was loaded from, to tell an instance-only change from a full reload.
pub struct Source {
    /// The config as written (override or config.pbtxt), before auto-complete.
    pub written: ModelConfig,
    /// The config the versions serve with.
    pub config: Arc<ModelConfig>,
    /// Fingerprint of the version directories (config.pbtxt excluded); None for file overrides.
    pub content: Option<u64>,
    /// The files of a load with `file:` overrides, kept while the model is loaded: a restarted
    /// model actor loads them again from there (the directory goes with the last reference).
    pub files: Option<Arc<mesh::overrides::OverrideDir>>,
}

pub struct ModelEntry {
    pub state: ModelState,
    /// Fingerprint of the whole model directory as last loaded, for poll mode.
    pub fingerprint: Option<u64>,
    pub source: Option<Source>,
}

impl ModelEntry {
    pub fn failed(reason: String) -> Self {
        ModelEntry {
            state: ModelState::Failed(reason),
            fingerprint: None,
            source: None,
        }
    }
}

#[derive(Default)]
pub struct ModelTable {
    models: RwLock<BTreeMap<String, ModelEntry>>,
}

impl ModelTable {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, ModelEntry>> {
        self.models.reading()
    }

    /// Replaces a model's entry; the old versions' supervisors stop, their instances finish in-flight work.
    pub fn set(&self, name: &str, entry: ModelEntry) {
        let old = self.models.writing().insert(name.to_string(), entry);
        drop(old);
    }

    /// Publishes a new serving config after an in-place change.
    pub fn set_config(&self, name: &str, config: Arc<ModelConfig>, written: ModelConfig, fingerprint: u64) {
        let mut models = self.models.writing();
        if let Some(entry) = models.get_mut(name) {
            entry.fingerprint = Some(fingerprint);
            if let Some(s) = entry.source.as_mut() {
                s.config = config;
                s.written = written;
            }
        }
    }

    /// Records the directory fingerprint a load attempt saw.
    pub fn set_fingerprint(&self, name: &str, fingerprint: u64) {
        if let Some(entry) = self.models.writing().get_mut(name) {
            entry.fingerprint = Some(fingerprint);
        }
    }

    /// Drops every model, which stops their instances once in-flight work ends.
    pub fn clear(&self) {
        let old = std::mem::take(&mut *self.models.writing());
        drop(old);
    }

    /// Whether the node has the model at all (in any state).
    pub fn knows(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// A loaded model's kept `file:` override files and the config they were loaded with.
    pub fn kept_files(&self, name: &str) -> Option<(Arc<mesh::overrides::OverrideDir>, ModelConfig)> {
        let models = self.read();
        let source = models.get(name)?.source.as_ref()?;
        Some((source.files.clone()?, source.written.clone()))
    }

    pub fn is_ready(&self, name: &str) -> bool {
        matches!(self.read().get(name).map(|e| &e.state), Some(ModelState::Ready(_)))
    }

    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Finds a ready model version (empty `version`: the highest) and hands it, with all ready
    /// versions, to `f` under one read lock.
    pub fn lookup<R>(
        &self,
        name: &str,
        version: &str,
        f: impl FnOnce(&Arc<ModelHandle>, &BTreeMap<i64, Arc<ModelHandle>>) -> R,
    ) -> Result<R> {
        let models = self.read();
        let versions = match models.get(name).map(|e| &e.state) {
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
    pub fn resolve(&self, name: &str, version: &str) -> Result<Arc<LoadedVersion>> {
        self.lookup(name, version, |m, _| m.snapshot())
    }

    /// Snapshots of the ready versions of one model (or of all models when `name` is empty).
    pub fn ready_snapshots(&self, name: &str) -> Result<Vec<Arc<LoadedVersion>>> {
        let models = self.read();
        let ready = |e: &ModelEntry| match &e.state {
            ModelState::Ready(v) => v.values().map(|h| h.snapshot()).collect::<Vec<_>>(),
            ModelState::Failed(_) | ModelState::Unloaded => Vec::new(),
        };
        if name.is_empty() {
            return Ok(models.values().flat_map(ready).collect());
        }
        let entry = models
            .get(name)
            .ok_or_else(|| Error::not_found(format!("unknown model: '{name}' is not found")))?;
        Ok(ready(entry))
    }

    /// The models a serving ensemble's steps call (empty for anything else).
    pub fn ensemble_models(&self, name: &str) -> Vec<String> {
        match self.read().get(name).map(|e| &e.state) {
            Some(ModelState::Ready(v)) => v
                .values()
                .filter_map(|h| h.snapshot().ensemble.as_ref().map(|p| p.models()))
                .flatten()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether any model failed to load (for strict readiness).
    pub fn any_failed(&self) -> bool {
        self.read().values().any(|e| matches!(e.state, ModelState::Failed(_)))
    }

    /// The repository index: every model directory in `roots` and every model with a state.
    pub fn index(&self, roots: &[PathBuf]) -> Vec<IndexEntry> {
        let (dirs, _) = crate::repository::scan(roots);
        let models = self.read();
        let entry = |name: &str, version: String, state: &str, reason: &str| IndexEntry {
            name: name.to_string(),
            version,
            state: state.into(),
            reason: reason.into(),
            nodes: Vec::new(),
        };
        let mut out: Vec<IndexEntry> = dirs
            .iter()
            .filter(|d| !models.contains_key(&d.name))
            .map(|d| entry(&d.name, String::new(), "", ""))
            .collect();
        for (name, e) in models.iter() {
            match &e.state {
                ModelState::Ready(versions) => {
                    out.extend(versions.keys().map(|v| entry(name, v.to_string(), "READY", "")))
                }
                ModelState::Failed(reason) => out.push(entry(name, String::new(), "UNAVAILABLE", reason)),
                ModelState::Unloaded => out.push(entry(name, String::new(), "UNAVAILABLE", "unloaded")),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.version.cmp(&b.version)));
        out
    }
}
