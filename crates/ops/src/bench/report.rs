//! The outcome of a run: error kinds and their tally, and the summary as an aligned table or JSON.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use serde_json::{json, Value};

use super::histogram::Histogram;

/// Why one request failed: the key its failures are counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// No connection could be made.
    Connect,
    /// No answer within `--timeout`.
    Timeout,
    /// The connection closed or broke before the answer was complete.
    Disconnected,
    /// The answer was not valid HTTP/gRPC.
    Protocol,
    /// An HTTP answer with a status other than 2xx.
    Http(u16),
    /// A gRPC status other than OK (the code's number).
    Grpc(i32),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Connect => f.write_str("connect"),
            ErrorKind::Timeout => f.write_str("timeout"),
            ErrorKind::Disconnected => f.write_str("disconnected"),
            ErrorKind::Protocol => f.write_str("protocol"),
            ErrorKind::Http(status) => write!(f, "HTTP {status}"),
            ErrorKind::Grpc(code) => f.write_str(grpc_code_name(*code)),
        }
    }
}

/// The canonical upper-case name of a gRPC status code, as in the gRPC spec.
pub fn grpc_code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

/// One failed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    pub kind: ErrorKind,
    pub message: String,
}

impl RequestError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RequestError {
            kind,
            message: message.into(),
        }
    }
}

/// Failures counted by kind, each with the first message seen as its example.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorTally {
    by_kind: BTreeMap<ErrorKind, (u64, String)>,
}

impl ErrorTally {
    pub fn record(&mut self, e: RequestError) {
        self.by_kind.entry(e.kind).or_insert((0, e.message)).0 += 1;
    }

    pub fn merge(&mut self, other: ErrorTally) {
        for (kind, (count, example)) in other.by_kind {
            self.by_kind.entry(kind).or_insert((0, example)).0 += count;
        }
    }

    /// Every failure counted.
    pub fn total(&self) -> u64 {
        self.by_kind.values().map(|(n, _)| n).sum()
    }

    /// (kind, count, example) in kind order.
    pub fn iter(&self) -> impl Iterator<Item = (ErrorKind, u64, &str)> {
        self.by_kind.iter().map(|(k, (n, ex))| (*k, *n, ex.as_str()))
    }
}

/// Everything a run measured.
#[derive(Clone, Debug)]
pub struct Summary {
    pub model: String,
    /// Empty when the server chose the version.
    pub model_version: String,
    /// "http" or "grpc".
    pub protocol: &'static str,
    /// The address requests went to.
    pub url: String,
    pub concurrency: u32,
    pub batch: u32,
    /// From the first request sent to the last answer received.
    pub elapsed: Duration,
    /// Latencies of successful requests, in nanoseconds.
    pub latency_ns: Histogram,
    pub errors: ErrorTally,
}

impl Summary {
    /// Requests answered (successfully or not).
    pub fn requests(&self) -> u64 {
        self.ok() + self.errors.total()
    }

    pub fn ok(&self) -> u64 {
        self.latency_ns.count()
    }

    /// Successful requests per second.
    pub fn throughput_rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ok() as f64 / secs
        } else {
            0.0
        }
    }

    /// Latencies in µs (one decimal): p50, p90, p99, max, mean; None when nothing succeeded.
    fn latencies_us(&self) -> [(&'static str, Option<f64>); 5] {
        let h = &self.latency_ns;
        let us = |ns: Option<f64>| ns.map(|v| (v / 100.0).round() / 10.0);
        [
            ("p50", us(h.quantile(0.50).map(|v| v as f64))),
            ("p90", us(h.quantile(0.90).map(|v| v as f64))),
            ("p99", us(h.quantile(0.99).map(|v| v as f64))),
            ("max", us(h.max().map(|v| v as f64))),
            ("mean", us(h.mean())),
        ]
    }

    /// The summary as one JSON object (latencies in µs; throughput counts successful requests).
    pub fn to_json(&self) -> Value {
        let errors: serde_json::Map<String, Value> = self
            .errors
            .iter()
            .map(|(kind, count, example)| (kind.to_string(), json!({"count": count, "example": example})))
            .collect();
        let latency: serde_json::Map<String, Value> = self
            .latencies_us()
            .into_iter()
            .map(|(name, v)| (name.to_string(), json!(v)))
            .collect();
        let rps = self.throughput_rps();
        json!({
            "model": self.model,
            "model_version": self.model_version,
            "protocol": self.protocol,
            "url": self.url,
            "concurrency": self.concurrency,
            "batch": self.batch,
            "duration_s": (self.elapsed.as_secs_f64() * 1e6).round() / 1e6,
            "requests": self.requests(),
            "ok": self.ok(),
            "failed": self.errors.total(),
            "errors": errors,
            "throughput_rps": round3(rps),
            "throughput_infer_per_s": round3(rps * f64::from(self.batch)),
            "latency_us": latency,
        })
    }

    /// The summary for a person: key/value lines, a latency table and an error table.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let version = if self.model_version.is_empty() {
            String::new()
        } else {
            format!(" (version {})", self.model_version)
        };
        let rps = self.throughput_rps();
        let failed = self.errors.total();
        let requests = if failed == 0 {
            format!("{} (all ok)", self.requests())
        } else {
            format!("{} ({} ok, {} failed)", self.requests(), self.ok(), failed)
        };
        let rows = [
            ("model", format!("{}{version}", self.model)),
            ("protocol", format!("{} {}", self.protocol, self.url)),
            ("concurrency", self.concurrency.to_string()),
            ("batch", self.batch.to_string()),
            ("duration", format!("{:.2} s", self.elapsed.as_secs_f64())),
            ("requests", requests),
            (
                "throughput",
                format!("{rps:.1} req/s, {:.1} infer/s", rps * f64::from(self.batch)),
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(out, "{k:<12} {v}");
        }
        out.push('\n');
        let lat = self.latencies_us();
        let mut header = format!("{:<12}", "latency");
        let mut values = format!("{:<12}", "");
        for (name, v) in lat {
            let _ = write!(header, " {name:>10}");
            let _ = write!(values, " {:>10}", v.map_or_else(|| "-".to_string(), format_us));
        }
        let _ = writeln!(out, "{}", header.trim_end());
        let _ = writeln!(out, "{}", values.trim_end());
        if failed > 0 {
            let width = self
                .errors
                .iter()
                .map(|(k, _, _)| k.to_string().len())
                .max()
                .unwrap_or(0)
                .max(12);
            let _ = writeln!(out, "\n{:<width$} {:>8}  example", "errors", "count");
            for (kind, count, example) in self.errors.iter() {
                let _ = writeln!(
                    out,
                    "{:<width$} {count:>8}  {}",
                    kind.to_string(),
                    one_line(example, 100)
                );
            }
        }
        out.trim_end().to_string()
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A latency in µs written with a unit that suits it: `812.4 µs`, `12.35 ms`, `1.204 s`.
pub fn format_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.3} s", us / 1_000_000.0)
    }
}

/// The message on one line, cut to `max` characters with an ellipsis.
fn one_line(msg: &str, max: usize) -> String {
    let flat: String = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
