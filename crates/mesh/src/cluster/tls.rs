//! Mutual TLS for the cluster link: quinn crypto configs (TLS 1.3, ALPN `mesh`, ring) checked against a cluster CA.
//!
//! The router serves with [`server_crypto`], which requires every node to present a `node` certificate signed by
//! the cluster CA; a node dials with [`client_crypto`], which checks that the router's certificate is a `router`
//! certificate of the same CA and presents the node's own. Each side also refuses to start with a certificate of
//! the wrong role ([`identity`]). The callers add their own `quinn::TransportConfig`. Without certificates, the
//! development mode ([`insecure_server_crypto`], [`insecure_client_crypto`]) encrypts but authenticates nobody.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, InconsistentKeys, RootCertStore, ServerConfig, SignatureScheme};

use super::certs;
use super::identity::{self, Role, RoleClientVerifier, RoleServerVerifier};

/// The ALPN protocol both sides of the cluster link speak.
pub const ALPN: &[u8] = b"mesh";

/// The three PEM files of a cluster member (`--cluster-ca`, `--cluster-cert`, `--cluster-key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate(s) every peer is checked against.
    pub ca: PathBuf,
    /// This member's certificate (a chain, leaf first), signed by the CA.
    pub cert: PathBuf,
    /// This member's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The three files, as given.
    pub fn new(ca: impl Into<PathBuf>, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            cert: cert.into(),
            key: key.into(),
        }
    }

    /// The layout `mesh-ops certs` writes: `DIR/ca.pem`, `DIR/NAME.pem`, `DIR/NAME.key`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        Self::new(
            dir.join("ca.pem"),
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        )
    }

    /// The files from the three optional flags: all three (`Some`), none (`None`: the development mode), or an
    /// error naming the missing ones.
    pub fn from_flags(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Option<Self>, String> {
        match (ca, cert, key) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(Self { ca, cert, key })),
            (None, None, None) => Ok(None),
            (ca, cert, key) => {
                let missing: Vec<&str> = [("--cluster-ca", ca.is_none()), ("--cluster-cert", cert.is_none())]
                    .into_iter()
                    .chain([("--cluster-key", key.is_none())])
                    .filter_map(|(flag, missing)| missing.then_some(flag))
                    .collect();
                Err(format!(
                    "mutual TLS needs --cluster-ca, --cluster-cert and --cluster-key together; missing {}",
                    missing.join(", ")
                ))
            }
        }
    }
}

/// The one crypto provider of the mesh (ring), passed explicitly to every config built here.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The router's side: serves `files.cert` (a router certificate) and REQUIRES a node certificate signed by the
/// CA in `files.ca`.
pub fn server_crypto(files: &TlsFiles) -> Result<Arc<QuicServerConfig>, String> {
    server_crypto_of(&Loaded::read(files, Role::Router)?, &[], files)
}

/// [`server_crypto`] from files already read, refusing node certificates that `crls` revoke (CRLs of other
/// issuers, say of a second CA in the bundle, leave that CA's certificates unchecked).
pub(crate) fn server_crypto_of(
    loaded: &Loaded,
    crls: &[CertificateRevocationListDer<'static>],
    files: &TlsFiles,
) -> Result<Arc<QuicServerConfig>, String> {
    let provider = provider();
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(loaded.roots.clone()), provider.clone())
        .with_crls(crls.iter().cloned())
        .allow_unknown_revocation_status()
        .build()
        .map_err(|e| {
            format!(
                "CA certificate {}: cannot verify clients with it: {e}",
                files.ca.display()
            )
        })?;
    let verifier = Arc::new(RoleClientVerifier {
        inner,
        wanted: Role::Node,
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3 with the ring provider: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(loaded.chain.clone(), loaded.key.clone_key())
        .map_err(|e| key_error(e, files))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    // No session resumption: a resumed session skips the certificate checks, so a node could come back with a
    // certificate that has since expired or been revoked. Links are long-lived; a full handshake costs nothing.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    quic_server(config)
}

/// A node's side: checks that the router's certificate is a router certificate of the CA in `files.ca` (the
/// name it dials must be one of its SANs) and presents `files.cert` (a node certificate) as its own.
pub fn client_crypto(files: &TlsFiles) -> Result<Arc<QuicClientConfig>, String> {
    node_crypto(files).map(|(config, _)| config)
}

/// [`client_crypto`], and the name in the node's certificate: its name in the cluster.
pub fn node_crypto(files: &TlsFiles) -> Result<(Arc<QuicClientConfig>, String), String> {
    let loaded = Loaded::read(files, Role::Node)?;
    let config = client_crypto_of(&loaded, &[], files)?;
    Ok((config, loaded.name))
}

/// [`client_crypto`] from files already read, refusing router certificates that `crls` revoke.
pub(crate) fn client_crypto_of(
    loaded: &Loaded,
    crls: &[CertificateRevocationListDer<'static>],
    files: &TlsFiles,
) -> Result<Arc<QuicClientConfig>, String> {
    let provider = provider();
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(loaded.roots.clone()), provider.clone())
        .with_crls(crls.iter().cloned())
        .allow_unknown_revocation_status()
        .build()
        .map_err(|e| {
            format!(
                "CA certificate {}: cannot verify routers with it: {e}",
                files.ca.display()
            )
        })?;
    let verifier = Arc::new(RoleServerVerifier {
        inner,
        wanted: Role::Router,
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3 with the ring provider: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(loaded.chain.clone(), loaded.key.clone_key())
        .map_err(|e| key_error(e, files))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    // Every dial checks the router's certificate in full (see `server_crypto_of`).
    config.resumption = rustls::client::Resumption::disabled();
    quic_client(config)
}

/// DEVELOPMENT ONLY — never use in production. Serves an ephemeral self-signed certificate made at start-up
/// and asks no client for a certificate: any process that can reach the port joins the cluster.
pub fn insecure_server_crypto() -> Result<Arc<QuicServerConfig>, String> {
    let (cert, key) = certs::self_signed_ephemeral()?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3 with the ring provider: {e}"))?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .map_err(|e| format!("ephemeral development certificate: {e}"))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    quic_server(config)
}

/// DEVELOPMENT ONLY — never use in production. Accepts any server certificate (it still checks that the server
/// holds the key of the certificate it shows) and presents none: the link is encrypted but open to a
/// man in the middle.
pub fn insecure_client_crypto() -> Result<Arc<QuicClientConfig>, String> {
    let provider = provider();
    let verifier = Arc::new(AcceptAnyServer {
        provider: provider.clone(),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3 with the ring provider: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    quic_client(config)
}

/// The peer's name from its certificate, for logs: the common name. `None` when the peer showed no certificate
/// (a node in development mode) or it cannot be read.
pub fn peer_name(conn: &quinn::Connection) -> Option<String> {
    identity::of_peer(conn).map(|id| id.name)
}

/// A member's files, read and checked against each other.
pub(crate) struct Loaded {
    roots: RootCertStore,
    /// The CA certificates, as read (a revocation list must be signed by one of them).
    pub(crate) cas: Vec<CertificateDer<'static>>,
    /// The member's chain, leaf first.
    pub(crate) chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// The certificate's common name.
    pub(crate) name: String,
}

impl Loaded {
    /// The files, with the certificate checked to carry `role`.
    pub(crate) fn read(files: &TlsFiles, role: Role) -> Result<Self, String> {
        let cas = certs::load_certs(&files.ca, "CA certificate")?;
        certs::check_ca(&cas, &files.ca)?;
        let chain = certs::load_certs(&files.cert, "certificate")?;
        let key = certs::load_key(&files.key)?;
        certs::check_issued_by(&chain, &files.cert, &cas, &files.ca)?;
        let own = identity::of_chain(&chain).map_err(|e| format!("certificate {}: {e}", files.cert.display()))?;
        own.require(role)
            .map_err(|e| format!("certificate {}: {e}", files.cert.display()))?;
        let mut roots = RootCertStore::empty();
        for (i, ca) in cas.iter().cloned().enumerate() {
            roots.add(ca).map_err(|e| {
                format!(
                    "CA certificate {}: certificate {} is not a usable CA: {e}",
                    files.ca.display(),
                    i + 1
                )
            })?;
        }
        Ok(Self {
            roots,
            cas,
            chain,
            key,
            name: own.name,
        })
    }
}

/// A rustls error from pairing the certificate with its key, as a message naming both files.
fn key_error(e: rustls::Error, files: &TlsFiles) -> String {
    match e {
        rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => {
            format!(
                "private key {} does not match the certificate in {}",
                files.key.display(),
                files.cert.display()
            )
        }
        e => format!(
            "private key {} with certificate {}: {e}",
            files.key.display(),
            files.cert.display()
        ),
    }
}

fn quic_server(config: ServerConfig) -> Result<Arc<QuicServerConfig>, String> {
    QuicServerConfig::try_from(config)
        .map(Arc::new)
        .map_err(|e| format!("QUIC server crypto: {e}"))
}

fn quic_client(config: ClientConfig) -> Result<Arc<QuicClientConfig>, String> {
    QuicClientConfig::try_from(config)
        .map(Arc::new)
        .map_err(|e| format!("QUIC client crypto: {e}"))
}

/// The development mode's server verifier: trusts any certificate, but checks the handshake signatures with the
/// provider's algorithms, so the server must hold the key of the certificate it shows.
struct AcceptAnyServer {
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for AcceptAnyServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AcceptAnyServer (insecure development mode)")
    }
}

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
