//! The cluster link shared by mesh-node and mesh-router: messages, framing, handshake, TLS.
pub mod tls;
