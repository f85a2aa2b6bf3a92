//! tritonserver 2.51's flags that the mesh's own flags do not already cover, so start scripts run
//! unchanged: the ones with an effect are read by the parts they concern; every other one given is
//! logged once at start-up with the reason it changes nothing.
use std::path::PathBuf;

use clap::builder::BoolishValueParser;

/// Accepted for compatibility with tritonserver's command line (flattened into each binary's flags).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TritonFlags {
    /// Server name in the server metadata (`GET /v2`, gRPC ServerMetadata); default "triton", as
    /// tritonserver's.
    #[arg(long)]
    pub id: Option<String>,
    /// Writes the log to this file (appended; created private, never through a symbolic link)
    /// instead of standard output.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// `default` or `ISO8601`, as the logging extension reports it.
    #[arg(long, value_parser = ["default", "ISO8601"])]
    pub log_format: Option<String>,
    /// Legacy form of `--cache-config local,size=N`.
    #[arg(long, value_name = "BYTES")]
    pub response_cache_byte_size: Option<u64>,

    // Accepted; logged as having no effect (see `ignored`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub disable_auto_complete_config: Option<bool>,
    #[arg(long, value_parser = BoolishValueParser::new())]
    pub strict_model_config: Option<bool>,
    #[arg(long)]
    pub model_config_name: Option<String>,
    #[arg(long)]
    pub model_load_thread_count: Option<u32>,
    #[arg(long)]
    pub model_load_retry_count: Option<u32>,
    #[arg(long, value_parser = BoolishValueParser::new())]
    pub model_namespacing: Option<bool>,
    #[arg(long, value_parser = BoolishValueParser::new())]
    pub enable_peer_access: Option<bool>,
    #[arg(long)]
    pub http_thread_count: Option<u32>,
    #[arg(long)]
    pub grpc_infer_allocation_pool_size: Option<u32>,
    #[arg(long, value_parser = BoolishValueParser::new())]
    pub allow_vertex_ai: Option<bool>,
    #[arg(long)]
    pub vertex_ai_port: Option<u16>,
    #[arg(long)]
    pub vertex_ai_thread_count: Option<u32>,
    #[arg(long)]
    pub vertex_ai_default_model: Option<String>,
    #[arg(long, value_parser = BoolishValueParser::new())]
    pub allow_gpu_metrics: Option<bool>,
    #[arg(long, value_parser = BoolishValueParser::new())]
    pub allow_cpu_metrics: Option<bool>,
    #[arg(long)]
    pub metrics_interval_ms: Option<f64>,
    #[arg(long)]
    pub metrics_config: Vec<String>,
    #[arg(long)]
    pub backend_directory: Option<String>,
    #[arg(long)]
    pub repoagent_directory: Option<String>,
    #[arg(long)]
    pub cache_directory: Option<String>,
    /// `off` (the default) or `execution_count`: instances run only while the resources their
    /// `instance_group { rate_limiter }` names are free, taking turns by priority.
    #[arg(long, value_parser = ["off", "execution_count"])]
    pub rate_limit: Option<String>,
    /// `<name>:<count>[:<device>]`: copies of a rate-limiter resource (per device without a
    /// device; a resource not named then has none). Default: what the hungriest instance needs.
    #[arg(long, value_name = "NAME:COUNT[:DEVICE]")]
    pub rate_limit_resource: Vec<String>,
    #[arg(long)]
    pub pinned_memory_pool_byte_size: Option<u64>,
    #[arg(long)]
    pub cuda_memory_pool_byte_size: Vec<String>,
    #[arg(long)]
    pub cuda_virtual_address_size: Vec<String>,
    #[arg(long)]
    pub min_supported_compute_capability: Option<f64>,
    #[arg(long)]
    pub buffer_manager_thread_count: Option<u32>,
    #[arg(long)]
    pub host_policy: Vec<String>,
    #[arg(long)]
    pub model_load_gpu_limit: Vec<String>,
}

/// Why a given flag changes nothing here.
pub struct Ignored {
    pub flag: &'static str,
    pub reason: &'static str,
}

/// Logs each given flag that has no effect, once, with its reason.
pub fn log_ignored(ignored: &[Ignored]) {
    for i in ignored {
        tracing::info!("tritonserver flag {} accepted without effect: {}", i.flag, i.reason);
    }
}

const NO_CUDA_POOLS: &str =
    "the mesh allocates no pinned or CUDA memory pools: tensors live in ordinary memory and each backend manages its device memory";
const ROUTER_RUNS_NO_MODELS: &str = "mesh-router runs no models: each node applies its own flag";

impl TritonFlags {
    /// The flags given on the command line that have no effect, each with its reason; `runs_models`
    /// is false for mesh-router, where the flags about executing models change nothing.
    pub fn ignored(&self, runs_models: bool) -> Vec<Ignored> {
        let mut out = Vec::new();
        let mut note = |given: bool, flag: &'static str, reason: &'static str| {
            if given {
                out.push(Ignored { flag, reason });
            }
        };
        if !runs_models {
            for (given, flag) in [
                (
                    self.disable_auto_complete_config.is_some(),
                    "--disable-auto-complete-config",
                ),
                (self.strict_model_config.is_some(), "--strict-model-config"),
                (self.model_config_name.is_some(), "--model-config-name"),
                (self.model_load_retry_count.is_some(), "--model-load-retry-count"),
                (self.model_load_thread_count.is_some(), "--model-load-thread-count"),
                (self.allow_cpu_metrics.is_some(), "--allow-cpu-metrics"),
                (self.allow_gpu_metrics.is_some(), "--allow-gpu-metrics"),
                (self.metrics_interval_ms.is_some(), "--metrics-interval-ms"),
                (!self.metrics_config.is_empty(), "--metrics-config"),
            ] {
                note(given, flag, ROUTER_RUNS_NO_MODELS);
            }
        }
        note(
            self.model_namespacing.is_some() && !runs_models,
            "--model-namespacing",
            "the router places models by name; a name in more than one of its repositories is refused",
        );
        note(
            self.enable_peer_access.is_some(),
            "--enable-peer-access",
            "the mesh does not copy tensors between GPUs",
        );
        note(
            self.http_thread_count.is_some(),
            "--http-thread-count",
            "HTTP is served by the async runtime's workers (TOKIO_WORKER_THREADS sets them), not a thread pool of its own",
        );
        note(
            self.grpc_infer_allocation_pool_size.is_some(),
            "--grpc-infer-allocation-pool-size",
            "the mesh keeps no pool of gRPC request objects",
        );
        const VERTEX: &str = "the mesh has no Vertex AI endpoint";
        note(self.allow_vertex_ai.is_some(), "--allow-vertex-ai", VERTEX);
        note(self.vertex_ai_port.is_some(), "--vertex-ai-port", VERTEX);
        note(
            self.vertex_ai_thread_count.is_some(),
            "--vertex-ai-thread-count",
            VERTEX,
        );
        note(
            self.vertex_ai_default_model.is_some(),
            "--vertex-ai-default-model",
            VERTEX,
        );
        note(
            self.backend_directory.is_some(),
            "--backend-directory",
            "the mesh's backends are built in (ONNX Runtime is found with --backend-config onnxruntime,library=PATH)",
        );
        note(
            self.repoagent_directory.is_some(),
            "--repoagent-directory",
            "the mesh has no repository agents",
        );
        note(
            self.cache_directory.is_some(),
            "--cache-directory",
            "the response cache is built in (--cache-config local,size=N)",
        );
        if !runs_models {
            note(self.rate_limit.is_some(), "--rate-limit", ROUTER_RUNS_NO_MODELS);
            note(
                !self.rate_limit_resource.is_empty(),
                "--rate-limit-resource",
                ROUTER_RUNS_NO_MODELS,
            );
        }
        note(
            self.pinned_memory_pool_byte_size.is_some(),
            "--pinned-memory-pool-byte-size",
            NO_CUDA_POOLS,
        );
        note(
            !self.cuda_memory_pool_byte_size.is_empty(),
            "--cuda-memory-pool-byte-size",
            NO_CUDA_POOLS,
        );
        note(
            !self.cuda_virtual_address_size.is_empty(),
            "--cuda-virtual-address-size",
            NO_CUDA_POOLS,
        );
        note(
            self.min_supported_compute_capability.is_some(),
            "--min-supported-compute-capability",
            "each backend checks the GPUs it can use when it loads a model",
        );
        note(
            self.buffer_manager_thread_count.is_some(),
            "--buffer-manager-thread-count",
            "the mesh has no buffer-manager threads",
        );
        note(
            !self.host_policy.is_empty(),
            "--host-policy",
            "the mesh places instances with --gpus and instance_group",
        );
        if !runs_models {
            note(
                !self.model_load_gpu_limit.is_empty(),
                "--model-load-gpu-limit",
                ROUTER_RUNS_NO_MODELS,
            );
        }
        out
    }

    /// Starts logging as `--log-file` and `--log-format` say, sets `--id`, then logs the given
    /// flags that have no effect (`runs_models`: see `ignored`).
    pub fn start_logging(&self, crates: &[&str], level: &str, runs_models: bool) -> Result<(), String> {
        crate::process::init_logging(crates, level, self.log_file.as_deref())?;
        if let Some(format) = &self.log_format {
            crate::logging::set_format(format).map_err(|e| e.message)?;
        }
        if let Some(id) = &self.id {
            crate::set_server_name(id);
        }
        log_ignored(&self.ignored(runs_models));
        Ok(())
    }

    /// `--response-cache-byte-size N` as the `--cache-config` entry it stands for.
    pub fn cache_config(&self) -> Option<String> {
        self.response_cache_byte_size.map(|n| format!("local,size={n}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        triton: TritonFlags,
    }

    fn parse(args: &[&str]) -> TritonFlags {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .triton
    }

    #[test]
    fn given_flags_without_effect_are_named_once_with_a_reason() {
        assert!(parse(&[]).ignored(true).is_empty());
        let f = parse(&[
            "--backend-directory=/opt/tritonserver/backends",
            "--disable-auto-complete-config",
            "--vertex-ai-port",
            "8080",
            "--allow-vertex-ai",
            "0",
            "--rate-limit",
            "off",
        ]);
        let flags: Vec<&str> = f.ignored(true).iter().map(|i| i.flag).collect();
        assert_eq!(flags, ["--allow-vertex-ai", "--vertex-ai-port", "--backend-directory"]);
        assert_eq!(f.disable_auto_complete_config, Some(true));
        assert!(f.ignored(true).iter().all(|i| !i.reason.is_empty()));
        // A router runs no models, so the rate limiter's and loading flags change nothing there.
        let router: Vec<&str> = f.ignored(false).iter().map(|i| i.flag).collect();
        assert!(router.contains(&"--rate-limit"), "{router:?}");
        assert!(router.contains(&"--disable-auto-complete-config"), "{router:?}");
        assert!(Cli::try_parse_from(["x", "--rate-limit", "sometimes"]).is_err());
    }

    #[test]
    fn legacy_cache_size_and_bad_values() {
        assert_eq!(
            parse(&["--response-cache-byte-size", "1024"]).cache_config().as_deref(),
            Some("local,size=1024")
        );
        let bad = Cli::try_parse_from(["x", "--log-format", "xml"]).err().unwrap();
        assert!(bad.to_string().contains("xml"), "{bad}");
        assert!(Cli::try_parse_from(["x", "--strict-model-config", "maybe"]).is_err());
        assert_eq!(
            parse(&["--strict-model-config", "false"]).strict_model_config,
            Some(false)
        );
    }
}
