//! The credit of a streamed request over a real QUIC stream: the serving side sends only the answers its
//! caller granted, and the caller grants only as its own client makes room.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::serve;
use crate::cluster::call::{self, Peer};
use crate::cluster::convert::{request_frame, ErrorKind};
use crate::cluster::io::read_frame;
use crate::cluster::{tls, Limits};
use crate::dispatch::Dispatch;
use crate::request::{InferRequest, InferResponse};
use crate::stream::StreamItem;
use crate::stream::{stream_channel, StreamSender, Window};
use crate::tensor::{NamedTensor, Tensor};
use crate::{IndexEntry, ModelView};

const ANSWERS: usize = 100;

/// A decoupled model that sends `answers` answers of 1 KiB as fast as its stream's window lets it
/// (and echoes a unary request's inputs).
struct Flood {
    made: Arc<AtomicUsize>,
    answers: usize,
}

#[async_trait::async_trait]
impl Dispatch for Flood {
    /// A unary request is answered with its own inputs.
    async fn infer(&self, request: InferRequest) -> crate::Result<InferResponse> {
        Ok(InferResponse {
            model_name: request.model_name,
            outputs: request.inputs,
            ..Default::default()
        })
    }
    async fn infer_stream(&self, _: InferRequest, sink: StreamSender) {
        for n in 0..self.answers {
            let Some(credit) = sink.credit().await else { return };
            let response = InferResponse {
                outputs: vec![NamedTensor {
                    name: "N".into(),
                    tensor: Tensor::from_values(vec![256], &[n as i32; 256]),
                }],
                ..Default::default()
            };
            let last = n + 1 == self.answers;
            let _ = sink.send(StreamItem {
                response: Some(Ok(response)),
                last,
                credit: Some(credit),
            });
            self.made.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn ready(&self) -> bool {
        true
    }
    fn model(&self, _: &str, _: &str) -> crate::Result<ModelView> {
        Err(crate::Error::not_found("no views here"))
    }
    fn repository_index(&self) -> Vec<IndexEntry> {
        Vec::new()
    }
}

/// `dispatch` serving `streams` requests, one after another, on a real QUIC pair on loopback (test
/// certificates); returns the caller's connection and the serving task, which ends with its own.
async fn served<D: Dispatch + Send + Sync + 'static>(
    dispatch: D,
    streams: usize,
) -> (quinn::Connection, tokio::task::JoinHandle<quinn::Connection>) {
    let local = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server_crypto = tls::insecure_server_crypto().unwrap();
    let server = quinn::Endpoint::server(quinn::ServerConfig::with_crypto(server_crypto), local).unwrap();
    let addr = server.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let limits = Limits::default();
        let conn = server.accept().await.unwrap().await.unwrap();
        for _ in 0..streams {
            let (send, mut recv) = conn.accept_bi().await.unwrap();
            let first = read_frame(&mut recv, &limits).await.unwrap().unwrap();
            let received = super::request_of(first).unwrap();
            serve(&dispatch, received, (send, recv), (&limits, None), |_| {
                ErrorKind::Answered
            })
            .await;
        }
        conn
    });
    let mut client = quinn::Endpoint::client(local).unwrap();
    client.set_default_client_config(quinn::ClientConfig::new(tls::insecure_client_crypto().unwrap()));
    let conn = client.connect(addr, "mesh").unwrap().await.unwrap();
    (conn, serving)
}

/// A served Flood of `answers` on a real QUIC pair; returns the connection to call it, and its count of answers made.
async fn flood(
    answers: usize,
) -> (
    quinn::Connection,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<quinn::Connection>,
) {
    let made = Arc::new(AtomicUsize::new(0));
    let flood = Flood {
        made: made.clone(),
        answers,
    };
    let (conn, serving) = served(flood, 1).await;
    (conn, made, serving)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sends_only_what_its_callers_client_made_room_for() {
    let (conn, made, serving) = flood(ANSWERS).await;
    let limits = Limits::default();
    // The caller's client has room for one answer and reads none yet.
    let window = Window::new(1, u64::MAX);
    let (sink, mut answers) = stream_channel(window.clone());
    let request = InferRequest {
        model_name: "flood".into(),
        ..Default::default()
    };
    let chunks = request_frame(&request, true, None, &limits).unwrap();
    let calling = tokio::spawn(async move {
        let peer = Peer {
            conn: &conn,
            name: "peer",
            out: None,
        };
        let far = Instant::now() + Duration::from_secs(30);
        let result = call::stream(peer, chunks, &limits, &sink, far).await;
        (result.map_err(|(f, n)| format!("{f} after {n}")), conn)
    });
    // The one answer the client has room for arrives (however long the machine takes to get it
    // there), and then, however long the model is given, it makes no more than its windows allow.
    let guard = Instant::now() + Duration::from_secs(60);
    while window.out() < 1 {
        assert!(
            Instant::now() < guard,
            "the granted answer never reached the caller's client"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = made.load(Ordering::SeqCst);
    // The serving side's own window (16) and one granted answer; without credit it would send all 100.
    assert!(
        held <= 20,
        "the model made {held} answers for a client with room for one"
    );
    assert_eq!(
        window.out(),
        1,
        "the caller holds the one answer its client has room for"
    );
    let first = answers.try_recv().expect("the granted answer arrived");
    assert!(answers.try_recv().is_err(), "only one answer was read off the link");
    drop(first);

    // Reading on, every answer arrives, in order.
    let mut seen = 1;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(10), answers.recv())
        .await
        .unwrap()
    {
        let response = item.response.expect("an answer").expect("no error");
        let n = i32::from_ne_bytes(response.outputs[0].tensor.data[..4].try_into().unwrap());
        assert_eq!(n as usize, seen);
        seen += 1;
        if item.last {
            break;
        }
    }
    assert_eq!(seen, ANSWERS);
    let (result, _conn) = calling.await.unwrap();
    assert_eq!(result, Ok(()));
    let _ = tokio::time::timeout(Duration::from_secs(5), serving).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_finished_and_stopped_reading_credit_still_delivers_its_last_answers() {
    // With room for all, the serving side has credit for every answer, writes them, and ends its stream
    // (refusing further credit) before the caller's later grants: that is not a failure.
    for _ in 0..20 {
        let (conn, _made, _serving) = flood(4).await;
        let limits = Limits::default();
        let (sink, mut answers) = stream_channel(Window::new(64, u64::MAX));
        let request = InferRequest {
            model_name: "flood".into(),
            ..Default::default()
        };
        let chunks = request_frame(&request, true, None, &limits).unwrap();
        let peer = Peer {
            conn: &conn,
            name: "peer",
            out: None,
        };
        let far = Instant::now() + Duration::from_secs(30);
        let result = call::stream(peer, chunks, &limits, &sink, far).await;
        assert_eq!(result.map_err(|(f, n)| format!("{f} after {n}")), Ok(()));
        let mut got = 0;
        while let Ok(item) = answers.try_recv() {
            got += usize::from(item.response.is_some());
        }
        assert_eq!(got, 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_requests_end_their_streams_without_a_stop_sending_each() {
    const CALLS: u64 = 200;
    let echo = Flood {
        made: Arc::default(),
        answers: 0,
    };
    let (conn, serving) = served(echo, CALLS as usize).await;
    let limits = Limits::default();
    let peer = Peer {
        conn: &conn,
        name: "peer",
        out: None,
    };
    for n in 0..CALLS {
        let request = InferRequest {
            model_name: "echo".into(),
            inputs: vec![NamedTensor {
                name: "X".into(),
                tensor: Tensor::from_values(vec![4], &[n as i32; 4]),
            }],
            ..Default::default()
        };
        let chunks = request_frame(&request, false, None, &limits).unwrap();
        let answer = call::unary(peer, chunks, &limits).await.unwrap();
        assert_eq!(answer.outputs[0].tensor.data, request.inputs[0].tensor.data);
    }
    assert_no_stop_sending(&conn, serving, "200 unary requests").await;
}

/// Each side reads the other's end before letting its stream go (at once when it came with the
/// last frame, else in a task that waits for it), so no request costs a STOP_SENDING packet,
/// however the packets and the threads were scheduled.
async fn assert_no_stop_sending(
    conn: &quinn::Connection,
    serving: tokio::task::JoinHandle<quinn::Connection>,
    what: &str,
) {
    let served = tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .expect("the serving side ends")
        .unwrap();
    let (caller, callee) = (conn.stats().frame_tx.stop_sending, served.stats().frame_tx.stop_sending);
    assert_eq!(
        (caller, callee),
        (0, 0),
        "STOP_SENDING frames from the caller and the callee for {what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_requests_end_their_streams_without_a_stop_sending_each() {
    // Credit the caller grants after the last answer left, and each side's end, are read before
    // either side lets its stream go.
    const CALLS: u64 = 50;
    let flood = Flood {
        made: Arc::default(),
        answers: 3,
    };
    let (conn, serving) = served(flood, CALLS as usize).await;
    let limits = Limits::default();
    let peer = Peer {
        conn: &conn,
        name: "peer",
        out: None,
    };
    for _ in 0..CALLS {
        let (sink, mut answers) = stream_channel(Window::new(64, u64::MAX));
        let request = InferRequest {
            model_name: "flood".into(),
            ..Default::default()
        };
        let chunks = request_frame(&request, true, None, &limits).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let result = call::stream(peer, chunks, &limits, &sink, far).await;
        assert_eq!(result.map_err(|(f, n)| format!("{f} after {n}")), Ok(()));
        let mut got = 0;
        while let Ok(item) = answers.try_recv() {
            got += usize::from(item.response.is_some());
        }
        assert_eq!(got, 3);
    }
    assert_no_stop_sending(&conn, serving, "50 streamed requests").await;
}
