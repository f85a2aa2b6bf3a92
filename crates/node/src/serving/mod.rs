//! Serving: what a request from the HTTP/gRPC frontends (or an in-process caller) passes through, from the listeners to the node's Dispatch: its admission, the response cache, the computation.
pub mod admit;
pub mod bls;
pub mod cache;
pub(crate) mod cached;
pub(crate) mod compute;
pub mod dispatch;
pub mod sequence;
pub mod traced;
