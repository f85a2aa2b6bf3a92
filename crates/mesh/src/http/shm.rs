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
        .route("/v2/cudasharedmemory/status", get(cuda_status_all))
        .route("/v2/cudasharedmemory/region/{name}/status", get(cuda_status))
        .route("/v2/cudasharedmemory/region/{name}/register", post(cuda_register))
        .route("/v2/cudasharedmemory/region/{name}/unregister", post(cuda_unregister))
        .route("/v2/cudasharedmemory/unregister", post(cuda_unregister_all))
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SystemRegister {
    key: String,
    #[serde(default)]
    offset: u64,
    byte_size: u64,
}

async fn system_register(State(shm): St, Path(name): Path<String>, body: Bytes) -> Response {
    done(
        parse::<SystemRegister>(&body, "system shared memory register")
            .and_then(|r| shm.register_system(&name, &r.key, r.offset, r.byte_size)),
    )
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

async fn cuda_register(State(shm): St, Path(name): Path<String>, body: Bytes) -> Response {
    use base64::Engine;
    let registered = parse::<CudaRegister>(&body, "CUDA shared memory register").and_then(|r| {
        let handle = base64::engine::general_purpose::STANDARD
            .decode(&r.raw_handle.b64)
            .map_err(|e| Error::invalid(format!("raw_handle.b64 is not valid base64: {e}")))?;
        shm.register_cuda(&name, &handle, r.device_id, r.byte_size)
    });
    done(registered)
}
async fn cuda_unregister(State(shm): St, Path(name): Path<String>) -> Response {
    done(shm.unregister_cuda(&name))
}
async fn cuda_unregister_all(State(shm): St) -> Response {
    done(shm.unregister_cuda(""))
}
