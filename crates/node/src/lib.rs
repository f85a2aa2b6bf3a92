//! mesh-node's library: repository loading, backends, instances and the node's Dispatch, shared by the binary, tests and benches.
pub mod actors;
pub mod backend;
pub mod cli;
pub mod node;
pub mod placement;
pub mod repository;
pub mod serving;
pub mod telemetry;
