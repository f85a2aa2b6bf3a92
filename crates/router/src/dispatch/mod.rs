//! The router's Dispatch, the request path: each request is forwarded to a node serving its model
//! (`forward`), router ensembles run their steps through this same Dispatch (`ensemble`), statistics
//! are gathered from the nodes (`stats`), and model control goes to placement (`control`). Each
//! finished request is counted into the console's traffic history (`metrics::history`).
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use mesh::budget::FairBudget;
use mesh::proto::ModelStatisticsResponse;
use mesh::sync::Locked;
use mesh::{Dispatch, IndexEntry, InferRequest, InferResponse, ModelView, Result, StreamItem, StreamSender};

use mesh::trace::otel::live::SpanKind;

use self::traced::Trace;
use crate::ensembles::Ensembles;
use crate::metrics::history::{History, HistorySettings};
use crate::route::{RetryPolicy, RetrySettings};
use crate::shared::{Placement, RoutingView};

mod control;
mod ensemble;
mod forward;
mod rollout;
mod shadow;
mod stats;
mod traced;

/// The most sequences of rolled-out models pinned to a version at once (beyond them a sequence
/// follows its id's bucket, which holds while the share does).
const PINNED_SEQUENCES: usize = 100_000;
/// A pinned sequence without a request this long is forgotten (Triton's default idle time for a
/// sequence is 1 s; clients that pause longer keep their id's bucket).
const PIN_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

pub struct RouterDispatch {
    pub view: Arc<RoutingView>,
    pub ensembles: Ensembles,
    pub placement: Arc<Placement>,
    retry: RetryPolicy,
    /// Clients' requests the router holds (to forward and retry them), shared fairly between
    /// models and clients ([`mesh::budget`]).
    budget: Arc<FairBudget>,
    /// Each model's recent requests through this router, for the console's charts (bounded).
    pub history: Mutex<History>,
    /// Sequences of rolled-out models pinned to the version their first request got (bounded).
    pins: Mutex<crate::rollout::split::Pins>,
    /// Shadow requests of rollouts: their own budget, and each model's results here.
    shadows: Arc<shadow::Shadows>,
}

impl RouterDispatch {
    pub fn new(
        view: Arc<RoutingView>,
        ensembles: Ensembles,
        placement: Arc<Placement>,
        budget: Arc<FairBudget>,
    ) -> Self {
        let retry = RetryPolicy::new(RetrySettings {
            max_attempts: view.route.max_attempts,
        });
        RouterDispatch {
            view,
            ensembles,
            placement,
            retry,
            budget,
            history: Mutex::new(History::new(HistorySettings::default(), Instant::now())),
            pins: Mutex::new(crate::rollout::split::Pins::new(PINNED_SEQUENCES, PIN_IDLE)),
            shadows: Arc::default(),
        }
    }

    /// Runs a router ensemble (`run`) the router serves itself: under a span of its own, its steps'
    /// routing the span's children, and into the console's history beside its steps (each routed,
    /// and recorded, as a request of its own).
    async fn ensemble_request<T>(
        &self,
        trace: &Trace,
        name: String,
        run: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let mut span = trace.span(name.clone(), SpanKind::Internal);
        let result = traced::steps(&span, run).await;
        traced::outcome(&mut span, &result);
        self.history
            .locked()
            .record(&name, started.elapsed(), result.is_ok(), Instant::now());
        result
    }

    /// The generation-stamped view of a model a step or metadata request needs.
    fn cluster_view(&self, name: &str, version: &str) -> Result<ModelView> {
        self.view.routing().model_view(name, version)
    }
}

#[async_trait]
impl Dispatch for RouterDispatch {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        // Refused here as a node would refuse it: one rule per parameter (mesh::params).
        mesh::params::check(&request.parameters)?;
        let trace = Trace::begin(&request.model_name);
        if self.ensembles.get(&request.model_name).is_some() {
            let name = request.model_name.clone();
            return self.ensemble_request(&trace, name, self.run_ensemble(request)).await;
        }
        self.route_unary(request, &trace).await
    }

    async fn infer_stream(&self, request: InferRequest, sink: StreamSender) {
        if let Err(e) = mesh::params::check(&request.parameters) {
            let _ = sink.send(StreamItem::new(Some(Err(e)), true));
            return;
        }
        let trace = Trace::begin(&request.model_name);
        if self.ensembles.get(&request.model_name).is_some() {
            let name = request.model_name.clone();
            let _ = self
                .ensemble_request(&trace, name, self.stream_ensemble(request, sink))
                .await;
            return;
        }
        if let Err(e) = self.route_stream(request, &sink, &trace).await {
            let _ = sink.send(StreamItem::new(Some(Err(e)), true));
        }
    }

    /// Ready when at least one node serves a ready model.
    fn ready(&self) -> bool {
        self.view.routing().ready()
    }

    fn model(&self, name: &str, version: &str) -> Result<ModelView> {
        if let Some(e) = self.ensembles.get(name) {
            let ready = matches!(self.ensemble_ready(name), Some(Ok(())));
            return self.ensembles.view(e, ready, version);
        }
        self.cluster_view(name, version)
    }

    fn repository_index(&self) -> Vec<IndexEntry> {
        let table = self.view.routing();
        let mut rows: Vec<IndexEntry> = table.index().iter().map(|r| r.entry()).collect();
        self.ensemble_rows(&mut rows);
        self.placement.index_rows(&mut rows);
        rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.version.cmp(&b.version)));
        rows
    }

    async fn model_statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        self.statistics(name, version).await
    }

    async fn load_model(&self, name: &str, options: mesh::LoadOptions) -> Result<()> {
        self.load(name, options).await
    }

    async fn unload_model(&self, name: &str, _: bool) -> Result<()> {
        self.unload(name).await
    }

    fn budget(&self) -> Option<&Arc<FairBudget>> {
        Some(&self.budget)
    }

    fn extensions(&self) -> Vec<&'static str> {
        mesh::dispatch::SERVING_EXTENSIONS.to_vec()
    }
}
