//! Tests of the cluster's TLS: real quinn handshakes on loopback, refusals, and the errors for bad files.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tempfile::TempDir;

use super::certs::{self, CertificateAuthority, LeafRequest, San};
use super::tls::{self, TlsFiles};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A CA and the certificates it issued, written as `mesh-ops certs` lays them out.
struct Pki {
    dir: TempDir,
}

impl Pki {
    /// A CA named `ca_name` with a certificate for each of `names`.
    fn new(ca_name: &str, names: &[&str]) -> Self {
        let dir = TempDir::new().expect("temp dir");
        let ca = CertificateAuthority::generate(ca_name, 30).expect("CA");
        write(dir.path(), "ca.pem", ca.cert_pem());
        write(dir.path(), "ca.key", ca.key_pem());
        for name in names {
            let leaf = ca.issue(&LeafRequest::new(*name)).expect("leaf");
            write(dir.path(), &format!("{name}.pem"), &leaf.cert_pem);
            write(dir.path(), &format!("{name}.key"), &leaf.key_pem);
        }
        Self { dir }
    }

    fn files(&self, name: &str) -> TlsFiles {
        TlsFiles::in_dir(self.dir.path(), name)
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).expect("write");
}

/// What each side saw of one connection attempt.
#[derive(Debug)]
struct Outcome {
    /// The server: the client's certificate name, or the error.
    server: Result<Option<String>, String>,
    /// The client: the server's answer and certificate name, or the error.
    client: Result<(Vec<u8>, Option<String>), String>,
}

/// One server, one client dialing `server_name`; the client sends "ping" on a bi stream, the server answers "pong".
async fn exchange(server: Arc<QuicServerConfig>, client: Arc<QuicClientConfig>, server_name: &str) -> Outcome {
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let endpoint = quinn::Endpoint::server(quinn::ServerConfig::with_crypto(server), listen).expect("server endpoint");
    let addr = endpoint.local_addr().expect("server address");
    let serving = tokio::spawn(async move {
        let incoming = endpoint.accept().await.ok_or("endpoint closed")?;
        let conn = incoming.await.map_err(|e| format!("accept: {e}"))?;
        let name = tls::peer_name(&conn);
        let (mut send, mut recv) = conn.accept_bi().await.map_err(|e| format!("accept_bi: {e}"))?;
        let got = recv.read_to_end(64).await.map_err(|e| format!("server read: {e}"))?;
        if got != b"ping" {
            return Err(format!("server got {got:?}"));
        }
        send.write_all(b"pong")
            .await
            .map_err(|e| format!("server write: {e}"))?;
        send.finish().map_err(|e| format!("server finish: {e}"))?;
        conn.closed().await;
        Ok::<_, String>(name)
    });
    let client_side = async {
        let mut endpoint = quinn::Endpoint::client(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
            .map_err(|e| format!("client endpoint: {e}"))?;
        endpoint.set_default_client_config(quinn::ClientConfig::new(client));
        let conn = endpoint
            .connect(addr, server_name)
            .map_err(|e| format!("connect: {e}"))?
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let name = tls::peer_name(&conn);
        let alpn = conn
            .handshake_data()
            .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|data| data.protocol);
        if alpn.as_deref() != Some(tls::ALPN) {
            return Err(format!("ALPN {alpn:?}"));
        }
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| format!("open_bi: {e}"))?;
        send.write_all(b"ping")
            .await
            .map_err(|e| format!("client write: {e}"))?;
        send.finish().map_err(|e| format!("client finish: {e}"))?;
        let answer = recv.read_to_end(64).await.map_err(|e| format!("client read: {e}"))?;
        conn.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
        Ok::<_, String>((answer, name))
    };
    let client = tokio::time::timeout(TIMEOUT, client_side)
        .await
        .unwrap_or_else(|_| Err("client timed out".into()));
    let server = match tokio::time::timeout(TIMEOUT, serving).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(format!("server task: {join}")),
        Err(_) => Err("server timed out".into()),
    };
    let out = Outcome { server, client };
    for err in [out.server.as_ref().err(), out.client.as_ref().err()]
        .into_iter()
        .flatten()
    {
        assert!(
            !err.contains("timed out"),
            "a refusal must be prompt, not a timeout: {out:?}"
        );
    }
    out
}

#[tokio::test]
async fn ca_signed_certificates_on_both_sides_connect_and_exchange_bytes() {
    let pki = Pki::new("test CA", &["router", "node-a"]);
    let server = tls::server_crypto(&pki.files("router")).expect("server crypto");
    let client = tls::client_crypto(&pki.files("node-a")).expect("client crypto");
    for dial in ["localhost", "127.0.0.1", "router"] {
        let out = exchange(server.clone(), client.clone(), dial).await;
        assert_eq!(
            out.client,
            Ok((b"pong".to_vec(), Some("router".to_string()))),
            "dialing {dial}"
        );
        assert_eq!(out.server, Ok(Some("node-a".to_string())), "dialing {dial}");
    }
}

#[tokio::test]
async fn client_with_a_certificate_from_another_ca_is_refused() {
    let pki = Pki::new("test CA", &["router"]);
    let other = Pki::new("other CA", &["intruder"]);
    // The intruder trusts the real CA (it knows whom it dials) but its own cert comes from another CA.
    let files = TlsFiles::new(
        pki.path("ca.pem"),
        other.path("intruder.pem"),
        other.path("intruder.key"),
    );
    // Loading refuses it too; build the config the way a careless client would, without that check.
    let err = tls::client_crypto(&files).err().expect("mismatched chain accepted");
    assert!(err.contains("is not signed by the CA"), "{err}");
    let client = raw_client(
        &pki.path("ca.pem"),
        Some((&other.path("intruder.pem"), &other.path("intruder.key"))),
    );
    let out = exchange(
        tls::server_crypto(&pki.files("router")).expect("server"),
        client,
        "localhost",
    )
    .await;
    let err = out.server.expect_err("server accepted a foreign client");
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(out.client.is_err(), "client exchanged bytes: {:?}", out.client);
}

#[tokio::test]
async fn client_without_a_certificate_is_refused() {
    let pki = Pki::new("test CA", &["router"]);
    let server = tls::server_crypto(&pki.files("router")).expect("server");
    let client = raw_client(&pki.path("ca.pem"), None);
    let out = exchange(server.clone(), client, "localhost").await;
    let err = out.server.expect_err("server accepted a client without a certificate");
    assert!(err.contains("no certificates"), "{err}");
    assert!(out.client.is_err(), "{:?}", out.client);
    let out = exchange(
        server,
        tls::insecure_client_crypto().expect("insecure client"),
        "localhost",
    )
    .await;
    let err = out.server.expect_err("server accepted an insecure client");
    assert!(err.contains("no certificates"), "{err}");
    assert!(out.client.is_err(), "{:?}", out.client);
}

#[tokio::test]
async fn server_certificate_from_another_ca_is_rejected_by_the_client() {
    let pki = Pki::new("test CA", &["node-a"]);
    let other = Pki::new("other CA", &["router"]);
    let server = tls::server_crypto(&other.files("router")).expect("server");
    let out = exchange(
        server,
        tls::client_crypto(&pki.files("node-a")).expect("client"),
        "localhost",
    )
    .await;
    let err = out.client.expect_err("client trusted a foreign server");
    assert!(err.contains("handshake") && err.contains("UnknownIssuer"), "{err}");
    assert!(out.server.is_err(), "{:?}", out.server);
}

#[tokio::test]
async fn server_name_outside_the_certificate_is_rejected() {
    let pki = Pki::new("test CA", &["router", "node-a"]);
    let server = tls::server_crypto(&pki.files("router")).expect("server");
    let out = exchange(
        server,
        tls::client_crypto(&pki.files("node-a")).expect("client"),
        "elsewhere.example",
    )
    .await;
    let err = out.client.expect_err("client accepted a certificate for another name");
    assert!(err.contains("not valid for name"), "{err}");
}

#[tokio::test]
async fn insecure_mode_connects() {
    let server = tls::insecure_server_crypto().expect("insecure server");
    let client = tls::insecure_client_crypto().expect("insecure client");
    let out = exchange(server, client, "localhost").await;
    assert_eq!(out.client.map(|(answer, _)| answer), Ok(b"pong".to_vec()));
    assert_eq!(out.server, Ok(None));
}

/// A client that trusts `ca` and presents `cert` (or nothing), built without mesh's file checks.
fn raw_client(ca: &Path, cert: Option<(&Path, &Path)>) -> Arc<QuicClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for der in certs::load_certs(ca, "CA certificate").expect("CA") {
        roots.add(der).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots);
    let mut config = match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                certs::load_certs(cert, "certificate").expect("cert"),
                certs::load_key(key).expect("key"),
            )
            .expect("client auth"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![tls::ALPN.to_vec()];
    Arc::new(QuicClientConfig::try_from(config).expect("QUIC client"))
}

fn server_err(files: &TlsFiles) -> String {
    tls::server_crypto(files).err().expect("bad files accepted")
}

#[test]
fn bad_files_give_clear_errors() {
    let pki = Pki::new("test CA", &["router", "node-a"]);
    let good = pki.files("router");
    let missing = TlsFiles {
        ca: pki.path("nope.pem"),
        ..good.clone()
    };
    let err = server_err(&missing);
    assert!(err.contains("nope.pem") && err.contains("cannot read"), "{err}");

    write(pki.dir.path(), "junk.pem", "hello, not PEM\n");
    let err = server_err(&TlsFiles {
        cert: pki.path("junk.pem"),
        ..good.clone()
    });
    assert!(err.contains("junk.pem") && err.contains("not a PEM file"), "{err}");
    let err = tls::client_crypto(&TlsFiles {
        key: pki.path("junk.pem"),
        ..good.clone()
    })
    .err()
    .expect("junk key");
    assert!(err.contains("junk.pem") && err.contains("not a PEM file"), "{err}");

    let err = server_err(&TlsFiles {
        cert: pki.path("router.key"),
        ..good.clone()
    });
    assert!(err.contains("router.key") && err.contains("no CERTIFICATE"), "{err}");
    let err = server_err(&TlsFiles {
        key: pki.path("router.pem"),
        ..good.clone()
    });
    assert!(err.contains("router.pem") && err.contains("no PRIVATE KEY"), "{err}");

    let err = server_err(&TlsFiles {
        key: pki.path("node-a.key"),
        ..good.clone()
    });
    assert!(
        err.contains("node-a.key") && err.contains("does not match") && err.contains("router.pem"),
        "{err}"
    );

    let err = server_err(&TlsFiles {
        ca: pki.path("node-a.pem"),
        ..good.clone()
    });
    assert!(
        err.contains("node-a.pem") && err.contains("not a CA certificate"),
        "{err}"
    );

    let other = Pki::new("other CA", &[]);
    let err = server_err(&TlsFiles {
        ca: other.path("ca.pem"),
        ..good.clone()
    });
    assert!(
        err.contains("router.pem") && err.contains("not signed by the CA") && err.contains("other CA"),
        "{err}"
    );

    assert!(tls::server_crypto(&good).is_ok());
}

#[test]
fn flags_come_all_three_or_none() {
    assert_eq!(TlsFiles::from_flags(None, None, None), Ok(None));
    let all = TlsFiles::from_flags(Some("a".into()), Some("b".into()), Some("c".into()));
    assert_eq!(all, Ok(Some(TlsFiles::new("a", "b", "c"))));
    let err = TlsFiles::from_flags(Some("a".into()), None, None).expect_err("partial");
    assert!(err.contains("--cluster-cert, --cluster-key"), "{err}");
}

#[test]
fn leaf_sans_default_to_name_and_loopback() {
    let ca = CertificateAuthority::generate("test CA", 1).expect("CA");
    let mut req = LeafRequest::new("node-a");
    req.dns_names = vec!["node-a.example".into(), "*.pool.example".into(), "localhost".into()];
    req.ip_addrs = vec!["10.0.0.7".parse().expect("ip")];
    let leaf = ca.issue(&req).expect("leaf");
    let expected: Vec<String> = [
        "DNS:node-a",
        "DNS:node-a.example",
        "DNS:*.pool.example",
        "DNS:localhost",
        "IP:10.0.0.7",
        "IP:127.0.0.1",
        "IP:::1",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(leaf.sans.iter().map(San::to_string).collect::<Vec<_>>(), expected);
    assert_eq!(certs::sans_of_pem(&leaf.cert_pem), Ok(leaf.sans.clone()));
    // A name that is no DNS name is only the common name; an IP name is an IP SAN.
    let sans = LeafRequest::new("node_1 x").subject_alt_names().expect("sans");
    assert_eq!(sans.first(), Some(&San::Dns("localhost".into())));
    let sans = LeafRequest::new("10.1.2.3").subject_alt_names().expect("sans");
    assert_eq!(sans.first(), Some(&San::Ip("10.1.2.3".parse().expect("ip"))));
    let bad = LeafRequest {
        dns_names: vec!["bad name".into()],
        ..LeafRequest::new("n")
    };
    assert!(ca
        .issue(&bad)
        .expect_err("bad dns")
        .contains("'bad name' is not a valid DNS name"));
    let zero = LeafRequest {
        days: 0,
        ..LeafRequest::new("n")
    };
    assert!(ca.issue(&zero).expect_err("zero days").contains("out of range"));
}

#[test]
fn a_loaded_ca_issues_certificates_that_verify() {
    let pki = Pki::new("test CA", &[]);
    let ca = CertificateAuthority::load(&pki.path("ca.pem"), &pki.path("ca.key")).expect("load CA");
    assert_eq!(ca.subject(), "CN=test CA, O=mesh cluster");
    let leaf = ca.issue(&LeafRequest::new("later")).expect("leaf");
    write(pki.dir.path(), "later.pem", &leaf.cert_pem);
    write(pki.dir.path(), "later.key", &leaf.key_pem);
    assert!(tls::client_crypto(&pki.files("later")).is_ok());
    // A CA key that is not the CA's.
    let other = CertificateAuthority::generate("other", 1).expect("other");
    write(pki.dir.path(), "other.key", other.key_pem());
    let err = CertificateAuthority::load(&pki.path("ca.pem"), &pki.path("other.key")).expect_err("wrong key");
    assert!(err.contains("does not belong"), "{err}");
    let err = CertificateAuthority::load(&pki.path("later.pem"), &pki.path("later.key")).expect_err("leaf as CA");
    assert!(err.contains("not a CA certificate"), "{err}");
}
