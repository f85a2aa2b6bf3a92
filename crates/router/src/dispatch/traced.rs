//! The router's spans of a request (OpenTelemetry mode, `--trace-config mode=opentelemetry`): the
//! router's `InferRequest` (Triton's sampling, continuing the client's `traceparent` or a node's
//! BLS call), then `route` (which version, how many attempts, how it ended), `wait for replica`
//! while nothing could take it, and one `attempt` per node tried (which node and why, how it
//! ended), whose context goes over the link so the node's spans are its children. A router
//! ensemble is a span of its own, its steps' `route` spans under it.
use mesh::trace::otel::live::{KeyValue, Parent, Span, SpanKind, Traced};
use mesh::{Error, Result};

tokio::task_local! {
    /// Set while a router ensemble runs its steps: the span they go under (None: untraced).
    static STEPS_OF: Option<Parent>;
}

/// A request's place in the router's trace: the request traced here (a client's, or a node's BLS
/// call), or a router ensemble's step under its ensemble's span, or nothing.
pub(super) struct Trace {
    _traced: Option<Traced>,
    parent: Option<Parent>,
}

impl Trace {
    /// Whether this request of `model` is traced: a step of a router ensemble is exactly when
    /// its ensemble is (never sampled on its own, as in Triton); any other by Triton's sampling.
    pub(super) fn begin(model: &str) -> Trace {
        if let Ok(parent) = STEPS_OF.try_with(|p| *p) {
            return Trace { _traced: None, parent };
        }
        let traced = Traced::sample(model);
        Trace {
            parent: traced.as_ref().map(Traced::parent),
            _traced: traced,
        }
    }

    /// Opens a span under the request's root (or its ensemble's span).
    pub(super) fn span(&self, name: impl Into<std::borrow::Cow<'static, str>>, kind: SpanKind) -> Span {
        self.parent.map_or_else(Span::none, |p| p.child(name, kind))
    }

    /// The `route` span of `model`, on router `router`.
    pub(super) fn route(&self, model: &str, router: &str) -> Span {
        let mut span = self.span("route", SpanKind::Internal);
        if span.is_recording() {
            span.set(KeyValue::new("triton.model_name", model.to_string()));
            span.set(KeyValue::new("mesh.router", router.to_string()));
            span.set(KeyValue::new("mesh.outcome", CANCELLED));
        }
        span
    }
}

/// The outcome of a span whose request was dropped before it ended (its client went away).
pub(super) const CANCELLED: &str = "cancelled";

/// Runs a router ensemble's steps (`steps`) under `span`: each step's routing is its child.
pub(super) async fn steps<T>(span: &Span, steps: impl std::future::Future<Output = T>) -> T {
    STEPS_OF.scope(span.parent(), steps).await
}

/// Notes how a span's work ended: `ok`, or the error's code.
pub(super) fn outcome<T>(span: &mut Span, result: &Result<T>) {
    if span.is_recording() {
        let outcome = match result {
            Ok(_) => "ok".to_string(),
            Err(e) => code_name(e),
        };
        span.set(KeyValue::new("mesh.outcome", outcome));
    }
}

/// An error's code in capitals (`UNAVAILABLE`, `NOT_FOUND`, …).
pub(super) fn code_name(e: &Error) -> String {
    let mut out = String::new();
    for (i, c) in format!("{:?}", e.code).chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_in_capitals() {
        assert_eq!(code_name(&Error::not_found("x")), "NOT_FOUND");
        assert_eq!(code_name(&Error::unavailable("x")), "UNAVAILABLE");
    }
}
