//! The node's actor tree: NodeSupervisor → RepositoryManager → ModelActor → InstanceActor, and the model table they publish to.
pub mod instance;
pub mod manager;
pub mod model;
pub mod node;
pub mod table;

use ractor::{ActorRef, RpcReplyPort};

/// Sends `actor` a request and waits for the answer, without a timeout (loads can take long).
pub async fn ask<M: ractor::Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    who: &str,
    msg: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, String> {
    let gone = || format!("the {who} stopped before answering");
    actor.call(msg, None).await.map_err(|_| gone())?.success_or_else(gone)
}
