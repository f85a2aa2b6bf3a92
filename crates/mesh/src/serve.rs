//! Binds the KServe v2 HTTP, gRPC and metrics endpoints over any `Dispatch` (node and router alike)
//! and drains them gracefully on shutdown.
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dispatch::Dispatch;
use crate::grpc::GrpcFrontend;
use crate::http::HttpOptions;
use crate::listen::ConnLimits;
use crate::restrict::{GrpcGuard, Restrictions};
use crate::shm::SharedMemory;

/// Resolves when shutdown has been requested.
pub fn shutdown_signal(rx: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Binds a listener; `reuse_port` (tritonserver's `--reuse-http-port` / `--reuse-grpc-port`) lets
/// several servers share the port, the kernel spreading connections among them.
fn bind(what: &str, addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, String> {
    let failed = |e: std::io::Error| format!("cannot listen for {what} on {addr}: {e}");
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(failed)?;
    // SO_REUSEADDR as TcpListener::bind sets it (a restart binds while old connections linger).
    socket.set_reuseaddr(true).map_err(failed)?;
    socket.set_reuseport(reuse_port).map_err(failed)?;
    socket.bind(addr).map_err(failed)?;
    socket.listen(1024).map_err(failed)
}

/// How the HTTP port accepts connections: TLS or not, and its limits.
#[derive(Clone, Default)]
pub struct HttpListen {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub limits: ConnLimits,
    pub reuse_port: bool,
}

/// Serves KServe v2 HTTP (plus `extra` routes, such as a router's own API) until shutdown; idle
/// keep-alive connections close at once, in-flight requests finish.
#[allow(clippy::too_many_arguments)]
pub async fn http<D: Dispatch>(
    addr: SocketAddr,
    dispatch: Arc<D>,
    options: HttpOptions,
    extra: Option<axum::Router>,
    rules: Arc<Restrictions>,
    shm: Arc<SharedMemory>,
    listen: HttpListen,
    stop: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, String> {
    let listener = bind("HTTP", addr, listen.reuse_port)?;
    let scheme = if listen.tls.is_some() { "HTTPS" } else { "HTTP" };
    tracing::info!(%addr, "{scheme} service started");
    let mut app = crate::http::router(dispatch, options, shm);
    if let Some(extra) = extra {
        app = extra.merge(app);
    }
    if !rules.is_empty() {
        app = app.layer(axum::middleware::from_fn_with_state(rules, crate::restrict::http_guard));
    }
    let signal = shutdown_signal(stop);
    Ok(tokio::spawn(crate::listen::serve(
        listener,
        app,
        listen.tls,
        listen.limits,
        signal,
    )))
}

/// Serves Triton's SageMaker endpoints (`crate::http::sagemaker`) over plain HTTP until shutdown,
/// behind the HTTP port's restricted APIs.
pub async fn sagemaker<D: Dispatch>(
    addr: SocketAddr,
    dispatch: Arc<D>,
    options: crate::http::sagemaker::SageMakerOptions,
    (rules, shm, limits): (Arc<Restrictions>, Arc<SharedMemory>, ConnLimits),
    stop: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, String> {
    let listener = bind("SageMaker", addr, false)?;
    tracing::info!(%addr, "Started Sagemaker HTTPService");
    let app = crate::http::sagemaker::router(dispatch, options, rules, shm);
    let signal = shutdown_signal(stop);
    Ok(tokio::spawn(crate::listen::serve(listener, app, None, limits, signal)))
}

/// What the gRPC listener serves with: the largest message, the restricted protocols, the shared
/// memory registry, the header-forward pattern, TLS, and keep-alive, age and compression.
pub type GrpcParts = (
    usize,
    Arc<Restrictions>,
    Arc<SharedMemory>,
    Option<regex::Regex>,
    Option<tonic::transport::ServerTlsConfig>,
    crate::listen::GrpcConnArgs,
);

/// Concurrent HTTP/2 streams one gRPC connection may open.
pub const GRPC_MAX_STREAMS: u32 = 1024;

/// Serves KServe v2 gRPC until shutdown.
pub async fn grpc<D: Dispatch>(
    addr: SocketAddr,
    dispatch: Arc<D>,
    (max_message, rules, shm, forward, tls, conn): GrpcParts,
    stop: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, String> {
    let listener = bind("gRPC", addr, conn.reuse_grpc_port == Some(true))?;
    // Streams per connection at most (h2 refuses more), so one client cannot open unbounded ones.
    let mut builder = conn.apply(tonic::transport::Server::builder().max_concurrent_streams(Some(GRPC_MAX_STREAMS)));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(|e| format!("gRPC TLS: {e}"))?;
        tracing::info!(%addr, "gRPC service started (TLS)");
    } else {
        tracing::info!(%addr, "gRPC service started");
    }
    // The builder's tcp_nodelay only applies to listeners tonic binds itself; without it, Nagle
    // holds back a response written while an earlier one is unacknowledged (40 ms stalls).
    let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |tcp| {
        tcp.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    let service = GrpcGuard {
        inner: GrpcFrontend::server(dispatch, max_message, shm, forward, conn.compress()),
        rules,
    };
    let signal = shutdown_signal(stop);
    Ok(tokio::spawn(async move {
        let server = builder.add_service(service);
        if let Err(e) = server.serve_with_incoming_shutdown(incoming, signal).await {
            tracing::error!("gRPC server failed: {e}");
        }
    }))
}

/// What renders the Prometheus text of `/metrics`.
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves Prometheus text at `/metrics` until shutdown.
pub async fn metrics(
    addr: SocketAddr,
    render: RenderMetrics,
    stop: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, String> {
    let listener = bind("metrics", addr, false)?;
    tracing::info!(%addr, "metrics service started");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(),
                )
            }
        }),
    );
    let signal = shutdown_signal(stop);
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(signal).await {
            tracing::error!("metrics server failed: {e}");
        }
    }))
}

/// The client-facing listeners' flags, named like tritonserver's; flattened into each binary's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenArgs {
    #[arg(long, default_value_t = 8000)]
    pub http_port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    pub http_address: std::net::IpAddr,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_http: bool,
    /// Lets several servers listen on the HTTP port (SO_REUSEPORT), as tritonserver's flag.
    #[arg(long, value_parser = clap::builder::BoolishValueParser::new())]
    pub reuse_http_port: Option<bool>,
    #[arg(long, default_value_t = 8001)]
    pub grpc_port: u16,
    #[arg(long, default_value = "0.0.0.0")]
    pub grpc_address: std::net::IpAddr,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_grpc: bool,
    #[arg(long, default_value_t = 8002)]
    pub metrics_port: u16,
    #[arg(long)]
    pub metrics_address: Option<std::net::IpAddr>,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_metrics: bool,
    /// Largest accepted HTTP body (and gRPC message), in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub http_max_input_size: usize,
    /// Busy polling: for this many microseconds after each request starts or ends, the async
    /// workers poll their sockets instead of sleeping, trading CPU for the latency of a wake-up
    /// (0, the default: off; `crates/mesh/src/busy.rs`). For a host with cores to spare.
    #[arg(long, default_value_t = 0, value_name = "MICROSECONDS",
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub busy_poll_us: u64,
    /// Puts HTTP API groups behind a header, as tritonserver's flag: `<api>[,<api>...]:<key>=<value>`
    /// (repeatable; groups: health, metadata, inference, shared-memory, model-config,
    /// model-repository, statistics, trace, logging, and on a router cluster: its /mesh/v1 API).
    /// MESH_HTTP_RESTRICTED_API holds one, keeping the key off the command line.
    #[arg(
        long,
        value_name = "APIS:KEY=VALUE",
        env = "MESH_HTTP_RESTRICTED_API",
        hide_env_values = true
    )]
    pub http_restricted_api: Vec<String>,
    /// The same for gRPC methods (the header is gRPC metadata); or MESH_GRPC_RESTRICTED_PROTOCOL.
    #[arg(
        long,
        value_name = "PROTOCOLS:KEY=VALUE",
        env = "MESH_GRPC_RESTRICTED_PROTOCOL",
        hide_env_values = true
    )]
    pub grpc_restricted_protocol: Vec<String>,
    /// HTTP headers whose name matches this regular expression reach the model as request
    /// parameters (string values), as tritonserver's flag.
    #[arg(long, value_name = "REGEX")]
    pub http_header_forward_pattern: Option<String>,
    /// The same for gRPC metadata.
    #[arg(long, value_name = "REGEX")]
    pub grpc_header_forward_pattern: Option<String>,
    /// Request tracing, as tritonserver's flag (repeatable): `level=OFF|TIMESTAMPS`, `rate=N`,
    /// `count=N`, `mode=triton|opentelemetry`; trace files: `[triton,]file=PATH`, `log-frequency=N`;
    /// OpenTelemetry: `opentelemetry,url=URL` (default http://localhost:4318/v1/traces),
    /// `opentelemetry,resource=KEY=VALUE` (repeatable), `opentelemetry,bsp_max_queue_size=N`,
    /// `bsp_schedule_delay=MS`, `bsp_max_export_batch_size=N`.
    #[arg(long, value_name = "[MODE,]KEY=VALUE")]
    pub trace_config: Vec<String>,
    /// Legacy tracing flags: the same settings as `--trace-config file=`, `level=` (repeatable),
    /// `rate=`, `count=` and `log-frequency=`, which win when both are given.
    #[arg(long, value_name = "PATH")]
    pub trace_file: Option<String>,
    #[arg(long, value_name = "OFF|TIMESTAMPS|TENSORS")]
    pub trace_level: Vec<String>,
    #[arg(long)]
    pub trace_rate: Option<u64>,
    #[arg(long)]
    pub trace_count: Option<i64>,
    #[arg(long)]
    pub trace_log_frequency: Option<u64>,
    /// Serves Triton's SageMaker endpoints (GET /ping, POST /invocations, /models) on
    /// --sagemaker-port (all addresses), as tritonserver's flag.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_sagemaker: bool,
    #[arg(long, default_value_t = 8080)]
    pub sagemaker_port: u16,
    /// `<low>-<high>`: the ports the other services (HTTP, gRPC, metrics) on the SageMaker
    /// address must use, as tritonserver checks them at start-up.
    #[arg(long, value_name = "LOW-HIGH")]
    pub sagemaker_safe_port_range: Option<String>,
    /// Accepted without effect: the async runtime's workers serve SageMaker as they serve HTTP.
    #[arg(long)]
    pub sagemaker_thread_count: Option<u32>,
    #[command(flatten)]
    pub tls: crate::listen::TlsArgs,
    #[command(flatten)]
    pub grpc_conn: crate::listen::GrpcConnArgs,
}

/// A header-forward pattern, compiled to match case-insensitively as Triton's does (`MY_HEADER.*`
/// matches `my_header_1`); `(?-i)` in the pattern makes it case-sensitive. Names arrive in lower case.
fn forward_pattern(flag: &str, pattern: &Option<String>) -> Result<Option<regex::Regex>, String> {
    pattern
        .as_deref()
        .map(|p| {
            regex::RegexBuilder::new(p)
                .case_insensitive(true)
                .build()
                .map_err(|e| format!("--{flag} '{p}' is not a valid regular expression: {e}"))
        })
        .transpose()
}

impl ListenArgs {
    /// `--trace-config` entries, the legacy `--trace-*` flags first so that `--trace-config` wins.
    pub fn trace_flags(&self) -> Vec<String> {
        let mut flags: Vec<String> = self.trace_file.iter().map(|f| format!("file={f}")).collect();
        flags.extend(self.trace_level.iter().map(|l| format!("level={l}")));
        flags.extend(self.trace_rate.map(|n| format!("rate={n}")));
        flags.extend(self.trace_count.map(|n| format!("count={n}")));
        flags.extend(self.trace_log_frequency.map(|n| format!("log-frequency={n}")));
        flags.extend(self.trace_config.iter().cloned());
        flags
    }

    /// The HTTP port's restricted groups (`--http-restricted-api`).
    pub fn http_rules(&self) -> Result<Restrictions, String> {
        Restrictions::parse(&self.http_restricted_api, "api")
    }

    /// The HTTP endpoint, or None when disabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.allow_http
            .then(|| SocketAddr::new(self.http_address, self.http_port))
    }

    /// The SageMaker endpoint (tritonserver's is on every address), or None when disabled; checks
    /// the ports as tritonserver does first.
    pub fn sagemaker_addr(&self) -> Result<Option<SocketAddr>, String> {
        if !self.allow_sagemaker {
            return Ok(None);
        }
        let any = std::net::IpAddr::from([0, 0, 0, 0]);
        let range = self
            .sagemaker_safe_port_range
            .as_deref()
            .map(crate::http::sagemaker::parse_port_range)
            .transpose()?;
        let metrics = self.metrics_address.unwrap_or(self.http_address);
        let mut services = Vec::new();
        services.extend(
            self.allow_http
                .then_some(("HTTP", self.http_address, self.http_port, None)),
        );
        services.extend(
            self.allow_grpc
                .then_some(("GRPC", self.grpc_address, self.grpc_port, None)),
        );
        services.extend(
            self.allow_metrics
                .then_some(("metrics", metrics, self.metrics_port, None)),
        );
        services.push(("SageMaker", any, self.sagemaker_port, range));
        crate::http::sagemaker::check_ports(&services)?;
        Ok(Some(SocketAddr::new(any, self.sagemaker_port)))
    }

    /// The gRPC endpoint, or None when disabled.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.allow_grpc
            .then(|| SocketAddr::new(self.grpc_address, self.grpc_port))
    }

    /// Starts every listener the flags allow: KServe v2 HTTP (plus `extra` routes) and gRPC over
    /// `dispatch`, and `/metrics` rendered by `render`; each drains when `stop` turns true.
    pub async fn start<D: Dispatch>(
        &self,
        dispatch: Arc<D>,
        extra: Option<axum::Router>,
        render: RenderMetrics,
        stop: &watch::Receiver<bool>,
    ) -> Result<Vec<JoinHandle<()>>, String> {
        crate::compat::log_ignored(&self.grpc_conn.ignored());
        if self.sagemaker_thread_count.is_some() {
            crate::compat::log_ignored(&[crate::compat::Ignored {
                flag: "--sagemaker-thread-count",
                reason: "SageMaker is served by the async runtime's workers, not a thread pool of its own",
            }]);
        }
        let sagemaker_addr = self.sagemaker_addr()?;
        crate::trace::start(&self.trace_flags())?;
        let http_rules = Arc::new(self.http_rules()?);
        let grpc_rules = Arc::new(Restrictions::parse_grpc(&self.grpc_restricted_protocol)?);
        let mut servers = Vec::new();
        // One registry: a region registered over HTTP serves gRPC requests too.
        let shm = Arc::new(SharedMemory::default());
        if let Some(addr) = sagemaker_addr {
            let options = crate::http::sagemaker::SageMakerOptions::from_env(self.http_max_input_size);
            let (_, limits) = self.tls.http()?;
            let parts = (http_rules.clone(), shm.clone(), limits);
            servers.push(sagemaker(addr, dispatch.clone(), options, parts, stop).await?);
        }
        if let Some(addr) = self.http_addr() {
            let options = HttpOptions {
                max_input_size: self.http_max_input_size,
                forward_headers: forward_pattern("http-header-forward-pattern", &self.http_header_forward_pattern)?,
            };
            let (tls, limits) = self.tls.http()?;
            let listen = HttpListen {
                tls,
                limits,
                reuse_port: self.reuse_http_port == Some(true),
            };
            servers.push(
                http(
                    addr,
                    dispatch.clone(),
                    options,
                    extra,
                    http_rules,
                    shm.clone(),
                    listen,
                    stop,
                )
                .await?,
            );
        }
        if let Some(addr) = self.grpc_addr() {
            let forward = forward_pattern("grpc-header-forward-pattern", &self.grpc_header_forward_pattern)?;
            let tls = self.tls.grpc()?;
            let grpc_args = (
                self.http_max_input_size,
                grpc_rules,
                shm,
                forward,
                tls,
                self.grpc_conn.clone(),
            );
            servers.push(grpc(addr, dispatch, grpc_args, stop).await?);
        }
        if self.allow_metrics {
            let addr = SocketAddr::new(self.metrics_address.unwrap_or(self.http_address), self.metrics_port);
            servers.push(metrics(addr, render, stop).await?);
        }
        Ok(servers)
    }
}

#[cfg(test)]
mod tests {
    use super::forward_pattern;

    #[test]
    fn forward_patterns_match_names_case_insensitively_unless_told_not_to() {
        let flag = "http-header-forward-pattern";
        let upper = forward_pattern(flag, &Some("MY_HEADER.*".into())).unwrap().unwrap();
        assert!(upper.is_match("my_header_1") && upper.is_match("My_Header_3"));
        assert!(!upper.is_match("header_1"));
        let exact = forward_pattern(flag, &Some("(?-i)MY_HEADER.*".into()))
            .unwrap()
            .unwrap();
        assert!(!exact.is_match("my_header_1") && exact.is_match("MY_HEADER_1"));
        assert!(forward_pattern(flag, &None).unwrap().is_none());
        let e = forward_pattern(flag, &Some("(".into())).unwrap_err();
        assert!(
            e.starts_with("--http-header-forward-pattern '(' is not a valid regular expression"),
            "{e}"
        );
    }
}
