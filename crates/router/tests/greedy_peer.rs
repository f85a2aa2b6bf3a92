//! A real mesh-router beside a peer that holds a valid node certificate and uses it to take the
//! router's room (issue 52, item 3): hellos of the largest size that dribble, from 200 connections
//! on four addresses that dial again when refused; then, joined, 200 streams that announce 16 MiB
//! requests and dribble them, and a control stream that announces a large frame. A healthy node
//! under client load beside it loses no request and keeps its link, and another joins meanwhile.
mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mesh::cluster::certs::Role;
use mesh::cluster::convert::request_frame;
use mesh::cluster::msg::Message;
use mesh::cluster::{tls, Limits};
use mesh::{InferRequest, NamedTensor, Tensor};
use quinn::{Connection, Endpoint, SendStream};

/// Where the greedy peer connects from once joined: another loopback address than the healthy
/// node's, as a peer on another host would (the router bounds handshakes per address).
const GREEDY_FROM: [u8; 4] = [127, 0, 0, 2];

/// The largest hello the router reads.
const MAX_HELLO: u32 = mesh_router::actors::link::handshake::MAX_HELLO;

/// Client requests through the router, one after the other, until stopped: (answered, failed).
fn load(router_http: u16, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, Vec<String>)> {
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0u64, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            match http_post(router_http, "/v2/models/fake_add/infer", &infer_body("load")).await {
                Some((200, body)) if body.contains("[2.5,-1.0]") => ok += 1,
                other => failed.push(format!("{other:?}")),
            }
        }
        (ok, failed)
    })
}

/// Writes `first` on a new stream of `conn`, then one byte every 100 ms until `stop`.
async fn dribble(conn: Connection, first: Vec<u8>, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let Ok((mut tx, _rx)) = conn.open_bi().await else {
        return;
    };
    if tx.write_all(&first).await.is_err() {
        return;
    }
    drip(&mut tx, &stop, &sent).await;
}

/// The prelude and header of a request frame that announces a 16 MiB tensor: what a peer sends
/// before the payload, which the router reserves room for.
fn big_request_head() -> Vec<u8> {
    let request = InferRequest {
        model_name: "fake_add".into(),
        inputs: vec![NamedTensor {
            name: "X".into(),
            tensor: Tensor::from_values(vec![4 << 20], &vec![0f32; 4 << 20]),
        }],
        ..Default::default()
    };
    let chunks = request_frame(&request, false, None, &Limits::default()).unwrap();
    chunks[0].to_vec()
}

async fn drip(tx: &mut SendStream, stop: &AtomicBool, sent: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        if tx.write_all(&[0]).await.is_err() {
            return;
        }
        sent.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_peer_with_a_valid_certificate_fails_no_request_of_a_healthy_node() {
    let certs = Certs::new();
    // 256 MiB: sixteen 16 MiB reservations would take all of it.
    let mut router = start_router(&certs, Some(&certs.router), &["--max-inflight-bytes", "268435456"]).await;
    let healthy = join_serving_fake_add(&certs, &router, "node-good", answer_right).await;
    let stop_load = Arc::new(AtomicBool::new(false));
    let loading = load(router.http, stop_load.clone());

    let greedy = certs.member("node-greedy", Role::Node);
    let endpoint = Endpoint::client(SocketAddr::new(IpAddr::from(GREEDY_FROM), 0)).unwrap();
    let config = client_config(tls::client_crypto(&greedy).unwrap());
    let connect = |endpoint: &Endpoint| {
        let connecting = endpoint
            .connect_with(config.clone(), router.cluster_addr(), "localhost")
            .unwrap();
        async move {
            tokio::time::timeout(Duration::from_secs(10), connecting)
                .await
                .ok()?
                .ok()
        }
    };

    // 1. Two hundred connections from four addresses at once, each announcing the largest hello
    // and sending it a byte at a time, dialing again whenever refused. Meanwhile another healthy
    // node joins.
    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let attempts = Arc::new(AtomicU64::new(0));
    let endpoints: Vec<Endpoint> = (2..=5u8)
        .map(|last| Endpoint::client(SocketAddr::new(IpAddr::from([127, 0, 0, last]), 0)).unwrap())
        .collect();
    let mut dribblers = Vec::new();
    for i in 0..200 {
        let (endpoint, config, to) = (endpoints[i % 4].clone(), config.clone(), router.cluster_addr());
        let (stop, sent, attempts) = (stop.clone(), sent.clone(), attempts.clone());
        dribblers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                attempts.fetch_add(1, Ordering::Relaxed);
                let connecting = endpoint.connect_with(config.clone(), to, "localhost").unwrap();
                match tokio::time::timeout(Duration::from_secs(10), connecting).await {
                    Ok(Ok(conn)) => dribble(conn, prelude(MAX_HELLO, 0).to_vec(), stop.clone(), sent.clone()).await,
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let late = eventually(
        "a healthy node to join during the hello flood",
        Duration::from_secs(30),
        || async {
            let conn = connect_as(&certs.member("node-late", Role::Node), router.cluster_addr())
                .await
                .ok()?;
            let (_tx, _rx, first) = say_hello(&conn, &hello("node-late", Vec::new())).await.ok()?;
            matches!(first, Message::Welcome(_)).then_some(conn)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    for d in dribblers {
        let _ = d.await;
    }
    println!(
        "hello flood: {} connections tried, {} bytes dribbled; node-late joined",
        attempts.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed)
    );
    late.close(0u32.into(), b"done");

    // 2. Joined under its own name, 200 streams that send the head of a request of 16 MiB and
    // dribble its tensor, and a control stream that announces a 16 MiB control frame.
    let conn = eventually("the greedy peer to join", Duration::from_secs(30), || {
        let attempt = connect(&endpoint);
        async move {
            let conn = attempt.await?;
            let (tx, _rx, first) = say_hello(&conn, &hello("node-greedy", Vec::new())).await.ok()?;
            matches!(first, Message::Welcome(_)).then_some((conn, tx))
        }
    })
    .await;
    let (conn, mut control) = conn;
    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let head = big_request_head();
    let mut streams = Vec::new();
    for _ in 0..200 {
        streams.push(tokio::spawn(dribble(
            conn.clone(),
            head.clone(),
            stop.clone(),
            sent.clone(),
        )));
    }
    control.write_all(&prelude(16 << 20, 0)).await.unwrap();
    let control_drip = {
        let (stop, sent) = (stop.clone(), sent.clone());
        tokio::spawn(async move { drip(&mut control, &stop, &sent).await })
    };
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    for s in streams {
        let _ = s.await;
    }
    let _ = control_drip.await;

    stop_load.store(true, Ordering::Relaxed);
    let (ok, failed) = loading.await.unwrap();
    println!(
        "client requests through the healthy node: {ok} answered, {} failed",
        failed.len()
    );
    assert!(ok > 20, "too few requests went through to tell: {ok}");
    assert!(
        failed.is_empty(),
        "{} client requests failed beside the greedy peer, first: {}\n{}",
        failed.len(),
        failed[0],
        router.proc.output()
    );
    assert!(
        healthy.close_reason().is_none(),
        "the healthy node's link was dropped: {:?}",
        healthy.close_reason()
    );
    let good = cluster_node(&router, "node-good").await.expect("node-good is a member");
    assert_eq!(good["state"], "up", "{good}");
    let log = router.proc.output();
    assert!(
        !log.lines()
            .any(|l| l.contains("node-good") && (l.contains("dropped") || l.contains("busy"))),
        "the router dropped or refused the healthy node:\n{log}"
    );
    assert_live(&mut router).await;
}
