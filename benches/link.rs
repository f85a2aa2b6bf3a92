//! The cluster link on its own, against a plain gRPC hop over TCP for the same call: one process,
//! loopback, an echo model on the far side (the answer is the request's tensor), so only the
//! transport is measured. Small requests at concurrency 1 and 8 (p50/p99, req/s) and 16 MiB tensors
//! (GB/s of tensor bytes moved one way and back), over QUIC and through the link's shared memory (a
//! router and a node on the same host).
//!
//! Run: `cargo bench -p mesh-router --bench link -- [SECONDS_PER_POINT]` (default 3).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use mesh::cluster::call::{self, Peer};
use mesh::cluster::certs::{CertificateAuthority, LeafRequest, Role};
use mesh::cluster::convert::{request_frame, ErrorKind};
use mesh::cluster::io::read_frame;
use mesh::cluster::shm::{Outbound, Registered};
use mesh::cluster::{answer, tls, transport, Limits};
use mesh::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use mesh::proto::model_infer_request::InferInputTensor;
use mesh::proto::ModelInferRequest;
use mesh::{DataType, Dispatch, IndexEntry, InferRequest, InferResponse, ModelView, NamedTensor, Result, Tensor};

/// Answers every request with its own first input, renamed: no model work.
struct Echo;

#[async_trait]
impl Dispatch for Echo {
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let mut outputs = request.inputs;
        outputs.truncate(1);
        outputs[0].name = "y".into();
        Ok(InferResponse {
            model_name: request.model_name,
            model_version: "1".into(),
            id: request.id,
            outputs,
            parameters: vec![],
        })
    }
    fn ready(&self) -> bool {
        true
    }
    fn model(&self, name: &str, _: &str) -> Result<ModelView> {
        Err(mesh::Error::not_found(format!("no metadata for '{name}'")))
    }
    fn repository_index(&self) -> Vec<IndexEntry> {
        vec![]
    }
}

fn request(bytes: usize) -> InferRequest {
    let n = bytes / 4;
    InferRequest {
        model_name: "echo".into(),
        inputs: vec![NamedTensor {
            name: "x".into(),
            tensor: Tensor::new(DataType::Fp32, vec![1, n as i64], Bytes::from(vec![1u8; n * 4])).unwrap(),
        }],
        ..Default::default()
    }
}

/// Both ends of a link's shared memory in this one process: the arenas (kept alive by the caller)
/// and each side's way into the other's.
struct SharedMemory {
    _arenas: Vec<Registered>,
    to_node: Arc<Outbound>,
    to_router: Arc<Outbound>,
}

fn shared_memory(limits: &Limits) -> SharedMemory {
    let (node, router) = (limits.arenas.inbound().unwrap(), limits.arenas.inbound().unwrap());
    SharedMemory {
        to_node: limits.arenas.outbound(node.offer().as_ref(), "echo node").unwrap(),
        to_router: limits.arenas.outbound(router.offer().as_ref(), "router").unwrap(),
        _arenas: vec![node, router],
    }
}

/// A QUIC "node" serving Echo, and a connection to it as a router would hold it; the node writes
/// its answers into `to_router` when given.
async fn quic_pair(limits: Limits, to_router: Option<Arc<Outbound>>) -> (quinn::Connection, quinn::Endpoint) {
    let dir = std::env::temp_dir().join(format!("mesh-link-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = CertificateAuthority::generate("bench CA", 1).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
    for (name, role) in [("router", Role::Router), ("node", Role::Node)] {
        let leaf = ca.issue(&LeafRequest::new(name, role)).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), &leaf.cert_pem).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), &leaf.key_pem).unwrap();
    }
    let t = transport::transport_config(&transport::Tuning::default()).unwrap();
    let mut server =
        quinn::ServerConfig::with_crypto(tls::server_crypto(&tls::TlsFiles::in_dir(&dir, "router")).unwrap());
    server.transport_config(t.clone());
    let listener = transport::endpoint("127.0.0.1:0".parse().unwrap(), Some(server)).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let mut client = quinn::ClientConfig::new(tls::client_crypto(&tls::TlsFiles::in_dir(&dir, "node")).unwrap());
    client.transport_config(t);
    let dialer = transport::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let dialing = dialer.connect_with(client, addr, "localhost").unwrap();
    let accepted = listener.accept().await.unwrap().await.unwrap();
    let dialed = dialing.await.unwrap();
    // The side that accepted plays the router (it opens request streams); the dialer serves them.
    tokio::spawn(async move {
        while let Ok((send, mut recv)) = dialed.accept_bi().await {
            let (limits, out) = (limits.clone(), to_router.clone());
            tokio::spawn(async move {
                if let Ok(Some(frame)) = read_frame(&mut recv, &limits).await {
                    if let Ok(received) = answer::request_of(frame) {
                        let out = (&limits, out.as_deref());
                        answer::serve(&Echo, received, (send, recv), out, |_| ErrorKind::Answered).await;
                    }
                }
            });
        }
    });
    std::fs::remove_dir_all(&dir).ok();
    (accepted, listener)
}

async fn grpc_client() -> GrpcInferenceServiceClient<tonic::transport::Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |tcp| {
        tcp.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    let service = mesh::grpc::GrpcFrontend::server(Arc::new(Echo), usize::MAX, Default::default(), None, false);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .connect()
        .await
        .unwrap();
    GrpcInferenceServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

fn grpc_request(bytes: usize) -> ModelInferRequest {
    let n = bytes / 4;
    ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![1, n as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![1u8; n * 4].into()],
        ..Default::default()
    }
}

/// Calls made before a point is timed.
const WARM_UP: usize = 50;

/// Runs `call` from `concurrency` tasks for `secs`; returns the latencies and the wall time.
async fn load<F, Fut>(concurrency: usize, secs: f64, call: F) -> (Vec<Duration>, Duration)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    for _ in 0..WARM_UP {
        call().await;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    call().await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, start.elapsed())
}

fn row(label: &str, mut lat: Vec<Duration>, wall: Duration, bytes: usize) {
    lat.sort_unstable();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e6;
    let rate = lat.len() as f64 / wall.as_secs_f64();
    let gbps = rate * bytes as f64 * 2.0 / 1e9;
    println!("| {label} | {rate:.0} | {:.0} | {:.0} | {gbps:.2} |", p(0.5), p(0.99));
}

#[tokio::main]
async fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let limits = Limits::default();
    let shm = shared_memory(&limits);
    let (conn, _listener) = quic_pair(limits.clone(), None).await;
    let (shm_conn, _shm_listener) = quic_pair(limits.clone(), Some(shm.to_router.clone())).await;
    let grpc = grpc_client().await;
    // Requests sent on `conn` (the plain QUIC link), warm-ups included, for its packet counts.
    let mut on_conn = 0usize;
    let mut small = None;
    println!("| call | req/s | p50 µs | p99 µs | GB/s (both ways) |");
    println!("|---|---|---|---|---|");
    for (bytes, concurrencies) in [(256usize, vec![1, 8]), (16 << 20, vec![1, 4])] {
        let size = if bytes >= 1 << 20 {
            format!("{} MiB", bytes >> 20)
        } else {
            format!("{bytes} B")
        };
        for c in concurrencies {
            let links = [
                ("QUIC link", conn.clone(), None),
                (
                    "link, same host (shared memory)",
                    shm_conn.clone(),
                    Some(shm.to_node.clone()),
                ),
            ];
            for (label, conn, out) in links {
                if out.is_some() && (bytes as u64) < mesh::cluster::shm::MIN_PAYLOAD {
                    continue; // small payloads travel inline either way
                }
                let plain = out.is_none();
                let req = Arc::new(request(bytes));
                let limits = limits.clone();
                let (lat, wall) = load(c, secs, move || {
                    let (req, conn, limits, out) = (req.clone(), conn.clone(), limits.clone(), out.clone());
                    async move {
                        let chunks = request_frame(&req, false, None, &limits).unwrap();
                        let peer = Peer {
                            conn: &conn,
                            name: "echo node",
                            out: out.as_deref(),
                        };
                        let r = call::unary(peer, chunks, &limits).await.unwrap();
                        assert_eq!(r.outputs[0].tensor.data.len(), bytes);
                    }
                })
                .await;
                if plain {
                    on_conn += WARM_UP + lat.len();
                }
                row(&format!("{label}, {size}, c={c}"), lat, wall, bytes);
            }

            let req = grpc_request(bytes);
            let client = grpc.clone();
            let (lat, wall) = load(c, secs, move || {
                let (req, mut client) = (req.clone(), client.clone());
                async move {
                    let r = client.model_infer(req).await.unwrap().into_inner();
                    assert_eq!(r.raw_output_contents[0].len(), bytes);
                }
            })
            .await;
            row(&format!("gRPC over TCP, {size}, c={c}"), lat, wall, bytes);
        }
        if bytes < 1 << 20 {
            small = Some((on_conn, conn.stats()));
        }
    }
    // What the scheduler decides, so a measurement here rather than a test: whether a peer's FIN
    // has arrived when a stream is let go (each stream's end is read before it goes, so none should
    // cost a STOP_SENDING), and how many datagrams a small request takes.
    let s = conn.stats();
    println!(
        "\nQUIC link: {on_conn} requests; STOP_SENDING frames: {} sent, {} received",
        s.frame_tx.stop_sending, s.frame_rx.stop_sending
    );
    if let Some((n, s)) = small {
        let per = |d: u64| d as f64 / n.max(1) as f64;
        println!(
            "Its {n} small requests: {:.2} datagrams sent and {:.2} received per request",
            per(s.udp_tx.datagrams),
            per(s.udp_rx.datagrams)
        );
    }
}
