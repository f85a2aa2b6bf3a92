//! A real mesh-router attacked on its cluster port by fake nodes: foreign certificates, bad hellos, garbage.
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mesh::cluster::certs::Role;
use mesh::cluster::frame::SHARED;
use mesh::cluster::msg::{AnswerBody, Fetch, FetchEnd, Message, ModelStatus, RequestHead, TensorHead};
use mesh::cluster::shm::Descriptor;
use mesh::cluster::transport::{close, stream_code};
use mesh::cluster::{tls, Limits, PROTOCOL_VERSION};
use mesh::{InferRequest, NamedTensor, Tensor};

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

/// Asserts that a link ended in the TLS handshake (a QUIC crypto error) for `why`.
fn assert_tls_refusal(e: &quinn::ConnectionError, why: &str) {
    match e {
        quinn::ConnectionError::ConnectionClosed(c) => {
            let code = u64::from(c.error_code);
            assert!((0x100..0x200).contains(&code), "not a TLS alert: {e:?}");
            let reason = String::from_utf8_lossy(&c.reason);
            assert!(reason.contains(why), "refused for another reason: {e:?}");
        }
        quinn::ConnectionError::TransportError(t) => assert!(t.to_string().contains(why), "{t}"),
        other => panic!("the link ended with {other:?}, not a TLS refusal"),
    }
}

/// Opens a stream on `conn`, writes `bytes`, finishes it, and reads how the router ended it.
async fn exchange(conn: &quinn::Connection, bytes: &[u8]) -> End {
    let (mut tx, mut rx) = conn.open_bi().await.expect("open a stream");
    tx.write_all(bytes).await.expect("write");
    let _ = tx.finish();
    read_end(&mut rx).await
}

/// Connects as a good node, sends `bytes` as the start of its control stream, and returns the close.
async fn first_frame_closes(router: &Router, certs: &Certs, bytes: &[u8]) -> (u64, String) {
    let conn = connect_as(&certs.node, router.cluster_addr()).await.expect("connect");
    let (mut tx, _rx) = conn.open_bi().await.unwrap();
    tx.write_all(bytes).await.unwrap();
    let _ = tx.finish();
    closed_by_app(&conn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_ca_cannot_connect_and_good_nodes_still_join() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;

    // The rogue node trusts the router (both CAs), but its own certificate is signed by the rogue CA.
    let rogue = connect_as(&certs.rogue_node, router.cluster_addr()).await;
    let refused = match rogue {
        Err(e) => e,
        // A QUIC client may finish its side of the handshake before the server has checked its certificate:
        // then the server's refusal closes the connection at once, before any hello is answered.
        Ok(conn) => {
            let hello = say_hello(&conn, &hello("rogue-node", Vec::new())).await;
            assert!(hello.is_err(), "a node of another CA was answered: {hello:?}");
            conn.closed().await
        }
    };
    assert_tls_refusal(&refused, "invalid peer certificate: UnknownIssuer");

    // A node that shows no certificate at all is refused the same way.
    let anonymous = connect(
        client_config(tls::insecure_client_crypto().unwrap()),
        router.cluster_addr(),
    )
    .await;
    let refused = match anonymous {
        Err(e) => e,
        Ok(conn) => {
            let hello = say_hello(&conn, &hello("anonymous", Vec::new())).await;
            assert!(hello.is_err(), "a node without a certificate was answered: {hello:?}");
            conn.closed().await
        }
    };
    assert_tls_refusal(&refused, "peer sent no certificates");

    let log = eventually(
        "the router to log the refused handshake",
        Duration::from_secs(30),
        || {
            let out = router.proc.output();
            async move { out.contains("refused a cluster connection").then_some(out) }
        },
    )
    .await;
    assert!(!log.contains("node joined"), "a refused node joined:\n{log}");

    assert_live(&mut router).await;
    let mut good = join(&certs, &router, "node-good").await;
    assert!(!good.welcome.router.is_empty());
    send_load_report(&mut good).await;
    let node = eventually("the good node to be listed", Duration::from_secs(30), || {
        cluster_node(&router, "node-good")
    })
    .await;
    assert_eq!(node["state"], "up");
    assert!(cluster_node(&router, "rogue-node").await.is_none());
    assert!(cluster_node(&router, "anonymous").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_of_another_protocol_version_is_refused_with_the_reason() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;

    let mut bytes = encode(&hello("node-v99", Vec::new()));
    bytes[3] = 99;
    let (code, reason) = first_frame_closes(&router, &certs, &bytes).await;
    assert_eq!(code, u64::from(close::REFUSED), "reason: {reason}");
    assert_eq!(
        reason,
        format!("cannot join: protocol version 99 is not supported; this build speaks version {PROTOCOL_VERSION}")
    );
    assert_live(&mut router).await;
    assert!(cluster_node(&router, "node-v99").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hellos_without_a_name_or_with_an_unreadable_config_are_refused() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;

    let (code, reason) = first_frame_closes(&router, &certs, &encode(&hello("", Vec::new()))).await;
    assert_eq!(
        (code, reason.as_str()),
        (u64::from(close::REFUSED), "cannot join: the hello names no node")
    );

    let broken = ModelStatus {
        name: "broken_model".into(),
        version: 3,
        ready: true,
        reason: String::new(),
        config: vec![0xff; 12], // not a protobuf message
        placed: false,
    };
    let (code, reason) = first_frame_closes(&router, &certs, &encode(&hello("node-bad-config", vec![broken]))).await;
    assert_eq!(code, u64::from(close::REFUSED), "reason: {reason}");
    assert!(
        reason.starts_with("cannot join: model 'broken_model' version 3 has an unreadable config"),
        "{reason}"
    );

    assert_live(&mut router).await;
    assert!(cluster_node(&router, "node-bad-config").await.is_none());
    join(&certs, &router, "node-after-bad-hellos").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_or_oversized_first_frames_close_the_connection_with_protocol() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;

    let mut corrupt = prelude(64, 0).to_vec();
    corrupt.extend((0..64u8).map(|i| i.wrapping_mul(37) ^ 0xa5));
    let mut huge_payload = prelude(32, u64::MAX).to_vec();
    huge_payload.extend([0u8; 32]);
    // A hello that says its payload lies in shared memory, naming an arena this router never made.
    let mut in_no_arena = encode(&hello("node-shm", vec![]));
    let header_len = u32::from_le_bytes(in_no_arena[4..8].try_into().unwrap());
    in_no_arena[4..8].copy_from_slice(&(header_len | SHARED).to_le_bytes());
    in_no_arena[8..16].copy_from_slice(&(1u64 << 20).to_le_bytes());
    in_no_arena.extend(
        Descriptor {
            arena: 7,
            slot: 64,
            seq: 1,
        }
        .encode(),
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: mesh\r\n\r\n".to_vec(),
            "bad hello: not a mesh cluster frame",
        ),
        (
            "a cut prelude",
            b"MSH\x01\x00".to_vec(),
            "bad hello: the stream ended inside a frame",
        ),
        ("a corrupt header", corrupt, "bad hello: corrupt frame header"),
        (
            "a payload far over the limit",
            huge_payload,
            "bad hello: frame payload of 18446744073709551615 bytes is larger than the link's limit",
        ),
        (
            "a header far over the limit",
            // The top bit marks a payload in shared memory; the length is the other 31.
            prelude(u32::MAX, 0).to_vec(),
            "bad hello: frame header of 2147483647 bytes is larger than the link's limit",
        ),
        (
            // A hello carries no tensors: any payload, here one said to lie in an arena, is refused.
            "a payload in a shared-memory arena",
            in_no_arena,
            "bad hello: frame payload of 1048576 bytes is larger than the link's limit of 0 bytes",
        ),
        (
            // A hello is small: one that announces 16 MiB is refused before anything is reserved.
            "a hello of 16 MiB",
            prelude(16 << 20, 0).to_vec(),
            "bad hello: frame header of 16777216 bytes is larger than the link's limit of 4194304 bytes",
        ),
        (
            "a load report instead of a hello",
            encode(&Message::LoadReport(mesh::cluster::msg::LoadReport {
                models: Vec::new(),
            })),
            "expected a hello, got a load report",
        ),
    ];
    for (what, bytes, expected) in cases {
        let (code, reason) = first_frame_closes(&router, &certs, &bytes).await;
        assert_eq!(
            code,
            u64::from(close::PROTOCOL),
            "{what}: closed with {code} ({reason})"
        );
        assert!(reason.starts_with(expected), "{what}: the reason is '{reason}'");
        assert_live(&mut router).await;
    }
    let mut node = join(&certs, &router, "node-after-garbage").await;
    send_load_report(&mut node).await;
    let listed = eventually("the node to be up", Duration::from_secs(30), || async {
        cluster_node(&router, "node-after-garbage")
            .await
            .filter(|n| n["state"] == "up")
    })
    .await;
    assert_eq!(listed["name"], "node-after-garbage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_a_request_stream_fails_only_that_stream() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;
    let mut node = join(&certs, &router, "node-g").await;
    let conn = node.conn.clone();

    let (code, message) = error_answer(&exchange(&conn, b"\x00\x01garbage that is no frame at all").await);
    assert_eq!(code, 1, "INVALID_ARGUMENT: {message}");
    assert!(message.contains("not a mesh cluster frame"), "{message}");

    // A frame cut inside its prelude cannot be answered: the stream is reset with PROTOCOL.
    match exchange(&conn, b"MSH\x01").await {
        End::Reset(code) => assert_eq!(code, u64::from(stream_code::PROTOCOL)),
        other => panic!("a cut frame should reset its stream, got {other:?}"),
    }

    let mut oversized = prelude(32, u64::MAX / 2).to_vec();
    oversized.extend([0u8; 32]);
    let (_, message) = error_answer(&exchange(&conn, &oversized).await);
    assert!(message.contains("is larger than the link's limit"), "{message}");

    let (_, message) = error_answer(&exchange(&conn, &encode(&hello("node-g", Vec::new()))).await);
    assert!(message.contains("must start with a request, not hello"), "{message}");

    // A request whose tensor lies outside its (empty) payload.
    let lying = Message::Request(RequestHead {
        model: "m".into(),
        version: String::new(),
        id: "lie".into(),
        outputs: Vec::new(),
        parameters: Vec::new(),
        inputs: vec![TensorHead {
            name: "X".into(),
            dtype: mesh::cluster::convert::dtype_code(mesh::DataType::Fp32),
            shape: vec![1, 4],
            offset: 1 << 40,
            len: 16,
        }],
        stream: false,
        traceparent: String::new(),
        tracestate: String::new(),
    });
    let (_, message) = error_answer(&exchange(&conn, &encode(&lying)).await);
    assert!(message.contains("lie outside"), "{message}");

    // The link and its control stream survived all of that.
    assert!(
        conn.close_reason().is_none(),
        "the link closed: {:?}",
        conn.close_reason()
    );
    send_load_report(&mut node).await;
    let listed = eventually("node-g to be up", Duration::from_secs(30), || async {
        cluster_node(&router, "node-g").await.filter(|n| n["state"] == "up")
    })
    .await;
    assert_eq!(listed["incarnation"], "5eed000000000001");

    // A well-formed request for a model nobody serves gets a proper error answer.
    let request = InferRequest {
        model_name: "no_such_model".into(),
        model_version: String::new(),
        id: "r1".into(),
        inputs: vec![NamedTensor {
            name: "X".into(),
            tensor: Tensor::from_values(vec![1, 2], &[1.0f32, 2.0]),
        }],
        outputs: Vec::new(),
        parameters: Vec::new(),
        client: mesh::Client::Local,
    };
    let chunks = mesh::cluster::convert::request_frame(&request, false, None, &Limits::default()).unwrap();
    let (code, message) = error_answer(&exchange(&conn, &chunks.concat()).await);
    assert!(message.contains("no_such_model"), "{message}");
    assert_eq!(
        mesh::cluster::convert::code_from(code),
        mesh::Code::NotFound,
        "unknown model: {message}"
    );
    assert!(conn.close_reason().is_none());
    assert_live(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_welcome_on_the_control_stream_closes_the_link_with_protocol() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;
    let mut node = join(&certs, &router, "node-w").await;
    let welcome = Message::Welcome(node.welcome.clone());
    send(&mut node.control, &welcome).await;
    let (code, reason) = closed_by_app(&node.conn).await;
    assert_eq!(
        (code, reason.as_str()),
        (u64::from(close::PROTOCOL), "a welcome on the control stream")
    );
    assert_live(&mut router).await;
    join(&certs, &router, "node-w2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_datagrams_do_not_disturb_the_cluster_port() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;
    let mut before = join(&certs, &router, "node-before").await;

    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut sent = 0;
    for i in 0..1500u32 {
        let len = [1usize, 7, 40, 1200, 1350, 1500][i as usize % 6];
        let mut packet: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
        match i % 3 {
            // A QUIC v1 long header (an Initial's first byte), random connection ids and body.
            0 if len > 20 => {
                packet[0] = 0xc3;
                packet[1..5].copy_from_slice(&1u32.to_be_bytes());
                packet[5] = 8;
                packet[14] = 8;
            }
            // A long header of an unknown version: asks for version negotiation.
            1 if len > 20 => {
                packet[0] = 0xc0;
                packet[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes());
            }
            // A short header: a packet of some connection the router does not have.
            _ => packet[0] = 0x40 | (packet[0] & 0x3f),
        }
        if socket.send_to(&packet, router.cluster_addr()).is_ok() {
            sent += 1;
        }
    }
    assert!(sent > 1000, "only {sent} datagrams went out");

    assert_live(&mut router).await;
    let mut after = join(&certs, &router, "node-after").await;
    assert!(
        before.conn.close_reason().is_none(),
        "the flood closed a joined link: {:?}",
        before.conn.close_reason()
    );
    send_load_report(&mut before).await;
    send_load_report(&mut after).await;
    for name in ["node-before", "node-after"] {
        eventually(&format!("{name} to be up"), Duration::from_secs(30), || async {
            cluster_node(&router, name).await.filter(|n| n["state"] == "up")
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_needs_certificates_unless_insecure_dev() {
    let certs = Certs::new();
    for (flags, needles) in [
        (Vec::new(), vec!["--cluster-ca", "--cluster-insecure-dev"]),
        (
            vec!["--cluster-ca".to_string(), certs.router.ca.display().to_string()],
            vec!["missing --cluster-cert, --cluster-key"],
        ),
    ] {
        let mut args = router_args(free_tcp_port(), free_udp_port(), None);
        args.extend(flags);
        let log = certs.path().join(format!("no-certs-{}.log", needles.len()));
        let mut proc = Proc::spawn(env!("CARGO_BIN_EXE_mesh-router"), &args, &log);
        let status = proc
            .wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("the router started without certificates:\n{}", proc.output()));
        assert!(!status.success(), "exit status {status}");
        let out = proc.output();
        for needle in needles {
            assert!(out.contains(needle), "the refusal does not name {needle}:\n{out}");
        }
    }

    // The development mode starts, says so loudly, and lets a node without a certificate join.
    let mut router = start_router(&certs, None, &["--cluster-insecure-dev"]).await;
    assert!(router.proc.output().contains("WITHOUT certificates"));
    let conn = connect(
        client_config(tls::insecure_client_crypto().unwrap()),
        router.cluster_addr(),
    )
    .await
    .expect("an anonymous node connects in development mode");
    let (_tx, _rx, first) = say_hello(&conn, &hello("dev-node", Vec::new())).await.unwrap();
    assert!(matches!(first, Message::Welcome(_)), "{first:?}");
    assert_live(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_grants_no_stream_credit_does_not_stall_other_joins() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;

    // This node lets the router send nothing on the streams it opens, so the welcome cannot be written; its
    // keep-alives hold the connection open.
    let mut transport = Arc::try_unwrap(mesh::cluster::transport::transport_config(&TUNING).unwrap()).unwrap();
    transport.stream_receive_window(quinn::VarInt::from_u32(0));
    let mut config = quinn::ClientConfig::new(tls::client_crypto(&certs.member("node-stingy", Role::Node)).unwrap());
    config.transport_config(Arc::new(transport));
    let stingy = connect(config, router.cluster_addr()).await.expect("connect");
    let (mut tx, _rx) = stingy.open_bi().await.unwrap();
    send(&mut tx, &hello("node-stingy", Vec::new())).await;
    eventually(
        "the stingy hello to reach the router",
        Duration::from_secs(30),
        || async { (stingy.stats().frame_tx.stream > 0).then_some(()) },
    )
    .await;

    // Stalled behind the stingy node, the join would wait out its 30 s write timeout first.
    let good = tokio::time::timeout(Duration::from_secs(20), join(&certs, &router, "node-after-stingy")).await;
    assert!(
        good.is_ok(),
        "a node that grants no stream credit stalled every later join:\n{}",
        router.proc.output()
    );
    assert_live(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_for_files_the_router_does_not_hold_gets_a_clear_error_and_nothing_else() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;
    let node = join(&certs, &router, "node-fetch").await;
    for (model, key) in [("nope", "0".repeat(64)), ("../../etc", "x".into())] {
        let ask = encode(&Message::Fetch(Fetch {
            model: model.into(),
            key: key.clone(),
        }));
        match exchange(&node.conn, &ask).await {
            End::Frames(frames) => match frames.as_slice() {
                [Message::FetchEnd(FetchEnd::Error(e))] => {
                    let want = format!("model '{model}' has no files under key {key}");
                    assert!(e.message.contains(&want), "{}", e.message);
                }
                other => panic!("expected one fetch error, got {other:?}"),
            },
            other => panic!("expected a fetch error, got {other:?}"),
        }
    }
    assert_live(&mut router).await;
    assert_eq!(cluster_node(&router, "node-fetch").await.unwrap()["state"], "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_only_under_its_certificates_name_and_cannot_take_a_live_members() {
    let certs = Certs::new();
    let mut router = start_router(&certs, Some(&certs.router), &[]).await;

    // node-a's certificate, with a hello that claims node-b.
    let (code, reason) = first_frame_closes(&router, &certs, &encode(&hello("node-b", Vec::new()))).await;
    assert_eq!(code, u64::from(close::REFUSED), "reason: {reason}");
    assert!(
        reason.contains("the hello names node 'node-b' but its certificate is 'node-a's"),
        "{reason}"
    );
    assert!(cluster_node(&router, "node-b").await.is_none());

    // A router's certificate cannot join as a node: mesh-node would not even start with it, and the router's
    // handshake refuses a client built without that check.
    assert!(tls::client_crypto(&certs.router).is_err());
    let refused = match connect(client_config(raw_client(&certs.router)), router.cluster_addr()).await {
        Err(e) => e,
        Ok(conn) => {
            let hello = say_hello(&conn, &hello("router", Vec::new())).await;
            assert!(hello.is_err(), "a router certificate was answered as a node: {hello:?}");
            conn.closed().await
        }
    };
    assert_tls_refusal(&refused, "is a router certificate; only a node certificate may join");

    // node-t joins; a second certificate for node-t (another key, same CA) cannot take its name while it lives.
    let live = join(&certs, &router, "node-t").await;
    let second = certs.path().join("second");
    std::fs::create_dir(&second).unwrap();
    let (cert, key) = write_leaf(&second, &certs.ca, "node-t", Role::Node);
    let twin = tls::TlsFiles::new(certs.path().join("ca.pem"), cert, key);
    let conn = connect_as(&twin, router.cluster_addr())
        .await
        .expect("a CA-signed certificate connects");
    let (mut tx, _rx) = conn.open_bi().await.unwrap();
    send(&mut tx, &hello("node-t", Vec::new())).await;
    let (code, reason) = closed_by_app(&conn).await;
    assert_eq!(code, u64::from(close::REFUSED), "reason: {reason}");
    assert!(
        reason.contains("node name 'node-t' is held by a live member"),
        "{reason}"
    );
    assert!(live.conn.close_reason().is_none(), "the live member was pushed out");
    let node = cluster_node(&router, "node-t").await.expect("node-t listed");
    assert_eq!(node["state"], "up");

    // The same key is the same node coming back (a restart): it replaces the member.
    let again = join(&certs, &router, "node-t").await;
    assert!(!again.welcome.router.is_empty());
    eventually("the older link to be closed", Duration::from_secs(30), || async {
        live.conn.close_reason().map(|_| ())
    })
    .await;
    assert_live(&mut router).await;
}

/// A client presenting `files` and trusting their CA, built without mesh's check of its own role.
fn raw_client(files: &tls::TlsFiles) -> Arc<quinn::crypto::rustls::QuicClientConfig> {
    use mesh::cluster::certs::{load_certs, load_key};
    let mut roots = rustls::RootCertStore::empty();
    for der in load_certs(&files.ca, "CA").unwrap() {
        roots.add(der).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(load_certs(&files.cert, "cert").unwrap(), load_key(&files.key).unwrap())
        .unwrap();
    config.alpn_protocols = vec![tls::ALPN.to_vec()];
    Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(config).unwrap())
}
