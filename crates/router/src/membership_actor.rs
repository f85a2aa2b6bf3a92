//! MembershipActor: the one writer of the router's membership table; link actors send it what
//! nodes say and the supervisor sends it links that ended; each change republishes the routing view.
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::cluster::Cluster;
use crate::membership::{Joined, LinkId, ModelEvent, ModelLoad, NodeHello};

/// What changes membership; the MembershipActor is its one writer.
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

/// How often membership looks for silent nodes.
const TICK: Duration = Duration::from_millis(250);

pub struct MembershipActor;

impl Actor for MembershipActor {
    type Msg = MembershipMsg;
    type State = Arc<Cluster>;
    type Arguments = Arc<Cluster>;

    async fn pre_start(
        &self,
        myself: ActorRef<MembershipMsg>,
        cluster: Arc<Cluster>,
    ) -> Result<Arc<Cluster>, ActorProcessingErr> {
        ractor::time::send_interval(TICK, myself.get_cell(), || MembershipMsg::Tick);
        Ok(cluster)
    }

    async fn handle(
        &self,
        _: ActorRef<MembershipMsg>,
        msg: MembershipMsg,
        cluster: &mut Arc<Cluster>,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match msg {
            MembershipMsg::Join(link, hello) => {
                let name = hello.name.clone();
                let mut joined = Ok(Joined::New);
                cluster.update(|m| {
                    joined = m.join(link, hello, now);
                    joined.is_ok()
                });
                let joined = match joined {
                    Ok(j) => j,
                    Err(why) => {
                        // Two hellos for one name raced past the link's own check: the later one is refused.
                        tracing::warn!(node = %name, "refused a node: {why}");
                        if let Some(l) = cluster.link(link) {
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
                    if let Some(l) = cluster.link(old) {
                        l.close(mesh::cluster::transport::close::REPLACED, why);
                    }
                }
            }
            MembershipMsg::Event(link, e) => {
                cluster.update(|m| m.model_event(link, e, now));
            }
            MembershipMsg::Report(link, loads) => {
                cluster.update(|m| m.report(link, loads, now));
            }
            MembershipMsg::Drain(link) => {
                cluster.update(|m| m.draining(link, now));
            }
            MembershipMsg::Goodbye(link) => {
                cluster.update(|m| m.goodbye(link, now));
            }
            MembershipMsg::LinkGone(link, why) => {
                tracing::debug!(link, "link gone: {why}");
                cluster.update(|m| m.link_lost(link, now));
            }
            MembershipMsg::Tick => {
                cluster.update(|m| m.tick(now));
            }
        }
        Ok(())
    }
}
