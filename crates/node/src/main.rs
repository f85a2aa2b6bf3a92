//! mesh-node: serves Triton model repositories over KServe v2 HTTP/gRPC on ONNX Runtime.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::sync::watch;

use mesh_node::actors::manager::loader::Repositories;
use mesh_node::backend::ort_env;
use mesh_node::backend::python::{PythonContext, PythonSettings};
use mesh_node::cli::Args;
use mesh_node::cluster::{ClusterNode, Settings as ClusterSettings};
use mesh_node::node::Node;
use mesh_node::serving::dispatch::NodeOptions;
use mesh_node::telemetry::metrics;
use mesh_node::{placement, repository};

fn main() -> ExitCode {
    let args = Args::parse();
    let level = match (args.log_verbose, args.log_info, args.log_warning) {
        (v, _, _) if v >= 2 => "trace",
        (1, _, _) => "debug",
        (_, true, _) => "info",
        (_, false, true) => "warn",
        _ => "error",
    };
    if let Err(e) = args.triton.start_logging(&["mesh", "mesh_node"], level, true) {
        eprintln!("mesh-node: {e}");
        return ExitCode::FAILURE;
    }
    mesh::process::run(run(args))
}

async fn run(args: Args) -> Result<(), String> {
    repository::check_repositories(&args.model_repository)?;
    let prometheus = metrics::install(metrics::MetricsConfig::parse(&args.triton.metrics_config)?)?;
    mesh::busy::start(
        Duration::from_micros(args.listen.busy_poll_us),
        mesh::process::worker_count(),
    );
    let env = ort_env::Ort::load(args.backend_setting("onnxruntime", "library"))?;
    let discovery = placement::discover_gpus();
    tracing::info!("{}", discovery.note);
    let used = placement::restrict(&discovery.gpus, args.gpus.as_deref())?;
    let gpus: Vec<i32> = used.iter().map(|g| g.index).collect();
    let gpu_uuids: Vec<String> = used.iter().map(|g| g.uuid.clone()).collect();
    let repos = Repositories {
        env,
        roots: args.model_repository.clone(),
        gpus,
        gpu_uuids: gpu_uuids.clone(),
        mode: args.control.model_control_mode,
        python: Arc::new(PythonContext {
            settings: PythonSettings::from_backend_config(&args.backend_settings("python"))?,
            dispatch: Default::default(),
            runtime: tokio::runtime::Handle::current(),
        }),
        placed: Default::default(),
        loading: mesh_node::actors::manager::loader::LoadSettings::from_flags(&args.triton)?,
        limiter: mesh_node::actors::instance::rate_limit::Limiter::from_flags(
            args.triton.rate_limit.as_deref(),
            &args.triton.rate_limit_resource,
        )?,
    };
    // Triton's rule and words: the old flag and the new one are one or the other.
    if args.triton.response_cache_byte_size.is_some() && !args.cache_config.is_empty() {
        return Err(
            "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. \
                    Please provide one or the other."
                .into(),
        );
    }
    let options = NodeOptions {
        strict_readiness: args.strict_readiness,
        poll_secs: args.control.repository_poll_secs,
        max_inflight_bytes: args.max_inflight_bytes,
        cache: mesh_node::serving::cache::CacheConfig::parse(
            &args
                .triton
                .cache_config()
                .into_iter()
                .chain(args.cache_config.iter().cloned())
                .collect::<Vec<_>>(),
        )?,
    };
    let cluster = ClusterSettings::from_args(&args, &repos.gpus)?;
    let node = Node::start(repos, options).await?;
    let dispatch = node.dispatch.clone();
    let failed = node.load_at_start(&args.control.load_model).await;
    if failed > 0 && args.exit_on_error {
        return Err(format!("{failed} model(s) failed to load and --exit-on-error is true"));
    }
    let cluster = match cluster {
        Some((settings, transport)) => {
            let joined = ClusterNode::start(settings, &node, transport)?;
            node.bls.set_remote(joined.remote());
            Some(joined)
        }
        None => None,
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let render: mesh::serve::RenderMetrics = Arc::new(move || {
        // Triton's metrics, then the custom ones Python models define.
        let mut text = prometheus.render();
        text.push_str(&mesh_node::telemetry::custom::CUSTOM.render());
        text
    });
    let servers = args.listen.start(dispatch.clone(), None, render, &stop_rx).await?;
    let interval = metrics::sample_interval(args.triton.metrics_interval_ms)?;
    if args.listen.allow_metrics && args.triton.allow_cpu_metrics != Some(false) {
        metrics::spawn_cpu_sampler(interval);
    }
    // A node without GPUs has said so already ("running CPU-only"): nothing to sample.
    if args.listen.allow_metrics && args.triton.allow_gpu_metrics != Some(false) && !gpu_uuids.is_empty() {
        mesh_node::telemetry::gpu::spawn_sampler(interval, gpu_uuids);
    }

    mesh::process::wait_for_signal().await?;
    tracing::info!(
        timeout_secs = args.exit_timeout_secs,
        "shutting down: no new requests, finishing in-flight ones"
    );
    let exit_timeout = Duration::from_secs(args.exit_timeout_secs);
    if let Some(cluster) = &cluster {
        // Routers stop sending new requests first and release the node once theirs are answered;
        // the node's own clients are served meanwhile.
        cluster.drain(exit_timeout).await;
    }
    let _ = stop_tx.send(true);
    mesh::process::drain(servers, exit_timeout).await;
    mesh::trace::flush(); // traces not written yet go to trace_file, as tritonserver writes them at exit
    if let Some(cluster) = cluster {
        cluster.leave(exit_timeout).await;
    }
    drop(dispatch);
    node.stop().await;
    tracing::info!("stopped");
    Ok(())
}
