//! Tests of reloading: the watcher driven by hand (bad files keep what is in force), and real QUIC links on
//! loopback that are refused, cut and served with renewed certificates while the endpoints run.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quinn::{Connection, ConnectionError, Endpoint};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tempfile::TempDir;

use super::{node_client, peer_cert, server_crypto, watch_server, Side, Sources, Watch, Watcher};
use crate::cluster::certs::{CertificateAuthority, LeafRequest, Role};
use crate::cluster::crl::{Entry, Reason, Serial};
use crate::cluster::tls::{self, TlsFiles};
use crate::cluster::transport::{self, close, Tuning};

/// A CA directory laid out as `mesh-ops certs` lays it out.
struct Pki {
    dir: TempDir,
    ca: CertificateAuthority,
}

impl Pki {
    fn new() -> Pki {
        let dir = TempDir::new().expect("temp dir");
        let ca = CertificateAuthority::generate("test CA", 2).expect("CA");
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).expect("ca.pem");
        Pki { dir, ca }
    }

    /// Issues NAME.pem and NAME.key (the key first, as `mesh-ops certs issue` writes them).
    fn issue(&self, name: &str, role: Role, lifetime: Option<Duration>) -> TlsFiles {
        let leaf = self
            .ca
            .issue(&LeafRequest {
                lifetime,
                ..LeafRequest::new(name, role)
            })
            .expect("leaf");
        let files = TlsFiles::in_dir(self.dir.path(), name);
        replace(&files.key, &leaf.key_pem);
        replace(&files.cert, &leaf.cert_pem);
        files
    }

    fn serial(&self, name: &str) -> Serial {
        let pem = std::fs::read(self.dir.path().join(format!("{name}.pem"))).expect("cert");
        let der = CertificateDer::from_pem_slice(&pem).expect("pem");
        Serial::of_cert(&der).expect("serial")
    }

    /// Writes crl.pem beside the CA revoking the current certificates of `names`.
    fn revoke(&self, names: &[&str], number: u64) {
        let entries: Vec<Entry> = names
            .iter()
            .map(|n| Entry {
                serial: self.serial(n),
                revoked_at: std::time::SystemTime::now(),
                reason: Some(Reason::KeyCompromise),
            })
            .collect();
        let pem = self
            .ca
            .sign_crl(number, &entries, Duration::from_secs(3600))
            .expect("crl");
        replace(&self.crl(), &pem);
    }

    fn crl(&self) -> std::path::PathBuf {
        self.dir.path().join("crl.pem")
    }
}

/// Replaces a file through a rename, as the tools do.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn tuning() -> Arc<quinn::TransportConfig> {
    transport::transport_config(&Tuning {
        keep_alive: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(3000),
    })
    .expect("transport")
}

/// A node's watcher, driven by hand.
fn node_watcher(files: TlsFiles) -> (Watcher, super::LiveClient) {
    let sources = Sources::new(files, None);
    let (client, name) = node_client(&sources).expect("node client");
    let side = Side::Node {
        client: client.clone(),
        name,
    };
    (
        Watcher::new(sources, side, Box::new(Vec::new)).expect("watcher"),
        client,
    )
}

#[test]
fn a_bad_revocation_list_on_reload_keeps_the_one_in_force() {
    let pki = Pki::new();
    pki.issue("router", Role::Router, None);
    let (mut w, _) = node_watcher(pki.issue("node-a", Role::Node, None));
    assert!(w.revoked.is_empty());
    pki.revoke(&["router"], 1);
    w.poll(false);
    assert_eq!(
        w.revoked.get(&pki.serial("router")).map(|e| e.reason),
        Some(Some(Reason::KeyCompromise))
    );

    replace(&pki.crl(), "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n");
    w.poll(false);
    assert!(w.failed[1].is_some(), "the first failure waits one more look");
    w.poll(false);
    assert!(
        w.failed[1].is_none() && w.seen[1] == super::stamp(&[&pki.crl()]),
        "warned and left alone"
    );
    assert_eq!(w.revoked.len(), 1, "the list in force stays");
    // A list of another CA is refused the same way; so is a vanished file.
    let other = CertificateAuthority::generate("other CA", 1).expect("other");
    replace(&pki.crl(), &other.sign_crl(9, &[], Duration::from_secs(60)).unwrap());
    w.poll(true);
    assert_eq!((w.revoked.len(), w.crls[0].number), (1, Some(1)));
    std::fs::remove_file(pki.crl()).expect("remove");
    w.poll(false);
    assert_eq!(w.revoked.len(), 1, "a removed list does not reinstate anyone");
    // A good list again is taken.
    pki.revoke(&[], 2);
    w.poll(false);
    assert_eq!((w.revoked.len(), w.crls[0].number), (0, Some(2)));
}

#[test]
fn a_renewed_key_waits_for_its_certificate_and_a_node_keeps_its_name() {
    let pki = Pki::new();
    let files = pki.issue("node-a", Role::Node, None);
    let (mut w, _client) = node_watcher(files.clone());
    let first = pki.serial("node-a");
    // The new key is written first: with the old certificate it does not match, so nothing changes yet.
    let leaf = pki.ca.issue(&LeafRequest::new("node-a", Role::Node)).expect("leaf");
    replace(&files.key, &leaf.key_pem);
    w.poll(false);
    assert!(w.failed[0].is_some());
    assert_eq!(Serial::of_cert(&w.loaded.chain[0]).unwrap(), first);
    replace(&files.cert, &leaf.cert_pem);
    w.poll(false);
    assert!(w.failed[0].is_none());
    assert_ne!(
        Serial::of_cert(&w.loaded.chain[0]).unwrap(),
        first,
        "the renewed certificate is in force"
    );

    // A certificate for another name is refused: a node's name cannot change while it runs.
    let other = pki.ca.issue(&LeafRequest::new("node-b", Role::Node)).expect("leaf");
    replace(&files.key, &other.key_pem);
    replace(&files.cert, &other.cert_pem);
    w.poll(true);
    assert_eq!(w.loaded.name, "node-a");
}

#[test]
fn start_uses_crl_pem_beside_the_ca_and_refuses_a_malformed_or_missing_given_list() {
    let pki = Pki::new();
    let files = pki.issue("router", Role::Router, None);
    let beside = Sources::new(files.clone(), None);
    assert_eq!((beside.crl.clone(), beside.crl_given), (pki.crl(), false));
    server_crypto(&beside).expect("no list yet: nothing revoked");
    let given = Sources::new(files.clone(), Some(pki.dir.path().join("elsewhere.pem")));
    let err = server_crypto(&given).err().expect("a given list must exist");
    assert!(
        err.contains("elsewhere.pem: cannot read") && err.contains("--cluster-crl"),
        "{err}"
    );
    std::fs::write(pki.crl(), "junk").expect("write");
    let err = server_crypto(&beside).err().expect("malformed");
    assert!(
        err.contains("crl.pem: not a PEM file") && err.contains("beside --cluster-ca"),
        "{err}"
    );
    pki.revoke(&["router"], 1);
    server_crypto(&beside).expect("a good list");
}

/// A router endpoint on loopback that echoes one stream per connection and keeps the connections it accepted.
struct Server {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<(String, Connection)>>>,
    _watch: Watch,
    _endpoint: Endpoint,
}

fn serve(files: TlsFiles) -> Server {
    let sources = Sources::new(files, None);
    let mut config = quinn::ServerConfig::with_crypto(server_crypto(&sources).expect("server crypto"));
    config.transport_config(tuning());
    let endpoint =
        transport::endpoint(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), Some(config.clone())).expect("endpoint");
    let conns: Arc<Mutex<Vec<(String, Connection)>>> = Arc::default();
    let listed = conns.clone();
    let watch = watch_server(sources, &endpoint, config, move || listed.lock().unwrap().clone()).expect("watch");
    let (accepting, kept) = (endpoint.clone(), conns.clone());
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            // As the router does: an address not yet validated gets a stateless Retry first.
            if !incoming.remote_address_validated() && incoming.may_retry() {
                let _ = incoming.retry();
                continue;
            }
            let kept = kept.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                kept.lock()
                    .unwrap()
                    .push((tls::peer_name(&conn).unwrap_or_default(), conn.clone()));
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let got = recv.read_to_end(64).await.unwrap_or_default();
                    let _ = send.write_all(&got).await;
                    let _ = send.finish();
                }
            });
        }
    });
    Server {
        addr: endpoint.local_addr().expect("address"),
        conns,
        _watch: watch,
        _endpoint: endpoint,
    }
}

/// Dials `to` and exchanges one stream: the connection when the peer took it, else why not.
async fn dial(config: quinn::ClientConfig, to: SocketAddr) -> Result<Connection, String> {
    let endpoint = Endpoint::client(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).expect("client endpoint");
    let attempt = async {
        let conn = endpoint
            .connect_with(config, to, "localhost")
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        match ping(&conn).await {
            Ok(()) => Ok(conn),
            // A client may finish its side of the handshake before the server has checked its certificate: the
            // server's refusal then closes the connection, and its reason is the answer.
            Err(e) => match tokio::time::timeout(Duration::from_secs(2), conn.closed()).await {
                Ok(reason) => Err(reason.to_string()),
                Err(_) => Err(e),
            },
        }
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .unwrap_or_else(|_| Err("no answer in 10 s".into()))
}

async fn ping(conn: &Connection) -> Result<(), String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let _ = send.finish();
    match recv.read_to_end(64).await {
        Ok(b) if b == b"ping" => Ok(()),
        Ok(b) => Err(format!("answered {b:?}")),
        Err(e) => Err(e.to_string()),
    }
}

fn client_of(files: &TlsFiles) -> quinn::ClientConfig {
    let mut c = quinn::ClientConfig::new(tls::client_crypto(files).expect("client crypto"));
    c.transport_config(tuning());
    c
}

/// The application close (code, reason) of `conn`, within 30 s.
async fn app_close(conn: &Connection) -> (u32, String) {
    match tokio::time::timeout(Duration::from_secs(30), conn.closed()).await {
        Ok(ConnectionError::ApplicationClosed(c)) => (
            u32::try_from(c.error_code.into_inner()).unwrap_or(u32::MAX),
            String::from_utf8_lossy(&c.reason).into_owned(),
        ),
        other => panic!("expected an application close, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_cuts_and_refuses_a_revoked_node_and_serves_a_renewed_certificate() {
    let pki = Pki::new();
    let server = serve(pki.issue("router", Role::Router, Some(Duration::from_secs(3600))));
    let (a_files, b_files) = (
        pki.issue("node-a", Role::Node, None),
        pki.issue("node-b", Role::Node, None),
    );
    let a = dial(client_of(&a_files), server.addr).await.expect("node-a joins");
    let b = dial(client_of(&b_files), server.addr).await.expect("node-b joins");

    pki.revoke(&["node-a"], 1);
    let (code, reason) = app_close(&a).await;
    assert_eq!(code, close::REVOKED, "{reason}");
    assert!(
        reason.contains("certificate 'node-a'") && reason.contains("was revoked") && reason.contains("key-compromise"),
        "{reason}"
    );
    let refused = dial(client_of(&a_files), server.addr)
        .await
        .expect_err("the revoked certificate again");
    assert!(refused.to_lowercase().contains("revoked"), "{refused}");
    assert!(b.close_reason().is_none(), "node-b's link was cut");
    ping(&b).await.expect("node-b's link still carries streams");

    // A renewed router certificate: new connections get it, the live one stays.
    let old = pki.serial("router");
    pki.issue("router", Role::Router, Some(Duration::from_secs(7200)));
    let new = pki.serial("router");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = dial(client_of(&b_files), server.addr)
            .await
            .expect("node-b dials again");
        let shown = peer_cert(&c).expect("router certificate").serial;
        if shown == new {
            break;
        }
        assert_eq!(shown, old);
        assert!(
            Instant::now() < deadline,
            "the renewed router certificate was not served in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(b.close_reason().is_none(), "a renewed certificate cut a live link");
    ping(&b).await.expect("node-b's first link still works");
    assert_eq!(
        server
            .conns
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == "node-a")
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drops_and_refuses_a_router_whose_certificate_is_revoked() {
    let pki = Pki::new();
    let server = serve(pki.issue("router", Role::Router, None));
    let sources = Sources::new(pki.issue("node-a", Role::Node, None), None);
    let (mut client, _) = node_client(&sources).expect("node client");
    client.transport_config(tuning());
    let link = dial(client.current(), server.addr).await.expect("joins");
    let listed = Arc::new(Mutex::new(vec![("router".to_string(), link.clone())]));
    let list = listed.clone();
    let _watch = client
        .watch(move || list.lock().unwrap().clone())
        .expect("watch")
        .expect("watching");

    pki.revoke(&["router"], 1);
    let closed = tokio::time::timeout(Duration::from_secs(30), link.closed())
        .await
        .expect("the node cut the link");
    assert!(matches!(closed, ConnectionError::LocallyClosed), "{closed:?}");
    let refused = dial(client.current(), server.addr)
        .await
        .expect_err("the next dial refuses the router");
    assert!(refused.to_lowercase().contains("revoked"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_is_cut_when_its_peer_certificate_expires() {
    let pki = Pki::new();
    let server = serve(pki.issue("router", Role::Router, None));
    let short = pki.issue("node-s", Role::Node, Some(Duration::from_secs(6)));
    let long = pki.issue("node-l", Role::Node, None);
    // Built now: once the certificate has expired, its files no longer load.
    let short_client = client_of(&short);
    let s = dial(short_client.clone(), server.addr)
        .await
        .expect("a short-lived certificate joins");
    let l = dial(client_of(&long), server.addr).await.expect("joins");
    let (code, reason) = app_close(&s).await;
    assert_eq!(code, close::EXPIRED, "{reason}");
    assert!(
        reason.contains("certificate 'node-s'") && reason.contains("expired on"),
        "{reason}"
    );
    let refused = dial(short_client, server.addr).await.expect_err("expired");
    assert!(refused.to_lowercase().contains("expired"), "{refused}");
    assert!(l.close_reason().is_none());
}

/// A UDP relay on loopback between one client and `to`: the client's first datagram and every answer pass at
/// once; the client's later datagrams wait until `release` is sent.
async fn holding_relay(to: SocketAddr) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let front = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("relay front");
    let back = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("relay back");
    back.connect(to).await.expect("relay to server");
    let addr = front.local_addr().expect("relay address");
    let (release, mut released) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut client, mut sent, mut held, mut open) = (None, 0usize, Vec::new(), false);
        let (mut a, mut b) = ([0u8; 2048], [0u8; 2048]);
        loop {
            tokio::select! {
                got = front.recv_from(&mut a) => {
                    let Ok((n, from)) = got else { return };
                    client = Some(from);
                    sent += 1;
                    if open || sent == 1 {
                        let _ = back.send(&a[..n]).await;
                    } else {
                        held.push(a[..n].to_vec());
                    }
                }
                got = back.recv(&mut b) => {
                    let Ok(n) = got else { return };
                    if let Some(c) = client {
                        let _ = front.send_to(&b[..n], c).await;
                    }
                }
                _ = &mut released, if !open => {
                    open = true;
                    for d in held.drain(..) {
                        let _ = back.send(&d).await;
                    }
                }
            }
        }
    });
    (addr, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_retried_before_a_renewal_is_served_after_it() {
    let pki = Pki::new();
    let server = serve(pki.issue("router", Role::Router, None));
    let files = pki.issue("node-a", Role::Node, None);
    // The client gets its Retry (a token under the key in force now); its second Initial is held.
    let (relay, release) = holding_relay(server.addr).await;
    let mut slow = quinn::ClientConfig::new(tls::client_crypto(&files).expect("client crypto"));
    slow.transport_config(
        transport::transport_config(&Tuning {
            keep_alive: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(20),
        })
        .expect("transport"),
    );
    let held = tokio::spawn(dial(slow, relay));

    // The router's certificate is renewed and the new one served to new clients.
    let old = pki.serial("router");
    pki.issue("router", Role::Router, Some(Duration::from_secs(7200)));
    let new = pki.serial("router");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = dial(client_of(&files), server.addr).await.expect("dials directly");
        if peer_cert(&c).expect("router certificate").serial == new {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The held Initial carries a token of the old config: a renewal keeps the token key, so it is taken.
    release.send(()).expect("relay runs");
    let conn = held
        .await
        .expect("dial task")
        .expect("the client retried before the renewal is served");
    let shown = peer_cert(&conn).expect("router certificate").serial;
    assert!(shown == new || shown == old, "an unknown certificate");
}
