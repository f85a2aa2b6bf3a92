//! RouterSupervisor, the root of the router's actor tree: it starts the MembershipActor, the
//! PlacementActor and one NodeLink per connected node, each with what it talks to.
//!
//! Supervision edges: the supervisor is linked to every actor it starts. A NodeLink's end (clean
//! or not) becomes a membership event; the MembershipActor and the PlacementActor are started again
//! if they fail, and their mailboxes are delivered to the new instance (membership itself lives in
//! the routing view, and placement reads its state back from what nodes report, so nothing is lost).
use std::collections::HashMap;
use std::sync::Arc;

use mesh::Dispatch;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::link::{LinkArgs, NodeLink};
use super::membership::MembershipActor;
use super::placement::{PlacementActor, PlacementArgs};
use crate::membership::LinkId;
use crate::messages::{mailbox, Inbox, LinkMsg, Mailbox, MembershipMsg, PlacementMsg, SupervisorMsg};
use crate::place::PlacementSettings;
use crate::shared::{Link, Placement, RoutingView};

pub struct RouterSupervisor;

/// What the actor tree is built from (made in `main.rs`).
pub struct SupervisorArgs {
    pub view: Arc<RoutingView>,
    pub placement: Arc<Placement>,
    pub settings: PlacementSettings,
    /// The request path, where BLS calls from nodes go.
    pub bls: Arc<dyn Dispatch>,
    /// The MembershipActor's mailbox (NodeLinks and the supervisor tell it) and inbox.
    pub membership: Mailbox<MembershipMsg>,
    pub membership_inbox: Inbox<MembershipMsg>,
    /// The PlacementActor's mailbox (NodeLinks tell it; the request path asks through `Placement`).
    pub placement_mailbox: Mailbox<PlacementMsg>,
    pub placement_inbox: Inbox<PlacementMsg>,
}

pub struct SupervisorState {
    args: SupervisorArgs,
    membership: ActorRef<MembershipMsg>,
    placement: ActorRef<PlacementMsg>,
    /// Each NodeLink's link, and the inbox its actor reads.
    links: HashMap<ActorId, (LinkId, Inbox<LinkMsg>)>,
}

impl RouterSupervisor {
    async fn spawn_membership(
        myself: &ActorRef<SupervisorMsg>,
        args: &SupervisorArgs,
    ) -> Result<ActorRef<MembershipMsg>, ActorProcessingErr> {
        let (m, _) = Actor::spawn_linked(None, MembershipActor, args.view.clone(), myself.get_cell()).await?;
        args.membership_inbox.deliver_to(m.clone());
        Ok(m)
    }

    async fn spawn_placement(
        myself: &ActorRef<SupervisorMsg>,
        args: &SupervisorArgs,
    ) -> Result<ActorRef<PlacementMsg>, ActorProcessingErr> {
        let placement = PlacementArgs {
            handle: args.placement.clone(),
            view: args.view.clone(),
            settings: args.settings.clone(),
        };
        let (p, _) = Actor::spawn_linked(None, PlacementActor, placement, myself.get_cell()).await?;
        args.placement_inbox.deliver_to(p.clone());
        Ok(p)
    }
}

impl Actor for RouterSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let membership = Self::spawn_membership(&myself, &args).await?;
        let placement = Self::spawn_placement(&myself, &args).await?;
        Ok(SupervisorState {
            args,
            membership,
            placement,
            links: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let SupervisorMsg::Joined(joining) = msg;
        let view = &state.args.view;
        let id = view.links.next_id();
        let (control, inbox) = mailbox("node link");
        let limits = view.limits.for_link();
        let link = Arc::new(Link::new(
            id,
            joining.hello.name.clone(),
            joining.conn.clone(),
            control,
            limits,
        ));
        let args = LinkArgs {
            link: link.clone(),
            joining,
            view: view.clone(),
            membership: state.args.membership.clone(),
            placement: state.args.placement_mailbox.clone(),
            repo: state.args.placement.repo.clone(),
            bls: state.args.bls.clone(),
        };
        // Registered before membership hears of the node, so the routing view never names a link
        // the request path cannot find.
        view.links.add(link.clone());
        match Actor::spawn_linked(None, NodeLink, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                inbox.deliver_to(actor.clone());
                state.links.insert(actor.get_id(), (id, inbox));
            }
            Err(e) => {
                view.remove_link(id);
                tracing::warn!(node = %link.name, "could not start the node's link: {e}");
                link.close(
                    mesh::cluster::transport::close::PROTOCOL,
                    "the router could not start this link",
                );
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorTerminated(cell, _, why) => (cell, why.unwrap_or_else(|| "closed".into())),
            SupervisionEvent::ActorFailed(cell, e) => (cell, format!("link actor failed: {e}")),
            _ => return Ok(()),
        };
        if let Some((link, _inbox)) = state.links.remove(&cell.get_id()) {
            if let Some(l) = state.args.view.remove_link(link) {
                l.close(mesh::cluster::transport::close::NORMAL, "link closed by the router");
                tracing::info!(node = %l.name, link, "node link ended: {why}");
            }
            state.args.membership.tell(MembershipMsg::LinkGone(link, why));
        } else if cell.get_id() == state.membership.get_id() {
            tracing::error!("membership actor ended ({why}); starting it again");
            state.membership = Self::spawn_membership(&myself, &state.args).await?;
        } else if cell.get_id() == state.placement.get_id() {
            // Its state is read back from what nodes report: placed replicas are adopted.
            tracing::error!("placement actor ended ({why}); starting it again");
            state.placement = Self::spawn_placement(&myself, &state.args).await?;
        }
        Ok(())
    }
}
