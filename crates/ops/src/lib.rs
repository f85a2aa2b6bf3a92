//! mesh-ops: the operator's tooling for a mesh cluster (status, certificates).
pub mod bench;
pub mod certs;
pub mod cli;
pub mod http;
pub mod status;
