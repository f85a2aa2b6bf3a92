//! mesh-router: serves KServe v2 HTTP/gRPC for the cluster and routes to mesh-nodes over QUIC.
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mesh::cluster::transport;
use ractor::Actor;
use tokio::sync::watch;

use mesh_router::actors::link::handshake;
use mesh_router::actors::{RouterSupervisor, SupervisorArgs};
use mesh_router::cli::Args;
use mesh_router::dispatch::RouterDispatch;
use mesh_router::ensembles::Ensembles;
use mesh_router::lead::{self, Lead};
use mesh_router::membership::MembershipSettings;
use mesh_router::messages::{bounded_mailbox, mailbox, SupervisorMsg};
use mesh_router::repository::ClusterRepo;
use mesh_router::route::{BalanceSettings, Balancer};
use mesh_router::shared::{Placement, RouteSettings, RoutingView};
use mesh_router::{api, metrics};

fn main() -> ExitCode {
    let args = Args::parse();
    let level = match args.log_verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    if let Err(e) = args.triton.start_logging(&["mesh", "mesh_router"], level, false) {
        eprintln!("mesh-router: {e}");
        return ExitCode::FAILURE;
    }
    mesh::process::run(run(args))
}

async fn run(args: Args) -> Result<(), String> {
    // Its spans say they are the router's (`--trace-config mode=opentelemetry`).
    mesh::trace::otel::identify(mesh::trace::otel::Identity {
        service: "mesh-router",
        scope: "mesh-router",
    });
    let prometheus = metrics::install()?;
    mesh::busy::start(
        Duration::from_micros(args.listen.busy_poll_us),
        mesh::process::worker_count(),
    );
    let ensembles = Ensembles::load(&args.model_repository)?;
    let mut server = quinn::ServerConfig::with_crypto(args.link.server_crypto()?);
    server.transport_config(args.link.transport()?);
    let cluster_addr = SocketAddr::new(args.cluster_address, args.cluster_port);
    let endpoint =
        transport::endpoint(cluster_addr, Some(server.clone())).map_err(|e| format!("cannot listen for nodes: {e}"))?;
    tracing::info!(
        addr = %cluster_addr,
        keepalive_ms = args.link.cluster_keepalive_ms,
        idle_timeout_ms = args.link.cluster_idle_timeout_ms,
        "cluster port open (QUIC)"
    );
    let limits = args.link.limits(args.max_inflight_bytes);
    let route = RouteSettings {
        request_timeout: args.request_timeout(),
        max_attempts: args.max_attempts.max(1),
        route_wait: Duration::from_millis(args.route_wait_ms),
    };
    let balancer = Balancer::new(BalanceSettings {
        quarantine: Duration::from_millis(args.quarantine_ms),
        ..BalanceSettings::default()
    });
    let host = mesh::process::hostname();
    let id = args.router_name.clone().unwrap_or_else(|| {
        let host = host.as_deref().unwrap_or("router");
        format!("{host}:{}", args.cluster_port)
    });
    let lead = if args.etcd_endpoints.is_empty() {
        Lead::single(id.clone())
    } else {
        let tls = lead::etcd::tls_options(
            args.etcd_ca.as_deref(),
            args.etcd_cert.as_deref(),
            args.etcd_key.as_deref(),
        )?;
        let user = match (&args.etcd_user, &args.etcd_password) {
            (Some(u), Some(p)) => Some((u.clone(), p.clone())),
            (None, None) => None,
            _ => return Err("--etcd-user and --etcd-password (or MESH_ETCD_PASSWORD) go together".into()),
        };
        if tls.is_some() && args.etcd_endpoints.iter().any(|e| !e.starts_with("https://")) {
            return Err("with --etcd-ca, every --etcd-endpoints entry must be https://".into());
        }
        lead::etcd::start(lead::etcd::EtcdSettings {
            tls,
            user,
            endpoints: args.etcd_endpoints.clone(),
            prefix: args.etcd_prefix.clone(),
            ttl: Duration::from_secs(args.etcd_lease_secs.max(1)),
            poll: Duration::from_millis(250),
            me: lead::LeaderInfo {
                name: id.clone(),
                http: args.advertise_http.clone().unwrap_or_else(|| {
                    let port = args.listen.http_port;
                    match args.listen.http_address {
                        a if a.is_unspecified() => format!("{}:{port}", host.as_deref().unwrap_or("localhost")),
                        a => std::net::SocketAddr::new(a, port).to_string(),
                    }
                }),
            },
        })
    };
    let view = Arc::new(RoutingView::new(
        id,
        MembershipSettings::default(),
        balancer,
        limits.clone(),
        route,
    ));
    // Renewed certificates and revocation lists take effect without a restart; revoked or expired nodes are cut.
    let _tls_watch = args.link.watch_server(&endpoint, &server, {
        let view = view.clone();
        move || {
            view.links
                .all()
                .iter()
                .map(|l| (l.name.clone(), l.conn.clone()))
                .collect()
        }
    })?;
    let repo = Arc::new(ClusterRepo::new(args.model_repository.clone()));
    let http_rules = Arc::new(args.listen.http_rules()?);
    // The mailboxes are made first, so each part is built with those it talks to.
    let (membership, membership_inbox) = mailbox("membership");
    // Operators' load, unload, scale and drain reach the placement actor: at most 16 wait at once.
    let (placement_mailbox, placement_inbox) = bounded_mailbox("placement", 16);
    let placement = Arc::new(Placement::new(
        repo,
        lead,
        args.control.model_control_mode,
        http_rules.clone(),
        placement_mailbox.clone(),
    ));
    let budget = mesh::budget::with_reserve(
        args.max_inflight_bytes,
        args.inflight_reserve_bytes,
        "--max-inflight-bytes",
    );
    let dispatch = Arc::new(RouterDispatch::new(view.clone(), ensembles, placement.clone(), budget));
    let (supervisor, supervisor_task) = Actor::spawn(
        None,
        RouterSupervisor,
        SupervisorArgs {
            view: view.clone(),
            placement,
            settings: args.placement(),
            bls: dispatch.clone(),
            membership,
            membership_inbox,
            placement_mailbox,
            placement_inbox,
        },
    )
    .await
    .map_err(|e| format!("cannot start the router supervisor: {e}"))?;

    let accept = {
        let (endpoint, supervisor) = (endpoint.clone(), supervisor.clone());
        // Hellos are read under limits of their own; handshakes in flight are bounded.
        let limits = handshake::hello_limits(&limits);
        let gates = Arc::new(handshake::Gates::default());
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let Some(screened) = handshake::screen(incoming, &gates) else {
                    continue;
                };
                let (supervisor, limits, gates) = (supervisor.clone(), limits.clone(), gates.clone());
                tokio::spawn(async move {
                    if let Some(joining) = handshake::join(screened, &gates, &limits).await {
                        let _ = supervisor.cast(SupervisorMsg::Joined(joining));
                    }
                });
            }
        })
    };
    let sampler = {
        let view = view.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let nodes = view.membership().nodes(std::time::Instant::now());
                let mut states = [("up", 0), ("draining", 0), ("silent", 0), ("lost", 0), ("left", 0)];
                for n in &nodes {
                    if let Some(s) = states.iter_mut().find(|(s, _)| *s == n.state.as_str()) {
                        s.1 += 1;
                    }
                }
                let links: Vec<_> = view
                    .links
                    .all()
                    .iter()
                    .map(|l| (l.name.clone(), l.conn.rtt(), l.inflight()))
                    .collect();
                metrics::cluster(&states, &links);
            }
        })
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let render: mesh::serve::RenderMetrics = Arc::new(move || prometheus.render());
    let api = api::routes(dispatch.clone(), http_rules.header("cluster").is_some());
    let servers = args.listen.start(dispatch.clone(), Some(api), render, &stop_rx).await?;

    mesh::process::wait_for_signal().await?;
    tracing::info!(
        timeout_secs = args.exit_timeout_secs,
        "shutting down: no new requests, finishing in-flight ones"
    );
    let _ = stop_tx.send(true);
    // Another router takes placement over now, while this one finishes its requests.
    dispatch.placement.lead.resign().await;
    mesh::process::drain(servers, Duration::from_secs(args.exit_timeout_secs)).await;
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
