//! Command-line flags of mesh-router; the client-facing ones are named like tritonserver's.
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::place::PlacementSettings;

#[derive(Debug, Parser)]
#[command(
    name = "mesh-router",
    // A flag given twice takes its last value, as tritonserver's command line does.
    args_override_self = true,
    // A flag that needs a value takes the next argument, even `-1`, as tritonserver's getopt does.
    mut_args = mesh::getopt::value_may_begin_with_dash,
    version,
    about = "The mesh's cluster entrypoint: serves KServe v2 HTTP and gRPC and routes to mesh-nodes over QUIC"
)]
pub struct Args {
    /// The cluster repository (repeatable, Triton's layout): the router places its models on the
    /// nodes, shipping their files over the cluster link, and runs its ensembles itself.
    #[arg(long = "model-repository", alias = "model-store")]
    pub model_repository: Vec<PathBuf>,
    #[command(flatten)]
    pub control: mesh::control::ControlArgs,
    /// Replicas of a model whose config sets no `mesh.min_replicas`.
    #[arg(long, default_value_t = 2)]
    pub default_min_replicas: u32,
    /// Replicas of a model whose config sets no `mesh.max_replicas`.
    #[arg(long, default_value_t = 4)]
    pub default_max_replicas: u32,
    /// Autoscaling target: requests in flight per replica (Ray Serve's target_ongoing_requests).
    #[arg(long, default_value_t = 2.0)]
    pub target_inflight: f64,
    /// How long load must stay above the target before a replica is added, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub scale_up_delay_ms: u64,
    /// How long load must stay below the target before a replica is removed, in ms.
    #[arg(long, default_value_t = 600_000)]
    pub scale_down_delay_ms: u64,
    /// A replica is not evicted or moved before it served this long, in ms (no thrashing).
    #[arg(long, default_value_t = 30_000)]
    pub min_replica_age_ms: u64,
    /// Moves (rebalancing, drains) in progress at once across the cluster.
    #[arg(long, default_value_t = 2)]
    pub max_moves: usize,
    /// A placement that is not ready within this counts as failed on that node, in ms.
    #[arg(long, default_value_t = 120_000)]
    pub load_timeout_ms: u64,
    /// After start, nothing is placed for this long, in ms: nodes rejoin and report what an
    /// earlier router placed, and those replicas are adopted instead of placed again.
    #[arg(long, default_value_t = 3_000)]
    pub placement_grace_ms: u64,

    /// etcd endpoints (`http://HOST:PORT`, comma-separated or repeated): several routers serve
    /// the same cluster, and one of them, elected through etcd, decides placement. Without it this
    /// router is the only one and decides alone.
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// The CA that etcd's server certificate chains to (TLS to etcd; the endpoints are https://).
    #[arg(long, value_name = "PATH")]
    pub etcd_ca: Option<std::path::PathBuf>,
    /// This router's client certificate for etcd (with --etcd-key), when etcd asks for one.
    #[arg(long, value_name = "PATH")]
    pub etcd_cert: Option<std::path::PathBuf>,
    #[arg(long, value_name = "PATH")]
    pub etcd_key: Option<std::path::PathBuf>,
    /// etcd user (etcd's authentication), with --etcd-password or MESH_ETCD_PASSWORD.
    #[arg(long)]
    pub etcd_user: Option<String>,
    /// The etcd user's password; MESH_ETCD_PASSWORD keeps it off the command line.
    #[arg(long, env = "MESH_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// Key prefix in etcd; routers of one cluster share it, other clusters use another.
    #[arg(long, default_value = "/mesh")]
    pub etcd_prefix: String,
    /// The placement leader's lease in etcd, in seconds: a leader that dies or is cut off is
    /// replaced within about this long (etcd raises values below its minimum, 2 s by default).
    #[arg(long, default_value_t = 3)]
    pub etcd_lease_secs: u64,
    /// This router's name for other routers and operators (default: HOSTNAME:CLUSTER_PORT).
    #[arg(long)]
    pub router_name: Option<String>,
    /// Where other routers reach this one's HTTP API (HOST:PORT) to hand it placement changes
    /// while it leads (default: --http-address and --http-port, or HOSTNAME and the port when it
    /// listens on every address).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_http: Option<String>,

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
    /// received or forwarded), and as many of clients' requests it holds to forward (each charged
    /// 20 KiB more, as on a node); past it a frame is refused, or a request answered UNAVAILABLE,
    /// so memory stays bounded. Clients' requests share it fairly between models and clients.
    #[arg(long, default_value_t = 2 << 30)]
    pub max_inflight_bytes: u64,
    /// Of --max-inflight-bytes for clients' requests, the bytes kept for models and clients under
    /// their fair share (default: an eighth; 0: first come, first served), as on a node.
    #[arg(long)]
    pub inflight_reserve_bytes: Option<u64>,

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
    #[command(flatten)]
    pub triton: mesh::compat::TritonFlags,
}

impl Args {
    /// Placement's settings from the flags.
    pub fn placement(&self) -> PlacementSettings {
        let ms = Duration::from_millis;
        PlacementSettings {
            place: crate::place::PlaceSettings {
                default_min: self.default_min_replicas,
                default_max: self.default_max_replicas.max(self.default_min_replicas),
                min_age: ms(self.min_replica_age_ms),
                max_moves: self.max_moves.max(1),
                load_timeout: ms(self.load_timeout_ms),
                ..Default::default()
            },
            scale: crate::place::ScaleSettings {
                target_inflight: self.target_inflight,
                up_delay: ms(self.scale_up_delay_ms),
                down_delay: ms(self.scale_down_delay_ms),
            },
            mode: self.control.model_control_mode,
            load_at_start: self.control.load_model.clone(),
            poll_every: Duration::from_secs(self.control.repository_poll_secs.max(1)),
            tick: ms(200),
            startup_grace: ms(self.placement_grace_ms),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_with_a_value_takes_the_next_argument_even_with_a_leading_dash() {
        let report = mesh::getopt::check_dash_values::<Args>(&["--http-port", "8000"]);
        assert!(report.failures.is_empty(), "{:#?}", report.failures);
        for flag in [
            "--trace-count",
            "--id",
            "--model-repository",
            "--model-store",
            "--etcd-endpoints",
        ] {
            assert!(report.required.iter().any(|f| f == flag), "{flag}");
        }
        let a = Args::try_parse_from(["mesh-router", "--trace-count", "-1", "--router-name", "-r"]).unwrap();
        assert_eq!(a.listen.trace_count, Some(-1));
        assert_eq!(a.router_name.as_deref(), Some("-r"));
        let e = Args::try_parse_from(["mesh-router", "--trace-count"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a value is required for '--trace-count <TRACE_COUNT>'"),
            "{e}"
        );
    }
}
