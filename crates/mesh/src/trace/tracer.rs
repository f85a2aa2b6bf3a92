//! The tracer: trace settings (the server's, and each model's over them), which requests they
//! trace, and which file each finished trace goes to and when. Sans-IO: it hands back the files to
//! write. As in Triton, every change makes a new setting, and each setting holds its own traces:
//! it writes them to `trace_file.<n>` every `log_frequency` traces or once its count is used up,
//! and the traces it still holds when it is replaced (once its last trace has finished) or at
//! exit go to `trace_file.<n>` with a `log_frequency`, else to `trace_file`.
use std::collections::HashMap;

use super::parse::{apply, parse_changes, Known};
use super::{defaults, Change, Fields, Mode, Settings, Trace};
use crate::error::{Error, Result};

/// Finished traces one setting holds at most before they are written (`trace_file.<n>`), and
/// `trace_file`'s traces held at most until exit (more are written to `trace_file.<n>`).
pub const MAX_HELD_TRACES: u64 = 10_000;

/// A file to write: its path and its JSON entries.
pub type Write = (String, Vec<serde_json::Value>);

/// One setting as made at its last change: what was given, the values in effect (the count is
/// what is left of it), the sampling counters, and the traces it holds.
#[derive(Debug, Clone)]
pub(super) struct Scope {
    /// Which setting this is (a new one at every change).
    id: u64,
    given: Fields,
    now: Settings,
    /// Requests seen while the count was not used up; every `rate`-th is traced.
    seen: u64,
    /// Traces (a client's request each) started and finished under this setting.
    created: u64,
    collected: u64,
    /// Traces of this setting still running, children included.
    live: u64,
    /// Finished traces' entries not written yet, and how many traces (children apart) they hold.
    held: Vec<serde_json::Value>,
    held_traces: u64,
}

impl Scope {
    /// The setting after `changes` over `current` (if any), with `fallback` for what is not given.
    /// A given count keeps what is left of it unless it is set again. Refused (with Triton's
    /// words), when `checked`, if it would trace but cannot: no trace file. (The start-up settings
    /// are not checked, as tritonserver's are not: without a file they trace nothing.)
    fn make(current: Option<&Scope>, fallback: &Settings, changes: &[Known], checked: bool) -> Result<Scope> {
        let mut given = current.map(|c| c.given.clone()).unwrap_or_default();
        // OpenTelemetry mode starts with a rate of 0 if told: only requests with a context are traced.
        apply(&mut given, changes, !checked && fallback.mode == Mode::OpenTelemetry)?;
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
            mode: fallback.mode,
            config: fallback.config.clone(),
        };
        if checked && now.mode == Mode::Triton && now.traces() && now.file.is_empty() {
            return Err(Error::invalid(
                "Attempting to set invalid trace setting :trace file name is not given",
            ));
        }
        Ok(Scope {
            id: 0,
            given,
            now,
            seen: 0,
            created: 0,
            collected: 0,
            live: 0,
            held: Vec::new(),
            held_traces: 0,
        })
    }
}

/// Settings, sampling counters and traces not yet written.
pub struct Tracer {
    /// The settings the server started with (`--trace-config` over Triton's defaults): what
    /// clearing a server setting returns to.
    start: Settings,
    global: Scope,
    pub(super) models: HashMap<String, Scope>,
    /// Settings replaced while some of their traces still ran.
    retired: Vec<Scope>,
    /// The setting of each running trace.
    running: HashMap<u64, u64>,
    next_id: u64,
    next_scope: u64,
    /// The index of the next `trace_file.<n>`.
    file_index: u64,
    /// Entries for `trace_file` (written at exit), and how many traces they hold.
    unindexed: Vec<serde_json::Value>,
    unindexed_traces: u64,
    /// Files due to be written.
    due: Vec<Write>,
}

impl Default for Tracer {
    fn default() -> Self {
        let start = defaults();
        let global = Scope::make(None, &start, &[], false).expect("the defaults are valid");
        Tracer {
            global,
            start,
            models: HashMap::new(),
            retired: Vec::new(),
            running: HashMap::new(),
            next_id: 0,
            next_scope: 0,
            file_index: 0,
            unindexed: Vec::new(),
            unindexed_traces: 0,
            due: Vec::new(),
        }
    }
}

impl Tracer {
    /// Starts with the server's `--trace-config` settings, which clearing a server setting
    /// later returns to.
    pub fn configure(&mut self, file: String, changes: &[Change]) -> Result<()> {
        self.configure_mode(Mode::Triton, Vec::new(), file, changes)
    }

    /// The same in a mode: OpenTelemetry's with its settings as the API shows them (`config`).
    pub fn configure_mode(
        &mut self,
        mode: Mode,
        config: Vec<(String, String)>,
        file: String,
        changes: &[Change],
    ) -> Result<()> {
        let changes = parse_changes(changes, mode)?;
        let base = Settings {
            file,
            mode,
            config,
            ..defaults()
        };
        let global = Scope::make(None, &base, &changes, false)?;
        self.start = global.now.clone();
        self.global = self.numbered(global);
        self.models.clear();
        Ok(())
    }

    fn numbered(&mut self, mut scope: Scope) -> Scope {
        self.next_scope += 1;
        scope.id = self.next_scope;
        scope
    }

    pub(super) fn active(&self) -> bool {
        self.global.now.traces() || self.models.values().any(|s| s.now.traces())
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

    /// The setting with this id: a current one, or one replaced while its traces ran.
    fn scope_by_id(&mut self, id: u64) -> Option<&mut Scope> {
        if self.global.id == id {
            return Some(&mut self.global);
        }
        if let Some(scope) = self.models.values_mut().find(|s| s.id == id) {
            return Some(scope);
        }
        self.retired.iter_mut().find(|s| s.id == id)
    }

    /// The settings of the server (`model` None) or of one model (its own over the server's).
    pub fn settings(&self, model: Option<&str>) -> Settings {
        self.scope(model).now.clone()
    }

    /// Changes settings of the server or of one model; all or nothing. A model's setting is made
    /// again over the server's new one (its given values kept), as Triton remakes them. The
    /// settings replaced write what they hold once their last trace has finished.
    pub fn update(&mut self, model: Option<&str>, changes: &[Change]) -> Result<Settings> {
        let changes = parse_changes(changes, self.start.mode)?;
        let mut replaced = Vec::new();
        match model {
            Some(m) => {
                let scope = Scope::make(self.models.get(m), &self.global.now, &changes, true)?;
                let old = if scope.given == Fields::default() {
                    self.models.remove(m)
                } else {
                    let scope = self.numbered(scope);
                    self.models.insert(m.to_string(), scope)
                };
                replaced.extend(old);
            }
            None => {
                let global = Scope::make(Some(&self.global), &self.start, &changes, true)?;
                let models = self
                    .models
                    .iter()
                    .map(|(m, s)| Ok((m.clone(), Scope::make(Some(s), &global.now, &[], false)?)))
                    .collect::<Result<Vec<_>>>()?;
                let global = self.numbered(global);
                replaced.push(std::mem::replace(&mut self.global, global));
                for (m, scope) in models {
                    let scope = self.numbered(scope);
                    replaced.extend(self.models.insert(m, scope));
                }
            }
        }
        for old in replaced {
            self.retire(old);
        }
        Ok(self.settings(model))
    }

    fn retire(&mut self, scope: Scope) {
        if scope.live == 0 {
            self.close(scope);
        } else {
            self.retired.push(scope);
        }
    }

    /// A setting's end: the traces it holds go to `trace_file.<n>` with a `log_frequency`, else to
    /// `trace_file` (as Triton's setting does when it is destroyed).
    fn close(&mut self, mut scope: Scope) {
        if scope.held.is_empty() {
            return;
        }
        if scope.now.log_frequency != 0 {
            self.indexed(std::mem::take(&mut scope.held));
            return;
        }
        self.unindexed.append(&mut scope.held);
        self.unindexed_traces += scope.held_traces;
        if self.unindexed_traces >= MAX_HELD_TRACES {
            self.unindexed_traces = 0;
            let entries = std::mem::take(&mut self.unindexed);
            self.indexed(entries);
        }
    }

    fn indexed(&mut self, entries: Vec<serde_json::Value>) {
        let path = format!("{}.{}", self.global.now.file, self.file_index);
        self.file_index += 1;
        self.due.push((path, entries));
    }

    /// Whether this request of `model` (a client's) is traced, and if so its trace id: the level
    /// traces, the count is not used up (each traced request takes one from it), and it is the
    /// `rate`-th request its setting has seen.
    pub fn sample(&mut self, model: &str) -> Option<u64> {
        if self.start.mode == Mode::OpenTelemetry {
            return self.sample_otel(model, false);
        }
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
        scope.live += 1;
        let scope = scope.id;
        self.next_id += 1;
        self.running.insert(self.next_id, scope);
        Some(self.next_id)
    }

    /// OpenTelemetry mode's sampling (Triton's `SampleTrace`): a request that brings a trace
    /// context (`forced`) is traced whatever the rate and count while the level traces; it is
    /// counted towards the rate, and a rate hit takes one from the count. Others are traced on a
    /// rate hit while the count lasts; a rate of 0 traces only requests with a context.
    pub fn sample_otel(&mut self, model: &str, forced: bool) -> Option<u64> {
        let scope = self.scope_mut(model);
        if !scope.now.traces() {
            return None;
        }
        let mut hit = false;
        if scope.now.rate != 0 {
            if scope.now.count == 0 && !forced {
                return None;
            }
            scope.seen += 1;
            hit = scope.seen.is_multiple_of(scope.now.rate);
            if hit && scope.now.count > 0 {
                scope.now.count -= 1;
            } else if hit && scope.now.count == 0 {
                hit = false;
            }
        }
        if !(hit || forced) {
            return None;
        }
        self.next_id += 1;
        Some(self.next_id)
    }

    /// A trace id for a request made on behalf of the traced request `parent` (its child),
    /// whatever the settings' rate and count, kept by the parent's setting; none without a
    /// trace file (in trace file mode).
    pub fn child(&mut self, parent: u64) -> Option<u64> {
        if self.start.mode == Mode::OpenTelemetry {
            self.next_id += 1;
            return Some(self.next_id);
        }
        if self.global.now.file.is_empty() {
            return None;
        }
        let scope = self.running.get(&parent).copied().unwrap_or(self.global.id);
        if let Some(s) = self.scope_by_id(scope) {
            s.live += 1;
        }
        self.next_id += 1;
        self.running.insert(self.next_id, scope);
        Some(self.next_id)
    }

    /// Keeps a finished trace with its setting and returns the files due now: its setting's
    /// `trace_file.<n>` when that holds `log_frequency` traces, when its count is used up and
    /// every request it saw is collected (Triton's rule), or when it holds [`MAX_HELD_TRACES`];
    /// and what a replaced setting held once its last trace is in. Without a trace file nothing
    /// is kept: nothing could ever write it.
    pub fn finish(&mut self, trace: &Trace) -> Vec<Write> {
        if self.global.now.file.is_empty() {
            return Vec::new();
        }
        let mut head = serde_json::json!({
            "id": trace.id, "model_name": trace.model, "model_version": trace.version, "request_id": trace.request_id,
        });
        if let Some(parent) = trace.parent_id {
            head["parent_id"] = parent.into();
        }
        let mut entries = vec![head];
        for (name, ns) in &trace.stamps {
            entries.push(serde_json::json!({"id": trace.id, "timestamps": [{"name": name, "ns": ns}]}));
        }
        let id = match self.running.remove(&trace.id) {
            Some(id) => id,
            None => self.scope_mut(&trace.model).id,
        };
        let Some(scope) = self.scope_by_id(id) else {
            return std::mem::take(&mut self.due);
        };
        scope.live = scope.live.saturating_sub(1);
        scope.held.append(&mut entries);
        let mut write = None;
        if trace.parent_id.is_none() {
            scope.held_traces += 1;
            scope.collected += 1;
            let used_up = scope.now.count == 0 && scope.collected >= scope.seen;
            let every = scope.now.log_frequency;
            let due = every != 0 && scope.held_traces >= every;
            if used_up || due || scope.held_traces >= MAX_HELD_TRACES {
                scope.held_traces = 0;
                write = Some(std::mem::take(&mut scope.held));
            }
        }
        if let Some(entries) = write {
            self.indexed(entries);
        }
        if let Some(at) = self.retired.iter().position(|s| s.id == id && s.live == 0) {
            let scope = self.retired.swap_remove(at);
            self.close(scope);
        }
        std::mem::take(&mut self.due)
    }

    /// The files due since the last call (a change of settings may make some).
    pub fn take_due(&mut self) -> Vec<Write> {
        std::mem::take(&mut self.due)
    }

    /// Every setting's end (at exit): the files to write, `trace_file` last.
    pub fn drain(&mut self) -> Vec<Write> {
        let mut scopes: Vec<Scope> = std::mem::take(&mut self.retired);
        scopes.extend(self.models.values_mut().map(|s| {
            let mut out = s.clone();
            s.held.clear();
            s.held_traces = 0;
            out.live = 0;
            out
        }));
        let global = self.global.clone();
        self.global.held.clear();
        self.global.held_traces = 0;
        scopes.push(global);
        for scope in scopes {
            self.close(scope);
        }
        if !self.unindexed.is_empty() && !self.global.now.file.is_empty() {
            self.unindexed_traces = 0;
            let entries = std::mem::take(&mut self.unindexed);
            self.due.push((self.global.now.file.clone(), entries));
        }
        std::mem::take(&mut self.due)
    }
}
