//! NodeLink: the actor of one connected node. It welcomes the node, turns its control stream into
//! membership events, releases it once drained, and serves the BLS requests the node sends; client
//! requests to the node do not pass through it (they open streams on the link directly).
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::cluster::answer::{reject, request_of, serve};
use mesh::cluster::convert::ErrorKind;
use mesh::cluster::frame::{self, FrameError};
use mesh::cluster::io::{read_control_frame, read_frame, write_frame};
use mesh::cluster::msg::{self, Message, Welcome};
use mesh::cluster::session::router::{model_status, Effect, RouterSession};
use mesh::cluster::session::End;
use mesh::cluster::ship;
use mesh::cluster::shm::Registered;
use mesh::cluster::transport::{close, CONTROL_PRIORITY, CONTROL_WRITE_TIMEOUT};
use mesh::Dispatch;
use quinn::{RecvStream, SendStream};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;

use crate::membership::NodeHello;
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
    /// This router's shared-memory arena for the node, when shared memory is on; removed with the actor.
    inbound: Option<Registered>,
    /// The control stream's protocol (sans-IO); this actor drives it.
    session: RouterSession,
    /// A check the session asked for is scheduled.
    check_due: bool,
}

/// Writes one control frame to the node within `limit`.
async fn write_control(state: &mut LinkState, message: &Message, limit: Duration) -> Result<(), String> {
    let chunks = frame::encode(message, Default::default(), &state.view.limits).map_err(|e| e.to_string())?;
    match tokio::time::timeout(limit, write_frame(&mut state.control, chunks)).await {
        Ok(written) => written.map_err(|e| e.to_string()),
        Err(_) => Err(format!("the node took no control frame for {limit:?}")),
    }
}

pub struct NodeLink;

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
        // A full budget holds the control stream back; only a bad frame ends the link.
        match read_control_frame(&mut recv, &limits).await {
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
        let (dispatch, repo, limits, link) = (dispatch.clone(), repo.clone(), limits.clone(), link.clone());
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
                Ok((mut request, stream, trace)) => {
                    // The node is the client of its BLS calls, for the router's fair budget.
                    request.client = mesh::Client::Link(link.conn.stable_id() as u64);
                    let out = link.out();
                    serve(
                        &*dispatch,
                        (request, stream, trace),
                        (send, recv),
                        (&limits, out),
                        |_| ErrorKind::Answered,
                    )
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
        let offer = hello.arena.clone();
        let hello = match node_hello(hello, &link, &view) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(peer = %link.address, "refused a node: {e}");
                link.close(close::REFUSED, &format!("cannot join: {e}"));
                return Err(e.into());
            }
        };
        // Shared memory both ways when the node runs on this host: its arena for requests, ours
        // (offered in the welcome) for the answers of its BLS calls.
        let peer = format!("node '{}'", hello.name);
        if let Some(out) = view.limits.arenas.outbound(offer.as_ref(), &peer) {
            let _ = link.out.set(out);
        }
        let inbound = view.limits.arenas.inbound();
        Ok(LinkState {
            inbound,
            link,
            view,
            membership,
            placement,
            control: control_tx,
            hello: Some(hello),
            pending: Some((control_rx, bls, repo)),
            tasks: Vec::new(),
            session: RouterSession::default(),
            check_due: false,
        })
    }

    /// Welcomes the node from the actor's own task (the supervisor does not wait on a slow node),
    /// then tells membership, whose routing view may now send requests on the link.
    async fn post_start(&self, myself: ActorRef<LinkMsg>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        let welcome = Message::Welcome(Welcome {
            router: state.view.id.clone(),
            link: state.link.id,
            arena: state.inbound.as_ref().and_then(|a| a.offer()),
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
        let limits = state.link.limits.clone();
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
        let now = Instant::now();
        let effects = match msg {
            LinkMsg::Control(message) => state.session.on_message(message, now),
            LinkMsg::CheckDrain => {
                state.check_due = false;
                state.session.on_timeout(state.link.inflight(), now)
            }
            LinkMsg::Send(message) => vec![Effect::Send(message)],
            LinkMsg::Closed(why) => {
                myself.stop(Some(why));
                return Ok(());
            }
            LinkMsg::Broken(why) => vec![Effect::End(End::Protocol(why))],
        };
        for effect in effects {
            if !apply(state, &myself, effect).await {
                return Ok(());
            }
        }
        // The session's next check (a draining node's in-flight count), once.
        if let Some(at) = state.session.poll_timeout().filter(|_| !state.check_due) {
            state.check_due = true;
            let wait = at.saturating_duration_since(Instant::now());
            ractor::time::send_after(wait, myself.get_cell(), || LinkMsg::CheckDrain);
        }
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<LinkMsg>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        for t in state.tasks.drain(..) {
            t.abort();
        }
        Ok(())
    }
}

/// Carries out one effect of the session; false once the actor stops.
async fn apply(state: &mut LinkState, myself: &ActorRef<LinkMsg>, effect: Effect) -> bool {
    let id = state.link.id;
    match effect {
        Effect::Model(e) => drop(state.membership.tell(MembershipMsg::Event(id, e))),
        Effect::Report(loads) => drop(state.membership.tell(MembershipMsg::Report(id, loads))),
        Effect::Draining => {
            tracing::info!(node = %state.link.name, "node is draining: no new requests go to it");
            state.membership.tell(MembershipMsg::Drain(id));
        }
        Effect::Goodbye => drop(state.membership.tell(MembershipMsg::Goodbye(id))),
        Effect::Placed(p) => drop(state.placement.tell(PlacementMsg::Placed(state.link.name.clone(), p))),
        Effect::Send(message) => {
            if let Err(why) = write_control(state, &message, CONTROL_WRITE_TIMEOUT).await {
                state.link.close(close::PROTOCOL, &why);
                myself.stop(Some(why));
                return false;
            }
            if message == Message::Released {
                tracing::info!(node = %state.link.name, "drained node released");
            }
        }
        Effect::End(End::Left) => {
            myself.stop(Some("the node said goodbye".into()));
            return false;
        }
        Effect::End(End::Protocol(why)) => {
            state.link.close(close::PROTOCOL, &why);
            myself.stop(Some(why));
            return false;
        }
        Effect::End(End::Lost(why)) => {
            myself.stop(Some(why));
            return false;
        }
    }
    true
}
