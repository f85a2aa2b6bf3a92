//! Tests of `mesh-ops certs revoke` and `certs crl`: the index of issued certificates, revoking by name (every
//! certificate of the name) and by serial, the list's growing number, and refusals.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh::cluster::certs::{CertificateAuthority, LeafRequest, Role};
use mesh::cluster::crl::{Reason, Serial};
use tempfile::TempDir;

use super::{crl, revoke, INDEX};
use crate::ca_dir::read_index;
use crate::certs::{init, issue, DEFAULT_CA_NAME};

fn ca_dir() -> TempDir {
    let tmp = TempDir::new().expect("temp dir");
    init(tmp.path(), DEFAULT_CA_NAME, 3650, false).expect("init");
    tmp
}

fn serial_of(dir: &Path, name: &str) -> Serial {
    Serial::of_pem(&std::fs::read_to_string(dir.join(format!("{name}.pem"))).expect("cert")).expect("serial")
}

/// The list in `dir`, read back and checked against the CA.
fn list(dir: &Path) -> Vec<mesh::cluster::crl::Crl> {
    let ca = CertificateAuthority::load(&dir.join("ca.pem"), &dir.join("ca.key")).expect("CA");
    ca.read_crl(&dir.join("crl.pem")).expect("a list signed by the CA")
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

#[test]
fn every_certificate_of_a_name_is_recorded_and_revoked() {
    let tmp = ca_dir();
    let dir = tmp.path();
    let first = issue(dir, &LeafRequest::new("node-a", Role::Node), false).expect("issue");
    assert_eq!(first.serial, serial_of(dir, "node-a"));
    assert!(
        first
            .to_string()
            .contains(&format!("serial {}, valid 825 days", first.serial)),
        "{first}"
    );
    let second = issue(dir, &LeafRequest::new("node-a", Role::Node), true).expect("re-issue");
    issue(dir, &LeafRequest::new("node-b", Role::Node), false).expect("node-b");
    #[cfg(unix)]
    assert_eq!(mode(&dir.join(INDEX)), 0o600);
    let index = read_index(dir).expect("index");
    let names: Vec<(&str, &str)> = index.iter().map(|i| (i.name.as_str(), i.role.as_str())).collect();
    assert_eq!(names, vec![("node-a", "node"), ("node-a", "node"), ("node-b", "node")]);

    let report = revoke(dir, "node-a", Some(Reason::KeyCompromise), 30).expect("revoke");
    let revoked: Vec<(Serial, bool)> = report.revoked.iter().map(|r| (r.serial.clone(), r.already)).collect();
    assert_eq!(
        revoked,
        vec![(first.serial.clone(), false), (second.serial.clone(), false)]
    );
    let text = report.to_string();
    assert!(
        text.contains(&format!("revoked serial {} ('node-a')", first.serial)),
        "{text}"
    );
    assert!(text.contains("revocation list number 1"), "{text}");
    let crls = list(dir);
    assert_eq!(crls[0].number, Some(1));
    assert_eq!(crls[0].entries.len(), 2);
    assert_eq!(
        crls[0].find(&second.serial).and_then(|e| e.reason),
        Some(Reason::KeyCompromise)
    );
    let due = crls[0]
        .next_update
        .expect("next update")
        .duration_since(crls[0].this_update)
        .expect("later");
    assert_eq!(due.as_secs() / 86_400, 30);

    // Revoking twice is not an error; the list is written again with the next number.
    let again = revoke(dir, "node-a", None, 30).expect("again");
    assert!(again.revoked.iter().all(|r| r.already));
    assert!(again.to_string().contains("was already revoked"), "{again}");
    assert_eq!((list(dir)[0].number, list(dir)[0].entries.len()), (Some(2), 2));

    // By serial, as openssl prints it (upper case) or with colons in lower case.
    let b = serial_of(dir, "node-b");
    let lower: Vec<String> = b.as_bytes().iter().map(|x| format!("{x:02x}")).collect();
    let by_serial = revoke(dir, &lower.join(":"), Some(Reason::Superseded), 30).expect("by serial");
    assert_eq!(by_serial.revoked[0].name.as_deref(), Some("node-b"));
    assert_eq!((list(dir)[0].number, list(dir)[0].entries.len()), (Some(3), 3));
    assert!(revoke(dir, &b.to_string(), None, 30).expect("upper case").revoked[0].already);
    let leftovers = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .count();
    assert_eq!(leftovers, 0, "temporary files left behind");
}

#[test]
fn unknown_names_and_bad_files_are_errors_that_name_them() {
    let tmp = ca_dir();
    let dir = tmp.path();
    let err = revoke(dir, "node-zz", None, 30).expect_err("unknown").to_string();
    assert!(
        err.contains("no certificate named 'node-zz'") && err.contains(INDEX),
        "{err}"
    );
    assert!(!dir.join("crl.pem").exists(), "nothing written for an unknown name");
    let err = revoke(&dir.join("nowhere"), "node-a", None, 30)
        .expect_err("no CA")
        .to_string();
    assert!(err.contains("certs init"), "{err}");
    assert!(revoke(dir, "01", None, 0)
        .expect_err("zero days")
        .to_string()
        .contains("--crl-days 0"));

    // A certificate issued before the index existed is still revoked by its name (its NAME.pem).
    let ca = CertificateAuthority::load(&dir.join("ca.pem"), &dir.join("ca.key")).expect("CA");
    let old = ca.issue(&LeafRequest::new("node-old", Role::Node)).expect("leaf");
    std::fs::write(dir.join("node-old.pem"), &old.cert_pem).expect("write");
    let report = revoke(dir, "node-old", None, 30).expect("by NAME.pem");
    assert_eq!(report.revoked[0].serial, Serial::of_pem(&old.cert_pem).unwrap());

    // A list that is not the CA's is refused, not overwritten.
    std::fs::write(dir.join("crl.pem"), "junk").expect("write");
    let err = revoke(dir, "node-old", None, 30).expect_err("bad list").to_string();
    assert!(err.contains("crl.pem") && err.contains("not a PEM file"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("crl.pem")).unwrap(), "junk");

    // A symlinked index is refused.
    #[cfg(unix)]
    {
        std::fs::remove_file(dir.join(INDEX)).ok();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(INDEX)).expect("symlink");
        let err = read_index(dir).expect_err("symlink").to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let err = issue(dir, &LeafRequest::new("node-c", Role::Node), false)
            .expect_err("symlink")
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
    std::fs::remove_file(dir.join(INDEX)).ok();
    std::fs::write(dir.join(INDEX), "garbage line\n").expect("write");
    let err = read_index(dir).expect_err("garbage").to_string();
    assert!(err.contains(&format!("{INDEX}:1")), "{err}");
}

#[test]
fn crl_refreshes_the_list_and_show_only_reads_it() {
    let tmp = ca_dir();
    let dir = tmp.path();
    let err = crl(dir, 30, true).expect_err("nothing to show").to_string();
    assert!(err.contains("no revocation list"), "{err}");
    let empty = crl(dir, 7, false).expect("an empty list");
    assert_eq!((empty.number, empty.entries.len()), (Some(1), 0));
    issue(dir, &LeafRequest::new("node-a", Role::Node), false).expect("issue");
    revoke(dir, "node-a", Some(Reason::CessationOfOperation), 30).expect("revoke");
    let refreshed = crl(dir, 7, false).expect("refresh");
    assert_eq!((refreshed.number, refreshed.entries.len()), (Some(3), 1));
    assert_eq!(refreshed.entries[0].1.as_deref(), Some("node-a"));
    let before = std::fs::read(dir.join("crl.pem")).unwrap();
    let shown = crl(dir, 7, true).expect("show");
    assert!(!shown.written && shown.number == Some(3));
    let text = shown.to_string();
    assert!(
        text.contains("read ") && text.contains("node-a") && text.contains("(cessation-of-operation)"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(dir.join("crl.pem")).unwrap(),
        before,
        "--show wrote the list"
    );

    // A new CA (init --force) drops the old CA's list and index.
    let report = init(dir, "replacement CA", 10, true).expect("forced init");
    assert!(!dir.join("crl.pem").exists() && !dir.join(INDEX).exists());
    assert_eq!(report.removed.len(), 2);
    assert!(report.to_string().contains("belonged to the replaced CA"), "{report}");
}

#[test]
fn short_lived_certificates_are_issued_for_hours() {
    let tmp = ca_dir();
    let dir = tmp.path();
    let req = LeafRequest {
        lifetime: Some(Duration::from_secs(8 * 3600)),
        ..LeafRequest::new("node-a", Role::Node)
    };
    let report = issue(dir, &req, false).expect("issue");
    assert!(report.to_string().contains("valid 8 hours"), "{report}");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let not_after = read_index(dir).expect("index")[0].not_after;
    assert!(
        (now + 8 * 3600 - 60..=now + 8 * 3600 + 1).contains(&not_after),
        "{not_after} vs {now}"
    );
}
