//! Tests of the cluster's TLS: real quinn handshakes on loopback, refusals, and the errors for bad files.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tempfile::TempDir;

use super::certs::{self, CertificateAuthority, LeafRequest, San};
use super::identity::{Identity, Role};
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
            let leaf = ca.issue(&LeafRequest::new(*name, role_of(name))).expect("leaf");
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

/// The role the tests give a name: `router…` is a router, `server…` a server, `client…` a client, the rest nodes.
fn role_of(name: &str) -> Role {
    [Role::Router, Role::Server, Role::Client]
        .into_iter()
        .find(|r| name.starts_with(r.as_str()))
        .unwrap_or(Role::Node)
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
    let mut req = LeafRequest::new("node-a", Role::Node);
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
    let sans = LeafRequest::new("node_1 x", Role::Node)
        .subject_alt_names()
        .expect("sans");
    assert_eq!(sans.first(), Some(&San::Dns("localhost".into())));
    let sans = LeafRequest::new("10.1.2.3", Role::Node)
        .subject_alt_names()
        .expect("sans");
    assert_eq!(sans.first(), Some(&San::Ip("10.1.2.3".parse().expect("ip"))));
    let bad = LeafRequest {
        dns_names: vec!["bad name".into()],
        ..LeafRequest::new("n", Role::Node)
    };
    assert!(ca
        .issue(&bad)
        .expect_err("bad dns")
        .contains("'bad name' is not a valid DNS name"));
    let zero = LeafRequest {
        days: 0,
        ..LeafRequest::new("n", Role::Node)
    };
    assert!(ca.issue(&zero).expect_err("zero days").contains("out of range"));
}

#[test]
fn a_loaded_ca_issues_certificates_that_verify() {
    let pki = Pki::new("test CA", &[]);
    let ca = CertificateAuthority::load(&pki.path("ca.pem"), &pki.path("ca.key")).expect("load CA");
    assert_eq!(ca.subject(), "CN=test CA, O=mesh cluster");
    let leaf = ca.issue(&LeafRequest::new("later", Role::Node)).expect("leaf");
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

/// A server that serves `cert` and asks clients for a certificate of `ca`, built without mesh's role checks.
fn raw_server(ca: &Path, cert: &Path, key: &Path) -> Arc<QuicServerConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for der in certs::load_certs(ca, "CA certificate").expect("CA") {
        roots.add(der).expect("root");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), tls::provider())
        .build()
        .expect("verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs::load_certs(cert, "certificate").expect("cert"),
            certs::load_key(key).expect("key"),
        )
        .expect("server cert");
    config.alpn_protocols = vec![tls::ALPN.to_vec()];
    Arc::new(QuicServerConfig::try_from(config).expect("QUIC server"))
}

#[test]
fn each_side_refuses_to_start_with_a_certificate_of_the_wrong_role() {
    let pki = Pki::new("test CA", &["router", "node-a", "server-x"]);
    let err = server_err(&pki.files("node-a"));
    assert!(
        err.contains("node-a.pem") && err.contains("is a node certificate; only a router certificate may serve"),
        "{err}"
    );
    assert!(err.contains("--role router"), "{err}");
    let err = tls::client_crypto(&pki.files("router"))
        .err()
        .expect("router cert as a node");
    assert!(
        err.contains("is a router certificate; only a node certificate may join"),
        "{err}"
    );
    let err = server_err(&pki.files("server-x"));
    assert!(err.contains("is a server certificate"), "{err}");
    let named = tls::node_crypto(&pki.files("node-a")).map(|(_, name)| name);
    assert_eq!(named, Ok("node-a".to_string()));
}

#[test]
fn identities_name_the_holder_its_role_and_its_key() {
    let ca = CertificateAuthority::generate("test CA", 1).expect("CA");
    let der = |pem: &str| certs_der(pem);
    let a = ca.issue(&LeafRequest::new("node-a", Role::Node)).expect("leaf");
    let again = ca.issue(&LeafRequest::new("node-a", Role::Node)).expect("leaf");
    let id = Identity::of(&der(&a.cert_pem)).expect("identity");
    assert_eq!((id.name.as_str(), id.role), ("node-a", Some(Role::Node)));
    assert_eq!(Identity::of(&der(&a.cert_pem)).expect("identity").key, id.key, "stable");
    let other = Identity::of(&der(&again.cert_pem)).expect("identity");
    assert_eq!(other.name, id.name);
    assert_ne!(other.key, id.key, "a re-issued certificate has a fresh key");
    // A certificate without a role (the CA's own here, as one issued before roles would be) is refused.
    let legacy = Identity::of(&der(ca.cert_pem())).expect("identity");
    assert_eq!(legacy.role, None);
    let err = legacy.require(Role::Node).expect_err("no role");
    assert!(
        err.contains("carries no mesh role") && err.contains("--role node --force"),
        "{err}"
    );
    assert_eq!("router".parse::<Role>(), Ok(Role::Router));
    assert!("admin"
        .parse::<Role>()
        .expect_err("unknown")
        .contains("one of: router, node, server, client"));
}

fn certs_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("PEM")
        .as_ref()
        .to_vec()
}

#[tokio::test]
async fn a_node_certificate_serving_as_a_router_is_refused_by_the_node() {
    let pki = Pki::new("test CA", &["node-a", "node-b"]);
    // node-b pretends to be the router with its own (node) certificate.
    let server = raw_server(&pki.path("ca.pem"), &pki.path("node-b.pem"), &pki.path("node-b.key"));
    let out = exchange(
        server,
        tls::client_crypto(&pki.files("node-a")).expect("client"),
        "localhost",
    )
    .await;
    let err = out.client.expect_err("a node trusted a node certificate as its router");
    assert!(
        err.contains("certificate 'node-b' is a node certificate; only a router certificate may serve"),
        "{err}"
    );
    assert!(out.server.is_err(), "{:?}", out.server);
}

#[tokio::test]
async fn a_router_certificate_joining_as_a_node_is_refused_by_the_router() {
    let pki = Pki::new("test CA", &["router", "router-2"]);
    // router-2 dials the router with its router certificate, as if it were a node.
    let client = raw_client(
        &pki.path("ca.pem"),
        Some((&pki.path("router-2.pem"), &pki.path("router-2.key"))),
    );
    let out = exchange(
        tls::server_crypto(&pki.files("router")).expect("server"),
        client,
        "localhost",
    )
    .await;
    let err = out.server.expect_err("the router let a router certificate join");
    assert!(
        err.contains("certificate 'router-2' is a router certificate; only a node certificate may join"),
        "{err}"
    );
    assert!(out.client.is_err(), "{:?}", out.client);
}
