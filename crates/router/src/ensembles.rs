//! The router's own ensembles (`--model-repository`): planned with the shared planner against the
//! configs of the models the cluster serves, planned again when membership changes, and run step
//! by step through the router, so each step goes wherever its model is served.
use mesh::sync::Locked;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh::config::{parse_pbtxt, validate_config, ModelConfig};
use mesh::ensemble::{Plan, StepModel};
use mesh::proto::{InferStatistics, ModelStatistics, StatisticDuration};
use mesh::{Error, ModelView, Result};

/// One ensemble of the router's repository.
pub struct Ensemble {
    pub config: Arc<ModelConfig>,
    pub version: i64,
    /// Its outputs' class labels (`label_filename`), for the classification extension.
    pub labels: mesh::classify::Labels,
    stats: EnsembleStats,
}

/// What the router counts for an ensemble it runs (its steps are counted by the nodes).
#[derive(Default)]
struct EnsembleStats {
    success: (AtomicU64, AtomicU64),
    fail: (AtomicU64, AtomicU64),
    last_ms: AtomicU64,
}

/// A plan, or why the ensemble cannot be planned against the cluster now.
pub type Planned = std::result::Result<Arc<Plan>, String>;

/// The ensembles and their plans as of a routing generation.
pub struct Ensembles {
    models: BTreeMap<String, Ensemble>,
    plans: Mutex<(u64, BTreeMap<String, Planned>)>,
}

fn version_of(dir: &Path) -> i64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .max()
        .unwrap_or(1)
}

/// Reads one model directory's config if it is an ensemble.
fn read_ensemble(dir: &Path) -> std::result::Result<Option<ModelConfig>, String> {
    let path = dir.join("config.pbtxt");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut config = parse_pbtxt(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if config.platform != "ensemble" {
        return Ok(None);
    }
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    if config.name.is_empty() {
        config.name = name.clone();
    } else if config.name != name {
        return Err(format!(
            "{}: the config names '{}' but its directory is '{name}'",
            path.display(),
            config.name
        ));
    }
    validate_config(&config).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(config))
}

impl Ensembles {
    /// Reads every ensemble of the repositories; other models are left to the nodes.
    pub fn load(roots: &[PathBuf]) -> std::result::Result<Ensembles, String> {
        let mut models = BTreeMap::new();
        for root in roots {
            let entries =
                std::fs::read_dir(root).map_err(|e| format!("cannot read repository {}: {e}", root.display()))?;
            let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
            dirs.sort();
            for dir in dirs {
                // Other models are placed on nodes (see `placement_actor`).
                if let Some(config) = read_ensemble(&dir)? {
                    tracing::info!(ensemble = %config.name, "router ensemble found");
                    let version = version_of(&dir);
                    let labels = mesh::classify::Labels::load(&dir, &config)
                        .map_err(|e| format!("{}: {}", dir.display(), e.message))?;
                    models.insert(
                        config.name.clone(),
                        Ensemble {
                            config: Arc::new(config),
                            version,
                            labels,
                            stats: Default::default(),
                        },
                    );
                }
            }
        }
        Ok(Ensembles {
            models,
            plans: Mutex::new((u64::MAX, BTreeMap::new())),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Ensemble> {
        self.models.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.models.keys()
    }

    /// The ensemble's plan against the cluster of generation `generation`; `view` gives each step
    /// model's config as the cluster serves it.
    pub fn plan(&self, name: &str, generation: u64, view: &dyn Fn(&str, &str) -> Result<ModelView>) -> Option<Planned> {
        let ensemble = self.models.get(name)?;
        let mut plans = self.plans.locked();
        if plans.0 != generation {
            plans.1.clear();
            plans.0 = generation;
        }
        let plan = plans.1.entry(name.to_string()).or_insert_with(|| {
            let lookup = |model: &str, version: &str| -> std::result::Result<StepModel, String> {
                if self.models.contains_key(model) {
                    return Err(format!(
                        "step model '{model}' is another router ensemble; nest them on a node"
                    ));
                }
                let v = view(model, version).map_err(|e| e.message)?;
                let decoupled = v.config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled);
                Ok(StepModel {
                    config: (*v.config).clone(),
                    decoupled,
                })
            };
            Plan::build(&ensemble.config, &lookup).map(Arc::new)
        });
        Some(plan.clone())
    }

    /// The ensemble's view; `ready` when it plans against the cluster and its steps can run.
    pub fn view(&self, ensemble: &Ensemble, ready: bool, version: &str) -> Result<ModelView> {
        if !version.is_empty() && version != ensemble.version.to_string() {
            return Err(Error::not_found(format!(
                "ensemble '{}' has no version {version}",
                ensemble.config.name
            )));
        }
        Ok(ModelView {
            config: ensemble.config.clone(),
            version: ensemble.version,
            ready_versions: if ready { vec![ensemble.version] } else { vec![] },
            ready,
        })
    }

    /// Records one run of an ensemble.
    pub fn record(&self, name: &str, ok: bool, took: Duration) {
        let Some(e) = self.models.get(name) else { return };
        let (count, ns) = if ok { &e.stats.success } else { &e.stats.fail };
        count.fetch_add(1, Ordering::Relaxed);
        ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        e.stats.last_ms.store(now, Ordering::Relaxed);
    }

    /// The statistics the router keeps for an ensemble.
    pub fn statistics(&self, ensemble: &Ensemble) -> ModelStatistics {
        let d = |(c, n): &(AtomicU64, AtomicU64)| {
            Some(StatisticDuration {
                count: c.load(Ordering::Relaxed),
                ns: n.load(Ordering::Relaxed),
            })
        };
        let success = ensemble.stats.success.0.load(Ordering::Relaxed);
        ModelStatistics {
            name: ensemble.config.name.clone(),
            version: ensemble.version.to_string(),
            last_inference: ensemble.stats.last_ms.load(Ordering::Relaxed),
            inference_count: success,
            execution_count: success,
            inference_stats: Some(InferStatistics {
                success: d(&ensemble.stats.success),
                fail: d(&ensemble.stats.fail),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
