//! Model management: loading at start, explicit load/unload with config and file overrides, and poll mode.
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mesh::config::{config_from_json, ModelConfig};
use mesh::{Error, LoadOptions, Result};

use crate::cli::ControlMode;
use crate::dispatch::{ModelState, NodeDispatch};
use crate::loader;
use crate::repository::{self, ModelDir};

/// At most this many `file:` overrides in one load request.
const MAX_OVERRIDE_FILES: usize = 64;

/// A temporary model directory built from `file:` overrides, removed when dropped.
struct OverrideDir(PathBuf);

impl Drop for OverrideDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks that an override path stays inside the model directory (no `..`, no absolute paths).
fn safe_relative(path: &str) -> Result<PathBuf> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(Error::invalid(format!(
            "file override path '{path}' must be relative and stay inside the model"
        )));
    }
    Ok(p.to_path_buf())
}

/// Writes `file:` overrides into a fresh directory laid out like a model directory.
fn write_override_dir(name: &str, files: &[(String, bytes::Bytes)]) -> Result<(OverrideDir, ModelDir)> {
    if files.len() > MAX_OVERRIDE_FILES {
        return Err(Error::invalid(format!(
            "at most {MAX_OVERRIDE_FILES} file overrides per load"
        )));
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("mesh-node-{}-override-{n}", std::process::id()));
    let guard = OverrideDir(root.clone());
    let model_dir = root.join(name);
    for (path, bytes) in files {
        let target = model_dir.join(safe_relative(path)?);
        let io = |e: std::io::Error| Error::internal(format!("cannot write file override '{path}': {e}"));
        std::fs::create_dir_all(target.parent().unwrap_or(&model_dir)).map_err(io)?;
        std::fs::write(&target, bytes).map_err(io)?;
    }
    let versions = repository::version_dirs(&model_dir);
    Ok((
        guard,
        ModelDir {
            name: name.to_string(),
            path: model_dir,
            versions,
        },
    ))
}

impl NodeDispatch {
    /// Refuses repository load/unload unless the node runs in explicit mode, as tritonserver does.
    pub(crate) fn check_explicit(&self, what: &str, name: &str) -> Result<()> {
        if self.repos.mode == ControlMode::Explicit {
            return Ok(());
        }
        Err(Error::unsupported(format!(
            "cannot {what} '{name}': explicit model load / unload needs --model-control-mode=explicit"
        )))
    }

    /// Loads (or reloads) one model; new versions replace old ones only once they are ready.
    pub async fn load(&self, name: &str, options: LoadOptions) -> Result<()> {
        let _serial = self.load_lock.lock().await;
        let override_config: Option<ModelConfig> = match &options.config {
            Some(text) => Some(config_from_json(text).map_err(Error::invalid)?),
            None => None,
        };
        if !options.files.is_empty() && override_config.is_none() {
            return Err(Error::invalid("file overrides need a 'config' parameter as well"));
        }
        let (_guard, dir) = if options.files.is_empty() {
            let (dirs, _) = repository::scan(&self.repos.roots);
            let dir = dirs.into_iter().find(|d| d.name == name).ok_or_else(|| {
                Error::not_found(format!(
                    "failed to load '{name}': no such model directory in the repositories"
                ))
            })?;
            (None, dir)
        } else {
            let (g, d) = write_override_dir(name, &options.files)?;
            (Some(g), d)
        };
        let fingerprint = repository::fingerprint(&dir.path);
        match loader::load_model(&self.repos.env, &dir, &self.repos.gpus, override_config).await {
            Ok(versions) => {
                let shown: Vec<_> = versions.keys().map(|v| v.to_string()).collect();
                tracing::info!(model = %name, versions = %shown.join(","), "model ready");
                self.set_model(name.to_string(), ModelState::Ready(versions));
                self.fingerprints
                    .lock()
                    .expect("fingerprints")
                    .insert(name.to_string(), fingerprint);
                Ok(())
            }
            Err(reason) => {
                tracing::error!(model = %name, "failed to load: {reason}");
                if self.ready_versions(name).is_none() {
                    self.set_model(name.to_string(), ModelState::Failed(reason.clone()));
                } else {
                    tracing::warn!(model = %name, "keeping the versions already serving");
                }
                Err(Error::invalid(format!("failed to load '{name}': {reason}")))
            }
        }
    }

    /// Unloads a model: new requests are refused at once, in-flight ones finish on the old instances.
    pub async fn unload(&self, name: &str) -> Result<()> {
        let _serial = self.load_lock.lock().await;
        if !self.known_models().iter().any(|m| m == name) {
            return Err(Error::not_found(format!("failed to unload '{name}': it is not loaded")));
        }
        self.set_model(name.to_string(), ModelState::Unloaded);
        self.fingerprints.lock().expect("fingerprints").remove(name);
        tracing::info!(model = %name, "model unloaded");
        Ok(())
    }

    /// Loads what the control mode asks for at start-up; returns how many models failed.
    pub async fn load_at_start(&self, explicit: &[String]) -> usize {
        let (dirs, errors) = repository::scan(&self.repos.roots);
        let mut failed = 0;
        for (name, reason) in errors {
            tracing::error!(model = %name, "{reason}");
            self.set_model(name, ModelState::Failed(reason));
            failed += 1;
        }
        for dir in dirs {
            let wanted =
                self.repos.mode != ControlMode::Explicit || explicit.iter().any(|m| m == "*" || *m == dir.name);
            if wanted && self.load(&dir.name, LoadOptions::default()).await.is_err() {
                failed += 1;
            }
        }
        failed
    }

    /// Poll mode: reloads models whose directory changed, loads new ones, unloads removed ones.
    pub async fn poll_once(&self) {
        let (dirs, _) = repository::scan(&self.repos.roots);
        for dir in &dirs {
            let known = self.fingerprints.lock().expect("fingerprints").get(&dir.name).copied();
            let now = repository::fingerprint(&dir.path);
            if known != Some(now) {
                tracing::info!(model = %dir.name, "repository change seen; loading");
                let _ = self.load(&dir.name, LoadOptions::default()).await;
                self.fingerprints
                    .lock()
                    .expect("fingerprints")
                    .insert(dir.name.clone(), now);
            }
        }
        for name in self.known_models() {
            if !dirs.iter().any(|d| d.name == name) && self.ready_versions(&name).is_some() {
                let _ = self.unload(&name).await;
            }
        }
    }

    /// Runs `poll_once` every `every` until the process ends.
    pub fn spawn_poller(self: Arc<Self>, every: Duration) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
            tick.tick().await;
            loop {
                tick.tick().await;
                self.poll_once().await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_paths_must_stay_inside_the_model() {
        assert!(safe_relative("1/model.onnx").is_ok());
        for bad in ["../x", "/etc/passwd", "1/../../x", "", "./a"] {
            assert!(safe_relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn override_dir_is_laid_out_and_removed() {
        let files = vec![("1/model.onnx".to_string(), bytes::Bytes::from_static(b"x"))];
        let (guard, dir) = write_override_dir("m", &files).unwrap();
        assert_eq!(dir.versions, vec![1]);
        assert!(dir.path.join("1/model.onnx").is_file());
        let root = guard.0.clone();
        drop(guard);
        assert!(!root.exists());
    }
}
