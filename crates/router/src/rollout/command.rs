//! The operator's rollout commands as the router's API takes them (`POST
//! /mesh/v1/models/{m}/rollout`): a small JSON object read with a bound on its size and values,
//! every field checked in words an operator can act on, defaults filled in, so that what a follower
//! hands to the leader ([`Command::body`]) reads back as the same command.
use std::time::Duration;

use mesh::error::Code;
use mesh::{Error, Result};
use serde_json::{json, Map, Value};

use super::{Guard, Spec};

/// The largest request body taken (a start with every field is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// The most steps a rollout may have.
pub const MAX_STEPS: usize = 20;
/// The longest minimum time of a step: a week.
pub const MAX_STEP_SECONDS: u64 = 7 * 24 * 3600;
/// The largest request count a step or the guard may wait for.
pub const MAX_REQUESTS: u64 = 1_000_000_000;
/// The steps of a start that names none, in percent.
pub const DEFAULT_STEPS: [u8; 4] = [5, 25, 50, 100];
pub const DEFAULT_STEP_SECONDS: u64 = 60;
pub const DEFAULT_STEP_REQUESTS: u64 = 100;
/// The largest version number taken (Triton's version directories are int64).
const MAX_VERSION: u64 = i64::MAX as u64;

/// A start: what the rollout is to do (the serving version, when not given, is found by placement).
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub candidate: String,
    pub serving: Option<String>,
    pub steps: Vec<u8>,
    pub min_step_seconds: u64,
    pub min_step_requests: u64,
    pub guard: Guard,
    /// Percent of the serving version's requests also sent to the candidate as shadows.
    pub shadow: u8,
}

impl Start {
    /// The spec of this start for `model`, serving `serving`, checked.
    pub fn spec(&self, model: &str, serving: &str) -> Result<Spec> {
        let spec = Spec {
            model: model.to_string(),
            serving: serving.to_string(),
            candidate: self.candidate.clone(),
            steps: self.steps.clone(),
            min_step_time: Duration::from_secs(self.min_step_seconds),
            min_step_requests: self.min_step_requests,
            guard: self.guard,
            shadow: self.shadow,
        };
        spec.check().map_err(Error::invalid)?;
        Ok(spec)
    }
}

/// One operator command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Start(Start),
    Pause,
    Resume,
    Promote,
    Abort,
}

const START_FIELDS: [&str; 10] = [
    "action",
    "candidate",
    "serving",
    "steps",
    "min_step_seconds",
    "min_step_requests",
    "min_requests",
    "max_error_rate_increase",
    "max_p99_ratio",
    "shadow",
];

impl Command {
    /// The action's name, as the body gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Start(_) => "start",
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Promote => "promote",
            Command::Abort => "abort",
        }
    }

    /// Reads a request body: `{"action": "start", "candidate": "2", ...}` or `{"action": "pause"}`
    /// (resume, promote, abort). Every mistake is an invalid-argument error naming the field.
    pub fn parse(body: &[u8]) -> Result<Command> {
        Command::from_value(Command::read(body)?)
    }

    /// A rollout request's body as JSON, read within its bounds (413 past [`MAX_BODY_BYTES`]).
    pub fn read(body: &[u8]) -> Result<Value> {
        if body.len() > MAX_BODY_BYTES {
            return Err(Error::new(
                Code::PayloadTooLarge,
                format!(
                    "the rollout request is {} bytes; at most {MAX_BODY_BYTES} are read",
                    body.len()
                ),
            ));
        }
        mesh::http::json_bounded::parse(body, "rollout request")
    }

    /// The command a request's JSON body gives.
    pub fn from_value(value: Value) -> Result<Command> {
        let Value::Object(fields) = value else {
            return Err(Error::invalid(
                "the rollout request must be a JSON object such as {\"action\": \"start\", \"candidate\": \"2\"}",
            ));
        };
        let action = match fields.get("action") {
            Some(Value::String(a)) => a.as_str(),
            _ => return Err(Error::invalid("give 'action': start, pause, resume, promote or abort")),
        };
        if !["start", "pause", "resume", "promote", "abort"].contains(&action) {
            return Err(Error::invalid(format!(
                "unknown rollout action '{}': start, pause, resume, promote or abort",
                shown(action)
            )));
        }
        let known: &[&str] = if action == "start" { &START_FIELDS } else { &["action"] };
        if let Some(extra) = fields.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(Error::invalid(format!(
                "'{}' is not a field of the rollout action '{action}' (its fields: {})",
                shown(extra),
                known.join(", ")
            )));
        }
        Ok(match action {
            "start" => Command::Start(start(&fields)?),
            "pause" => Command::Pause,
            "resume" => Command::Resume,
            "promote" => Command::Promote,
            _ => Command::Abort,
        })
    }

    /// The body that reads back as this command (what a follower hands to the leader).
    pub fn body(&self) -> Value {
        match self {
            Command::Start(s) => {
                let mut body = json!({
                    "action": "start",
                    "candidate": s.candidate,
                    "steps": s.steps,
                    "min_step_seconds": s.min_step_seconds,
                    "min_step_requests": s.min_step_requests,
                    "min_requests": s.guard.min_requests,
                    "max_error_rate_increase": s.guard.max_error_rate_increase,
                    "max_p99_ratio": s.guard.max_p99_ratio,
                    "shadow": s.shadow,
                });
                if let Some(serving) = &s.serving {
                    body["serving"] = json!(serving);
                }
                body
            }
            other => json!({ "action": other.name() }),
        }
    }
}

/// A start's fields, each checked, defaults filled in.
fn start(fields: &Map<String, Value>) -> Result<Start> {
    let candidate = match fields.get("candidate") {
        Some(v) => version(v, "candidate")?,
        None => {
            return Err(Error::invalid(
                "a start needs 'candidate': the version to roll out, such as \"2\"",
            ))
        }
    };
    let serving = fields.get("serving").map(|v| version(v, "serving")).transpose()?;
    if serving.as_ref() == Some(&candidate) {
        return Err(Error::invalid(format!(
            "'serving' and 'candidate' are both version {candidate}: the candidate must be another version"
        )));
    }
    let steps = match fields.get("steps") {
        Some(v) => steps(v)?,
        None => DEFAULT_STEPS.to_vec(),
    };
    let defaults = Guard::default();
    let start = Start {
        candidate,
        serving,
        steps,
        min_step_seconds: count(fields, "min_step_seconds", DEFAULT_STEP_SECONDS, 0, MAX_STEP_SECONDS)?,
        min_step_requests: count(fields, "min_step_requests", DEFAULT_STEP_REQUESTS, 0, MAX_REQUESTS)?,
        guard: Guard {
            min_requests: count(fields, "min_requests", defaults.min_requests, 1, MAX_REQUESTS)?,
            max_error_rate_increase: ratio(fields, "max_error_rate_increase", defaults.max_error_rate_increase)?,
            max_p99_ratio: ratio(fields, "max_p99_ratio", defaults.max_p99_ratio)?,
        },
        shadow: count(fields, "shadow", 0, 0, 100)? as u8,
    };
    // The steps and margins, checked by the spec itself (the serving version is known later).
    start.spec("", start.serving.as_deref().unwrap_or(""))?;
    Ok(start)
}

/// A version as Triton names its directories: a positive integer, as a string or a number;
/// answered in its plain form ("02" is "2").
pub fn version(v: &Value, field: &str) -> Result<String> {
    let n = match v {
        Value::String(s) if !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u64>().ok()
        }
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    match n {
        Some(n) if (1..=MAX_VERSION).contains(&n) => Ok(n.to_string()),
        _ => Err(Error::invalid(format!(
            "'{field}' must be a version as Triton names its version directories, a positive integer \
             such as \"2\", not {}",
            shown(&v.to_string())
        ))),
    }
}

fn steps(v: &Value) -> Result<Vec<u8>> {
    let bad = || {
        Error::invalid(format!(
            "'steps' must be a list of at most {MAX_STEPS} whole percentages rising to 100, such as \
             [5, 25, 50, 100], not {}",
            shown(&v.to_string())
        ))
    };
    let Value::Array(items) = v else { return Err(bad()) };
    if items.is_empty() || items.len() > MAX_STEPS {
        return Err(bad());
    }
    items
        .iter()
        .map(|i| {
            i.as_u64()
                .filter(|p| (1..=100).contains(p))
                .map(|p| p as u8)
                .ok_or_else(bad)
        })
        .collect()
}

/// A whole number between `lo` and `hi`, or `default` when not given.
fn count(fields: &Map<String, Value>, field: &str, default: u64, lo: u64, hi: u64) -> Result<u64> {
    match fields.get(field) {
        None => Ok(default),
        Some(v) => v.as_u64().filter(|n| (lo..=hi).contains(n)).ok_or_else(|| {
            Error::invalid(format!(
                "'{field}' must be a whole number from {lo} to {hi}, not {}",
                shown(&v.to_string())
            ))
        }),
    }
}

/// A number (its range is checked with the spec), or `default` when not given.
fn ratio(fields: &Map<String, Value>, field: &str, default: f64) -> Result<f64> {
    match fields.get(field) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| Error::invalid(format!("'{field}' must be a number, not {}", shown(&v.to_string())))),
    }
}

/// A client's text in an error, cut short.
fn shown(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
