//! The cluster link shared by mesh-node and mesh-router: messages, framing, handshake, transport, TLS.
//!
//! One QUIC connection per node–router pair, opened by the node. Its first bidirectional stream is
//! the control stream (hello and welcome, model events, load reports, drain, goodbye); every other
//! stream carries one request (or statistics query) and its answers, opened by the side that sends
//! the request. Frames are `frame`'s prelude, an rkyv header (`msg`) and tensor bytes.
pub mod answer;
pub mod call;
pub mod certs;
pub mod convert;
pub mod crl;
pub mod fence;
pub mod flags;
pub mod frame;
pub mod identity;
pub mod io;
pub mod msg;
pub mod reload;
pub mod revocation;
pub mod session;
pub mod ship;
pub mod shm;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tls;
pub mod transport;

pub use frame::{Frame, FrameError, Limits, PROTOCOL_VERSION};

#[cfg(test)]
mod tls_tests;
