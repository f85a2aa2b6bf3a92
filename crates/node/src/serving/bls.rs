//! The Dispatch Python models' BLS calls go through: the node's own Dispatch for models this node
//! knows, and, on a node that joined a cluster, a router for every other model (transparently to
//! `model.py`).
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use mesh::proto::ModelStatisticsResponse;
use mesh::{Dispatch, IndexEntry, InferRequest, InferResponse, LoadOptions, ModelView, Result, StreamSender};

use super::dispatch::NodeDispatch;

/// Where requests for models this node does not know go (the cluster's routers).
#[async_trait]
pub trait Remote: Send + Sync + 'static {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse>;
}

pub struct BlsDispatch {
    local: Arc<NodeDispatch>,
    remote: OnceLock<Arc<dyn Remote>>,
}

impl BlsDispatch {
    pub fn new(local: Arc<NodeDispatch>) -> Self {
        BlsDispatch {
            local,
            remote: OnceLock::new(),
        }
    }

    /// Sends calls for unknown models to `remote` from now on (set once, when the node joins).
    pub fn set_remote(&self, remote: Arc<dyn Remote>) {
        let _ = self.remote.set(remote);
    }

    /// The remote for this request: only for a model the node does not know at all (a model that
    /// is here but failed or unloaded answers with its own state, as on a single node).
    fn remote_for(&self, request: &InferRequest) -> Option<&Arc<dyn Remote>> {
        self.remote
            .get()
            .filter(|_| !self.local.table.knows(&request.model_name))
    }
}

#[async_trait]
impl Dispatch for BlsDispatch {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        match self.remote_for(&request) {
            Some(remote) => remote.infer(request).await,
            None => self.local.infer(request).await,
        }
    }

    async fn infer_stream(&self, request: InferRequest, sink: StreamSender) {
        match self.remote_for(&request) {
            Some(remote) => {
                let response = remote.infer(request).await;
                let _ = sink.send(mesh::StreamItem::new(Some(response), true));
            }
            None => self.local.infer_stream(request, sink).await,
        }
    }

    fn ready(&self) -> bool {
        self.local.ready()
    }

    fn model(&self, name: &str, version: &str) -> Result<ModelView> {
        self.local.model(name, version)
    }

    fn repository_index(&self) -> Vec<IndexEntry> {
        self.local.repository_index()
    }

    async fn load_model(&self, name: &str, options: LoadOptions) -> Result<()> {
        self.local.load_model(name, options).await
    }

    async fn unload_model(&self, name: &str, unload_dependents: bool) -> Result<()> {
        self.local.unload_model(name, unload_dependents).await
    }

    async fn model_statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        self.local.model_statistics(name, version).await
    }

    fn extensions(&self) -> Vec<&'static str> {
        self.local.extensions()
    }
}
