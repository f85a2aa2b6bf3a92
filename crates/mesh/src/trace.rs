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

/// The settings that apply to a scope; a model's unset fields follow the global ones.
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

const DEFAULTS: Fields = Fields {
    level: None,
    rate: Some(1000),
    count: Some(-1),
    log_frequency: Some(0),
};

/// Finished traces held in memory at most before they are written (`trace_file.<n>`).
pub const MAX_HELD_TRACES: u64 = 10_000;

/// Settings, sampling counters and traces not yet written. Sans-IO but for `flush`.
#[derive(Default)]
pub struct Tracer {
    global: Fields,
    file: String,
    models: HashMap<String, Fields>,
    /// Requests seen per model since its rate last changed.
    seen: HashMap<String, u64>,
    next_id: u64,
    /// Trace entries not yet written, and how many traces they hold.
    pending: Vec<serde_json::Value>,
    pending_traces: u64,
    /// The index of the next `trace_file.<n>` (with `log_frequency`).
    file_index: u64,
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

impl Tracer {
    /// Starts with the server's `--trace-config` settings.
    pub fn configure(&mut self, file: String, changes: &[Change]) -> Result<()> {
        self.file = file;
        let changes = parse_changes(changes)?;
        let mut global = self.global.clone();
        apply(&mut global, &changes)?;
        self.global = global;
        Ok(())
    }

    /// The settings of the server (`model` None) or of one model (its own over the server's).
    pub fn settings(&self, model: Option<&str>) -> Settings {
        let model = model.and_then(|m| self.models.get(m));
        let pick = |f: fn(&Fields) -> Option<u64>| {
            model
                .and_then(f)
                .or(f(&self.global))
                .or(f(&DEFAULTS))
                .unwrap_or_default()
        };
        Settings {
            level: model
                .and_then(|m| m.level.clone())
                .or_else(|| self.global.level.clone())
                .unwrap_or_else(|| vec!["OFF".into()]),
            rate: pick(|f| f.rate),
            count: model.and_then(|m| m.count).or(self.global.count).unwrap_or(-1),
            log_frequency: pick(|f| f.log_frequency),
            file: self.file.clone(),
        }
    }

    /// Changes settings of the server or of one model; all or nothing.
    pub fn update(&mut self, model: Option<&str>, changes: &[Change]) -> Result<Settings> {
        let changes = parse_changes(changes)?;
        let mut fields = match model {
            Some(m) => self.models.get(m).cloned().unwrap_or_default(),
            None => self.global.clone(),
        };
        apply(&mut fields, &changes)?;
        if changes.iter().any(|(k, _)| *k == "trace_rate") {
            match model {
                Some(m) => drop(self.seen.remove(m)),
                None => self.seen.clear(),
            }
        }
        match model {
            Some(m) if fields == Fields::default() => drop(self.models.remove(m)),
            Some(m) => drop(self.models.insert(m.to_string(), fields)),
            None => self.global = fields,
        }
        Ok(self.settings(model))
    }

    /// Whether this request of `model` is traced (and, if so, its trace id): the level traces,
    /// it is the first of each `trace_rate` requests, and `trace_count` is not used up (each
    /// traced request takes one from the count of the scope that sets it).
    pub fn sample(&mut self, model: &str) -> Option<u64> {
        let settings = self.settings(Some(model));
        if !settings.traces() || settings.count == 0 {
            return None;
        }
        let seen = self.seen.entry(model.to_string()).or_default();
        let due = seen.is_multiple_of(settings.rate.max(1));
        *seen += 1;
        if !due {
            return None;
        }
        if settings.count > 0 {
            let scope = match self.models.get_mut(model).filter(|f| f.count.is_some()) {
                Some(fields) => fields,
                None => &mut self.global,
            };
            scope.count = Some(settings.count - 1);
        }
        self.next_id += 1;
        Some(self.next_id)
    }

    /// Keeps a finished trace; returns the file to write now when `log_frequency` traces are held,
    /// or [`MAX_HELD_TRACES`] whatever `log_frequency` says (0 would otherwise hold them until
    /// exit). Without a trace file nothing is kept: nothing could ever write it.
    pub fn finish(&mut self, trace: &Trace) -> Option<(String, Vec<serde_json::Value>)> {
        if self.file.is_empty() {
            return None;
        }
        self.pending.push(serde_json::json!({
            "id": trace.id, "model_name": trace.model, "model_version": trace.version, "request_id": trace.request_id,
        }));
        for (name, ns) in &trace.stamps {
            self.pending
                .push(serde_json::json!({"id": trace.id, "timestamps": [{"name": name, "ns": ns}]}));
        }
        self.pending_traces += 1;
        let every = self.settings(Some(&trace.model)).log_frequency;
        let full = self.pending_traces >= MAX_HELD_TRACES;
        if !full && (every == 0 || self.pending_traces < every) {
            return None;
        }
        let path = format!("{}.{}", self.file, self.file_index);
        self.file_index += 1;
        self.pending_traces = 0;
        Some((path, std::mem::take(&mut self.pending)))
    }

    /// Everything not written yet, for `trace_file` (at shutdown).
    pub fn drain(&mut self) -> Option<(String, Vec<serde_json::Value>)> {
        if self.pending.is_empty() || self.file.is_empty() {
            return None;
        }
        self.pending_traces = 0;
        Some((self.file.clone(), std::mem::take(&mut self.pending)))
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
                fields.level = Some(levels);
            }
            "trace_rate" => {
                let v = one(key, values)?;
                let rate: u64 = v
                    .parse()
                    .map_err(|_| Error::invalid(format!("Unable to parse 'trace_rate', got: {v}")))?;
                if rate == 0 {
                    return Err(Error::invalid(
                        "Attempting to set invalid trace setting :sample rate must be non-zero",
                    ));
                }
                fields.rate = Some(rate);
            }
            "trace_count" => {
                let v = one(key, values)?;
                let count: i64 = v.parse().ok().filter(|&c| c >= -1).ok_or_else(|| {
                    Error::invalid(format!("Unable to parse 'trace_count'. Expecting value >= -1, got:{v}"))
                })?;
                fields.count = Some(count);
            }
            "log_frequency" => {
                let v = one(key, values)?;
                fields.log_frequency = Some(
                    v.parse()
                        .map_err(|_| Error::invalid(format!("Unable to parse 'log_frequency', got: {v}")))?,
                );
            }
            "trace_mode" if one(key, values)? != "triton" => {
                return Err(Error::invalid("'trace_mode' can only be 'triton'"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// One traced request: who it is and its timestamps (ns of the monotonic clock, as Triton's).
#[derive(Debug, Clone)]
pub struct Trace {
    pub id: u64,
    pub model: String,
    pub version: i64,
    pub request_id: String,
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

/// A model's settings need the model: an unknown one is Triton's 400.
pub fn known_model<D: crate::dispatch::Dispatch + ?Sized>(dispatch: &D, model: &str) -> Result<()> {
    match dispatch.model(model, "") {
        Err(e) if e.code == crate::error::Code::NotFound => {
            Err(Error::invalid(format!("Request for unknown model : {model}")))
        }
        _ => Ok(()),
    }
}

/// Whether any scope traces: requests skip the tracer's lock while none does.
static ACTIVE: AtomicBool = AtomicBool::new(false);

impl Tracer {
    fn active(&self) -> bool {
        self.settings(None).traces() || self.models.keys().any(|m| self.settings(Some(m)).traces())
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
pub fn sample(model: &str) -> Option<u64> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    tracer().sample(model)
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

/// Records a finished trace (writing `trace_file.<n>` when `log_frequency` traces are held).
pub fn record(trace: &Trace) {
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

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
