//! Tests of the command line, durations, and whole runs against a small fake KServe HTTP server.
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicUsize;

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

fn parse(args: &[&str]) -> BenchArgs {
    let argv = ["mesh-ops", "bench"].iter().chain(args);
    match Cli::try_parse_from(argv).expect("parses").command {
        Command::Bench(b) => b,
        other => panic!("{other:?}"),
    }
}

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
    for bad in ["", "0s", "s", "10x", "-1s", "1..2s"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_command_line_has_defaults_and_checks() {
    let a = parse(&["mlp"]);
    assert_eq!(
        (a.model.as_str(), a.url.as_str(), a.protocol),
        ("mlp", "http://localhost:8000", Protocol::Http)
    );
    assert_eq!((a.concurrency, a.batch, a.duration, a.requests), (1, 1, None, None));
    assert_eq!(
        (a.input.clone(), a.timeout, a.json, a.no_progress),
        (InputSource::Random, Duration::from_secs(30), false, false)
    );
    let a = parse(&[
        "m",
        "--protocol",
        "grpc",
        "--grpc-url",
        "h:1",
        "-c",
        "8",
        "--requests",
        "100",
        "--input",
        "d.json",
        "--batch",
        "4",
        "--shape",
        "x:1,2",
        "--shape",
        "y:3",
        "--timeout",
        "2s",
        "--json",
        "--no-progress",
        "--model-version",
        "2",
    ]);
    assert_eq!(
        (a.protocol, a.grpc_url.as_str(), a.concurrency, a.requests),
        (Protocol::Grpc, "h:1", 8, Some(100))
    );
    assert_eq!(
        (a.batch, a.shapes.len(), a.timeout, a.model_version.as_deref()),
        (4, 2, Duration::from_secs(2), Some("2"))
    );
    assert!(a.json && a.no_progress);
    assert_eq!(
        parse(&["m", "--duration", "1m"]).duration,
        Some(Duration::from_secs(60))
    );
    let bad: [&[&str]; 6] = [
        &["m", "--duration", "1s", "--requests", "5"],
        &["m", "-c", "0"],
        &["m", "--requests", "0"],
        &["m", "--protocol", "udp"],
        &["m", "--shape", "nocolon"],
        &[],
    ];
    for args in bad {
        let argv = ["mesh-ops", "bench"].iter().chain(args);
        assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
    }
}

#[test]
fn io_errors_are_described_plainly() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(describe_io(&refused), "connection refused");
    let wrapped = std::io::Error::other(refused);
    assert_eq!(describe(&wrapped), "connection refused");
}

/// How long model `slow` takes to answer: far longer than any wait a test allows, so a bench that
/// waited for its answers instead of abandoning them could not pass, however slow the machine.
const SLOW_ANSWER: Duration = Duration::from_secs(60);

/// A KServe v2 HTTP server for model `m` (x: FP32 [-1, 4], max_batch_size 8) that answers every
/// fifth inference with 503, and model `slow` (no inputs) that answers after 60 s; it counts
/// the inference requests of `m` it saw.
fn fake_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let infers = Arc::new(AtomicUsize::new(0));
    let seen = infers.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || serve(conn, &seen));
        }
    });
    (url, infers)
}

fn serve(conn: TcpStream, infers: &AtomicUsize) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_ascii_lowercase());
        }
        let header = |name: &str| {
            head.iter()
                .find_map(|h| h.strip_prefix(&format!("{name}: ")).map(str::to_string))
        };
        let mut body = vec![0; header("content-length").map_or(0, |n| n.parse().unwrap())];
        reader.read_exact(&mut body).unwrap();
        let path = head[0].split(' ').nth(1).unwrap_or("").to_string();
        let (status, answer) = match path.as_str() {
            "/v2/models/slow" => ("200 OK", r#"{"name":"slow","inputs":[]}"#),
            "/v2/models/slow/config" => ("200 OK", "{}"),
            "/v2/models/slow/infer" => {
                std::thread::sleep(SLOW_ANSWER);
                ("200 OK", "{}")
            }
            "/v2/models/m" => (
                "200 OK",
                r#"{"name":"m","inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]}]}"#,
            ),
            "/v2/models/m/config" => ("200 OK", r#"{"name":"m","max_batch_size":8}"#),
            "/v2/models/m/infer" => {
                let json_len: usize = header("inference-header-content-length").unwrap().parse().unwrap();
                let json: serde_json::Value = serde_json::from_slice(&body[..json_len]).unwrap();
                assert_eq!(json["inputs"][0]["shape"], serde_json::json!([2, 4]));
                assert_eq!(body.len() - json_len, 2 * 4 * 4);
                if infers.fetch_add(1, Ordering::SeqCst) % 5 == 4 {
                    ("503 Service Unavailable", r#"{"error":"busy"}"#)
                } else {
                    ("200 OK", r#"{"outputs":[]}"#)
                }
            }
            _ => (
                "404 Not Found",
                r#"{"error":"Request for unknown model: 'nope' is not found"}"#,
            ),
        };
        let reply = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{answer}", answer.len());
        if conn.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn a_run_counts_every_request_and_tallies_failures() {
    let (url, infers) = fake_server();
    let args = parse(&[
        "m",
        "--url",
        &url,
        "-c",
        "3",
        "--requests",
        "50",
        "--batch",
        "2",
        "--no-progress",
    ]);
    let s = run(&args).unwrap();
    assert_eq!((s.requests(), s.ok(), s.errors.total()), (50, 40, 10));
    assert_eq!(infers.load(Ordering::SeqCst), 50);
    let rows: Vec<_> = s.errors.iter().collect();
    assert_eq!(rows, [(ErrorKind::Http(503), 10, "busy")]);
    assert_eq!((s.batch, s.concurrency, s.protocol), (2, 3, "http"));
    assert!(s.latency_ns.quantile(0.5).unwrap() > 0);
}

#[test]
fn a_timed_run_stops_after_its_duration() {
    let (url, _) = fake_server();
    let args = parse(&[
        "m",
        "--url",
        &url,
        "--duration",
        "300ms",
        "--batch",
        "2",
        "--no-progress",
    ]);
    let s = run(&args).unwrap();
    assert!(s.requests() > 0);
    assert!(
        s.elapsed >= Duration::from_millis(300) && s.elapsed < Duration::from_secs(60),
        "{:?}",
        s.elapsed
    );
}

#[test]
fn requests_without_an_answer_in_time_are_timeouts() {
    let (url, _) = fake_server();
    let args = parse(&[
        "slow",
        "--url",
        &url,
        "-c",
        "2",
        "--requests",
        "4",
        "--timeout",
        "100ms",
    ]);
    let s = run(&args).unwrap();
    assert_eq!((s.requests(), s.ok()), (4, 0));
    let rows: Vec<_> = s.errors.iter().collect();
    assert_eq!(rows, [(ErrorKind::Timeout, 4, "no answer within 0.100 s")]);
    // Two rounds of 100 ms each; waiting for the answers would take two rounds of SLOW_ANSWER.
    assert!(
        s.elapsed >= Duration::from_millis(200) && s.elapsed < SLOW_ANSWER / 2,
        "abandoned, not waited for: {:?}",
        s.elapsed
    );
}

#[test]
fn an_unknown_model_is_a_setup_error_naming_it() {
    let (url, _) = fake_server();
    let e = run(&parse(&["nope", "--url", &url, "--requests", "1"])).unwrap_err();
    assert_eq!(e.kind, SetupKind::UnknownModel);
    assert!(
        e.message.starts_with("model 'nope': ") && e.message.contains("HTTP 404"),
        "{}",
        e.message
    );
    assert!(e.message.contains("is not found"), "{}", e.message);
}

#[test]
fn a_missing_input_file_is_a_usage_error() {
    let (url, _) = fake_server();
    let e = run(&parse(&["m", "--url", &url, "--input", "/nonexistent/d.json"])).unwrap_err();
    assert_eq!(e.kind, SetupKind::Usage);
    assert!(e.message.starts_with("--input /nonexistent/d.json: "), "{}", e.message);
}
