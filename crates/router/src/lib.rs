//! mesh-router: the cluster entrypoint that routes KServe v2 requests to mesh-nodes over QUIC.

pub mod membership;
pub mod route;

#[cfg(test)]
mod sim;
