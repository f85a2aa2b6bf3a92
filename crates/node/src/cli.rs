//! Command-line flags, named like tritonserver's so start scripts only change the binary name.
use std::path::PathBuf;

use clap::Parser;

pub use mesh::control::ControlMode;

#[derive(Debug, Parser)]
#[command(
    name = "mesh-node",
    // A flag given twice takes its last value, as tritonserver's command line does.
    args_override_self = true,
    // A flag that needs a value takes the next argument, even `-1`, as tritonserver's getopt does.
    mut_args = mesh::getopt::value_may_begin_with_dash,
    version,
    about = "Serves Triton model repositories over KServe v2 HTTP and gRPC"
)]
pub struct Args {
    /// Model repository directory; give it more than once to serve several. A node that joins a
    /// cluster (`--cluster-join`) may have none: it serves what the router places on it.
    #[arg(
        long = "model-repository",
        alias = "model-store",
        required_unless_present = "cluster_join"
    )]
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
    /// Of --max-inflight-bytes, the bytes kept for models and client connections under their fair
    /// share: past the rest, a model or client that holds more than its share is refused while the
    /// others are still admitted (default: an eighth; 0: first come, first served). A mesh extension.
    #[arg(long)]
    pub inflight_reserve_bytes: Option<usize>,

    /// The response cache, as tritonserver's flag: `local,size=<bytes>` (the last one given wins).
    /// Models with `response_cache { enable: true }` answer repeated requests from it.
    #[arg(long, value_name = "CACHE,SETTING=VALUE")]
    pub cache_config: Vec<String>,

    #[command(flatten)]
    pub control: mesh::control::ControlArgs,

    /// Ready only when every model loaded (true), or as soon as the server runs (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub strict_readiness: bool,
    /// Whether a model that fails to load stops the server from starting. Default false (unlike
    /// tritonserver): the failure is reported in the log and the repository index, and the rest serve.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub exit_on_error: bool,
    /// Seconds a stop (SIGINT/SIGTERM, the C API's, a drain's end) gives in-flight requests and then
    /// the models' finalize() before it kills what still runs; also what an unloaded model's
    /// finalize() may take
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
    /// Memory this node offers for the models a router places on it (bytes, or with a K/M/G/T
    /// suffix, powers of 1024); default: the machine's total memory.
    #[arg(long, value_parser = parse_size)]
    pub cluster_memory: Option<u64>,
    #[command(flatten)]
    pub triton: mesh::compat::TritonFlags,
    /// Where the files of placed models are cached, one verified copy per content key (default:
    /// the system's temporary folder, mesh-node-cache).
    #[arg(long)]
    pub cluster_cache: Option<PathBuf>,
}

/// Reads a byte count such as `1048576`, `512M`, `2G` or `1.5GiB` (suffixes are powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => {
            return Err(format!(
                "'{text}' is not a size (a number with an optional K, M, G or T suffix)"
            ))
        }
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (a number with an optional K, M, G or T suffix)"))?;
    let bytes = n * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is out of range"));
    }
    Ok(bytes as u64)
}

/// The machine's total memory from /proc/meminfo, if it can be read.
pub fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The log level `mesh-node` starts with, from tritonserver's log flags.
pub fn log_level(verbose: u8, info: bool, warning: bool) -> &'static str {
    match (verbose, info, warning) {
        (v, _, _) if v >= 2 => "trace",
        (1, _, _) => "debug",
        (_, true, _) => "info",
        (_, false, true) => "warn",
        _ => "error",
    }
}

impl Args {
    /// Starts the process's logging from tritonserver's log flags: the level, file and format, and
    /// the logging extension's `log_info`/`log_warning`/`log_error` switches.
    pub fn start_logging(&self) -> Result<(), String> {
        use mesh::logging::SettingValue::Bool;
        let level = log_level(self.log_verbose, self.log_info, self.log_warning);
        // The switches first: the lines logged while logging starts (flags accepted without
        // effect) already obey them.
        let switches = [
            ("log_info".to_string(), Bool(self.log_info)),
            ("log_warning".to_string(), Bool(self.log_warning)),
            ("log_error".to_string(), Bool(self.log_error)),
        ];
        mesh::logging::update(&switches).map_err(|e| e.message)?;
        self.triton
            .start_logging(&["mesh", "mesh_node", "tritonserver"], level, true)
    }

    /// Parses `mesh-node`'s flags without the program name (for a node started in process).
    pub fn parse_flags<I, S>(flags: I) -> Result<Args, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let argv = std::iter::once(std::ffi::OsString::from("mesh-node")).chain(flags.into_iter().map(Into::into));
        Args::try_parse_from(argv).map_err(|e| e.to_string().trim_end().to_string())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_flags_take_the_last_value_and_lists_keep_every_one() {
        let a = Args::try_parse_from([
            "mesh-node",
            "--model-repository=/a",
            "--model-repository",
            "/b",
            "--http-port",
            "1",
            "--http-port",
            "2",
            "--backend-config",
            "python,a=1",
            "--backend-config",
            "python,b=2",
            "--id",
            "first",
            "--id",
            "triton",
        ])
        .unwrap();
        assert_eq!(a.model_repository, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(a.listen.http_port, 2);
        assert_eq!(a.backend_settings("python").len(), 2);
        assert_eq!(a.triton.id.as_deref(), Some("triton"));
    }

    #[test]
    fn every_flag_with_a_value_takes_the_next_argument_even_with_a_leading_dash() {
        let report = mesh::getopt::check_dash_values::<Args>(&["--model-repository", "/m"]);
        assert!(report.failures.is_empty(), "{:#?}", report.failures);
        // Every flag of tritonserver 2.51's --help that takes a value is among those walked, and
        // none that takes no value needs one.
        let fixture = include_str!("../../../tests/fixtures/tritonserver-2.51-flags.txt");
        let triton: Vec<(&str, bool)> = fixture
            .lines()
            .filter(|l| l.starts_with("--"))
            .map(|l| (l.split_whitespace().next().unwrap(), l.contains(' ')))
            .collect();
        assert_eq!(triton.len(), 86);
        for (flag, takes_value) in triton {
            let required = report.required.iter().any(|f| f == flag);
            let optional = report.optional.iter().any(|f| f == flag);
            assert!(if takes_value { required || optional } else { !required }, "{flag}");
        }
        // Only these take their value optionally (tritonserver: none, and a required boolean for
        // the two gRPC ones), so a dash-leading argument after them is the next flag.
        let mut optional = report.optional.clone();
        optional.sort();
        assert_eq!(
            optional,
            [
                "--disable-auto-complete-config",
                "--grpc-use-ssl",
                "--grpc-use-ssl-mutual"
            ]
        );
    }

    #[test]
    fn a_start_scripts_dash_leading_values_are_taken() {
        let a = Args::parse_flags([
            "--model-repository",
            "-models",
            "--trace-count",
            "-1",
            "--id",
            "-x",
            "--metrics-interval-ms",
            "-1",
            "--gpus",
            "-1",
            "--grpc-use-ssl",
            "--strict-readiness",
            "false",
        ])
        .unwrap();
        assert_eq!(a.model_repository, [PathBuf::from("-models")]);
        assert_eq!(a.listen.trace_count, Some(-1));
        assert_eq!(a.listen.trace_flags(), ["count=-1"]);
        assert_eq!(a.triton.id.as_deref(), Some("-x"));
        assert_eq!(a.triton.metrics_interval_ms, Some(-1.0));
        assert_eq!(a.gpus, Some(vec![-1]));
        assert!(a.listen.tls.grpc_use_ssl && !a.strict_readiness);
        // A value the flag's type refuses is refused as that flag's value.
        let e = Args::parse_flags(["--model-repository", "/m", "--exit-timeout-secs", "-1"]).unwrap_err();
        assert!(e.contains("invalid value '-1' for '--exit-timeout-secs"), "{e}");
        // A value really missing is still refused, naming the flag.
        let e = Args::parse_flags(["--model-repository", "/m", "--trace-count"]).unwrap_err();
        assert!(
            e.contains("a value is required for '--trace-count <TRACE_COUNT>'"),
            "{e}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("5Q").unwrap_err().contains("not a size"));
        assert!(parse_size("").is_err());
        assert!(total_memory().is_some_and(|m| m > 0));
    }
}
