//! Accepting HTTP connections for the KServe v2 port: optional TLS (rustls), a cap on open
//! connections, and time limits on a request's headers and body, so that clients that connect and
//! send nothing, or send slowly (slowloris), cannot hold the server's sockets and tasks. Each request
//! carries its peer's address (`ConnectInfo`). On shutdown, idle connections close at once and
//! in-flight requests finish.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Limits of the HTTP listener (`--http-max-connections`, `--http-header-timeout-secs`,
/// `--http-body-timeout-secs`).
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// Open connections at most; past it the listener stops accepting until one closes.
    pub max_connections: usize,
    /// A request's head (and a TLS handshake) must arrive within this. hyper starts the clock when
    /// a connection waits for its next request, so it is also how long a keep-alive connection
    /// may sit idle: long enough for pooled clients, short enough to reclaim slow ones.
    pub header_timeout: Duration,
    /// A request's body must arrive within this, counted from its head.
    pub body_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
        }
    }
}

/// A request body that fails once its deadline passes, so a handler reading it answers (408-like
/// 400) instead of waiting forever for a client that stopped sending.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

/// The error a late body ends with.
#[derive(Debug)]
pub struct BodyTimeout(Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} s (--http-body-timeout-secs)",
            self.0.as_secs()
        )
    }
}

impl std::error::Error for BodyTimeout {}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(self.limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` until `stop` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnLimits,
    stop: impl Future<Output = ()> + Send,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut stop => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset while queued: go on after a pause.
                    tracing::warn!("HTTP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = tcp.set_nodelay(true);
        let (app, builder, watcher, acceptor) = (app.clone(), builder.clone(), graceful.watcher(), acceptor.clone());
        let body_timeout = limits.body_timeout;
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                let request = request.map(|inner| {
                    let deadline = Box::pin(tokio::time::sleep(body_timeout));
                    axum::body::Body::new(
                        TimedBody {
                            inner,
                            deadline,
                            limit: body_timeout,
                        }
                        .boxed_unsync(),
                    )
                });
                let mut app = app.clone();
                async move { tower::Service::call(&mut app, request).await }
            });
            match acceptor {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                    let _ = watcher.watch(conn.into_owned()).await;
                }
                Some(acceptor) => match tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                        let _ = watcher.watch(conn.into_owned()).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake did not finish in time"),
                },
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A rustls server configuration from PEM files: the certificate chain, its key, and, for mutual
/// TLS, the CA whose certificates clients must present. Errors name the file and what is wrong.
pub fn server_tls(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |p: &std::path::Path, what: &str| {
        std::fs::read(p).map_err(|e| format!("cannot read the {what} {}: {e}", p.display()))
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert, "certificate")?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in it", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key, "private key")?)
        .map_err(|e| format!("{}: not a PEM private key: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&read(ca, "client CA certificate")?) {
                let c = c.map_err(|e| format!("{}: not a PEM certificate: {e}", ca.display()))?;
                roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no certificate in it", ca.display()));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and its key: {e}", cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Client-facing TLS and connection limits (flattened into `ListenArgs`). The gRPC flags are
/// tritonserver's; HTTPS is a mesh extension (tritonserver serves HTTP only in clear).
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// Serve gRPC over TLS with --grpc-server-cert and --grpc-server-key (tritonserver's flag).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub grpc_use_ssl: bool,
    /// Serve gRPC over mutual TLS: clients must present a certificate signed by --grpc-root-cert.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub grpc_use_ssl_mutual: bool,
    /// PEM certificate chain of the gRPC server.
    #[arg(long, value_name = "PATH")]
    pub grpc_server_cert: Option<std::path::PathBuf>,
    /// PEM private key of the gRPC server.
    #[arg(long, value_name = "PATH")]
    pub grpc_server_key: Option<std::path::PathBuf>,
    /// PEM CA certificate that client certificates must chain to (mutual TLS).
    #[arg(long, value_name = "PATH")]
    pub grpc_root_cert: Option<std::path::PathBuf>,
    /// Serve HTTP as HTTPS with this PEM certificate chain (with --http-tls-key).
    #[arg(long, value_name = "PATH")]
    pub http_tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for --http-tls-cert.
    #[arg(long, value_name = "PATH")]
    pub http_tls_key: Option<std::path::PathBuf>,
    /// HTTPS clients must present a certificate signed by this PEM CA (mutual TLS).
    #[arg(long, value_name = "PATH")]
    pub http_tls_client_ca: Option<std::path::PathBuf>,
    /// Open HTTP connections at most; past it new ones wait in the listen backlog.
    #[arg(long, default_value_t = 4096)]
    pub http_max_connections: usize,
    /// Seconds a client has to send a request's headers (and finish a TLS handshake); also how
    /// long an idle keep-alive connection is kept.
    #[arg(long, default_value_t = 60)]
    pub http_header_timeout_secs: u64,
    /// Seconds a client has to send a request's body once its headers arrived.
    #[arg(long, default_value_t = 60)]
    pub http_body_timeout_secs: u64,
}

impl TlsArgs {
    /// The HTTP listener's TLS configuration (None: plain HTTP) and limits.
    pub fn http(&self) -> Result<(Option<Arc<rustls::ServerConfig>>, ConnLimits), String> {
        let limits = ConnLimits {
            max_connections: self.http_max_connections.max(1),
            header_timeout: Duration::from_secs(self.http_header_timeout_secs.max(1)),
            body_timeout: Duration::from_secs(self.http_body_timeout_secs.max(1)),
        };
        let tls = match (&self.http_tls_cert, &self.http_tls_key) {
            (Some(cert), Some(key)) => Some(server_tls(cert, key, self.http_tls_client_ca.as_deref())?),
            (None, None) if self.http_tls_client_ca.is_none() => None,
            _ => {
                return Err(
                    "HTTPS needs both --http-tls-cert and --http-tls-key (and --http-tls-client-ca only with them)"
                        .into(),
                )
            }
        };
        Ok((tls, limits))
    }

    /// The gRPC listener's TLS configuration, None when --grpc-use-ssl is off.
    pub fn grpc(&self) -> Result<Option<tonic::transport::ServerTlsConfig>, String> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        if !self.grpc_use_ssl && !self.grpc_use_ssl_mutual {
            if self.grpc_server_cert.is_some() || self.grpc_server_key.is_some() || self.grpc_root_cert.is_some() {
                tracing::warn!("--grpc-server-cert/--grpc-server-key/--grpc-root-cert given without --grpc-use-ssl: gRPC is served in clear");
            }
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&self.grpc_server_cert, &self.grpc_server_key) else {
            return Err("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key".into());
        };
        let client_ca = match (self.grpc_use_ssl_mutual, &self.grpc_root_cert) {
            (false, _) => None,
            (true, Some(ca)) => Some(ca.as_path()),
            (true, None) => {
                return Err("--grpc-use-ssl-mutual needs --grpc-root-cert (the CA of client certificates)".into())
            }
        };
        // The same checks as HTTPS, once, so a bad file is named at start rather than at the first client.
        server_tls(cert, key, client_ca)?;
        let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        let mut tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(read(cert)?, read(key)?))
            .timeout(Duration::from_secs(self.http_header_timeout_secs.max(1)));
        if let Some(ca) = client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(Some(tls))
    }
}

/// tritonserver's gRPC connection flags (flattened into `ListenArgs`); durations in milliseconds.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GrpcConnArgs {
    /// Pings an idle client connection this often (default: never).
    #[arg(long, value_name = "MS")]
    pub grpc_keepalive_time: Option<u64>,
    /// Closes a connection whose ping is not answered within this long.
    #[arg(long, value_name = "MS")]
    pub grpc_keepalive_timeout: Option<u64>,
    /// Closes connections older than this, after --grpc-max-connection-age-grace for their calls.
    #[arg(long, value_name = "MS")]
    pub grpc_max_connection_age: Option<u64>,
    #[arg(long, value_name = "MS")]
    pub grpc_max_connection_age_grace: Option<u64>,
    /// `none`, `low`, `medium` or `high`: anything but `none` gzips the answers of clients that
    /// accept gzip (at one level; the levels are not told apart).
    #[arg(long, value_parser = ["none", "low", "medium", "high"])]
    pub grpc_infer_response_compression_level: Option<String>,
    /// Lets several servers listen on the gRPC port (SO_REUSEPORT), as tritonserver's flag.
    #[arg(long, value_parser = clap::builder::BoolishValueParser::new())]
    pub reuse_grpc_port: Option<bool>,
    // gRPC core's client-ping policy; the mesh's HTTP/2 server answers every ping, so these are
    // accepted and logged as having no effect.
    #[arg(long, value_parser = clap::builder::BoolishValueParser::new())]
    pub grpc_keepalive_permit_without_calls: Option<bool>,
    #[arg(long)]
    pub grpc_http2_max_pings_without_data: Option<u64>,
    #[arg(long)]
    pub grpc_http2_min_recv_ping_interval_without_data: Option<u64>,
    #[arg(long)]
    pub grpc_http2_max_ping_strikes: Option<u64>,
}

impl GrpcConnArgs {
    /// Applies keep-alive and connection age to the gRPC server.
    pub fn apply(&self, mut builder: tonic::transport::Server) -> tonic::transport::Server {
        let ms = Duration::from_millis;
        if let Some(t) = self.grpc_keepalive_time {
            builder = builder.http2_keepalive_interval(Some(ms(t.max(1))));
        }
        if let Some(t) = self.grpc_keepalive_timeout {
            builder = builder.http2_keepalive_timeout(Some(ms(t.max(1))));
        }
        if let Some(t) = self.grpc_max_connection_age {
            builder = builder.max_connection_age(ms(t.max(1)));
        }
        if let Some(t) = self.grpc_max_connection_age_grace {
            builder = builder.max_connection_age_grace(ms(t));
        }
        builder
    }

    /// Whether answers are gzipped for clients that accept it.
    pub fn compress(&self) -> bool {
        self.grpc_infer_response_compression_level
            .as_deref()
            .is_some_and(|l| l != "none")
    }

    /// The given ping-policy flags, which have no effect.
    pub fn ignored(&self) -> Vec<crate::compat::Ignored> {
        const NO_PING_POLICY: &str = "the mesh's HTTP/2 server answers every client ping and has no ping-strike policy";
        [
            (
                self.grpc_keepalive_permit_without_calls.is_some(),
                "--grpc-keepalive-permit-without-calls",
            ),
            (
                self.grpc_http2_max_pings_without_data.is_some(),
                "--grpc-http2-max-pings-without-data",
            ),
            (
                self.grpc_http2_min_recv_ping_interval_without_data.is_some(),
                "--grpc-http2-min-recv-ping-interval-without-data",
            ),
            (
                self.grpc_http2_max_ping_strikes.is_some(),
                "--grpc-http2-max-ping-strikes",
            ),
        ]
        .into_iter()
        .filter(|(given, _)| *given)
        .map(|(_, flag)| crate::compat::Ignored {
            flag,
            reason: NO_PING_POLICY,
        })
        .collect()
    }
}
