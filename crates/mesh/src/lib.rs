//! Shared core of the mesh: tensors, model config, KServe v2 codecs and frontends, errors, the Dispatch seam.

pub mod classify;
pub mod cluster;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod dtype;
pub mod ensemble;
pub mod error;
pub mod grpc;
pub mod http;
pub mod listen;
pub mod logging;
pub mod metadata;
pub mod overrides;
pub mod params;
pub mod private;
pub mod process;
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
pub use request::{InferRequest, InferResponse, Param, Params, RequestedOutput};
pub use stream::{StreamItem, StreamSender};
pub use tensor::{NamedTensor, Tensor};

/// The server name and version reported by server metadata.
pub const SERVER_NAME: &str = "mesh";
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");
