//! The routing table: an immutable snapshot of membership that request tasks read without locks.
use std::collections::BTreeMap;
use std::sync::Arc;

use mesh::config::ModelConfig;
use mesh::{Error, IndexEntry, ModelView};

use super::{LinkId, Load, ModelStatus, NodeState};

/// A node that can take a request for one model version now, with its last reported load for that version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub link: LinkId,
    pub node: String,
    /// Requests of this version the node reported executing.
    pub inflight: u32,
    /// Requests of this version the node reported queued.
    pub queued: u32,
    pub exec_us: u64,
}

/// A model version that [`RoutingTable::resolve`] found, with its routable replicas (never empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved<'a> {
    pub version: i64,
    pub replicas: &'a [Replica],
}

/// Why a request has no replica to go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// The version is not a number (INVALID_ARGUMENT).
    Invalid(Error),
    /// No node knows the model or version (NOT_FOUND): answer at once.
    NotFound(Error),
    /// The model is known but nothing routable serves it now (its nodes are draining, silent, recently lost,
    /// or loading): the caller may wait, within the request's deadline, for a replica to appear.
    NoReplica { reason: String },
}

impl From<ResolveError> for Error {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::Invalid(e) | ResolveError::NotFound(e) => e,
            ResolveError::NoReplica { reason } => Error::unavailable(reason),
        }
    }
}

/// One row of the cluster's repository index: a model version and who holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRow {
    pub name: String,
    pub version: i64,
    /// READY when a routable node has it ready, else UNAVAILABLE.
    pub state: &'static str,
    /// Why it is not ready, node by node (empty when READY).
    pub reason: String,
    /// Every node that reports this version, ready or not, sorted.
    pub nodes: Vec<String>,
}

impl IndexRow {
    /// The row as the `Dispatch` trait's repository index writes it.
    pub fn entry(&self) -> IndexEntry {
        IndexEntry {
            name: self.name.clone(),
            version: self.version.to_string(),
            state: self.state.to_string(),
            reason: self.reason.clone(),
            nodes: self.nodes.clone(),
        }
    }
}

/// One node that reports a model version, whatever its state.
#[derive(Debug, Clone)]
struct Holder {
    node: String,
    state: NodeState,
    ready: bool,
    reason: String,
    config: Arc<ModelConfig>,
}

impl Holder {
    fn routable(&self) -> bool {
        self.state == NodeState::Up && self.ready
    }

    /// Why this holder cannot take requests.
    fn why_not(&self) -> String {
        match self.state {
            NodeState::Draining => format!("node '{}' is draining", self.node),
            NodeState::Silent => format!("node '{}' has gone silent", self.node),
            NodeState::Lost => format!("node '{}' was lost", self.node),
            NodeState::Left => format!("node '{}' left the cluster", self.node),
            NodeState::Up if self.reason.is_empty() => format!("node '{}': not ready", self.node),
            NodeState::Up => format!("node '{}': {}", self.node, self.reason),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct VersionRoutes {
    replicas: Vec<Replica>,
    holders: Vec<Holder>,
}

impl VersionRoutes {
    fn reasons(&self) -> Vec<String> {
        self.holders
            .iter()
            .filter(|h| !h.routable())
            .map(Holder::why_not)
            .collect()
    }
}

/// Per model name, per version: routable replicas and every holder. Build it with
/// [`super::Membership::routing_table`], share it as `Arc<RoutingTable>`.
#[derive(Debug, Clone, Default)]
pub struct RoutingTable {
    generation: u64,
    models: BTreeMap<String, BTreeMap<i64, VersionRoutes>>,
    ready: bool,
}

pub(super) struct Builder(RoutingTable);

impl Builder {
    pub(super) fn new(generation: u64) -> Self {
        Builder(RoutingTable {
            generation,
            ..RoutingTable::default()
        })
    }

    pub(super) fn add(&mut self, node: &str, link: Option<LinkId>, state: NodeState, status: &ModelStatus, load: Load) {
        let routes = self
            .0
            .models
            .entry(status.name.clone())
            .or_default()
            .entry(status.version)
            .or_default();
        let holder = Holder {
            node: node.to_string(),
            state,
            ready: status.ready,
            reason: status.reason.clone(),
            config: status.config.clone(),
        };
        if let (true, Some(link)) = (holder.routable(), link) {
            self.0.ready = true;
            routes.replicas.push(Replica {
                link,
                node: node.to_string(),
                inflight: load.inflight,
                queued: load.queued,
                exec_us: load.exec_us,
            });
        }
        routes.holders.push(holder);
    }

    pub(super) fn finish(self) -> RoutingTable {
        self.0
    }
}

fn unknown(name: &str) -> Error {
    Error::not_found(format!("unknown model: '{name}' is not found"))
}

fn parse_version(version: &str) -> Result<i64, Error> {
    version
        .parse()
        .map_err(|_| Error::invalid(format!("model version '{version}' is not a number")))
}

fn version_missing(name: &str, version: i64) -> Error {
    Error::not_found(format!("version {version} of model '{name}' is not available"))
}

impl RoutingTable {
    /// The membership generation this snapshot was built at.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether at least one Up node serves at least one ready model.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Where a request for `name` / `version` can go. An empty version means the highest version that is
    /// routable somewhere in the cluster.
    pub fn resolve(&self, name: &str, version: &str) -> Result<Resolved<'_>, ResolveError> {
        let versions = self
            .models
            .get(name)
            .ok_or_else(|| ResolveError::NotFound(unknown(name)))?;
        if version.is_empty() {
            if let Some((&v, routes)) = versions.iter().rev().find(|(_, r)| !r.replicas.is_empty()) {
                return Ok(Resolved {
                    version: v,
                    replicas: &routes.replicas,
                });
            }
            let reasons: Vec<String> = versions
                .iter()
                .rev()
                .map(|(v, r)| format!("version {v}: {}", r.reasons().join(", ")))
                .collect();
            return Err(ResolveError::NoReplica {
                reason: format!("model '{name}' has no available replica ({})", reasons.join("; ")),
            });
        }
        let v = parse_version(version).map_err(ResolveError::Invalid)?;
        let routes = versions
            .get(&v)
            .ok_or_else(|| ResolveError::NotFound(version_missing(name, v)))?;
        if routes.replicas.is_empty() {
            return Err(ResolveError::NoReplica {
                reason: format!(
                    "version {v} of model '{name}' has no available replica ({})",
                    routes.reasons().join(", ")
                ),
            });
        }
        Ok(Resolved {
            version: v,
            replicas: &routes.replicas,
        })
    }

    /// The model as the metadata, config and readiness endpoints see it. An empty version is the highest
    /// ready one (or the highest known when none is ready). The config comes from a node serving that
    /// version, preferring a routable one, then any ready one.
    pub fn model_view(&self, name: &str, version: &str) -> mesh::Result<ModelView> {
        let versions = self.models.get(name).ok_or_else(|| unknown(name))?;
        let ready_versions: Vec<i64> = versions
            .iter()
            .filter(|(_, r)| !r.replicas.is_empty())
            .map(|(&v, _)| v)
            .collect();
        let chosen = if version.is_empty() {
            match ready_versions.last() {
                Some(&v) => v,
                None => *versions.keys().next_back().ok_or_else(|| unknown(name))?,
            }
        } else {
            parse_version(version)?
        };
        let routes = versions.get(&chosen).ok_or_else(|| version_missing(name, chosen))?;
        let holder = routes
            .holders
            .iter()
            .find(|h| h.routable())
            .or_else(|| routes.holders.iter().find(|h| h.ready))
            .or_else(|| routes.holders.first())
            .ok_or_else(|| version_missing(name, chosen))?;
        Ok(ModelView {
            config: holder.config.clone(),
            version: chosen,
            ready: !routes.replicas.is_empty(),
            ready_versions,
        })
    }

    /// One row per (model, version) anywhere in the cluster, sorted by name then version.
    pub fn index(&self) -> Vec<IndexRow> {
        let mut rows = Vec::new();
        for (name, versions) in &self.models {
            for (&version, routes) in versions {
                let ready = !routes.replicas.is_empty();
                let mut nodes: Vec<String> = routes.holders.iter().map(|h| h.node.clone()).collect();
                nodes.sort();
                rows.push(IndexRow {
                    name: name.clone(),
                    version,
                    state: if ready { "READY" } else { "UNAVAILABLE" },
                    reason: if ready {
                        String::new()
                    } else {
                        routes.reasons().join(", ")
                    },
                    nodes,
                });
            }
        }
        rows
    }
}
