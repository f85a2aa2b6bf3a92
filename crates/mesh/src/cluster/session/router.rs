//! The router's side of one node's control stream, sans-IO: it turns what the node says into
//! membership and placement events (a node's load reports are rate-limited, a model's config must
//! decode), and while the node drains it checks the router's in-flight count on the link until it
//! may release the node.
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::msg::{self, Message};
use crate::config::ModelConfig;

use super::End;

/// Load reports closer together than this are dropped (nodes report every 250 ms by default), so
/// one node cannot flood membership.
pub const MIN_REPORT_GAP: Duration = Duration::from_millis(20);
/// How often a draining node's in-flight count is checked.
pub const DRAIN_CHECK: Duration = Duration::from_millis(20);
/// Quiet checks in a row before a draining node is released: a request that picked the node just
/// before the drain was published has had time to show up in the count.
pub const QUIET_CHECKS: u32 = 2;

/// One model version on one node.
#[derive(Debug, Clone)]
pub struct ModelStatus {
    pub name: String,
    pub version: i64,
    pub ready: bool,
    /// Why the version is not ready (empty when it is).
    pub reason: String,
    pub config: Arc<ModelConfig>,
    /// The router placed it (from the cluster repository); false: the node's own repository.
    pub placed: bool,
}

/// A change to what a node serves.
#[derive(Debug, Clone)]
pub enum ModelEvent {
    /// A version was added, or its readiness or config changed.
    Update(ModelStatus),
    /// A version is no longer served by the node.
    Removed { name: String, version: i64 },
}

/// One entry of a load report, naming the model version it is about.
pub use crate::cluster::msg::ModelLoad;

/// A model version as the node described it, with its config decoded.
pub fn model_status(m: msg::ModelStatus) -> Result<ModelStatus, String> {
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

/// What the driver does after a step of the session.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Tell membership: a model changed on the node.
    Model(ModelEvent),
    /// Tell membership: the node's load.
    Report(Vec<ModelLoad>),
    /// Tell membership: the node drains (route nothing new to it).
    Draining,
    /// Tell membership: the node leaves.
    Goodbye,
    /// Tell placement: how a Place ended.
    Placed(msg::Placed),
    /// Write this frame on the control stream.
    Send(Message),
    /// The session is over.
    End(End),
}

/// The router's session with one node, once it was welcomed.
#[derive(Debug, Default)]
pub struct RouterSession {
    reported: Option<Instant>,
    drain: Option<Drain>,
}

#[derive(Debug)]
struct Drain {
    next_check: Instant,
    quiet: u32,
    released: bool,
}

impl RouterSession {
    /// A frame the node sent on its control stream at `now`.
    pub fn on_message(&mut self, message: Message, now: Instant) -> Vec<Effect> {
        match message {
            Message::ModelEvent(msg::ModelEvent::Update(m)) => match model_status(m) {
                Ok(m) => vec![Effect::Model(ModelEvent::Update(m))],
                Err(why) => vec![Effect::End(End::Protocol(why))],
            },
            Message::ModelEvent(msg::ModelEvent::Removed { name, version }) => {
                vec![Effect::Model(ModelEvent::Removed { name, version })]
            }
            Message::LoadReport(_) if self.reported.is_some_and(|t| now.duration_since(t) < MIN_REPORT_GAP) => {
                vec![]
            }
            Message::LoadReport(r) => {
                self.reported = Some(now);
                vec![Effect::Report(r.models)]
            }
            Message::Drain => {
                self.drain.get_or_insert(Drain {
                    next_check: now + DRAIN_CHECK,
                    quiet: 0,
                    released: false,
                });
                vec![Effect::Draining]
            }
            Message::Placed(p) => vec![Effect::Placed(p)],
            Message::Goodbye => vec![Effect::Goodbye, Effect::End(End::Left)],
            other => vec![Effect::End(End::Protocol(format!(
                "a {} on the control stream",
                crate::cluster::answer::message_name(&other)
            )))],
        }
    }

    /// When the session next needs [`RouterSession::on_timeout`] (a draining node's check).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.drain.as_ref().filter(|d| !d.released).map(|d| d.next_check)
    }

    /// The time came (see [`RouterSession::poll_timeout`]); `inflight` is the router's in-flight
    /// count on the link now. Releases a draining node after enough quiet checks in a row.
    pub fn on_timeout(&mut self, inflight: u32, now: Instant) -> Vec<Effect> {
        let Some(d) = self.drain.as_mut().filter(|d| !d.released && now >= d.next_check) else {
            return vec![];
        };
        d.quiet = if inflight == 0 { d.quiet + 1 } else { 0 };
        d.next_check = now + DRAIN_CHECK;
        if d.quiet < QUIET_CHECKS {
            return vec![];
        }
        d.released = true;
        vec![Effect::Send(Message::Released)]
    }
}
