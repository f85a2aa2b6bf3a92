//! The spans of traced requests, as tritonserver 2.51 makes them in OpenTelemetry mode, assembled
//! from the timestamps each finished trace brings (sans-IO: times come in, spans go out).
//!
//! A client's sampled request is one OpenTelemetry trace: a root span `InferRequest` (the child of
//! the client's span when it sent a `traceparent`) holding the frontend's timestamps as events;
//! under it a span named after the model holding `REQUEST_START`, `QUEUE_START`, `REQUEST_END`
//! (and Triton's attributes), and under that a `compute` span holding the four `COMPUTE_*` events.
//! A request made on behalf of a traced one (an ensemble's step, a BLS call made with
//! `trace=request.trace()`) is its child trace: its model span hangs under its parent's model span.
//! Every span is a SERVER span of the scope `triton-server`, sampled, its status unset. Spans end
//! as their trace finishes (compute first, then the model); the root ends last, once the
//! frontend has answered and every trace of the request has finished.
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::context::{carrier_of, python_context, Carrier, Remote};
use crate::trace::Trace;

/// The instrumentation scope of every span (tritonserver's tracer name).
pub const SCOPE: &str = "triton-server";
/// The root span's name.
pub const ROOT: &str = "InferRequest";

const MODEL_EVENTS: [&str; 3] = ["REQUEST_START", "QUEUE_START", "REQUEST_END"];
const COMPUTE_EVENTS: [&str; 4] = [
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
];
/// The node's stamp that belongs to the frontend's root span.
const RESPONSE_COMPLETE: &str = "INFER_RESPONSE_COMPLETE";

/// A span that ended: the request it belongs to (its root trace's id) and whether it is that
/// request's last (its root).
#[derive(Debug, Clone)]
pub struct Ended {
    pub request: u64,
    pub span: SpanData,
    pub last: bool,
}

/// Now, on both clocks: the Unix time in ns and the monotonic ns of `mesh::trace::ns`.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub unix_ns: i128,
    pub steady_ns: u64,
}

/// One client's request being traced.
struct Request {
    trace_id: TraceId,
    root: SpanId,
    remote: Option<SpanId>,
    state: TraceState,
    /// Unix ns minus monotonic ns, taken when it was sampled.
    offset: i128,
    start: u64,
    end: u64,
    /// The root span's events (the frontend's, and the answer's completion).
    events: Vec<(&'static str, u64)>,
    /// Its traces still running (its own and its children).
    live: usize,
    /// A frontend serves it and ends the root when it has answered.
    fronted: bool,
    /// Its client went away before the answer: no response completes.
    cancelled: bool,
    /// Its traces' ids.
    traces: Vec<u64>,
}

/// One trace (Triton's trace id): the request it is part of, its model span, its parent trace.
struct Node {
    request: u64,
    span: SpanId,
    parent: Option<u64>,
}

/// The requests being traced and their traces.
pub struct Registry {
    requests: HashMap<u64, Request>,
    traces: HashMap<u64, Node>,
    scope: InstrumentationScope,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(SCOPE)
    }
}

/// A span this process opens as things happen (a router's routing, waits and attempts), under
/// its request's root or another open span, and ends with [`Registry::close`]: its request's root
/// waits for it.
#[derive(Debug)]
pub struct Open {
    pub(super) request: u64,
    pub trace_id: TraceId,
    pub span: SpanId,
    parent: SpanId,
    name: Cow<'static, str>,
    kind: SpanKind,
    start: u64,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<(&'static str, u64)>,
    pub state: TraceState,
}

fn span_id() -> SpanId {
    SpanId::from_bytes(rand::random::<u64>().max(1).to_be_bytes())
}

fn trace_id() -> TraceId {
    TraceId::from_bytes(rand::random::<u128>().max(1).to_be_bytes())
}

/// Timestamps (monotonic ns) as span events at their Unix times.
fn events_at<'a>(
    offset: i128,
    stamps: impl IntoIterator<Item = &'a (&'static str, u64)>,
) -> Vec<opentelemetry::trace::Event> {
    stamps
        .into_iter()
        .map(|&(n, t)| opentelemetry::trace::Event::new(n, at(offset, t), Vec::new(), 0))
        .collect()
}

fn at(offset: i128, steady: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos((steady as i128 + offset).clamp(0, u64::MAX as i128) as u64)
}

impl Registry {
    /// An empty registry whose spans are of the instrumentation scope `scope`.
    pub fn new(scope: &'static str) -> Self {
        Registry {
            requests: HashMap::new(),
            traces: HashMap::new(),
            scope: InstrumentationScope::builder(scope).build(),
        }
    }

    /// Opens a span of request `request` (its root trace's id) named `name`, under `parent` (None:
    /// the request's root), at `now` (steady ns). None when the request is not traced here.
    pub fn open(
        &mut self,
        request: u64,
        parent: Option<SpanId>,
        (name, kind): (Cow<'static, str>, SpanKind),
        now: u64,
    ) -> Option<Open> {
        let r = self.requests.get_mut(&request)?;
        r.live += 1;
        Some(Open {
            request,
            trace_id: r.trace_id,
            span: span_id(),
            parent: parent.unwrap_or(r.root),
            name,
            kind,
            start: now,
            attributes: Vec::new(),
            events: Vec::new(),
            state: r.state.clone(),
        })
    }

    /// Ends `open` at `now`: the span, and its request's root when nothing else holds it.
    pub fn close(&mut self, open: Open, now: u64) -> Vec<Ended> {
        let Some(r) = self.requests.get_mut(&open.request) else {
            return Vec::new();
        };
        r.live = r.live.saturating_sub(1);
        r.end = r.end.max(now);
        let r = &self.requests[&open.request];
        let mut span = self.span(r, open.name.into_owned(), (open.span, open.parent), (open.start, now));
        span.span_kind = open.kind;
        span.attributes = open.attributes;
        span.events.events = events_at(r.offset, &open.events);
        let mut ended = vec![Ended {
            request: open.request,
            span,
            last: false,
        }];
        ended.extend(self.close_if_done(open.request));
        ended
    }

    /// Request `id`'s own trace is done without stamps of its own (a router's request, whose spans
    /// are the ones it opened): its root ends when nothing else holds it.
    pub fn release(&mut self, id: u64) -> Option<Ended> {
        let r = self.requests.get_mut(&id)?;
        r.live = r.live.saturating_sub(1);
        self.close_if_done(id)
    }

    /// The W3C context of trace `id`'s model span: what a request made on its behalf on another
    /// server continues.
    pub fn carrier(&self, id: u64) -> Option<Carrier> {
        let (r, span) = self.model_span(id)?;
        Some(carrier_of(r.trace_id, span, &r.state))
    }

    /// Trace `id`'s request and model span.
    fn model_span(&self, id: u64) -> Option<(&Request, SpanId)> {
        let node = self.traces.get(&id)?;
        Some((self.requests.get(&node.request)?, node.span))
    }

    /// Starts tracing a client's request, sampled now as trace `id`; `remote` is the client's
    /// span, `fronted` that a frontend will end the root ([`Registry::front_done`]).
    pub fn root(&mut self, id: u64, remote: Option<Remote>, fronted: bool, now: Clock) {
        let (trace_id, parent, state) = match remote {
            Some(r) => (r.trace_id, Some(r.span_id), r.state),
            None => (trace_id(), None, TraceState::default()),
        };
        self.requests.insert(
            id,
            Request {
                trace_id,
                root: span_id(),
                remote: parent,
                state,
                offset: now.unix_ns - now.steady_ns as i128,
                start: now.steady_ns,
                end: now.steady_ns,
                events: Vec::new(),
                live: 1,
                fronted,
                cancelled: false,
                traces: vec![id],
            },
        );
        self.traces.insert(
            id,
            Node {
                request: id,
                span: span_id(),
                parent: None,
            },
        );
    }

    /// Traces `id` as the child of trace `parent` (false: the parent's request is not traced here).
    pub fn child(&mut self, id: u64, parent: u64) -> bool {
        let Some(request) = self.traces.get(&parent).map(|n| n.request) else {
            return false;
        };
        let Some(r) = self.requests.get_mut(&request) else {
            return false;
        };
        r.live += 1;
        r.traces.push(id);
        self.traces.insert(
            id,
            Node {
                request,
                span: span_id(),
                parent: Some(parent),
            },
        );
        true
    }

    /// The context a Python model of trace `id` is given (`request.trace().get_context()`).
    pub fn context(&self, id: u64) -> Option<String> {
        let (r, span) = self.model_span(id)?;
        Some(python_context(r.trace_id, span, &r.state))
    }

    /// Whether any request is being traced.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    fn span(&self, r: &Request, name: String, ids: (SpanId, SpanId), times: (u64, u64)) -> SpanData {
        let (id, parent) = ids;
        SpanData {
            span_context: SpanContext::new(r.trace_id, id, TraceFlags::SAMPLED, false, r.state.clone()),
            parent_span_id: parent,
            parent_span_is_remote: id == r.root && r.remote.is_some(),
            span_kind: SpanKind::Server,
            name: Cow::Owned(name),
            start_time: at(r.offset, times.0),
            end_time: at(r.offset, times.1.max(times.0)),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: self.scope.clone(),
        }
    }

    /// The spans of a finished trace (its compute span, if it ran, then its model span), and
    /// the root span too when this was the last thing its request waited for.
    pub fn finish(&mut self, trace: &Trace) -> Vec<Ended> {
        let Some(node) = self.traces.get(&trace.id) else {
            return Vec::new();
        };
        let Some(r) = self.requests.get(&node.request) else {
            return Vec::new();
        };
        let parent_span = match node.parent {
            None => r.root,
            Some(p) => self.traces.get(&p).map_or(r.root, |n| n.span),
        };
        let mut stamps = trace.stamps.clone();
        stamps.sort_by_key(|&(_, t)| t);
        let first = stamps.first().map_or(r.start, |s| s.1);
        let last = stamps.last().map_or(first, |s| s.1);
        let stamp = |name: &str| stamps.iter().find(|(n, _)| *n == name).map(|s| s.1);
        let events = |names: &[&str]| {
            let mut events = SpanEvents::default();
            events.events = events_at(r.offset, stamps.iter().filter(|(n, _)| names.contains(n)));
            events
        };
        let mut out = Vec::new();
        if let Some(start) = stamp("COMPUTE_START") {
            let end = stamp("COMPUTE_END").unwrap_or(last);
            let mut compute = self.span(r, "compute".into(), (span_id(), node.span), (start, end));
            compute.events = events(&COMPUTE_EVENTS);
            out.push(compute);
        }
        let times = (
            stamp("REQUEST_START").unwrap_or(first),
            stamp("REQUEST_END").unwrap_or(last),
        );
        let mut model = self.span(r, trace.model.clone(), (node.span, parent_span), times);
        let known: Vec<&str> = COMPUTE_EVENTS.iter().chain([&RESPONSE_COMPLETE]).copied().collect();
        let others: Vec<&str> = stamps
            .iter()
            .map(|s| s.0)
            .filter(|n| MODEL_EVENTS.contains(n) || !known.contains(n))
            .collect();
        model.events = events(&others);
        model.attributes = vec![
            KeyValue::new("triton.model_name", trace.model.clone()),
            KeyValue::new("triton.model_version", trace.version),
            KeyValue::new("triton.trace_id", trace.id as i64),
            KeyValue::new("triton.trace_parent_id", trace.parent_id.unwrap_or(0) as i64),
        ];
        if !trace.request_id.is_empty() {
            model
                .attributes
                .push(KeyValue::new("triton.request_id", trace.request_id.clone()));
        }
        out.push(model);
        let request = node.request;
        let r = self.requests.get_mut(&request).expect("looked up above");
        if trace.parent_id.is_none() && !r.cancelled {
            r.events.extend(stamps.iter().filter(|s| s.0 == RESPONSE_COMPLETE));
        }
        r.end = r.end.max(last);
        r.live = r.live.saturating_sub(1);
        let mut ended: Vec<Ended> = out
            .into_iter()
            .map(|span| Ended {
                request,
                span,
                last: false,
            })
            .collect();
        ended.extend(self.close_if_done(request));
        ended
    }

    /// The frontend serving request `id` has answered (`answered`), or its client went away, at
    /// `now` (steady ns), with its own timestamps: the root's events. Ends the root if nothing
    /// else runs.
    pub fn front_done(&mut self, id: u64, stamps: &[(&'static str, u64)], now: u64, answered: bool) -> Option<Ended> {
        let r = self.requests.get_mut(&id)?;
        if !answered {
            r.cancelled = true;
            r.events.retain(|s| s.0 != RESPONSE_COMPLETE);
        }
        r.events.extend_from_slice(stamps);
        r.end = r.end.max(now);
        r.fronted = false;
        self.close_if_done(id)
    }

    fn close_if_done(&mut self, id: u64) -> Option<Ended> {
        let r = self.requests.get(&id)?;
        if r.live > 0 || r.fronted {
            return None;
        }
        let r = self.requests.remove(&id)?;
        for t in &r.traces {
            self.traces.remove(t);
        }
        let mut stamps = r.events.clone();
        stamps.sort_by_key(|&(_, t)| t);
        let start = stamps.first().map_or(r.start, |s| s.1.min(r.start));
        let end = stamps.last().map_or(r.end, |s| s.1.max(r.end));
        let mut root = self.span(
            &r,
            ROOT.into(),
            (r.root, r.remote.unwrap_or(SpanId::INVALID)),
            (start, end),
        );
        root.events.events = events_at(r.offset, &stamps);
        Some(Ended {
            request: id,
            span: root,
            last: true,
        })
    }
}

#[cfg(test)]
#[path = "spans_tests.rs"]
mod tests;
