//! Command-line flags, named like tritonserver's so start scripts only change the binary name.
use std::path::PathBuf;

use clap::Parser;

/// Model control modes, as tritonserver names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlMode {
    None,
    Explicit,
    Poll,
}

#[derive(Debug, Parser)]
#[command(
    name = "mesh-node",
    version,
    about = "Serves Triton model repositories over KServe v2 HTTP and gRPC"
)]
pub struct Args {
    /// Model repository directory; give it more than once to serve several.
    #[arg(long = "model-repository", alias = "model-store", required = true)]
    pub model_repository: Vec<PathBuf>,

    #[command(flatten)]
    pub listen: mesh::serve::ListenArgs,

    /// GPUs this node may use (e.g. `--gpus 0,1`); default: every visible GPU.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<i32>>,

    /// Bytes of request tensors the node holds at once (queued or running); past it, requests are
    /// refused at once with UNAVAILABLE, so memory stays bounded under overload. A mesh extension.
    #[arg(long, default_value_t = 2 << 30)]
    pub max_inflight_bytes: usize,

    /// none: load everything at start; explicit and poll arrive with the repository extension.
    #[arg(long, value_enum, default_value = "none")]
    pub model_control_mode: ControlMode,
    /// Models to load at start in explicit mode (repeatable; `*` for all).
    #[arg(long)]
    pub load_model: Vec<String>,
    #[arg(long, default_value_t = 15)]
    pub repository_poll_secs: u64,

    /// Ready only when every model loaded (true), or as soon as the server runs (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub strict_readiness: bool,
    /// Whether a model that fails to load stops the server from starting. Default false (unlike
    /// tritonserver): the failure is reported in the log and the repository index, and the rest serve.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub exit_on_error: bool,
    /// Seconds to let in-flight requests finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub exit_timeout_secs: u64,

    /// 0 logs info and above; 1 adds debug; 2 and more add trace.
    #[arg(long, default_value_t = 0)]
    pub log_verbose: u8,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub log_info: bool,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub log_warning: bool,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub log_error: bool,

    /// `<backend>,<setting>=<value>`; `onnxruntime,library=PATH` names the ONNX Runtime library.
    #[arg(long)]
    pub backend_config: Vec<String>,

    /// Joins the cluster of the mesh-router at HOST:PORT (its cluster port, 8003 by default); give it
    /// once per router. Without it the node serves alone, as before.
    #[arg(long = "cluster-join", value_name = "HOST:PORT")]
    pub cluster_join: Vec<String>,
    /// This node's name in the cluster, unique among its nodes (default: HOSTNAME:HTTP_PORT).
    #[arg(long)]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub link: mesh::cluster::flags::LinkArgs,
    /// Local UDP address of the node's end of the cluster links.
    #[arg(long, default_value = "0.0.0.0:0")]
    pub cluster_bind: std::net::SocketAddr,
    /// How often the node reports model changes and load to its routers, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub cluster_report_ms: u64,
}

impl Args {
    /// Every `--backend-config <backend>,<key>=<value>` for one backend, in order.
    pub fn backend_settings(&self, backend: &str) -> Vec<(String, String)> {
        self.backend_config
            .iter()
            .filter_map(|s| {
                let (b, kv) = s.split_once(',')?;
                let (k, v) = kv.split_once('=')?;
                (b == backend).then(|| (k.to_string(), v.to_string()))
            })
            .collect()
    }

    /// The value of `--backend-config <backend>,<key>=<value>`, if given.
    pub fn backend_setting(&self, backend: &str, key: &str) -> Option<String> {
        self.backend_config.iter().find_map(|s| {
            let (b, kv) = s.split_once(',')?;
            let (k, v) = kv.split_once('=')?;
            (b == backend && k == key).then(|| v.to_string())
        })
    }
}
