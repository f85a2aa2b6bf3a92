//! Helpers for the node tests: a real `mesh-node` process, certificates, an HTTP client, a fake router.
#![allow(dead_code)] // each test binary uses a subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mesh::cluster::certs::{CertificateAuthority, Role};
use mesh::cluster::io::read_frame;
use mesh::cluster::msg::{Hello, Message, Welcome};
#[allow(unused_imports)]
pub use mesh::cluster::testkit::{encode, eventually, free_tcp_port, free_udp_port, read_end, send, write_leaf, End};
use mesh::cluster::tls::{self, TlsFiles};
use mesh::cluster::transport::{self, Tuning};
use mesh::cluster::Limits;
use quinn::{Connection, ConnectionError, Endpoint, RecvStream, SendStream};

/// Transport timings of both ends in these tests: slower than production so a busy 2-core host does not time
/// links out; none of the tests depends on them.
pub const TUNING: Tuning = Tuning {
    keep_alive: Duration::from_millis(300),
    idle_timeout: Duration::from_millis(3000),
};

/// The repository root, two levels above this crate.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The project venv's ONNX Runtime: `.venv/lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so.*`
pub fn find_ort() -> Option<PathBuf> {
    let lib = repo_root().join(".venv/lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .filter_map(|e| std::fs::read_dir(e.path().join("site-packages/onnxruntime/capi")).ok())
        .flat_map(|dir| dir.flatten().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libonnxruntime.so."))
        })
        .collect();
    found.sort();
    // Prefer the version the project pins, else the newest found.
    found
        .iter()
        .find(|p| p.ends_with("libonnxruntime.so.1.31.1"))
        .or(found.last())
        .cloned()
}

/// The ONNX Runtime library and the add_sub model, or None (after one line saying why) when this machine lacks
/// them; with `MESH_REQUIRE_SERVER=1` their absence fails the test instead.
pub fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let ort = find_ort();
    let add_sub = repo_root().join("target/models/simple/add_sub");
    let missing = match (&ort, add_sub.join("1/model.onnx").is_file()) {
        (None, _) => "the ONNX Runtime library (.venv/lib/python*/site-packages/onnxruntime/capi)",
        (_, false) => "target/models/simple/add_sub (run scripts/setup.sh)",
        (Some(_), true) => return Some((ort.unwrap(), add_sub)),
    };
    if std::env::var("MESH_REQUIRE_SERVER").as_deref() == Ok("1") {
        panic!("MESH_REQUIRE_SERVER=1 but {missing} is missing");
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("skipping the mesh-node cluster tests: {missing} is missing"));
    None
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A child process, killed when dropped (also when a test panics). Its stdout and stderr go to `log`.
pub struct Proc {
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(bin: &str, args: &[String], envs: &[(&str, &Path)], log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("create the log file");
        let err = out.try_clone().expect("clone the log file");
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("NO_COLOR", "1")
            .env_remove("MESH_LOG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("poll the child").is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking HTTP/1.1 GET on 127.0.0.1: the status, or None when nothing answers.
pub fn http_status_blocking(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    String::from_utf8_lossy(&raw).split_whitespace().nth(1)?.parse().ok()
}

/// `http_status_blocking` off the async runtime, so the test's QUIC endpoint keeps running.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http_status_blocking(port, &path))
        .await
        .unwrap()
}

/// Certificates and a model repository in a temporary directory: the cluster CA with a router and a node
/// certificate, and a rogue CA's router certificate.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub ort: PathBuf,
    /// A repository with add_sub.
    pub repo: PathBuf,
    pub router: TlsFiles,
    /// The cluster CA, which issues each node started here a certificate under its name.
    pub ca: CertificateAuthority,
    /// The rogue router: its certificate is signed by the rogue CA; it trusts both CAs, so only the node's check
    /// of the router's certificate can stop the join.
    pub rogue_router: TlsFiles,
}

impl Setup {
    /// None when the node cannot run here (see `prerequisites`).
    pub fn new() -> Option<Setup> {
        let (ort, add_sub) = prerequisites()?;
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models");
        copy_dir(&add_sub, &repo.join("add_sub"));
        let ca = CertificateAuthority::generate("mesh test CA", 2).unwrap();
        let rogue = CertificateAuthority::generate("rogue CA", 2).unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca.cert_pem()).unwrap();
        let both_pem = dir.path().join("both-cas.pem");
        std::fs::write(&both_pem, format!("{}{}", ca.cert_pem(), rogue.cert_pem())).unwrap();
        let (router_cert, router_key) = write_leaf(dir.path(), &ca, "router", Role::Router);
        let (rogue_cert, rogue_key) = write_leaf(dir.path(), &rogue, "rogue-router", Role::Router);
        Some(Setup {
            ort,
            repo,
            router: TlsFiles::new(&ca_pem, router_cert, router_key),
            ca,
            rogue_router: TlsFiles::new(both_pem, rogue_cert, rogue_key),
            dir,
        })
    }

    /// The certificate files of node `name` (a node's name in the cluster is its certificate's), issued once.
    pub fn node(&self, name: &str) -> TlsFiles {
        let (cert, key) = (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        );
        if !cert.exists() {
            write_leaf(self.dir.path(), &self.ca, name, Role::Node);
        }
        TlsFiles::new(self.dir.path().join("ca.pem"), cert, key)
    }

    /// Starts a node called `name` on a fresh HTTP port that joins `router`, and waits until its HTTP is live.
    pub async fn start_node(&self, name: &str, router: SocketAddr) -> Node {
        let files = self.node(name);
        let http = free_tcp_port();
        let mut args: Vec<String> = vec![
            "--model-repository".into(),
            self.repo.display().to_string(),
            "--http-address".into(),
            "127.0.0.1".into(),
            "--http-port".into(),
            http.to_string(),
            "--allow-grpc".into(),
            "false".into(),
            "--allow-metrics".into(),
            "false".into(),
            "--cluster-join".into(),
            router.to_string(),
            "--node-name".into(),
            name.into(),
            "--cluster-bind".into(),
            "127.0.0.1:0".into(),
            "--cluster-report-ms".into(),
            "100".into(),
            "--cluster-keepalive-ms".into(),
            TUNING.keep_alive.as_millis().to_string(),
            "--cluster-idle-timeout-ms".into(),
            TUNING.idle_timeout.as_millis().to_string(),
        ];
        for (flag, path) in [
            ("--cluster-ca", &files.ca),
            ("--cluster-cert", &files.cert),
            ("--cluster-key", &files.key),
        ] {
            args.push(flag.into());
            args.push(path.display().to_string());
        }
        let log = self.dir.path().join(format!("{name}-{http}.log"));
        let mut proc = Proc::spawn(
            env!("CARGO_BIN_EXE_mesh-node"),
            &args,
            &[("ORT_DYLIB_PATH", &self.ort)],
            &log,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(proc.running(), "mesh-node exited at start:\n{}", proc.output());
            if http_status(http, "/v2/health/live").await == Some(200) {
                return Node { proc, http };
            }
            assert!(
                Instant::now() < deadline,
                "mesh-node did not become live in 60 s:\n{}",
                proc.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A running `mesh-node`.
pub struct Node {
    pub proc: Proc,
    pub http: u16,
}

impl Node {
    /// Asserts that the process runs and its own HTTP endpoint still answers.
    pub async fn assert_serving(&mut self) {
        assert!(self.proc.running(), "the node died:\n{}", self.proc.output());
        assert_eq!(
            http_status(self.http, "/v2/health/live").await,
            Some(200),
            "the node stopped serving HTTP:\n{}",
            self.proc.output()
        );
    }

    /// Waits until the node's output contains `needle`; returns the output.
    pub async fn wait_log(&self, needle: &str, limit: Duration) -> String {
        eventually(&format!("the node to log '{needle}'"), limit, || {
            let out = self.proc.output();
            async move { out.contains(needle).then_some(out) }
        })
        .await
    }
}

/// A fake router: a QUIC server endpoint on 127.0.0.1 with the tests' transport settings.
pub struct FakeRouter {
    pub endpoint: Endpoint,
    pub addr: SocketAddr,
}

impl FakeRouter {
    pub fn new(files: &TlsFiles) -> FakeRouter {
        Self::with_transport(files, |_| {})
    }

    /// A fake router whose transport settings `adjust` changes from the tests' defaults.
    pub fn with_transport(files: &TlsFiles, adjust: impl FnOnce(&mut quinn::TransportConfig)) -> FakeRouter {
        let mut transport = std::sync::Arc::try_unwrap(transport::transport_config(&TUNING).unwrap())
            .expect("a fresh transport config");
        adjust(&mut transport);
        let mut config = quinn::ServerConfig::with_crypto(tls::server_crypto(files).unwrap());
        config.transport_config(std::sync::Arc::new(transport));
        let endpoint = Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = endpoint.local_addr().unwrap();
        FakeRouter { endpoint, addr }
    }

    /// The next connection attempt's outcome, or None when none comes within `limit`.
    pub async fn next_attempt(&self, limit: Duration) -> Option<Result<Connection, ConnectionError>> {
        let incoming = tokio::time::timeout(limit, self.endpoint.accept()).await.ok()??;
        Some(
            tokio::time::timeout(Duration::from_secs(10), incoming)
                .await
                .expect("a QUIC handshake neither finished nor failed in 10 s"),
        )
    }

    /// Accepts the next node and reads its hello from the control stream.
    pub async fn accept_hello(&self) -> Link {
        let conn = self
            .next_attempt(Duration::from_secs(30))
            .await
            .expect("the node did not dial in 30 s")
            .expect("the node's handshake failed");
        let (control, mut control_rx) = tokio::time::timeout(Duration::from_secs(10), conn.accept_bi())
            .await
            .expect("no control stream in 10 s")
            .expect("the control stream");
        let first = read_frame(&mut control_rx, &Limits::default())
            .await
            .expect("a frame")
            .expect("a hello");
        let Message::Hello(hello) = first.message else {
            panic!("the node's first frame is not a hello: {:?}", first.message)
        };
        Link {
            conn,
            control,
            control_rx,
            hello,
        }
    }
}

/// A node connected to the fake router.
pub struct Link {
    pub conn: Connection,
    pub control: SendStream,
    pub control_rx: RecvStream,
    pub hello: Hello,
}

impl Link {
    pub async fn welcome(&mut self) {
        let welcome = Message::Welcome(Welcome {
            router: "fake-router".into(),
            link: 7,
            arena: None,
        });
        send(&mut self.control, &welcome).await;
    }

    /// The next control frame, within `limit`.
    pub async fn next_control(&mut self, limit: Duration) -> Message {
        let read = tokio::time::timeout(limit, read_frame(&mut self.control_rx, &Limits::default()))
            .await
            .expect("no control frame in time");
        read.expect("a control frame")
            .expect("the control stream ended")
            .message
    }
}

/// Opens a stream on `conn`, writes `bytes`, finishes it, and reads how the node ended it.
pub async fn exchange(conn: &Connection, bytes: &[u8]) -> End {
    let (mut tx, mut rx) = conn.open_bi().await.expect("open a stream");
    tx.write_all(bytes).await.expect("write");
    let _ = tx.finish();
    read_end(&mut rx).await
}
