//! The node's Dispatch: a request is admitted once (`admit`), answered from the response cache where it may be (`cached`), else computed (`compute`); and the model-control calls, handed to the repository manager.
use mesh::sync::ReadWrite;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use mesh::proto::ModelStatisticsResponse;
use mesh::{
    Dispatch, Error, IndexEntry, InferRequest, InferResponse, LoadOptions, ModelView, Result, StreamItem, StreamSender,
};

use crate::actors::manager::loader::Repositories;
use crate::actors::manager::{ManagerLink, ManagerMsg};
use crate::actors::model::LoadedVersion;
use crate::actors::table::ModelTable;
use crate::cli::ControlMode;
use crate::serving::admit::{self, Admission, Entry, Replies};
use crate::serving::cache::{self, ResponseCache};
use crate::serving::{cached, compute};

/// Serves the models loaded on this node: reads the model table on each request and hands
/// repository changes to the RepositoryManager actor.
pub struct NodeDispatch {
    pub(crate) table: Arc<ModelTable>,
    strict_readiness: bool,
    mode: ControlMode,
    roots: Vec<PathBuf>,
    pub(crate) manager: Arc<ManagerLink>,
    budget: Arc<mesh::budget::FairBudget>,
    /// The response cache (`--cache-config`), for models whose config enables it.
    cache: Option<Arc<ResponseCache>>,
    /// Clients' load and unload requests waiting for (or in) the repository manager, whose mailbox
    /// they would otherwise fill without bound: one change runs at a time and may take seconds.
    changes: Arc<tokio::sync::Semaphore>,
}

/// How many clients' repository changes may wait for the manager at once; more are refused as
/// overload. The router's placements are not counted: they come from the cluster, which bounds them.
pub const MAX_PENDING_CHANGES: usize = 16;

/// How the node serves, beyond where its models are.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub strict_readiness: bool,
    pub poll_secs: u64,
    pub max_inflight_bytes: usize,
    /// Of those, kept for models and clients under their fair share (None: an eighth).
    pub inflight_reserve_bytes: Option<usize>,
    pub cache: Option<cache::CacheConfig>,
}

impl NodeDispatch {
    pub fn new(options: &NodeOptions, repos: &Repositories, table: Arc<ModelTable>, manager: Arc<ManagerLink>) -> Self {
        NodeDispatch {
            table,
            strict_readiness: options.strict_readiness,
            mode: repos.mode,
            roots: repos.roots.clone(),
            manager,
            budget: mesh::budget::with_reserve(
                options.max_inflight_bytes as u64,
                options.inflight_reserve_bytes.map(|r| r as u64),
                "--max-inflight-bytes",
            ),
            cache: options.cache.map(|c| Arc::new(ResponseCache::new(c))),
            changes: Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_CHANGES)),
        }
    }

    /// A client's repository change, if fewer than [`MAX_PENDING_CHANGES`] wait already.
    async fn ask_change(
        &self,
        what: &str,
        msg: impl FnOnce(ractor::RpcReplyPort<Result<()>>) -> ManagerMsg,
    ) -> Result<()> {
        let Ok(_turn) = self.changes.clone().try_acquire_owned() else {
            return Err(Error::overloaded(format!(
                "{what} refused: {MAX_PENDING_CHANGES} load and unload requests are already waiting for the \
                 repository manager; try again when they are done"
            )));
        };
        self.ask_manager(msg).await
    }

    /// Hands a request to the RepositoryManager and waits for its answer.
    /// Loads a model the cluster's router placed on this node, whatever the control mode.
    pub async fn load_placed(&self, name: &str) -> Result<()> {
        let name = name.to_string();
        self.ask_manager(|reply| ManagerMsg::Load(name, LoadOptions::default(), reply))
            .await
    }

    /// Unloads a model the router placed here (it moved, or the cluster no longer wants it).
    pub async fn unload_placed(&self, name: &str) -> Result<()> {
        let name = name.to_string();
        self.ask_manager(|reply| ManagerMsg::Unload(name, false, reply)).await
    }

    async fn ask_manager<T: Send + 'static>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<Result<T>>) -> ManagerMsg,
    ) -> Result<T> {
        let manager = self.manager.reading().clone();
        let manager = manager.ok_or_else(|| Error::unavailable("the repository manager is restarting; try again"))?;
        crate::actors::ask(&manager, "repository manager", msg)
            .await
            .map_err(Error::unavailable)?
    }

    /// Admits a request an in-process caller (the C API, the embedding API) hands over with its
    /// tensors as they are: checked here once, as a frontend's request is ([`admit`]), and its
    /// tensors' bytes too. The [`Admission`] then runs as it is ([`NodeDispatch::infer_admitted`],
    /// [`NodeDispatch::infer_stream_admitted`]). With [`Replies::Stream`] the caller takes a stream
    /// where [`Admission::decoupled`] says the model needs one.
    pub fn admit_local(&self, request: InferRequest, replies: Replies) -> Result<Admission> {
        admit::admit(&self.table, request, Entry::InProcess, replies)
    }

    /// Runs an admitted request that answers once (a decoupled model needs
    /// [`NodeDispatch::infer_stream_admitted`]).
    pub async fn infer_admitted(&self, admission: Admission) -> Result<InferResponse> {
        if admission.decoupled() {
            return Err(mesh::validate::needs_stream(admission.model_name()));
        }
        self.answer_once(admission).await
    }

    /// Runs an admitted request: a decoupled model's answers stream into `sink`; any other model
    /// answers once, there too.
    pub async fn infer_stream_admitted(&self, admission: Admission, sink: StreamSender) {
        let response = match self.serve(admission, Some(sink.clone())).await {
            Ok(None) => return, // streamed, final flags included
            Ok(Some(response)) => Ok(response),
            Err(e) => Err(e),
        };
        let _ = sink.send(StreamItem::new(Some(response), true));
    }

    /// Runs an admitted request of a model that answers once.
    async fn answer_once(&self, admission: Admission) -> Result<InferResponse> {
        self.serve(admission, None)
            .await?
            .ok_or_else(|| Error::internal("a decoupled model answered a single-answer request"))
    }

    /// Runs an admitted request, from the response cache where it may be, and classifies its
    /// answer as it asked. `stream`: where a decoupled model's answers go (None: it must answer
    /// once). Ok(None): the answers went to `stream`.
    async fn serve(&self, admission: Admission, stream: Option<StreamSender>) -> Result<Option<InferResponse>> {
        let Admission { admitted, work } = admission;
        let model = work.model.clone();
        let compute = |work| compute::run(self, &self.budget, work, stream);
        let cache = self.cache.as_deref().filter(|_| cached::cacheable(&work));
        let response = match cache {
            Some(cache) => cached::answer(cache, work, compute).await?,
            None => compute(work).await?,
        };
        response
            .map(|response| admitted.answer(response, &model.config, &model.labels))
            .transpose()
    }
}

#[async_trait]
impl Dispatch for NodeDispatch {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        // Without a stream a decoupled model is refused, so an answer always comes back here.
        let admission = admit::admit(&self.table, request, Entry::Frontend, Replies::One)?;
        self.answer_once(admission).await
    }

    /// A decoupled model's answers stream from its instance into `sink`; any other model answers once.
    async fn infer_stream(&self, request: InferRequest, sink: StreamSender) {
        match admit::admit(&self.table, request, Entry::Frontend, Replies::Stream) {
            Ok(admission) => self.infer_stream_admitted(admission, sink).await,
            Err(e) => {
                let _ = sink.send(StreamItem::new(Some(Err(e)), true));
            }
        }
    }

    fn ready(&self) -> bool {
        !self.strict_readiness || !self.table.any_failed()
    }

    fn model(&self, name: &str, version: &str) -> Result<ModelView> {
        let (m, ready_versions) = self
            .table
            .lookup(name, version, |m, all| (m.snapshot(), all.keys().copied().collect()))?;
        let ready = m.is_ready();
        Ok(ModelView {
            config: m.config.clone(),
            version: m.version,
            ready_versions,
            ready,
        })
    }

    async fn model_statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        let chosen: Vec<Arc<LoadedVersion>> = if name.is_empty() || version.is_empty() {
            self.table.ready_snapshots(name)?
        } else {
            vec![self.table.resolve(name, version)?]
        };
        Ok(ModelStatisticsResponse {
            model_stats: chosen.iter().map(|m| m.stats.snapshot()).collect(),
        })
    }

    async fn load_model(&self, name: &str, options: LoadOptions) -> Result<()> {
        self.mode.check_explicit("load", name)?;
        mesh::repository::check_model_name(name)?;
        let name = name.to_string();
        let what = format!("load of model '{name}'");
        self.ask_change(&what, |reply| ManagerMsg::Load(name, options, reply))
            .await
    }

    async fn unload_model(&self, name: &str, unload_dependents: bool) -> Result<()> {
        self.mode.check_explicit("unload", name)?;
        mesh::repository::check_model_name(name)?;
        let name = name.to_string();
        let what = format!("unload of model '{name}'");
        self.ask_change(&what, |reply| ManagerMsg::Unload(name, unload_dependents, reply))
            .await
    }

    fn budget(&self) -> Option<&Arc<mesh::budget::FairBudget>> {
        Some(&self.budget)
    }

    fn extensions(&self) -> Vec<&'static str> {
        let mut e = mesh::dispatch::SERVING_EXTENSIONS.to_vec();
        if self.mode == ControlMode::Explicit {
            e.push("model_repository");
            e.push("model_repository(unload_dependents)");
        }
        e
    }

    fn repository_index(&self) -> Vec<IndexEntry> {
        self.table.index(&self.roots)
    }
}
