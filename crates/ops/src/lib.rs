//! mesh-ops: the operator's tooling for a mesh cluster (status, models, placement, drains, load generation, certificates).
pub mod bench;
pub mod certs;
pub mod cli;
pub mod control;
pub mod http;
pub mod placement;
pub mod status;
