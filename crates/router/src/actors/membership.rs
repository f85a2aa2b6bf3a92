//! MembershipActor: the one writer of the router's membership table; link actors tell it what
//! nodes say and the supervisor tells it links that ended; each change republishes the routing view.
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::membership::Joined;
use crate::messages::MembershipMsg;
use crate::shared::RoutingView;

/// How often membership looks for silent nodes.
const TICK: Duration = Duration::from_millis(250);

pub struct MembershipActor;

impl Actor for MembershipActor {
    type Msg = MembershipMsg;
    type State = Arc<RoutingView>;
    type Arguments = Arc<RoutingView>;

    async fn pre_start(
        &self,
        myself: ActorRef<MembershipMsg>,
        view: Arc<RoutingView>,
    ) -> Result<Arc<RoutingView>, ActorProcessingErr> {
        ractor::time::send_interval(TICK, myself.get_cell(), || MembershipMsg::Tick);
        Ok(view)
    }

    async fn handle(
        &self,
        _: ActorRef<MembershipMsg>,
        msg: MembershipMsg,
        view: &mut Arc<RoutingView>,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match msg {
            MembershipMsg::Join(link, hello) => {
                let name = hello.name.clone();
                let mut joined = Ok(Joined::New);
                view.update(|m| {
                    joined = m.join(link, hello, now);
                    joined.is_ok()
                });
                let joined = match joined {
                    Ok(j) => j,
                    Err(why) => {
                        // Two hellos for one name raced past the link's own check: the later one is refused.
                        tracing::warn!(node = %name, "refused a node: {why}");
                        if let Some(l) = view.link(link) {
                            l.close(mesh::cluster::transport::close::REFUSED, &format!("cannot join: {why}"));
                        }
                        return Ok(());
                    }
                };
                let old = match joined {
                    Joined::New => None,
                    Joined::Rejoined { old_link } => old_link.map(|l| (l, "the same node joined again on a new link")),
                    Joined::Replaced { old_link, .. } => old_link.map(|l| (l, "a new incarnation of this node joined")),
                };
                if let Some((old, why)) = old {
                    tracing::info!(node = %name, "closing an older link of the node: {why}");
                    if let Some(l) = view.link(old) {
                        l.close(mesh::cluster::transport::close::REPLACED, why);
                    }
                }
            }
            MembershipMsg::Event(link, e) => {
                view.update(|m| m.model_event(link, e, now));
            }
            MembershipMsg::Report(link, loads) => {
                view.update(|m| m.report(link, loads, now));
            }
            MembershipMsg::Drain(link) => {
                view.update(|m| m.draining(link, now));
            }
            MembershipMsg::Goodbye(link) => {
                view.update(|m| m.goodbye(link, now));
            }
            MembershipMsg::LinkGone(link, why) => {
                tracing::debug!(link, "link gone: {why}");
                view.update(|m| m.link_lost(link, now));
            }
            MembershipMsg::Tick => {
                view.update(|m| m.tick(now));
            }
        }
        Ok(())
    }
}
