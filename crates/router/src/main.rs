//! mesh-router: serves KServe v2 HTTP/gRPC for the cluster and routes to mesh-nodes over QUIC.
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mesh::cluster::frame::Budget;
use mesh::cluster::{tls, transport, Limits};
use ractor::Actor;
use tokio::sync::watch;

use mesh_router::cli::Args;
use mesh_router::cluster::{Cluster, RouteSettings};
use mesh_router::dispatch::RouterDispatch;
use mesh_router::ensembles::Ensembles;
use mesh_router::membership::MembershipSettings;
use mesh_router::route::{BalanceSettings, Balancer};
use mesh_router::supervisor::{RouterSupervisor, SupervisorArgs, SupervisorMsg};
use mesh_router::{api, link, metrics};

fn init_logging(args: &Args) {
    let level = match args.log_verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = format!("warn,mesh={level},mesh_router={level}");
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

/// The cluster port's TLS: mutual TLS against the cluster CA, or the loudly logged development mode.
fn server_crypto(args: &Args) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, String> {
    match tls::TlsFiles::from_flags(
        args.cluster_ca.clone(),
        args.cluster_cert.clone(),
        args.cluster_key.clone(),
    )? {
        Some(files) => tls::server_crypto(&files),
        None if args.cluster_insecure_dev => {
            tracing::warn!(
                "!!! --cluster-insecure-dev: the cluster port runs WITHOUT certificates; anyone who can \
                 reach it can join as a node and see every request. Development only. !!!"
            );
            tls::insecure_server_crypto()
        }
        None => Err(
            "refusing to open the cluster port without certificates: give --cluster-ca, \
                     --cluster-cert and --cluster-key (make them with `mesh-ops certs init DIR` and \
                     `mesh-ops certs issue DIR NAME`), or --cluster-insecure-dev for development"
                .into(),
        ),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "router".into())
}

async fn run(args: Args) -> Result<(), String> {
    let prometheus = metrics::install()?;
    let ensembles = Ensembles::load(&args.model_repository)?;
    let tuning = transport::Tuning {
        keep_alive: Duration::from_millis(args.cluster_keepalive_ms),
        idle_timeout: Duration::from_millis(args.cluster_idle_timeout_ms),
    };
    let mut server = quinn::ServerConfig::with_crypto(server_crypto(&args)?);
    server.transport_config(transport::transport_config(&tuning)?);
    let cluster_addr = SocketAddr::new(args.cluster_address, args.cluster_port);
    let endpoint =
        transport::endpoint(cluster_addr, Some(server)).map_err(|e| format!("cannot listen for nodes: {e}"))?;
    tracing::info!(addr = %cluster_addr, ?tuning, "cluster port open (QUIC)");

    let limits = Limits {
        max_payload: args.cluster_max_frame_bytes,
        budget: Arc::new(Budget::new(args.max_inflight_bytes)),
        ..Limits::default()
    };
    let route = RouteSettings {
        request_timeout: args.request_timeout(),
        max_attempts: args.max_attempts.max(1),
        route_wait: Duration::from_millis(args.route_wait_ms),
    };
    let balancer = Balancer::new(BalanceSettings {
        quarantine: Duration::from_millis(args.quarantine_ms),
        ..BalanceSettings::default()
    });
    let id = format!("{}:{}", hostname(), args.cluster_port);
    let cluster = Arc::new(Cluster::new(
        id,
        MembershipSettings::default(),
        balancer,
        limits.clone(),
        route,
    ));
    let dispatch = Arc::new(RouterDispatch::new(cluster.clone(), ensembles));
    let (supervisor, supervisor_task) = Actor::spawn(
        None,
        RouterSupervisor,
        SupervisorArgs {
            cluster: cluster.clone(),
            dispatch: dispatch.clone(),
        },
    )
    .await
    .map_err(|e| format!("cannot start the router supervisor: {e}"))?;

    let accept = {
        let (endpoint, supervisor, limits) = (endpoint.clone(), supervisor.clone(), limits.clone());
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let (supervisor, limits) = (supervisor.clone(), limits.clone());
                tokio::spawn(async move {
                    let peer = incoming.remote_address();
                    match incoming.await {
                        Ok(conn) => {
                            if let Some(joining) = link::handshake(conn, &limits).await {
                                let _ = supervisor.cast(SupervisorMsg::Joined(joining));
                            }
                        }
                        Err(e) => tracing::warn!(%peer, "refused a cluster connection: {e}"),
                    }
                });
            }
        })
    };
    let sampler = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let nodes = cluster.membership().nodes(std::time::Instant::now());
                let mut states = [("up", 0), ("draining", 0), ("silent", 0), ("lost", 0), ("left", 0)];
                for n in &nodes {
                    if let Some(s) = states.iter_mut().find(|(s, _)| *s == n.state.as_str()) {
                        s.1 += 1;
                    }
                }
                let links: Vec<_> = cluster
                    .links()
                    .iter()
                    .map(|l| (l.name.clone(), l.conn.rtt(), l.inflight()))
                    .collect();
                metrics::cluster(&states, &links);
            }
        })
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    if args.allow_http {
        let addr = SocketAddr::new(args.http_address, args.http_port);
        let options = mesh::http::HttpOptions {
            max_input_size: args.http_max_input_size,
        };
        let extra = api::routes(dispatch.clone());
        servers.push(mesh::serve::http(addr, dispatch.clone(), options, Some(extra), &stop_rx).await?);
    }
    if args.allow_grpc {
        let addr = SocketAddr::new(args.grpc_address, args.grpc_port);
        servers.push(mesh::serve::grpc(addr, dispatch.clone(), args.http_max_input_size, &stop_rx).await?);
    }
    if args.allow_metrics {
        let addr = SocketAddr::new(args.metrics_address.unwrap_or(args.http_address), args.metrics_port);
        let render: mesh::serve::RenderMetrics = Arc::new(move || prometheus.render());
        servers.push(mesh::serve::metrics(addr, render, &stop_rx).await?);
    }

    wait_for_signal().await?;
    tracing::info!(
        timeout_secs = args.exit_timeout_secs,
        "shutting down: no new requests, finishing in-flight ones"
    );
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(Duration::from_secs(args.exit_timeout_secs), async {
        for s in servers {
            let _ = s.await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("in-flight requests did not finish within --exit-timeout-secs; exiting anyway");
    }
    accept.abort();
    sampler.abort();
    endpoint.close(
        quinn::VarInt::from_u32(transport::close::NORMAL),
        b"router shutting down",
    );
    supervisor.stop(None);
    let _ = tokio::time::timeout(Duration::from_secs(2), supervisor_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    tracing::info!("stopped");
    Ok(())
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
