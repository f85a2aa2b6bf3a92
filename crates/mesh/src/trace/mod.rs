//! Triton's trace extension: trace settings (global, and per model over them) read and changed over
//! HTTP and gRPC, which requests are traced by them (`trace_rate`, `trace_count`, and in
//! OpenTelemetry mode a client's `traceparent`), and where each traced request's timestamps go:
//! the trace file in Triton's JSON form (`mode=triton`), or OpenTelemetry spans sent to a
//! collector (`mode=opentelemetry`, [`otel`]). One tracer per process, like the logging settings.
use crate::sync::Locked;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use crate::error::{Error, Result};

/// One setting's new value: strings (a list for `trace_level`), or None to clear it (a model's
/// setting then follows the global one again; a global one returns to its default).
pub type Change = (String, Option<Vec<String>>);

/// The settings a scope was given: `None` follows the fallback (a model's: the server's; the
/// server's: those it started with).
#[derive(Debug, Clone, Default, PartialEq)]
struct Fields {
    level: Option<Vec<String>>,
    rate: Option<u64>,
    count: Option<i64>,
    log_frequency: Option<u64>,
}

/// Effective settings of a scope, as the API shows them.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub level: Vec<String>,
    pub rate: u64,
    pub count: i64,
    pub log_frequency: u64,
    pub file: String,
    pub mode: Mode,
    /// The mode's own settings, as given at start-up (OpenTelemetry's `url`, `resource`, `bsp_*`).
    pub config: Vec<(String, String)>,
}

impl Settings {
    /// Triton's JSON object (every value a string, `trace_level` a list). In OpenTelemetry mode
    /// a repeated setting (`resource`) is shown once here; [`Settings::to_text`] shows each.
    pub fn to_json(&self) -> serde_json::Value {
        match self.mode {
            Mode::Triton => serde_json::json!({
                "trace_level": self.level,
                "trace_rate": self.rate.to_string(),
                "trace_count": self.count.to_string(),
                "log_frequency": self.log_frequency.to_string(),
                "trace_file": self.file,
                "trace_mode": "triton",
            }),
            Mode::OpenTelemetry => serde_json::from_str(&self.to_text()).unwrap_or_default(),
        }
    }

    /// The JSON text Triton answers: in OpenTelemetry mode, in Triton's order (level, rate,
    /// count, mode, then the mode's settings as given, a repeated one as repeated keys), without
    /// the trace file's `log_frequency` and `trace_file`.
    pub fn to_text(&self) -> String {
        if self.mode == Mode::Triton {
            return self.to_json().to_string();
        }
        let text = |v: &str| serde_json::Value::from(v).to_string();
        let mut out = format!(
            "{{\"trace_level\":{},\"trace_rate\":\"{}\",\"trace_count\":\"{}\",\"trace_mode\":\"{}\"",
            serde_json::Value::from(self.level.clone()),
            self.rate,
            self.count,
            self.mode.name()
        );
        for (k, v) in &self.config {
            out.push_str(&format!(",{}:{}", text(k), text(v)));
        }
        out.push('}');
        out
    }

    /// The same as (name, values) pairs, for gRPC (a repeated setting: one name, its values).
    pub fn pairs(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = vec![
            ("trace_level".into(), self.level.clone()),
            ("trace_rate".into(), vec![self.rate.to_string()]),
            ("trace_count".into(), vec![self.count.to_string()]),
        ];
        if self.mode == Mode::Triton {
            out.push(("log_frequency".into(), vec![self.log_frequency.to_string()]));
            out.push(("trace_file".into(), vec![self.file.clone()]));
        }
        out.push(("trace_mode".into(), vec![self.mode.name().into()]));
        for (k, v) in &self.config {
            match out.iter_mut().find(|(name, _)| name == k) {
                Some((_, values)) => values.push(v.clone()),
                None => out.push((k.clone(), vec![v.clone()])),
            }
        }
        out
    }

    fn traces(&self) -> bool {
        self.level.iter().any(|l| l == "TIMESTAMPS" || l == "TENSORS")
    }
}

/// Triton's built-in settings (no trace file, so nothing traces until one is given).
fn defaults() -> Settings {
    Settings {
        level: vec!["OFF".into()],
        rate: 1000,
        count: -1,
        log_frequency: 0,
        file: String::new(),
        mode: Mode::Triton,
        config: Vec::new(),
    }
}

/// One traced request: who it is, the trace it is part of (a BLS call made with
/// `trace=request.trace()`), and its timestamps (ns of the monotonic clock, as Triton's).
#[derive(Debug, Clone)]
pub struct Trace {
    pub id: u64,
    pub model: String,
    pub version: i64,
    pub request_id: String,
    pub parent_id: Option<u64>,
    pub stamps: Vec<(&'static str, u64)>,
}

/// The monotonic clock in ns at `at` (Triton's trace timestamps are steady-clock ns).
pub fn ns(at: Instant) -> u64 {
    static ANCHOR: LazyLock<(Instant, u64)> = LazyLock::new(|| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (Instant::now(), ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    });
    let (base, base_ns) = *ANCHOR;
    match at.checked_duration_since(base) {
        Some(d) => base_ns + d.as_nanos() as u64,
        None => base_ns.saturating_sub(base.duration_since(at).as_nanos() as u64),
    }
}

/// A model's settings need the model serving: an unknown or unloaded one is Triton's 400.
pub fn known_model<D: crate::dispatch::Dispatch + ?Sized>(dispatch: &D, model: &str) -> Result<()> {
    match dispatch.model(model, "") {
        Ok(view) if view.ready => Ok(()),
        _ => Err(Error::invalid(format!("Request for unknown model : {model}"))),
    }
}

/// Whether any scope traces: requests skip the tracer's lock while none does.
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether the tracer is in OpenTelemetry mode (traces become spans, [`otel`]).
static OTEL: AtomicBool = AtomicBool::new(false);

pub(crate) fn otel_mode() -> bool {
    OTEL.load(Ordering::Relaxed)
}

/// Changes settings (see `Tracer::update`) and notes whether anything traces now.
pub fn update(model: Option<&str>, changes: &[Change]) -> Result<Settings> {
    let mut t = tracer();
    let settings = t.update(model, changes)?;
    ACTIVE.store(t.active(), Ordering::Relaxed);
    let due = t.take_due();
    drop(t);
    for (path, entries) in due {
        write(&path, &entries);
    }
    Ok(settings)
}

/// Sets the server's starting settings (`--trace-config`), in trace file mode.
pub fn configure(file: String, changes: &[Change]) -> Result<()> {
    configure_mode(Mode::Triton, Vec::new(), file, changes)
}

fn configure_mode(mode: Mode, config: Vec<(String, String)>, file: String, changes: &[Change]) -> Result<()> {
    let mut t = tracer();
    t.configure_mode(mode, config, file, changes)?;
    OTEL.store(mode == Mode::OpenTelemetry, Ordering::Relaxed);
    ACTIVE.store(t.active(), Ordering::Relaxed);
    Ok(())
}

/// Starts tracing as tritonserver's `--trace-config` flags say (the legacy `--trace-*` flags
/// first, as `KEY=VALUE`): the settings, and in OpenTelemetry mode the exporter. Errors are
/// tritonserver's words where it has them.
pub fn start(flags: &[String]) -> std::result::Result<(), String> {
    let env = |key: &str| std::env::var(key).ok();
    let read = flags::parse(flags, &env)?;
    for warning in &read.warnings {
        tracing::warn!("{warning}");
    }
    let config = match &read.otel {
        Some(otel) => {
            otel::start(otel, &env)?;
            otel.entries.clone()
        }
        None => Vec::new(),
    };
    configure_mode(read.mode, config, read.file, &read.changes).map_err(|e| format!("--trace-config: {}", e.message))
}

/// Whether this request of `model` is traced, and its trace id (a relaxed load when nothing traces).
/// As in Triton, only the requests clients make are sampled: a request made on behalf of another
/// (inside `child`: a BLS call, an ensemble's step) is traced exactly when that one is, as its child.
/// In OpenTelemetry mode a request whose client sent a valid `traceparent` (the frontend serving
/// it has it) is traced whatever the rate and count.
pub fn sample(model: &str) -> Option<u64> {
    match PARENT.try_with(|parent| *parent) {
        Ok(Some(parent)) => {
            let id = tracer().child(parent)?;
            (!otel_mode() || otel::child(id, parent)).then_some(id)
        }
        Ok(None) => None,
        Err(_) if !ACTIVE.load(Ordering::Relaxed) => None,
        Err(_) if !otel_mode() => tracer().sample(model),
        Err(_) => {
            let (carrier, fronted) = front::serving(model);
            let carrier = carrier.or_else(|| LINKED.try_with(Clone::clone).ok());
            let remote = carrier.as_ref().and_then(otel::context::extract);
            let id = tracer().sample_otel(model, remote.is_some())?;
            otel::root(id, remote, fronted);
            if fronted && !front::own(id) {
                // Its frontend ended before the request was sampled: nothing else will end its root.
                otel::front_done(id, &[], false);
            }
            Some(id)
        }
    }
}

/// The OpenTelemetry context of traced request `id` as a Python model gets it
/// (`request.trace().get_context()`); None in trace file mode, as in Triton.
pub fn context(id: u64) -> Option<String> {
    otel_mode().then(|| otel::context(id)).flatten()
}

tokio::task_local! {
    /// Set inside `child`: the trace of the request the current one is made for (None: untraced).
    static PARENT: Option<u64>;
    /// Set inside `linked`: the trace context a peer sent with the request served here.
    static LINKED: otel::context::Carrier;
}

/// Serves `call`, a request a cluster peer sent with the trace context `carrier` (a router's
/// attempt, a node's calling model): in OpenTelemetry mode the request is traced as that span's
/// child, whatever the rate and count, as a client's request with a `traceparent` is.
pub async fn linked<T>(carrier: Option<otel::context::Carrier>, call: impl std::future::Future<Output = T>) -> T {
    match carrier {
        Some(c) if ACTIVE.load(Ordering::Relaxed) => LINKED.scope(c, call).await,
        _ => call.await,
    }
}

/// Runs `call`, requests made on behalf of the request traced as `parent` (None: an untraced
/// one), so that they are traced as that request's children, or not at all.
pub async fn child<T>(parent: Option<u64>, call: impl std::future::Future<Output = T>) -> T {
    PARENT.scope(parent, call).await
}

/// The trace the current request is a child of (inside `child`).
pub fn parent() -> Option<u64> {
    PARENT.try_with(|id| *id).ok().flatten()
}

/// The process's tracer.
pub static TRACER: LazyLock<Mutex<Tracer>> = LazyLock::new(|| Mutex::new(Tracer::default()));

pub fn tracer() -> std::sync::MutexGuard<'static, Tracer> {
    TRACER.locked()
}

/// Writes trace entries as one JSON array (a file of its own per write, as Triton's).
fn write(path: &str, entries: &[serde_json::Value]) {
    let text = match serde_json::to_vec(entries) {
        Ok(t) => t,
        Err(e) => return tracing::error!("cannot encode traces: {e}"),
    };
    let written = std::fs::File::create(path).and_then(|mut f| f.write_all(&text));
    if let Err(e) = written {
        tracing::error!("cannot write the trace file {path}: {e}");
    }
}

/// Records a finished trace (writing `trace_file.<n>` when it is time). A trace of the request a
/// frontend is serving (`front::serve`) is left to that frontend, which adds its own timestamps.
pub fn record(trace: &Trace) {
    if otel_mode() {
        return otel::finish(trace);
    }
    if front::claim(trace) {
        return;
    }
    write_now(trace);
}

fn write_now(trace: &Trace) {
    let ready = tracer().finish(trace);
    for (path, entries) in ready {
        write(&path, &entries);
    }
}

/// Writes the traces not written yet (at shutdown); exports the spans not exported yet.
pub fn flush() {
    otel::flush();
    let ready = tracer().drain();
    for (path, entries) in ready {
        write(&path, &entries);
    }
}

/// Reads tritonserver's `--trace-config [triton,]KEY=VALUE` flags: the trace file and the settings.
pub fn from_flags(flags: &[String]) -> std::result::Result<(String, Vec<Change>), String> {
    let read = flags::parse(flags, &|_| None)?;
    Ok((read.file, read.changes))
}

mod flags;
pub mod front;
pub mod otel;
mod parse;
mod tracer;

pub use flags::Mode;

pub use tracer::{Tracer, MAX_HELD_TRACES};

#[cfg(test)]
mod tests;
