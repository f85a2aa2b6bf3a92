//! A real mesh-router routing client requests to a fake node that answers them with garbage, resets and lies.
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mesh::cluster::convert::{answer_frame, request_from};
use mesh::cluster::frame;
use mesh::cluster::io::read_frame;
use mesh::cluster::msg::{Answer, AnswerBody, Message, ResponseHead, StatsReply, TensorHead};
use mesh::cluster::transport::stream_code;
use mesh::cluster::Limits;
use mesh::{InferResponse, NamedTensor, Tensor};
use quinn::{Connection, RecvStream, SendStream, VarInt};

async fn write(tx: &mut SendStream, chunks: Vec<bytes::Bytes>) {
    let _ = tx.write_all(&chunks.concat()).await;
    let _ = tx.finish();
}

/// Answers one routed request as its id asks; the correct answer is Y = X + 1.
async fn answer(mut tx: SendStream, mut rx: RecvStream, seen: Arc<Mutex<HashMap<String, u32>>>) {
    let limits = Limits::default();
    let Ok(Some(f)) = read_frame(&mut rx, &limits).await else {
        return;
    };
    let Message::Request(head) = f.message else {
        return;
    };
    let (request, _) = request_from(head, &f.payload).expect("the router sends well-formed requests");
    *seen.lock().unwrap().entry(request.id.clone()).or_default() += 1;
    match request.id.as_str() {
        "garbage" => {
            write(
                &mut tx,
                vec![bytes::Bytes::from_static(b"this is no frame, only garbage")],
            )
            .await
        }
        "reset" => {
            let _ = tx.reset(VarInt::from_u32(stream_code::PROTOCOL));
        }
        "nothing" => {
            let _ = tx.finish();
        }
        "big" => {
            // An answer larger than a router with a small receive budget can take.
            let response = InferResponse {
                model_name: "fake_add".into(),
                model_version: "1".into(),
                id: request.id.clone(),
                outputs: vec![NamedTensor {
                    name: "Y".into(),
                    tensor: Tensor::from_values(vec![16 * 1024], &vec![0f32; 16 * 1024]),
                }],
                parameters: Vec::new(),
            };
            write(&mut tx, answer_frame(Some(&Ok(response)), true, &limits).unwrap()).await
        }
        "stats" => {
            let reply = Message::StatsReply(StatsReply::Stats(Vec::new()));
            write(&mut tx, frame::encode(&reply, Default::default(), &limits).unwrap()).await
        }
        "outside" => {
            let lie = Message::Answer(Answer {
                last: true,
                body: AnswerBody::Response(ResponseHead {
                    model: "fake_add".into(),
                    version: "1".into(),
                    id: request.id.clone(),
                    parameters: Vec::new(),
                    outputs: vec![TensorHead {
                        name: "Y".into(),
                        dtype: mesh::cluster::convert::dtype_code(mesh::DataType::Fp32),
                        shape: vec![2],
                        offset: u64::MAX - 4,
                        len: 8,
                    }],
                }),
            });
            write(&mut tx, frame::encode(&lie, Default::default(), &limits).unwrap()).await
        }
        _ => {
            write(
                &mut tx,
                answer_frame(Some(&Ok(add_one(&request))), true, &limits).unwrap(),
            )
            .await
        }
    }
}

/// Joins as `name` serving fake_add with [`answer`]; the count of each request id the node saw.
async fn join_lying(certs: &Certs, router: &Router, name: &str) -> (Connection, Arc<Mutex<HashMap<String, u32>>>) {
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let counter = seen.clone();
    let conn = join_serving_fake_add(certs, router, name, move |tx, rx| answer(tx, rx, counter.clone())).await;
    (conn, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbled_answers_of_a_node_become_client_errors_and_good_ones_still_flow() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &["--quarantine-ms", "20"]).await;
    let (conn, seen) = join_lying(&certs, &router, "node-liar").await;

    for id in ["garbage", "reset", "nothing", "stats", "outside"] {
        let started = std::time::Instant::now();
        let (status, body) = http_post(router.http, "/v2/models/fake_add/infer", &infer_body(id))
            .await
            .unwrap_or_else(|| panic!("{id}: no HTTP answer"));
        // The only replica failed in a way that may have run the request: UNAVAILABLE, never a made-up answer.
        assert_eq!(
            status, 503,
            "{id}: a garbled answer reached the client as {status}: {body}"
        );
        assert!(
            body.contains("node-liar"),
            "{id}: the error does not name the node: {body}"
        );
        // The client learns what went wrong, not only that every replica was tried.
        assert!(
            body.contains("last failure: node 'node-liar'"),
            "{id}: the error drops the failure's cause: {body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{id}: took {:?}",
            started.elapsed()
        );
        assert!(
            seen.lock().unwrap().get(id).copied().unwrap_or(0) >= 1,
            "{id}: never reached the node"
        );
        assert!(conn.close_reason().is_none(), "{id}: the router closed the link");
        assert_live(&mut router).await;
    }

    let (status, body) = eventually(
        "a good answer after the quarantine",
        Duration::from_secs(30),
        || async {
            http_post(router.http, "/v2/models/fake_add/infer", &infer_body("ok"))
                .await
                .filter(|r| r.0 == 200)
        },
    )
    .await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["outputs"][0]["name"], "Y", "{body}");
    assert_eq!(v["outputs"][0]["data"], serde_json::json!([2.5, -1.0]), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_routers_budget_is_a_503_and_the_node_stays_routable() {
    let certs = Certs::new();
    // 32 KiB: a client's request fits (charged 20 KiB and its tensors), and the link's half, 16 KiB,
    // takes small answers but not a 64 KiB one. A quarantine of a minute would show if the node
    // were wrongly blamed.
    let args = ["--max-inflight-bytes", "32768", "--quarantine-ms", "60000"];
    let mut router = start_router(&certs, Some(&certs.router), &args).await;
    let (_conn, seen) = join_lying(&certs, &router, "node-big").await;
    let (status, body) = http_post(router.http, "/v2/models/fake_add/infer", &infer_body("big"))
        .await
        .expect("an HTTP answer");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("could not be taken"),
        "the error says the router was short of budget: {body}"
    );
    // It ran once and was not run again (the answer existed; it could not be taken).
    assert_eq!(seen.lock().unwrap().get("big").copied(), Some(1));
    // Not the node's fault: no quarantine, so the next request goes to it at once.
    let (status, body) = http_post(router.http, "/v2/models/fake_add/infer", &infer_body("ok"))
        .await
        .expect("an HTTP answer");
    assert_eq!(status, 200, "{body}");
    assert_live(&mut router).await;
}
