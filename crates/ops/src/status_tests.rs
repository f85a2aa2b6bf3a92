//! Tests of `mesh-ops status`: rendering fixture views, and fetching from a one-shot HTTP server.

use std::net::TcpListener;
use std::time::Duration;

use super::{age, cluster_url, parse, pretty_json, render, run, seconds, ClusterView};
use crate::http::tests::serve_once;

const TIMEOUT: Duration = Duration::from_secs(5);

const FIXTURE: &str = r#"{
  "router": {"version": "0.1.0", "uptime_s": 12.5, "build": "extra field"},
  "nodes": [
    {"name": "node-a", "incarnation": "9f3c", "address": "127.0.0.1:40123", "state": "up",
     "models": ["add_sub:1", "mlp:1"], "inflight": 3, "last_report_ms": 120, "devices": ["cpu"]},
    {"name": "node-b", "incarnation": "77aa", "address": "10.0.0.2:40001", "state": "silent",
     "models": ["add_sub:1", "resnet50:1", "densenet121:1", "squeezenet:1"], "inflight": 0,
     "last_report_ms": 3210, "devices": ["cpu", "gpu0"], "zone": "b"},
    {"name": "node-c", "address": "10.0.0.3:40001", "state": "lost", "last_report_ms": null}
  ],
  "models": [
    {"name": "add_sub", "version": "1", "state": "READY", "nodes": ["node-a", "node-b"], "reason": ""},
    {"name": "mlp", "version": 2, "state": "UNAVAILABLE", "nodes": [], "reason": "no node has room"}
  ]
}"#;

const TABLES: &str = "\
router 0.1.0, up 12.5 s: 3 nodes (1 up), 2 models

NODES
NAME    ADDRESS          STATE   MODELS            IN FLIGHT  LAST REPORT  DEVICES
node-a  127.0.0.1:40123  up      add_sub:1, mlp:1  3          120 ms       cpu
node-b  10.0.0.2:40001   silent  4 models          0          3.2 s        cpu, gpu0
node-c  10.0.0.3:40001   lost    -                 -          -            -

MODELS
NAME     VERSION  STATE        NODES           REASON
add_sub  1        READY        node-a, node-b  -
mlp      2        UNAVAILABLE  -               no node has room
";

#[test]
fn fixture_renders_as_aligned_tables() {
    let view = parse("http://x", FIXTURE).expect("fixture");
    assert_eq!(render(&view), TABLES);
}

#[test]
fn missing_null_and_odd_fields_are_tolerated() {
    let view = parse(
        "http://x",
        r#"{"nodes": [{"name": "n", "models": null, "inflight": "many"}, 7], "extra": 1}"#,
    )
    .expect("sparse view");
    assert_eq!(view.nodes.len(), 1);
    assert_eq!((view.nodes[0].inflight, view.nodes[0].models.len()), (None, 0));
    let text = render(&view);
    assert!(text.starts_with("router ?: 1 node (0 up), 0 models\n"), "{text}");
    assert!(text.contains("MODELS\n  (none)\n"), "{text}");
    assert_eq!(parse("http://x", "{}").expect("empty"), ClusterView::default());
    let err = parse("http://x", "[1, 2]").expect_err("not an object");
    assert!(err.to_string().contains("http://x"), "{err}");
}

#[test]
fn the_routers_part_in_placement_is_on_the_first_line() {
    let line = |lead: &str| {
        let body = format!(r#"{{"router": {{"version": "1", "lead": {lead}}}}}"#);
        let text = render(&parse("http://x", &body).expect("view"));
        text.lines().next().unwrap_or_default().to_string()
    };
    assert_eq!(
        line(r#"{"role": "single", "epoch": 0}"#),
        "router 1: 0 nodes (0 up), 0 models"
    );
    assert!(line(r#"{"role": "leader", "epoch": 7}"#).contains("placement leader (epoch 7)"));
    assert!(line(r#"{"role": "follower", "leader": "r2"}"#).contains("placement led by r2"));
    assert!(line(r#"{"role": "unknown", "why": "etcd: down"}"#).contains("no placement leader (etcd: down)"));
    assert!(line(r#""garbage""#).starts_with("router 1: 0 nodes"));
}

#[test]
fn control_characters_from_the_network_are_not_printed() {
    let view = parse("http://x", r#"{"nodes": [{"name": "evil\u001b[2J", "state": "up"}]}"#).expect("view");
    let text = render(&view);
    assert!(!text.contains('\u{1b}') && text.contains("evil?[2J"), "{text}");
}

#[test]
fn ages_and_durations_read_at_a_glance() {
    assert_eq!(age(120.0), "120 ms");
    assert_eq!(age(3210.0), "3.2 s");
    assert_eq!(age(245_000.0), "4m 05s");
    assert_eq!(age(-1.0), "-");
    assert_eq!(seconds(7380.0), "2h 03m");
    assert_eq!(seconds(3.0 * 86_400.0 + 4.0 * 3600.0), "3d 04h");
}

#[test]
fn router_urls() {
    assert_eq!(
        cluster_url("http://localhost:8000"),
        "http://localhost:8000/mesh/v1/cluster"
    );
    assert_eq!(cluster_url("http://r:8000/"), "http://r:8000/mesh/v1/cluster");
    assert_eq!(cluster_url("r:9000"), "http://r:9000/mesh/v1/cluster");
}

#[test]
fn pretty_json_keeps_the_order_received() {
    let json =
        r#"{"router":{"version":"0.1.0","uptime_s":12.50},"nodes":[],"models":[{"name":"a,b:{}","x":[1,2]}],"e":{ }}"#;
    let expected = r#"{
  "router": {
    "version": "0.1.0",
    "uptime_s": 12.50
  },
  "nodes": [],
  "models": [
    {
      "name": "a,b:{}",
      "x": [
        1,
        2
      ]
    }
  ],
  "e": {}
}"#;
    assert_eq!(pretty_json(json), expected);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&pretty_json(FIXTURE)).ok(),
        serde_json::from_str(FIXTURE).ok()
    );
}

fn json_answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn status_fetches_and_renders() {
    let (url, server) = serve_once(json_answer(FIXTURE));
    assert_eq!(run(&url, false, TIMEOUT).expect("status"), TABLES);
    assert!(server
        .join()
        .expect("server")
        .starts_with("GET /mesh/v1/cluster HTTP/1.1\r\n"));
    let (url, _server) = serve_once(json_answer(r#"{"nodes":[],"router":{}}"#));
    assert_eq!(
        run(&url, true, TIMEOUT).expect("status --json"),
        "{\n  \"nodes\": [],\n  \"router\": {}\n}"
    );
}

#[test]
fn chunked_answers_are_read() {
    let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in FIXTURE.as_bytes().chunks(100) {
        answer.extend(format!("{:x}\r\n", chunk.len()).bytes());
        answer.extend(chunk);
        answer.extend(b"\r\n");
    }
    answer.extend(b"0\r\n\r\n");
    let (url, _server) = serve_once(answer);
    assert_eq!(run(&url, false, TIMEOUT).expect("status"), TABLES);
}

#[test]
fn errors_name_the_url() {
    let (url, _server) =
        serve_once(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 19\r\n\r\n{\"error\": \"broken\"}".to_vec());
    let err = run(&url, false, TIMEOUT).expect_err("500").to_string();
    assert!(
        err.contains(&format!("{url}/mesh/v1/cluster")) && err.contains("500") && err.contains("broken"),
        "{err}"
    );

    let (url, _server) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n<html/>\r\n".to_vec());
    let err = format!("{:#}", run(&url, true, TIMEOUT).expect_err("not JSON"));
    assert!(
        err.contains(&format!("{url}/mesh/v1/cluster")) && err.contains("not JSON"),
        "{err}"
    );

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    drop(listener);
    let err = run(&url, false, TIMEOUT).expect_err("refused").to_string();
    assert!(
        err.contains("cannot reach the router at") && err.contains(&url),
        "{err}"
    );

    let err = run("https://router:8000", false, TIMEOUT)
        .expect_err("https")
        .to_string();
    assert!(
        err.contains("only http://") && err.contains("https://router:8000/mesh/v1/cluster"),
        "{err}"
    );
}
