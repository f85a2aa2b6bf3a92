//! The cluster link's flags, shared by mesh-router and mesh-node (flattened into each one's flags):
//! certificates and their revocation list (reloaded while running), the development mode, failure-detection timing
//! and frame limits.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicServerConfig;

use super::frame::{Budget, Limits};
use super::shm::Arenas;
use super::{reload, tls, transport};

#[derive(Debug, Clone, clap::Args)]
pub struct LinkArgs {
    /// The cluster CA's certificate (PEM); the other end must present a certificate it signed.
    #[arg(long)]
    pub cluster_ca: Option<PathBuf>,
    /// This process's certificate (PEM), signed by the cluster CA.
    #[arg(long)]
    pub cluster_cert: Option<PathBuf>,
    /// This process's private key (PEM).
    #[arg(long)]
    pub cluster_key: Option<PathBuf>,
    /// The cluster CA's certificate revocation list (PEM, written by `mesh-ops certs revoke DIR NAME`): peers
    /// whose certificate it lists are refused at the handshake, and their live links are cut. Default: `crl.pem`
    /// beside --cluster-ca when it is there (one written there later is picked up too). This file and the three
    /// above are re-read when their content changes (every second) and on SIGHUP: new connections use them.
    #[arg(long)]
    pub cluster_crl: Option<PathBuf>,
    /// DEVELOPMENT ONLY: the cluster link without certificates (nothing is authenticated).
    #[arg(long, default_value_t = false)]
    pub cluster_insecure_dev: bool,
    /// Keep-alive interval on cluster links, in milliseconds.
    #[arg(long, default_value_t = 150)]
    pub cluster_keepalive_ms: u64,
    /// A cluster link that hears nothing for this long is dead, in milliseconds.
    #[arg(long, default_value_t = 750)]
    pub cluster_idle_timeout_ms: u64,
    /// Largest tensor payload of one frame on the cluster link, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub cluster_max_frame_bytes: u64,
    /// Tensor payloads of 64 KiB and more go through shared memory when both ends of a link run on
    /// the same host (found out at the handshake); false: every payload travels over QUIC.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cluster_shared_memory: bool,
}

const NEED_CERTS: &str = "give --cluster-ca, --cluster-cert and --cluster-key (make them with `mesh-ops certs \
                          init DIR` and `mesh-ops certs issue DIR NAME --role router|node`), or --cluster-insecure-dev for development";

impl LinkArgs {
    /// The certificate files and revocation list, or None without certificate flags.
    fn sources(&self) -> Result<Option<reload::Sources>, String> {
        let files = tls::TlsFiles::from_flags(
            self.cluster_ca.clone(),
            self.cluster_cert.clone(),
            self.cluster_key.clone(),
        )?;
        match files {
            Some(f) => Ok(Some(reload::Sources::new(f, self.cluster_crl.clone()))),
            None if self.cluster_crl.is_some() => {
                Err("--cluster-crl needs --cluster-ca, --cluster-cert and --cluster-key".into())
            }
            None => Ok(None),
        }
    }

    /// The certificate files, or None in the development mode; an error when neither is given.
    fn files(&self, what: &str) -> Result<Option<reload::Sources>, String> {
        match self.sources()? {
            Some(f) => Ok(Some(f)),
            None if self.cluster_insecure_dev => {
                tracing::warn!(
                    "!!! --cluster-insecure-dev: {what} WITHOUT certificates; nothing on the cluster link is \
                     authenticated. Development only. !!!"
                );
                Ok(None)
            }
            None => Err(format!("refusing to {what} without certificates: {NEED_CERTS}")),
        }
    }

    /// A router's side: mutual TLS against the cluster CA, or the development mode.
    pub fn server_crypto(&self) -> Result<Arc<QuicServerConfig>, String> {
        match self.files("open the cluster port")? {
            Some(s) => reload::server_crypto(&s),
            None => tls::insecure_server_crypto(),
        }
    }

    /// A router's side, while it runs: watches the files (nothing in the development mode), swaps the crypto of
    /// `endpoint`'s server config `server` (what it was opened with) when they change, and cuts the links `links` lists (a label for logs, the connection) whose
    /// node's certificate is revoked or expires. Watching stops when the result is dropped.
    pub fn watch_server(
        &self,
        endpoint: &quinn::Endpoint,
        server: &quinn::ServerConfig,
        links: impl Fn() -> Vec<(String, quinn::Connection)> + Send + 'static,
    ) -> Result<Option<reload::Watch>, String> {
        match self.sources()? {
            Some(s) => reload::watch_server(s, endpoint, server.clone(), links).map(Some),
            None => Ok(None),
        }
    }

    /// A node's side: mutual TLS against the cluster CA and its revocation list, and the name in the node's
    /// certificate (its name in the cluster), or the development mode (no name). [`reload::LiveClient::watch`]
    /// keeps the client config current while the node runs.
    pub fn node_client(&self) -> Result<(reload::LiveClient, Option<String>), String> {
        match self.files("join the cluster")? {
            Some(s) => reload::node_client(&s).map(|(client, name)| (client, Some(name))),
            None => Ok((reload::LiveClient::fixed(tls::insecure_client_crypto()?), None)),
        }
    }

    /// The link's transport settings.
    pub fn transport(&self) -> Result<Arc<quinn::TransportConfig>, String> {
        transport::transport_config(&transport::Tuning {
            keep_alive: Duration::from_millis(self.cluster_keepalive_ms),
            idle_timeout: Duration::from_millis(self.cluster_idle_timeout_ms),
        })
    }

    /// Frame limits, with a receive budget of `budget` bytes for the process.
    pub fn limits(&self, budget: u64) -> Limits {
        Limits {
            max_payload: self.cluster_max_frame_bytes,
            budget: Arc::new(Budget::new(budget)),
            arenas: Arc::new(match self.cluster_shared_memory {
                true => Arenas::default(),
                false => Arenas::off(),
            }),
            ..Limits::default()
        }
    }
}
