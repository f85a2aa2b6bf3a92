//! mesh-node's library: repository loading, backends, instances and the node's Dispatch, shared by the binary, tests and benches.
pub mod backend;
pub mod batch_io;
pub mod batching;
pub mod cli;
pub mod dispatch;
pub mod instance;
pub mod loader;
pub mod manager;
pub mod metrics;
pub mod ort_env;
pub mod placement;
pub mod repository;
pub mod server;
pub mod stats;
pub mod supervision;
pub mod warmup;
