//! Tests of error kinds, the error tally and the summary's table and JSON.
use super::*;

fn summary(latencies_us: &[u64], errors: &[(ErrorKind, &str)]) -> Summary {
    let mut latency_ns = Histogram::new();
    for us in latencies_us {
        latency_ns.record(us * 1000);
    }
    let mut tally = ErrorTally::default();
    for (kind, msg) in errors {
        tally.record(RequestError::new(*kind, *msg));
    }
    Summary {
        model: "mlp".into(),
        model_version: String::new(),
        protocol: "http",
        url: "http://localhost:8000".into(),
        concurrency: 4,
        batch: 2,
        elapsed: Duration::from_secs(2),
        latency_ns,
        errors: tally,
    }
}

#[test]
fn error_kinds_are_named_for_people() {
    let names: Vec<String> = [
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::Disconnected,
        ErrorKind::Protocol,
        ErrorKind::Http(503),
        ErrorKind::Grpc(14),
        ErrorKind::Grpc(5),
        ErrorKind::Grpc(99),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(
        names,
        [
            "connect",
            "timeout",
            "disconnected",
            "protocol",
            "HTTP 503",
            "UNAVAILABLE",
            "NOT_FOUND",
            "UNKNOWN"
        ]
    );
    assert_eq!(grpc_code_name(0), "OK");
    assert_eq!(grpc_code_name(16), "UNAUTHENTICATED");
    assert_eq!(grpc_code_name(-1), "UNKNOWN");
}

#[test]
fn the_tally_counts_by_kind_and_keeps_the_first_example() {
    let mut a = ErrorTally::default();
    a.record(RequestError::new(ErrorKind::Http(503), "busy 1"));
    a.record(RequestError::new(ErrorKind::Http(503), "busy 2"));
    a.record(RequestError::new(ErrorKind::Timeout, "slow"));
    let mut b = ErrorTally::default();
    b.record(RequestError::new(ErrorKind::Http(503), "busy 3"));
    b.record(RequestError::new(ErrorKind::Connect, "refused"));
    a.merge(b);
    let rows: Vec<(ErrorKind, u64, &str)> = a.iter().collect();
    assert_eq!(
        rows,
        [
            (ErrorKind::Connect, 1, "refused"),
            (ErrorKind::Timeout, 1, "slow"),
            (ErrorKind::Http(503), 3, "busy 1")
        ]
    );
    assert_eq!(a.total(), 5);
}

#[test]
fn json_has_the_documented_shape() {
    let s = summary(
        &[100, 200, 300, 400],
        &[(ErrorKind::Http(503), "overloaded"), (ErrorKind::Http(503), "again")],
    );
    let j = s.to_json();
    for key in [
        "model",
        "protocol",
        "concurrency",
        "duration_s",
        "requests",
        "ok",
        "errors",
        "throughput_rps",
        "latency_us",
    ] {
        assert!(j.get(key).is_some(), "missing {key}");
    }
    assert_eq!(j["model"], "mlp");
    assert_eq!(j["protocol"], "http");
    assert_eq!(j["concurrency"], 4);
    assert_eq!(j["duration_s"], 2.0);
    assert_eq!(
        (j["requests"].as_u64(), j["ok"].as_u64(), j["failed"].as_u64()),
        (Some(6), Some(4), Some(2))
    );
    assert_eq!(j["errors"], json!({"HTTP 503": {"count": 2, "example": "overloaded"}}));
    assert_eq!(j["throughput_rps"], 2.0);
    assert_eq!(j["throughput_infer_per_s"], 4.0);
    let lat = &j["latency_us"];
    // max and mean are exact; percentiles are within 0.4% (the middle of their bucket).
    assert_eq!((lat["max"].as_f64(), lat["mean"].as_f64()), (Some(400.0), Some(250.0)));
    for (p, want) in [("p50", 200.0), ("p90", 400.0), ("p99", 400.0)] {
        let got = lat[p].as_f64().unwrap();
        assert!((got - want).abs() <= want * 0.004, "{p}: {got}");
    }
}

#[test]
fn json_latencies_are_null_when_nothing_succeeded() {
    let j = summary(&[], &[(ErrorKind::Connect, "connection refused")]).to_json();
    assert_eq!(j["ok"], 0);
    assert_eq!(j["throughput_rps"], 0.0);
    assert!(j["latency_us"]["p50"].is_null() && j["latency_us"]["mean"].is_null());
}

#[test]
fn the_table_reads_at_a_glance() {
    let table = summary(&[100, 200, 300, 1500], &[]).to_table();
    let expected = "\
model        mlp
protocol     http http://localhost:8000
concurrency  4
batch        2
duration     2.00 s
requests     4 (all ok)
throughput   2.0 req/s, 4.0 infer/s

latency             p50        p90        p99        max       mean
               200.2 µs    1.50 ms    1.50 ms    1.50 ms   525.0 µs";
    assert_eq!(table, expected);
    assert!(!table.contains("errors"));
}

#[test]
fn the_table_lists_errors_with_an_example_each() {
    let long = "x ".repeat(200);
    let mut s = summary(
        &[100],
        &[
            (ErrorKind::Grpc(14), "model busy\nretry later"),
            (ErrorKind::Timeout, &long),
        ],
    );
    s.model_version = "3".into();
    let table = s.to_table();
    assert!(table.starts_with("model        mlp (version 3)\n"), "{table}");
    assert!(table.contains("requests     3 (1 ok, 2 failed)"), "{table}");
    assert!(
        table.contains("\nerrors          count  example\ntimeout             1  x x x"),
        "{table}"
    );
    assert!(
        table.contains("\nUNAVAILABLE         1  model busy retry later"),
        "{table}"
    );
    let timeout_line = table.lines().find(|l| l.starts_with("timeout")).unwrap();
    assert!(
        timeout_line.ends_with('…') && timeout_line.chars().count() < 140,
        "{timeout_line}"
    );
}

#[test]
fn latencies_pick_a_readable_unit() {
    assert_eq!(format_us(12.34), "12.3 µs");
    assert_eq!(format_us(999.94), "999.9 µs");
    assert_eq!(format_us(12_345.0), "12.35 ms");
    assert_eq!(format_us(2_500_000.0), "2.500 s");
}
