//! mesh-node: serves Triton model repositories over KServe v2 HTTP/gRPC on ONNX Runtime.

use std::net::SocketAddr;
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

fn init_logging(args: &Args) {
    let level = match (args.log_verbose, args.log_info, args.log_warning) {
        (v, _, _) if v >= 2 => "trace",
        (1, _, _) => "debug",
        (_, true, _) => "info",
        (_, false, true) => "warn",
        _ => "error",
    };
    let filter = format!("warn,mesh={level},mesh_node={level}");
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("MESH_LOG").unwrap_or_else(|_| filter.into()))
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    };
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

async fn run(args: Args) -> Result<(), String> {
    repository::check_repositories(&args.model_repository)?;
    let prometheus = metrics::install()?;
    let env = ort_env::init(args.backend_setting("onnxruntime", "library"))?;
    let discovery = placement::discover_gpus();
    tracing::info!("{}", discovery.note);
    let gpus: Vec<i32> = placement::restrict(&discovery.gpus, args.gpus.as_deref())?
        .iter()
        .map(|g| g.index)
        .collect();
    let repos = Repositories {
        env: Arc::new(env),
        roots: args.model_repository.clone(),
        gpus,
        mode: args.model_control_mode,
        python: Arc::new(PythonContext {
            settings: PythonSettings::from_backend_config(&args.backend_settings("python"))?,
            dispatch: Default::default(),
            runtime: tokio::runtime::Handle::current(),
        }),
    };
    let options = NodeOptions {
        strict_readiness: args.strict_readiness,
        poll_secs: args.repository_poll_secs,
        max_inflight_bytes: args.max_inflight_bytes,
    };
    let cluster = ClusterSettings::from_args(&args, &repos.gpus)?;
    let node = Node::start(repos, options).await?;
    let dispatch = node.dispatch.clone();
    let failed = node.load_at_start(&args.load_model).await;
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
    let mut servers = Vec::new();
    if args.allow_http {
        let addr = SocketAddr::new(args.http_address, args.http_port);
        let options = mesh::http::HttpOptions {
            max_input_size: args.http_max_input_size,
        };
        servers.push(mesh::serve::http(addr, dispatch.clone(), options, None, &stop_rx).await?);
    }
    if args.allow_grpc {
        let addr = SocketAddr::new(args.grpc_address, args.grpc_port);
        servers.push(mesh::serve::grpc(addr, dispatch.clone(), args.http_max_input_size, &stop_rx).await?);
    }
    if args.allow_metrics {
        let addr = SocketAddr::new(args.metrics_address.unwrap_or(args.http_address), args.metrics_port);
        let render: mesh::serve::RenderMetrics = Arc::new(move || prometheus.render());
        servers.push(mesh::serve::metrics(addr, render, &stop_rx).await?);
        metrics::spawn_cpu_sampler();
    }

    wait_for_signal().await?;
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
    let drained = tokio::time::timeout(exit_timeout, futures_join(servers)).await;
    if drained.is_err() {
        tracing::warn!("in-flight requests did not finish within --exit-timeout-secs; exiting anyway");
    }
    if let Some(cluster) = cluster {
        cluster.leave(Duration::from_secs(5)).await;
    }
    drop(dispatch);
    node.stop().await;
    tracing::info!("stopped");
    Ok(())
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

async fn wait_for_signal() -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}
