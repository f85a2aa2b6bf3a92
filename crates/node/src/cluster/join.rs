//! One router's session, kept up for the node's life: dial, say hello, then report model changes and
//! load, serve the router's request streams, follow drain and release, and dial again after a loss.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::cluster::frame;
use mesh::cluster::io::{read_control_frame, write_frame};
use mesh::cluster::msg::{Hello, Message};
use mesh::cluster::session::node::{Effect, NodeSession};
use mesh::cluster::session::End;
use mesh::cluster::transport::{close, CONTROL_PRIORITY, CONTROL_WRITE_TIMEOUT};
use mesh::cluster::FrameError;
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use tokio::sync::mpsc;

use super::placing::{Command, Queues};
use super::report::{diff, hello_models, snapshot, versions, LoadTracker};
use super::{Context, Phase};

/// How a session ended, which decides how soon to dial again.
enum Ended {
    /// The router refused the join (another protocol version, a bad hello): retry slowly.
    Refused(String),
    /// The link broke or the router went away.
    Lost(String),
    /// The router broke the protocol on the control stream (the link closes with PROTOCOL).
    Broken(String),
    /// Another process joined under this node's name (names must be unique): retry slowly.
    Replaced(String),
    /// This node left cleanly.
    Left,
}

/// How long a goodbye waits for the router to close the link, so the goodbye is delivered.
const GOODBYE_WAIT: Duration = Duration::from_secs(1);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
const REFUSED_BACKOFF: Duration = Duration::from_secs(10);

/// Keeps a session with the router at `addr` until the node leaves.
pub async fn run(addr: String, ctx: Arc<Context>) {
    let mut backoff = FIRST_BACKOFF;
    let mut phase = ctx.phase.subscribe();
    loop {
        if *phase.borrow() == Phase::Leaving {
            return;
        }
        let began = Instant::now();
        let wait = match session(&addr, &ctx).await {
            Ended::Left => return,
            Ended::Refused(why) => {
                tracing::error!(router = %addr, "the router refused this node: {why}");
                REFUSED_BACKOFF
            }
            Ended::Replaced(why) => {
                tracing::error!(
                    router = %addr,
                    node = %ctx.settings.name,
                    "another process joined under this node's name ({why}); node names must be unique \
                     (--node-name); dialing again in {REFUSED_BACKOFF:?}"
                );
                REFUSED_BACKOFF
            }
            Ended::Lost(why) | Ended::Broken(why) => {
                if began.elapsed() > Duration::from_secs(5) {
                    backoff = FIRST_BACKOFF; // it was up a while: dial again quickly
                }
                tracing::warn!(router = %addr, "cluster link down: {why}; dialing again in {backoff:?}");
                let b = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                b
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = phase.wait_for(|p| *p == Phase::Leaving) => return,
        }
    }
}

/// The host part of HOST:PORT, which the router's certificate must name.
fn server_name(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn why_closed(e: &ConnectionError) -> Ended {
    match e {
        ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(close::REFUSED) => {
            Ended::Refused(String::from_utf8_lossy(&c.reason).into_owned())
        }
        ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(close::REPLACED) => {
            Ended::Replaced(String::from_utf8_lossy(&c.reason).into_owned())
        }
        ConnectionError::ApplicationClosed(c) => Ended::Lost(format!(
            "the router closed the link: {}",
            String::from_utf8_lossy(&c.reason)
        )),
        other => Ended::Lost(other.to_string()),
    }
}

async fn dial(addr: &str, ctx: &Context) -> Result<Connection, Ended> {
    let target = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| Ended::Lost(format!("cannot resolve {addr}: {e}")))?
        .next()
        .ok_or_else(|| Ended::Lost(format!("{addr} resolves to no address")))?;
    let connecting = ctx
        .endpoint
        .connect_with(ctx.settings.client.current(), target, server_name(addr))
        .map_err(|e| Ended::Lost(format!("cannot dial {addr}: {e}")))?;
    connecting.await.map_err(|e| match e {
        ConnectionError::TransportError(t) => Ended::Lost(format!("TLS or transport refused: {t}")),
        other => why_closed(&other),
    })
}

async fn send(tx: &mut SendStream, message: &Message, ctx: &Context) -> Result<(), Ended> {
    let chunks = frame::encode(message, Default::default(), &ctx.settings.limits)
        .map_err(|e| Ended::Lost(format!("cannot encode a control frame: {e}")))?;
    match tokio::time::timeout(CONTROL_WRITE_TIMEOUT, write_frame(tx, chunks)).await {
        Ok(written) => written.map_err(|e| Ended::Lost(format!("control stream: {e}"))),
        Err(_) => Err(Ended::Lost(format!(
            "the router took no control frame for {CONTROL_WRITE_TIMEOUT:?}"
        ))),
    }
}

/// Says goodbye and waits a moment for the router to close the link, so the goodbye arrives
/// (closing at once would drop it unsent).
async fn goodbye(tx: &mut SendStream, conn: &Connection, ctx: &Context) -> Ended {
    if send(tx, &Message::Goodbye, ctx).await.is_ok() {
        let _ = tx.finish();
        let _ = tokio::time::timeout(GOODBYE_WAIT, conn.closed()).await;
    }
    conn.close(VarInt::from_u32(close::NORMAL), b"goodbye");
    Ended::Left
}

/// What the control stream's reader hands the session.
enum Read {
    Frame(Message),
    /// The stream or the link ended.
    Ended(String),
    /// A frame that breaks the protocol.
    Broken(String),
}

/// Forwards control frames to the session; read in its own task because a frame read is not
/// cancel-safe inside a select.
async fn read_control(mut rx: RecvStream, limits: mesh::cluster::Limits, out: mpsc::Sender<Read>) {
    loop {
        // A full budget holds the control stream back; only a bad frame ends the link.
        let next = match read_control_frame(&mut rx, &limits).await {
            Ok(Some(f)) => Read::Frame(f.message),
            Ok(None) => Read::Ended("the router ended the control stream".into()),
            Err(FrameError::Io(why)) => Read::Ended(why),
            Err(e) => Read::Broken(format!("bad control frame: {e}")),
        };
        let end = !matches!(next, Read::Frame(_));
        if out.send(next).await.is_err() || end {
            return;
        }
    }
}

/// How a session's end is reported.
fn ended(end: End) -> Ended {
    match end {
        End::Protocol(why) => Ended::Broken(why),
        End::Lost(why) => Ended::Lost(why),
        End::Left => Ended::Left,
    }
}

async fn session(addr: &str, ctx: &Arc<Context>) -> Ended {
    let conn = match dial(addr, ctx).await {
        Ok(c) => c,
        Err(e) => return e,
    };
    let result = joined(addr, ctx, &conn).await;
    ctx.routers.remove(&conn);
    match &result {
        Ended::Left => {}
        Ended::Broken(why) => conn.close(VarInt::from_u32(close::PROTOCOL), why.as_bytes()),
        _ => conn.close(VarInt::from_u32(close::NORMAL), b"session ended"),
    }
    result
}

async fn joined(addr: &str, ctx: &Arc<Context>, conn: &Connection) -> Ended {
    let (mut tx, rx) = match conn.open_bi().await {
        Ok(s) => s,
        Err(e) => return why_closed(&e),
    };
    let _ = tx.set_priority(CONTROL_PRIORITY);
    let placed = ctx.placing.placed.clone();
    let mut last = snapshot(&versions(&ctx.serving.table), &placed);
    let s = &ctx.settings;
    // This node's arena, where a router on this host writes its requests (and the answers of our BLS
    // calls); removed when the session ends.
    let inbound = s.limits.arenas.inbound();
    let hello = Hello {
        name: s.name.clone(),
        incarnation: s.incarnation,
        devices: s.devices.clone(),
        http: s.http.clone(),
        grpc: s.grpc.clone(),
        models: hello_models(&last),
        memory: s.memory,
        arena: inbound.as_ref().and_then(|a| a.offer()),
    };
    let mut out = None;
    let (frames_tx, mut frames) = mpsc::channel(16);
    let _reader = AbortOnDrop(tokio::spawn(read_control(rx, s.limits.clone(), frames_tx)));
    let (mut session, first) = NodeSession::start(hello, Instant::now());
    // The hello's write counts against the welcome's deadline (a router may take no bytes at all):
    // when it runs out, the loop below finds the deadline passed.
    if let (Effect::Send(m), Some(by)) = (first, session.poll_timeout()) {
        if let Ok(Err(e)) = tokio::time::timeout_at(by.into(), send(&mut tx, &m, ctx)).await {
            return e;
        }
    }
    // Until the welcome: the session ends on anything else, or at its deadline.
    while !session.joined() {
        let deadline = session.poll_timeout().unwrap_or_else(Instant::now);
        let effects = match tokio::time::timeout_at(deadline.into(), frames.recv()).await {
            Err(_) => session.on_timeout(Instant::now()),
            Ok(Some(Read::Frame(m))) => session.on_message(m, &ctx.placing.fencing),
            Ok(Some(Read::Broken(why))) => return Ended::Broken(why),
            Ok(Some(Read::Ended(why))) => return ended_by(conn, why).await,
            Ok(None) => return Ended::Lost("the control stream reader ended".into()),
        };
        for effect in effects {
            match effect {
                Effect::Joined(w) => {
                    tracing::info!(router = %addr, router_id = %w.router, link = w.link, "joined the cluster");
                    out = s.limits.arenas.outbound(w.arena.as_ref(), &format!("router {addr}"));
                }
                Effect::End(end) => return ended(end),
                _ => {}
            }
        }
    }
    let live = ctx.routers.add(addr, conn.clone(), out.clone());
    let acceptor = {
        let (conn, serving) = (conn.clone(), ctx.serving.clone());
        tokio::spawn(async move {
            while let Ok((send, recv)) = conn.accept_bi().await {
                let (serving, out) = (serving.clone(), out.clone());
                let link = conn.stable_id() as u64;
                tokio::spawn(async move { serving.stream(send, recv, (link, out.as_deref())).await });
            }
        })
    };
    let _acceptor = AbortOnDrop(acceptor);
    let mut tracker = LoadTracker::default();
    let mut tick = tokio::time::interval(s.report_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut phase = ctx.phase.subscribe();
    let (placed_tx, mut placed_rx) = mpsc::unbounded_channel();
    let mut queues = Queues::new(ctx.placing.clone(), conn.clone(), placed_tx);
    loop {
        // Read (and mark seen) before waiting, so a change made meanwhile wakes `changed()` below.
        let now = *phase.borrow_and_update();
        let effects = match now {
            Phase::Leaving => session.on_leave(),
            Phase::Draining => session.on_drain(),
            _ => vec![],
        };
        let effects = if !effects.is_empty() {
            effects
        } else {
            tokio::select! {
                _ = tick.tick() => {
                    let now = versions(&ctx.serving.table);
                    let snap = snapshot(&now, &placed);
                    for event in diff(&last, &snap) {
                        if let Err(e) = send(&mut tx, &Message::ModelEvent(event), ctx).await {
                            return e;
                        }
                    }
                    last = snap;
                    if let Err(e) = send(&mut tx, &Message::LoadReport(tracker.report(&now)), ctx).await {
                        return e;
                    }
                    vec![]
                }
                Some(done) = placed_rx.recv() => session.on_placed(done),
                frame = frames.recv() => match frame {
                    Some(Read::Frame(m)) => session.on_message(m, &ctx.placing.fencing),
                    Some(Read::Broken(why)) => return Ended::Broken(why),
                    Some(Read::Ended(why)) => return ended_by(conn, why).await,
                    None => return Ended::Lost("control stream reader ended".into()),
                },
                changed = phase.changed() => {
                    if changed.is_err() {
                        session.on_leave()
                    } else {
                        vec![]
                    }
                }
            }
        };
        for effect in effects {
            match effect {
                Effect::Send(Message::Goodbye) => return goodbye(&mut tx, conn, ctx).await,
                Effect::Send(m) => {
                    if let Err(e) = send(&mut tx, &m, ctx).await {
                        return e;
                    }
                }
                Effect::Place(p) => {
                    tracing::info!(router = %addr, model = %p.model, "the router places a model here");
                    queues.submit(&p.model.clone(), Command::Place(p));
                }
                Effect::Evict(model) => queues.submit(&model, Command::Evict(model.clone())),
                Effect::MayStop => tracing::info!(
                    router = %addr,
                    "the router moved every placed model off this node (mesh-ops drain): it may be stopped"
                ),
                Effect::Leads(epoch) => tracing::info!(router = %addr, epoch, "this router leads placement now"),
                Effect::Released => {
                    tracing::info!(router = %addr, "the router released this node");
                    live.released.store(true, Ordering::Release);
                    ctx.released.notify_waiters();
                }
                Effect::Fenced { command, why } => {
                    tracing::warn!(router = %addr, command, "{why}");
                    metrics::counter!("mesh_node_fenced_commands_total", "command" => command).increment(1);
                }
                Effect::Ignored(what) => {
                    tracing::warn!(router = %addr, "ignoring an unexpected {what} on the control stream")
                }
                Effect::Joined(_) => {}
                Effect::End(End::Left) => return goodbye(&mut tx, conn, ctx).await,
                Effect::End(end) => return ended(end),
            }
        }
    }
}

/// Why a link ended: the router's close reason when it gave one (a refusal says why), else `why`.
async fn ended_by(conn: &Connection, why: String) -> Ended {
    match tokio::time::timeout(Duration::from_millis(200), conn.closed()).await {
        Ok(reason) => why_closed(&reason),
        Err(_) => Ended::Lost(why),
    }
}

/// Aborts a helper task when the session that started it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
