//! Reloads a cluster member's TLS files while it runs: a renewed certificate and key, a changed CA bundle and a new
//! revocation list are read when their content changes (polled every second) and on SIGHUP. New connections use
//! them (the router's server config, swapped with `Endpoint::set_server_config`; a node's next dial, through
//! [`LiveClient`]); live links whose peer certificate is now revoked or expired are cut ([`super::revocation`]
//! decides which). A file that cannot be used is a warning, and what was in force stays in force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, TransportConfig, VarInt};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::crl::{self, Crl, Serial};
use super::identity::Role;
use super::revocation::{self, PeerCert, Revoked};
use super::tls::{self, Loaded, TlsFiles};
use crate::sync::ReadWrite;

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(1);
/// The revocation list's file name beside the CA certificate, used when `--cluster-crl` is not given.
pub const CRL_BESIDE_CA: &str = "crl.pem";

/// A member's TLS files: the three of [`TlsFiles`] and the revocation list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sources {
    pub files: TlsFiles,
    /// The revocation list's path.
    pub crl: PathBuf,
    /// Whether `crl` was given (`--cluster-crl`: it must exist at start) or is the default beside the CA (used
    /// when it exists; one written there later is picked up).
    pub crl_given: bool,
}

impl Sources {
    /// `crl` when given, else `crl.pem` in the CA certificate's directory.
    pub fn new(files: TlsFiles, crl: Option<PathBuf>) -> Sources {
        let crl_given = crl.is_some();
        let crl = crl.unwrap_or_else(|| files.ca.with_file_name(CRL_BESIDE_CA));
        Sources { files, crl, crl_given }
    }

    /// The revocation lists in force at start: the file's, or none when the default file is absent.
    fn initial_crls(&self, cas: &[CertificateDer<'_>]) -> Result<Vec<Crl>, String> {
        match self.read_crls(cas)? {
            Some(crls) => Ok(crls),
            None => Ok(Vec::new()),
        }
    }

    /// The revocation lists on disk now; `None` when the file is absent and was not given.
    fn read_crls(&self, cas: &[CertificateDer<'_>]) -> Result<Option<Vec<Crl>>, String> {
        if !self.crl_given && !self.crl.exists() {
            return Ok(None);
        }
        crl::read(&self.crl, cas).map(Some).map_err(|e| match self.crl_given {
            true => format!("{e} (--cluster-crl)"),
            false => format!("{e} (found beside --cluster-ca; give --cluster-crl to use another file)"),
        })
    }
}

fn ders(crls: &[Crl]) -> Vec<CertificateRevocationListDer<'static>> {
    crls.iter().map(|c| c.der.clone()).collect()
}

/// The router's crypto at start: its files and the revocation list (a malformed list is an error here).
pub fn server_crypto(sources: &Sources) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, String> {
    let loaded = Loaded::read(&sources.files, Role::Router)?;
    let crls = sources.initial_crls(&loaded.cas)?;
    tls::server_crypto_of(&loaded, &ders(&crls), &sources.files)
}

/// A node's crypto at start, as a [`LiveClient`] that [`LiveClient::watch`] keeps current, and the name in its
/// certificate.
pub fn node_client(sources: &Sources) -> Result<(LiveClient, String), String> {
    let loaded = Loaded::read(&sources.files, Role::Node)?;
    let crls = sources.initial_crls(&loaded.cas)?;
    let crypto = tls::client_crypto_of(&loaded, &ders(&crls), &sources.files)?;
    let mut client = LiveClient::fixed(crypto);
    client.watched = Some(Arc::new((sources.clone(), loaded.name.clone())));
    Ok((client, loaded.name))
}

/// A node's client config for its next dial; a [`Watch`] replaces it when the files change.
#[derive(Clone)]
pub struct LiveClient {
    current: Arc<RwLock<quinn::ClientConfig>>,
    transport: Option<Arc<TransportConfig>>,
    /// The files to watch and the node's name (a renewed certificate must keep it); `None`: never reloaded.
    watched: Option<Arc<(Sources, String)>>,
}

impl LiveClient {
    /// A client config that is never reloaded (the development mode).
    pub fn fixed(crypto: Arc<QuicClientConfig>) -> LiveClient {
        LiveClient {
            current: Arc::new(RwLock::new(quinn::ClientConfig::new(crypto))),
            transport: None,
            watched: None,
        }
    }

    /// The config to dial with now.
    pub fn current(&self) -> quinn::ClientConfig {
        self.current.reading().clone()
    }

    /// The transport settings of every config, now and after reloads.
    pub fn transport_config(&mut self, transport: Arc<TransportConfig>) -> &mut Self {
        self.current.writing().transport_config(transport.clone());
        self.transport = Some(transport);
        self
    }

    fn set_crypto(&self, crypto: Arc<QuicClientConfig>) {
        let mut config = quinn::ClientConfig::new(crypto);
        if let Some(t) = &self.transport {
            config.transport_config(t.clone());
        }
        *self.current.writing() = config;
    }

    /// Starts watching the node's files (nothing in the development mode): new dials use what changed, and the
    /// links `links` lists (a label for logs, the connection) are cut when their router's certificate is revoked
    /// or expires.
    pub fn watch(
        &self,
        links: impl Fn() -> Vec<(String, Connection)> + Send + 'static,
    ) -> Result<Option<Watch>, String> {
        let Some(watched) = &self.watched else {
            return Ok(None);
        };
        let (sources, name) = (watched.0.clone(), watched.1.clone());
        let side = Side::Node {
            client: self.clone(),
            name,
        };
        Watcher::new(sources, side, Box::new(links)).map(|w| Some(w.spawn()))
    }
}

/// The router's side: watches its files, swaps the crypto of the endpoint's server config `base` when they
/// change (the rest of `base` is kept: its transport settings and the key of its retry tokens, so a client
/// between its Retry and its second Initial is not refused by a key it never saw), and cuts the links `links`
/// lists whose node's certificate is revoked or expires.
pub fn watch_server(
    sources: Sources,
    endpoint: &quinn::Endpoint,
    base: quinn::ServerConfig,
    links: impl Fn() -> Vec<(String, Connection)> + Send + 'static,
) -> Result<Watch, String> {
    let side = Side::Router {
        endpoint: endpoint.clone(),
        base: Box::new(base),
    };
    Watcher::new(sources, side, Box::new(links)).map(Watcher::spawn)
}

/// The watching task; stops when dropped.
pub struct Watch(JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Side {
    Router {
        endpoint: quinn::Endpoint,
        base: Box<quinn::ServerConfig>,
    },
    Node {
        client: LiveClient,
        name: String,
    },
}

impl Side {
    fn role(&self) -> Role {
        match self {
            Side::Router { .. } => Role::Router,
            Side::Node { .. } => Role::Node,
        }
    }

    /// Builds the crypto of `loaded` and `crls` and puts it in force for new connections.
    fn apply(&self, loaded: &Loaded, crls: &[Crl], files: &TlsFiles) -> Result<(), String> {
        match self {
            Side::Router { endpoint, base } => {
                let mut config = quinn::ServerConfig::clone(base);
                config.crypto = tls::server_crypto_of(loaded, &ders(crls), files)?;
                endpoint.set_server_config(Some(config));
            }
            Side::Node { client, name } => {
                if loaded.name != *name {
                    return Err(format!(
                        "certificate {}: it is issued to '{}', but this node joined as '{name}' (a node's name \
                         cannot change while it runs; restart it to take the new name)",
                        files.cert.display(),
                        loaded.name
                    ));
                }
                client.set_crypto(tls::client_crypto_of(loaded, &ders(crls), files)?);
            }
        }
        Ok(())
    }
}

type Links = Box<dyn Fn() -> Vec<(String, Connection)> + Send>;

/// A digest of files' contents (or of why they cannot be read): equal digests, nothing to reload.
type Stamp = [u8; 32];

fn stamp(paths: &[&Path]) -> Stamp {
    let mut hash = Sha256::new();
    for path in paths {
        match std::fs::read(path) {
            Ok(bytes) => {
                hash.update((bytes.len() as u64).to_le_bytes());
                hash.update(&bytes);
            }
            Err(e) => hash.update(format!("unreadable: {:?}", e.kind())),
        }
    }
    hash.finalize().into()
}

/// The two parts that are reloaded on their own.
#[derive(Clone, Copy)]
enum Part {
    Files,
    Crl,
}

struct Watcher {
    sources: Sources,
    side: Side,
    links: Links,
    loaded: Loaded,
    crls: Vec<Crl>,
    revoked: Revoked,
    /// What was last put in force (or given up on after a warning).
    seen: [Stamp; 2],
    /// A change that failed once: warned about if it still fails at the next look (a certificate and its key are
    /// written one after the other, so one look may find a new key beside the old certificate).
    failed: [Option<Stamp>; 2],
}

impl Watcher {
    /// Reads the files and puts them in force (they may have changed since the member started).
    fn new(sources: Sources, side: Side, links: Links) -> Result<Watcher, String> {
        let seen = [stamp(&Self::file_paths(&sources)), stamp(&[&sources.crl])];
        let loaded = Loaded::read(&sources.files, side.role())?;
        let crls = sources.initial_crls(&loaded.cas)?;
        side.apply(&loaded, &crls, &sources.files)?;
        Ok(Watcher {
            revoked: Revoked::of(&crls),
            sources,
            side,
            links,
            loaded,
            crls,
            seen,
            failed: [None, None],
        })
    }

    fn file_paths(sources: &Sources) -> [&Path; 3] {
        [&sources.files.ca, &sources.files.cert, &sources.files.key]
    }

    /// Starts watching; SIGHUP is taken over before this returns (its default would end the process).
    fn spawn(self) -> Watch {
        use tokio::signal::unix::{signal, SignalKind};
        let hup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("cannot watch SIGHUP ({e}); the cluster TLS files are still polled every {POLL:?}");
                None
            }
        };
        tracing::info!(
            certificate = %self.sources.files.cert.display(),
            revocation_list = %self.sources.crl.display(),
            "cluster TLS: {}; {}; watching the files (and SIGHUP)",
            self.own(),
            self.list()
        );
        self.warn_if_own_revoked();
        Watch(tokio::spawn(self.run(hup)))
    }

    async fn run(mut self, mut hup: Option<tokio::signal::unix::Signal>) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                () = hangup(&mut hup) => true,
            };
            if forced {
                tracing::info!("SIGHUP: reading the cluster TLS files again");
            }
            self.poll(forced);
            self.cut_links(SystemTime::now());
        }
    }

    /// This member's certificate, for logs.
    fn own(&self) -> String {
        match self.loaded.chain.first().map(|c| PeerCert::of_der(c)) {
            Some(Ok(p)) => format!(
                "certificate '{}' (serial {}) valid until {}",
                p.name,
                p.serial,
                crl::show_time(p.not_after)
            ),
            _ => format!("certificate '{}'", self.loaded.name),
        }
    }

    /// The revocation list in force, for logs.
    fn list(&self) -> String {
        if self.crls.is_empty() {
            return format!("no revocation list ({} is absent)", self.sources.crl.display());
        }
        let numbers: Vec<String> = self
            .crls
            .iter()
            .map(|c| c.number.map_or("-".into(), |n| n.to_string()))
            .collect();
        format!(
            "revocation list {} (number {}): {} certificate(s) revoked",
            self.sources.crl.display(),
            numbers.join(", "),
            self.revoked.len()
        )
    }

    fn warn_if_own_revoked(&self) {
        let own = self.loaded.chain.first().and_then(|c| Serial::of_cert(c).ok());
        if let Some(entry) = own.and_then(|s| self.revoked.get(&s)) {
            tracing::warn!(
                "this member's own certificate {} (serial {}) is on the revocation list: peers that have the list \
                 refuse it; issue a new one",
                self.sources.files.cert.display(),
                entry.serial
            );
        }
        let next = self.crls.iter().filter_map(|c| c.next_update).min();
        if let Some(next) = next.filter(|n| *n < SystemTime::now()) {
            tracing::warn!(
                "revocation list {} is past its next update ({}): refresh it (`mesh-ops certs crl DIR`); it stays in \
                 force until then",
                self.sources.crl.display(),
                crl::show_time(next)
            );
        }
    }

    /// Looks at the files; reloads what changed. `forced` (SIGHUP): a file that cannot be used is warned about at
    /// once.
    fn poll(&mut self, forced: bool) {
        let now = [stamp(&Self::file_paths(&self.sources)), stamp(&[&self.sources.crl])];
        if now == self.seen {
            if forced {
                tracing::info!("the cluster TLS files have not changed");
            }
            return;
        }
        let files = if now[0] != self.seen[0] {
            match Loaded::read(&self.sources.files, self.side.role()) {
                Ok(l) => Some(l),
                Err(e) => {
                    self.fail(Part::Files, now[0], &e, forced);
                    None
                }
            }
        } else {
            None
        };
        let cas_changed = files.as_ref().is_some_and(|l| l.cas != self.loaded.cas);
        let crls = if now[1] != self.seen[1] || cas_changed {
            let cas = files.as_ref().map_or(&self.loaded.cas, |l| &l.cas);
            match self.sources.read_crls(cas) {
                Ok(Some(c)) => Some(c),
                Ok(None) => {
                    if !self.crls.is_empty() {
                        tracing::warn!(
                            "revocation list {} is gone; the {} revoked certificate(s) of the list read before stay \
                             revoked until this process restarts",
                            self.sources.crl.display(),
                            self.revoked.len()
                        );
                    }
                    self.seen[1] = now[1];
                    None
                }
                Err(e) => {
                    self.fail(Part::Crl, now[1], &e, forced);
                    None
                }
            }
        } else {
            None
        };
        if files.is_none() && crls.is_none() {
            return;
        }
        let loaded = files.as_ref().unwrap_or(&self.loaded);
        let lists = crls.as_deref().unwrap_or(&self.crls);
        if let Err(e) = self.side.apply(loaded, lists, &self.sources.files) {
            // Most likely a certificate and a key that do not match yet (one written, the other not),
            // or, when only the list changed, a list the configuration refuses: blamed on what changed.
            match files {
                Some(_) => self.fail(Part::Files, now[0], &e, forced),
                None => self.fail(Part::Crl, now[1], &e, forced),
            }
            return;
        }
        if let Some(l) = files {
            self.loaded = l;
            self.seen[0] = now[0];
            self.failed[0] = None;
            tracing::info!("cluster TLS: new connections use {}", self.own());
        }
        if let Some(c) = crls {
            let revoked = Revoked::of(&c);
            let change = revocation::decide::<()>(&self.revoked, &revoked, [], SystemTime::now());
            self.crls = c;
            self.revoked = revoked;
            self.seen[1] = now[1];
            self.failed[1] = None;
            for serial in &change.newly_revoked {
                tracing::warn!(serial = %serial, "certificate revoked: refused from now on");
            }
            for serial in &change.reinstated {
                tracing::info!(serial = %serial, "certificate no longer on the revocation list");
            }
            tracing::info!("cluster TLS: {}", self.list());
        }
        self.warn_if_own_revoked();
    }

    /// A change that cannot be used: warned about once it fails twice in a row (or at once on SIGHUP), then left
    /// alone until the files change again.
    fn fail(&mut self, part: Part, stamp: Stamp, why: &str, forced: bool) {
        let i = part as usize;
        if forced || self.failed[i] == Some(stamp) {
            let kept = match part {
                Part::Files => "the certificate in force",
                Part::Crl => "the revocation list in force",
            };
            tracing::warn!("cannot reload the cluster TLS files: {why}; keeping {kept}");
            self.seen[i] = stamp;
            self.failed[i] = None;
        } else {
            self.failed[i] = Some(stamp);
        }
    }

    /// Closes every live link whose peer's certificate is revoked or expired.
    fn cut_links(&self, now: SystemTime) {
        let peers = (self.links)().into_iter().filter_map(|(label, conn)| {
            if conn.close_reason().is_some() {
                return None;
            }
            let peer = peer_cert(&conn)?;
            Some(((label, conn), peer))
        });
        for ((label, conn), peer, why) in revocation::decide(&self.revoked, &self.revoked, peers, now).cut {
            let reason = why.describe(&peer);
            tracing::warn!(peer = %label, "{reason}: closing its cluster link");
            conn.close(VarInt::from_u32(why.close_code()), reason.as_bytes());
        }
    }
}

/// The leaf certificate the peer of `conn` proved; `None` without one (the development mode).
pub fn peer_cert(conn: &Connection) -> Option<PeerCert> {
    let identity = conn.peer_identity()?;
    let chain = identity.downcast_ref::<Vec<CertificateDer<'static>>>()?;
    PeerCert::of_der(chain.first()?).ok()
}

async fn hangup(hup: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(s) = hup {
        if s.recv().await.is_some() {
            return;
        }
        *hup = None;
    }
    std::future::pending().await
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
