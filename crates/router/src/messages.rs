//! What the router's actors are told: every actor message, and the typed mailboxes that carry them.
//!
//! A [`Mailbox`] is made at assembly, before the actor it reaches, and handed to whoever talks to
//! that actor, so who talks to whom is fixed when things are built. Its [`Inbox`] goes to the
//! supervisor, which delivers it to the actor instance of the moment: messages told while a
//! restarted actor starts again wait in the mailbox instead of being dropped.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh::cluster::msg::{self, Hello, Message};
use mesh::sync::Locked;
use mesh::{Error, LoadOptions, Result};
use quinn::{Connection, RecvStream, SendStream};
use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::membership::{LinkId, ModelEvent, ModelLoad, NodeHello};

/// The sending side of an actor's mailbox (cheap to clone).
pub struct Mailbox<M> {
    actor: &'static str,
    tx: mpsc::UnboundedSender<M>,
    /// For a mailbox that clients' requests reach: how many asks may wait at once.
    asks: Option<(Arc<tokio::sync::Semaphore>, usize)>,
}

impl<M> Clone for Mailbox<M> {
    fn clone(&self) -> Self {
        Mailbox {
            actor: self.actor,
            tx: self.tx.clone(),
            asks: self.asks.clone(),
        }
    }
}

/// The receiving side: the supervisor delivers it to the actor that reads it now.
pub struct Inbox<M> {
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<M>>>,
    /// A message taken for an actor that had just stopped: the next actor gets it first.
    held: Arc<Mutex<Option<M>>>,
    pump: Mutex<Option<AbortHandle>>,
}

/// A mailbox for the actor named `actor` (the name is for logs).
pub fn mailbox<M>(actor: &'static str) -> (Mailbox<M>, Inbox<M>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let inbox = Inbox {
        rx: Arc::new(tokio::sync::Mutex::new(rx)),
        held: Arc::new(Mutex::new(None)),
        pump: Mutex::new(None),
    };
    (Mailbox { actor, tx, asks: None }, inbox)
}

/// A mailbox that clients' requests reach through [`Mailbox::ask`]: at most `asks` of them wait
/// for an answer at once, and more are refused at once as overload, so a flood of them cannot
/// grow it without bound (what the actor tells itself, `tell`, is not counted).
pub fn bounded_mailbox<M>(actor: &'static str, asks: usize) -> (Mailbox<M>, Inbox<M>) {
    let (mut mailbox, inbox) = mailbox(actor);
    mailbox.asks = Some((Arc::new(tokio::sync::Semaphore::new(asks)), asks));
    (mailbox, inbox)
}

impl<M: ractor::Message> Mailbox<M> {
    /// Tells the actor; false when it is gone for good (its inbox was dropped).
    pub fn tell(&self, message: M) -> bool {
        let told = self.tx.send(message).is_ok();
        if !told {
            tracing::debug!(actor = self.actor, "the actor is gone; a message to it was dropped");
        }
        told
    }

    /// Asks the actor and waits at most `wait` for its answer.
    pub async fn ask<T: Send + 'static>(
        &self,
        wait: Duration,
        message: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
    ) -> Result<T> {
        let _turn = match &self.asks {
            Some((asks, limit)) => Some(asks.clone().try_acquire_owned().map_err(|_| {
                Error::overloaded(format!(
                    "the router's {} has {limit} requests waiting already; try again when they are done",
                    self.actor
                ))
            })?),
            None => None,
        };
        let (tx, rx) = ractor::concurrency::oneshot();
        if !self.tell(message(tx.into())) {
            return Err(Error::unavailable(format!("the router's {} stopped", self.actor)));
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Error::unavailable(format!(
                "the router's {} stopped before answering; try again",
                self.actor
            ))),
            Err(_) => Err(Error::unavailable(format!(
                "the router's {} did not finish within {}s; see mesh-ops status",
                self.actor,
                wait.as_secs()
            ))),
        }
    }
}

impl<M: ractor::Message> Inbox<M> {
    /// Delivers what the mailbox holds, and what it is told from now on, to `actor` (replacing the
    /// actor it went to before, which failed or stopped).
    pub fn deliver_to(&self, actor: ActorRef<M>) {
        let (rx, held) = (self.rx.clone(), self.held.clone());
        let mut pump = self.pump.locked();
        if let Some(old) = pump.take() {
            // Cancelled while it waits for a message (receiving is cancel-safe), so none is lost.
            old.abort();
        }
        let task = tokio::spawn(async move {
            let mut rx = rx.lock().await;
            let mut next = held.locked().take();
            loop {
                let m = match next.take() {
                    Some(m) => m,
                    None => match rx.recv().await {
                        Some(m) => m,
                        None => return,
                    },
                };
                if let Err(ractor::MessagingErr::SendErr(m)) = actor.cast(m) {
                    // The actor stopped: keep the message for the one the supervisor starts next.
                    *held.locked() = Some(m);
                    return;
                }
            }
        });
        *pump = Some(task.abort_handle());
    }
}

impl<M> Drop for Inbox<M> {
    fn drop(&mut self) {
        if let Some(p) = self.pump.locked().take() {
            p.abort();
        }
    }
}

/// To the MembershipActor, the one writer of membership: what nodes say, and links that ended.
pub enum MembershipMsg {
    Join(LinkId, NodeHello),
    Event(LinkId, ModelEvent),
    Report(LinkId, Vec<ModelLoad>),
    Drain(LinkId),
    Goodbye(LinkId),
    /// The link ended (connection lost, closed, or its actor failed), with why.
    LinkGone(LinkId, String),
    /// Periodic: silence detection and forgetting old lost nodes.
    Tick,
}

/// To a NodeLink, the actor of one connected node.
pub enum LinkMsg {
    Control(Message),
    /// The control stream or the connection ended, with why.
    Closed(String),
    /// The node sent a frame that breaks the protocol on the control stream.
    Broken(String),
    /// While the node drains: release it once nothing of ours is in flight on it.
    CheckDrain,
    /// Write a command (place, evict, may-stop) on the node's control stream.
    Send(Message),
}

/// To the PlacementActor: its tick, nodes' answers, and the operator's changes (answered once
/// the cluster got there, or why it cannot).
pub enum PlacementMsg {
    Tick,
    /// A node answered a Place.
    Placed(String, msg::Placed),
    Load(String, LoadOptions, RpcReplyPort<Result<()>>),
    Unload(String, RpcReplyPort<Result<()>>),
    Scale(String, Option<u32>, Option<u32>, RpcReplyPort<Result<(u32, u32)>>),
    Drain(String, RpcReplyPort<Result<()>>),
    /// An operator's rollout command for a model: answered with the rollout as it is then.
    Rollout(
        String,
        crate::rollout::Command,
        RpcReplyPort<Result<crate::rollout::Stored>>,
    ),
}

/// To the supervisor: a connection finished its handshake.
pub enum SupervisorMsg {
    Joined(Joining),
}

/// A node whose hello was read: what its NodeLink starts from.
pub struct Joining {
    pub conn: Connection,
    pub control: (SendStream, RecvStream),
    pub hello: Hello,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};

    struct Echo;

    impl Actor for Echo {
        type Msg = (u32, RpcReplyPort<Result<u32>>);
        type State = u32;
        type Arguments = u32;

        async fn pre_start(&self, _: ActorRef<Self::Msg>, add: u32) -> std::result::Result<u32, ActorProcessingErr> {
            Ok(add)
        }

        async fn handle(
            &self,
            _: ActorRef<Self::Msg>,
            (n, reply): Self::Msg,
            add: &mut u32,
        ) -> std::result::Result<(), ActorProcessingErr> {
            let _ = reply.send(Ok(n + *add));
            Ok(())
        }
    }

    #[tokio::test]
    async fn messages_told_while_no_actor_reads_wait_for_the_next_one() {
        let (mailbox, inbox) = mailbox("echo");
        let wait = Duration::from_secs(5);
        let first = Actor::spawn(None, Echo, 100).await.unwrap().0;
        inbox.deliver_to(first.clone());
        assert_eq!(mailbox.ask(wait, |r| (1, r)).await.unwrap(), 101);

        // The actor stops; what is asked meanwhile is answered by its replacement.
        first.stop(None);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending = {
            let mailbox = mailbox.clone();
            tokio::spawn(async move { mailbox.ask(wait, |r| (2, r)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = Actor::spawn(None, Echo, 200).await.unwrap().0;
        inbox.deliver_to(second.clone());
        // The stopped actor's pump took message 2 and kept it for the next actor.
        assert_eq!(pending.await.unwrap().unwrap(), 202);
        assert_eq!(mailbox.ask(wait, |r| (3, r)).await.unwrap(), 203);
        second.stop(None);
    }

    #[tokio::test]
    async fn a_bounded_mailbox_refuses_asks_beyond_its_limit_and_takes_them_again_once_answered() {
        let (mailbox, inbox) = bounded_mailbox::<(u32, RpcReplyPort<Result<u32>>)>("placement", 3);
        let wait = Duration::from_secs(30);
        // Nobody reads yet: three asks wait, the fourth is refused at once.
        let waiting: Vec<_> = (0..3)
            .map(|n| {
                let mailbox = mailbox.clone();
                tokio::spawn(async move { mailbox.ask(wait, |r| (n, r)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let e = mailbox.ask(wait, |r| (9, r)).await.unwrap_err();
        assert_eq!(e.code, mesh::error::Code::Overloaded);
        assert!(e.message.contains("placement has 3 requests waiting already"), "{e}");
        let actor = Actor::spawn(None, Echo, 10).await.unwrap().0;
        inbox.deliver_to(actor.clone());
        for (n, w) in waiting.into_iter().enumerate() {
            assert_eq!(w.await.unwrap().unwrap(), n as u32 + 10);
        }
        assert_eq!(
            mailbox.ask(wait, |r| (5, r)).await.unwrap(),
            15,
            "answered asks free their places"
        );
        actor.stop(None);
    }

    #[tokio::test]
    async fn an_unanswered_ask_times_out_and_a_dropped_inbox_refuses() {
        let (mailbox, inbox) = mailbox::<(u32, RpcReplyPort<Result<u32>>)>("nobody");
        let e = mailbox.ask(Duration::from_millis(50), |r| (1, r)).await.unwrap_err();
        assert!(e.message.contains("did not finish"), "{e}");
        drop(inbox);
        let e = mailbox.ask(Duration::from_millis(50), |r| (1, r)).await.unwrap_err();
        assert!(e.message.contains("stopped"), "{e}");
    }
}
