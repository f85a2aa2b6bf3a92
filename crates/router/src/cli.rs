//! Command-line flags of mesh-router; the client-facing ones are named like tritonserver's.
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "mesh-router",
    version,
    about = "The mesh's cluster entrypoint: serves KServe v2 HTTP and gRPC and routes to mesh-nodes over QUIC"
)]
pub struct Args {
    /// Model repository with the cluster's ensembles (repeatable); their steps run wherever their
    /// models are served. Other models in it are ignored for now (nodes serve their own).
    #[arg(long = "model-repository", alias = "model-store")]
    pub model_repository: Vec<PathBuf>,

    #[arg(long, default_value_t = 8000)]
    pub http_port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    pub http_address: IpAddr,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_http: bool,
    #[arg(long, default_value_t = 8001)]
    pub grpc_port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    pub grpc_address: IpAddr,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_grpc: bool,
    #[arg(long, default_value_t = 8002)]
    pub metrics_port: u16,
    #[arg(long)]
    pub metrics_address: Option<IpAddr>,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_metrics: bool,
    /// Largest accepted HTTP body (and gRPC message), in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub http_max_input_size: usize,

    /// Address the cluster port (UDP, QUIC) listens on for nodes.
    #[arg(long, default_value = "0.0.0.0")]
    pub cluster_address: IpAddr,
    #[arg(long, default_value_t = 8003)]
    pub cluster_port: u16,
    /// The cluster CA's certificate (PEM); nodes must present a certificate it signed.
    #[arg(long)]
    pub cluster_ca: Option<PathBuf>,
    /// This router's certificate (PEM), signed by the cluster CA.
    #[arg(long)]
    pub cluster_cert: Option<PathBuf>,
    /// This router's private key (PEM).
    #[arg(long)]
    pub cluster_key: Option<PathBuf>,
    /// DEVELOPMENT ONLY: run the cluster port without certificates (anyone who can reach it can join).
    #[arg(long, default_value_t = false)]
    pub cluster_insecure_dev: bool,
    /// Keep-alive interval on node links, in milliseconds.
    #[arg(long, default_value_t = 150)]
    pub cluster_keepalive_ms: u64,
    /// A node link that hears nothing for this long is dead, in milliseconds.
    #[arg(long, default_value_t = 750)]
    pub cluster_idle_timeout_ms: u64,
    /// Largest tensor payload of one frame on the cluster link, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub cluster_max_frame_bytes: u64,
    /// Tensor bytes the router holds from the cluster link at once (answers and BLS requests being
    /// received or forwarded); past it a frame is refused as overloaded, so memory stays bounded.
    #[arg(long, default_value_t = 2 << 30)]
    pub max_inflight_bytes: u64,

    /// Deadline of a request that carries no `timeout` parameter, in milliseconds; retries and
    /// waits for a replica stay within it.
    #[arg(long, default_value_t = 60_000)]
    pub request_timeout_ms: u64,
    /// Most nodes one request is tried on.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// How long a request may wait for a ready replica of its model (within its deadline), in ms.
    #[arg(long, default_value_t = 5_000)]
    pub route_wait_ms: u64,
    /// How long a node that failed at the transport level gets no new requests, in ms.
    #[arg(long, default_value_t = 3_000)]
    pub quarantine_ms: u64,

    /// Seconds to let in-flight requests finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub exit_timeout_secs: u64,
    /// 0 logs info and above; 1 adds debug; 2 and more add trace.
    #[arg(long, default_value_t = 0)]
    pub log_verbose: u8,
}

impl Args {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}
