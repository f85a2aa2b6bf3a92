//! `TRITONSERVER_Server`: a mesh node started in the calling process on its own tokio runtime, and the server's calls.
use std::ffi::c_char;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use http_body_util::BodyExt;
use mesh::Dispatch;
use mesh_node::embed;
use mesh_node::serving::dispatch::NodeDispatch;
use tower::ServiceExt;

use crate::error::{from_mesh, Code, Failure, FailureExt};
use crate::live::Live;
use crate::message::{TRITONSERVER_Message, TRITONSERVER_Metrics, TRITONSERVER_Parameter};
use crate::options::TRITONSERVER_ServerOptions;
use crate::{ffi, out, text, TRITONSERVER_Error};

pub(crate) static SERVERS: Live = Live::new("server");

/// What requests and the server's calls share: the node's Dispatch and the runtime it runs on.
pub struct Core {
    pub dispatch: Arc<NodeDispatch>,
    pub runtime: tokio::runtime::Handle,
    pub stopped: AtomicBool,
    /// The server's name in its metadata (`TRITONSERVER_ServerOptionsSetServerId`): each server
    /// in the process keeps its own.
    id: String,
    /// Triton's HTTP frontend in process: metadata, config, statistics and the index are answered
    /// as JSON exactly as `GET /v2/...` answers them.
    http: axum::Router,
}

impl Core {
    /// UNAVAILABLE once the server was stopped.
    pub fn check_running(&self) -> Result<(), Failure> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Failure::unavailable("the server is stopped (TRITONSERVER_ServerStop)"));
        }
        Ok(())
    }

    /// A JSON answer of the HTTP frontend, or its error with the code its status stands for.
    fn json(&self, method: http::Method, path: &str, body: &'static str) -> Result<String, Failure> {
        self.check_running()?;
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .map_err(|e| Failure::invalid(format!("bad name in {path}: {e}")))?;
        let router = self.http.clone();
        let (status, bytes) = block_on(&self.runtime, async move {
            let response = router
                .oneshot(request)
                .await
                .map_err(|e| Failure::internal(e.to_string()))?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| Failure::internal(e.to_string()))?;
            Ok::<_, Failure>((status, bytes.to_bytes()))
        })?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status.is_success() {
            return Ok(text);
        }
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or(text);
        let code = match status.as_u16() {
            400 | 413 => Code::InvalidArg,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            501 => Code::Unsupported,
            503 => Code::Unavailable,
            _ => Code::Internal,
        };
        Err(Failure::of(code, message))
    }
}

/// A server: its runtime, the node on it (none once stopped) and what requests share.
pub struct TRITONSERVER_Server {
    runtime: Option<tokio::runtime::Runtime>,
    node: Mutex<Option<embed::Server>>,
    pub core: Arc<Core>,
}

/// Runs a future to its end from a C caller's thread; from inside a tokio runtime (a callback, or
/// a Rust application that calls the C API) it runs on a thread of its own, as blocking there is not allowed.
pub(crate) fn block_on<F: Future + Send>(runtime: &tokio::runtime::Handle, fut: F) -> F::Output
where
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| s.spawn(|| runtime.block_on(fut)).join())
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    } else {
        runtime.block_on(fut)
    }
}

/// The process's log settings come from the first server's options (logging is process-wide).
fn start_logging(args: &mesh_node::cli::Args) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        if let Err(e) = args.start_logging() {
            eprintln!("libtritonserver: {e}");
        }
    });
}

/// A C API model version as the Dispatch names it (negative: the version the policy picks).
pub(crate) fn version_text(version: i64) -> String {
    if version < 0 {
        String::new()
    } else {
        version.to_string()
    }
}

/// The HTTP path of a model (and version), names percent-encoded.
fn model_path(name: &str, version: i64) -> String {
    let name = mesh::http::path_segment(name);
    if version < 0 {
        format!("/v2/models/{name}")
    } else {
        format!("/v2/models/{name}/versions/{version}")
    }
}

/// Runs a call on a live, running server.
unsafe fn with_server(
    server: *mut TRITONSERVER_Server,
    f: impl FnOnce(&TRITONSERVER_Server) -> Result<(), Failure>,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let s = SERVERS.get(server)?;
        f(s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerNew(
    server: *mut *mut TRITONSERVER_Server,
    options: *mut TRITONSERVER_ServerOptions,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let server = out(server, "server")?;
        // SAFETY: options this library made and the caller has not deleted.
        let options = unsafe { options.as_ref() }.ok_or_else(|| Failure::invalid("options is null"))?;
        if options.repositories == 0 {
            return Err(Failure::invalid(
                "no model repository: call TRITONSERVER_ServerOptionsSetModelRepositoryPath",
            ));
        }
        let args = mesh_node::cli::Args::parse_flags(&options.flags).map_err(Failure::invalid)?;
        start_logging(&args);
        let args_id = args.triton.id.clone().unwrap_or_else(|| mesh::SERVER_NAME.to_string());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("tritonserver")
            .build()
            .map_err(|e| Failure::internal(format!("cannot start the server's runtime: {e}")))?;
        // As Triton: a repository that cannot be read, or models that fail to load with
        // exit-on-error, fail the server's start with INTERNAL (a bad option is INVALID_ARG above).
        let node = block_on(runtime.handle(), embed::Server::from_args(args)).map_err(Failure::internal)?;
        let dispatch = node.dispatch().clone();
        let http = mesh::http::router(
            dispatch.clone(),
            mesh::http::HttpOptions::default(),
            Arc::new(mesh::shm::SharedMemory::default()),
        );
        let core = Arc::new(Core {
            dispatch,
            runtime: runtime.handle().clone(),
            stopped: AtomicBool::new(false),
            id: args_id,
            http,
        });
        *server = SERVERS.add(Box::new(TRITONSERVER_Server {
            runtime: Some(runtime),
            node: Mutex::new(Some(node)),
            core,
        }));
        Ok(())
    })
}

impl TRITONSERVER_Server {
    /// Stops the node once: models finish what they run and are unloaded.
    fn stop(&self) {
        self.core.stopped.store(true, Ordering::Release);
        let node = self.node.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(node) = node {
            block_on(&self.core.runtime, node.stop());
        }
    }

    fn with_node<R>(&self, f: impl FnOnce(&embed::Server) -> R) -> Result<R, Failure> {
        let guard = self.node.lock().unwrap_or_else(|p| p.into_inner());
        let node = guard
            .as_ref()
            .ok_or_else(|| Failure::unavailable("the server is stopped (TRITONSERVER_ServerStop)"))?;
        Ok(f(node))
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerDelete(server: *mut TRITONSERVER_Server) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let mut s = SERVERS.take(server)?;
        s.stop();
        if let Some(runtime) = s.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerStop(server: *mut TRITONSERVER_Server) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_server`.
    unsafe {
        with_server(server, |s| {
            s.stop();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerIsLive(
    server: *mut TRITONSERVER_Server,
    live: *mut bool,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_server`.
    unsafe {
        with_server(server, |s| {
            *out(live, "live")? = !s.core.stopped.load(Ordering::Acquire);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerIsReady(
    server: *mut TRITONSERVER_Server,
    ready: *mut bool,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_server`.
    unsafe {
        with_server(server, |s| {
            *out(ready, "ready")? = !s.core.stopped.load(Ordering::Acquire) && s.core.dispatch.ready();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelIsReady(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    ready: *mut bool,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_server`.
    let name = unsafe { text(model_name, "model_name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            let ready = out(ready, "ready")?;
            *ready = false;
            s.core.check_running()?;
            let view = s
                .core
                .dispatch
                .model(name?, &version_text(model_version))
                .map_err(from_mesh)?;
            *ready = view.ready;
            Ok(())
        })
    }
}

/// Hands a JSON answer to the caller as a message.
fn message(to: *mut *mut TRITONSERVER_Message, json: String) -> Result<(), Failure> {
    *out(to, "message")? = Box::into_raw(Box::new(TRITONSERVER_Message { json }));
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerMetadata(
    server: *mut TRITONSERVER_Server,
    server_metadata: *mut *mut TRITONSERVER_Message,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_server`.
    unsafe {
        with_server(server, |s| {
            let json = s.core.json(http::Method::GET, "/v2", "")?;
            let mut metadata: serde_json::Value =
                serde_json::from_str(&json).map_err(|e| Failure::internal(format!("server metadata: {e}")))?;
            metadata["name"] = serde_json::Value::String(s.core.id.clone());
            message(server_metadata, metadata.to_string())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelMetadata(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    model_metadata: *mut *mut TRITONSERVER_Message,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_server`.
    let name = unsafe { text(model_name, "model_name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            let json = s.core.json(http::Method::GET, &model_path(name?, model_version), "")?;
            message(model_metadata, json)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelConfig(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    config_version: u32,
    model_config: *mut *mut TRITONSERVER_Message,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_server`.
    let name = unsafe { text(model_name, "model_name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            if config_version != 1 {
                return Err(Failure::invalid(format!(
                    "model config version {config_version} is not supported; only version 1"
                )));
            }
            let path = format!("{}/config", model_path(name?, model_version));
            message(model_config, s.core.json(http::Method::GET, &path, "")?)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelStatistics(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    model_stats: *mut *mut TRITONSERVER_Message,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_server`.
    let name = unsafe { text(model_name, "model_name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            let name = name?;
            let path = if name.is_empty() {
                "/v2/models/stats".to_string()
            } else {
                format!("{}/stats", model_path(name, model_version))
            };
            message(model_stats, s.core.json(http::Method::GET, &path, "")?)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelIndex(
    server: *mut TRITONSERVER_Server,
    flags: u32,
    model_index: *mut *mut TRITONSERVER_Message,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_server`.
    unsafe {
        with_server(server, |s| {
            let body = if flags & 1 != 0 { r#"{"ready":true}"# } else { "{}" };
            message(
                model_index,
                s.core.json(http::Method::POST, "/v2/repository/index", body)?,
            )
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerLoadModel(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: as TRITONSERVER_ServerLoadModelWithParameters with no parameters.
    unsafe { TRITONSERVER_ServerLoadModelWithParameters(server, model_name, std::ptr::null(), 0) }
}

/// A load's parameters: `config` (a JSON string) and `file:<path>` (bytes), as the repository extension takes them.
unsafe fn load_options(
    parameters: *const *const TRITONSERVER_Parameter,
    count: u64,
) -> Result<mesh::LoadOptions, Failure> {
    use crate::message::ParameterValue;
    let mut options = mesh::LoadOptions::default();
    if count == 0 {
        return Ok(options);
    }
    if parameters.is_null() {
        return Err(Failure::invalid("parameters is null"));
    }
    let count = usize::try_from(count).map_err(|_| Failure::invalid("parameter_count is too large"))?;
    // SAFETY: `parameters` holds `count` parameter pointers (the header's contract).
    for &p in unsafe { std::slice::from_raw_parts(parameters, count) } {
        // SAFETY: each is a parameter this library made.
        let p = unsafe { p.as_ref() }.ok_or_else(|| Failure::invalid("a load parameter is null"))?;
        let name = p.name.to_string_lossy();
        match (&*name, &p.value) {
            ("config", ParameterValue::String(json)) => options.config = Some(json.to_string_lossy().into_owned()),
            (file, ParameterValue::Bytes(bytes)) if file.starts_with("file:") => options
                .files
                .push((file["file:".len()..].to_string(), bytes::Bytes::copy_from_slice(bytes))),
            (other, _) => {
                return Err(Failure::invalid(format!(
                    "unrecognized load parameter '{other}' (expected 'config' as a string or 'file:<path>' as bytes)"
                )))
            }
        }
    }
    Ok(options)
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerLoadModelWithParameters(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    parameters: *const *const TRITONSERVER_Parameter,
    parameter_count: u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string and parameters this library made (the header's contract).
    let (name, options) = unsafe {
        (
            text(model_name, "model_name"),
            load_options(parameters, parameter_count),
        )
    };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            let (name, options) = (name?.to_string(), options?);
            s.core.check_running()?;
            let dispatch = s.core.dispatch.clone();
            block_on(
                &s.core.runtime,
                async move { dispatch.load_model(&name, options).await },
            )
            .map_err(from_mesh)
        })
    }
}

unsafe fn unload(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    dependents: bool,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_server`.
    let name = unsafe { text(model_name, "model_name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            let name = name?.to_string();
            s.core.check_running()?;
            let dispatch = s.core.dispatch.clone();
            block_on(&s.core.runtime, async move {
                dispatch.unload_model(&name, dependents).await
            })
            .map_err(from_mesh)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerUnloadModel(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `unload`.
    unsafe { unload(server, model_name, false) }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerUnloadModelAndDependents(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `unload`.
    unsafe { unload(server, model_name, true) }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerMetrics(
    server: *mut TRITONSERVER_Server,
    metrics: *mut *mut TRITONSERVER_Metrics,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_server`.
    unsafe {
        with_server(server, |s| {
            let text = s.with_node(|n| n.metrics())?;
            *out(metrics, "metrics")? = Box::into_raw(Box::new(TRITONSERVER_Metrics { text }));
            Ok(())
        })
    }
}

/// `TRITONSERVER_ServerModelBatchProperties` / `TransactionProperties` read the model's config.
unsafe fn model_property(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    flags: *mut u32,
    voidp: *mut *mut std::ffi::c_void,
    pick: fn(&mesh::proto::ModelConfig) -> u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_server`.
    let name = unsafe { text(model_name, "model_name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_server(server, |s| {
            if let Some(v) = voidp.as_mut() {
                *v = std::ptr::null_mut();
            }
            s.core.check_running()?;
            let view = s
                .core
                .dispatch
                .model(name?, &version_text(model_version))
                .map_err(from_mesh)?;
            *out(flags, "flags")? = pick(&view.config);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelBatchProperties(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    flags: *mut u32,
    voidp: *mut *mut std::ffi::c_void,
) -> *mut TRITONSERVER_Error {
    // TRITONSERVER_BATCH_FIRST_DIM (2) when the model batches, else TRITONSERVER_BATCH_UNKNOWN (1).
    // SAFETY: see `model_property`.
    unsafe {
        model_property(server, model_name, model_version, flags, voidp, |c| {
            if c.max_batch_size > 0 {
                2
            } else {
                1
            }
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelTransactionProperties(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    txn_flags: *mut u32,
    voidp: *mut *mut std::ffi::c_void,
) -> *mut TRITONSERVER_Error {
    // TRITONSERVER_TXN_DECOUPLED (2) or TRITONSERVER_TXN_ONE_TO_ONE (1).
    // SAFETY: see `model_property`.
    unsafe {
        model_property(server, model_name, model_version, txn_flags, voidp, |c| {
            if c.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) {
                2
            } else {
                1
            }
        })
    }
}
