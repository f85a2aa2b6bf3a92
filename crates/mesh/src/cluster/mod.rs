//! The cluster link shared by mesh-node and mesh-router: messages, framing, handshake, TLS.
pub mod certs;
pub mod tls;

#[cfg(test)]
mod tls_tests;
