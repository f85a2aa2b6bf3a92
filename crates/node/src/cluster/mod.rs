//! The node's side of the cluster link (`--cluster-join`): one session per router that reports the
//! node's models and load and serves the router's requests; BLS calls for models this node does
//! not serve leave through a router; on shutdown the node drains, is released, and says goodbye.
pub mod join;
pub mod placing;
pub mod report;
pub mod serve;

use mesh::sync::ReadWrite;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mesh::cluster::call::{self, Failure, Peer};
use mesh::cluster::convert::request_frame;
use mesh::cluster::shm::Outbound;
use mesh::cluster::{transport, Limits};
use mesh::{Error, InferRequest, InferResponse, Result};
use quinn::{Connection, TransportConfig};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::cli::Args;
use crate::node::Node;
use crate::serving::bls::Remote;
use serve::Serving;

/// How the node joins, from its flags.
pub struct Settings {
    /// HOST:PORT of every router to join.
    pub routers: Vec<String>,
    pub name: String,
    /// Fresh per process start.
    pub incarnation: u64,
    pub devices: Vec<String>,
    /// The node's own endpoints, for operators.
    pub http: String,
    pub grpc: String,
    /// The config of the next dial: kept current with the certificate files while the node runs.
    pub client: mesh::cluster::reload::LiveClient,
    pub bind: SocketAddr,
    pub limits: Limits,
    /// How often model changes and load are reported.
    pub report_every: Duration,
    /// Memory offered for placed models, told to routers in the hello.
    pub memory: u64,
    /// Where placed models' files are cached.
    pub cache: PathBuf,
    /// The node's own repositories (the router does not place over their models).
    pub roots: Vec<PathBuf>,
}

impl Settings {
    /// The cluster settings of the flags, or None without `--cluster-join`; with it, certificates
    /// are required unless the development flag says otherwise.
    pub fn from_args(
        args: &Args,
        gpus: &[i32],
    ) -> std::result::Result<Option<(Settings, Arc<TransportConfig>)>, String> {
        if args.cluster_join.is_empty() {
            return Ok(None);
        }
        let (client, certificate) = args.link.node_client()?;
        let name = node_name(args.node_name.as_deref(), certificate)?
            .unwrap_or_else(|| format!("{}:{}", hostname(), args.listen.http_port));
        let transport = args.link.transport()?;
        let mut devices = vec!["cpu".to_string()];
        devices.extend(gpus.iter().map(|g| format!("gpu:{g}")));
        let endpoint = |addr: Option<std::net::SocketAddr>| addr.map(|a| a.to_string()).unwrap_or_default();
        let settings = Settings {
            routers: args.cluster_join.clone(),
            name,
            incarnation: rand::random(),
            devices,
            http: endpoint(args.listen.http_addr()),
            grpc: endpoint(args.listen.grpc_addr()),
            client,
            bind: args.cluster_bind,
            // Tensor bytes received from routers are bounded like the node's own requests.
            limits: args.link.limits(args.max_inflight_bytes as u64),
            report_every: Duration::from_millis(args.cluster_report_ms.max(10)),
            memory: args.cluster_memory.or_else(crate::cli::total_memory).unwrap_or(8 << 30),
            cache: args
                .cluster_cache
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("mesh-node-cache")),
            roots: args.model_repository.clone(),
        };
        Ok(Some((settings, transport)))
    }
}

/// The node's name in the cluster: its certificate's. `--node-name` may repeat it, not change it; without a
/// certificate (the development mode) it is `--node-name`, else HOST:HTTP_PORT (None here).
fn node_name(flag: Option<&str>, certificate: Option<String>) -> std::result::Result<Option<String>, String> {
    match (flag, certificate) {
        (Some(flag), Some(cert)) if flag != cert => Err(format!(
            "--node-name '{flag}' is not the name in this node's certificate ('{cert}'): a node's name in the \
             cluster is its certificate's; leave --node-name out, or issue a certificate for '{flag}' \
             (mesh-ops certs issue DIR {flag} --role node)"
        )),
        (_, Some(cert)) => Ok(Some(cert)),
        (flag, None) => Ok(flag.map(str::to_string)),
    }
}

fn hostname() -> String {
    mesh::process::hostname().unwrap_or_else(|| "node".into())
}

/// Where the node is in its life in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// Stopping: routers are told to send nothing new.
    Draining,
    /// Every session says goodbye and closes.
    Leaving,
}

/// What every session shares.
pub struct Context {
    pub settings: Settings,
    pub endpoint: quinn::Endpoint,
    pub serving: Arc<Serving>,
    pub routers: Arc<Routers>,
    pub phase: watch::Sender<Phase>,
    /// Woken when a router releases this node.
    pub released: Notify,
    /// Loads and evicts the models routers place here.
    pub placing: Arc<placing::Placing>,
}

/// A router this node is joined to now.
pub struct LiveRouter {
    pub addr: String,
    pub conn: Connection,
    /// The router's shared-memory arena, when it runs on this host.
    pub out: Option<Arc<Outbound>>,
    /// The router has nothing of its own in flight here any more (after a drain).
    pub released: AtomicBool,
}

/// The routers this node is joined to; BLS calls for models served elsewhere go through them.
#[derive(Default)]
pub struct Routers {
    live: RwLock<Vec<Arc<LiveRouter>>>,
    next: AtomicUsize,
    limits: Limits,
}

impl Routers {
    fn add(&self, addr: &str, conn: Connection, out: Option<Arc<Outbound>>) -> Arc<LiveRouter> {
        let live = Arc::new(LiveRouter {
            addr: addr.to_string(),
            conn,
            out,
            released: AtomicBool::new(false),
        });
        self.live.writing().push(live.clone());
        live
    }

    fn remove(&self, conn: &Connection) {
        self.live.writing().retain(|r| r.conn.stable_id() != conn.stable_id());
    }

    fn all(&self) -> Vec<Arc<LiveRouter>> {
        self.live.reading().clone()
    }
}

#[async_trait]
impl Remote for Routers {
    /// Sends a BLS request to a router, which runs it on a node that serves the model. A router the
    /// request never reached is skipped for the next one; any other failure is the call's answer.
    async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let routers = self.all();
        if routers.is_empty() {
            return Err(Error::unavailable(format!(
                "model '{}' is not served on this node and no cluster router is connected",
                request.model_name
            )));
        }
        // A call traced as its caller's child (`trace=request.trace()`) continues the caller's
        // trace on the router and the node that serves it.
        let trace = mesh::trace::parent().and_then(mesh::trace::otel::carrier);
        let chunks = request_frame(&request, false, trace.as_ref(), &self.limits)?;
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..routers.len() {
            let r = &routers[(first + i) % routers.len()];
            let name = format!("router {}", r.addr);
            let peer = Peer {
                conn: &r.conn,
                name: &name,
                out: r.out.as_deref(),
            };
            match call::unary(peer, chunks.clone(), &self.limits).await {
                Ok(response) => return Ok(response),
                Err(Failure::NotSent(why)) => last = why,
                Err(Failure::Answered(e) | Failure::Refused(e) | Failure::Overloaded(e)) => return Err(e),
                Err(Failure::Lost(why)) => return Err(Error::unavailable(why)),
            }
        }
        Err(Error::unavailable(format!("no router took the BLS call: {last}")))
    }
}

/// The node's membership in the cluster.
pub struct ClusterNode {
    ctx: Arc<Context>,
    sessions: Vec<JoinHandle<()>>,
    /// Reloads the certificate files and cuts links to routers whose certificate is revoked or expired.
    _tls: Option<mesh::cluster::reload::Watch>,
}

impl ClusterNode {
    /// Binds the node's QUIC endpoint and starts one session per router.
    pub fn start(
        settings: Settings,
        node: &Node,
        transport: Arc<quinn::TransportConfig>,
    ) -> std::result::Result<ClusterNode, String> {
        let (dispatch, table) = (node.dispatch.clone(), node.table());
        let placing = Arc::new(placing::Placing {
            cache: mesh::cluster::ship::Cache {
                root: settings.cache.clone(),
            },
            max_model_bytes: settings.memory,
            dispatch: dispatch.clone(),
            placed: node.placed(),
            roots: settings.roots.clone(),
            limits: settings.limits.clone(),
            fencing: Default::default(),
        });
        let mut settings = settings;
        settings.client.transport_config(transport);
        let endpoint = transport::endpoint(settings.bind, None)?;
        let serving = Arc::new(Serving {
            dispatch,
            table,
            limits: settings.limits.clone(),
            leaving: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        });
        let routers = Arc::new(Routers {
            limits: settings.limits.clone(),
            ..Default::default()
        });
        let ctx = Arc::new(Context {
            endpoint,
            serving,
            routers,
            phase: watch::channel(Phase::Serving).0,
            released: Notify::new(),
            placing,
            settings,
        });
        let sessions = ctx
            .settings
            .routers
            .iter()
            .map(|addr| tokio::spawn(join::run(addr.clone(), ctx.clone())))
            .collect();
        let routers = ctx.routers.clone();
        let tls = ctx.settings.client.watch(move || {
            let live = routers.all().into_iter();
            live.map(|r| (format!("router {}", r.addr), r.conn.clone())).collect()
        })?;
        tracing::info!(
            node = %ctx.settings.name,
            routers = ?ctx.settings.routers,
            incarnation = format!("{:016x}", ctx.settings.incarnation),
            memory = ctx.settings.memory,
            cache = %ctx.settings.cache.display(),
            "joining the cluster"
        );
        Ok(ClusterNode {
            ctx,
            sessions,
            _tls: tls,
        })
    }

    /// Where BLS calls for models this node does not serve go.
    pub fn remote(&self) -> Arc<Routers> {
        self.ctx.routers.clone()
    }

    /// Tells every router to send nothing new, and waits until each joined router released this
    /// node (nothing of its in flight here) or `timeout` passes. The node keeps serving meanwhile.
    pub async fn drain(&self, timeout: Duration) {
        self.ctx.phase.send_replace(Phase::Draining);
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.ctx.released.notified();
            let routers = self.ctx.routers.all();
            if routers.iter().all(|r| r.released.load(Ordering::Acquire)) {
                tracing::info!(routers = routers.len(), "drained: every router released this node");
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("routers did not release this node within the exit timeout; leaving anyway");
                return;
            }
            // Also look again now and then: a router may go away instead of releasing.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), notified).await;
        }
    }

    /// Finishes the router requests still running, says goodbye and closes every link.
    pub async fn leave(self, timeout: Duration) {
        self.ctx.serving.leaving.store(true, Ordering::Release);
        let deadline = Instant::now() + timeout;
        while self.ctx.serving.active.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.ctx.phase.send_replace(Phase::Leaving);
        for s in self.sessions {
            let _ = tokio::time::timeout(Duration::from_secs(1), s).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.ctx.endpoint.wait_idle()).await;
        tracing::info!("left the cluster");
    }
}

#[cfg(test)]
mod name_tests {
    use super::node_name;

    #[test]
    fn a_nodes_name_is_its_certificates() {
        assert_eq!(node_name(None, Some("node-a".into())), Ok(Some("node-a".into())));
        assert_eq!(
            node_name(Some("node-a"), Some("node-a".into())),
            Ok(Some("node-a".into()))
        );
        let err = node_name(Some("node-b"), Some("node-a".into())).expect_err("another name is refused");
        assert!(
            err.contains("'node-b' is not the name in this node's certificate ('node-a')"),
            "{err}"
        );
        assert_eq!(node_name(Some("dev"), None), Ok(Some("dev".into())));
        assert_eq!(node_name(None, None), Ok(None));
    }
}
