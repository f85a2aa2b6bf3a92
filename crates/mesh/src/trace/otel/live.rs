//! Spans made as a request goes, for a server whose work is not a model's (a router's routing):
//! a request traced here ([`Traced`]: Triton's sampling, and the root `InferRequest` a node makes)
//! and spans under it ([`Span`]) that end when dropped, so a request cancelled mid-way still ends
//! them and its root. Each span can hand its W3C context on ([`Span::carrier`]) to the server that
//! does the next part of the work, whose spans then join the same trace.
use std::borrow::Cow;
use std::time::Instant;

use opentelemetry::trace::SpanId;
pub use opentelemetry::trace::SpanKind;
pub use opentelemetry::KeyValue;

use super::context::{carrier_of, Carrier};
use super::spans::Open;
use super::{export, REGISTRY};
use crate::sync::Locked;

fn steady_now() -> u64 {
    crate::trace::ns(Instant::now())
}

/// A request this process traces with spans of its own; its own part ends when dropped (its root
/// ends once its spans have too, and its frontend, if one serves it, has answered).
#[derive(Debug)]
pub struct Traced {
    id: u64,
}

impl Traced {
    /// Whether this request of `model` (a client's, through a frontend, or a peer's, over the
    /// link) is traced here, by Triton's sampling in OpenTelemetry mode ([`crate::trace::sample`]:
    /// a request that brings a trace context always is). None in trace file mode and while
    /// nothing traces (one relaxed load).
    pub fn sample(model: &str) -> Option<Traced> {
        if !crate::trace::otel_mode() {
            return None;
        }
        crate::trace::sample(model).map(|id| Traced { id })
    }

    /// Opens a span under the request's root.
    pub fn span(&self, name: impl Into<Cow<'static, str>>, kind: SpanKind) -> Span {
        Span::open(self.id, None, name.into(), kind)
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let ended = REGISTRY.locked().release(self.id);
        export(ended);
    }
}

/// An open span (or none: the request is not traced, and every call does nothing); it ends when
/// dropped.
#[derive(Debug, Default)]
pub struct Span(Option<Open>);

impl Span {
    fn open(request: u64, parent: Option<SpanId>, name: Cow<'static, str>, kind: SpanKind) -> Span {
        Span(REGISTRY.locked().open(request, parent, (name, kind), steady_now()))
    }

    /// No span: what an untraced request carries.
    pub fn none() -> Span {
        Span(None)
    }

    /// Whether this is a span (its request is traced).
    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    /// Opens a span under this one.
    pub fn child(&self, name: impl Into<Cow<'static, str>>, kind: SpanKind) -> Span {
        match &self.0 {
            Some(o) => Span::open(o.request, Some(o.span), name.into(), kind),
            None => Span(None),
        }
    }

    /// Sets an attribute (a key set again takes the new value).
    pub fn set(&mut self, attribute: KeyValue) {
        if let Some(o) = &mut self.0 {
            o.attributes.retain(|a| a.key != attribute.key);
            o.attributes.push(attribute);
        }
    }

    /// Adds an event named `name` now.
    pub fn event(&mut self, name: &'static str) {
        if let Some(o) = &mut self.0 {
            o.events.push((name, steady_now()));
        }
    }

    /// This span's W3C context, for a request another server runs on its behalf.
    pub fn carrier(&self) -> Option<Carrier> {
        let o = self.0.as_ref()?;
        Some(carrier_of(o.trace_id, o.span, &o.state))
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(open) = self.0.take() {
            let ended = REGISTRY.locked().close(open, steady_now());
            export(ended);
        }
    }
}

/// Where a span opens: a traced request's root, or an open span (copyable, to hand to the work
/// done under it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    request: u64,
    span: Option<SpanId>,
}

impl Parent {
    /// Opens a span here.
    pub fn child(self, name: impl Into<Cow<'static, str>>, kind: SpanKind) -> Span {
        Span::open(self.request, self.span, name.into(), kind)
    }
}

impl Traced {
    /// The request's root, as a place to open spans.
    pub fn parent(&self) -> Parent {
        Parent {
            request: self.id,
            span: None,
        }
    }
}

impl Span {
    /// This span as a place to open spans (None: not traced).
    pub fn parent(&self) -> Option<Parent> {
        self.0.as_ref().map(|o| Parent {
            request: o.request,
            span: Some(o.span),
        })
    }
}
