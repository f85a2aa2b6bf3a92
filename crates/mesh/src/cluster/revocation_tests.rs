//! Tests of the revocation decision: which live links a new list or the clock cuts, and what the logs say.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::{decide, PeerCert, Revoked, Why};
use crate::cluster::certs::{CertificateAuthority, LeafRequest, Role};
use crate::cluster::crl::{Crl, Entry, Reason, Serial};
use crate::cluster::transport::close;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn serial(s: &str) -> Serial {
    s.parse().expect("serial")
}

fn entry(s: &str, revoked_at: u64) -> Entry {
    Entry {
        serial: serial(s),
        revoked_at: at(revoked_at),
        reason: Some(Reason::KeyCompromise),
    }
}

/// A list revoking `entries` (only its entries matter here).
fn list(entries: Vec<Entry>) -> Crl {
    Crl {
        der: Vec::new().into(),
        issuer: "CN=test CA".into(),
        number: Some(1),
        this_update: at(0),
        next_update: None,
        entries,
    }
}

fn peer(s: &str, name: &str, not_after: u64) -> PeerCert {
    PeerCert {
        serial: serial(s),
        name: name.into(),
        not_after: at(not_after),
    }
}

const NOW: u64 = 1_000_000;

fn links() -> Vec<(&'static str, PeerCert)> {
    vec![
        ("link-a", peer("0A", "node-a", NOW * 2)),
        ("link-b", peer("0B", "node-b", NOW * 2)),
        ("link-c", peer("0C", "node-c", NOW * 2)),
    ]
}

#[test]
fn a_new_list_cuts_exactly_the_links_it_revokes() {
    let old = Revoked::default();
    let new = Revoked::of(&[list(vec![entry("0B", 500)])]);
    let d = decide(&old, &new, links(), at(NOW));
    let cut: Vec<_> = d.cut.iter().map(|(k, p, _)| (*k, p.name.as_str())).collect();
    assert_eq!(cut, vec![("link-b", "node-b")]);
    assert_eq!(
        d.cut[0].2,
        Why::Revoked {
            since: at(500),
            reason: Some(Reason::KeyCompromise)
        }
    );
    assert_eq!(d.newly_revoked, vec![serial("0B")]);
    assert!(d.reinstated.is_empty());
}

#[test]
fn a_link_that_raced_the_list_is_cut_at_the_next_look() {
    // The list was already in force, but this link got through before it was (or it is a new link of a revoked
    // certificate that raced the reload): the same list on both sides still cuts it, and reports nothing new.
    let revoked = Revoked::of(&[list(vec![entry("0C", 500)])]);
    let d = decide(&revoked, &revoked, links(), at(NOW));
    assert_eq!(d.cut.iter().map(|(k, _, _)| *k).collect::<Vec<_>>(), vec!["link-c"]);
    assert!(d.newly_revoked.is_empty() && d.reinstated.is_empty());
}

#[test]
fn an_expired_certificate_cuts_its_link_and_a_live_one_does_not() {
    let none = Revoked::default();
    let mut live = links();
    live.push(("link-old", peer("0D", "node-d", NOW - 1)));
    // Valid through its last second, as in a handshake.
    live.push(("link-edge", peer("0E", "node-e", NOW)));
    let d = decide(&none, &none, live, at(NOW) + Duration::from_millis(999));
    let cut: Vec<_> = d.cut.iter().map(|(k, _, why)| (*k, *why)).collect();
    assert_eq!(cut, vec![("link-old", Why::Expired { at: at(NOW - 1) })]);
    // Revoked wins over expired in the reason.
    let revoked = Revoked::of(&[list(vec![entry("0D", 7)])]);
    let d = decide(&none, &revoked, vec![("x", peer("0D", "node-d", NOW - 1))], at(NOW));
    assert!(matches!(d.cut[0].2, Why::Revoked { .. }));
}

#[test]
fn a_dropped_entry_is_reinstated_and_cuts_nothing() {
    let old = Revoked::of(&[list(vec![entry("0A", 1), entry("0B", 2)])]);
    let new = Revoked::of(&[list(vec![entry("0B", 2)])]);
    let d = decide(&old, &new, vec![("link-a", peer("0A", "node-a", NOW * 2))], at(NOW));
    assert!(d.cut.is_empty());
    assert_eq!(d.reinstated, vec![serial("0A")]);
    assert!(d.newly_revoked.is_empty());
}

#[test]
fn the_earliest_revocation_of_a_serial_wins_across_lists() {
    let r = Revoked::of(&[
        list(vec![entry("0A", 900)]),
        list(vec![entry("0A", 100), entry("0B", 5)]),
    ]);
    assert_eq!(r.len(), 2);
    assert_eq!(r.get(&serial("0A")).map(|e| e.revoked_at), Some(at(100)));
    assert!(Revoked::default().is_empty());
}

#[test]
fn reasons_name_the_certificate_and_close_with_their_own_code() {
    let p = peer("0A1B", "node-a", 0);
    let revoked = Why::Revoked {
        since: at(1_700_000_000),
        reason: Some(Reason::KeyCompromise),
    };
    let text = revoked.describe(&p);
    assert!(
        text.starts_with("certificate 'node-a' (serial 0A1B) was revoked on Nov 14")
            && text.ends_with("(key-compromise)"),
        "{text}"
    );
    assert_eq!(revoked.close_code(), close::REVOKED);
    let expired = Why::Expired { at: at(0) };
    assert!(
        expired.describe(&p).contains("'node-a' (serial 0A1B) expired on"),
        "{}",
        expired.describe(&p)
    );
    assert_eq!(expired.close_code(), close::EXPIRED);
}

#[test]
fn a_peer_certificate_gives_its_serial_name_and_expiry() {
    let ca = CertificateAuthority::generate("test CA", 2).expect("CA");
    let leaf = ca
        .issue(&LeafRequest {
            lifetime: Some(Duration::from_secs(3600)),
            ..LeafRequest::new("node-a", Role::Node)
        })
        .expect("leaf");
    let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).expect("der");
    let p = PeerCert::of_der(&der).expect("peer");
    assert_eq!(p.name, "node-a");
    assert_eq!(p.serial, Serial::of_cert(&der).unwrap());
    let left = p.not_after.duration_since(SystemTime::now()).expect("in the future");
    assert!(
        left <= Duration::from_secs(3600) && left > Duration::from_secs(3500),
        "{left:?}"
    );
    assert!(PeerCert::of_der(b"junk").is_err());
}
