//! NodeLink: the actor of one connected node. It welcomes the node, turns its control stream into
//! membership events, releases it once drained, and serves the BLS requests the node sends; client
//! requests to the node do not pass through it (they open streams on the link directly).
use std::sync::Arc;
use std::time::Duration;

use mesh::cluster::answer::{message_name, reject, request_of, serve};
use mesh::cluster::convert::ErrorKind;
use mesh::cluster::frame::{self, FrameError};
use mesh::cluster::io::{read_frame, write_frame};
use mesh::cluster::msg::{self, Message, Welcome};
use mesh::cluster::ship;
use mesh::cluster::transport::{close, CONTROL_PRIORITY, CONTROL_WRITE_TIMEOUT};
use mesh::config::ModelConfig;
use mesh::Dispatch;
use quinn::{RecvStream, SendStream};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;

use crate::membership::{ModelEvent, ModelLoad, ModelStatus, NodeHello};
use crate::messages::{Joining, LinkMsg, Mailbox, MembershipMsg, PlacementMsg};
use crate::repository::ClusterRepo;
use crate::shared::{Link, RoutingView};

pub mod handshake;

/// What a NodeLink is built with: its node, and everyone it talks to.
pub struct LinkArgs {
    pub link: Arc<Link>,
    pub joining: Joining,
    pub view: Arc<RoutingView>,
    pub membership: Mailbox<MembershipMsg>,
    pub placement: Mailbox<PlacementMsg>,
    /// The cluster repository, whose files nodes fetch for placed models.
    pub repo: Arc<ClusterRepo>,
    /// Where BLS calls from the node go (the router's request path).
    pub bls: Arc<dyn Dispatch>,
}

pub struct LinkState {
    link: Arc<Link>,
    view: Arc<RoutingView>,
    membership: Mailbox<MembershipMsg>,
    placement: Mailbox<PlacementMsg>,
    control: SendStream,
    /// The node's hello until the welcome is written (then it goes to membership).
    hello: Option<NodeHello>,
    /// The control stream's reader and the BLS and fetch acceptor, started once the node is welcomed.
    pending: Option<(RecvStream, Arc<dyn Dispatch>, Arc<ClusterRepo>)>,
    tasks: Vec<JoinHandle<()>>,
    draining: Option<JoinHandle<()>>,
    quiet_checks: u32,
    /// When the last load report was taken.
    reported: Option<std::time::Instant>,
}

/// Load reports closer together than this are dropped (nodes report every 250 ms by default).
const MIN_REPORT_GAP: Duration = Duration::from_millis(20);

/// Writes one control frame to the node within `limit`.
async fn write_control(state: &mut LinkState, message: &Message, limit: Duration) -> Result<(), String> {
    let chunks = frame::encode(message, Default::default(), &state.view.limits).map_err(|e| e.to_string())?;
    match tokio::time::timeout(limit, write_frame(&mut state.control, chunks)).await {
        Ok(written) => written.map_err(|e| e.to_string()),
        Err(_) => Err(format!("the node took no control frame for {limit:?}")),
    }
}

pub struct NodeLink;

fn model_status(m: msg::ModelStatus) -> Result<ModelStatus, String> {
    let config: ModelConfig = prost::Message::decode(m.config.as_slice())
        .map_err(|e| format!("model '{}' version {} has an unreadable config: {e}", m.name, m.version))?;
    Ok(ModelStatus {
        name: m.name,
        version: m.version,
        ready: m.ready,
        reason: m.reason,
        config: Arc::new(config),
        placed: m.placed,
    })
}

/// The node's hello, once its certificate proves the name it claims ([`handshake::check_identity`]).
fn node_hello(hello: msg::Hello, link: &Link, view: &RoutingView) -> Result<NodeHello, String> {
    let models = hello.models.into_iter().map(model_status).collect::<Result<_, _>>()?;
    let key = handshake::check_identity(&hello.name, &link.conn, &view.membership())?;
    Ok(NodeHello {
        name: hello.name,
        incarnation: hello.incarnation,
        address: link.address.to_string(),
        devices: hello.devices,
        models,
        memory: hello.memory,
        key,
    })
}

/// Reads the node's control frames into the actor until the stream or connection ends.
async fn read_control(mut recv: RecvStream, actor: ActorRef<LinkMsg>, limits: mesh::cluster::Limits) {
    loop {
        match read_frame(&mut recv, &limits).await {
            Ok(Some(f)) => {
                if actor.cast(LinkMsg::Control(f.message)).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = actor.cast(LinkMsg::Closed("the node ended its control stream".into()));
                return;
            }
            Err(e @ (FrameError::Io(_) | FrameError::Truncated { .. })) => {
                let _ = actor.cast(LinkMsg::Closed(format!("control stream: {e}")));
                return;
            }
            Err(e) => {
                let _ = actor.cast(LinkMsg::Broken(format!("bad control frame: {e}")));
                return;
            }
        }
    }
}

/// Sends the files of a placed model a node asks for, if the key is the model's current one.
async fn send_files(mut send: SendStream, fetch: msg::Fetch, repo: &ClusterRepo, limits: &mesh::cluster::Limits) {
    let result = match repo.by_key(&fetch.model, &fetch.key) {
        Some(m) => ship::send_files(&mut send, &m.dir, &m.manifest, limits).await,
        None => {
            let why = format!(
                "model '{}' has no files under key {} here (it changed or was unloaded)",
                fetch.model, fetch.key
            );
            ship::fetch_error(&mut send, why, limits).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(model = %fetch.model, "sending a model's files to a node failed: {e}");
    }
}

/// Serves the streams a node opens: BLS calls leaving the node (through the router), and fetches
/// of placed models' files.
async fn accept_requests(
    link: Arc<Link>,
    dispatch: Arc<dyn Dispatch>,
    repo: Arc<ClusterRepo>,
    limits: mesh::cluster::Limits,
) {
    loop {
        let (send, mut recv) = match link.conn.accept_bi().await {
            Ok(s) => s,
            Err(_) => return, // the connection ended; the control reader reports why
        };
        let (dispatch, repo, limits) = (dispatch.clone(), repo.clone(), limits.clone());
        tokio::spawn(async move {
            let first = match read_frame(&mut recv, &limits).await {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => return reject(send, recv, e, &limits).await,
            };
            if let Message::Fetch(fetch) = first.message {
                return send_files(send, fetch, &repo, &limits).await;
            }
            match request_of(first) {
                Ok((request, stream)) => {
                    serve(&*dispatch, request, stream, (send, recv), &limits, |_| {
                        ErrorKind::Answered
                    })
                    .await
                }
                Err(e) => reject(send, recv, e, &limits).await,
            }
        });
    }
}

impl Actor for NodeLink {
    type Msg = LinkMsg;
    type State = LinkState;
    type Arguments = LinkArgs;

    async fn pre_start(&self, _: ActorRef<LinkMsg>, args: LinkArgs) -> Result<LinkState, ActorProcessingErr> {
        let LinkArgs {
            link,
            joining,
            view,
            membership,
            placement,
            repo,
            bls,
        } = args;
        let Joining { control, hello, .. } = joining;
        let (control_tx, control_rx) = control;
        let _ = control_tx.set_priority(CONTROL_PRIORITY);
        let hello = match node_hello(hello, &link, &view) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(peer = %link.address, "refused a node: {e}");
                link.close(close::REFUSED, &format!("cannot join: {e}"));
                return Err(e.into());
            }
        };
        Ok(LinkState {
            link,
            view,
            membership,
            placement,
            control: control_tx,
            hello: Some(hello),
            pending: Some((control_rx, bls, repo)),
            tasks: Vec::new(),
            draining: None,
            quiet_checks: 0,
            reported: None,
        })
    }

    /// Welcomes the node from the actor's own task (the supervisor does not wait on a slow node),
    /// then tells membership, whose routing view may now send requests on the link.
    async fn post_start(&self, myself: ActorRef<LinkMsg>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        let welcome = Message::Welcome(Welcome {
            router: state.view.id.clone(),
            link: state.link.id,
        });
        if let Err(why) = write_control(state, &welcome, handshake::HELLO_TIMEOUT).await {
            state.link.close(close::PROTOCOL, &why);
            myself.stop(Some(format!("welcome not delivered: {why}")));
            return Ok(());
        }
        let (Some(hello), Some((control_rx, bls, repo))) = (state.hello.take(), state.pending.take()) else {
            return Ok(());
        };
        tracing::info!(
            node = %hello.name,
            address = %state.link.address,
            models = hello.models.len(),
            incarnation = format!("{:016x}", hello.incarnation),
            "node joined"
        );
        state.membership.tell(MembershipMsg::Join(state.link.id, hello));
        let limits = state.view.limits.clone();
        state.tasks = vec![
            tokio::spawn(read_control(control_rx, myself.clone(), limits.clone())),
            tokio::spawn(accept_requests(state.link.clone(), bls, repo, limits)),
        ];
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<LinkMsg>,
        msg: LinkMsg,
        state: &mut LinkState,
    ) -> Result<(), ActorProcessingErr> {
        let id = state.link.id;
        match msg {
            LinkMsg::Control(Message::ModelEvent(e)) => {
                let event = match e {
                    msg::ModelEvent::Update(m) => match model_status(m) {
                        Ok(m) => ModelEvent::Update(m),
                        Err(e) => {
                            state.link.close(close::PROTOCOL, &e);
                            myself.stop(Some(e));
                            return Ok(());
                        }
                    },
                    msg::ModelEvent::Removed { name, version } => ModelEvent::Removed { name, version },
                };
                state.membership.tell(MembershipMsg::Event(id, event));
            }
            LinkMsg::Control(Message::LoadReport(_))
                if state.reported.is_some_and(|t| t.elapsed() < MIN_REPORT_GAP) =>
            {
                // Faster than any node reports: dropped, so one node cannot flood membership.
            }
            LinkMsg::Control(Message::LoadReport(r)) => {
                state.reported = Some(std::time::Instant::now());
                let loads = r
                    .models
                    .into_iter()
                    .map(|m| ModelLoad {
                        name: m.name,
                        version: m.version,
                        inflight: m.inflight,
                        queued: m.queued,
                        exec_us: m.exec_us,
                    })
                    .collect();
                state.membership.tell(MembershipMsg::Report(id, loads));
            }
            LinkMsg::Control(Message::Drain) => {
                tracing::info!(node = %state.link.name, "node is draining: no new requests go to it");
                state.membership.tell(MembershipMsg::Drain(id));
                if state.draining.is_none() {
                    let cell = myself.get_cell();
                    state.draining = Some(ractor::time::send_interval(DRAIN_CHECK, cell, || LinkMsg::CheckDrain));
                }
            }
            LinkMsg::Control(Message::Placed(p)) => {
                state.placement.tell(PlacementMsg::Placed(state.link.name.clone(), p));
            }
            LinkMsg::Send(message) => {
                if let Err(why) = write_control(state, &message, CONTROL_WRITE_TIMEOUT).await {
                    state.link.close(close::PROTOCOL, &why);
                    myself.stop(Some(why));
                }
            }
            LinkMsg::Control(Message::Goodbye) => {
                state.membership.tell(MembershipMsg::Goodbye(id));
                myself.stop(Some("the node said goodbye".into()));
            }
            LinkMsg::Control(other) => {
                let why = format!("a {} on the control stream", message_name(&other));
                state.link.close(close::PROTOCOL, &why);
                myself.stop(Some(why));
            }
            LinkMsg::CheckDrain => {
                // Two quiet checks in a row: a request that picked this node just before the drain
                // was published has had time to show up in the count.
                state.quiet_checks = if state.link.inflight() == 0 {
                    state.quiet_checks + 1
                } else {
                    0
                };
                if state.quiet_checks >= 2 {
                    if let Some(t) = state.draining.take() {
                        t.abort();
                    }
                    match write_control(state, &Message::Released, CONTROL_WRITE_TIMEOUT).await {
                        Ok(()) => tracing::info!(node = %state.link.name, "drained node released"),
                        Err(why) => {
                            state.link.close(close::PROTOCOL, &why);
                            myself.stop(Some(why));
                        }
                    }
                }
            }
            LinkMsg::Closed(why) => myself.stop(Some(why)),
            LinkMsg::Broken(why) => {
                state.link.close(close::PROTOCOL, &why);
                myself.stop(Some(why));
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<LinkMsg>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        for t in state.tasks.drain(..) {
            t.abort();
        }
        if let Some(t) = state.draining.take() {
            t.abort();
        }
        Ok(())
    }
}

/// How often a draining node's in-flight count is checked.
const DRAIN_CHECK: Duration = Duration::from_millis(20);
