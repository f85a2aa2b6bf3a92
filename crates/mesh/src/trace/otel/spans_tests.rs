//! Tests of the span assembly: Triton's span trees (a model, an ensemble, BLS), names, events,
//! attributes, times, the client's context as the root's parent, and when the root ends.
use std::collections::BTreeMap;

use opentelemetry::trace::TraceState;
use opentelemetry::Value;

use super::*;
use crate::trace::otel::context::{extract, Carrier};

const NOW: Clock = Clock {
    unix_ns: 1_700_000_000_000_000_000,
    steady_ns: 1_000,
};

fn trace(id: u64, model: &str, parent: Option<u64>, computed: bool) -> Trace {
    let mut stamps = vec![("REQUEST_START", 1_100), ("QUEUE_START", 1_200)];
    if computed {
        stamps.extend([
            ("COMPUTE_START", 1_300),
            ("COMPUTE_INPUT_END", 1_400),
            ("COMPUTE_OUTPUT_START", 1_500),
            ("COMPUTE_END", 1_600),
        ]);
    }
    stamps.extend([("REQUEST_END", 1_700), ("INFER_RESPONSE_COMPLETE", 1_700)]);
    Trace {
        id,
        model: model.into(),
        version: 1,
        request_id: if parent.is_none() { "req".into() } else { String::new() },
        parent_id: parent,
        stamps,
    }
}

fn names(span: &SpanData) -> Vec<&str> {
    span.events.iter().map(|e| &*e.name).collect()
}

fn front() -> Vec<(&'static str, u64)> {
    vec![
        ("HTTP_RECV_START", 900),
        ("HTTP_RECV_END", 1_000),
        ("HTTP_SEND_START", 1_800),
        ("HTTP_SEND_END", 1_900),
    ]
}

/// parent name -> sorted children names, as Triton's unittest checks nesting.
fn nesting(spans: &[Ended]) -> BTreeMap<String, Vec<String>> {
    let by_id: HashMap<SpanId, &str> = spans
        .iter()
        .map(|e| (e.span.span_context.span_id(), &*e.span.name))
        .collect();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in spans {
        if let Some(parent) = by_id.get(&e.span.parent_span_id) {
            out.entry(parent.to_string()).or_default().push(e.span.name.to_string());
        }
    }
    out.values_mut().for_each(|v| v.sort());
    out
}

fn tree(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
        .collect()
}

#[test]
fn a_model_is_three_spans_and_the_root_waits_for_the_frontend() {
    let mut reg = Registry::default();
    reg.root(1, None, true, NOW);
    let mut spans = reg.finish(&trace(1, "simple", None, true));
    assert_eq!(
        spans.iter().map(|e| &*e.span.name).collect::<Vec<_>>(),
        ["compute", "simple"]
    );
    assert!(spans.iter().all(|e| !e.last && e.request == 1));
    let root = reg.front_done(1, &front(), 1_950, true).expect("the root ends now");
    assert!(root.last);
    spans.push(root);
    assert!(reg.is_empty());
    assert_eq!(
        nesting(&spans),
        tree(&[("InferRequest", &["simple"]), ("simple", &["compute"])])
    );
    let [compute, model, root] = [&spans[0].span, &spans[1].span, &spans[2].span];
    assert_eq!(names(compute), COMPUTE_EVENTS);
    assert_eq!(names(model), MODEL_EVENTS);
    assert_eq!(
        names(root),
        [
            "HTTP_RECV_START",
            "HTTP_RECV_END",
            "INFER_RESPONSE_COMPLETE",
            "HTTP_SEND_START",
            "HTTP_SEND_END"
        ]
    );
    assert_eq!(root.parent_span_id, SpanId::INVALID);
    assert!(!root.parent_span_is_remote);
    let trace_id = root.span_context.trace_id();
    assert!(spans.iter().all(|e| e.span.span_context.trace_id() == trace_id));
    assert!(spans
        .iter()
        .all(|e| e.span.span_kind == SpanKind::Server && e.span.status == Status::Unset));
    assert!(spans.iter().all(|e| e.span.instrumentation_scope.name() == SCOPE));
    // Times: steady ns placed on the Unix clock of the moment it was sampled.
    let unix = |ns: u64| UNIX_EPOCH + Duration::from_nanos((NOW.unix_ns - 1_000 + ns as i128) as u64);
    assert_eq!((root.start_time, root.end_time), (unix(900), unix(1_950)));
    assert_eq!((model.start_time, model.end_time), (unix(1_100), unix(1_700)));
    assert_eq!((compute.start_time, compute.end_time), (unix(1_300), unix(1_600)));
    // Triton's attributes, on the model span only.
    let attrs: HashMap<&str, Value> = model
        .attributes
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.clone()))
        .collect();
    assert_eq!(attrs["triton.model_name"], Value::from("simple"));
    assert_eq!(attrs["triton.model_version"], Value::I64(1));
    assert_eq!(attrs["triton.trace_id"], Value::I64(1));
    assert_eq!(attrs["triton.trace_parent_id"], Value::I64(0));
    assert_eq!(attrs["triton.request_id"], Value::from("req"));
    assert!(compute.attributes.is_empty() && root.attributes.is_empty());
}

#[test]
fn bls_calls_and_ensemble_steps_hang_under_their_callers_model_span() {
    let mut reg = Registry::default();
    reg.root(1, None, true, NOW);
    assert!(reg.child(2, 1), "the ensemble the BLS model calls");
    assert!(reg.child(3, 2), "the ensemble's step");
    let mut spans = reg.finish(&trace(3, "simple", Some(2), true));
    spans.extend(reg.finish(&trace(2, "ensemble_add_sub_int32_int32_int32", Some(1), false)));
    spans.extend(reg.finish(&trace(1, "bls_simple", None, true)));
    spans.extend(reg.front_done(1, &front(), 2_000, true));
    assert_eq!(spans.len(), 6);
    assert_eq!(
        nesting(&spans),
        tree(&[
            ("InferRequest", &["bls_simple"]),
            ("bls_simple", &["compute", "ensemble_add_sub_int32_int32_int32"]),
            ("ensemble_add_sub_int32_int32_int32", &["simple"]),
            ("simple", &["compute"]),
        ])
    );
    let ensemble = spans.iter().find(|e| e.span.name.starts_with("ensemble")).unwrap();
    assert_eq!(
        names(&ensemble.span),
        MODEL_EVENTS,
        "no compute of its own, no response event"
    );
    let parent_attr = ensemble
        .span
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "triton.trace_parent_id")
        .unwrap();
    assert_eq!(parent_attr.value, Value::I64(1));
    assert!(!ensemble
        .span
        .attributes
        .iter()
        .any(|kv| kv.key.as_str() == "triton.request_id"));
    let root = spans.last().unwrap();
    assert_eq!(
        names(&root.span)
            .iter()
            .filter(|n| **n == "INFER_RESPONSE_COMPLETE")
            .count(),
        1,
        "only the client's request completes a response"
    );
    assert!(!reg.child(4, 1), "a finished request takes no more children");
}

#[test]
fn the_clients_context_is_the_roots_parent() {
    let carrier = Carrier {
        traceparent: Some("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01".into()),
        tracestate: Some("k=v".into()),
    };
    let mut reg = Registry::default();
    reg.root(7, extract(&carrier), true, NOW);
    let context = reg.context(7).unwrap();
    assert!(
        context.starts_with(r#"{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-"#),
        "{context}"
    );
    assert!(context.ends_with(r#"-01","tracestate":"k=v"}"#), "{context}");
    let model = reg.finish(&trace(7, "simple", None, true)).pop().unwrap().span;
    assert!(
        context.contains(&model.span_context.span_id().to_string()),
        "the model span's id"
    );
    let root = reg.front_done(7, &[], 2_000, true).unwrap().span;
    assert_eq!(
        root.span_context.trace_id().to_string(),
        "0af7651916cd43dd8448eb211c12666c"
    );
    assert_eq!(root.parent_span_id.to_string(), "b7ad6b7169242424");
    assert!(root.parent_span_is_remote);
    assert_eq!(root.span_context.trace_state(), &"k=v".parse::<TraceState>().unwrap());
    assert_eq!(reg.context(7), None, "gone with its request");
}

#[test]
fn without_a_frontend_the_root_ends_with_the_last_trace_and_a_frontend_may_finish_first() {
    let mut reg = Registry::default();
    reg.root(1, None, false, NOW);
    let spans = reg.finish(&trace(1, "simple", None, true));
    assert_eq!(spans.len(), 3);
    assert!(spans[2].last && &*spans[2].span.name == ROOT);
    assert_eq!(names(&spans[2].span), ["INFER_RESPONSE_COMPLETE"]);

    // A client that went away: the frontend is done before the request's trace ends.
    reg.root(2, None, true, NOW);
    let cancelled = [("GRPC_WAITREAD_START", 900), ("GRPC_WAITREAD_END", 1_000)];
    assert!(
        reg.front_done(2, &cancelled, 1_500, false).is_none(),
        "its trace still runs"
    );
    let mut t = trace(2, "input_all_required", None, false);
    t.stamps.retain(|s| s.0 != "QUEUE_START");
    let spans = reg.finish(&t);
    let root = spans.last().unwrap();
    assert!(root.last);
    assert_eq!(
        names(&root.span),
        ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"],
        "no answer completed"
    );
    assert!(reg.is_empty());
    assert!(
        reg.finish(&trace(9, "unknown", None, true)).is_empty(),
        "not traced here"
    );
}

#[test]
fn spans_opened_as_things_happen_nest_and_the_root_waits_for_them() {
    let mut r = Registry::new("mesh-router");
    let remote = extract(&Carrier {
        traceparent: Some("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01".into()),
        tracestate: Some("k=v".into()),
    });
    r.root(7, remote, true, NOW);
    let mut route = r.open(7, None, ("route".into(), SpanKind::Internal), 1_100).unwrap();
    route.attributes.push(KeyValue::new("mesh.attempts", 1));
    let mut attempt = r
        .open(7, Some(route.span), ("attempt".into(), SpanKind::Client), 1_200)
        .unwrap();
    attempt.events.push(("SENT", 1_250));
    let (attempt_id, route_id) = (attempt.span, route.span);
    let mut ended = r.close(attempt, 1_500);
    ended.extend(r.close(route, 1_600));
    assert_eq!(ended.len(), 2, "the root waits for its own part and its frontend");
    assert!(r.release(7).is_none(), "the frontend has not answered yet");
    let root = r.front_done(7, &front(), 1_900, true).expect("the root ends last");
    assert!(root.last && r.is_empty());
    let (a, route) = (&ended[0].span, &ended[1].span);
    assert_eq!((&*a.name, a.span_kind.clone()), ("attempt", SpanKind::Client));
    assert_eq!(a.parent_span_id, route_id);
    assert_eq!(a.span_context.span_id(), attempt_id);
    assert_eq!(names(a), ["SENT"]);
    assert_eq!(route.parent_span_id, root.span.span_context.span_id());
    assert_eq!(route.span_kind, SpanKind::Internal);
    assert_eq!(route.attributes, [KeyValue::new("mesh.attempts", 1)]);
    assert_eq!(route.instrumentation_scope.name(), "mesh-router");
    let trace = root.span.span_context.trace_id();
    assert_eq!(trace.to_string(), "0af7651916cd43dd8448eb211c12666c");
    assert!(ended
        .iter()
        .all(|e| e.span.span_context.trace_id() == trace && e.request == 7));
    assert_eq!(a.span_context.trace_state().header(), "k=v");
    assert_eq!(a.end_time.duration_since(a.start_time).unwrap().as_nanos(), 300);
}

#[test]
fn a_request_without_a_frontend_ends_when_its_part_and_spans_are_done() {
    let mut r = Registry::default();
    r.root(3, None, false, NOW);
    let span = r.open(3, None, ("route".into(), SpanKind::Internal), 1_100).unwrap();
    assert!(r.release(3).is_none(), "an open span holds the root");
    let ended = r.close(span, 1_200);
    assert_eq!(ended.len(), 2);
    assert!(ended[1].last && ended[1].span.name == ROOT);
    assert!(
        r.open(3, None, ("late".into(), SpanKind::Internal), 1_300).is_none(),
        "gone"
    );
}

#[test]
fn a_traces_model_span_is_the_context_a_call_on_its_behalf_continues() {
    let mut r = Registry::default();
    r.root(1, None, false, NOW);
    let carrier = r.carrier(1).unwrap();
    assert_eq!(carrier.tracestate, None, "the client sent none");
    let remote = extract(&carrier).expect("a valid W3C context");
    let ended = r.finish(&trace(1, "bls", None, true));
    let model = ended.iter().find(|e| e.span.name == "bls").unwrap();
    assert_eq!(remote.span_id, model.span.span_context.span_id());
    assert_eq!(remote.trace_id, model.span.span_context.trace_id());
    assert!(r.carrier(1).is_none(), "finished");
}
