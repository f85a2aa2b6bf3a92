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

    #[command(flatten)]
    pub listen: mesh::serve::ListenArgs,

    /// Address the cluster port (UDP, QUIC) listens on for nodes.
    #[arg(long, default_value = "0.0.0.0")]
    pub cluster_address: IpAddr,
    #[arg(long, default_value_t = 8003)]
    pub cluster_port: u16,
    #[command(flatten)]
    pub link: mesh::cluster::flags::LinkArgs,
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
