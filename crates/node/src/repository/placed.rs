//! Models the cluster's router placed on this node: where their shipped files lie, by model name.
use mesh::sync::ReadWrite;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::RwLock;

/// A placed model's directory (in the node's shipment cache) and the config override it came with.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedDir {
    pub path: PathBuf,
    pub config: Option<String>,
}

/// Placed models by name; the repository manager loads these from their directories instead of
/// the node's own repositories, and poll mode never unloads them.
#[derive(Debug, Default)]
pub struct PlacedModels(RwLock<BTreeMap<String, PlacedDir>>);

impl PlacedModels {
    pub fn get(&self, name: &str) -> Option<PlacedDir> {
        self.0.reading().get(name).cloned()
    }

    pub fn set(&self, name: &str, dir: PlacedDir) {
        self.0.writing().insert(name.to_string(), dir);
    }

    /// Forgets a placement; returns whether it was one.
    pub fn remove(&self, name: &str) -> bool {
        self.0.writing().remove(name).is_some()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.reading().contains_key(name)
    }
}
