//! mesh-router: the cluster entrypoint that routes KServe v2 requests to mesh-nodes over QUIC.
//!
//! A request passes `frontend` (mesh's HTTP/gRPC, generic over `Dispatch`) → `dispatch`
//! (RouterDispatch: forward, ensembles, statistics, control) → `route` (the routing rules choose a
//! node) → a link of `shared::links` (one stream on that node's QUIC connection).
//!
//! Modules import only downward, in these layers (top first):
//! - assembly: `main.rs` and `cli`;
//! - the request path: `dispatch`, `api`;
//! - actors: `actors` (supervisor, membership, link, placement); only the supervisor and `main.rs`
//!   name an actor;
//! - shared state: `shared` (the routing view, the link registry, placement's view), which the
//!   actors write and the request path reads without a hop;
//! - messages: `messages` (every actor message, and the typed mailboxes that carry them);
//! - pure decisions and leaves: `membership`, `route`, `place`, `lead`, `repository`,
//!   `ensembles`, `stats`, `metrics`.
pub mod actors;
pub mod api;
pub mod cli;
pub mod dispatch;
pub mod ensembles;
pub mod lead;
pub mod membership;
pub mod messages;
pub mod metrics;
pub mod place;
pub mod repository;
pub mod rollout;
pub mod route;
pub mod shared;
pub mod stats;

#[cfg(test)]
mod sim;
