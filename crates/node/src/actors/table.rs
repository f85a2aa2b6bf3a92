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
        Self::without_source(ModelState::Failed(reason))
    }

    /// An unloaded model: it stays known, so requests for it say it is unloaded.
    pub fn unloaded() -> Self {
        Self::without_source(ModelState::Unloaded)
    }

    fn without_source(state: ModelState) -> Self {
        ModelEntry {
            state,
            fingerprint: None,
            source: None,
        }
    }
}

/// Every model, keyed by name; with `--model-namespacing`, models from the repositories are kept
/// under their directory's path (`mesh::repository::namespaced_key`), so one name may be served
/// from several repositories, and a client's name finds them through `aliases`.
#[derive(Default)]
pub struct ModelTable {
    models: RwLock<BTreeMap<String, ModelEntry>>,
    /// `--model-namespacing`: each repository is a namespace.
    namespacing: bool,
    /// With namespacing, the keys kept under each model name. Locked after `models`.
    aliases: RwLock<BTreeMap<String, Vec<String>>>,
}

impl ModelTable {
    /// An empty table; `namespacing` as `--model-namespacing` says.
    pub fn new(namespacing: bool) -> Self {
        ModelTable {
            namespacing,
            ..Default::default()
        }
    }

    /// Whether each repository is a namespace (`--model-namespacing`).
    pub fn namespacing(&self) -> bool {
        self.namespacing
    }

    /// The entry a client's `name` finds: the model kept under that name, or with namespacing the
    /// one copy of it that is not unloaded. Two or more get Triton's "ambiguity" error.
    fn find<'a>(&self, models: &'a BTreeMap<String, ModelEntry>, name: &str) -> Result<&'a ModelEntry> {
        if let Some(entry) = models.get(name) {
            return Ok(entry);
        }
        let aliases = self.aliases.reading();
        let keys = aliases.get(name).map(Vec::as_slice).unwrap_or_default();
        let live: Vec<&'a ModelEntry> = keys
            .iter()
            .filter_map(|k| models.get(k))
            .filter(|e| !matches!(e.state, ModelState::Unloaded))
            .collect();
        match (live.as_slice(), keys.first()) {
            ([one], _) => Ok(one),
            ([], Some(key)) => models.get(key).ok_or_else(|| unknown(name)),
            ([], None) => Err(unknown(name)),
            (many, _) => Err(Error::invalid(format!(
                "There are {} identifiers of model '{name}' in global map, model namespace must be \
                 provided to resolve ambiguity.",
                many.len()
            ))),
        }
    }

    /// The keys a client's name stands for: the name itself, or every namespaced copy of it.
    pub fn keys_of(&self, name: &str) -> Vec<String> {
        let models = self.read();
        if models.contains_key(name) {
            return vec![name.to_string()];
        }
        self.aliases.reading().get(name).cloned().unwrap_or_default()
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, ModelEntry>> {
        self.models.reading()
    }

    /// Replaces a model's entry; the old versions' supervisors stop, their instances finish in-flight work.
    pub fn set(&self, name: &str, entry: ModelEntry) {
        let mut models = self.models.writing();
        let old = models.insert(name.to_string(), entry);
        if old.is_none() && mesh::repository::is_namespaced(name) {
            let plain = mesh::repository::name_of_key(name).to_string();
            self.aliases.writing().entry(plain).or_default().push(name.to_string());
        }
        drop(models);
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
        let mut models = self.models.writing();
        let old = std::mem::take(&mut *models);
        self.aliases.writing().clear();
        drop(models);
        drop(old);
    }

    /// Whether the node has the model at all (in any state), under its name or namespaced.
    pub fn knows(&self, name: &str) -> bool {
        self.read().contains_key(name) || self.aliases.reading().contains_key(name)
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
        let versions = match &self.find(&models, name)?.state {
            ModelState::Failed(reason) => {
                return Err(Error::unavailable(format!("model '{name}' is not ready: {reason}")))
            }
            ModelState::Unloaded => return Err(Error::unavailable(format!("model '{name}' is unloaded"))),
            ModelState::Ready(v) => v,
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
        let entry = self.find(&models, name)?;
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

    /// The repository index: every model directory in `roots` and every model with a state. A
    /// name served from several repositories is listed once for each, by its name.
    pub fn index(&self, roots: &[PathBuf]) -> Vec<IndexEntry> {
        let (dirs, _) = crate::repository::scan_with(roots, self.namespacing);
        let models = self.read();
        let entry = |name: &str, version: String, state: &str, reason: &str| IndexEntry {
            name: mesh::repository::name_of_key(name).to_string(),
            version,
            state: state.into(),
            reason: reason.into(),
            nodes: Vec::new(),
        };
        let mut out: Vec<IndexEntry> = dirs
            .iter()
            .filter(|d| !models.contains_key(&d.key))
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

fn unknown(name: &str) -> Error {
    Error::not_found(format!("unknown model: '{name}' is not found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_served_from_two_repositories_is_ambiguous_until_one_copy_is_unloaded() {
        let t = ModelTable::new(true);
        t.set("/r1/m", ModelEntry::failed("one".into()));
        t.set("/r2/m", ModelEntry::failed("two".into()));
        t.set("/r1/solo", ModelEntry::failed("solo".into()));
        let err = |name: &str| t.resolve(name, "").err().expect("no model serves");
        let e = err("m");
        assert_eq!(e.code, mesh::Code::InvalidArgument);
        assert!(
            e.message.contains("There are 2 identifiers of model 'm'"),
            "{}",
            e.message
        );
        assert!(e.message.contains("resolve ambiguity"), "{}", e.message);
        // A name found once reaches its copy; a key reaches its own.
        assert!(err("solo").message.contains("solo"));
        assert!(err("/r2/m").message.contains("two"));
        assert_eq!(t.keys_of("m"), vec!["/r1/m".to_string(), "/r2/m".to_string()]);
        assert!(t.knows("m") && !t.knows("other"));
        // With one copy unloaded, the name is the other copy's.
        t.set("/r1/m", ModelEntry::unloaded());
        assert!(err("m").message.contains("two"));
        // Every copy unloaded: the name says so, rather than "unknown".
        t.set("/r2/m", ModelEntry::unloaded());
        assert!(err("m").message.contains("unloaded"));
        assert_eq!(err("nothing").code, mesh::Code::NotFound);
        // The index shows names, not keys.
        let names: Vec<_> = t.index(&[]).into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec!["m", "m", "solo"]);
    }
}
