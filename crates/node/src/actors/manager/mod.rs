//! RepositoryManager: the actor that loads, reloads (in place when only the instances change) and
//! unloads models, one change at a time, and polls the repositories in poll mode.
pub mod loader;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use mesh::config::{config_from_json, config_to_json, validate_config, ModelConfig};
use mesh::{Error, LoadOptions, Result};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::actors::model::ModelHandle;
use crate::actors::table::{ModelEntry, ModelState, ModelTable, Source};
use crate::cli::ControlMode;
use crate::repository::{self, ModelDir};
use loader::Repositories;
use mesh::overrides::write_override_dir;

pub enum ManagerMsg {
    Load(String, LoadOptions, RpcReplyPort<Result<()>>),
    /// Unloads a model; with `unload_dependents`, an ensemble's composing models go too (unless
    /// another ensemble still uses them).
    Unload(String, bool, RpcReplyPort<Result<()>>),
    /// Loads what the control mode asks for at start-up; answers how many models failed.
    LoadAtStart(Vec<String>, RpcReplyPort<usize>),
    Poll,
    /// The manager was restarted (its ModelActors died with it): reload what was serving.
    Recover,
}

/// The current RepositoryManager, replaced when the NodeSupervisor restarts it.
pub type ManagerLink = RwLock<Option<ActorRef<ManagerMsg>>>;

pub struct ManagerArgs {
    pub repos: Arc<Repositories>,
    pub table: Arc<ModelTable>,
    /// Poll mode's period.
    pub poll_every: Option<Duration>,
}

pub struct RepositoryManager;

/// Cheap to clone (shared handles): start-up loads run on clones, several at once.
#[derive(Clone)]
pub struct Manager {
    repos: Arc<Repositories>,
    table: Arc<ModelTable>,
}

/// How deep ensembles may nest when loading their composing models first.
const MAX_ENSEMBLE_DEPTH: usize = 8;

/// Why a model is (re)loaded, which decides what a failure does.
#[derive(Clone, Copy)]
enum Why {
    /// Asked for, or pulled in by an ensemble at this nesting depth: a failed reload keeps the
    /// versions already serving.
    Load(usize),
    /// Planning an ensemble again after a step model changed: a failure replaces the old plan.
    Replan,
}

type Loading<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>>;

impl Manager {
    /// Lists the repositories' models; with `--model-namespacing` each repository is a namespace.
    fn scan(&self) -> (Vec<ModelDir>, Vec<(String, String)>) {
        repository::scan_with(&self.repos.roots, self.table.namespacing())
    }

    /// Loads (or reloads) the model a client names: with namespacing, its copy in every
    /// repository that has it. Overrides need a name found once.
    async fn load(&self, me: &ActorCell, name: &str, options: LoadOptions) -> Result<()> {
        let mut copies: Vec<String> = Vec::new();
        if self.table.namespacing() {
            copies = self
                .scan()
                .0
                .into_iter()
                .filter(|d| d.name == name)
                .map(|d| d.key)
                .collect();
        }
        if copies.len() > 1 && (options.config.is_some() || !options.files.is_empty()) {
            return Err(Error::invalid(format!(
                "failed to load '{name}': it is in {} model repositories (--model-namespacing), and a \
                 config or file override applies to one model",
                copies.len()
            )));
        }
        if copies.is_empty() {
            return self.load_key(me, name, options).await;
        }
        let mut result = Ok(());
        for key in copies {
            let done = self.load_key(me, &key, options.clone()).await;
            result = result.and(done);
        }
        result
    }

    /// Loads (or reloads) the model kept under `key`; new versions replace old ones only once
    /// they are ready.
    async fn load_key(&self, me: &ActorCell, key: &str, options: LoadOptions) -> Result<()> {
        let result = self.load_nested(me, key, options, Why::Load(0)).await;
        self.replan_dependents(me, key).await;
        result
    }

    /// Plans again the ensembles (serving or failed) that call `changed`, after it was loaded,
    /// reloaded or unloaded, so their state and reason stay true: an ensemble whose step model went
    /// away says so, and one whose step model came back serves again. Their steps are not loaded.
    async fn replan_dependents(&self, me: &ActorCell, changed: &str) {
        let (dirs, _) = self.scan();
        let step = repository::name_of_key(changed);
        for dir in dirs {
            // A serving ensemble is planned again from the config it serves (an override stays).
            let served = {
                let models = self.table.read();
                match models.get(&dir.key) {
                    Some(ModelEntry {
                        state: ModelState::Ready(_),
                        source: Some(source),
                        ..
                    }) => Some(Some(source.written.clone())),
                    Some(ModelEntry {
                        state: ModelState::Failed(_),
                        ..
                    }) => Some(None),
                    _ => None,
                }
            };
            let Some(served) = served.filter(|_| dir.key != changed) else {
                continue;
            };
            let written = match served {
                Some(config) => config,
                None => match loader::written_config(&dir, None, &self.repos.loading) {
                    Ok((config, _)) => config,
                    Err(_) => continue,
                },
            };
            if !loader::is_ensemble(&written) || !mesh::ensemble::step_models(&written).iter().any(|m| m == step) {
                continue;
            }
            tracing::info!(model = %dir.key, step = %changed, "a step model changed; planning the ensemble again");
            let options = LoadOptions {
                config: Some(config_to_json(&written).to_string()),
                files: Vec::new(),
            };
            let _ = self.load_nested(me, &dir.key, options, Why::Replan).await;
        }
    }

    /// Loads the models an ensemble's steps call that are not serving yet (explicit mode loads
    /// them with the ensemble, as Triton does); their failures surface in the ensemble's plan.
    async fn load_steps(
        &self,
        me: &ActorCell,
        (dirs, dir): (&[ModelDir], &ModelDir),
        ensemble: &ModelConfig,
        depth: usize,
    ) {
        if depth >= MAX_ENSEMBLE_DEPTH {
            return;
        }
        for step in mesh::ensemble::step_models(ensemble) {
            let key = step_key(dirs, dir, &step);
            if !self.table.is_ready(&key) && dirs.iter().any(|d| d.key == key) {
                let _ = self
                    .load_nested(me, &key, LoadOptions::default(), Why::Load(depth + 1))
                    .await;
            }
        }
    }

    fn load_nested<'a>(&'a self, me: &'a ActorCell, name: &'a str, options: LoadOptions, why: Why) -> Loading<'a> {
        Box::pin(self.load_at(me, name, options, why, None))
    }

    /// Loads a model again after its actor or this manager failed: from the files of its `file:`
    /// overrides when it was loaded with them (kept while it is loaded), else as any load.
    async fn restore(&self, me: &ActorCell, name: &str) -> Result<()> {
        let kept = self.table.kept_files(name);
        let result = self.load_at(me, name, LoadOptions::default(), Why::Load(0), kept).await;
        self.replan_dependents(me, name).await;
        result
    }

    async fn load_at(
        &self,
        me: &ActorCell,
        name: &str,
        options: LoadOptions,
        why: Why,
        kept: Option<(Arc<mesh::overrides::OverrideDir>, ModelConfig)>,
    ) -> Result<()> {
        // `name` is the table key; a namespaced model's directory and config carry its name.
        let (key, name) = (name, repository::name_of_key(name));
        let keyed = |path| ModelDir {
            key: key.to_string(),
            ..ModelDir::at(name, path)
        };
        if let Some((files, written)) = kept {
            let dir = keyed(files.model_dir(name));
            return self.load_dir(me, key, dir, Some(written), Some(files), None, why).await;
        }
        let placed = self.repos.placed.get(key);
        // A placed model keeps the config override it was placed with across reloads.
        let config = options
            .config
            .clone()
            .or_else(|| placed.as_ref().and_then(|p| p.config.clone()));
        let override_config: Option<ModelConfig> = match &config {
            Some(text) => Some(config_from_json(text).map_err(Error::invalid)?),
            None => None,
        };
        if !options.files.is_empty() && override_config.is_none() {
            return Err(Error::invalid("file overrides need a 'config' parameter as well"));
        }
        let (files, dir) = if let Some(placed) = placed.filter(|_| options.files.is_empty()) {
            (None, keyed(placed.path))
        } else if options.files.is_empty() {
            let (dirs, _) = self.scan();
            let dir = dirs.into_iter().find(|d| d.key == key).ok_or_else(|| {
                Error::not_found(format!(
                    "failed to load '{name}': no such model directory in the repositories"
                ))
            })?;
            (None, dir)
        } else {
            let (g, path) = write_override_dir(name, &options.files)?;
            (Some(Arc::new(g)), keyed(path))
        };
        // File overrides may change anything, so they always load afresh.
        let content = files
            .is_none()
            .then(|| repository::fingerprint(&dir.path, repository::Fingerprint::Content));
        self.load_dir(me, key, dir, override_config, files, content, why).await
    }

    /// Loads `dir` (with its config override and kept override files) into the table.
    #[allow(clippy::too_many_arguments)]
    async fn load_dir(
        &self,
        me: &ActorCell,
        name: &str,
        dir: ModelDir,
        override_config: Option<ModelConfig>,
        files: Option<Arc<mesh::overrides::OverrideDir>>,
        content: Option<u64>,
        why: Why,
    ) -> Result<()> {
        let fingerprint = repository::fingerprint(&dir.path, repository::Fingerprint::All);
        let written = loader::written_config(&dir, override_config, &self.repos.loading);
        if let Ok((written, _)) = &written {
            if let Some(done) = self.change_in_place(name, written, content, fingerprint).await {
                return done;
            }
        }
        let loaded = match written {
            Ok(written) if loader::is_ensemble(&written.0) => {
                // One listing serves both: loading step models changes no directory.
                let (dirs, _) = self.scan();
                if let Why::Load(depth) = why {
                    self.load_steps(me, (&dirs, &dir), &written.0, depth).await;
                }
                loader::load_ensemble(&self.table, &dir, written, &|step| step_key(&dirs, &dir, step))
            }
            Ok(written) => {
                let mut tries = 0;
                loop {
                    match loader::load_model(&self.repos, &dir, written.clone(), me).await {
                        Err(e) if tries < self.repos.loading.retries => {
                            tries += 1;
                            tracing::warn!(model = %name, attempt = tries, "load failed, trying again: {e}");
                        }
                        done => break done,
                    }
                }
            }
            Err(e) => Err(e),
        };
        match loaded {
            Ok(loaded) => {
                let shown: Vec<_> = loaded.versions.keys().map(|v| v.to_string()).collect();
                tracing::info!(model = %name, versions = %shown.join(","), "model ready");
                let entry = ModelEntry {
                    state: ModelState::Ready(loaded.versions),
                    fingerprint: Some(fingerprint),
                    source: Some(Source {
                        written: loaded.written,
                        config: loaded.config,
                        content,
                        files,
                    }),
                };
                self.table.set(name, entry);
                Ok(())
            }
            Err(reason) => {
                tracing::error!(model = %name, "failed to load: {reason}");
                if self.table.is_ready(name) && matches!(why, Why::Load(_)) {
                    tracing::warn!(model = %name, "keeping the versions already serving");
                } else {
                    self.table.set(name, ModelEntry::failed(reason.clone()));
                }
                Err(Error::invalid(format!("failed to load '{name}': {reason}")))
            }
        }
    }

    /// When only `instance_group` changed and the model files did not, changes the instances of
    /// every serving version in place: no session reload, statistics kept. None: a full load is needed.
    async fn change_in_place(
        &self,
        name: &str,
        written: &ModelConfig,
        content: Option<u64>,
        fingerprint: u64,
    ) -> Option<Result<()>> {
        let (handles, serving): (Vec<Arc<ModelHandle>>, Arc<ModelConfig>) = {
            let models = self.table.read();
            let entry = models.get(name)?;
            let (ModelState::Ready(versions), Some(source)) = (&entry.state, &entry.source) else {
                return None;
            };
            // The new config may be an edit of config.pbtxt or of the served config (what clients fetch).
            let instances_only = loader::only_instances_differ(&source.written, written)
                || loader::only_instances_differ(&source.config, written);
            if content.is_none() || source.content != content || !instances_only {
                return None;
            }
            (versions.values().cloned().collect(), source.config.clone())
        };
        let mut next = (*serving).clone();
        next.instance_group = written.instance_group.clone();
        let resized = async {
            validate_config(&next)?;
            let placements = loader::placements(&next, &self.repos)?;
            let next = Arc::new(next);
            for h in &handles {
                h.resize(next.clone(), placements.clone()).await?;
            }
            Ok::<_, String>(next)
        }
        .await;
        Some(match resized {
            Ok(next) => {
                self.table.set_config(name, next, written.clone(), fingerprint);
                Ok(())
            }
            Err(reason) => {
                tracing::error!(model = %name, "failed to change instances: {reason}");
                Err(Error::invalid(format!("failed to load '{name}': {reason}")))
            }
        })
    }

    /// Unloads the model a client names: with namespacing, its copy from every repository.
    fn unload_named(&self, name: &str, dependents: bool) -> Result<Vec<String>> {
        let keys = self.table.keys_of(name);
        if keys.is_empty() {
            return Err(Error::not_found(format!("failed to unload '{name}': it is not loaded")));
        }
        for key in &keys {
            self.unload(key, dependents)?;
        }
        Ok(keys)
    }

    /// Unloads a model: new requests are refused at once, in-flight ones finish on the old
    /// instances. With `dependents`, an ensemble's composing models are unloaded too, except
    /// those another serving ensemble still calls.
    fn unload(&self, name: &str, dependents: bool) -> Result<()> {
        if !self.table.names().iter().any(|m| m == name) {
            return Err(Error::not_found(format!("failed to unload '{name}': it is not loaded")));
        }
        let composing = if dependents {
            self.table.ensemble_models(name)
        } else {
            Vec::new()
        };
        self.table.set(name, ModelEntry::unloaded());
        tracing::info!(model = %name, "model unloaded");
        for step in composing {
            let still_used = self
                .table
                .names()
                .iter()
                .any(|other| self.table.ensemble_models(other).contains(&step));
            if !still_used && self.table.is_ready(&step) {
                self.unload(&step, true)?;
            }
        }
        Ok(())
    }

    async fn load_at_start(&self, me: &ActorCell, explicit: &[String]) -> usize {
        let (dirs, errors) = self.scan();
        for (name, reason) in errors {
            tracing::error!(model = %name, "{reason}");
            self.table.set(&name, ModelEntry::failed(reason));
        }
        let wanted = dirs.into_iter().filter(|dir| {
            self.repos.mode != ControlMode::Explicit || explicit.iter().any(|m| m == "*" || *m == dir.name)
        });
        // Models load `--model-load-thread-count` at a time, each in a task of its own (their
        // backends block while they open); ensembles follow one by one, once the models their
        // steps call have loaded.
        let (ensembles, models): (Vec<ModelDir>, Vec<ModelDir>) = wanted.partition(|dir| {
            loader::written_config(dir, None, &self.repos.loading).is_ok_and(|(c, _)| loader::is_ensemble(&c))
        });
        let mut running = tokio::task::JoinSet::new();
        let joined = |done: Option<std::result::Result<(), tokio::task::JoinError>>| {
            if let Some(Err(e)) = done {
                tracing::error!("a model load stopped: {e}");
            }
        };
        for dir in models {
            while running.len() >= self.repos.loading.threads {
                joined(running.join_next().await);
            }
            let (manager, me) = (self.clone(), me.clone());
            running.spawn(async move {
                let _ = manager
                    .load_nested(&me, &dir.key, LoadOptions::default(), Why::Load(0))
                    .await;
            });
        }
        while let Some(done) = running.join_next().await {
            joined(Some(done));
        }
        for dir in ensembles {
            // A nested ensemble may have loaded (or failed to load) this one first.
            if !self.table.read().contains_key(&dir.key) {
                let _ = self
                    .load_nested(me, &dir.key, LoadOptions::default(), Why::Load(0))
                    .await;
            }
        }
        let models = self.table.read();
        models
            .values()
            .filter(|e| matches!(e.state, ModelState::Failed(_)))
            .count()
    }

    /// Poll mode: reloads models whose directory changed, loads new ones, unloads removed ones.
    async fn poll(&self, me: &ActorCell) {
        let (dirs, _) = self.scan();
        for dir in &dirs {
            let known = self.table.read().get(&dir.key).and_then(|e| e.fingerprint);
            let now = repository::fingerprint(&dir.path, repository::Fingerprint::All);
            if known != Some(now) {
                tracing::info!(model = %dir.key, "repository change seen; loading");
                let _ = self.load_key(me, &dir.key, LoadOptions::default()).await;
                // Also after a failure, so the same content is not retried on every poll.
                self.table.set_fingerprint(&dir.key, now);
            }
        }
        for name in self.table.names() {
            let gone =
                !dirs.iter().any(|d| d.key == name) && self.table.is_ready(&name) && !self.repos.placed.contains(&name);
            if gone && self.unload(&name, false).is_ok() {
                self.replan_dependents(me, &name).await;
            }
        }
    }

    /// Reloads every model that was serving from the repository (after a manager restart).
    async fn recover(&self, me: &ActorCell) {
        let serving: Vec<String> = self
            .table
            .names()
            .into_iter()
            .filter(|n| self.table.is_ready(n))
            .collect();
        for name in serving {
            tracing::warn!(model = %name, "reloading after a repository manager restart");
            let _ = self.restore(me, &name).await;
        }
    }

    /// The model whose version is supervised by the actor `id`.
    fn model_of(&self, id: ractor::ActorId) -> Option<String> {
        self.table.read().iter().find_map(|(name, e)| match &e.state {
            ModelState::Ready(v) => v.values().any(|h| h.actor_id() == Some(id)).then(|| name.clone()),
            _ => None,
        })
    }
}

impl Actor for RepositoryManager {
    type Msg = ManagerMsg;
    type State = Manager;
    type Arguments = ManagerArgs;

    async fn pre_start(&self, myself: ActorRef<ManagerMsg>, args: ManagerArgs) -> Result<Manager, ActorProcessingErr> {
        if let Some(every) = args.poll_every {
            myself.send_interval(every.max(Duration::from_millis(100)), || ManagerMsg::Poll);
        }
        Ok(Manager {
            repos: args.repos,
            table: args.table,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ManagerMsg>,
        msg: ManagerMsg,
        state: &mut Manager,
    ) -> Result<(), ActorProcessingErr> {
        let me = myself.get_cell();
        match msg {
            ManagerMsg::Load(name, options, reply) => {
                let _ = reply.send(state.load(&me, &name, options).await);
            }
            ManagerMsg::Unload(name, dependents, reply) => {
                let result = state.unload_named(&name, dependents);
                for key in result.iter().flatten() {
                    state.replan_dependents(&me, key).await;
                }
                let _ = reply.send(result.map(|_| ()));
            }
            ManagerMsg::LoadAtStart(explicit, reply) => {
                let _ = reply.send(state.load_at_start(&me, &explicit).await);
            }
            ManagerMsg::Poll => state.poll(&me).await,
            ManagerMsg::Recover => state.recover(&me).await,
        }
        Ok(())
    }

    /// A ModelActor that died took its instances with it: load the model again.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ManagerMsg>,
        event: SupervisionEvent,
        state: &mut Manager,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            if let Some(name) = state.model_of(cell.get_id()) {
                tracing::error!(model = %name, "model supervisor failed: {err}; reloading the model");
                let _ = state.restore(&myself.get_cell(), &name).await;
            }
        }
        Ok(())
    }
}

/// The table key an ensemble in `ensemble` calls its step `step` by (Triton's resolution with
/// namespacing): the copy in the ensemble's own repository, else the one copy there is, else the
/// name (unknown or ambiguous, which the plan then reports). Without namespacing: the name.
fn step_key(dirs: &[ModelDir], ensemble: &ModelDir, step: &str) -> String {
    let own = ensemble.path.parent().map(|repo| repo.join(step));
    let copies: Vec<&ModelDir> = dirs
        .iter()
        .filter(|d| d.name == step && repository::is_namespaced(&d.key))
        .collect();
    match copies.iter().find(|d| Some(&d.path) == own.as_ref()) {
        Some(mine) => mine.key.clone(),
        None if copies.len() == 1 => copies[0].key.clone(),
        None => step.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn dir(repo: &str, name: &str, namespaced: bool) -> ModelDir {
        let path = Path::new(repo).join(name);
        ModelDir {
            key: if namespaced {
                mesh::repository::namespaced_key(&path)
            } else {
                name.into()
            },
            ..ModelDir::at(name, path)
        }
    }

    #[test]
    fn a_step_calls_its_own_repositorys_copy_then_the_only_one_then_its_name() {
        let dirs = [
            dir("/a", "m", true),
            dir("/b", "m", true),
            dir("/b", "solo", true),
            dir("/c", "m", true),
        ];
        let ens = |repo| dir(repo, "e", true);
        assert_eq!(step_key(&dirs, &ens("/a"), "m"), "/a/m");
        assert_eq!(step_key(&dirs, &ens("/b"), "m"), "/b/m");
        assert_eq!(step_key(&dirs, &ens("/a"), "solo"), "/b/solo");
        // Not in the ensemble's repository and in several others: the name, which is ambiguous.
        assert_eq!(step_key(&dirs, &ens("/d"), "m"), "m");
        assert_eq!(step_key(&dirs, &ens("/a"), "missing"), "missing");
        // Without namespacing, keys are names.
        let plain = [dir("/a", "m", false)];
        assert_eq!(step_key(&plain, &dir("/a", "e", false), "m"), "m");
    }
}
