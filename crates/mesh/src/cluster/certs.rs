//! Certificates for the cluster link: a cluster CA, the leaf certificates it issues, PEM loading with clear errors.
//!
//! Every key is ECDSA P-256 (rcgen's default, supported by the ring provider). A leaf certificate carries one
//! role ([`Role`]): written in its subject (`OU=mesh node`) and matched by its extended key usage (serverAuth
//! for a router, clientAuth for a node or another client, both for another server such as etcd, which dials
//! itself), so a node's certificate cannot serve as a router and a router's cannot join as a node.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData, RevokedCertParams,
    SanType, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::error::X509Error;
use x509_parser::extensions::GeneralName;

use super::crl;
pub use super::identity::Role;

/// Days a CA made by [`CertificateAuthority::generate`] stays valid unless told otherwise (about ten years).
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// Days a leaf certificate stays valid unless told otherwise: 825 (about 27 months), the longest lifetime the
/// major TLS clients accept for a server certificate; re-issuing with `mesh-ops certs issue` is cheap.
pub const DEFAULT_LEAF_DAYS: u32 = 825;
/// The longest validity accepted (100 years), so date arithmetic never overflows.
pub const MAX_DAYS: u32 = 36_500;
/// Certificates start being valid this long before they are made, so a peer whose clock runs a little behind
/// accepts a fresh certificate.
const BACKDATE: Duration = Duration::from_secs(3600);
/// The organization written into every subject this module makes.
const ORGANIZATION: &str = "mesh cluster";

/// One subject alternative name of a leaf certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum San {
    /// A DNS name (`DNS:node-a.example`).
    Dns(String),
    /// An IP address (`IP:127.0.0.1`).
    Ip(IpAddr),
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            San::Dns(name) => write!(f, "DNS:{name}"),
            San::Ip(ip) => write!(f, "IP:{ip}"),
        }
    }
}

/// What a leaf certificate should say: its name and role, extra names and addresses, and how long it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafRequest {
    /// The subject's common name (a node or router name); also a SAN when it is a DNS name or an IP address.
    pub name: String,
    /// What the certificate may be used for.
    pub role: Role,
    /// Extra DNS names (a leading `*.` wildcard label is allowed).
    pub dns_names: Vec<String>,
    /// Extra IP addresses.
    pub ip_addrs: Vec<IpAddr>,
    /// Validity in days, from now.
    pub days: u32,
    /// Exact validity from now instead of `days`, for short-lived certificates (`mesh-ops certs issue --hours N`).
    pub lifetime: Option<Duration>,
}

impl LeafRequest {
    /// A request for `name` in `role` with no extra names and [`DEFAULT_LEAF_DAYS`].
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Self {
            name: name.into(),
            role,
            dns_names: Vec::new(),
            ip_addrs: Vec::new(),
            days: DEFAULT_LEAF_DAYS,
            lifetime: None,
        }
    }

    /// How long the certificate will be valid: `lifetime` when given, else `days`.
    pub fn validity(&self) -> Duration {
        self.lifetime
            .unwrap_or(Duration::from_secs(u64::from(self.days) * 86_400))
    }

    /// The SANs the certificate will carry, in order and without duplicates: `name` (when it is a valid DNS name
    /// or an IP address), the extra DNS names, the extra IPs, then `localhost`, `127.0.0.1` and `::1`, so the
    /// certificate works on loopback as it is.
    pub fn subject_alt_names(&self) -> Result<Vec<San>, String> {
        let mut sans = Vec::new();
        let mut push = |san: San| {
            if !sans.contains(&san) {
                sans.push(san);
            }
        };
        if let Ok(ip) = self.name.parse::<IpAddr>() {
            push(San::Ip(ip));
        } else if is_dns_name(&self.name) {
            push(San::Dns(self.name.to_ascii_lowercase()));
        }
        for name in &self.dns_names {
            if !is_dns_name(name) {
                return Err(format!("'{name}' is not a valid DNS name"));
            }
            push(San::Dns(name.to_ascii_lowercase()));
        }
        for ip in &self.ip_addrs {
            push(San::Ip(*ip));
        }
        push(San::Dns("localhost".into()));
        push(San::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        push(San::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        Ok(sans)
    }
}

/// Whether `name` is a DNS name a certificate can carry (`*.` followed by a DNS name is allowed too).
fn is_dns_name(name: &str) -> bool {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    DnsName::try_from(bare).is_ok() && bare.parse::<IpAddr>().is_err()
}

/// A leaf certificate and its private key, both PEM, as issued by [`CertificateAuthority::issue`].
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// The certificate, PEM (`CERTIFICATE`).
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8 `PRIVATE KEY`). Keep it secret (file mode 0600).
    pub key_pem: String,
    /// The subject alternative names it carries.
    pub sans: Vec<San>,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("sans", &self.sans)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

/// The cluster CA: its certificate and key, able to issue leaf certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
    subject: String,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("subject", &self.subject)
            .field("key", &"[elided]")
            .finish()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA named `common_name`, valid for `days` (CA basic constraint with path length 0,
    /// key usages keyCertSign, cRLSign and digitalSignature).
    pub fn generate(common_name: &str, days: u32) -> Result<Self, String> {
        let (not_before, not_after) = validity(days)?;
        let key = KeyPair::generate().map_err(|e| format!("cannot generate the CA key: {e}"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("cannot sign the CA certificate: {e}"))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem,
            subject: format!("CN={common_name}, O={ORGANIZATION}"),
            issuer: Issuer::new(params, key),
        })
    }

    /// An existing CA from its PEM certificate and key. Checks that the certificate is a CA and that the key is
    /// the certificate's key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("the CA certificate is not a PEM CERTIFICATE: {e}"))?;
        let x509 = parse(&der).map_err(|e| format!("the CA certificate is not valid X.509: {e}"))?;
        if !x509.is_ca() {
            return Err(format!(
                "certificate '{}' is not a CA certificate (no CA basic constraint)",
                x509.subject()
            ));
        }
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("the CA key is not a usable private key: {e}"))?;
        if x509.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
            return Err(format!(
                "the CA key does not belong to the CA certificate '{}'",
                x509.subject()
            ));
        }
        let subject = x509.subject().to_string();
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|e| format!("cannot use the CA certificate: {e}"))?;
        Ok(Self {
            issuer,
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            subject,
        })
    }

    /// A certificate revocation list signed by this CA, PEM (`X509 CRL`): number `number` (it must grow with every
    /// list the CA signs), issued now, due for renewal after `valid_for`, listing `entries`.
    pub fn sign_crl(&self, number: u64, entries: &[crl::Entry], valid_for: Duration) -> Result<String, String> {
        let now = SystemTime::now();
        let next = now
            .checked_add(valid_for)
            .filter(|_| !valid_for.is_zero() && valid_for <= Duration::from_secs(u64::from(MAX_DAYS) * 86_400))
            .ok_or_else(|| format!("a revocation list valid for {valid_for:?} is out of range"))?;
        let params = CertificateRevocationListParams {
            this_update: now.into(),
            next_update: next.into(),
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: entries
                .iter()
                .map(|e| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(e.serial.as_bytes()),
                    revocation_time: e.revoked_at.into(),
                    reason_code: e.reason.map(crl::Reason::to_rcgen),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .and_then(|crl| crl.pem())
            .map_err(|e| format!("cannot sign the revocation list: {e}"))
    }

    /// The revocation lists of the PEM file at `path`, checked to be signed by this CA; errors name the file.
    pub fn read_crl(&self, path: &Path) -> Result<Vec<crl::Crl>, String> {
        let der = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| format!("the CA certificate is not a PEM CERTIFICATE: {e}"))?;
        crl::read(path, &[der])
    }

    /// An existing CA from its PEM files; errors name the file at fault.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, String> {
        let cert_pem = read_text(cert_path, "CA certificate")?;
        let key_pem = read_text(key_path, "CA key")?;
        if CertificateDer::pem_slice_iter(cert_pem.as_bytes()).next().is_none() {
            return Err(format!(
                "CA certificate {}: no CERTIFICATE section",
                cert_path.display()
            ));
        }
        if PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).is_err() {
            return Err(format!("CA key {}: no PRIVATE KEY section", key_path.display()));
        }
        Self::from_pem(&cert_pem, &key_pem)
            .map_err(|e| format!("CA {} + {}: {e}", cert_path.display(), key_path.display()))
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM. Keep it secret.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The CA's subject, e.g. `CN=mesh cluster CA, O=mesh cluster`.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Issues a leaf certificate for `req` with a fresh key, not a CA: its role in the subject and the one
    /// extended key usage of the role.
    pub fn issue(&self, req: &LeafRequest) -> Result<IssuedCert, String> {
        if req.name.trim().is_empty() {
            return Err("a certificate needs a non-empty name".into());
        }
        let (not_before, not_after) = validity_for(req.validity())?;
        let sans = req.subject_alt_names()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(&req.name);
        params
            .distinguished_name
            .push(DnType::OrganizationalUnitName, req.role.unit());
        params.subject_alt_names = sans
            .iter()
            .map(|san| match san {
                San::Dns(name) => name.clone().try_into().map(SanType::DnsName),
                San::Ip(ip) => Ok(SanType::IpAddress(*ip)),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| format!("bad subject alternative name: {e}"))?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match req.role {
            Role::Router => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Role::Node | Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            // etcd (and other servers with client-certificate checks) dial themselves with their own certificate.
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let key = KeyPair::generate().map_err(|e| format!("cannot generate a key: {e}"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("cannot sign the certificate: {e}"))?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            sans,
        })
    }
}

/// A self-signed certificate and key for `localhost` and the loopback addresses, made in memory: the
/// development mode's ephemeral server identity.
pub(crate) fn self_signed_ephemeral() -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), String> {
    let ca = CertificateAuthority::generate("mesh dev (insecure, ephemeral)", 1)?;
    let leaf = ca.issue(&LeafRequest {
        days: 1,
        ..LeafRequest::new("localhost", Role::Router)
    })?;
    let cert = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).map_err(|e| e.to_string())?;
    Ok((cert, key))
}

fn subject(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, ORGANIZATION);
    dn
}

/// (not before, not after) for a certificate valid `days` from now.
fn validity(days: u32) -> Result<(SystemTime, SystemTime), String> {
    if days == 0 || days > MAX_DAYS {
        return Err(format!("validity of {days} days is out of range (1 to {MAX_DAYS})"));
    }
    validity_for(Duration::from_secs(u64::from(days) * 86_400))
}

/// (not before, not after) for a certificate valid `lifetime` from now (at most [`MAX_DAYS`]).
fn validity_for(lifetime: Duration) -> Result<(SystemTime, SystemTime), String> {
    if lifetime.is_zero() || lifetime > Duration::from_secs(u64::from(MAX_DAYS) * 86_400) {
        return Err(format!(
            "validity of {} is out of range (1 second to {MAX_DAYS} days)",
            describe_lifetime(lifetime)
        ));
    }
    let now = SystemTime::now();
    let not_before = now.checked_sub(BACKDATE).unwrap_or(now);
    let not_after = now
        .checked_add(lifetime)
        .ok_or_else(|| format!("validity of {lifetime:?} overflows the clock"))?;
    Ok((not_before, not_after))
}

/// A lifetime as people say it: `825 days`, `8 hours`, `90 seconds`.
pub fn describe_lifetime(lifetime: Duration) -> String {
    let secs = lifetime.as_secs();
    match secs {
        s if s >= 86_400 && s % 86_400 == 0 => plural(s / 86_400, "day"),
        s if s >= 3600 && s % 3600 == 0 => plural(s / 3600, "hour"),
        s if s >= 60 && s % 60 == 0 => plural(s / 60, "minute"),
        s => plural(s, "second"),
    }
}

fn plural(n: u64, unit: &str) -> String {
    match n {
        1 => format!("1 {unit}"),
        n => format!("{n} {unit}s"),
    }
}

fn parse<'a>(der: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>, String> {
    x509_parser::parse_x509_certificate(der.as_ref())
        .map(|(_, cert)| cert)
        .map_err(|e| e.to_string())
}

/// Reads a PEM file as text; errors say which file and what is wrong with it.
fn read_text(path: &Path, what: &str) -> Result<String, String> {
    let bytes = read_pem_bytes(path, what)?;
    String::from_utf8(bytes).map_err(|_| format!("{what} {}: not a PEM file (not text)", path.display()))
}

fn read_pem_bytes(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{what} {}: cannot read: {e}", path.display()))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!(
            "{what} {}: not a PEM file (no '-----BEGIN' line)",
            path.display()
        ));
    }
    Ok(bytes)
}

/// The certificates of a PEM file (a chain: the leaf first), each checked to be X.509 and valid now.
/// `what` names the file's role in errors ("CA certificate", "certificate").
pub fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read_pem_bytes(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no CERTIFICATE section (is it a key file?)",
            path.display()
        ));
    }
    for (i, der) in certs.iter().enumerate() {
        let x509 =
            parse(der).map_err(|e| format!("{what} {}: certificate {} is not X.509: {e}", path.display(), i + 1))?;
        let validity = x509.validity();
        if !validity.is_valid() {
            return Err(format!(
                "{what} {}: certificate '{}' is valid only from {} to {} (check the clock, or issue a new one)",
                path.display(),
                x509.subject(),
                validity.not_before,
                validity.not_after
            ));
        }
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read_pem_bytes(path, "private key")?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!(
                "private key {}: no PRIVATE KEY section (is it a certificate?)",
                path.display()
            )
        }
        e => format!("private key {}: bad PEM: {e}", path.display()),
    })
}

/// Checks that the CA file holds CA certificates.
pub(crate) fn check_ca(cas: &[CertificateDer<'_>], ca_path: &Path) -> Result<(), String> {
    for der in cas {
        let x509 = parse(der).map_err(|e| format!("CA certificate {}: {e}", ca_path.display()))?;
        if !x509.is_ca() {
            return Err(format!(
                "CA certificate {}: '{}' is not a CA certificate (no CA basic constraint; is it a node's certificate?)",
                ca_path.display(),
                x509.subject()
            ));
        }
    }
    Ok(())
}

/// Checks that `chain` (from `cert_path`) leads to one of the CA certificates: one of its certificates is a CA
/// certificate or is signed by one. Passes when a signature algorithm cannot be checked here; the handshake will.
pub(crate) fn check_issued_by(
    chain: &[CertificateDer<'_>],
    cert_path: &Path,
    cas: &[CertificateDer<'_>],
    ca_path: &Path,
) -> Result<(), String> {
    let parsed_cas = cas.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
    let mut undecided = false;
    for der in chain {
        if cas.iter().any(|ca| ca.as_ref() == der.as_ref()) {
            return Ok(());
        }
        let x509 = parse(der)?;
        for ca in &parsed_cas {
            match x509.verify_signature(Some(ca.public_key())) {
                Ok(()) => return Ok(()),
                Err(X509Error::SignatureUnsupportedAlgorithm) => undecided = true,
                Err(_) => {}
            }
        }
    }
    if undecided {
        return Ok(());
    }
    let leaf = chain.first().map(parse).transpose()?;
    let (subject, issuer) = leaf
        .map(|c| (c.subject().to_string(), c.issuer().to_string()))
        .unwrap_or_default();
    let ca_subjects: Vec<String> = parsed_cas.iter().map(|c| c.subject().to_string()).collect();
    Err(format!(
        "certificate {}: '{subject}' (issued by '{issuer}') is not signed by the CA in {} ('{}')",
        cert_path.display(),
        ca_path.display(),
        ca_subjects.join("', '")
    ))
}

/// The SANs of a PEM certificate, for reports (`DNS:…`, `IP:…`).
pub fn sans_of_pem(cert_pem: &str) -> Result<Vec<San>, String> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| format!("not a PEM certificate: {e}"))?;
    let x509 = parse(&der)?;
    let Some(ext) = x509.subject_alternative_name().map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    Ok(ext
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(San::Dns(dns.to_string())),
            GeneralName::IPAddress(bytes) => ip_from_bytes(bytes).map(San::Ip),
            _ => None,
        })
        .collect())
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}
