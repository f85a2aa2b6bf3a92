//! Triton's OpenTelemetry trace mode (`--trace-config mode=opentelemetry`): each traced request
//! becomes a tree of spans (`spans`), the child of the client's span when it sent a W3C
//! `traceparent` (`context`), exported to an OTLP/HTTP collector by the batch span processor
//! (`queue`, `export`) with the settings of `--trace-config opentelemetry,KEY=VALUE`
//! (`config`). This module holds the process's registry of traced requests and its exporter.
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use self::context::Remote;
use self::spans::{Clock, Ended, Registry};
use crate::sync::Locked;
use crate::trace::Trace;

mod client;
pub mod config;
pub mod context;
mod export;
pub mod live;
mod queue;
pub mod spans;

/// The requests being traced.
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::new(identity().scope)));
/// Who this process is to a collector, when it is not a Triton server ([`identify`]).
static IDENTITY: OnceLock<Identity> = OnceLock::new();

/// How a process names itself in its spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The resource's `service.name` unless `opentelemetry,resource=service.name=…` says otherwise.
    pub service: &'static str,
    /// The instrumentation scope of its spans.
    pub scope: &'static str,
}

/// A Triton server's: `triton-inference-server`, scope `triton-server`.
pub const TRITON: Identity = Identity {
    service: "triton-inference-server",
    scope: spans::SCOPE,
};

/// Names this process in its spans (a router: `mesh-router`); before anything traces. A second
/// call changes nothing.
pub fn identify(identity: Identity) {
    let _ = IDENTITY.set(identity);
}

fn identity() -> Identity {
    IDENTITY.get().copied().unwrap_or(TRITON)
}
/// The exporter, started once per process (by the first server's flags).
static PROCESSOR: OnceLock<export::Processor> = OnceLock::new();

/// How long the spans not exported yet may take to go out at shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the exporter with these settings (`env`: the environment, for the resource).
pub fn start(config: &config::OtelConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    if PROCESSOR.get().is_some() {
        tracing::warn!("the OpenTelemetry exporter runs already: its first settings stay");
        return Ok(());
    }
    let client = client::Client::new(env).map_err(|e| format!("--trace-config opentelemetry: {e}"))?;
    let processor = export::Processor::start(config, export::resource(config, identity().service, env), client)?;
    let _ = PROCESSOR.set(processor);
    Ok(())
}

fn now() -> Clock {
    let unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    Clock {
        unix_ns,
        steady_ns: crate::trace::ns(Instant::now()),
    }
}

fn export(ended: impl IntoIterator<Item = Ended>) {
    let Some(processor) = PROCESSOR.get() else {
        return;
    };
    for e in ended {
        processor.push(e.request, e.span, e.last);
    }
}

/// Starts tracing a client's request sampled as trace `id` (see [`Registry::root`]).
pub fn root(id: u64, remote: Option<Remote>, fronted: bool) {
    REGISTRY.locked().root(id, remote, fronted, now());
}

/// Traces `id` as the child of trace `parent`; false when that one is not traced.
pub fn child(id: u64, parent: u64) -> bool {
    REGISTRY.locked().child(id, parent)
}

/// A trace finished: its spans go to the exporter (and its request's root, if it was the last).
pub fn finish(trace: &Trace) {
    let ended = REGISTRY.locked().finish(trace);
    export(ended);
}

/// The frontend serving request `id` is done (`answered`, or its client went away), with its
/// timestamps for the root span.
pub fn front_done(id: u64, stamps: &[(&'static str, u64)], answered: bool) {
    let end = crate::trace::ns(Instant::now());
    let ended = REGISTRY.locked().front_done(id, stamps, end, answered);
    export(ended);
}

/// The W3C context of trace `id`'s model span, for a request made on its behalf on another
/// server (a BLS call the cluster's router takes).
pub fn carrier(id: u64) -> Option<context::Carrier> {
    REGISTRY.locked().carrier(id)
}

/// A Python model's context of trace `id`.
pub fn context(id: u64) -> Option<String> {
    REGISTRY.locked().context(id)
}

/// Exports what is queued (at shutdown).
pub fn flush() {
    if let Some(processor) = PROCESSOR.get() {
        processor.flush(FLUSH_TIMEOUT);
    }
}
