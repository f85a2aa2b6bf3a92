//! Which live cluster links to cut when the revocation list or the clock moves, decided without IO: given the old
//! and the new CRL contents and the certificate each live link's peer proved (serial, expiry), the links whose
//! certificate is now revoked or expired, and which serials the change revoked or reinstated (for the logs).
//!
//! The rule: no link outlives the certificate it was made with. A link whose peer certificate is on the current
//! list is cut, whether the list just changed or the link raced with the change (it got through the handshake
//! before the new list was in force); so is a link whose peer certificate has expired: the peer dials again with
//! its renewed certificate. A new certificate on disk cuts nothing by itself.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::crl::{self, Crl, Entry, Reason, Serial};
use super::transport::close;

/// The serials a set of CRLs revokes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revoked {
    by_serial: BTreeMap<Serial, Entry>,
}

impl Revoked {
    /// Everything `crls` revoke (the earliest entry wins when two lists name the same serial).
    pub fn of(crls: &[Crl]) -> Revoked {
        let mut by_serial: BTreeMap<Serial, Entry> = BTreeMap::new();
        for entry in crls.iter().flat_map(|c| c.entries.iter()) {
            let kept = by_serial.entry(entry.serial.clone()).or_insert_with(|| entry.clone());
            if entry.revoked_at < kept.revoked_at {
                *kept = entry.clone();
            }
        }
        Revoked { by_serial }
    }

    /// The entry revoking `serial`, if any.
    pub fn get(&self, serial: &Serial) -> Option<&Entry> {
        self.by_serial.get(serial)
    }

    pub fn len(&self) -> usize {
        self.by_serial.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_serial.is_empty()
    }
}

/// What a live link's peer proved in its handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCert {
    pub serial: Serial,
    /// The certificate's common name.
    pub name: String,
    pub not_after: SystemTime,
}

impl PeerCert {
    /// The serial, name and expiry of a DER certificate.
    pub fn of_der(der: &[u8]) -> Result<PeerCert, String> {
        let (_, x509) =
            x509_parser::parse_x509_certificate(der).map_err(|e| format!("the certificate is not X.509: {e}"))?;
        let name = x509
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or("")
            .to_string();
        Ok(PeerCert {
            serial: Serial::from_bytes(x509.raw_serial()),
            name,
            not_after: crl::system_time(&x509.validity().not_after),
        })
    }
}

/// Why a link is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The peer's certificate is on the revocation list.
    Revoked { since: SystemTime, reason: Option<Reason> },
    /// The peer's certificate expired.
    Expired { at: SystemTime },
}

impl Why {
    /// The QUIC application close code the link is closed with.
    pub fn close_code(&self) -> u32 {
        match self {
            Why::Revoked { .. } => close::REVOKED,
            Why::Expired { .. } => close::EXPIRED,
        }
    }

    /// The close reason sent to the peer and logged: it names the certificate and what happened to it.
    pub fn describe(&self, peer: &PeerCert) -> String {
        match self {
            Why::Revoked { since, reason } => format!(
                "certificate '{}' (serial {}) was revoked on {}{}",
                peer.name,
                peer.serial,
                crl::show_time(*since),
                reason.map(|r| format!(" ({r})")).unwrap_or_default()
            ),
            Why::Expired { at } => format!(
                "certificate '{}' (serial {}) expired on {}",
                peer.name,
                peer.serial,
                crl::show_time(*at)
            ),
        }
    }
}

/// What to do after a look at the live links.
#[derive(Debug, PartialEq, Eq)]
pub struct Decision<K> {
    /// The links to cut, with their peer's certificate and why.
    pub cut: Vec<(K, PeerCert, Why)>,
    /// Serials on the new list that were not on the old one.
    pub newly_revoked: Vec<Serial>,
    /// Serials on the old list that the new one dropped (their certificates are accepted again).
    pub reinstated: Vec<Serial>,
}

/// Given the list in force before (`old`) and now (`new`), the live links (`key`, the peer's certificate) and the
/// time, which links to cut. Pass the same list twice for the periodic look (expiries, links that raced a change).
pub fn decide<K>(
    old: &Revoked,
    new: &Revoked,
    links: impl IntoIterator<Item = (K, PeerCert)>,
    now: SystemTime,
) -> Decision<K> {
    let cut = links
        .into_iter()
        .filter_map(|(key, peer)| {
            let why = match new.get(&peer.serial) {
                Some(e) => Why::Revoked {
                    since: e.revoked_at,
                    reason: e.reason,
                },
                None if expired(peer.not_after, now) => Why::Expired { at: peer.not_after },
                None => return None,
            };
            Some((key, peer, why))
        })
        .collect();
    Decision {
        cut,
        newly_revoked: new.by_serial.keys().filter(|s| old.get(s).is_none()).cloned().collect(),
        reinstated: old.by_serial.keys().filter(|s| new.get(s).is_none()).cloned().collect(),
    }
}

/// Whether a certificate valid until `not_after` has expired at `now`. As in the handshake (webpki compares whole
/// seconds), it is valid through its `notAfter` second: a link is never cut while a new handshake with the same
/// certificate would still pass.
fn expired(not_after: SystemTime, now: SystemTime) -> bool {
    now.duration_since(not_after)
        .is_ok_and(|past| past >= std::time::Duration::from_secs(1))
}

#[cfg(test)]
#[path = "revocation_tests.rs"]
mod tests;
