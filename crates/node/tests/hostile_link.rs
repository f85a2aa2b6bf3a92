//! A real mesh-node joining fake routers that send garbage, refuse it, or show a certificate of another CA.
mod common;

use std::time::Duration;

use common::*;
use mesh::cluster::call::{self, Failure, Peer};
use mesh::cluster::convert::{dtype_code, request_frame};
use mesh::cluster::frame::Prelude;
use mesh::cluster::msg::{AnswerBody, Message, RequestHead, TensorHead};
use mesh::cluster::transport::{close, stream_code};
use mesh::cluster::{Limits, PROTOCOL_VERSION};
use mesh::config::ModelConfig;
use mesh::{DataType, InferRequest, NamedTensor, Tensor};
use quinn::{ConnectionError, VarInt};

/// The one error answer an `End` holds: (code number, message).
fn error_answer(end: &End) -> (u8, String) {
    match end {
        End::Frames(frames) => match frames.as_slice() {
            [Message::Answer(a)] => match &a.body {
                AnswerBody::Error(e) if a.last => (e.code, e.message.clone()),
                other => panic!("expected a final error answer, got {other:?} (last: {})", a.last),
            },
            other => panic!("expected exactly one answer frame, got {other:?}"),
        },
        other => panic!("expected an error answer, got {other:?}"),
    }
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn add_sub_request(model: &str, a: &[f32], b: &[f32]) -> InferRequest {
    let input = |name: &str, v: &[f32]| NamedTensor {
        name: name.into(),
        tensor: Tensor::from_values(vec![1, 16], v),
    };
    InferRequest {
        model_name: model.into(),
        model_version: String::new(),
        id: format!("{model}-1"),
        inputs: vec![input("INPUT0", a), input("INPUT1", b)],
        outputs: Vec::new(),
        parameters: Vec::new(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hello_carries_the_name_the_models_and_a_fresh_incarnation() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let node = setup.start_node("node-7", router.addr).await;
    let mut link = router.accept_hello().await;
    let hello = link.hello.clone();
    assert_eq!(hello.name, "node-7");
    assert_ne!(hello.incarnation, 0);
    assert!(hello.devices.contains(&"cpu".to_string()), "{:?}", hello.devices);
    assert_eq!(hello.http, format!("127.0.0.1:{}", node.http));
    assert_eq!(hello.grpc, "", "gRPC is disabled");
    let [model] = hello.models.as_slice() else {
        panic!("expected add_sub alone, got {:?}", hello.models)
    };
    assert_eq!((model.name.as_str(), model.version, model.ready), ("add_sub", 1, true));
    assert_eq!(model.reason, "");
    let config: ModelConfig = prost::Message::decode(model.config.as_slice()).expect("a protobuf ModelConfig");
    assert_eq!(config.name, "add_sub");
    assert_eq!(config.max_batch_size, 8);
    let inputs: Vec<_> = config.input.iter().map(|i| (i.name.as_str(), i.dims.clone())).collect();
    assert_eq!(inputs, [("INPUT0", vec![16]), ("INPUT1", vec![16])]);
    assert_eq!(config.output.len(), 2);

    // Once welcomed, the node reports the load of its model.
    link.welcome().await;
    let report = link.next_control(Duration::from_secs(30)).await;
    let Message::LoadReport(report) = report else {
        panic!("expected a load report, got {report:?}")
    };
    assert!(
        report.models.iter().any(|m| m.name == "add_sub" && m.version == 1),
        "{report:?}"
    );

    // The same node started again is a new member: same name, another incarnation.
    drop(node);
    let _again = setup.start_node("node-7", router.addr).await;
    let second = router.accept_hello().await;
    assert_eq!(second.hello.name, "node-7");
    assert_ne!(
        second.hello.incarnation, hello.incarnation,
        "a restarted node kept its incarnation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_a_router_stream_fails_only_that_stream() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let mut node = setup.start_node("node-8", router.addr).await;
    let mut link = router.accept_hello().await;
    link.welcome().await;
    let conn = link.conn.clone();
    let limits = Limits::default();

    let (code, message) = error_answer(&exchange(&conn, b"\x00\x01garbage that is no frame at all").await);
    assert_eq!(code, 1, "INVALID_ARGUMENT: {message}");
    assert!(message.contains("not a mesh cluster frame"), "{message}");

    match exchange(&conn, b"MSH\x01").await {
        End::Reset(code) => assert_eq!(code, u64::from(stream_code::PROTOCOL)),
        other => panic!("a cut frame should reset its stream, got {other:?}"),
    }

    let mut oversized = Prelude {
        version: PROTOCOL_VERSION,
        header_len: 32,
        payload_len: u64::MAX / 2,
    }
    .encode()
    .to_vec();
    oversized.extend([0u8; 32]);
    let (_, message) = error_answer(&exchange(&conn, &oversized).await);
    assert!(message.contains("is larger than the link's limit"), "{message}");

    let (_, message) = error_answer(&exchange(&conn, &encode(&Message::Hello(link.hello.clone()))).await);
    assert!(message.contains("a hello cannot open a request stream"), "{message}");

    let lying = Message::Request(RequestHead {
        model: "add_sub".into(),
        version: String::new(),
        id: "lie".into(),
        outputs: Vec::new(),
        parameters: Vec::new(),
        inputs: vec![TensorHead {
            name: "INPUT0".into(),
            dtype: dtype_code(DataType::Fp32),
            shape: vec![1, 16],
            offset: 1 << 40,
            len: 64,
        }],
        stream: false,
        traceparent: String::new(),
        tracestate: String::new(),
    });
    let (_, message) = error_answer(&exchange(&conn, &encode(&lying)).await);
    assert!(message.contains("lie outside"), "{message}");

    // The node, its link and its control stream survived.
    node.assert_serving().await;
    assert!(
        conn.close_reason().is_none(),
        "the node closed the link: {:?}",
        conn.close_reason()
    );
    let next = link.next_control(Duration::from_secs(30)).await;
    assert!(
        matches!(next, Message::LoadReport(_) | Message::ModelEvent(_)),
        "{next:?}"
    );

    // A valid request is answered with the model's outputs.
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..16).map(|i| 0.5 * i as f32 - 3.0).collect();
    let peer = Peer {
        conn: &conn,
        name: "node-8",
        out: None,
    };
    let frame = request_frame(&add_sub_request("add_sub", &a, &b), false, None, &limits).unwrap();
    let response = call::unary(peer, frame, &limits).await.expect("add_sub answers");
    let output = |name: &str| {
        let t = &response.outputs.iter().find(|o| o.name == name).expect(name).tensor;
        assert_eq!((t.dtype, t.shape.as_slice()), (DataType::Fp32, &[1i64, 16][..]));
        floats(t)
    };
    assert_eq!(
        output("OUTPUT0"),
        a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>()
    );
    assert_eq!(
        output("OUTPUT1"),
        a.iter().zip(&b).map(|(x, y)| x - y).collect::<Vec<_>>()
    );

    // A model the node does not serve is refused as never started, so a router may retry it elsewhere.
    let frame = request_frame(&add_sub_request("not_here", &a, &b), false, None, &limits).unwrap();
    match call::unary(peer, frame, &limits).await {
        Err(Failure::Refused(e)) => assert!(e.message.contains("not_here"), "{}", e.message),
        Err(other) => panic!("expected a NotStarted refusal, got {other:?}"),
        Ok(r) => panic!("a model the node does not serve answered: {r:?}"),
    }

    // Statistics queries get statistics replies.
    let stats = call::stats(peer, "add_sub", "", &limits).await.expect("statistics");
    let [model] = stats.model_stats.as_slice() else {
        panic!("expected add_sub's statistics, got {stats:?}")
    };
    assert_eq!(model.name, "add_sub");
    assert!(model.inference_count >= 1, "{model:?}");
    let unknown = call::stats(peer, "not_here", "", &limits).await;
    assert!(unknown.is_err_and(|e| e.message.contains("not_here")));

    assert!(conn.close_reason().is_none());
    node.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_of_another_ca_is_not_joined_and_the_node_keeps_serving() {
    let Some(setup) = Setup::new() else { return };
    // The rogue router would accept the node (it trusts both CAs); only the node's check can stop the join.
    let router = FakeRouter::new(&setup.rogue_router);
    let mut node = setup.start_node("node-9", router.addr).await;
    for attempt in 1..=2 {
        let outcome = router
            .next_attempt(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("the node did not dial (attempt {attempt})"));
        match outcome {
            Ok(conn) => panic!("the node completed a handshake with a router of another CA: {conn:?}"),
            Err(ConnectionError::ConnectionClosed(c)) => {
                let code = u64::from(c.error_code);
                assert!((0x100..0x200).contains(&code), "not a TLS alert: {c:?}");
            }
            Err(other) => panic!("the handshake ended with {other:?}, not a TLS alert from the node"),
        }
    }
    let log = node.wait_log("invalid peer certificate", Duration::from_secs(30)).await;
    assert!(log.contains("UnknownIssuer"), "{log}");
    assert!(!log.contains("joined the cluster"), "{log}");
    node.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_logged_with_its_reason_and_the_node_keeps_running() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let mut node = setup.start_node("node-10", router.addr).await;
    let link = router.accept_hello().await;
    link.conn
        .close(VarInt::from_u32(close::REFUSED), b"cannot join: test refusal 4242");
    node.wait_log(
        "the router refused this node: cannot join: test refusal 4242",
        Duration::from_secs(30),
    )
    .await;
    node.assert_serving().await;
    // A refusal is retried slowly, unlike a lost link (dialed again within 100 ms).
    let again = router.next_attempt(Duration::from_millis(1500)).await;
    assert!(again.is_none(), "the node dialed again at once after a refusal");
    node.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_control_stream_ends_that_link_and_the_node_dials_again() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let mut node = setup.start_node("node-11", router.addr).await;
    let mut link = router.accept_hello().await;
    link.welcome().await;
    link.control.write_all(b"these bytes are not a frame").await.unwrap();

    let closed = tokio::time::timeout(Duration::from_secs(30), link.conn.closed())
        .await
        .expect("the node kept a link whose control stream is garbage");
    match &closed {
        ConnectionError::ApplicationClosed(c) => {
            let code = c.error_code.into_inner();
            assert!(
                code == u64::from(close::NORMAL) || code == u64::from(close::PROTOCOL),
                "{c:?}"
            );
        }
        other => panic!("expected the node to close the link, got {other:?}"),
    }
    node.wait_log("not a mesh cluster frame", Duration::from_secs(30)).await;

    let again = router.accept_hello().await;
    assert_eq!(
        (again.hello.name.as_str(), again.hello.incarnation),
        ("node-11", link.hello.incarnation),
        "the same process dials again"
    );
    node.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unexpected_control_frame_is_ignored() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let mut node = setup.start_node("node-12", router.addr).await;
    let mut link = router.accept_hello().await;
    link.welcome().await;
    let hello = Message::Hello(link.hello.clone());
    send(&mut link.control, &hello).await;
    node.wait_log(
        "ignoring an unexpected hello on the control stream",
        Duration::from_secs(30),
    )
    .await;
    // The session goes on: more reports come on the same link.
    for _ in 0..3 {
        let next = link.next_control(Duration::from_secs(30)).await;
        assert!(
            matches!(next, Message::LoadReport(_) | Message::ModelEvent(_)),
            "{next:?}"
        );
    }
    assert!(link.conn.close_reason().is_none());
    node.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_never_welcomes_is_dialed_again_after_the_hello_timeout() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let mut node = setup.start_node("node-13", router.addr).await;
    let first = router.accept_hello().await;
    let started = std::time::Instant::now();
    let second = router.accept_hello().await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "dialed again after {waited:?}, before the hello timeout"
    );
    assert_eq!(second.hello.incarnation, first.hello.incarnation);
    node.wait_log("no welcome within", Duration::from_secs(30)).await;
    node.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_grants_no_stream_credit_is_dialed_again_after_the_hello_timeout() {
    let Some(setup) = Setup::new() else { return };
    // This router lets the node send nothing on the streams the node opens: the hello cannot be written.
    let router = FakeRouter::with_transport(&setup.router, |t| {
        t.stream_receive_window(VarInt::from_u32(0));
    });
    let mut node = setup.start_node("node-14", router.addr).await;
    let _first = router
        .next_attempt(Duration::from_secs(10))
        .await
        .expect("the node dials")
        .expect("the handshake succeeds");
    // A router that never welcomes is dialed again after the 5 s hello timeout; this one should be
    // too (a node stuck on it would never dial again; the wait only bounds the test).
    let second = router.next_attempt(Duration::from_secs(60)).await;
    assert!(
        second.is_some(),
        "the node stays stuck on a router that takes no bytes:\n{}",
        node.proc.output()
    );
    node.assert_serving().await;
}
