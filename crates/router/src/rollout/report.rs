//! A follower router's tally of a rollout's answers as it goes to the leader's guard (`POST
//! /mesh/v1/models/{m}/rollout` with `"action": "tally"`): each version's request and error counts
//! and its latency histogram as (bucket, count) pairs. Read as hostile as any body: versions
//! canonical, counts bounded and consistent, buckets in range.
use mesh::{Error, Result};
use serde_json::{json, Value};

use super::command::version;
use super::{Tally, Window};
use crate::metrics::histogram::{Histogram, BUCKETS};

/// The most answers one report may carry per version (a router reports every second).
pub const MAX_REPORTED: u64 = 10_000_000;

/// A report's fields.
const FIELDS: [&str; 6] = [
    "action",
    "serving",
    "candidate",
    "started",
    "serving_answers",
    "candidate_answers",
];

/// The report of `tally`.
pub fn body(tally: &Tally) -> Value {
    json!({
        "action": "tally",
        "serving": tally.serving,
        "candidate": tally.candidate,
        "started": tally.started,
        "serving_answers": window(&tally.serving_answers),
        "candidate_answers": window(&tally.candidate_answers),
    })
}

fn window(w: &Window) -> Value {
    json!({
        "requests": w.requests(),
        "errors": w.errors(),
        "latency": w.latency().sparse(),
    })
}

/// Whether a body is a tally report (its action says so).
pub fn is_report(body: &Value) -> bool {
    body.get("action").and_then(Value::as_str) == Some("tally")
}

/// Reads a report; every mistake is an invalid-argument error naming it.
pub fn parse(body: &Value) -> Result<Tally> {
    let fields = body
        .as_object()
        .ok_or_else(|| Error::invalid("a tally report is a JSON object"))?;
    if let Some(k) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(Error::invalid(format!("a tally report has no field '{k}'")));
    }
    let get = |k: &str| {
        fields
            .get(k)
            .ok_or_else(|| Error::invalid(format!("a tally report needs '{k}'")))
    };
    Ok(Tally {
        serving: version(get("serving")?, "serving")?,
        candidate: version(get("candidate")?, "candidate")?,
        started: get("started")?
            .as_u64()
            .ok_or_else(|| Error::invalid("'started' of a tally report must be the rollout's start, in ms"))?,
        serving_answers: read_window(get("serving_answers")?, "serving_answers")?,
        candidate_answers: read_window(get("candidate_answers")?, "candidate_answers")?,
    })
}

fn read_window(v: &Value, field: &str) -> Result<Window> {
    let bad = |why: &str| Error::invalid(format!("'{field}' of a tally report {why}"));
    let count = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .filter(|n| *n <= MAX_REPORTED)
            .ok_or_else(|| bad(&format!("needs '{k}', a count of at most {MAX_REPORTED}")))
    };
    let (requests, errors) = (count("requests")?, count("errors")?);
    if errors > requests {
        return Err(bad("counts more errors than requests"));
    }
    let pairs = v
        .get("latency")
        .and_then(Value::as_array)
        .filter(|p| p.len() <= BUCKETS)
        .ok_or_else(|| bad(&format!("needs 'latency', at most {BUCKETS} [bucket, count] pairs")))?;
    let mut read = Vec::with_capacity(pairs.len());
    for p in pairs {
        let pair = p.as_array().filter(|a| a.len() == 2).and_then(|a| {
            let b = a[0].as_u64().filter(|b| *b < BUCKETS as u64)?;
            let n = a[1].as_u64().filter(|n| *n <= MAX_REPORTED)?;
            Some((b as usize, n as u32))
        });
        read.push(pair.ok_or_else(|| {
            bad(&format!(
                "has a latency pair that is not [bucket below {BUCKETS}, count]"
            ))
        })?);
    }
    let latency = Histogram::from_sparse(&read).ok_or_else(|| bad("has a bucket out of range"))?;
    if u64::from(latency.total()) != requests {
        return Err(bad("counts a latency for other than each request"));
    }
    Ok(Window::from_parts(requests, errors, latency))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rollout::Arm;

    #[test]
    fn a_report_reads_back_as_the_tally_it_was() {
        let mut t = Tally::new("1", "2", 7);
        for i in 0..50u64 {
            t.record(Arm::Serving, true, Duration::from_millis(10 + i));
            t.record(Arm::Candidate, i % 5 != 0, Duration::from_millis(40));
        }
        let back = parse(&body(&t)).unwrap();
        assert!(is_report(&body(&t)));
        assert_eq!(
            (back.serving.as_str(), back.candidate.as_str(), back.started),
            ("1", "2", 7)
        );
        assert_eq!(
            (back.candidate_answers.requests(), back.candidate_answers.errors()),
            (50, 10)
        );
        assert_eq!(back.serving_answers.p99(), t.serving_answers.p99());
        assert_eq!(back.candidate_answers.p99(), t.candidate_answers.p99());
    }

    #[test]
    fn a_hostile_report_is_refused_naming_the_problem() {
        let good = body(&Tally::new("1", "2", 7));
        let with = |path: &[&str], v: Value| {
            let mut b = good.clone();
            let mut at = &mut b;
            for p in &path[..path.len() - 1] {
                at = &mut at[*p];
            }
            at[path[path.len() - 1]] = v;
            parse(&b).unwrap_err().message
        };
        assert!(parse(&good).is_ok());
        assert!(with(&["serving"], json!("0")).contains("'serving' must be a version"));
        assert!(with(&["extra"], json!(1)).contains("no field 'extra'"));
        assert!(with(&["started"], json!(-1)).contains("'started' of a tally report"));
        assert!(with(&["serving_answers", "requests"], json!(MAX_REPORTED + 1)).contains("at most"));
        assert!(with(&["serving_answers", "errors"], json!(1)).contains("more errors than requests"));
        assert!(with(&["candidate_answers", "latency"], json!([[BUCKETS, 1]])).contains("bucket below"));
        assert!(with(&["candidate_answers", "latency"], json!([[3, 1]])).contains("other than each request"));
        assert!(with(&["candidate_answers", "latency"], json!(vec![[0, 0]; BUCKETS + 1])).contains("at most"));
        assert!(parse(&json!([])).unwrap_err().message.contains("JSON object"));
    }
}
