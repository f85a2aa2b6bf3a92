//! Forwarding a request to a node: the routing rules ([`Attempts`]) choose each attempt's link,
//! the link carries it (one QUIC stream), and a failed attempt goes where the rules say, within the
//! request's deadline.
use std::sync::Arc;
use std::time::Instant;

use mesh::cluster::call::{self, Peer};
use mesh::cluster::convert::request_frame;
use mesh::sync::Locked;
use mesh::trace::otel::live::{KeyValue, Span, SpanKind};
use mesh::{Error, InferRequest, InferResponse, Result, StreamSender};

use super::traced::{self, Trace};
use super::RouterDispatch;
use crate::metrics;
use crate::route::{Attempts, Decision, Failure, Step, View};
use crate::shared::{InflightPermit, Link};

/// The request's sequence, when it belongs to one (stateful: pinned to one node, never moved).
pub(super) fn sequence_of(request: &InferRequest) -> Option<String> {
    mesh::params::sequence_id(&request.parameters)
        .ok()
        .flatten()
        .map(|id| id.to_string())
}

/// One attempt on its way to a node: the link, the encoded request, its place in the link's
/// in-flight count (released when the attempt ends), and its span (the link hop).
struct Attempt {
    link: Arc<Link>,
    chunks: Vec<bytes::Bytes>,
    name: String,
    _permit: InflightPermit,
    span: Span,
}

impl Attempt {
    fn peer(&self) -> Peer<'_> {
        Peer {
            conn: &self.link.conn,
            name: &self.name,
            out: self.link.out(),
        }
    }
}

impl RouterDispatch {
    fn begin(&self, request: &InferRequest) -> Attempts {
        self.placement.touch(&request.model_name);
        // The request's `timeout` parameter (µs) bounds routing and retries too (checked on entry).
        let timeout = mesh::params::timeout(&request.parameters).ok().flatten();
        self.begin_until(
            request,
            Instant::now() + timeout.unwrap_or(self.view.route.request_timeout),
        )
    }

    /// The routing state of a request to be answered by `deadline`.
    pub(super) fn begin_until(&self, request: &InferRequest, deadline: Instant) -> Attempts {
        Attempts::new(
            &request.model_name,
            &request.model_version,
            sequence_of(request),
            Instant::now(),
            deadline,
            self.view.route.route_wait,
        )
    }

    /// Picks the node for the next attempt and says why; waits (within the deadline and the route
    /// wait, in a `wait for replica` span under `route`) while the model is known but no replica
    /// can take it now.
    async fn choose(&self, r: &mut Attempts, request: &mut InferRequest, route: &Span) -> Result<(Arc<Link>, String)> {
        let mut changes = self.view.subscribe();
        let placing = |m: &str| self.placement.is_placing(m);
        let mut waiting = Span::none();
        let tried = r.state().tried().len();
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            let step = {
                let table = self.view.routing();
                let view = View {
                    table: &table,
                    placing: &placing,
                    inflight: |l| self.view.link(l).map_or(0, |l| l.inflight()),
                };
                r.next(&view, &self.view.balancer(), now, &mut rand::rng())
            };
            let step = match step {
                Step::Send { link, version } => match self.view.link(link) {
                    Some(link) => {
                        let why = route.is_recording().then(|| self.why(r, &version, &link, tried));
                        request.model_version = version;
                        return Ok((link, why.unwrap_or_default()));
                    }
                    None => r.vanished(now),
                },
                other => other,
            };
            match step {
                Step::Wait { until, reason } => {
                    if route.is_recording() && !waiting.is_recording() {
                        waiting = route.child("wait for replica", SpanKind::Internal);
                        waiting.set(KeyValue::new("mesh.wait_reason", reason));
                    }
                    let _ = tokio::time::timeout_at(until.into(), changes.changed()).await;
                }
                Step::Fail(e) => return Err(e),
                // `vanished` only waits or fails; were it ever to answer Send, asking again is safe.
                Step::Send { .. } => {}
            }
        }
    }

    /// Why the balancer's pick went to `link` (for the attempt's span): a sequence's pin, or the
    /// load it compared.
    fn why(&self, r: &Attempts, version: &str, link: &Link, tried: usize) -> String {
        if r.sequence().is_some() {
            return "the request's sequence is pinned to this node".into();
        }
        let table = self.view.routing();
        let Ok(resolved) = table.resolve(r.model(), version) else {
            return String::new();
        };
        let untried = resolved.replicas.len().saturating_sub(tried);
        let queued = resolved
            .replicas
            .iter()
            .find(|p| p.link == link.id)
            .map_or(0, |p| p.queued);
        match untried {
            0 | 1 => format!("the only untried replica of {}", resolved.replicas.len()),
            n => format!(
                "the lower load of two drawn from {n} untried replicas ({} in flight from this router, {queued} queued)",
                link.inflight()
            ),
        }
    }

    /// Picks the next node and encodes the request for it (`stream`: the answers stream back),
    /// with the attempt's span under `route` and its context for the node.
    async fn attempt(
        &self,
        r: &mut Attempts,
        request: &mut InferRequest,
        stream: bool,
        route: &Span,
    ) -> Result<Attempt> {
        let (link, why) = self.choose(r, request, route).await?;
        let mut span = route.child("attempt", SpanKind::Client);
        if span.is_recording() {
            span.set(KeyValue::new("mesh.node", link.name.clone()));
            span.set(KeyValue::new("mesh.attempt", r.state().tried().len() as i64 + 1));
            span.set(KeyValue::new("mesh.pick", why));
            span.set(KeyValue::new("mesh.outcome", traced::CANCELLED));
        }
        let chunks = request_frame(request, stream, span.carrier().as_ref(), &self.view.limits)?;
        r.sent(link.id, &link.name);
        metrics::attempt(&link.name);
        Ok(Attempt {
            name: format!("node '{}'", link.name),
            _permit: link.permit(),
            link,
            chunks,
            span,
        })
    }

    /// What to do after an attempt failed: Ok to try again, or the error for the client (told to
    /// the attempt's span too).
    fn after_failure(&self, r: &mut Attempts, model: &str, a: &mut Attempt, failure: Failure) -> Result<()> {
        let link = a.link.clone();
        let reason = failure.metric_reason();
        let what = a.span.is_recording().then(|| failure.to_string());
        let decision = r.failed(link.id, failure, &mut self.view.balancer(), &self.retry, Instant::now());
        if let Some(what) = what {
            let outcome = match &decision {
                Decision::Retry => format!("retried: {what}"),
                Decision::GiveUp(_) => format!("failed: {what}"),
            };
            a.span.set(KeyValue::new("mesh.outcome", outcome));
        }
        match decision {
            Decision::Retry => {
                if let Some(why) = reason {
                    metrics::retry(why);
                }
                tracing::debug!(model = %model, node = %link.name, "retrying on another node");
                Ok(())
            }
            Decision::GiveUp(e) => Err(e),
        }
    }

    fn finish<T>(&self, r: &Attempts, (model, route): (&str, &mut Span), started: Instant, result: &Result<T>) {
        if route.is_recording() {
            traced::outcome(route, result);
            route.set(KeyValue::new(
                "mesh.model_version",
                r.version().unwrap_or("").to_string(),
            ));
            route.set(KeyValue::new("mesh.attempts", r.state().tried().len() as i64));
        }
        // A name that matched nothing the cluster serves gets no series: a client sending made-up
        // names would grow the metrics registry (and /metrics) without bound. A node, like Triton,
        // keeps statistics only for the models it has.
        if matches!(result, Err(e) if e.code == mesh::Code::NotFound) && r.version().is_none() {
            return;
        }
        let failure = result.as_ref().err().map(|e| e.metric_reason());
        if result.is_ok() && r.failed_over() {
            metrics::failover();
        }
        let took = started.elapsed();
        metrics::request(model, r.version().unwrap_or(""), 1, took, failure);
        self.history
            .locked()
            .record(model, took, result.is_ok(), Instant::now());
    }

    pub(super) async fn route_unary(&self, mut request: InferRequest, trace: &Trace) -> Result<InferResponse> {
        // Held until answered, for retries: charged to the router's budget all that time.
        let _held = self.budget.admit_request(&request)?;
        let started = Instant::now();
        let mut side = self.split(&mut request);
        let mut r = self.begin(&request);
        let shadow = side
            .as_ref()
            .and_then(|s| self.shadow(s, &request, r.sequence().is_some()));
        let mut route = trace.route(&request.model_name, &self.view.id);
        let mut result = self.unary_attempts(&mut r, &mut request, &route).await;
        if let Some(side) = &mut side {
            if let Err(e) = &result {
                if self.to_serving(side, &mut r, &mut request, e) {
                    result = self.unary_attempts(&mut r, &mut request, &route).await;
                }
            }
            self.tally(side, result.as_ref(), r.deadline(), Instant::now());
        }
        if let (Some(shadow), Ok(answer)) = (shadow, &result) {
            // For the comparison, after the answer is ready (a clone shares the tensors' bytes).
            let _ = shadow.send((answer.clone(), started.elapsed()));
        }
        self.finish(&r, (&request.model_name, &mut route), started, &result);
        result
    }

    async fn unary_attempts(
        &self,
        r: &mut Attempts,
        request: &mut InferRequest,
        route: &Span,
    ) -> Result<InferResponse> {
        loop {
            let mut a = self.attempt(r, request, false, route).await?;
            let (link, chunks) = (a.link.clone(), std::mem::take(&mut a.chunks));
            let deadline = r.deadline();
            match tokio::time::timeout_at(deadline.into(), call::unary(a.peer(), chunks, &link.limits)).await {
                Ok(Ok(response)) => {
                    r.succeeded(link.id, &mut self.view.balancer());
                    a.span.set(KeyValue::new("mesh.outcome", "ok"));
                    return Ok(response);
                }
                Ok(Err(failure)) => self.after_failure(r, &request.model_name, &mut a, failure)?,
                Err(_) => {
                    a.span
                        .set(KeyValue::new("mesh.outcome", "failed: the request's deadline passed"));
                    return Err(Error::unavailable(format!(
                        "model '{}': the request's deadline passed while node '{}' ran it",
                        request.model_name, link.name
                    )));
                }
            }
        }
    }

    pub(super) async fn route_stream(
        &self,
        mut request: InferRequest,
        sink: &StreamSender,
        trace: &Trace,
    ) -> Result<()> {
        let _held = self.budget.admit_request(&request)?;
        let started = Instant::now();
        let mut side = self.split(&mut request);
        let mut r = self.begin(&request);
        let mut route = trace.route(&request.model_name, &self.view.id);
        let mut result = self.stream_attempts(&mut r, &mut request, sink, &route).await;
        if let Some(side) = &mut side {
            if let Err(e) = &result {
                if self.to_serving(side, &mut r, &mut request, e) {
                    result = self.stream_attempts(&mut r, &mut request, sink, &route).await;
                }
            }
            self.tally(side, result.as_ref(), r.deadline(), Instant::now());
        }
        self.finish(&r, (&request.model_name, &mut route), started, &result);
        result
    }

    async fn stream_attempts(
        &self,
        r: &mut Attempts,
        request: &mut InferRequest,
        sink: &StreamSender,
        route: &Span,
    ) -> Result<()> {
        loop {
            let mut a = self.attempt(r, request, true, route).await?;
            let (link, chunks) = (a.link.clone(), std::mem::take(&mut a.chunks));
            let first_by = r.deadline();
            match call::stream(a.peer(), chunks, &link.limits, sink, first_by).await {
                Ok(()) => {
                    r.succeeded(link.id, &mut self.view.balancer());
                    a.span.set(KeyValue::new("mesh.outcome", "ok"));
                    return Ok(());
                }
                Err((failure, forwarded)) => {
                    for _ in 0..forwarded {
                        r.answered();
                    }
                    self.after_failure(r, &request.model_name, &mut a, failure)?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::Param;

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
