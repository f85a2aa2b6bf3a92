//! Serving: what a request from the HTTP/gRPC frontends passes through, from the listeners to the node's Dispatch.
pub mod bls;
pub mod cache;
pub mod dispatch;
pub mod sequence;
