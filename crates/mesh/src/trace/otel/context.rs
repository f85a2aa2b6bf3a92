//! The W3C trace context a client sends with a request (`traceparent`, `tracestate`, as an HTTP
//! header or gRPC metadata), read by tritonserver 2.51's rules (opentelemetry-cpp 1.13's
//! `HttpTraceContext`), and the context a Python model's `request.trace().get_context()` gives.
use opentelemetry::trace::{SpanId, TraceId, TraceState};

/// What a client's request carries: the two headers as they came (None: absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carrier {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Carrier {
    /// The two values from a header lookup (`get` answers a header or metadata key, its first value).
    pub fn from_lookup<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> Option<Carrier> {
        let text = |key: &str| get(key).and_then(|v| std::str::from_utf8(v).ok()).map(str::to_string);
        let carrier = Carrier {
            traceparent: text("traceparent"),
            tracestate: text("tracestate"),
        };
        carrier.traceparent.is_some().then_some(carrier)
    }
}

/// A valid context from a client: the remote span the request's root span is a child of.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub flags: u8,
    pub state: TraceState,
}

/// A `traceparent`'s length (version 00's).
pub const MAX_TRACEPARENT: usize = 55;
const TRACEPARENT_LEN: usize = MAX_TRACEPARENT;

/// The remote span a `traceparent` names, by opentelemetry-cpp 1.13's rules: exactly 55
/// characters, four `-`-separated hex fields of 2, 32, 16 and 2 digits (either case), a version
/// other than `ff`, and trace and span ids that are not zero; any flags (a parent marked "not
/// sampled" is still traced: the sampler is AlwaysOn). Anything else is no context.
pub fn extract(carrier: &Carrier) -> Option<Remote> {
    let parent = carrier.traceparent.as_deref()?;
    if parent.len() != TRACEPARENT_LEN {
        return None;
    }
    let fields: Vec<&str> = parent.split('-').collect();
    let [version, trace, span, flags] = fields.as_slice() else {
        return None;
    };
    let sizes = [(version, 2), (trace, 32), (span, 16), (flags, 2)];
    if sizes
        .iter()
        .any(|(f, n)| f.len() != *n || !f.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return None;
    }
    if version.eq_ignore_ascii_case("ff") {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let state = carrier
        .tracestate
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(Remote {
        trace_id,
        span_id,
        flags: u8::from_str_radix(flags, 16).ok()?,
        state,
    })
}

/// The context of a traced request's model span, as Triton hands it to a Python model
/// (`request.trace().get_context()`): compact JSON with its `traceparent` (sampled) and the
/// client's `tracestate` when there is one.
pub fn python_context(trace_id: TraceId, span_id: SpanId, state: &TraceState) -> String {
    let c = carrier_of(trace_id, span_id, state);
    let mut out = serde_json::Map::new();
    out.insert("traceparent".into(), c.traceparent.into());
    if let Some(tracestate) = c.tracestate {
        out.insert("tracestate".into(), tracestate.into());
    }
    serde_json::Value::Object(out).to_string()
}

/// The W3C context of a sampled span `span_id` of trace `trace_id`, with the trace's `tracestate`
/// when it has one: what a request made on that span's behalf on another server continues.
pub fn carrier_of(trace_id: TraceId, span_id: SpanId, state: &TraceState) -> Carrier {
    let state = state.header();
    Carrier {
        traceparent: Some(format!("00-{trace_id}-{span_id}-01")),
        tracestate: (!state.is_empty()).then_some(state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01";

    fn carrier(parent: &str, state: Option<&str>) -> Carrier {
        Carrier {
            traceparent: Some(parent.into()),
            tracestate: state.map(str::to_string),
        }
    }

    #[test]
    fn tritons_test_vector_is_read() {
        let remote = extract(&carrier(PARENT, None)).unwrap();
        assert_eq!(remote.trace_id.to_string(), "0af7651916cd43dd8448eb211c12666c");
        assert_eq!(remote.span_id.to_string(), "b7ad6b7169242424");
        assert_eq!(remote.flags, 1);
    }

    #[test]
    fn cpp_rules_for_what_is_no_context() {
        let upper = PARENT.to_ascii_uppercase();
        assert!(extract(&carrier(&upper, None)).is_some(), "hex of either case");
        assert!(
            extract(&carrier(&PARENT.replacen("00", "7f", 1), None)).is_some(),
            "other versions"
        );
        assert!(
            extract(&carrier(&PARENT.replace("-01", "-00"), None)).is_some(),
            "unsampled parents too"
        );
        for bad in [
            PARENT.replacen("00", "ff", 1),
            format!("{PARENT}-x"),
            format!(" {PARENT}"),
            PARENT.replace('-', "_"),
            PARENT.replace("0af7", "0ag7"),
            "00-00000000000000000000000000000000-b7ad6b7169242424-01".into(),
            "00-0af7651916cd43dd8448eb211c12666c-0000000000000000-01".into(),
            String::new(),
        ] {
            assert_eq!(extract(&carrier(&bad, None)), None, "{bad}");
        }
        assert_eq!(extract(&Carrier::default()), None);
    }

    #[test]
    fn the_python_context_is_tritons_json() {
        let remote = extract(&carrier(PARENT, Some("k=v,a=b"))).unwrap();
        let span = SpanId::from_hex("00f067aa0ba902b7").unwrap();
        assert_eq!(
            python_context(remote.trace_id, span, &remote.state),
            r#"{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-00f067aa0ba902b7-01","tracestate":"k=v,a=b"}"#
        );
        assert_eq!(
            python_context(remote.trace_id, span, &TraceState::default()),
            r#"{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-00f067aa0ba902b7-01"}"#
        );
    }

    #[test]
    fn a_lookup_without_traceparent_carries_nothing() {
        let headers = [("traceparent", PARENT.as_bytes()), ("tracestate", b"k=v".as_slice())];
        let get = |k: &str| headers.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let c = Carrier::from_lookup(get).unwrap();
        assert_eq!(c.tracestate.as_deref(), Some("k=v"));
        assert_eq!(Carrier::from_lookup(|_| None), None);
    }
}
