//! mesh-router: the cluster entrypoint that routes KServe v2 requests to mesh-nodes over QUIC.
//!
//! A request passes `frontend` (mesh's HTTP/gRPC, generic over `Dispatch`) → `dispatch`
//! (RouterDispatch: route, retry) → `route` (the balancer picks a node) → `link` (one stream on
//! that node's QUIC connection). `membership` and `route` are sans-IO; the actors
//! (`supervisor`, `membership_actor`, `link::actor`) are thin shells around them.
pub mod api;
pub mod cli;
pub mod cluster;
pub mod dispatch;
pub mod ensembles;
pub mod lead;
pub mod link;
pub mod membership;
pub mod membership_actor;
pub mod metrics;
pub mod place;
pub mod placement;
pub mod placement_actor;
pub mod repository;
pub mod route;
pub mod stats;
pub mod supervisor;

#[cfg(test)]
mod sim;
