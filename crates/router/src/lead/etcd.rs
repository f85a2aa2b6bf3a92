//! The election, run against etcd: a lease kept alive, a leader key created only if absent and
//! bound to that lease (its creation revision is the fencing token), and the operator's intent
//! stored in one key, written only while this router still holds the leader key. Each step feeds
//! what etcd answered into the sans-IO `Leadership` and publishes the resulting `Role`.
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
};
use tokio::sync::watch;

use super::lease::{Leadership, Standing};
use super::{Desired, Lead, Role};

#[derive(Debug, Clone)]
pub struct EtcdSettings {
    pub endpoints: Vec<String>,
    /// Keys live under this prefix (`<prefix>/leader`, `<prefix>/placement`).
    pub prefix: String,
    pub ttl: Duration,
    /// How often the election is checked (and a follower reads the stored intent).
    pub poll: Duration,
    /// This router, as others see it in the leader key (its name and HTTP address).
    pub me: super::LeaderInfo,
    /// TLS to etcd (its CA, and this router's certificate when etcd asks for one).
    pub tls: Option<etcd_client::TlsOptions>,
    /// etcd's user authentication: name and password.
    pub user: Option<(String, String)>,
}

/// TLS options for etcd from PEM files; errors name the file.
pub fn tls_options(
    ca: Option<&std::path::Path>,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
) -> Result<Option<etcd_client::TlsOptions>, String> {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    let mut tls = match ca {
        None if cert.is_none() && key.is_none() => return Ok(None),
        None => return Err("--etcd-cert and --etcd-key need --etcd-ca".into()),
        Some(ca) => etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read(ca)?)),
    };
    match (cert, key) {
        (Some(cert), Some(key)) => tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?)),
        (None, None) => {}
        _ => return Err("--etcd-cert and --etcd-key go together".into()),
    }
    Ok(Some(tls))
}

/// Starts the election task; the handle's role follows it.
pub fn start(settings: EtcdSettings) -> Arc<Lead> {
    let (role_tx, role) = watch::channel(Role::Unknown {
        why: "connecting to etcd".into(),
    });
    let (save, save_rx) = watch::channel(None);
    let (resign, resign_rx) = tokio::sync::mpsc::channel(1);
    let (until_tx, until) = watch::channel(None);
    let (stored_tx, stored) = watch::channel(0);
    let me = settings.me.name.clone();
    tokio::spawn(Election::new(settings, role_tx, until_tx, stored_tx, save_rx).run(resign_rx));
    Arc::new(Lead {
        role,
        until,
        save: Some(save),
        seq: Default::default(),
        stored: Some(stored),
        resign: Some(resign),
        id: me,
    })
}

struct Election {
    settings: EtcdSettings,
    leadership: Leadership,
    client: Option<Client>,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// The intent read from etcd (on taking over, and by followers each step).
    state: Arc<Desired>,
    /// The intent last written by this leader.
    written: Option<Desired>,
    role_tx: watch::Sender<Role>,
    until_tx: watch::Sender<Option<Instant>>,
    save_rx: watch::Receiver<Option<(u64, Desired)>>,
    stored_tx: watch::Sender<u64>,
    last_error: Option<String>,
}

type Step = Result<(), etcd_client::Error>;

impl Election {
    fn new(
        settings: EtcdSettings,
        role_tx: watch::Sender<Role>,
        until_tx: watch::Sender<Option<Instant>>,
        stored_tx: watch::Sender<u64>,
        save_rx: watch::Receiver<Option<(u64, Desired)>>,
    ) -> Self {
        let margin = Duration::from_millis(500);
        Election {
            leadership: Leadership::new(settings.ttl, margin),
            settings,
            client: None,
            keeper: None,
            state: Arc::default(),
            written: None,
            role_tx,
            until_tx,
            stored_tx,
            save_rx,
            last_error: None,
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.settings.prefix.trim_end_matches('/'))
    }

    async fn run(mut self, mut resign: tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<()>>) {
        tracing::info!(endpoints = ?self.settings.endpoints, prefix = %self.settings.prefix, "placement election through etcd");
        loop {
            let step = tokio::time::timeout(self.settings.ttl / 2, self.step()).await;
            let failure = match step {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("etcd did not answer within {:?}", self.settings.ttl / 2)),
            };
            match failure {
                None if self.last_error.take().is_some() => tracing::info!("etcd reachable again"),
                None => {}
                Some(why) => {
                    if self.last_error.as_deref() != Some(&why) {
                        tracing::warn!("etcd: {why}; routing goes on, placement waits while this lasts");
                    }
                    self.keeper = None;
                    self.last_error = Some(why);
                }
            }
            self.publish(Instant::now());
            tokio::select! {
                _ = tokio::time::sleep(self.settings.poll) => {}
                // A change to store: write it now, not at the next poll.
                Ok(()) = self.save_rx.changed() => {}
                Some(done) = resign.recv() => {
                    self.resign().await;
                    let _ = done.send(());
                    return;
                }
            }
        }
    }

    fn publish(&self, now: Instant) {
        self.until_tx.send_replace(self.leadership.acts_until());
        let role = match self.leadership.standing(now) {
            Standing::Leader { epoch } => Role::Leader {
                epoch,
                state: self.state.clone(),
            },
            Standing::Follower { leader, http } => Role::Follower {
                leader,
                http,
                state: self.state.clone(),
            },
            Standing::Candidate => Role::Unknown {
                why: self
                    .last_error
                    .clone()
                    .map_or_else(|| "electing a placement leader".into(), |e| format!("etcd: {e}")),
            },
        };
        self.role_tx.send_if_modified(|r| {
            if *r == role {
                return false;
            }
            if r.name() == "leader" && role.name() != "leader" {
                let why = match &role {
                    Role::Follower { leader, .. } => format!("{leader} leads now"),
                    Role::Unknown { why } => why.clone(),
                    _ => "a new epoch".into(),
                };
                tracing::warn!("this router stopped leading placement: {why}");
            }
            match &role {
                Role::Leader { epoch, .. } => tracing::info!(epoch, "this router leads placement now"),
                Role::Follower { leader, .. } if r.name() != "follower" => {
                    tracing::info!(leader = %leader, "another router leads placement")
                }
                _ => {}
            }
            *r = role.clone();
            true
        });
    }

    /// Revokes the lease (deleting the leader key with it) and stops acting.
    async fn resign(&mut self) {
        let lease = self.leadership.lease(Instant::now());
        let was_leader = matches!(self.leadership.standing(Instant::now()), Standing::Leader { .. });
        self.leadership.lost_lease();
        let _ = self.role_tx.send(Role::Unknown {
            why: "this router is stopping".into(),
        });
        if let (Some(id), Some(client)) = (lease, self.client.as_mut()) {
            match tokio::time::timeout(self.settings.ttl / 2, client.lease_revoke(id)).await {
                Ok(Ok(_)) if was_leader => tracing::info!("handed placement leadership back (lease revoked)"),
                Ok(Ok(_)) => {}
                _ => tracing::warn!("could not revoke the lease; another router leads once it runs out"),
            }
        }
    }

    async fn step(&mut self) -> Step {
        if self.client.is_none() {
            let mut options = ConnectOptions::new()
                .with_connect_timeout(self.settings.ttl / 3)
                .with_timeout(self.settings.ttl / 3)
                .with_require_leader(true);
            if let Some(tls) = &self.settings.tls {
                options = options.with_tls(tls.clone());
            }
            if let Some((user, password)) = &self.settings.user {
                options = options.with_user(user.clone(), password.clone());
            }
            self.client = Some(Client::connect(&self.settings.endpoints, Some(options)).await?);
        }
        let now = Instant::now();
        let lease = match self.leadership.lease(now) {
            Some(id) => id,
            None => self.grant().await?,
        };
        if self.leadership.keepalive_due(Instant::now()) {
            self.keep_alive(lease).await?;
        }
        let Some(lease) = self.leadership.lease(Instant::now()) else {
            return Ok(());
        };
        self.campaign(lease).await?;
        match self.leadership.standing(Instant::now()) {
            Standing::Leader { epoch } => self.store(epoch).await,
            Standing::Follower { .. } => {
                self.state = Arc::new(self.read_state().await?);
                Ok(())
            }
            Standing::Candidate => Ok(()),
        }
    }

    fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("connected in step")
    }

    async fn grant(&mut self) -> Result<i64, etcd_client::Error> {
        let sent = Instant::now();
        let ttl = self.settings.ttl.as_secs().max(1) as i64;
        let granted = self.client().lease_grant(ttl, None).await?;
        let ttl = Duration::from_secs(granted.ttl().max(0) as u64);
        self.leadership.granted(granted.id(), ttl, sent);
        self.keeper = None;
        Ok(granted.id())
    }

    async fn keep_alive(&mut self, lease: i64) -> Step {
        if self.keeper.is_none() {
            self.keeper = Some(self.client().lease_keep_alive(lease).await?);
        }
        let sent = Instant::now();
        self.leadership.keepalive_sent(sent);
        let (keeper, stream) = self.keeper.as_mut().expect("just set");
        keeper.keep_alive().await?;
        match stream.message().await? {
            Some(answer) => self
                .leadership
                .kept_alive(Duration::from_secs(answer.ttl().max(0) as u64), sent),
            None => {
                self.keeper = None;
                self.leadership.lost_lease();
            }
        }
        Ok(())
    }

    /// Creates the leader key if nobody holds it; otherwise learns who does.
    async fn campaign(&mut self, lease: i64) -> Step {
        let key = self.key("leader");
        let me = serde_json::to_vec(&self.settings.me).unwrap_or_default();
        let put = TxnOp::put(key.clone(), me, Some(PutOptions::new().with_lease(lease)));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([put])
            .or_else([TxnOp::get(key, None)]);
        let answer = self.client().txn(txn).await?;
        if answer.succeeded() {
            let epoch = answer.header().map_or(0, |h| h.revision()) as u64;
            return self.take_over(epoch).await;
        }
        let holder = answer.op_responses().into_iter().find_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        match holder {
            // This router's own key (it won in an earlier step): still the leader.
            Some(kv) if kv.lease() == lease => {
                let epoch = kv.create_revision() as u64;
                if self.leadership.standing(Instant::now()) != (Standing::Leader { epoch }) {
                    self.take_over(epoch).await?;
                }
            }
            Some(kv) => {
                let leader = super::LeaderInfo::parse(kv.value());
                self.leadership.follows(leader.name, leader.http);
            }
            None => {} // deleted meanwhile: the next step campaigns again
        }
        Ok(())
    }

    /// Leads from `epoch` on, with what the previous leader stored, read before acting on anything.
    async fn take_over(&mut self, epoch: u64) -> Step {
        self.state = Arc::new(self.read_state().await?);
        self.written = Some((*self.state).clone());
        self.leadership.won(epoch);
        Ok(())
    }

    async fn read_state(&mut self) -> Result<Desired, etcd_client::Error> {
        let key = self.key("placement");
        let got = self.client().get(key, None).await?;
        Ok(match got.kvs().first() {
            Some(kv) => serde_json::from_slice(kv.value()).unwrap_or_else(|e| {
                tracing::error!("the placement state in etcd cannot be read ({e}); starting from none");
                Desired::default()
            }),
            None => Desired::default(),
        })
    }

    /// Writes the leader's intent if it changed, only while the leader key is still the one this
    /// router created (a deposed leader's write is refused by etcd itself).
    async fn store(&mut self, epoch: u64) -> Step {
        let Some((seq, desired)) = self.save_rx.borrow_and_update().clone() else {
            return Ok(());
        };
        if self.written.as_ref() == Some(&desired) {
            self.stored_tx.send_replace(seq);
            return Ok(());
        }
        let value = serde_json::to_vec(&desired).unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key("leader"),
                CompareOp::Equal,
                epoch as i64,
            )])
            .and_then([TxnOp::put(self.key("placement"), value, None)]);
        if self.client().txn(txn).await?.succeeded() {
            self.written = Some(desired);
            self.stored_tx.send_replace(seq);
        } else {
            tracing::warn!(
                epoch,
                "the leader key changed hands: this router no longer leads placement"
            );
            self.leadership.follows("(unknown)".into(), String::new());
        }
        Ok(())
    }
}
