//! A node's side of its control stream with one router, sans-IO: the hello waits for a welcome
//! (within [`HELLO_TIMEOUT`]), placement commands pass the fencing check (a deposed leader's are
//! refused, and a refused Place is answered), the node's drain is said once, and its leaving ends
//! with a goodbye. The node's own reports (model changes, load) are its report module's.
use std::time::{Duration, Instant};

use crate::cluster::fence::Fencing;
use crate::cluster::msg::{self, Message};

use super::End;

/// How long the hello and the router's welcome may take together.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the driver does after a step of the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Write this frame on the control stream.
    Send(Message),
    /// The router welcomed the node: serve its request streams from now on.
    Joined(msg::Welcome),
    /// Load this model of the cluster repository (the command passed fencing).
    Place(msg::Place),
    /// Unload this placed model (the command passed fencing).
    Evict(String),
    /// Everything the router placed here moved away: the node may be stopped.
    MayStop,
    /// This router leads placement from this epoch on.
    Leads(u64),
    /// The router released the draining node: nothing of its is in flight here any more.
    Released,
    /// A command of a deposed leader was refused; the driver logs and counts it.
    Fenced { command: &'static str, why: String },
    /// A frame the node does not expect on the control stream; ignored.
    Ignored(&'static str),
    /// The session is over.
    End(End),
}

/// Where the session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The hello was sent; the welcome is due by this time.
    Greeting {
        by: Instant,
    },
    Joined,
    Over,
}

/// A node's session with one router.
#[derive(Debug)]
pub struct NodeSession {
    state: State,
    drain_said: bool,
}

impl NodeSession {
    /// Starts a session at `now` with the node's hello, which the driver writes first.
    pub fn start(hello: msg::Hello, now: Instant) -> (Self, Effect) {
        let session = NodeSession {
            state: State::Greeting {
                by: now + HELLO_TIMEOUT,
            },
            drain_said: false,
        };
        (session, Effect::Send(Message::Hello(hello)))
    }

    pub fn joined(&self) -> bool {
        self.state == State::Joined
    }

    /// A frame the router sent; `fencing` is the node's highest placement epoch (shared by its
    /// sessions with every router).
    pub fn on_message(&mut self, message: Message, fencing: &Fencing) -> Vec<Effect> {
        match self.state {
            State::Over => vec![],
            State::Greeting { .. } => match message {
                Message::Welcome(w) => {
                    self.state = State::Joined;
                    vec![Effect::Joined(w)]
                }
                other => self.end(End::Protocol(format!(
                    "expected a welcome, got a {}",
                    crate::cluster::answer::message_name(&other)
                ))),
            },
            State::Joined => match message {
                Message::Place(p) => match admit(fencing, p.epoch) {
                    Ok(()) => vec![Effect::Place(p)],
                    Err(why) => {
                        let refused = msg::Placed {
                            model: p.model,
                            key: p.key,
                            error: why.clone(),
                            footprint: 0,
                        };
                        vec![fenced("place", why), Effect::Send(Message::Placed(refused))]
                    }
                },
                Message::Evict(e) => match admit(fencing, e.epoch) {
                    Ok(()) => vec![Effect::Evict(e.model)],
                    Err(why) => vec![fenced("evict", why)],
                },
                Message::MayStop(f) => match admit(fencing, f.epoch) {
                    Ok(()) => vec![Effect::MayStop],
                    Err(why) => vec![fenced("may-stop", why)],
                },
                Message::Fence(f) => match admit(fencing, f.epoch) {
                    Ok(()) => vec![Effect::Leads(f.epoch)],
                    Err(why) => vec![fenced("fence", why)],
                },
                Message::Released => vec![Effect::Released],
                other => vec![Effect::Ignored(crate::cluster::answer::message_name(&other))],
            },
        }
    }

    /// A Place this node carried out (or failed): the router hears how it ended.
    pub fn on_placed(&mut self, placed: msg::Placed) -> Vec<Effect> {
        match self.state {
            State::Joined => vec![Effect::Send(Message::Placed(placed))],
            _ => vec![],
        }
    }

    /// The node started draining: the router hears it once, so it routes nothing new here.
    pub fn on_drain(&mut self) -> Vec<Effect> {
        if self.state != State::Joined || self.drain_said {
            return vec![];
        }
        self.drain_said = true;
        vec![Effect::Send(Message::Drain)]
    }

    /// The node leaves: a goodbye, then the session is over.
    pub fn on_leave(&mut self) -> Vec<Effect> {
        match self.state {
            State::Over => vec![],
            State::Greeting { .. } => self.end(End::Left),
            State::Joined => {
                let mut out = vec![Effect::Send(Message::Goodbye)];
                out.extend(self.end(End::Left));
                out
            }
        }
    }

    /// When the session next needs [`NodeSession::on_timeout`] (the welcome's deadline).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Greeting { by } => Some(by),
            _ => None,
        }
    }

    pub fn on_timeout(&mut self, now: Instant) -> Vec<Effect> {
        match self.state {
            State::Greeting { by } if now >= by => {
                self.end(End::Lost(format!("no welcome within {HELLO_TIMEOUT:?} of the hello")))
            }
            _ => vec![],
        }
    }

    fn end(&mut self, end: End) -> Vec<Effect> {
        self.state = State::Over;
        vec![Effect::End(end)]
    }
}

/// Checks a command's epoch against the highest seen; a refusal says why.
fn admit(fencing: &Fencing, epoch: u64) -> Result<(), String> {
    fencing.admit(epoch).map_err(|seen| Fencing::refusal(epoch, seen))
}

fn fenced(command: &'static str, why: String) -> Effect {
    Effect::Fenced { command, why }
}
