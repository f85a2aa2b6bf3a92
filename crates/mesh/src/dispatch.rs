//! The one seam between frontends and whatever runs models: a local node or the cluster router.
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::proto::{ModelConfig, ModelStatisticsResponse};
use crate::request::{InferRequest, InferResponse};
use crate::stream::{StreamItem, StreamSender};

/// What a frontend needs to know about one served model version.
#[derive(Debug, Clone)]
pub struct ModelView {
    pub config: Arc<ModelConfig>,
    /// The version this view describes.
    pub version: i64,
    /// Every version of the model that is currently ready, ascending.
    pub ready_versions: Vec<i64>,
    pub ready: bool,
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    /// Empty when the model has no loaded version (for example when it failed to load).
    pub version: String,
    /// READY, UNAVAILABLE, LOADING or UNLOADING, as Triton reports them.
    pub state: String,
    pub reason: String,
    /// The cluster nodes serving this version (a router fills it; empty on a node).
    pub nodes: Vec<String>,
}

/// What a repository `load` request may carry besides the model name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// A config in JSON that replaces the repository's config.pbtxt.
    pub config: Option<String>,
    /// `file:<relative path>` overrides: model files given as bytes (a config is then required).
    pub files: Vec<(String, bytes::Bytes)>,
}

/// Runs inference and answers questions about models; frontends are generic over it.
#[async_trait]
pub trait Dispatch: Send + Sync + 'static {
    /// Runs one request on the model and version it names.
    async fn infer(&self, request: InferRequest) -> Result<InferResponse>;

    /// Runs one request whose model may answer several times (a decoupled model), sending each
    /// answer to `sink` as it is produced; returns once the request is finished. Others answer once.
    async fn infer_stream(&self, request: InferRequest, sink: StreamSender) {
        let response = self.infer(request).await;
        let _ = sink.send(StreamItem::new(Some(response), true));
    }

    /// Whether the server is ready for inference.
    fn ready(&self) -> bool;

    /// The view of a model version; `version` empty means the default one.
    fn model(&self, name: &str, version: &str) -> Result<ModelView>;

    /// Every model the repositories hold, with its state and the reason for it.
    fn repository_index(&self) -> Vec<IndexEntry>;

    /// Loads or reloads a model (the repository extension).
    async fn load_model(&self, name: &str, options: LoadOptions) -> Result<()> {
        let _ = options;
        Err(Error::unsupported(format!(
            "cannot load '{name}': explicit model control is not enabled on this server"
        )))
    }

    /// Unloads a model (the repository extension); `unload_dependents` also unloads models that use it.
    async fn unload_model(&self, name: &str, unload_dependents: bool) -> Result<()> {
        let _ = unload_dependents;
        Err(Error::unsupported(format!(
            "cannot unload '{name}': explicit model control is not enabled on this server"
        )))
    }

    /// Statistics of a model version, every version of a model (`version` empty), or every model (`name` empty).
    async fn model_statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        let _ = version;
        Err(Error::unsupported(format!(
            "statistics for '{name}' are not available on this server"
        )))
    }

    /// The server's in-flight budget, for frontends to charge what they hold besides requests (a
    /// stream's answers waiting for their client); None where the server keeps none.
    fn budget(&self) -> Option<&Arc<crate::budget::FairBudget>> {
        None
    }

    /// KServe v2 extensions this dispatcher really implements, for server metadata (a node and a
    /// router start from [`SERVING_EXTENSIONS`]).
    fn extensions(&self) -> Vec<&'static str> {
        vec!["binary_tensor_data", "model_configuration", "parameters", "statistics"]
    }
}

/// The extensions every mesh server (node or router) implements; a node in explicit model-control
/// mode adds the repository extension.
pub const SERVING_EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "model_configuration",
    "parameters",
    "statistics",
    "schedule_policy",
    "classification",
    "logging",
    "system_shared_memory",
    "cuda_shared_memory",
];
