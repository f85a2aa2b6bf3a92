//! The router's rollout API (issue 59) on a real mesh-router with a cluster repository: its answers
//! and errors, the restricted-API rule, and a rollout surviving what placement's intent survives
//! (a real etcd): handed from a follower to the leader and shadowed by the follower, carried on by
//! the next leader once the first is killed, and by a router started afresh.
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const ROLLOUT: &str = "/mesh/v1/models/fake_add/rollout";

/// A cluster repository holding fake_add with versions 1, 2 and 3.
fn repository(dir: &Path) -> PathBuf {
    let model = dir.join("repo").join("fake_add");
    for v in ["1", "2", "3"] {
        std::fs::create_dir_all(model.join(v)).unwrap();
        std::fs::write(model.join(v).join("model.onnx"), format!("version {v}")).unwrap();
    }
    std::fs::write(model.join("config.pbtxt"), FAKE_ADD).unwrap();
    dir.join("repo")
}

/// An HTTP request on 127.0.0.1 with an optional extra header: (status, JSON body).
async fn call(port: u16, method: &str, path: &str, body: Option<&str>, header: Option<(&str, &str)>) -> (u16, Value) {
    let (method, path) = (method.to_string(), path.to_string());
    let body = body.unwrap_or("").to_string();
    let header = header.map_or(String::new(), |(k, v)| format!("{k}: {v}\r\n"));
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2))
            .expect("the router's HTTP port");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{header}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    })
    .await
    .unwrap()
}

fn error_of(answer: &(u16, Value)) -> &str {
    answer.1["error"].as_str().unwrap_or("")
}

/// Waits until the router read fake_add from its repository (it places it).
async fn wait_placing(port: u16, header: Option<(&'static str, &'static str)>) {
    eventually(
        "the router to read its repository",
        Duration::from_secs(30),
        || async move {
            let (status, view) = call(port, "GET", "/mesh/v1/cluster", None, header).await;
            let models = view["placement"]["models"].as_array().cloned().unwrap_or_default();
            (status == 200 && models.iter().any(|m| m["name"] == "fake_add")).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollout_api_checks_each_request_and_follows_the_operator() {
    let certs = Certs::new();
    let repo = repository(certs.path());
    let key = ("admin-key", "s3cret");
    let args = [
        "--model-repository",
        repo.to_str().unwrap(),
        "--http-restricted-api",
        "cluster:admin-key=s3cret",
    ];
    let router = start_router(&certs, Some(&certs.router), &args).await;
    let port = router.http;
    let ok = Some(key);
    wait_placing(port, ok).await;

    // The access rule of the operator API: no key or a wrong one, no answer.
    let start = r#"{"action": "start", "candidate": "2", "steps": [5, 50, 100]}"#;
    for (method, body) in [("GET", None), ("POST", Some(start))] {
        for header in [None, Some(("admin-key", "wrong"))] {
            let r = call(port, method, ROLLOUT, body, header).await;
            assert_eq!(r.0, 403, "{method} with {header:?}: {r:?}");
            assert!(error_of(&r).contains("admin-key"), "{r:?}");
        }
    }
    let r = call(port, "GET", ROLLOUT, None, ok).await;
    assert_eq!(r.0, 404, "{r:?}");
    assert!(error_of(&r).contains("model 'fake_add' has no rollout"), "{r:?}");

    // Every mistake is named.
    for (body, status, words) in [
        (r#"{"action": "start"}"#, 400, "needs 'candidate'"),
        (
            r#"{"action": "start", "candidate": "two"}"#,
            400,
            "'candidate' must be a version",
        ),
        (
            r#"{"action": "start", "candidate": "2", "steps": [50, 25, 100]}"#,
            400,
            "must rise",
        ),
        (
            r#"{"action": "start", "candidate": "2", "max_p99_ratio": 0.5}"#,
            400,
            "at least 1",
        ),
        (r#"{"action": "jump"}"#, 400, "unknown rollout action 'jump'"),
        (
            r#"{"action": "tally", "serving": "1"}"#,
            400,
            "a tally report needs 'candidate'",
        ),
        (r#"{"action": "pause", "candidate": "2"}"#, 400, "not a field"),
        ("not json", 400, "failed to parse the rollout request"),
        (r#"{"action": "pause"}"#, 404, "has no rollout to pause"),
        (
            r#"{"action": "start", "candidate": "7"}"#,
            404,
            "no version 7 in the cluster repository (its versions: 1, 2, 3)",
        ),
    ] {
        let r = call(port, "POST", ROLLOUT, Some(body), ok).await;
        assert_eq!(r.0, status, "{body}: {r:?}");
        assert!(error_of(&r).contains(words), "{body}: {r:?}");
    }
    let huge = format!(r#"{{"action": "pause", "x": "{}"}}"#, "y".repeat(20_000));
    assert_eq!(call(port, "POST", ROLLOUT, Some(&huge), ok).await.0, 413);
    let r = call(port, "POST", "/mesh/v1/models/nope/rollout", Some(start), ok).await;
    assert_eq!(r.0, 404, "{r:?}");
    assert!(error_of(&r).contains("model 'nope' is not placed"), "{r:?}");

    // Started from the newest version below the candidate (no node serves one yet).
    let r = call(port, "POST", ROLLOUT, Some(start), ok).await;
    assert_eq!(r.0, 200, "{r:?}");
    let fields = |v: &Value| {
        (
            v["serving"].clone(),
            v["candidate"].clone(),
            v["state"].clone(),
            v["step"].clone(),
            v["share"].clone(),
        )
    };
    assert_eq!(
        fields(&r.1),
        (json!("1"), json!("2"), json!("running"), json!(0), json!(5))
    );
    assert_eq!(r.1["steps"], json!([5, 50, 100]));
    let r = call(
        port,
        "POST",
        ROLLOUT,
        Some(r#"{"action": "start", "candidate": "3"}"#),
        ok,
    )
    .await;
    assert_eq!(r.0, 409, "{r:?}");
    assert!(error_of(&r).contains("has a rollout running already"), "{r:?}");

    let act = |action: &'static str| async move {
        call(port, "POST", ROLLOUT, Some(&format!(r#"{{"action": "{action}"}}"#)), ok).await
    };
    let r = act("pause").await;
    assert_eq!(
        (r.0, r.1["state"].clone(), r.1["share"].clone()),
        (200, json!("paused"), json!(5)),
        "{r:?}"
    );
    let r = call(port, "GET", ROLLOUT, None, ok).await;
    assert_eq!((r.0, r.1["state"].clone()), (200, json!("paused")), "{r:?}");
    let (_, view) = call(port, "GET", "/mesh/v1/cluster", None, ok).await;
    let shown = &view["placement"]["rollouts"];
    assert_eq!(
        (shown[0]["model"].clone(), shown[0]["state"].clone()),
        (json!("fake_add"), json!("paused")),
        "{view}"
    );
    assert_eq!(act("resume").await.1["state"], "running");
    let r = act("promote").await;
    assert_eq!(
        (r.0, r.1["state"].clone(), r.1["share"].clone()),
        (200, json!("promoted"), json!(100)),
        "{r:?}"
    );
    let r = act("abort").await;
    assert_eq!(r.0, 409, "{r:?}");
    assert!(error_of(&r).contains("is over (promoted)"), "{r:?}");

    // Over, another may start.
    let r = call(
        port,
        "POST",
        ROLLOUT,
        Some(r#"{"action": "start", "candidate": 3, "serving": "2"}"#),
        ok,
    )
    .await;
    assert_eq!(
        fields(&r.1),
        (json!("2"), json!("3"), json!("running"), json!(0), json!(5)),
        "{r:?}"
    );
    let r = act("abort").await;
    assert_eq!(
        (r.0, r.1["state"].clone(), r.1["share"].clone()),
        (200, json!("aborted"), json!(0)),
        "{r:?}"
    );
}

/// A real etcd on loopback, or None (the test is skipped) when it is not installed and
/// MESH_REQUIRE_SERVER is not 1.
async fn etcd(dir: &Path) -> Option<(Proc, String)> {
    let Some(bin) = ["/usr/bin/etcd", "/usr/sbin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        assert_ne!(
            std::env::var("MESH_REQUIRE_SERVER").as_deref(),
            Ok("1"),
            "etcd is not installed"
        );
        eprintln!("etcd is not installed: skipped");
        return None;
    };
    let (client, peer) = (free_tcp_port(), free_tcp_port());
    let (endpoint, peer_url) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
    let data = dir.join("etcd").display().to_string();
    let cluster = format!("m0={peer_url}");
    let args: Vec<String> = [
        "--name",
        "m0",
        "--data-dir",
        data.as_str(),
        "--listen-client-urls",
        endpoint.as_str(),
        "--advertise-client-urls",
        endpoint.as_str(),
        "--listen-peer-urls",
        peer_url.as_str(),
        "--initial-advertise-peer-urls",
        peer_url.as_str(),
        "--initial-cluster",
        cluster.as_str(),
        "--initial-cluster-state",
        "new",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let proc = Proc::spawn(bin, &args, &dir.join("etcd.log"));
    eventually("etcd to answer", Duration::from_secs(30), || async move {
        let r = http_get(client, "/health").await?;
        (r.0 == 200).then_some(())
    })
    .await;
    Some((proc, endpoint))
}

async fn role(port: u16) -> String {
    let (_, view) = call(port, "GET", "/mesh/v1/cluster", None, None).await;
    view["router"]["lead"]["role"].as_str().unwrap_or("").to_string()
}

async fn elected_router(certs: &Certs, repo: &Path, endpoint: &str, name: &str, role_wanted: &str) -> Router {
    let args = [
        "--model-repository",
        repo.to_str().unwrap(),
        "--etcd-endpoints",
        endpoint,
        "--etcd-lease-secs",
        "2",
        "--router-name",
        name,
    ];
    let router = start_router(certs, Some(&certs.router), &args).await;
    let port = router.http;
    eventually(
        &format!("{name} to be {role_wanted}"),
        Duration::from_secs(60),
        || async move { (role(port).await == role_wanted).then_some(()) },
    )
    .await;
    wait_placing(port, None).await;
    router
}

/// The rollout's (state, step, candidate) as a router shows it, once it is `state`.
async fn shows(port: u16, state: &str) -> Value {
    let state = state.to_string();
    eventually(
        &format!("the rollout {state} on port {port}"),
        Duration::from_secs(30),
        || {
            let state = state.clone();
            async move {
                let (status, v) = call(port, "GET", ROLLOUT, None, None).await;
                (status == 200 && v["state"] == state.as_str()).then_some(v)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_is_kept_with_placements_intent_across_leaders_and_restarts() {
    let certs = Certs::new();
    let repo = repository(certs.path());
    let Some((_etcd, endpoint)) = etcd(certs.path()).await else {
        return;
    };
    let mut r1 = elected_router(&certs, &repo, &endpoint, "r1", "leader").await;
    let r2 = elected_router(&certs, &repo, &endpoint, "r2", "follower").await;

    // Sent to the follower, made by the leader; the follower shows what the leader stored.
    let start = r#"{"action": "start", "candidate": "2", "steps": [10, 100], "max_p99_ratio": 2}"#;
    let r = call(r2.http, "POST", ROLLOUT, Some(start), None).await;
    assert_eq!((r.0, r.1["state"].clone()), (200, json!("running")), "{r:?}");
    assert_eq!(shows(r1.http, "running").await["share"], 10);
    shows(r2.http, "running").await;
    let r = call(r2.http, "POST", ROLLOUT, Some(r#"{"action": "pause"}"#), None).await;
    assert_eq!((r.0, r.1["state"].clone()), (200, json!("paused")), "{r:?}");
    let r = call(
        r2.http,
        "POST",
        ROLLOUT,
        Some(r#"{"action": "start", "candidate": "3"}"#),
        None,
    )
    .await;
    assert_eq!(r.0, 409, "the leader's conflict comes back as one: {r:?}");
    shows(r1.http, "paused").await;
    shows(r2.http, "paused").await;
    let started = shows(r1.http, "paused").await["started_ms"].as_u64().unwrap();
    let r = call(r2.http, "POST", ROLLOUT, Some(&tally(started, 50)), None).await;
    assert_eq!(r.0, 503, "a follower's guard judges nothing: {r:?}");
    assert!(error_of(&r).contains("tallies go to the leader"), "{r:?}");

    // The leader is killed: the next one carries the rollout on where it was.
    r1.proc.signal(libc::SIGKILL);
    let _ = r1.proc.wait_exit(Duration::from_secs(10));
    let p2 = r2.http;
    eventually("r2 to lead", Duration::from_secs(60), || async move {
        (role(p2).await == "leader").then_some(())
    })
    .await;
    let v = shows(r2.http, "paused").await;
    assert_eq!(
        (
            v["serving"].clone(),
            v["candidate"].clone(),
            v["step"].clone(),
            v["share"].clone()
        ),
        (json!("1"), json!("2"), json!(0), json!(10)),
        "{v}"
    );
    assert_eq!(v["max_p99_ratio"], 2.0);
    let r = eventually("r2 to take the resume", Duration::from_secs(30), || async move {
        let r = call(p2, "POST", ROLLOUT, Some(r#"{"action": "resume"}"#), None).await;
        (r.0 == 200).then_some(r)
    })
    .await;
    assert_eq!(r.1["state"], "running");

    // Every router stops; one started afresh takes the rollout from etcd.
    drop(r2);
    let r3 = elected_router(&certs, &repo, &endpoint, "r3", "leader").await;
    let v = shows(r3.http, "running").await;
    assert_eq!(
        (v["candidate"].clone(), v["step"].clone()),
        (json!("2"), json!(0)),
        "{v}"
    );

    // A follower's tally, as its placement sends it each second, reaches the leader's guard: a
    // candidate failing half of its requests is rolled back, and says why.
    let started = v["started_ms"].as_u64().unwrap();
    let r = call(r3.http, "POST", ROLLOUT, Some(&tally(started + 1, 50)), None).await;
    assert_eq!(r.0, 404, "a report of another rollout of the same versions: {r:?}");
    let r = call(r3.http, "POST", ROLLOUT, Some(&tally(started, 50)), None).await;
    assert_eq!(r.0, 200, "{r:?}");
    let v = shows(r3.http, "rolled_back").await;
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("version 2 failed 50.0% of 100 requests"),
        "{v}"
    );
    assert_eq!(v["share"], 0);
    let r = call(r3.http, "POST", ROLLOUT, Some(&tally(started, 0)), None).await;
    assert_eq!(r.0, 404, "{r:?}");
    assert!(error_of(&r).contains("no running rollout from version 1 to 2"), "{r:?}");
}

/// A follower's report of 100 answers of each version (all 10 ms) of the rollout that started at
/// `started`, `failed` of the candidate's failing.
fn tally(started: u64, failed: u32) -> String {
    let answers = |errors: u32| json!({"requests": 100, "errors": errors, "latency": [[53, 100]]});
    json!({
        "action": "tally",
        "serving": "1",
        "candidate": "2",
        "started": started,
        "serving_answers": answers(0),
        "candidate_answers": answers(failed),
    })
    .to_string()
}
