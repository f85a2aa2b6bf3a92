//! Tests of `mesh-ops certs`: files and modes, refusals, and a real mutual-TLS handshake with the issued files.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use mesh::cluster::certs::{LeafRequest, Role, San, DEFAULT_LEAF_DAYS};
use mesh::cluster::tls::{self, TlsFiles};
use tempfile::TempDir;

use super::{init, issue, DEFAULT_CA_NAME};
use crate::ca_dir::check_name;

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

#[test]
fn init_writes_the_ca_and_refuses_to_overwrite_it() {
    let tmp = TempDir::new().expect("temp dir");
    let dir = tmp.path().join("pki/cluster");
    let report = init(&dir, DEFAULT_CA_NAME, 3650, false).expect("init");
    assert_eq!(
        (report.cert.clone(), report.key.clone()),
        (dir.join("ca.pem"), dir.join("ca.key"))
    );
    let pem = std::fs::read_to_string(&report.cert).expect("ca.pem");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(std::fs::read_to_string(&report.key)
        .expect("ca.key")
        .contains("PRIVATE KEY"));
    #[cfg(unix)]
    assert_eq!(mode(&report.key), 0o600);
    assert!(report.to_string().contains("CN=mesh cluster CA"), "{report}");

    let err = init(&dir, DEFAULT_CA_NAME, 3650, false)
        .expect_err("overwrite")
        .to_string();
    assert!(
        err.contains("ca.pem already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&report.cert).expect("ca.pem"),
        pem,
        "refusal must leave the CA alone"
    );
    init(&dir, "replacement CA", 10, true).expect("forced init");
    assert_ne!(std::fs::read_to_string(&report.cert).expect("ca.pem"), pem);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers.len(), 2, "temporary files left behind: {leftovers:?}");
}

#[test]
fn issue_writes_a_cert_and_a_private_key() {
    let tmp = TempDir::new().expect("temp dir");
    init(tmp.path(), DEFAULT_CA_NAME, 3650, false).expect("init");
    let mut req = LeafRequest::new("node-a", Role::Node);
    req.dns_names = vec!["node-a.cluster.example".into()];
    req.ip_addrs = vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))];
    let report = issue(tmp.path(), &req, false).expect("issue");
    assert_eq!(report.cert, tmp.path().join("node-a.pem"));
    assert_eq!(report.key, tmp.path().join("node-a.key"));
    assert_eq!(report.days, DEFAULT_LEAF_DAYS);
    #[cfg(unix)]
    assert_eq!(mode(&report.key), 0o600);
    let text = report.to_string();
    assert!(text.contains("(node certificate for 'node-a'"), "{text}");
    assert!(
        text.contains("SANs: DNS:node-a, DNS:node-a.cluster.example, IP:10.0.0.7, DNS:localhost, IP:127.0.0.1, IP:::1"),
        "{text}"
    );
    assert!(text.contains("--cluster-cert") && text.contains("node-a.pem"), "{text}");
    assert_eq!(report.sans.first(), Some(&San::Dns("node-a".into())));

    let err = issue(tmp.path(), &req, false).expect_err("overwrite").to_string();
    assert!(
        err.contains("node-a.pem already exists") && err.contains("--force"),
        "{err}"
    );
    issue(tmp.path(), &req, true).expect("forced re-issue");
}

#[test]
fn bad_names_and_a_missing_ca_are_refused() {
    for bad in [
        "",
        "a/b",
        "../x",
        ".hidden",
        "-rf",
        "ca",
        "CA",
        "node a",
        "nödé",
        &"x".repeat(64),
    ] {
        assert!(check_name(bad).is_err(), "{bad:?} accepted");
    }
    for good in ["node-a", "router_1", "n1.example", "10.0.0.7"] {
        check_name(good).expect(good);
    }
    let tmp = TempDir::new().expect("temp dir");
    let err = issue(tmp.path(), &LeafRequest::new("a/b", Role::Node), false)
        .expect_err("slash")
        .to_string();
    assert!(err.contains("'/'"), "{err}");
    let err = issue(tmp.path(), &LeafRequest::new("node-a", Role::Node), false)
        .expect_err("no CA")
        .to_string();
    assert!(err.contains("certs init"), "{err}");
    init(tmp.path(), DEFAULT_CA_NAME, 3650, false).expect("init");
    let bad_dns = LeafRequest {
        dns_names: vec!["not a name".into()],
        ..LeafRequest::new("node-a", Role::Node)
    };
    let err = issue(tmp.path(), &bad_dns, false).expect_err("bad dns").to_string();
    assert!(err.contains("not a valid DNS name"), "{err}");
    assert!(!tmp.path().join("node-a.pem").exists());
}

#[tokio::test]
async fn issued_files_complete_a_mutual_tls_handshake_on_loopback() {
    let tmp = TempDir::new().expect("temp dir");
    init(tmp.path(), DEFAULT_CA_NAME, 3650, false).expect("init");
    issue(tmp.path(), &LeafRequest::new("router", Role::Router), false).expect("router");
    issue(tmp.path(), &LeafRequest::new("node-a", Role::Node), false).expect("node");
    // A certificate from another CA's directory does not load against this CA.
    let other = TempDir::new().expect("temp dir");
    init(other.path(), "other CA", 3650, false).expect("other init");
    issue(other.path(), &LeafRequest::new("node-x", Role::Node), false).expect("other node");
    let foreign = TlsFiles::new(
        tmp.path().join("ca.pem"),
        other.path().join("node-x.pem"),
        other.path().join("node-x.key"),
    );
    let err = tls::client_crypto(&foreign).err().expect("foreign cert accepted");
    assert!(err.contains("not signed by the CA"), "{err}");

    let server = tls::server_crypto(&TlsFiles::in_dir(tmp.path(), "router")).expect("server crypto");
    let client = tls::client_crypto(&TlsFiles::in_dir(tmp.path(), "node-a")).expect("client crypto");
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let endpoint = quinn::Endpoint::server(quinn::ServerConfig::with_crypto(server), listen).expect("endpoint");
    let addr = endpoint.local_addr().expect("address");
    let serving = tokio::spawn(async move {
        let conn = endpoint
            .accept()
            .await
            .expect("incoming")
            .await
            .expect("server handshake");
        let (mut send, mut recv) = conn.accept_bi().await.expect("accept_bi");
        let got = recv.read_to_end(16).await.expect("server read");
        send.write_all(&got).await.expect("echo");
        send.finish().expect("finish");
        let peer = tls::peer_name(&conn);
        conn.closed().await;
        peer
    });
    let mut endpoint = quinn::Endpoint::client(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)).expect("client");
    endpoint.set_default_client_config(quinn::ClientConfig::new(client));
    let conn = endpoint
        .connect(addr, "localhost")
        .expect("connect")
        .await
        .expect("client handshake");
    let (mut send, mut recv) = conn.open_bi().await.expect("open_bi");
    send.write_all(b"hello").await.expect("write");
    send.finish().expect("finish");
    assert_eq!(recv.read_to_end(16).await.expect("read"), b"hello");
    assert_eq!(tls::peer_name(&conn).as_deref(), Some("router"));
    conn.close(0u32.into(), b"done");
    assert_eq!(serving.await.expect("server task").as_deref(), Some("node-a"));
}
