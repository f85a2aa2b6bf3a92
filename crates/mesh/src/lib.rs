//! Shared core of the mesh: tensors, model config, KServe v2 codecs and frontends, errors, the Dispatch seam.

pub mod budget;
pub mod busy;
pub mod classify;
pub mod cluster;
pub mod compat;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod dtype;
pub mod ensemble;
pub mod error;
pub mod getopt;
pub mod grpc;
pub mod http;
pub mod listen;
pub mod logging;
pub mod metadata;
pub mod overrides;
pub mod params;
pub mod private;
pub mod process;
pub mod queued;
pub mod repository;
pub mod request;
pub mod restrict;
pub mod serve;
pub mod shm;
pub mod stream;
pub mod sync;
pub mod telemetry;
pub mod tensor;
pub mod trace;
pub mod validate;

#[cfg(test)]
mod mutation_tests;

/// Types generated from the mesh's own wire-compatible `.proto` files (package `inference`).
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("inference");
    /// Encoded descriptor set of the protocol files, for text-format and JSON reflection.
    pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
}

pub use dispatch::{Dispatch, IndexEntry, LoadOptions, ModelView};
pub use dtype::DataType;
pub use error::{Code, Error, Result};
pub use request::{Client, InferRequest, InferResponse, Param, Params, RequestedOutput};
pub use stream::{StreamItem, StreamSender};
pub use tensor::{NamedTensor, Tensor};

/// The server name reported by server metadata unless `--id` gives another: Triton's default, since
/// clients and Triton's own tests check for it (the `version` is the mesh's).
pub const SERVER_NAME: &str = "triton";
static SERVER_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the name server metadata reports (`--id`); the first call wins.
pub fn set_server_name(name: &str) {
    let _ = SERVER_ID.set(name.to_string());
}

/// The name server metadata reports: `--id`, else [`SERVER_NAME`].
pub fn server_name() -> &'static str {
    SERVER_ID.get().map_or(SERVER_NAME, String::as_str)
}

/// The server version reported by server metadata.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");
