//! RouterSupervisor, the root of the router's actor tree: it starts the MembershipActor, the
//! PlacementActor and one NodeLink per connected node.
//! The supervisor turns a link actor's end (clean or not) into a membership event, and restarts the
//! MembershipActor if it fails (membership itself lives in `Cluster`, so nothing is lost).
use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::cluster::Cluster;
use crate::dispatch::RouterDispatch;
use crate::link::actor::{LinkArgs, NodeLink};
use crate::link::{Joining, Link};
use crate::membership::LinkId;
use crate::membership_actor::{MembershipActor, MembershipMsg};
use crate::placement_actor::{PlacementActor, PlacementArgs, PlacementMsg, PlacementSettings};

/// Messages to the supervisor: a connection finished its handshake.
pub enum SupervisorMsg {
    Joined(Joining),
}

pub struct RouterSupervisor;

pub struct SupervisorArgs {
    pub cluster: Arc<Cluster>,
    pub dispatch: Arc<RouterDispatch>,
    pub placement: PlacementSettings,
}

pub struct SupervisorState {
    args: SupervisorArgs,
    membership: ActorRef<MembershipMsg>,
    placement: ActorRef<PlacementMsg>,
    links: HashMap<ActorId, LinkId>,
}

impl RouterSupervisor {
    async fn spawn_membership(
        myself: &ActorRef<SupervisorMsg>,
        cluster: &Arc<Cluster>,
    ) -> Result<ActorRef<MembershipMsg>, ActorProcessingErr> {
        let (m, _) = Actor::spawn_linked(None, MembershipActor, cluster.clone(), myself.get_cell()).await?;
        cluster.set_membership_actor(m.clone());
        Ok(m)
    }

    async fn spawn_placement(
        myself: &ActorRef<SupervisorMsg>,
        args: &SupervisorArgs,
    ) -> Result<ActorRef<PlacementMsg>, ActorProcessingErr> {
        let placement = PlacementArgs {
            handle: args.dispatch.placement.clone(),
            cluster: args.cluster.clone(),
            settings: args.placement.clone(),
        };
        let (p, _) = Actor::spawn_linked(None, PlacementActor, placement, myself.get_cell()).await?;
        args.dispatch.placement.set_actor(p.clone());
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
        let membership = Self::spawn_membership(&myself, &args.cluster).await?;
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
        let cluster = &state.args.cluster;
        let id = cluster.next_link_id();
        let link = Arc::new(Link::new(id, joining.hello.name.clone(), joining.conn.clone()));
        let args = LinkArgs {
            link: link.clone(),
            joining,
            cluster: cluster.clone(),
            dispatch: state.args.dispatch.clone(),
        };
        // Registered before membership hears of the node, so the routing view never names a link
        // the request path cannot find.
        cluster.add_link(link.clone());
        match Actor::spawn_linked(None, NodeLink, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                link.set_control(actor.clone());
                state.links.insert(actor.get_id(), id);
            }
            Err(e) => {
                cluster.remove_link(id);
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
        if let Some(link) = state.links.remove(&cell.get_id()) {
            if let Some(l) = state.args.cluster.remove_link(link) {
                l.close(mesh::cluster::transport::close::NORMAL, "link closed by the router");
                tracing::info!(node = %l.name, link, "node link ended: {why}");
            }
            let _ = state.membership.cast(MembershipMsg::LinkGone(link, why));
        } else if cell.get_id() == state.membership.get_id() {
            tracing::error!("membership actor ended ({why}); starting it again");
            state.membership = Self::spawn_membership(&myself, &state.args.cluster).await?;
        } else if cell.get_id() == state.placement.get_id() {
            // Its state is read back from what nodes report: placed replicas are adopted.
            tracing::error!("placement actor ended ({why}); starting it again");
            state.placement = Self::spawn_placement(&myself, &state.args).await?;
        }
        Ok(())
    }
}
