//! mesh-ops: the operator's tooling for a mesh cluster (status, models, placement, drains, rollouts, load generation, a chaos relay, certificates).
pub mod bench;
pub mod ca_dir;
pub mod certs;
pub mod chaos;
pub mod cli;
pub mod control;
pub mod http;
pub mod placement;
pub mod render;
pub mod revoke;
pub mod rollout;
pub mod status;
