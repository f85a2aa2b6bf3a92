//! The shared-memory extensions' HTTP endpoints (`/v2/systemsharedmemory/...` and
//! `/v2/cudasharedmemory/...`) over the server's registry.
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;

use super::error_response;
use crate::error::{Error, Result};
use crate::shm::SharedMemory;

type St = State<Arc<SharedMemory>>;

/// The endpoints, to be merged into the `/v2` router.
pub fn routes(shm: Arc<SharedMemory>) -> Router {
    Router::new()
        .route("/v2/systemsharedmemory/status", get(system_status_all))
        .route("/v2/systemsharedmemory/region/{name}/status", get(system_status))
        .route("/v2/systemsharedmemory/region/{name}/register", post(system_register))
        .route(
            "/v2/systemsharedmemory/region/{name}/unregister",
            post(system_unregister),
        )
        .route("/v2/systemsharedmemory/unregister", post(system_unregister_all))
        // No region named: Triton's "'region name' is necessary ..." (400).
        .route("/v2/systemsharedmemory/register", post(system_register_nameless))
        .route("/v2/cudasharedmemory/status", get(cuda_status_all))
        .route("/v2/cudasharedmemory/region/{name}/status", get(cuda_status))
        .route("/v2/cudasharedmemory/region/{name}/register", post(cuda_register))
        .route("/v2/cudasharedmemory/region/{name}/unregister", post(cuda_unregister))
        .route("/v2/cudasharedmemory/unregister", post(cuda_unregister_all))
        .route("/v2/cudasharedmemory/register", post(cuda_register_nameless))
        .with_state(shm)
}

fn answer<T: serde::Serialize>(r: Result<T>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(&e),
    }
}

fn done(r: Result<()>) -> Response {
    match r {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => error_response(&e),
    }
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8], what: &str) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| Error::invalid(format!("failed to parse the {what} request: {e}")))
}

async fn system_status_all(State(shm): St) -> Response {
    answer(shm.system_status(""))
}
async fn system_status(State(shm): St, Path(name): Path<String>) -> Response {
    answer(shm.system_status(&name))
}

/// A system register body: what `register_system` is given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemRegister {
    pub key: String,
    #[serde(default)]
    pub offset: u64,
    pub byte_size: u64,
}

/// Reads a system register body (nothing is opened).
pub fn parse_system_register(body: &[u8]) -> Result<SystemRegister> {
    parse::<SystemRegister>(body, "system shared memory register")
}

async fn system_register(State(shm): St, Path(name): Path<String>, body: Bytes) -> Response {
    done(parse_system_register(&body).and_then(|r| shm.register_system(&name, &r.key, r.offset, r.byte_size)))
}
/// A register naming no region is refused before its body is read, as Triton does.
async fn system_register_nameless() -> Response {
    done(SharedMemory::require_name("", "system"))
}
async fn cuda_register_nameless() -> Response {
    done(SharedMemory::require_name("", "cuda"))
}
async fn system_unregister(State(shm): St, Path(name): Path<String>) -> Response {
    done(shm.unregister_system(&name))
}
async fn system_unregister_all(State(shm): St) -> Response {
    done(shm.unregister_system(""))
}

async fn cuda_status_all(State(shm): St) -> Response {
    answer(shm.cuda_status(""))
}
async fn cuda_status(State(shm): St, Path(name): Path<String>) -> Response {
    answer(shm.cuda_status(&name))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHandle {
    b64: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CudaRegister {
    raw_handle: RawHandle,
    device_id: i64,
    byte_size: u64,
}

/// Reads a CUDA register body: the raw handle (decoded from base64), device id and byte size
/// that `register_cuda` is given (nothing is opened).
pub fn parse_cuda_register(body: &[u8]) -> Result<(Vec<u8>, i64, u64)> {
    use base64::Engine;
    let r = parse::<CudaRegister>(body, "CUDA shared memory register")?;
    let handle = base64::engine::general_purpose::STANDARD
        .decode(&r.raw_handle.b64)
        .map_err(|e| Error::invalid(format!("raw_handle.b64 is not valid base64: {e}")))?;
    Ok((handle, r.device_id, r.byte_size))
}

async fn cuda_register(State(shm): St, Path(name): Path<String>, body: Bytes) -> Response {
    done(
        parse_cuda_register(&body)
            .and_then(|(handle, device_id, byte_size)| shm.register_cuda(&name, &handle, device_id, byte_size)),
    )
}
async fn cuda_unregister(State(shm): St, Path(name): Path<String>) -> Response {
    done(shm.unregister_cuda(&name))
}
async fn cuda_unregister_all(State(shm): St) -> Response {
    done(shm.unregister_cuda(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_bodies_parse_without_opening_anything() {
        let r = parse_system_register(br#"{"key": "/k", "byte_size": 64}"#).unwrap();
        assert_eq!((r.key.as_str(), r.offset, r.byte_size), ("/k", 0, 64));
        let e = parse_system_register(br#"{"key": "/k", "byte_size": 64, "extra": 1}"#).unwrap_err();
        assert!(
            e.message
                .contains("failed to parse the system shared memory register request"),
            "{}",
            e.message
        );
        let (handle, device, size) =
            parse_cuda_register(br#"{"raw_handle": {"b64": "AAEC"}, "device_id": 1, "byte_size": 8}"#).unwrap();
        assert_eq!((handle, device, size), (vec![0, 1, 2], 1, 8));
        let e = parse_cuda_register(br#"{"raw_handle": {"b64": "!"}, "device_id": 0, "byte_size": 8}"#).unwrap_err();
        assert!(
            e.message.contains("raw_handle.b64 is not valid base64"),
            "{}",
            e.message
        );
    }
}
