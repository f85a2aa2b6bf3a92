//! The router's actors, each a thin driver of shared state and pure decisions, built with what it
//! talks to: the supervisor (the root), membership (the one writer of membership), one link per
//! connected node, and placement.
pub mod link;
pub mod membership;
pub mod placement;
pub mod supervisor;

pub use supervisor::{RouterSupervisor, SupervisorArgs};
