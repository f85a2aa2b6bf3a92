//! The router's Dispatch: each request is routed to a node serving its model (the balancer picks,
//! the link carries it), failed attempts are retried by the retry rules within the request's
//! deadline, and router ensembles run their steps through this same Dispatch.
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mesh::cluster::call::{self, Failure as CallFailure, Peer};
use mesh::cluster::convert::request_frame;
use mesh::proto::ModelStatisticsResponse;
use mesh::{Dispatch, Error, IndexEntry, InferRequest, InferResponse, ModelView, Result, StreamItem, StreamSender};

use crate::cluster::Cluster;
use crate::ensembles::Ensembles;
use crate::link::{InflightPermit, Link};
use crate::membership::{ResolveError, RoutingTable};
use crate::metrics;
use crate::placement::Placement;
use crate::route::retry::{Decision, Failure, RequestState, RetryPolicy};
use crate::route::Pick;

pub struct RouterDispatch {
    pub cluster: Arc<Cluster>,
    pub ensembles: Ensembles,
    pub placement: Arc<Placement>,
    retry: RetryPolicy,
}

/// The request's `timeout` parameter (µs), which also bounds routing and retries (checked on entry,
/// [`mesh::params::check`]).
fn timeout_of(request: &InferRequest) -> Option<Duration> {
    mesh::params::timeout(&request.parameters).ok().flatten()
}

/// The request's sequence, when it belongs to one (stateful: pinned to one node, never moved).
fn sequence_of(request: &InferRequest) -> Option<String> {
    mesh::params::sequence_id(&request.parameters)
        .ok()
        .flatten()
        .map(|id| id.to_string())
}

/// The replica a sequence is pinned to: the highest rendezvous hash of (sequence, node name), so
/// every request of a sequence picks the same node while it serves the model, and a node joining or
/// leaving moves only the sequences it wins or held.
fn pinned(sequence: &str, replicas: &[crate::membership::Replica]) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    replicas
        .iter()
        .max_by_key(|r| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (sequence, r.node.as_str()).hash(&mut h);
            h.finish()
        })
        .map(|r| r.link)
}

/// A model is idempotent unless its config says `parameters { key: "mesh.idempotent" value {
/// string_value: "false" } }`: then a request lost with its node is not run again elsewhere.
pub fn idempotent(config: &mesh::config::ModelConfig) -> bool {
    config
        .parameters
        .get("mesh.idempotent")
        .is_none_or(|p| !p.string_value.trim().eq_ignore_ascii_case("false"))
}

/// Whether a model served in the cluster is idempotent: its own flag, and for an ensemble a node
/// runs whole, every step model's too (nested ensembles to a few levels).
fn idempotent_in(table: &RoutingTable, config: &mesh::config::ModelConfig, depth: usize) -> bool {
    if !idempotent(config) {
        return false;
    }
    let steps = mesh::ensemble::step_models(config);
    depth < 8
        && steps.iter().all(|step| {
            table
                .model_view(step, "")
                .map_or(true, |v| idempotent_in(table, &v.config, depth + 1))
        })
}

/// Model control through the router: not yet (the router does not place models); nodes load their
/// own repositories.
fn model_control(name: &str, what: &str) -> Error {
    Error::unsupported(format!(
        "cannot {what} '{name}' through mesh-router: it is not a model of the router's cluster repository \
         (--model-repository); {what} it on the nodes that serve it from their own repositories, and the \
         router follows"
    ))
}

/// The retry rules' view of a failed attempt, and the balancer's reaction to it.
fn classify(cluster: &Cluster, link: &Link, failure: CallFailure) -> (Failure, Option<&'static str>) {
    let now = Instant::now();
    match failure {
        CallFailure::NotSent(why) => {
            cluster.balancer().transport_failed(link.id, now);
            (Failure::NotStarted(why), Some("not_sent"))
        }
        CallFailure::Lost(why) => {
            cluster.balancer().transport_failed(link.id, now);
            (Failure::Lost(why), Some("lost"))
        }
        CallFailure::Refused(e) => (Failure::NotStarted(e.message), Some("refused")),
        CallFailure::Overloaded(e) => {
            cluster.balancer().overloaded(link.id, now);
            (Failure::Overloaded(e.message), Some("overloaded"))
        }
        CallFailure::Answered(e) => (Failure::Answered(e), None),
    }
}

/// A request on its way through the router: where it may go and what it tried.
struct Routing<'a> {
    request: &'a mut InferRequest,
    state: RequestState,
    /// The version the first pick resolved to (a request for "the latest" stays on one version).
    version: Option<String>,
    /// Set once a node failed at the transport level: success afterwards is a failover.
    failed_over: bool,
    /// The sequence the request belongs to (it is pinned to one node).
    sequence: Option<String>,
    /// What went wrong with the last attempt, for the client's error when nothing is left to try.
    last_failure: Option<String>,
}

impl Routing<'_> {
    /// An error that ends routing, with the last attempt's failure when there was one.
    fn with_cause(&self, e: Error) -> Error {
        match &self.last_failure {
            Some(why) => Error::new(e.code, format!("{}; last failure: {why}", e.message)),
            None => e,
        }
    }
}

/// One attempt on its way to a node: the link, the encoded request, and its place in the link's
/// in-flight count (released when the attempt ends).
struct Attempt {
    link: Arc<Link>,
    chunks: Vec<bytes::Bytes>,
    name: String,
    _permit: InflightPermit,
}

impl Attempt {
    fn peer(&self) -> Peer<'_> {
        Peer {
            conn: &self.link.conn,
            name: &self.name,
        }
    }
}

impl RouterDispatch {
    pub fn new(cluster: Arc<Cluster>, ensembles: Ensembles, placement: Arc<Placement>) -> Self {
        let retry = RetryPolicy::new(crate::route::retry::RetrySettings {
            max_attempts: cluster.route.max_attempts,
        });
        RouterDispatch {
            cluster,
            ensembles,
            placement,
            retry,
        }
    }

    fn begin<'a>(&self, request: &'a mut InferRequest) -> Routing<'a> {
        self.placement.touch(&request.model_name);
        let now = Instant::now();
        let deadline = now + timeout_of(request).unwrap_or(self.cluster.route.request_timeout);
        let mut state = RequestState::new(request.model_name.clone(), now, deadline);
        let sequence = sequence_of(request);
        if sequence.is_some() {
            state = state.in_sequence();
        }
        Routing {
            request,
            state,
            version: None,
            failed_over: false,
            sequence,
            last_failure: None,
        }
    }

    /// Picks the node for the next attempt; waits (within the deadline and the route wait) while
    /// the model is known but no replica can take it now.
    async fn choose(&self, r: &mut Routing<'_>) -> Result<Arc<Link>> {
        let mut changes = self.cluster.subscribe();
        let wait_until = (Instant::now() + self.cluster.route.route_wait).min(r.state.deadline());
        loop {
            changes.borrow_and_update();
            let table = self.cluster.routing();
            let version = r.version.clone().unwrap_or_else(|| r.request.model_version.clone());
            let (reason, until) = match table.resolve(&r.request.model_name, &version) {
                Err(ResolveError::NoReplica { reason }) => (reason, None),
                // A model of the cluster repository with no replica yet is being placed: wait for it.
                Err(ResolveError::NotFound(_)) if self.placement.is_placing(&r.request.model_name) => {
                    (format!("model '{}' is being placed", r.request.model_name), None)
                }
                Err(e) => return Err(e.into()),
                Ok(resolved) => {
                    if r.version.is_none() {
                        let config = table.model_view(&r.request.model_name, &resolved.version.to_string());
                        if config.is_ok_and(|v| !idempotent_in(&table, &v.config, 0)) {
                            r.state = r.state.clone().non_idempotent();
                        }
                    }
                    let pick = if let Some(seq) = &r.sequence {
                        // The retry rules never move a sequence, so this is its one attempt.
                        pinned(seq, resolved.replicas).map_or_else(
                            || Pick::Wait {
                                reason: "no replica".into(),
                                until: None,
                            },
                            Pick::Routed,
                        )
                    } else {
                        let inflight = |l| self.cluster.link(l).map_or(0, |l| l.inflight());
                        let mut rng = rand::rng();
                        self.cluster.balancer().pick(
                            resolved.replicas,
                            inflight,
                            r.state.tried(),
                            Instant::now(),
                            &mut rng,
                        )
                    };
                    match pick {
                        Pick::Routed(id) => match self.cluster.link(id) {
                            Some(link) => {
                                let v = resolved.version.to_string();
                                r.request.model_version = v.clone();
                                r.version = Some(v);
                                return Ok(link);
                            }
                            // The link ended between the snapshot and now: look again shortly
                            // (its removal from the view is on its way).
                            None => (
                                "a chosen node just left".to_string(),
                                Some(Instant::now() + Duration::from_millis(5)),
                            ),
                        },
                        Pick::Wait { reason, until } => (reason, until),
                        Pick::Unavailable(e) => return Err(r.with_cause(e)),
                    }
                }
            };
            let now = Instant::now();
            if now >= wait_until {
                return Err(r.with_cause(r.state.waited_out(&reason, now)));
            }
            let until = until.unwrap_or(wait_until).min(wait_until);
            let _ = tokio::time::timeout_at(until.into(), changes.changed()).await;
        }
    }

    /// Picks the next node and encodes the request for it (`stream`: the answers stream back).
    async fn attempt(&self, r: &mut Routing<'_>, stream: bool) -> Result<Attempt> {
        let link = self.choose(r).await?;
        let chunks = request_frame(r.request, stream, &self.cluster.limits)?;
        r.state.sent(link.id, link.name.clone());
        metrics::attempt(&link.name);
        Ok(Attempt {
            name: format!("node '{}'", link.name),
            _permit: link.permit(),
            link,
            chunks,
        })
    }

    /// What to do after an attempt failed: Ok to try again, or the error for the client.
    fn after_failure(&self, r: &mut Routing<'_>, link: &Link, failure: CallFailure) -> Result<()> {
        r.last_failure = Some(failure.to_string());
        let (failure, why) = classify(&self.cluster, link, failure);
        if matches!(failure, Failure::Lost(_) | Failure::NotStarted(_)) && why != Some("refused") {
            r.failed_over = true;
        }
        match self.retry.decide(&r.state, failure, Instant::now()) {
            Decision::Retry => {
                if let Some(why) = why {
                    metrics::retry(why);
                }
                tracing::debug!(model = %r.request.model_name, node = %link.name, "retrying on another node");
                Ok(())
            }
            Decision::GiveUp(e) => Err(e),
        }
    }

    fn finish<T>(&self, r: &Routing<'_>, started: Instant, result: &Result<T>) {
        let version = r.version.as_deref().unwrap_or("");
        let failure = result.as_ref().err().map(|e| e.metric_reason());
        if result.is_ok() && r.failed_over {
            metrics::failover();
        }
        metrics::request(&r.request.model_name, version, 1, started.elapsed(), failure);
    }

    async fn route_unary(&self, mut request: InferRequest) -> Result<InferResponse> {
        let started = Instant::now();
        let mut r = self.begin(&mut request);
        let result = self.unary_attempts(&mut r).await;
        self.finish(&r, started, &result);
        result
    }

    async fn unary_attempts(&self, r: &mut Routing<'_>) -> Result<InferResponse> {
        loop {
            let mut a = self.attempt(r, false).await?;
            let (link, chunks) = (a.link.clone(), std::mem::take(&mut a.chunks));
            let deadline = r.state.deadline();
            match tokio::time::timeout_at(deadline.into(), call::unary(a.peer(), chunks, &self.cluster.limits)).await {
                Ok(Ok(response)) => {
                    self.cluster.balancer().succeeded(link.id);
                    return Ok(response);
                }
                Ok(Err(failure)) => self.after_failure(r, &link, failure)?,
                Err(_) => {
                    return Err(Error::unavailable(format!(
                        "model '{}': the request's deadline passed while node '{}' ran it",
                        r.request.model_name, link.name
                    )))
                }
            }
        }
    }

    async fn route_stream(&self, mut request: InferRequest, sink: &StreamSender) -> Result<()> {
        let started = Instant::now();
        let mut r = self.begin(&mut request);
        let result = async {
            loop {
                let mut a = self.attempt(&mut r, true).await?;
                let (link, chunks) = (a.link.clone(), std::mem::take(&mut a.chunks));
                let first_by = r.state.deadline();
                match call::stream(a.peer(), chunks, &self.cluster.limits, sink, first_by).await {
                    Ok(()) => {
                        self.cluster.balancer().succeeded(link.id);
                        return Ok(());
                    }
                    Err((failure, forwarded)) => {
                        for _ in 0..forwarded {
                            r.state.answered();
                        }
                        self.after_failure(&mut r, &link, failure)?;
                    }
                }
            }
        }
        .await;
        self.finish(&r, started, &result);
        result
    }

    /// The generation-stamped view of a model a step or metadata request needs.
    fn cluster_view(&self, name: &str, version: &str) -> Result<ModelView> {
        self.cluster.routing().model_view(name, version)
    }

    /// A router ensemble's plan against the cluster as it is now.
    fn ensemble_plan(&self, name: &str) -> Option<crate::ensembles::Planned> {
        let generation = self.cluster.routing().generation();
        self.ensembles.plan(name, generation, &|m, v| self.cluster_view(m, v))
    }

    /// Whether a router ensemble can serve now: it plans against the cluster and every step model
    /// has a routable replica (else the reason).
    fn ensemble_ready(&self, name: &str) -> Option<std::result::Result<(), String>> {
        let plan = match self.ensemble_plan(name)? {
            Ok(plan) => plan,
            Err(why) => return Some(Err(why)),
        };
        let table = self.cluster.routing();
        let missing: Vec<String> = plan
            .steps
            .iter()
            .filter(|step| !table.model_view(&step.model, &step.version).is_ok_and(|v| v.ready))
            .map(|step| format!("step model '{}' has no ready replica", step.model))
            .collect();
        Some(if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        })
    }

    /// Runs a router ensemble: its steps go through this Dispatch, each wherever its model is served.
    async fn run_ensemble(&self, request: InferRequest) -> Result<InferResponse> {
        let name = request.model_name.clone();
        let plan = match self.ensemble_plan(&name) {
            Some(Ok(plan)) => plan,
            Some(Err(why)) => return Err(Error::unavailable(format!("ensemble '{name}' is not ready: {why}"))),
            None => return Err(Error::not_found(format!("unknown model: '{name}' is not found"))),
        };
        let Some(ensemble) = self.ensembles.get(&name) else {
            return Err(Error::not_found(format!("unknown model: '{name}' is not found")));
        };
        let started = Instant::now();
        let wanted = mesh::classify::wanted(&request.outputs);
        let checked = mesh::validate::check_request(&ensemble.config, &request)
            .and_then(|()| mesh::classify::check(&ensemble.config, &request.outputs, false));
        let result = match checked {
            Ok(()) => mesh::ensemble::run(&plan, self, request).await.and_then(|mut r| {
                mesh::classify::apply(&mut r, &wanted, &ensemble.config, &ensemble.labels).map(|()| r)
            }),
            Err(e) => Err(e),
        };
        self.ensembles.record(&name, result.is_ok(), started.elapsed());
        result.map(|mut r| {
            r.model_version = ensemble.version.to_string();
            r
        })
    }
}

#[async_trait]
impl Dispatch for RouterDispatch {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        // Refused here as a node would refuse it: one rule per parameter (mesh::params).
        mesh::params::check(&request.parameters)?;
        if self.ensembles.get(&request.model_name).is_some() {
            return self.run_ensemble(request).await;
        }
        self.route_unary(request).await
    }

    async fn infer_stream(&self, request: InferRequest, sink: StreamSender) {
        if let Err(e) = mesh::params::check(&request.parameters) {
            let _ = sink.send(StreamItem::new(Some(Err(e)), true));
            return;
        }
        if let Some(ensemble) = self.ensembles.get(&request.model_name) {
            // An ensemble with a decoupled step streams each of its answers.
            if let Some(Ok(plan)) = self.ensemble_plan(&request.model_name) {
                if plan.decoupled {
                    match mesh::validate::check_request(&ensemble.config, &request) {
                        Ok(()) => mesh::ensemble::run_stream(&plan, self, request, sink).await,
                        Err(e) => drop(sink.send(StreamItem::new(Some(Err(e)), true))),
                    }
                    return;
                }
            }
            let response = self.infer(request).await;
            let _ = sink.send(StreamItem::new(Some(response), true));
            return;
        }
        if let Err(e) = self.route_stream(request, &sink).await {
            let _ = sink.send(StreamItem::new(Some(Err(e)), true));
        }
    }

    /// Ready when at least one node serves a ready model.
    fn ready(&self) -> bool {
        self.cluster.routing().ready()
    }

    fn model(&self, name: &str, version: &str) -> Result<ModelView> {
        if let Some(e) = self.ensembles.get(name) {
            let ready = matches!(self.ensemble_ready(name), Some(Ok(())));
            return self.ensembles.view(e, ready, version);
        }
        self.cluster_view(name, version)
    }

    fn repository_index(&self) -> Vec<IndexEntry> {
        let table = self.cluster.routing();
        let mut rows: Vec<IndexEntry> = table.index().iter().map(|r| r.entry()).collect();
        for name in self.ensembles.names() {
            let Some(e) = self.ensembles.get(name) else { continue };
            let (state, reason) = match self.ensemble_ready(name) {
                Some(Ok(())) => ("READY", String::new()),
                Some(Err(why)) => ("UNAVAILABLE", why),
                None => continue,
            };
            rows.push(IndexEntry {
                name: name.clone(),
                version: e.version.to_string(),
                state: state.into(),
                reason,
                nodes: vec![],
            });
        }
        self.placement.index_rows(&mut rows);
        rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.version.cmp(&b.version)));
        rows
    }

    /// Each node's statistics of the model, summed per version (router ensembles add their own).
    async fn model_statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        if let Some(e) = self.ensembles.get(name) {
            self.ensembles.view(e, true, version)?;
            return Ok(ModelStatisticsResponse {
                model_stats: vec![self.ensembles.statistics(e)],
            });
        }
        let links: Vec<Arc<Link>> = if name.is_empty() {
            self.cluster.links()
        } else {
            self.cluster_view(name, version)?;
            let nodes = self.cluster.membership().nodes(Instant::now());
            nodes
                .iter()
                .filter(|n| n.models.iter().any(|m| m.name == name))
                .filter_map(|n| n.link.and_then(|l| self.cluster.link(l)))
                .collect()
        };
        let asks = links.iter().map(|link| async move {
            let peer_name = format!("node '{}'", link.name);
            let peer = Peer {
                conn: &link.conn,
                name: &peer_name,
            };
            let answer = tokio::time::timeout(
                Duration::from_secs(5),
                call::stats(peer, name, version, &self.cluster.limits),
            )
            .await;
            match answer {
                Ok(Ok(s)) => Some(s),
                Ok(Err(e)) => {
                    tracing::debug!(node = %link.name, "statistics query failed: {e}");
                    None
                }
                Err(_) => None,
            }
        });
        let answers = futures::future::join_all(asks).await.into_iter().flatten();
        let mut merged = crate::stats::merge(answers);
        if name.is_empty() {
            for n in self.ensembles.names() {
                if let Some(e) = self.ensembles.get(n) {
                    merged.model_stats.push(self.ensembles.statistics(e));
                }
            }
        }
        Ok(merged)
    }

    /// Places a model of the cluster repository (with its config and `file:` overrides); answers
    /// once a replica is ready.
    async fn load_model(&self, name: &str, options: mesh::LoadOptions) -> Result<()> {
        self.placement.mode.check_explicit("load", name)?;
        mesh::repository::check_model_name(name)?;
        if self.placement.repo.roots.is_empty() || self.ensembles.get(name).is_some() {
            return Err(model_control(name, "load"));
        }
        self.placement
            .load(name, options, self.cluster.route.request_timeout)
            .await
    }

    /// Removes a placed model from every node; answers once none holds it.
    async fn unload_model(&self, name: &str, _: bool) -> Result<()> {
        self.placement.mode.check_explicit("unload", name)?;
        mesh::repository::check_model_name(name)?;
        let in_repository = || crate::repository::scan(&self.placement.repo.roots).0.contains_key(name);
        if !self.placement.repo.contains(name) && !in_repository() {
            return Err(model_control(name, "unload"));
        }
        self.placement.unload(name, self.cluster.route.request_timeout).await
    }

    fn extensions(&self) -> Vec<&'static str> {
        vec![
            "binary_tensor_data",
            "model_configuration",
            "parameters",
            "statistics",
            "schedule_policy",
            "classification",
            "logging",
            "system_shared_memory",
            "cuda_shared_memory",
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::Replica;
    use mesh::Param;

    fn replica(link: u64, node: &str) -> Replica {
        Replica {
            link,
            node: node.into(),
            inflight: 0,
            queued: 0,
            exec_us: 0,
        }
    }

    #[test]
    fn a_sequence_stays_on_its_node_and_only_its_node_leaving_moves_it() {
        let three = [replica(1, "a"), replica(2, "b"), replica(3, "c")];
        let mut on = std::collections::BTreeMap::new();
        for seq in 0..300 {
            let seq = seq.to_string();
            let first = pinned(&seq, &three).unwrap();
            assert_eq!(pinned(&seq, &three), Some(first), "the same node every time");
            // The order replicas come in does not matter.
            let reversed: Vec<Replica> = three.iter().rev().cloned().collect();
            assert_eq!(pinned(&seq, &reversed), Some(first));
            *on.entry(first).or_insert(0) += 1;
            // Node c leaving moves only c's sequences; a and b keep theirs.
            let two = [replica(1, "a"), replica(2, "b")];
            if first != 3 {
                assert_eq!(
                    pinned(&seq, &two),
                    Some(first),
                    "sequence {seq} moved off a staying node"
                );
            }
        }
        assert!(on.values().all(|&n| n > 60), "sequences spread over the nodes: {on:?}");
        assert_eq!(pinned("7", &[]), None);
    }

    #[test]
    fn sequence_ids_are_read_as_tritonclient_sends_them() {
        let with = |v: Param| InferRequest {
            parameters: vec![("sequence_id".into(), v)],
            ..Default::default()
        };
        assert_eq!(sequence_of(&with(Param::Uint(42))).as_deref(), Some("42"));
        assert_eq!(
            sequence_of(&with(Param::Int(-3))),
            None,
            "refused on entry, as a node refuses it"
        );
        assert_eq!(sequence_of(&with(Param::String("s1".into()))).as_deref(), Some("'s1'"));
        assert_ne!(
            sequence_of(&with(Param::String("1".into()))),
            sequence_of(&with(Param::Uint(1)))
        );
        assert_eq!(sequence_of(&with(Param::Uint(0))), None, "0 means no sequence");
        assert_eq!(sequence_of(&with(Param::String(String::new()))), None);
        assert_eq!(sequence_of(&InferRequest::default()), None);
    }
}
