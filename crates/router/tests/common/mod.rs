//! Helpers for the router tests: a real `mesh-router` process, certificates, an HTTP client, a fake node.
#![allow(dead_code)] // each test binary uses a subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::cluster::certs::{CertificateAuthority, Role};
use mesh::cluster::msg::{Hello, LoadReport, Message, ModelStatus, Welcome};
#[allow(unused_imports)]
pub use mesh::cluster::testkit::{encode, eventually, free_tcp_port, free_udp_port, read_end, send, write_leaf, End};
use mesh::cluster::tls::{self, TlsFiles};
use mesh::cluster::transport::{self, Tuning};
use mesh::cluster::Limits;
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, ConnectionError, Endpoint, RecvStream, SendStream};

/// Transport timings of both ends in these tests: slower than production so a busy 2-core host does not time
/// links out; none of the tests depends on them.
pub const TUNING: Tuning = Tuning {
    keep_alive: Duration::from_millis(300),
    idle_timeout: Duration::from_millis(3000),
};

/// A child process, killed when dropped (also when a test panics). Its stdout and stderr go to `log`.
pub struct Proc {
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(bin: &str, args: &[String], log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("create the log file");
        let err = out.try_clone().expect("clone the log file");
        let child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("MESH_LOG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the process `signal` (`libc::SIGHUP`, ...) with kill(2): no `kill` program is needed,
    /// which a fresh root may not have.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) takes plain integers; the child is ours and not yet reaped (Drop reaps it).
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status, if it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll the child")
    }

    /// Waits for the process to exit on its own, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking HTTP/1.1 request on 127.0.0.1 (a JSON body when given): (status, body), or None when nothing answers.
pub fn http_blocking(port: u16, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// A GET off the async runtime, so the QUIC endpoints of the test keep running.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http_blocking(port, "GET", &path, None))
        .await
        .unwrap()
}

/// A POST of a JSON body off the async runtime.
pub async fn http_post(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    let (path, body) = (path.to_string(), body.to_string());
    tokio::task::spawn_blocking(move || http_blocking(port, "POST", &path, Some(&body)))
        .await
        .unwrap()
}

/// Certificates in a temporary directory: the cluster CA with a router and a node certificate, and a rogue CA
/// with a node certificate of its own.
pub struct Certs {
    pub dir: tempfile::TempDir,
    /// The cluster CA, which issues each node a test joins as a certificate under its name.
    pub ca: CertificateAuthority,
    pub router: TlsFiles,
    pub node: TlsFiles,
    /// The rogue node: its certificate is signed by the rogue CA; it trusts both CAs, so only the router's
    /// check of its certificate can stop it.
    pub rogue_node: TlsFiles,
}

impl Certs {
    pub fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("mesh test CA", 2).unwrap();
        let rogue = CertificateAuthority::generate("rogue CA", 2).unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca.cert_pem()).unwrap();
        let both_pem = dir.path().join("both-cas.pem");
        std::fs::write(&both_pem, format!("{}{}", ca.cert_pem(), rogue.cert_pem())).unwrap();
        let (router_cert, router_key) = write_leaf(dir.path(), &ca, "router", Role::Router);
        let (node_cert, node_key) = write_leaf(dir.path(), &ca, "node-a", Role::Node);
        let (rogue_cert, rogue_key) = write_leaf(dir.path(), &rogue, "rogue-node", Role::Node);
        Certs {
            router: TlsFiles::new(&ca_pem, router_cert, router_key),
            node: TlsFiles::new(&ca_pem, node_cert, node_key),
            rogue_node: TlsFiles::new(both_pem, rogue_cert, rogue_key),
            dir,
            ca,
        }
    }

    /// The files of a member `name` in `role`, issued once (a node's name in the cluster is its certificate's).
    pub fn member(&self, name: &str, role: Role) -> TlsFiles {
        let (cert, key) = (
            self.path().join(format!("{name}.pem")),
            self.path().join(format!("{name}.key")),
        );
        if !cert.exists() {
            write_leaf(self.path(), &self.ca, name, role);
        }
        TlsFiles::new(self.path().join("ca.pem"), cert, key)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A running `mesh-router` with its HTTP and cluster ports on 127.0.0.1.
pub struct Router {
    pub proc: Proc,
    pub http: u16,
    pub cluster: u16,
}

impl Router {
    pub fn cluster_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.cluster))
    }
}

/// The flags of a router on fresh ports with `tls` (None: no certificate flags at all).
pub fn router_args(http: u16, cluster: u16, tls: Option<&TlsFiles>) -> Vec<String> {
    let mut args: Vec<String> = [
        "--http-address",
        "127.0.0.1",
        "--allow-grpc",
        "false",
        "--allow-metrics",
        "false",
        "--cluster-address",
        "127.0.0.1",
        "--route-wait-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--http-port".into(),
        http.to_string(),
        "--cluster-port".into(),
        cluster.to_string(),
        "--cluster-keepalive-ms".into(),
        TUNING.keep_alive.as_millis().to_string(),
        "--cluster-idle-timeout-ms".into(),
        TUNING.idle_timeout.as_millis().to_string(),
    ]);
    if let Some(f) = tls {
        for (flag, path) in [
            ("--cluster-ca", &f.ca),
            ("--cluster-cert", &f.cert),
            ("--cluster-key", &f.key),
        ] {
            args.push(flag.into());
            args.push(path.display().to_string());
        }
    }
    args
}

/// Starts a router with `extra` flags and waits until `/v2/health/live` answers 200 (a start that lost a port
/// race is tried again on other ports).
pub async fn start_router(certs: &Certs, tls: Option<&TlsFiles>, extra: &[&str]) -> Router {
    for attempt in 0..3 {
        let (http, cluster) = (free_tcp_port(), free_udp_port());
        let mut args = router_args(http, cluster, tls);
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = certs.path().join(format!("router-{http}.log"));
        let mut proc = Proc::spawn(env!("CARGO_BIN_EXE_mesh-router"), &args, &log);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = proc.exited() {
                let out = proc.output();
                if attempt < 2 && out.contains("in use") {
                    break; // another test took a port between our probe and the bind
                }
                panic!("mesh-router exited at start ({status}):\n{out}");
            }
            if http_get(http, "/v2/health/live").await.map(|r| r.0) == Some(200) {
                return Router { proc, http, cluster };
            }
            assert!(
                Instant::now() < deadline,
                "mesh-router did not become live in 30 s:\n{}",
                proc.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    unreachable!("the loop returns or panics")
}

/// `/mesh/v1/cluster`'s entry for the node called `name`.
pub async fn cluster_node(router: &Router, name: &str) -> Option<serde_json::Value> {
    let (status, body) = http_get(router.http, "/mesh/v1/cluster").await?;
    assert_eq!(status, 200, "GET /mesh/v1/cluster: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("cluster status is JSON");
    v["nodes"].as_array()?.iter().find(|n| n["name"] == name).cloned()
}

pub async fn assert_live(router: &mut Router) {
    assert!(
        router.proc.exited().is_none(),
        "the router died:\n{}",
        router.proc.output()
    );
    let live = http_get(router.http, "/v2/health/live").await;
    assert_eq!(
        live.as_ref().map(|r| r.0),
        Some(200),
        "the router stopped serving HTTP:\n{}",
        router.proc.output()
    );
}

/// A quinn client config for `crypto` with the tests' transport settings.
pub fn client_config(crypto: Arc<QuicClientConfig>) -> quinn::ClientConfig {
    let mut c = quinn::ClientConfig::new(crypto);
    c.transport_config(transport::transport_config(&TUNING).unwrap());
    c
}

/// A fake node's QUIC connection to the router (the handshake only; nothing is sent yet).
pub async fn connect(config: quinn::ClientConfig, to: SocketAddr) -> Result<Connection, ConnectionError> {
    let endpoint = Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let connecting = endpoint.connect_with(config, to, "localhost").unwrap();
    tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .expect("the QUIC handshake neither finished nor failed in 10 s")
}

pub async fn connect_as(files: &TlsFiles, to: SocketAddr) -> Result<Connection, ConnectionError> {
    connect(client_config(tls::client_crypto(files).unwrap()), to).await
}

/// A prelude of this build's version with the given lengths.
pub fn prelude(header_len: u32, payload_len: u64) -> [u8; mesh::cluster::frame::PRELUDE_LEN] {
    mesh::cluster::frame::Prelude {
        version: mesh::cluster::PROTOCOL_VERSION,
        header_len,
        payload_len,
    }
    .encode()
}

pub fn hello(name: &str, models: Vec<ModelStatus>) -> Message {
    Message::Hello(Hello {
        name: name.into(),
        incarnation: 0x5eed_0000_0000_0001,
        devices: vec!["cpu".into()],
        http: String::new(),
        grpc: String::new(),
        models,
        memory: 1 << 30,
        arena: None,
    })
}

/// Opens the control stream, says hello as `name`, and reads the router's first frame.
pub async fn say_hello(conn: &Connection, hello: &Message) -> Result<(SendStream, RecvStream, Message), String> {
    let (mut tx, mut rx) = conn.open_bi().await.map_err(|e| e.to_string())?;
    tx.write_all(&encode(hello)).await.map_err(|e| e.to_string())?;
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        mesh::cluster::io::read_frame(&mut rx, &Limits::default()),
    )
    .await
    .map_err(|_| "no answer to the hello in 10 s".to_string())?
    .map_err(|e| e.to_string())?
    .ok_or("the router ended the control stream")?;
    Ok((tx, rx, first.message))
}

/// A fake node that joined: its connection and control stream.
pub struct Joined {
    pub conn: Connection,
    pub control: SendStream,
    pub control_rx: RecvStream,
    pub welcome: Welcome,
}

/// Connects with the cluster CA's node certificate and joins as `name`; panics if the router does not welcome it.
pub async fn join(certs: &Certs, router: &Router, name: &str) -> Joined {
    join_as(&certs.member(name, Role::Node), router, name).await
}

/// Connects with `files` and joins as `name`; panics if the router does not welcome it.
pub async fn join_as(files: &TlsFiles, router: &Router, name: &str) -> Joined {
    let conn = connect_as(files, router.cluster_addr())
        .await
        .expect("a node with a certificate of the cluster CA connects");
    let (control, control_rx, first) = say_hello(&conn, &hello(name, Vec::new())).await.unwrap();
    let Message::Welcome(welcome) = first else {
        panic!("expected a welcome, got {first:?}")
    };
    Joined {
        conn,
        control,
        control_rx,
        welcome,
    }
}

pub async fn send_load_report(j: &mut Joined) {
    send(&mut j.control, &Message::LoadReport(LoadReport { models: Vec::new() })).await;
}

/// The application close (code, reason) the connection ends with, within 10 s.
pub async fn closed_by_app(conn: &Connection) -> (u64, String) {
    let e = tokio::time::timeout(Duration::from_secs(10), conn.closed())
        .await
        .expect("the router did not close the connection in 10 s");
    match e {
        ConnectionError::ApplicationClosed(c) => (
            c.error_code.into_inner(),
            String::from_utf8_lossy(&c.reason).into_owned(),
        ),
        other => panic!("expected an application close, got {other:?}"),
    }
}

pub const FAKE_ADD: &str = r#"
name: "fake_add"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"#;

/// The status of `fake_add` (Y = X + 1 when answered right) as a fake node reports it.
pub fn fake_add() -> ModelStatus {
    let config = mesh::config::parse_pbtxt(FAKE_ADD).unwrap();
    ModelStatus {
        name: "fake_add".into(),
        version: 1,
        ready: true,
        reason: String::new(),
        config: prost::Message::encode_to_vec(&config),
        placed: false,
    }
}

/// fake_add's right answer to `request`: Y = X + 1.
pub fn add_one(request: &mesh::InferRequest) -> mesh::InferResponse {
    let y: Vec<f32> = request.inputs[0]
        .tensor
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) + 1.0)
        .collect();
    mesh::InferResponse {
        model_name: "fake_add".into(),
        model_version: "1".into(),
        id: request.id.clone(),
        outputs: vec![mesh::NamedTensor {
            name: "Y".into(),
            tensor: mesh::Tensor::from_values(vec![2], &y),
        }],
        parameters: Vec::new(),
    }
}

/// Answers the request on one stream the router opened, right ([`add_one`]).
pub async fn answer_right(mut tx: SendStream, mut rx: RecvStream) {
    let limits = Limits::default();
    let Ok(Some(f)) = mesh::cluster::io::read_frame(&mut rx, &limits).await else {
        return;
    };
    let Message::Request(head) = f.message else {
        return;
    };
    let (request, _) = mesh::cluster::convert::request_from(head, &f.payload).expect("a well-formed request");
    let chunks = mesh::cluster::convert::answer_frame(Some(&Ok(add_one(&request))), true, &limits).unwrap();
    let _ = tx.write_all(&chunks.concat()).await;
    let _ = tx.finish();
}

/// An HTTP infer request body for fake_add, with X = [1.5, -2.0].
pub fn infer_body(id: &str) -> String {
    format!(r#"{{"id":"{id}","inputs":[{{"name":"X","shape":[2],"datatype":"FP32","data":[1.5,-2.0]}}]}}"#)
}

/// Joins as `name` serving fake_add, keeps the node heard from (a silent node is not routed to),
/// answers each stream the router opens with `answer`, and waits until the router routes fake_add.
pub async fn join_serving_fake_add<F, Fut>(certs: &Certs, router: &Router, name: &str, answer: F) -> Connection
where
    F: Fn(SendStream, RecvStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let conn = connect_as(&certs.member(name, Role::Node), router.cluster_addr())
        .await
        .unwrap();
    let (mut control, _control_rx, first) = say_hello(&conn, &hello(name, vec![fake_add()])).await.unwrap();
    assert!(matches!(first, Message::Welcome(_)), "{first:?}");
    tokio::spawn(async move {
        // The control stream's reader is kept alive with the task.
        let _control_rx = _control_rx;
        loop {
            send(&mut control, &Message::LoadReport(LoadReport { models: Vec::new() })).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let accepting = conn.clone();
    tokio::spawn(async move {
        while let Ok((tx, rx)) = accepting.accept_bi().await {
            tokio::spawn(answer(tx, rx));
        }
    });
    eventually(
        "fake_add to be ready on the router",
        Duration::from_secs(30),
        || async {
            let r = http_get(router.http, "/v2/models/fake_add/ready").await?;
            (r.0 == 200).then_some(())
        },
    )
    .await;
    conn
}
