//! The cluster link's flags, shared by mesh-router and mesh-node (flattened into each one's flags):
//! certificates, the development mode, failure-detection timing and frame limits.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

use super::frame::{Budget, Limits};
use super::shm::Arenas;
use super::{tls, transport};

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
    /// The certificate files, or None in the development mode; an error when neither is given.
    fn files(&self, what: &str) -> Result<Option<tls::TlsFiles>, String> {
        let files = tls::TlsFiles::from_flags(
            self.cluster_ca.clone(),
            self.cluster_cert.clone(),
            self.cluster_key.clone(),
        )?;
        match files {
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
            Some(f) => tls::server_crypto(&f),
            None => tls::insecure_server_crypto(),
        }
    }

    /// A node's side: mutual TLS against the cluster CA and the name in the node's certificate (its name
    /// in the cluster), or the development mode (no name).
    pub fn node_crypto(&self) -> Result<(Arc<QuicClientConfig>, Option<String>), String> {
        match self.files("join the cluster")? {
            Some(f) => tls::node_crypto(&f).map(|(config, name)| (config, Some(name))),
            None => Ok((tls::insecure_client_crypto()?, None)),
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
