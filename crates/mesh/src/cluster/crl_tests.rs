//! Tests of revocation lists: serial numbers as operators write them, signing and reading a CRL, refusals of files
//! that are not a CRL of the cluster CA, and leaf lifetimes in hours.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::{parse_pem, read, Entry, Reason, Serial};
use crate::cluster::certs::{describe_lifetime, CertificateAuthority, LeafRequest, Role};

fn der_of(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn serials_parse_as_openssl_prints_them_and_print_the_same_way() {
    let s: Serial = "0x0a:1B".parse().expect("hex with 0x and colons");
    assert_eq!(s.to_string(), "0A1B");
    assert_eq!(s.as_bytes(), &[0x0a, 0x1b]);
    assert_eq!(
        "000A1b".parse::<Serial>(),
        Ok(s.clone()),
        "leading zeros are the same value"
    );
    assert_eq!("a1b".parse::<Serial>(), Ok(s), "an odd number of digits");
    assert_eq!("00".parse::<Serial>().map(|s| s.to_string()), Ok("00".into()));
    assert_eq!(Serial::from_bytes(&[0, 0x80, 1]).to_string(), "8001");
    for bad in ["", "0x", "xyz", "12-34", &"ab".repeat(21)] {
        assert!(bad.parse::<Serial>().is_err(), "{bad:?} accepted");
    }
    let err = "node-a".parse::<Serial>().expect_err("a name");
    assert!(err.contains("'node-a' is not a serial number"), "{err}");
}

#[test]
fn a_certificates_serial_is_the_one_x509_tools_print() {
    let ca = CertificateAuthority::generate("test CA", 2).expect("CA");
    let leaf = ca.issue(&LeafRequest::new("node-a", Role::Node)).expect("leaf");
    let der = der_of(&leaf.cert_pem);
    let serial = Serial::of_cert(&der).expect("serial");
    let (_, x509) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let openssl = x509.tbs_certificate.serial.to_str_radix(16).to_uppercase();
    // openssl prints whole bytes: a value whose first nibble is zero keeps it.
    let openssl = if openssl.len() % 2 == 1 {
        format!("0{openssl}")
    } else {
        openssl
    };
    assert_eq!(serial.to_string(), openssl);
    assert_eq!(openssl.parse::<Serial>(), Ok(serial));
    assert!(Serial::of_cert(b"not a certificate").is_err());
}

#[test]
fn a_signed_crl_reads_back_with_its_number_dates_and_entries() {
    let ca = CertificateAuthority::generate("test CA", 2).expect("CA");
    let a = Serial::of_cert(&der_of(
        &ca.issue(&LeafRequest::new("a", Role::Node)).expect("a").cert_pem,
    ))
    .unwrap();
    let entries = vec![
        Entry {
            serial: a.clone(),
            revoked_at: at(1_700_000_000),
            reason: Some(Reason::KeyCompromise),
        },
        Entry {
            serial: "01".parse().unwrap(),
            revoked_at: at(1_700_000_100),
            reason: None,
        },
    ];
    let before = SystemTime::now() - Duration::from_secs(2);
    let pem = ca.sign_crl(7, &entries, Duration::from_secs(86_400)).expect("sign");
    assert!(pem.starts_with("-----BEGIN X509 CRL-----"), "{pem}");
    let crls = parse_pem(pem.as_bytes()).expect("parse");
    assert_eq!(crls.len(), 1);
    let crl = &crls[0];
    assert_eq!(crl.number, Some(7));
    assert_eq!(crl.issuer, "CN=test CA, O=mesh cluster");
    assert_eq!(crl.entries, entries);
    assert_eq!(crl.find(&a).and_then(|e| e.reason), Some(Reason::KeyCompromise));
    assert!(crl.this_update >= before && crl.this_update <= SystemTime::now());
    let next = crl
        .next_update
        .expect("next update")
        .duration_since(crl.this_update)
        .unwrap();
    assert!((86_399..=86_401).contains(&next.as_secs()), "{next:?}");
    crl.check_signed_by(&[der_of(ca.cert_pem())]).expect("signed by its CA");

    let other = CertificateAuthority::generate("other CA", 2).expect("other");
    let err = crl
        .check_signed_by(&[der_of(other.cert_pem())])
        .expect_err("another CA");
    assert!(err.contains("not signed by the cluster CA ('CN=other CA"), "{err}");
    // A bundle of both CAs: the list's own CA signed it.
    crl.check_signed_by(&[der_of(other.cert_pem()), der_of(ca.cert_pem())])
        .expect("bundle");

    // Two lists in one file (one per CA of a bundle).
    let both = format!(
        "{pem}{}",
        other.sign_crl(1, &[], Duration::from_secs(60)).expect("other list")
    );
    let crls = parse_pem(both.as_bytes()).expect("two lists");
    assert_eq!((crls.len(), crls[1].entries.len(), crls[1].number), (2, 0, Some(1)));
    assert!(
        ca.sign_crl(1, &[], Duration::ZERO).is_err(),
        "a list due before it is issued"
    );
}

#[test]
fn files_that_are_not_a_crl_of_the_ca_are_refused_with_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = CertificateAuthority::generate("test CA", 2).expect("CA");
    let cas = [der_of(ca.cert_pem())];
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let missing = dir.path().join("missing.pem");
    let cases = [
        (missing.clone(), "cannot read"),
        (write("text.pem", "hello"), "not a PEM file"),
        (write("cert.pem", ca.cert_pem()), "no X509 CRL section"),
        (
            write("bad.pem", "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"),
            "revocation list 1: not an X.509 CRL",
        ),
    ];
    for (path, why) in cases {
        let err = read(&path, &cas).expect_err("refused");
        assert!(
            err.contains(&path.display().to_string()) && err.contains(why),
            "{path:?}: {err}"
        );
    }
    let other = CertificateAuthority::generate("other CA", 2).expect("other");
    let foreign = write("foreign.pem", &other.sign_crl(1, &[], Duration::from_secs(60)).unwrap());
    let err = read(&foreign, &cas).expect_err("another CA's list");
    assert!(err.contains("not signed by the cluster CA"), "{err}");
    let good = write("crl.pem", &ca.sign_crl(3, &[], Duration::from_secs(60)).unwrap());
    assert_eq!(read(&good, &cas).expect("good")[0].number, Some(3));
}

#[test]
fn reasons_have_command_line_names() {
    for r in Reason::ALL {
        assert_eq!(r.as_str().parse::<Reason>(), Ok(r));
    }
    assert_eq!(Reason::from_code(1), Some(Reason::KeyCompromise));
    assert_eq!(Reason::from_code(7), None);
    let err = "stolen".parse::<Reason>().expect_err("unknown");
    assert!(err.contains("one of: key-compromise, superseded"), "{err}");
}

#[test]
fn leaf_lifetimes_may_be_hours() {
    let ca = CertificateAuthority::generate("test CA", 2).expect("CA");
    let req = LeafRequest {
        lifetime: Some(Duration::from_secs(8 * 3600)),
        ..LeafRequest::new("node-a", Role::Node)
    };
    assert_eq!(req.validity(), Duration::from_secs(8 * 3600));
    assert_eq!(
        LeafRequest::new("n", Role::Node).validity(),
        Duration::from_secs(825 * 86_400)
    );
    let leaf = ca.issue(&req).expect("short-lived leaf");
    let der = der_of(&leaf.cert_pem);
    let (_, x509) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let left = x509.validity().not_after.timestamp() - x509_parser::time::ASN1Time::now().timestamp();
    assert!((8 * 3600 - 60..=8 * 3600).contains(&left), "{left} s left");
    let zero = LeafRequest {
        lifetime: Some(Duration::ZERO),
        ..LeafRequest::new("n", Role::Node)
    };
    assert!(ca.issue(&zero).expect_err("zero").contains("0 seconds is out of range"));
    let too_long = LeafRequest {
        lifetime: Some(Duration::from_secs(36_501 * 86_400)),
        ..LeafRequest::new("n", Role::Node)
    };
    assert!(ca.issue(&too_long).expect_err("too long").contains("out of range"));
    assert_eq!(describe_lifetime(Duration::from_secs(8 * 3600)), "8 hours");
    assert_eq!(describe_lifetime(Duration::from_secs(86_400)), "1 day");
    assert_eq!(describe_lifetime(Duration::from_secs(90)), "90 seconds");
}
