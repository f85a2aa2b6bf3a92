//! The real `mesh-ops` binary managing certificates: a short-lived certificate, revoking it by name and by the serial
//! openssl prints, and the revocation list it writes (checked with openssl when it is installed).

use std::path::Path;
use std::process::Command;

/// Runs `mesh-ops ARGS`: (success, stdout and stderr).
fn ops(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mesh-ops"))
        .args(args)
        .env_remove("MESH_OPS_HEADER")
        .output()
        .expect("run mesh-ops");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn ok(args: &[&str]) -> String {
    let (success, text) = ops(args);
    assert!(success, "mesh-ops {args:?} failed:\n{text}");
    text
}

/// `openssl ARGS`, when openssl is installed.
fn openssl(args: &[&str]) -> Option<String> {
    let out = Command::new("openssl").args(args).output().ok()?;
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn revoke_by_name_and_by_openssls_serial_with_the_binary() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("pki");
    let d = dir.to_str().expect("utf-8 path");
    ok(&["certs", "init", d]);
    let issued = ok(&["certs", "issue", d, "node-a", "--role", "node", "--hours", "8"]);
    assert!(issued.contains("valid 8 hours"), "{issued}");
    ok(&["certs", "issue", d, "node-b", "--role", "node", "--hours", "1"]);
    let path = |f: &str| dir.join(f).display().to_string();

    let revoked = ok(&["certs", "revoke", d, "node-a", "--reason", "key-compromise"]);
    assert!(
        revoked.contains("revoked serial") && revoked.contains("('node-a')"),
        "{revoked}"
    );
    assert!(revoked.contains("revocation list number 1"), "{revoked}");

    // The serial as openssl prints it (`serial=…`), when openssl is here.
    if let Some(serial) = openssl(&["x509", "-noout", "-serial", "-in", &path("node-b.pem")]) {
        let serial = serial.trim().trim_start_matches("serial=");
        let by_serial = ok(&["certs", "revoke", d, serial]);
        assert!(
            by_serial.contains(&format!("revoked serial {serial} ('node-b')")),
            "{by_serial}"
        );
        // openssl reads the list as a CRL of the CA, with both serials and the number.
        let text = openssl(&["crl", "-noout", "-text", "-in", &path("crl.pem")]).expect("openssl crl");
        assert!(text.contains(&format!("Serial Number: {serial}")), "{text}");
        assert!(text.contains("Key Compromise"), "{text}");
        let verified = Command::new("openssl")
            .args(["crl", "-noout", "-in", &path("crl.pem"), "-CAfile", &path("ca.pem")])
            .output()
            .expect("openssl verify");
        let said = String::from_utf8_lossy(&verified.stderr).into_owned() + &String::from_utf8_lossy(&verified.stdout);
        assert!(said.contains("verify OK"), "{said}");
    }

    let (success, text) = ops(&["certs", "revoke", d, "nobody"]);
    assert!(!success && text.contains("no certificate named 'nobody'"), "{text}");
    let shown = ok(&["certs", "crl", d, "--show"]);
    assert!(
        shown.contains("node-a") && shown.contains("(key-compromise)"),
        "{shown}"
    );
    let refreshed = ok(&["certs", "crl", d]);
    assert!(
        refreshed.contains("wrote") && refreshed.contains(&path("crl.pem")),
        "{refreshed}"
    );
    assert!(Path::new(&path("crl.pem")).exists());
}
