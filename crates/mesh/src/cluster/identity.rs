//! Who a cluster certificate says its holder is: a name (the common name), a role (router or node, written in
//! the subject and matched by the extended key usage) and the key it proves, plus the TLS verifiers that refuse a
//! certificate of the wrong role with a reason that names it.
//!
//! The rules of the link: a router serves only with a `router` certificate (serverAuth), a node joins only with a
//! `node` certificate (clientAuth) whose name is the name it joins under, and a name held by a live member can be
//! taken over only by the holder of the same key (the same node restarting). Certificates issued before roles
//! existed carry none and are refused with a message that says how to re-issue them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};

/// What a certificate may be used for; written as the subject's organizational unit (`OU=mesh node`) and
/// matched by its extended key usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A router's cluster port (serverAuth).
    Router,
    /// A node joining routers (clientAuth).
    Node,
    /// Any other TLS server: a client-facing HTTPS or gRPC port, an etcd server (serverAuth, and clientAuth:
    /// etcd dials itself with its own certificate).
    Server,
    /// Any other TLS client: a client of a mutual-TLS port, a router talking to etcd (clientAuth).
    Client,
}

impl Role {
    /// Every role, in the order help texts list them.
    pub const ALL: [Role; 4] = [Role::Router, Role::Node, Role::Server, Role::Client];

    /// The role's name on the command line (`--role node`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Router => "router",
            Role::Node => "node",
            Role::Server => "server",
            Role::Client => "client",
        }
    }

    /// The subject's organizational unit that carries the role.
    pub fn unit(self) -> String {
        format!("mesh {}", self.as_str())
    }

    fn from_unit(unit: &str) -> Option<Role> {
        let name = unit.strip_prefix("mesh ")?;
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| {
            let all: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            format!("unknown certificate role '{s}' (one of: {})", all.join(", "))
        })
    }
}

/// The holder a certificate names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The subject's common name: the member's name in the cluster.
    pub name: String,
    /// The role in the subject; `None` for a certificate issued before roles.
    pub role: Option<Role>,
    /// SHA-256 of the subject public key: the same key is the same holder, even on a renewed certificate.
    pub key: [u8; 32],
}

impl Identity {
    /// The identity a DER certificate states. Errors when it is not X.509 or has no common name.
    pub fn of(der: &[u8]) -> Result<Identity, String> {
        let (_, x509) =
            x509_parser::parse_x509_certificate(der).map_err(|e| format!("the certificate is not X.509: {e}"))?;
        let subject = x509.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .ok_or_else(|| format!("certificate '{subject}' has no common name"))?
            .to_string();
        let role = subject
            .iter_organizational_unit()
            .filter_map(|ou| ou.as_str().ok())
            .find_map(Role::from_unit);
        let key = Sha256::digest(x509.public_key().raw).into();
        Ok(Identity { name, role, key })
    }

    /// Ok when the certificate carries `wanted`; else a reason naming what it carries and how to fix it.
    pub fn require(&self, wanted: Role) -> Result<(), String> {
        match self.role {
            Some(role) if role == wanted => Ok(()),
            Some(role) => Err(format!(
                "certificate '{}' is a {role} certificate; {} (issue one with `mesh-ops certs issue DIR NAME \
                 --role {wanted}`)",
                self.name,
                purpose(wanted)
            )),
            None => Err(format!(
                "certificate '{}' carries no mesh role (it was issued before roles); {} (re-issue it with \
                 `mesh-ops certs issue DIR NAME --role {wanted} --force`)",
                self.name,
                purpose(wanted)
            )),
        }
    }
}

fn purpose(role: Role) -> &'static str {
    match role {
        Role::Router => "only a router certificate may serve the cluster port",
        Role::Node => "only a node certificate may join the cluster",
        Role::Server => "a TLS server needs a server certificate",
        Role::Client => "a TLS client needs a client certificate",
    }
}

/// The identity of the leaf of `chain` (the first certificate).
pub fn of_chain(chain: &[CertificateDer<'_>]) -> Result<Identity, String> {
    Identity::of(chain.first().ok_or("no certificate")?.as_ref())
}

/// The identity the peer of `conn` proved in the handshake; `None` when it showed no certificate (the
/// development mode) or it cannot be read.
pub fn of_peer(conn: &quinn::Connection) -> Option<Identity> {
    let identity = conn.peer_identity()?;
    let chain = identity.downcast_ref::<Vec<CertificateDer<'static>>>()?;
    of_chain(chain).ok()
}

/// The verdict on a peer certificate: the inner verifier's, with the role checked once the chain is trusted. A
/// wrong key usage is reported as the wrong role when the subject says so (a certificate of another CA is still
/// refused for its issuer first: its subject says nothing trustworthy).
fn judge<T>(verified: Result<T, rustls::Error>, der: &CertificateDer<'_>, wanted: Role) -> Result<T, rustls::Error> {
    let role = || {
        Identity::of(der.as_ref())
            .and_then(|id| id.require(wanted))
            .map_err(rustls::Error::General)
    };
    match verified {
        Ok(v) => role().map(|()| v),
        Err(
            e @ rustls::Error::InvalidCertificate(
                CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
            ),
        ) => Err(role().err().unwrap_or(e)),
        Err(e) => Err(e),
    }
}

/// The handshake-signature methods of a verifier that wraps `self.inner`: the inner verifier's, as they are.
macro_rules! signatures_of_inner {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    };
}

/// Checks a client's role before the inner verifier checks its chain, so a router certificate shown by a
/// would-be node is refused as such rather than for a missing key usage.
#[derive(Debug)]
pub struct RoleClientVerifier {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub wanted: Role,
}

impl ClientCertVerifier for RoleClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        judge(
            self.inner.verify_client_cert(end_entity, intermediates, now),
            end_entity,
            self.wanted,
        )
    }

    signatures_of_inner!();
}

/// Checks a server's role, then its chain and name with the inner verifier, so a node certificate serving a
/// would-be router is refused as such.
#[derive(Debug)]
pub struct RoleServerVerifier {
    pub inner: Arc<dyn ServerCertVerifier>,
    pub wanted: Role,
}

impl ServerCertVerifier for RoleServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        judge(
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now),
            end_entity,
            self.wanted,
        )
    }

    signatures_of_inner!();
}
