//! The cluster repository (`mesh-router --model-repository`): the models the router places on
//! nodes, each with its files' manifest (the content key nodes cache by), its footprint and what
//! its config asks of placement (`mesh.min_replicas`, `mesh.max_replicas`, `KIND_GPU`).
use mesh::sync::ReadWrite;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use mesh::cluster::ship::{self, Manifest};
use mesh::config::{parse_pbtxt, ModelConfig};
use mesh::overrides::OverrideDir;
use mesh::proto::model_instance_group::Kind;

/// One model of the cluster repository, ready to ship.
#[derive(Debug)]
pub struct RepoModel {
    pub name: String,
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// A config override from a repository `load` (Triton's JSON), empty for none.
    pub config_override: String,
    /// Its config as read here (the override, else config.pbtxt, else empty): what a finished
    /// rollout's version policy is judged against.
    pub config: ModelConfig,
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub needs_gpu: bool,
    /// Estimated bytes per replica: its files times its instances.
    pub footprint: u64,
    /// The directory's stat fingerprint when the manifest was made.
    pub stat: u64,
    /// The temporary directory of `file:` overrides, removed with the model.
    pub override_files: Option<OverrideDir>,
}

/// What a model's config says about placement.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wants {
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub needs_gpu: bool,
    pub instances: u64,
    pub ensemble: bool,
}

/// Reads placement parameters from a config: `parameters { key: "mesh.min_replicas" value: {
/// string_value: "2" } }`, `mesh.max_replicas`, and whether an instance group is KIND_GPU.
pub fn wants(config: &ModelConfig) -> Result<Wants, String> {
    let bound = |key: &str| -> Result<Option<u32>, String> {
        match config.parameters.get(key) {
            None => Ok(None),
            Some(p) => p.string_value.trim().parse::<u32>().map(Some).map_err(|_| {
                format!(
                    "parameter {key} is '{}'; it must be a whole number of replicas",
                    p.string_value
                )
            }),
        }
    };
    let (min, max) = (bound("mesh.min_replicas")?, bound("mesh.max_replicas")?);
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return Err(format!(
                "mesh.min_replicas ({lo}) is more than mesh.max_replicas ({hi})"
            ));
        }
    }
    if max == Some(0) {
        return Err("mesh.max_replicas must be at least 1".into());
    }
    let groups = &config.instance_group;
    Ok(Wants {
        min,
        max,
        needs_gpu: groups.iter().any(|g| g.kind == Kind::Gpu as i32),
        instances: mesh::config::instance_count(config),
        ensemble: config.platform == "ensemble",
    })
}

/// The config a model directory is placed with: the override, else config.pbtxt, else none
/// (the node auto-completes it).
fn read_config(dir: &Path, config_override: &str) -> Result<ModelConfig, String> {
    if !config_override.is_empty() {
        return mesh::config::config_from_json(config_override);
    }
    match std::fs::read_to_string(dir.join("config.pbtxt")) {
        Ok(text) => parse_pbtxt(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(format!("cannot read config.pbtxt: {e}")),
    }
}

/// Reads one model directory into a shippable model (this hashes every file: call it off the
/// async threads). `previous` is reused when the directory did not change.
pub fn read_model(
    name: &str,
    dir: &Path,
    config_override: String,
    files: Option<OverrideDir>,
    previous: Option<&Arc<RepoModel>>,
) -> Result<Arc<RepoModel>, String> {
    let stat = mesh::repository::fingerprint(dir, mesh::repository::Fingerprint::All);
    if let Some(p) = previous.filter(|p| p.stat == stat && p.dir == dir && p.config_override == config_override) {
        return Ok(p.clone());
    }
    let config = read_config(dir, &config_override)?;
    if !config.name.is_empty() && config.name != name {
        return Err(format!(
            "config names the model '{}', but its directory is '{name}'; they must match",
            config.name
        ));
    }
    let wants = wants(&config)?;
    if wants.ensemble {
        return Err("an ensemble is run by the router, not placed".into());
    }
    let manifest = ship::manifest(name, dir)?;
    Ok(Arc::new(RepoModel {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        footprint: manifest.total().saturating_mul(wants.instances),
        manifest,
        config_override,
        config,
        min: wants.min,
        max: wants.max,
        needs_gpu: wants.needs_gpu,
        stat,
        override_files: files,
    }))
}

/// The model directories of the repositories (non-ensembles, by name), and the names found in two
/// repositories with why (`mesh::repository::scan`).
pub fn scan(roots: &[PathBuf]) -> (BTreeMap<String, PathBuf>, BTreeMap<String, String>) {
    let (dirs, errors) = mesh::repository::scan(roots);
    let is_ensemble = |dir: &Path| {
        std::fs::read_to_string(dir.join("config.pbtxt"))
            .ok()
            .and_then(|t| parse_pbtxt(&t).ok())
            .is_some_and(|c| c.platform == "ensemble")
    };
    let dirs = dirs
        .into_iter()
        .filter(|d| !is_ensemble(&d.path))
        .map(|d| (d.name, d.path))
        .collect();
    (dirs, errors.into_iter().collect())
}

/// The models the router currently places, by name and by content key.
#[derive(Debug, Default)]
pub struct ClusterRepo {
    pub roots: Vec<PathBuf>,
    models: RwLock<BTreeMap<String, Arc<RepoModel>>>,
}

impl ClusterRepo {
    pub fn new(roots: Vec<PathBuf>) -> Self {
        ClusterRepo {
            roots,
            models: RwLock::default(),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<RepoModel>> {
        self.models.reading().get(name).cloned()
    }

    /// The model whose current manifest has this key (what a node's fetch asks for).
    pub fn by_key(&self, name: &str, key: &str) -> Option<Arc<RepoModel>> {
        self.get(name).filter(|m| m.manifest.key == key)
    }

    pub fn set(&self, model: Arc<RepoModel>) {
        self.models.writing().insert(model.name.clone(), model);
    }

    pub fn remove(&self, name: &str) -> Option<Arc<RepoModel>> {
        self.models.writing().remove(name)
    }

    pub fn all(&self) -> Vec<Arc<RepoModel>> {
        self.models.reading().values().cloned().collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.models.reading().contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(root: &Path, name: &str, config: &str) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
        std::fs::write(dir.join("1/model.onnx"), vec![1u8; 1000]).unwrap();
        dir
    }

    #[test]
    fn placement_wants_come_from_config_parameters() {
        let root = tempfile::tempdir().unwrap();
        let dir = model(
            root.path(),
            "m",
            r#"name: "m" instance_group [{ count: 3 kind: KIND_GPU }]
               parameters { key: "mesh.min_replicas" value: { string_value: "1" } }
               parameters { key: "mesh.max_replicas" value: { string_value: "5" } }"#,
        );
        let m = read_model("m", &dir, String::new(), None, None).unwrap();
        assert_eq!((m.min, m.max, m.needs_gpu), (Some(1), Some(5), true));
        let bytes = m.manifest.total();
        assert_eq!(m.footprint, bytes * 3, "files times instances");
        // Unchanged: the same model comes back without hashing again.
        assert!(Arc::ptr_eq(
            &read_model("m", &dir, String::new(), None, Some(&m)).unwrap(),
            &m
        ));
    }

    #[test]
    fn bad_placement_parameters_and_names_are_clear_errors() {
        let root = tempfile::tempdir().unwrap();
        let bad = |config: &str| {
            let dir = model(root.path(), "m", config);
            read_model("m", &dir, String::new(), None, None).unwrap_err()
        };
        assert!(
            bad(r#"parameters { key: "mesh.min_replicas" value: { string_value: "two" } }"#).contains("whole number")
        );
        assert!(
            bad(r#"parameters { key: "mesh.min_replicas" value: { string_value: "3" } }
               parameters { key: "mesh.max_replicas" value: { string_value: "2" } }"#)
            .contains("more than mesh.max_replicas")
        );
        assert!(bad(r#"name: "other""#).contains("must match"));
        assert!(bad(r#"platform: "ensemble""#).contains("run by the router"));
    }

    #[test]
    fn scan_skips_ensembles_and_flags_duplicates() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        model(a.path(), "plain", "");
        model(a.path(), "ens", r#"platform: "ensemble""#);
        model(a.path(), "dup", "");
        model(b.path(), "dup", "");
        let (dirs, errors) = scan(&[a.path().to_path_buf(), b.path().to_path_buf()]);
        assert_eq!(dirs.keys().collect::<Vec<_>>(), ["plain"]);
        assert!(errors["dup"].contains("more than one repository"));
    }
}
