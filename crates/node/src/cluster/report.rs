//! What a node tells its routers about its models, without IO: the served versions (for the hello),
//! the changes since the last look (model events), and each version's load (load reports).
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mesh::cluster::msg::{LoadReport, ModelEvent, ModelLoad, ModelStatus};
use mesh::config::ModelConfig;

use crate::actors::model::LoadedVersion;
use crate::actors::table::{ModelState, ModelTable};
use crate::repository::placed::PlacedModels;

/// One served model version as routers see it.
#[derive(Clone)]
pub struct Served {
    pub ready: bool,
    /// The cluster's router placed the model here.
    pub placed: bool,
    pub reason: String,
    pub config: Arc<ModelConfig>,
}

impl PartialEq for Served {
    fn eq(&self, other: &Self) -> bool {
        self.ready == other.ready
            && self.placed == other.placed
            && self.reason == other.reason
            && (Arc::ptr_eq(&self.config, &other.config) || self.config == other.config)
    }
}

/// Every served model version, by (name, version).
pub type Snapshot = BTreeMap<(String, i64), Served>;

/// The versions the table serves now (failed and unloaded models serve none).
pub fn versions(table: &ModelTable) -> Vec<Arc<LoadedVersion>> {
    table
        .read()
        .values()
        .flat_map(|e| match &e.state {
            ModelState::Ready(v) => v.values().map(|h| h.snapshot()).collect(),
            ModelState::Failed(_) | ModelState::Unloaded => Vec::new(),
        })
        .collect()
}

pub fn snapshot(versions: &[Arc<LoadedVersion>], placed: &PlacedModels) -> Snapshot {
    versions
        .iter()
        .map(|v| {
            let ready = v.is_ready();
            let served = Served {
                ready,
                placed: placed.contains(&v.config.name),
                reason: if ready {
                    String::new()
                } else {
                    "no ready instance".into()
                },
                config: v.config.clone(),
            };
            ((v.config.name.clone(), v.version), served)
        })
        .collect()
}

fn status(name: &str, version: i64, s: &Served) -> ModelStatus {
    ModelStatus {
        name: name.to_string(),
        version,
        ready: s.ready,
        reason: s.reason.clone(),
        config: prost::Message::encode_to_vec(&*s.config),
        placed: s.placed,
    }
}

/// The model list of a hello.
pub fn hello_models(snapshot: &Snapshot) -> Vec<ModelStatus> {
    snapshot.iter().map(|((n, v), s)| status(n, *v, s)).collect()
}

/// The events that turn `old` into `new`: updates for new or changed versions, removals for gone ones.
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<ModelEvent> {
    let mut events = Vec::new();
    for ((name, version), s) in new {
        if old.get(&(name.clone(), *version)) != Some(s) {
            events.push(ModelEvent::Update(status(name, *version, s)));
        }
    }
    for (name, version) in old.keys() {
        if !new.contains_key(&(name.clone(), *version)) {
            events.push(ModelEvent::Removed {
                name: name.clone(),
                version: *version,
            });
        }
    }
    events
}

/// Turns cumulative statistics into recent execution times between two reports.
#[derive(Default)]
pub struct LoadTracker {
    last: HashMap<(String, i64), (u64, u64)>,
}

impl LoadTracker {
    /// Each version's requests in flight and queued (outstanding beyond one per instance), and its
    /// mean execution time since the previous report (or the last known one when nothing ran).
    pub fn report(&mut self, versions: &[Arc<LoadedVersion>]) -> LoadReport {
        let mut models = Vec::with_capacity(versions.len());
        for v in versions {
            let outstanding: Vec<usize> = v.instances.iter().map(|i| i.outstanding()).collect();
            let inflight: usize = outstanding.iter().sum();
            let queued: usize = outstanding.iter().map(|n| n.saturating_sub(1)).sum();
            let infer = v
                .stats
                .snapshot()
                .inference_stats
                .and_then(|s| s.compute_infer)
                .unwrap_or_default();
            let key = (v.config.name.clone(), v.version);
            let (count, ns) = (infer.count, infer.ns);
            let exec_us = match self.last.insert(key, (count, ns)) {
                Some((c0, n0)) if count > c0 => (ns.saturating_sub(n0) / (count - c0)) / 1000,
                _ if count > 0 => ns / count / 1000,
                _ => 0,
            };
            models.push(ModelLoad {
                name: v.config.name.clone(),
                version: v.version,
                inflight: inflight.min(u32::MAX as usize) as u32,
                queued: queued.min(u32::MAX as usize) as u32,
                exec_us,
            });
        }
        LoadReport { models }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(ready: bool, max_batch: i32) -> Served {
        Served {
            ready,
            placed: false,
            reason: if ready {
                String::new()
            } else {
                "no ready instance".into()
            },
            config: Arc::new(ModelConfig {
                name: "m".into(),
                max_batch_size: max_batch,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn diff_reports_new_changed_and_removed_versions_only() {
        let mut old = Snapshot::new();
        old.insert(("m".into(), 1), served(true, 0));
        old.insert(("m".into(), 2), served(true, 0));
        old.insert(("gone".into(), 1), served(true, 0));
        let mut new = old.clone();
        new.remove(&("gone".into(), 1));
        new.insert(("m".into(), 2), served(false, 0)); // readiness changed
        new.insert(("m".into(), 3), served(true, 0)); // added
        assert!(diff(&old, &old).is_empty(), "no change, no event");
        let events = diff(&old, &new);
        let names: Vec<String> = events
            .iter()
            .map(|e| match e {
                ModelEvent::Update(s) => format!("update {}:{} ready={}", s.name, s.version, s.ready),
                ModelEvent::Removed { name, version } => format!("removed {name}:{version}"),
            })
            .collect();
        assert_eq!(
            names,
            ["update m:2 ready=false", "update m:3 ready=true", "removed gone:1"]
        );
        // A changed config is an update even when readiness is the same.
        let mut changed = old.clone();
        changed.insert(("m".into(), 1), served(true, 8));
        assert_eq!(diff(&old, &changed).len(), 1);
        // So is a model that became (or stopped being) one the router placed.
        let mut placed = old.clone();
        placed.get_mut(&("m".to_string(), 1)).unwrap().placed = true;
        assert!(matches!(&diff(&old, &placed)[..], [ModelEvent::Update(s)] if s.placed));
        // The hello carries a decodable config.
        let models = hello_models(&new);
        let config: ModelConfig = prost::Message::decode(models[0].config.as_slice()).unwrap();
        assert_eq!(config.name, "m");
    }
}
