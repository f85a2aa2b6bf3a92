//! Triton's trace extension: trace settings (global, and per model over them) read and changed over
//! HTTP and gRPC, which requests are traced by them (`trace_rate`, `trace_count`), and the trace
//! file of each traced request's timestamps in Triton's JSON form. One tracer per process, like
//! the logging settings.
use crate::sync::Locked;
use std::collections::HashMap;
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
}

impl Settings {
    /// Triton's JSON object (every value a string, `trace_level` a list).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "trace_level": self.level,
            "trace_rate": self.rate.to_string(),
            "trace_count": self.count.to_string(),
            "log_frequency": self.log_frequency.to_string(),
            "trace_file": self.file,
            "trace_mode": "triton",
        })
    }

    /// The same as (name, values) pairs, for gRPC.
    pub fn pairs(&self) -> Vec<(&'static str, Vec<String>)> {
        vec![
            ("trace_level", self.level.clone()),
            ("trace_rate", vec![self.rate.to_string()]),
            ("trace_count", vec![self.count.to_string()]),
            ("log_frequency", vec![self.log_frequency.to_string()]),
            ("trace_file", vec![self.file.clone()]),
            ("trace_mode", vec!["triton".into()]),
        ]
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
    }
}

/// One scope's setting as made at its last change: what was given, the values in effect (the
/// count is what is left of it), and the sampling counters, which start again with every change
/// (as Triton makes a new setting object for each).
#[derive(Debug, Clone)]
struct Scope {
    given: Fields,
    now: Settings,
    /// Requests seen; every `rate`-th is traced.
    seen: u64,
    /// Traces started, and finished, under this setting.
    created: u64,
    collected: u64,
}

impl Scope {
    /// The setting after `changes` over `current` (if any), with `fallback` for what is not given.
    /// A given count keeps what is left of it unless it is set again. Refused (with Triton's
    /// words), when `checked`, if it would trace but cannot: no trace file. (The start-up settings
    /// are not checked, as tritonserver's are not: without a file they trace nothing.)
    fn make(current: Option<&Scope>, fallback: &Settings, changes: &[Known], checked: bool) -> Result<Scope> {
        let mut given = current.map(|c| c.given.clone()).unwrap_or_default();
        apply(&mut given, changes)?;
        let count_set_now = changes.iter().any(|(k, v)| *k == "trace_count" && v.is_some());
        let now = Settings {
            level: given.level.clone().unwrap_or_else(|| fallback.level.clone()),
            rate: given.rate.unwrap_or(fallback.rate),
            count: match (given.count, current) {
                (Some(_), Some(c)) if !count_set_now && c.given.count.is_some() => c.now.count,
                (Some(count), _) => count,
                (None, _) => fallback.count,
            },
            log_frequency: given.log_frequency.unwrap_or(fallback.log_frequency),
            file: fallback.file.clone(),
        };
        if checked && now.traces() && now.file.is_empty() {
            return Err(Error::invalid(
                "Attempting to set invalid trace setting :trace file name is not given",
            ));
        }
        Ok(Scope {
            given,
            now,
            seen: 0,
            created: 0,
            collected: 0,
        })
    }
}

/// Finished traces held in memory at most before they are written (`trace_file.<n>`).
pub const MAX_HELD_TRACES: u64 = 10_000;

/// Settings, sampling counters and traces not yet written. Sans-IO but for `flush`.
pub struct Tracer {
    /// The settings the server started with (`--trace-config` over Triton's defaults): what
    /// clearing a server setting returns to.
    start: Settings,
    global: Scope,
    models: HashMap<String, Scope>,
    next_id: u64,
    /// Trace entries not yet written, and how many traces they hold.
    pending: Vec<serde_json::Value>,
    pending_traces: u64,
    /// The index of the next `trace_file.<n>`.
    file_index: u64,
}

impl Default for Tracer {
    fn default() -> Self {
        let start = defaults();
        Tracer {
            global: Scope {
                given: Fields::default(),
                now: start.clone(),
                seen: 0,
                created: 0,
                collected: 0,
            },
            start,
            models: HashMap::new(),
            next_id: 0,
            pending: Vec::new(),
            pending_traces: 0,
            file_index: 0,
        }
    }
}

/// A change to a known setting.
type Known = (&'static str, Option<Vec<String>>);

fn parse_changes(changes: &[Change]) -> Result<Vec<Known>> {
    let mut out = Vec::new();
    for (key, value) in changes {
        let key: &'static str = match key.as_str() {
            "trace_level" => "trace_level",
            "trace_rate" => "trace_rate",
            "trace_count" => "trace_count",
            "log_frequency" => "log_frequency",
            "trace_file" => {
                return Err(Error::invalid(
                    "trace file location can not be updated through network protocol",
                ))
            }
            "trace_mode" => "trace_mode",
            _ => continue, // as Triton: a setting it does not know is ignored
        };
        out.push((key, value.clone()));
    }
    Ok(out)
}

fn one<'a>(key: &str, values: &'a [String]) -> Result<&'a str> {
    match values {
        [v] => Ok(v.trim()),
        _ => Err(Error::invalid(format!("'{key}' takes one value, got {}", values.len()))),
    }
}

/// A setting's number as Triton reads it (a 32-bit integer): not a number is "Unable to parse",
/// one past 32 bits is "out of range [ lo, hi ]" (the range Triton names for the setting).
fn number(key: &str, v: &str, range: (i64, i64)) -> Result<i64> {
    use std::num::IntErrorKind::{NegOverflow, PosOverflow};
    let out_of_range = || {
        Error::invalid(format!(
            "Unable to parse '{key}', value is out of range [ {}, {} ], got: {v}",
            range.0, range.1
        ))
    };
    match v.parse::<i64>() {
        Ok(n) if i32::try_from(n).is_ok() => Ok(n),
        Ok(_) => Err(out_of_range()),
        Err(e) if matches!(e.kind(), PosOverflow | NegOverflow) => Err(out_of_range()),
        Err(_) => Err(Error::invalid(format!("Unable to parse '{key}', got: {v}"))),
    }
}

/// A setting Triton keeps unsigned (`trace_rate`, `log_frequency`): its one value, where a
/// negative one is "Unable to parse".
fn unsigned(key: &str, values: &[String]) -> Result<u64> {
    let v = one(key, values)?;
    u64::try_from(number(key, v, (0, u32::MAX.into()))?)
        .map_err(|_| Error::invalid(format!("Unable to parse '{key}', got: {v}")))
}

impl Tracer {
    /// Starts with the server's `--trace-config` settings, which clearing a server setting
    /// later returns to.
    pub fn configure(&mut self, file: String, changes: &[Change]) -> Result<()> {
        let changes = parse_changes(changes)?;
        let base = Settings { file, ..defaults() };
        let global = Scope::make(None, &base, &changes, false)?;
        self.start = global.now.clone();
        self.global = global;
        self.models.clear();
        Ok(())
    }

    fn scope(&self, model: Option<&str>) -> &Scope {
        model.and_then(|m| self.models.get(m)).unwrap_or(&self.global)
    }

    fn scope_mut(&mut self, model: &str) -> &mut Scope {
        match self.models.get_mut(model) {
            Some(scope) => scope,
            None => &mut self.global,
        }
    }

    /// The settings of the server (`model` None) or of one model (its own over the server's).
    pub fn settings(&self, model: Option<&str>) -> Settings {
        self.scope(model).now.clone()
    }

    /// Changes settings of the server or of one model; all or nothing. A model's setting is made
    /// again over the server's new one (its given values kept), as Triton remakes them.
    pub fn update(&mut self, model: Option<&str>, changes: &[Change]) -> Result<Settings> {
        let changes = parse_changes(changes)?;
        match model {
            Some(m) => {
                let scope = Scope::make(self.models.get(m), &self.global.now, &changes, true)?;
                if scope.given == Fields::default() {
                    self.models.remove(m);
                } else {
                    self.models.insert(m.to_string(), scope);
                }
            }
            None => {
                let global = Scope::make(Some(&self.global), &self.start, &changes, true)?;
                let models = self
                    .models
                    .iter()
                    .map(|(m, s)| Ok((m.clone(), Scope::make(Some(s), &global.now, &[], false)?)))
                    .collect::<Result<HashMap<_, _>>>()?;
                self.global = global;
                self.models = models;
            }
        }
        Ok(self.settings(model))
    }

    /// Whether this request of `model` is traced (and, if so, its trace id): the level traces,
    /// it is the `rate`-th request its setting has seen since the last traced one, and the count
    /// is not used up (each traced request takes one from it).
    pub fn sample(&mut self, model: &str) -> Option<u64> {
        let scope = self.scope_mut(model);
        if !scope.now.traces() || scope.now.count == 0 || scope.now.file.is_empty() {
            return None;
        }
        scope.seen += 1;
        if !scope.seen.is_multiple_of(scope.now.rate.max(1)) {
            return None;
        }
        if scope.now.count > 0 {
            scope.now.count -= 1;
        }
        scope.created += 1;
        self.next_id += 1;
        Some(self.next_id)
    }

    /// A trace id for a request made on behalf of a traced one (its child), whatever the
    /// settings' rate and count; none without a trace file.
    pub fn child(&mut self) -> Option<u64> {
        if self.global.now.file.is_empty() {
            return None;
        }
        self.next_id += 1;
        Some(self.next_id)
    }

    /// Keeps a finished trace; returns the file to write now (`trace_file.<n>`) when
    /// `log_frequency` traces are held, when its setting's count is used up and every trace it
    /// started has finished, or when [`MAX_HELD_TRACES`] are held whatever the settings say.
    /// Without a trace file nothing is kept: nothing could ever write it.
    pub fn finish(&mut self, trace: &Trace) -> Option<(String, Vec<serde_json::Value>)> {
        if self.global.now.file.is_empty() {
            return None;
        }
        let mut head = serde_json::json!({
            "id": trace.id, "model_name": trace.model, "model_version": trace.version, "request_id": trace.request_id,
        });
        if let Some(parent) = trace.parent_id {
            head["parent_id"] = parent.into();
        }
        self.pending.push(head);
        for (name, ns) in &trace.stamps {
            self.pending
                .push(serde_json::json!({"id": trace.id, "timestamps": [{"name": name, "ns": ns}]}));
        }
        self.pending_traces += 1;
        let scope = self.scope_mut(&trace.model);
        scope.collected += 1;
        let used_up = scope.now.count == 0 && scope.collected >= scope.created;
        let every = scope.now.log_frequency;
        let due = every != 0 && self.pending_traces >= every;
        if !(used_up || due || self.pending_traces >= MAX_HELD_TRACES) {
            return None;
        }
        let path = format!("{}.{}", self.global.now.file, self.file_index);
        self.file_index += 1;
        self.pending_traces = 0;
        Some((path, std::mem::take(&mut self.pending)))
    }

    /// Everything not written yet, for `trace_file` (at shutdown).
    pub fn drain(&mut self) -> Option<(String, Vec<serde_json::Value>)> {
        if self.pending.is_empty() || self.global.now.file.is_empty() {
            return None;
        }
        self.pending_traces = 0;
        Some((self.global.now.file.clone(), std::mem::take(&mut self.pending)))
    }
}

fn apply(fields: &mut Fields, changes: &[Known]) -> Result<()> {
    for (key, value) in changes {
        let Some(values) = value else {
            match *key {
                "trace_level" => fields.level = None,
                "trace_rate" => fields.rate = None,
                "trace_count" => fields.count = None,
                "log_frequency" => fields.log_frequency = None,
                _ => {}
            }
            continue;
        };
        match *key {
            "trace_level" => {
                let levels: Vec<String> = values.iter().map(|v| v.trim().to_ascii_uppercase()).collect();
                if let Some(bad) = levels
                    .iter()
                    .find(|l| !matches!(l.as_str(), "OFF" | "TIMESTAMPS" | "TENSORS"))
                {
                    return Err(Error::invalid(format!(
                        "'trace_level' takes OFF, TIMESTAMPS or TENSORS, got '{bad}'"
                    )));
                }
                if levels.is_empty() {
                    return Err(Error::invalid("'trace_level' needs at least one level"));
                }
                if levels.len() > 1 && levels.iter().any(|l| l == "OFF") {
                    return Err(Error::invalid("Expect only one trace level 'OFF' is specified"));
                }
                fields.level = Some(levels);
            }
            "trace_rate" => {
                let rate = unsigned(key, values)?;
                if rate == 0 {
                    return Err(Error::invalid(
                        "Attempting to set invalid trace setting :sample rate must be non-zero",
                    ));
                }
                fields.rate = Some(rate);
            }
            "trace_count" => {
                let v = one(key, values)?;
                let count = number(key, v, (-1, i32::MAX.into()))?;
                if count < -1 {
                    return Err(Error::invalid(format!(
                        "Unable to parse 'trace_count'. Expecting value >= -1, got:{v}"
                    )));
                }
                fields.count = Some(count);
            }
            "log_frequency" => fields.log_frequency = Some(unsigned(key, values)?),
            "trace_mode" if one(key, values)? != "triton" => {
                return Err(Error::invalid("'trace_mode' can only be 'triton'"));
            }
            _ => {}
        }
    }
    Ok(())
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

impl Tracer {
    fn active(&self) -> bool {
        self.global.now.traces() || self.models.values().any(|s| s.now.traces())
    }
}

/// Changes settings (see `Tracer::update`) and notes whether anything traces now.
pub fn update(model: Option<&str>, changes: &[Change]) -> Result<Settings> {
    let mut t = tracer();
    let settings = t.update(model, changes)?;
    ACTIVE.store(t.active(), Ordering::Relaxed);
    Ok(settings)
}

/// Sets the server's starting settings (`--trace-config`).
pub fn configure(file: String, changes: &[Change]) -> Result<()> {
    let mut t = tracer();
    t.configure(file, changes)?;
    ACTIVE.store(t.active(), Ordering::Relaxed);
    Ok(())
}

/// Whether this request of `model` is traced, and its trace id (a relaxed load when nothing traces).
/// A request made inside `child` (a BLS call of a traced request) is always traced.
pub fn sample(model: &str) -> Option<u64> {
    if parent().is_some() {
        return tracer().child();
    }
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    tracer().sample(model)
}

tokio::task_local! {
    static PARENT: u64;
}

/// Runs `call` (a request made on behalf of the traced request `parent`, if any) so the requests
/// it makes are traced as that request's children.
pub async fn child<T>(parent: Option<u64>, call: impl std::future::Future<Output = T>) -> T {
    match parent {
        Some(id) => PARENT.scope(id, call).await,
        None => call.await,
    }
}

/// The trace the current request is a child of (inside `child`).
pub fn parent() -> Option<u64> {
    PARENT.try_with(|id| *id).ok()
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
    if front::claim(trace) {
        return;
    }
    write_now(trace);
}

fn write_now(trace: &Trace) {
    let ready = tracer().finish(trace);
    if let Some((path, entries)) = ready {
        write(&path, &entries);
    }
}

/// Writes the traces not written yet to `trace_file` (at shutdown).
pub fn flush() {
    let ready = tracer().drain();
    if let Some((path, entries)) = ready {
        write(&path, &entries);
    }
}

/// Reads tritonserver's `--trace-config [triton,]KEY=VALUE` flags: the file and the settings.
pub fn from_flags(flags: &[String]) -> std::result::Result<(String, Vec<Change>), String> {
    let mut file = String::new();
    let mut changes: Vec<Change> = Vec::new();
    for flag in flags {
        let body = flag.strip_prefix("triton,").unwrap_or(flag);
        let (key, value) = body
            .split_once('=')
            .ok_or_else(|| format!("--trace-config '{flag}' is not [triton,]KEY=VALUE"))?;
        let key = match key {
            "level" => "trace_level",
            "rate" => "trace_rate",
            "count" => "trace_count",
            "file" => {
                file = value.to_string();
                continue;
            }
            "log-frequency" | "log_frequency" => "log_frequency",
            "mode" => continue,
            other => return Err(format!("--trace-config: unknown setting '{other}'")),
        };
        // Levels accumulate (`--trace-level TIMESTAMPS --trace-level TENSORS`); other keys: the last wins.
        match changes.iter_mut().find(|(k, _)| k == key) {
            Some((_, Some(values))) if key == "trace_level" => values.push(value.to_string()),
            Some(change) => change.1 = Some(vec![value.to_string()]),
            None => changes.push((key.to_string(), Some(vec![value.to_string()]))),
        }
    }
    Ok((file, changes))
}

pub mod front;

#[cfg(test)]
mod tests;
