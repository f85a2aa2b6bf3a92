//! The node's Dispatch: finds the model version, checks the request, runs it on the instance, records metrics.
use mesh::sync::ReadWrite;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mesh::ensemble::Served;
use mesh::proto::ModelStatisticsResponse;
use mesh::validate::Admitted;
use mesh::{
    Dispatch, Error, IndexEntry, InferRequest, InferResponse, LoadOptions, ModelView, Result, StreamItem, StreamSender,
};

use crate::actors::instance::{Executed, Submission};
use crate::actors::manager::loader::Repositories;
use crate::actors::manager::{ManagerLink, ManagerMsg};
use crate::actors::model::LoadedVersion;
use crate::actors::table::ModelTable;
use crate::backend::{ResponseSink, Timings};
use crate::cli::ControlMode;
use crate::serving::cache::{self, ResponseCache};
use crate::serving::sequence;

/// Counts a request as pending while it runs; if its future is dropped first (the client went
/// away), records it as a CANCELED failure so the gauge and statistics stay true.
struct InFlight<'a> {
    model: &'a LoadedVersion,
    start: Instant,
    finished: bool,
}

impl InFlight<'_> {
    fn begin(model: &LoadedVersion) {
        model.stats.metrics.pending.increment(1.0);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.model.stats.metrics.pending.decrement(1.0);
        if !self.finished {
            self.model.stats.failure("CANCELED", self.start.elapsed());
        }
    }
}

/// Reads Triton's `priority` and `timeout` (µs) request parameters ([`mesh::params`]).
fn scheduling_params(request: &InferRequest) -> Result<(u32, Option<std::time::Duration>)> {
    let params = &request.parameters;
    Ok((mesh::params::priority(params)?, mesh::params::timeout(params)?))
}

/// Rows of a request: its batch dimension for batching models, else 1.
fn request_rows(model: &LoadedVersion, request: &InferRequest) -> usize {
    if model.config.max_batch_size > 0 {
        request
            .inputs
            .first()
            .and_then(|i| i.tensor.shape.first())
            .copied()
            .unwrap_or(1)
            .max(1) as usize
    } else {
        1
    }
}

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

    /// Runs one request through an ensemble's steps, each a request to this same Dispatch (so the
    /// composing models keep their own statistics); the ensemble records its own. Ok(None): the
    /// answers went to `stream`.
    async fn run_ensemble(
        &self,
        model: &LoadedVersion,
        plan: &mesh::ensemble::Plan,
        request: InferRequest,
        start: Instant,
        stream: Option<StreamSender>,
    ) -> Result<Option<InferResponse>> {
        let rows = request_rows(model, &request);
        // Traced as Triton traces an ensemble: its own trace (no compute of its own), its steps
        // that trace's children; an untraced ensemble's steps are not traced.
        let trace = mesh::trace::sample(&request.model_name);
        let (name, id) = (request.model_name.clone(), request.id.clone());
        InFlight::begin(model);
        let mut guard = InFlight {
            model,
            start,
            finished: false,
        };
        let serve = mesh::ensemble::serve(plan, self, request, &model.version_label, stream);
        let served = mesh::trace::child(trace, serve).await;
        guard.finished = true;
        drop(guard);
        record_ensemble(model, rows, start, served.failed());
        if let Some(trace) = trace {
            let end = mesh::trace::ns(Instant::now());
            let start = mesh::trace::ns(start);
            let stamps = vec![
                ("REQUEST_START", start),
                ("QUEUE_START", start),
                ("REQUEST_END", end),
                ("INFER_RESPONSE_COMPLETE", end),
            ];
            write_trace(trace, model, name, id, stamps);
        }
        match served {
            Served::Answered(answer) => answer.map(Some),
            Served::Streamed { .. } => Ok(None),
        }
    }

    /// Runs one request; `stream` is where a decoupled model's answers go (None: it must answer
    /// once). Ok(None): the answers went to `stream`.
    async fn run(&self, mut request: InferRequest, stream: Option<StreamSender>) -> Result<Option<InferResponse>> {
        // One rule per parameter, for every model (mesh::params), as a router checks them too.
        mesh::params::check(&request.parameters)?;
        let start = Instant::now();
        let model = self.table.resolve(&request.model_name, &request.model_version)?;
        // An ensemble with a decoupled step answers any number of times, as a decoupled model does.
        let decoupled = model
            .config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled)
            || model.ensemble.as_ref().is_some_and(|plan| plan.decoupled);
        if decoupled && stream.is_none() {
            return Err(mesh::validate::needs_stream(&request.model_name));
        }
        let admitted = match Admitted::check(&model.config, &request, decoupled) {
            Ok(admitted) => admitted,
            Err(e) => {
                model.stats.failure(e.metric_reason(), start.elapsed());
                return Err(e);
            }
        };
        let classified = |response: InferResponse| admitted.answer(response, &model.config, &model.labels);
        // Not for decoupled or sequence models: their answers depend on more than the inputs.
        let cacheable = !decoupled && model.sequences.is_none() && cache::enabled(&model.config);
        let cache = self.cache.as_deref().filter(|_| cacheable);
        let Some(cache) = cache else {
            let response = self.compute(&model, request, stream, start, decoupled).await?;
            return response.map(classified).transpose();
        };
        let lookup = Instant::now();
        let key = cache::key(
            &request.model_name,
            &model.version_label,
            model.stats.load,
            &request.inputs,
        );
        if let Some(outputs) = cache.lookup(&key) {
            let took = lookup.elapsed();
            cache.record(took, Duration::ZERO);
            model.stats.cache_hit(start.elapsed(), took);
            let response = InferResponse {
                model_name: request.model_name,
                model_version: model.version_label.clone(),
                id: request.id,
                outputs: cache::select(outputs, &request.outputs)?,
                parameters: Vec::new(),
            };
            return classified(response).map(Some);
        }
        let looked = lookup.elapsed();
        // A miss computes every output, so the entry answers later requests for any of them.
        let requested = std::mem::take(&mut request.outputs);
        let Some(mut response) = self.compute(&model, request, stream, start, decoupled).await? else {
            return Ok(None);
        };
        let insert = Instant::now();
        cache.insert(key, &response.outputs);
        let inserted = insert.elapsed();
        cache.record(looked, inserted);
        model.stats.cache_miss(looked + inserted);
        response.outputs = cache::select(response.outputs, &requested)?;
        classified(response).map(Some)
    }

    /// Runs a checked request on the model's instance (or its ensemble's steps).
    async fn compute(
        &self,
        model: &LoadedVersion,
        mut request: InferRequest,
        stream: Option<StreamSender>,
        start: Instant,
        decoupled: bool,
    ) -> Result<Option<InferResponse>> {
        if let Some(plan) = model.ensemble.clone() {
            return self.run_ensemble(model, &plan, request, start, stream).await;
        }
        let rows = request_rows(model, &request);
        let (priority, timeout) = scheduling_params(&request)?;
        let batched = model.config.max_batch_size > 0;
        let mut outputs: Vec<String> = request.outputs.iter().map(|o| o.name.clone()).collect();
        let failed = |e: Error| {
            model.stats.failure(e.metric_reason(), start.elapsed());
            e
        };
        // Admitted before it waits for anything (a sequence's slot or turn, the instance's queue),
        // so whatever waits is bounded by the budget.
        let _admitted = self.budget.admit_request(&request).map_err(failed)?;
        // A sequence request runs on its sequence's instance, in its turn, with its controls and state.
        let step = match &model.sequences {
            Some(table) => {
                let ready: Vec<&str> = model
                    .instances
                    .iter()
                    .filter(|i| i.is_ready())
                    .map(|i| &*i.label)
                    .collect();
                Some(
                    sequence::Step::admit(table, &request, rows, &ready)
                        .await
                        .map_err(failed)?,
                )
            }
            None => None,
        };
        let _turn = match &step {
            Some(step) => {
                let turn = step.ticket.turn.clone().lock_owned().await;
                step.add_inputs(&request.model_name, batched, &mut request.inputs)
                    .map_err(failed)?;
                let config_outputs: Vec<String> = model.config.output.iter().map(|o| o.name.clone()).collect();
                outputs = step.outputs(outputs, &config_outputs);
                Some(turn)
            }
            None => None,
        };
        let trace = mesh::trace::sample(&request.model_name);
        let submission = Submission {
            inputs: std::mem::take(&mut request.inputs),
            outputs,
            rows,
            priority,
            timeout,
            id: request.id.clone(),
            parameters: std::mem::take(&mut request.parameters),
            trace,
            sink: stream.filter(|_| decoupled).map(|tx| {
                let template = InferResponse {
                    model_name: request.model_name.clone(),
                    model_version: model.version_label.clone(),
                    id: request.id.clone(),
                    ..Default::default()
                };
                Box::new(ResponseSink::new(tx, template))
            }),
        };
        let instance = match &step {
            Some(step) => model
                .instances
                .iter()
                .find(|i| i.label == step.ticket.instance)
                .map(|i| &**i),
            None => model.pick(),
        };
        let instance = instance.ok_or_else(|| match &step {
            Some(step) => Error::unavailable(format!(
                "model '{}': instance {} that held sequence {} is gone; start the sequence again",
                request.model_name, step.ticket.instance, step.flags.id
            )),
            None => Error::unavailable(format!("model '{}' has no instances", request.model_name)),
        })?;
        let streamed = submission.sink.is_some();
        InFlight::begin(model);
        let mut guard = InFlight {
            model,
            start,
            finished: false,
        };
        let result = instance.execute(submission).await;
        guard.finished = true;
        drop(guard);
        if let Some(id) = trace {
            record_trace(id, model, &request, start, result.as_ref().ok());
        }
        match result {
            Ok(mut done) => {
                if let Some(step) = step {
                    if !streamed {
                        step.finish(batched, &mut done.outputs).map_err(failed)?;
                    }
                }
                let execution = done.counts_execution.then_some(done.batch_rows as u64);
                model
                    .stats
                    .success(rows as u64, start.elapsed(), done.queued, &done.timings, execution);
                if streamed {
                    return Ok(None);
                }
                Ok(Some(InferResponse {
                    model_name: request.model_name,
                    model_version: model.version_label.clone(),
                    id: request.id,
                    outputs: done.outputs,
                    parameters: Vec::new(),
                }))
            }
            Err(e) => {
                model.stats.failure(e.metric_reason(), start.elapsed());
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Dispatch for NodeDispatch {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        // Without a stream a decoupled model is refused, so an answer always comes back here.
        self.run(request, None)
            .await?
            .ok_or_else(|| Error::internal("a decoupled model answered a single-answer request"))
    }

    /// A decoupled model's answers stream from its instance into `sink`; any other model answers once.
    async fn infer_stream(&self, request: InferRequest, sink: StreamSender) {
        let response = match self.run(request, Some(sink.clone())).await {
            Ok(None) => return, // streamed, final flags included
            Ok(Some(response)) => Ok(response),
            Err(e) => Err(e),
        };
        let _ = sink.send(StreamItem::new(Some(response), true));
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

/// An ensemble's own statistics for one request: a success over its whole time, or a failure.
fn record_ensemble(model: &LoadedVersion, rows: usize, start: Instant, failed: Option<&'static str>) {
    let took = start.elapsed();
    match failed {
        Some(reason) => model.stats.failure(reason, took),
        None => {
            let timings = Timings {
                infer: took,
                ..Default::default()
            };
            model
                .stats
                .success(rows as u64, took, Duration::ZERO, &timings, Some(rows as u64));
        }
    }
}

/// Writes a traced request's timestamps, as Triton names them. The execution's own instants are
/// placed back from its durations (the instance reports durations, not instants).
fn record_trace(id: u64, model: &LoadedVersion, request: &InferRequest, start: Instant, done: Option<&Executed>) {
    use mesh::trace::ns;
    let end = Instant::now();
    let mut stamps = vec![("REQUEST_START", ns(start))];
    if let Some(done) = done {
        let t = &done.timings;
        let compute_start = end
            .checked_sub(t.input + t.infer + t.output)
            .map_or(start, |c| c.max(start));
        let queue_start = compute_start.checked_sub(done.queued).map_or(start, |q| q.max(start));
        stamps.extend([
            ("QUEUE_START", ns(queue_start)),
            ("COMPUTE_START", ns(compute_start)),
            ("COMPUTE_INPUT_END", ns((compute_start + t.input).min(end))),
            ("COMPUTE_OUTPUT_START", ns((compute_start + t.input + t.infer).min(end))),
            ("COMPUTE_END", ns(end)),
        ]);
    }
    stamps.extend([("REQUEST_END", ns(end)), ("INFER_RESPONSE_COMPLETE", ns(end))]);
    write_trace(id, model, request.model_name.clone(), request.id.clone(), stamps);
}

/// Records one trace of `model` under the trace of the request it serves (if any).
fn write_trace(id: u64, model: &LoadedVersion, name: String, request_id: String, stamps: Vec<(&'static str, u64)>) {
    mesh::trace::record(&mesh::trace::Trace {
        id,
        model: name,
        version: model.version,
        request_id,
        parent_id: mesh::trace::parent(),
        stamps,
    });
}
