//! Certificate revocation lists (CRLs) of the cluster CA: serial numbers as operators write them, a CRL file's
//! contents read and checked against the CA, and the entries `mesh-ops certs revoke` signs into one
//! (`CertificateAuthority::sign_crl` in `certs`).

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::error::X509Error;
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::time::ASN1Time;

/// The longest serial number accepted, in bytes (RFC 5280 allows 20).
const MAX_SERIAL: usize = 20;

/// A certificate's serial number: its value's big-endian bytes without leading zeros. Shown as `openssl x509
/// -serial` shows it (upper-case hex, no separators); parsed from hex with or without `0x`, colons or spaces.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Serial(Vec<u8>);

impl Serial {
    /// The serial of these big-endian bytes (a DER INTEGER's contents, or its value).
    pub fn from_bytes(bytes: &[u8]) -> Serial {
        let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
        Serial(bytes[start..].to_vec())
    }

    /// The serial of a DER certificate.
    pub fn of_cert(der: &[u8]) -> Result<Serial, String> {
        let (_, x509) =
            x509_parser::parse_x509_certificate(der).map_err(|e| format!("the certificate is not X.509: {e}"))?;
        Ok(Serial::from_bytes(x509.raw_serial()))
    }

    /// The serial of the first certificate of PEM text.
    pub fn of_pem(pem: &str) -> Result<Serial, String> {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("not a PEM certificate: {e}"))?;
        Serial::of_cert(&der)
    }

    /// The value's big-endian bytes, without leading zeros (empty for zero).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("00");
        }
        self.0.iter().try_for_each(|b| write!(f, "{b:02X}"))
    }
}

impl fmt::Debug for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Serial({self})")
    }
}

impl FromStr for Serial {
    type Err = String;

    fn from_str(s: &str) -> Result<Serial, String> {
        let trimmed = s.trim();
        let body = trimmed
            .strip_prefix("0x")
            .or_else(|| trimmed.strip_prefix("0X"))
            .unwrap_or(trimmed);
        let digits: String = body.chars().filter(|c| !matches!(c, ':' | ' ')).collect();
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "'{s}' is not a serial number (hex digits, as `openssl x509 -noout -serial` prints them)"
            ));
        }
        let padded = if digits.len() % 2 == 1 {
            format!("0{digits}")
        } else {
            digits
        };
        let bytes = (0..padded.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&padded[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|e| format!("'{s}' is not a serial number: {e}"))?;
        let serial = Serial::from_bytes(&bytes);
        if serial.0.len() > MAX_SERIAL {
            return Err(format!("serial number '{s}' is longer than {MAX_SERIAL} bytes"));
        }
        Ok(serial)
    }
}

/// Why a certificate was revoked (RFC 5280 reason codes an operator may give).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    Unspecified,
    KeyCompromise,
    CaCompromise,
    AffiliationChanged,
    Superseded,
    CessationOfOperation,
    CertificateHold,
    PrivilegeWithdrawn,
}

impl Reason {
    /// Every reason, in the order help texts list them.
    pub const ALL: [Reason; 8] = [
        Reason::KeyCompromise,
        Reason::Superseded,
        Reason::CessationOfOperation,
        Reason::AffiliationChanged,
        Reason::PrivilegeWithdrawn,
        Reason::CaCompromise,
        Reason::CertificateHold,
        Reason::Unspecified,
    ];

    /// The reason's name on the command line (`--reason key-compromise`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unspecified => "unspecified",
            Reason::KeyCompromise => "key-compromise",
            Reason::CaCompromise => "ca-compromise",
            Reason::AffiliationChanged => "affiliation-changed",
            Reason::Superseded => "superseded",
            Reason::CessationOfOperation => "cessation-of-operation",
            Reason::CertificateHold => "certificate-hold",
            Reason::PrivilegeWithdrawn => "privilege-withdrawn",
        }
    }

    /// The reason of an RFC 5280 reason code; `None` for codes an operator cannot give here.
    pub fn from_code(code: u8) -> Option<Reason> {
        Some(match code {
            0 => Reason::Unspecified,
            1 => Reason::KeyCompromise,
            2 => Reason::CaCompromise,
            3 => Reason::AffiliationChanged,
            4 => Reason::Superseded,
            5 => Reason::CessationOfOperation,
            6 => Reason::CertificateHold,
            9 => Reason::PrivilegeWithdrawn,
            _ => return None,
        })
    }

    /// The reason as rcgen writes it into a CRL entry.
    pub fn to_rcgen(self) -> rcgen::RevocationReason {
        use rcgen::RevocationReason as R;
        match self {
            Reason::Unspecified => R::Unspecified,
            Reason::KeyCompromise => R::KeyCompromise,
            Reason::CaCompromise => R::CaCompromise,
            Reason::AffiliationChanged => R::AffiliationChanged,
            Reason::Superseded => R::Superseded,
            Reason::CessationOfOperation => R::CessationOfOperation,
            Reason::CertificateHold => R::CertificateHold,
            Reason::PrivilegeWithdrawn => R::PrivilegeWithdrawn,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Reason {
    type Err = String;

    fn from_str(s: &str) -> Result<Reason, String> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| {
            let all: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
            format!("unknown revocation reason '{s}' (one of: {})", all.join(", "))
        })
    }
}

/// One revoked certificate of a CRL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub serial: Serial,
    /// When it was revoked (whole seconds: what a CRL keeps).
    pub revoked_at: SystemTime,
    /// The reason given, if any.
    pub reason: Option<Reason>,
}

/// One CRL as read from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crl {
    /// The CRL as it is, for rustls.
    pub der: CertificateRevocationListDer<'static>,
    /// Its issuer, e.g. `CN=mesh cluster CA, O=mesh cluster`.
    pub issuer: String,
    /// Its CRL number; every list the CA signs has a larger one.
    pub number: Option<u64>,
    pub this_update: SystemTime,
    pub next_update: Option<SystemTime>,
    pub entries: Vec<Entry>,
}

impl Crl {
    /// A DER CRL's contents; errors say what is wrong with it.
    pub fn from_der(der: Vec<u8>) -> Result<Crl, String> {
        let (rest, crl) = x509_parser::parse_x509_crl(&der).map_err(|e| format!("not an X.509 CRL: {e}"))?;
        if !rest.is_empty() {
            return Err(format!("{} bytes after the CRL", rest.len()));
        }
        let number = match crl.crl_number() {
            None => None,
            Some(n) => {
                let bytes = n.to_bytes_be();
                let value = Serial::from_bytes(&bytes);
                if value.0.len() > 8 {
                    return Err(format!("CRL number {} is too large", value));
                }
                Some(value.0.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
            }
        };
        let entries = crl
            .iter_revoked_certificates()
            .map(|r| Entry {
                serial: Serial::from_bytes(r.raw_serial()),
                revoked_at: system_time(&r.revocation_date),
                reason: r.reason_code().and_then(|(_, code)| Reason::from_code(code.0)),
            })
            .collect();
        Ok(Crl {
            issuer: crl.issuer().to_string(),
            number,
            this_update: system_time(&crl.last_update()),
            next_update: crl.next_update().as_ref().map(system_time),
            entries,
            der: CertificateRevocationListDer::from(der),
        })
    }

    /// The entry for `serial`, if this list revokes it.
    pub fn find(&self, serial: &Serial) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.serial == serial)
    }

    /// Checks that one of `cas` signed this list.
    pub fn check_signed_by(&self, cas: &[CertificateDer<'_>]) -> Result<(), String> {
        let (_, crl) = x509_parser::parse_x509_crl(&self.der).map_err(|e| format!("not an X.509 CRL: {e}"))?;
        let mut subjects = Vec::new();
        for der in cas {
            let (_, ca) =
                x509_parser::parse_x509_certificate(der).map_err(|e| format!("a CA certificate is not X.509: {e}"))?;
            match signed_by(&crl, &ca) {
                Ok(()) => return Ok(()),
                Err(_) => subjects.push(ca.subject().to_string()),
            }
        }
        Err(format!(
            "the revocation list of '{}' is not signed by the cluster CA ('{}')",
            self.issuer,
            subjects.join("', '")
        ))
    }
}

fn signed_by(
    crl: &CertificateRevocationList<'_>,
    ca: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<(), X509Error> {
    if crl.issuer().as_raw() != ca.subject().as_raw() {
        return Err(X509Error::InvalidSignatureValue);
    }
    crl.verify_signature(ca.public_key())
}

/// The CRLs of PEM text (`-----BEGIN X509 CRL-----` sections; one per CA of a bundle).
pub fn parse_pem(pem: &[u8]) -> Result<Vec<Crl>, String> {
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err("not a PEM file (no '-----BEGIN' line)".into());
    }
    let ders = CertificateRevocationListDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("bad PEM: {e}"))?;
    if ders.is_empty() {
        return Err("no X509 CRL section (is it a certificate or a key?)".into());
    }
    ders.into_iter()
        .enumerate()
        .map(|(i, der)| Crl::from_der(der.to_vec()).map_err(|e| format!("revocation list {}: {e}", i + 1)))
        .collect()
}

/// The CRLs of the PEM file at `path`, each checked to be signed by one of `cas`; errors name the file.
pub fn read(path: &Path, cas: &[CertificateDer<'_>]) -> Result<Vec<Crl>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("revocation list {}: cannot read: {e}", path.display()))?;
    let crls = parse_pem(&bytes).map_err(|e| format!("revocation list {}: {e}", path.display()))?;
    for crl in &crls {
        crl.check_signed_by(cas)
            .map_err(|e| format!("revocation list {}: {e}", path.display()))?;
    }
    Ok(crls)
}

/// A CRL or certificate time as a `SystemTime` (times before 1970 become 1970).
pub fn system_time(t: &ASN1Time) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
}

/// A time for people and logs, as X.509 tools print it (`Mar  1 12:00:00 2026 +00:00`).
pub fn show_time(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    i64::try_from(secs)
        .ok()
        .and_then(|s| ASN1Time::from_timestamp(s).ok())
        .map_or_else(|| format!("{secs} s after 1970"), |t| t.to_string())
}

#[cfg(test)]
#[path = "crl_tests.rs"]
mod tests;
