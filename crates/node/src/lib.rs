//! mesh-node's library: repository loading, backends, instances, the node's Dispatch and its side of the cluster link, shared by the binary, tests and benches.
pub mod actors;
pub mod backend;
pub mod cli;
pub mod cluster;
pub mod embed;
pub mod node;
pub mod placement;
pub mod repository;
pub mod serving;
pub mod telemetry;
