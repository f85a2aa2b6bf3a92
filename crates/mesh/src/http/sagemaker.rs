//! Triton's SageMaker frontend (`--allow-sagemaker`, tritonserver 2.51 `src/sagemaker_server.cc`):
//! GET /ping, POST /invocations, and the multi-model routes under /models, serving inference
//! through the HTTP frontend's infer path.
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

use super::{read_body, run_infer, AppState, Framing, HttpOptions, Peer};
use crate::dispatch::Dispatch;
use crate::error::Error;
use crate::restrict::Restrictions;
use crate::shm::SharedMemory;
use crate::sync::Locked;

/// The Content-Type of a body whose JSON part is followed by binary data; its size follows `=`.
pub const BINARY_MIME: &str = "application/vnd.sagemaker-triton.binary+json;json-header-size=";
/// Names the model that POST /invocations runs, as tritonserver reads it.
pub const ENV_DEFAULT_MODEL: &str = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME";
/// `live`: /ping answers liveness; anything else (default `ready`): readiness.
pub const ENV_PING_MODE: &str = "SAGEMAKER_TRITON_PING_MODE";
/// The model /invocations names when [`ENV_DEFAULT_MODEL`] is not set, as tritonserver's.
pub const UNSPECIFIED_MODEL: &str = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME";
/// The header that names the model a multi-model request is for (else the name in the path or body).
const TARGET_MODEL: &str = "x-amzn-sagemaker-target-model";
/// The most files a model loaded from a path may have (as many as a load's `file:` overrides).
const MAX_MODEL_FILES: usize = 64;
/// How deep a loaded model's folders may nest.
const MAX_MODEL_DEPTH: usize = 8;

/// What the SageMaker port serves with.
#[derive(Debug, Clone)]
pub struct SageMakerOptions {
    /// Largest request body, and most bytes of model files one load reads (`--http-max-input-size`).
    pub max_input_size: usize,
    /// The model of POST /invocations.
    pub default_model: String,
    /// Whether /ping answers liveness (else readiness).
    pub ping_live: bool,
}

impl SageMakerOptions {
    /// Options from tritonserver's environment variables.
    pub fn from_env(max_input_size: usize) -> SageMakerOptions {
        let default_model = std::env::var(ENV_DEFAULT_MODEL).unwrap_or_else(|_| UNSPECIFIED_MODEL.to_string());
        let ping_live = std::env::var(ENV_PING_MODE).is_ok_and(|m| m == "live");
        SageMakerOptions {
            max_input_size,
            default_model,
            ping_live,
        }
    }
}

/// A request as tritonserver's SageMaker handler routes it (`Handle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Ping,
    Invocations,
    List,
    Get(String),
    Load,
    Invoke(String),
    Unload(String),
    /// Anything else: 400 with an empty body.
    Unknown,
}

/// Routes by method and path, as tritonserver's regular expressions do (`/models/x/invoke` read
/// by GET is model `x`; POST to `/models/x` is a load, whose name comes from the body).
pub fn route(method: &Method, path: &str) -> Route {
    if path == "/ping" {
        return Route::Ping;
    }
    if path == "/invocations" {
        return Route::Invocations;
    }
    let Some(rest) = path.strip_prefix("/models") else {
        return Route::Unknown;
    };
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let (name, invoke) = match rest.strip_suffix("/invoke") {
        Some(name) if !name.is_empty() => (name, true),
        _ if rest == "/invoke" => ("", true),
        _ => (rest, false),
    };
    if name.contains('/') {
        return Route::Unknown;
    }
    let name = name.to_string();
    match *method {
        Method::GET if name.is_empty() => Route::List,
        Method::GET => Route::Get(name),
        Method::POST if invoke => Route::Invoke(name),
        Method::POST => Route::Load,
        Method::DELETE => Route::Unload(name),
        _ => Route::Unknown,
    }
}

/// The restricted-API group a route belongs to (the mesh applies `--http-restricted-api` here too).
pub fn group(route: &Route) -> Option<&'static str> {
    Some(match route {
        Route::Ping => "health",
        Route::Invocations | Route::Invoke(_) => "inference",
        Route::List | Route::Get(_) | Route::Load | Route::Unload(_) => "model-repository",
        Route::Unknown => return None,
    })
}

/// The size of the JSON part a SageMaker Content-Type gives: None when the type is not the binary
/// one (the whole body is JSON). tritonserver's checks and words; the size is read as C's atoi.
pub fn header_length(content_type: Option<&HeaderValue>, body_len: usize) -> Result<Option<usize>, Error> {
    let Some(text) = content_type.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()) else {
        return Ok(None);
    };
    let Some(pos) = text.find(BINARY_MIME) else {
        return Ok(None);
    };
    if pos != 0 {
        return Err(Error::invalid(format!(
            "expect MIME type for binary data starts with '{BINARY_MIME}', got: {text}"
        )));
    }
    let given = &text[BINARY_MIME.len()..];
    match usize::try_from(atoi(given)) {
        Ok(n) if n <= body_len => Ok(Some(n)),
        _ => Err(Error::invalid(format!(
            "inference header size should be in range (0, {body_len}), got: {given}"
        ))),
    }
}

/// C's atoi: leading spaces, a sign, then digits up to the first other character (0 if none).
fn atoi(text: &str) -> i64 {
    let t = text.trim_start();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let n = digits
        .bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0i64, |n, d| n.saturating_mul(10).saturating_add(i64::from(d - b'0')));
    if negative {
        -n
    } else {
        n
    }
}

/// The Content-Type of an answer with binary outputs after `json_len` bytes of JSON.
pub fn binary_content_type(json_len: usize) -> String {
    format!("{BINARY_MIME}{json_len}")
}

/// Words tritonserver takes for an out-of-memory error (`SageMakerMMECheckOOMError`).
const OOM_WORDS: [&str; 17] = [
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "OOM",
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
];

/// A multi-model error as tritonserver answers it: 507 when it reads as out of memory, else 400.
pub fn mme_error(e: &Error) -> Response {
    let oom = OOM_WORDS.iter().any(|w| e.message.contains(w));
    let status = if oom {
        StatusCode::INSUFFICIENT_STORAGE
    } else {
        StatusCode::BAD_REQUEST
    };
    (status, Json(serde_json::json!({ "error": e.message }))).into_response()
}

fn with_status(status: StatusCode, e: &Error) -> Response {
    (status, Json(serde_json::json!({ "error": e.message }))).into_response()
}

/// A listening service for [`check_ports`]: its name, address, port, and the range it allows the
/// others' ports (`--sagemaker-safe-port-range`).
pub type Service<'a> = (&'a str, IpAddr, u16, Option<(u16, u16)>);

/// Checks `--sagemaker-safe-port-range` and that no two services share an address and port, as
/// tritonserver does.
pub fn check_ports(services: &[Service]) -> Result<(), String> {
    for (i, (name, addr, port, range)) in services.iter().enumerate() {
        let others = if range.is_some() { 0 } else { i + 1 };
        for (j, (other, other_addr, other_port, _)) in services.iter().enumerate().skip(others) {
            if i == j || addr != other_addr {
                continue;
            }
            if let Some((lo, hi)) = range.filter(|(lo, hi)| other_port < lo || other_port > hi) {
                return Err(format!(
                    "The server cannot listen to {other} requests at port {other_port}, allowed port range is [{lo}, {hi}]"
                ));
            }
            if port == other_port {
                return Err(format!(
                    "The server cannot listen to {name} requests and {other} requests at the same address and port {addr}:{port}"
                ));
            }
        }
    }
    Ok(())
}

/// Reads `--sagemaker-safe-port-range`: `<low>-<high>`.
pub fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let bad = || format!("--sagemaker-safe-port-range '{text}' must be <integer>-<integer> (ports)");
    let (lo, hi) = text.split_once('-').ok_or_else(bad)?;
    let lo = lo.trim().parse().map_err(|_| bad())?;
    let hi = hi.trim().parse().map_err(|_| bad())?;
    Ok((lo, hi))
}

/// A model loaded through POST /models: the name it is served under and the URL it came from.
#[derive(Debug, Clone)]
struct Loaded {
    target: String,
    url: String,
}

struct SageMaker<D> {
    app: AppState<D>,
    rules: Arc<Restrictions>,
    options: SageMakerOptions,
    /// By the name the client gave (`model_name`, SageMaker's hash of the model).
    models: Mutex<BTreeMap<String, Loaded>>,
}

type St<D> = State<Arc<SageMaker<D>>>;

/// The SageMaker port's service over a dispatcher; `rules` are the HTTP port's restricted APIs,
/// `shm` the server's shared-memory registry.
pub fn router<D: Dispatch>(
    dispatch: Arc<D>,
    options: SageMakerOptions,
    rules: Arc<Restrictions>,
    shm: Arc<SharedMemory>,
) -> Router {
    let http = HttpOptions {
        max_input_size: options.max_input_size,
        // tritonserver's SageMaker server forwards no headers.
        forward_headers: None,
    };
    let state = Arc::new(SageMaker {
        app: AppState {
            dispatch,
            options: http,
            shm,
        },
        rules,
        options,
        models: Mutex::new(BTreeMap::new()),
    });
    Router::new().fallback(handle::<D>).with_state(state)
}

fn empty(status: StatusCode) -> Response {
    status.into_response()
}

fn method_not_allowed() -> Response {
    let body = serde_json::json!({ "error": "Method Not Allowed" });
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

/// The model a multi-model request is for: the target-model header, else `name`.
fn target(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(TARGET_MODEL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(name)
        .to_string()
}

async fn handle<D: Dispatch>(
    State(s): St<D>,
    Peer(client): Peer,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let route = route(&method, uri.path());
    tracing::debug!("SageMaker request: {method} {}", uri.path().escape_debug());
    if let Some(key) = group(&route).and_then(|g| s.rules.refuses(g, |k| text(&headers, k))) {
        let body = serde_json::json!({ "error": format!("This API is restricted, expecting header '{key}'") });
        return (StatusCode::FORBIDDEN, Json(body)).into_response();
    }
    match route {
        Route::Ping if method != Method::GET => method_not_allowed(),
        Route::Ping if s.options.ping_live || s.app.dispatch.ready() => empty(StatusCode::OK),
        Route::Ping => empty(StatusCode::BAD_REQUEST),
        Route::Invocations if method != Method::POST => method_not_allowed(),
        Route::Invocations => {
            let model = (s.options.default_model.clone(), String::new());
            let framing = Framing::SageMaker { mme: false };
            run_infer(&s.app, model, client, headers, body, framing).await
        }
        Route::List => list(&s),
        Route::Get(name) => match s.models.locked().get(&name) {
            Some(m) => Json(serde_json::json!({ "modelName": name, "modelUrl": m.url })).into_response(),
            None => empty(StatusCode::NOT_FOUND),
        },
        Route::Invoke(name) => {
            // As tritonserver: a loaded name, and the model the target-model header names, if any.
            let Some(loaded) = stored_target(&s, &name) else {
                return empty(StatusCode::NOT_FOUND);
            };
            let model = (target(&headers, &loaded), String::new());
            let framing = Framing::SageMaker { mme: true };
            run_infer(&s.app, model, client, headers, body, framing).await
        }
        Route::Load => load(&s, &headers, body).await,
        Route::Unload(name) => unload(&s, &name).await,
        Route::Unknown => empty(StatusCode::BAD_REQUEST),
    }
}

/// The model POST /models loaded as `name` (the target it was loaded under).
fn stored_target<D>(s: &SageMaker<D>, name: &str) -> Option<String> {
    let models = s.models.locked();
    models.get(name).map(|m| m.target.clone())
}

fn text(headers: &HeaderMap, key: &str) -> Option<String> {
    headers.get(key).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// GET /models: the loaded models; one not ready (version 1, as tritonserver asks) is an empty object.
fn list<D: Dispatch>(s: &SageMaker<D>) -> Response {
    let models = s.models.locked().clone();
    let rows: Vec<serde_json::Value> = models
        .iter()
        .map(|(name, m)| match s.app.dispatch.model(&m.target, "1") {
            Ok(view) if view.ready => serde_json::json!({ "modelName": name, "modelUrl": m.url }),
            _ => serde_json::json!({}),
        })
        .collect();
    Json(serde_json::json!({ "models": rows })).into_response()
}

/// The `model_name` and `url` of a load body (either may be absent: empty).
pub fn load_request(body: &[u8]) -> Result<(String, String), Error> {
    if body.is_empty() {
        return Ok((String::new(), String::new()));
    }
    let v = super::json_bounded::parse(body, "request JSON")?;
    let field = |key: &str| match v.get(key) {
        None => Ok(String::new()),
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(Error::invalid(format!("'{key}' must be a string"))),
    };
    Ok((field("model_name")?, field("url")?))
}

/// POST /models: loads the model at `url` under the target name, as tritonserver registers the
/// path as a repository and loads it; only where the server loads models on request (explicit
/// model control).
async fn load<D: Dispatch>(s: &SageMaker<D>, headers: &HeaderMap, body: Body) -> Response {
    let answer = async {
        let body = read_body(body, s.options.max_input_size).await?;
        let (name, url) = load_request(&body)?;
        let target = target(headers, &name);
        // Before the path is looked at: a server that chose its models serves no other.
        if !s.app.dispatch.extensions().contains(&"model_repository") {
            return Err(Error::unavailable(
                "explicit model load / unload is not allowed if polling is enabled",
            ));
        }
        crate::repository::check_model_name(&target)?;
        {
            // The name is taken now, before the awaits, so two loads of one name cannot both pass.
            let mut models = s.models.locked();
            if models.contains_key(&name) || models.values().any(|m| m.target == target) {
                return Ok(Err(Error::new(
                    crate::error::Code::AlreadyExists,
                    format!("failed to load '{target}': a model named '{name}' is loaded already"),
                )));
            }
            let loading = Loaded {
                target: target.clone(),
                url: url.clone(),
            };
            models.insert(name.clone(), loading);
        }
        let forget = || s.models.locked().remove(&name);
        let limit = s.options.max_input_size;
        let (t, u) = (target.clone(), url.clone());
        let read = tokio::task::spawn_blocking(move || model_at(&u, &t, limit))
            .await
            .map_err(|e| Error::internal(format!("reading the model failed: {e}")))
            .and_then(|r| r);
        let (options, model_url) = match read {
            Ok(read) => read,
            Err(e) => {
                forget();
                return Err(e);
            }
        };
        if let Err(e) = s.app.dispatch.load_model(&target, options).await {
            forget();
            return Ok(Err(e));
        }
        let loaded = Loaded { target, url: model_url };
        s.models.locked().insert(name, loaded);
        Ok(Ok(()))
    };
    match answer.await {
        Ok(Ok(())) => empty(StatusCode::OK),
        Ok(Err(e)) if e.code == crate::error::Code::AlreadyExists => with_status(StatusCode::CONFLICT, &e),
        Ok(Err(e)) => mme_error(&e),
        Err(e) => with_status(StatusCode::BAD_REQUEST, &e),
    }
}

/// DELETE /models/{name}: unloads a model POST /models loaded, with the models that depend on it.
async fn unload<D: Dispatch>(s: &SageMaker<D>, name: &str) -> Response {
    // The model it loaded, whatever a header says now: a DELETE unloads nothing else.
    let Some(target) = stored_target(s, name) else {
        return empty(StatusCode::NOT_FOUND);
    };
    if let Err(e) = s.app.dispatch.unload_model(&target, true).await {
        return with_status(StatusCode::BAD_REQUEST, &e);
    }
    s.models.locked().remove(name);
    empty(StatusCode::OK)
}

/// tritonserver's split of a SageMaker model path: `/opt/ml/models/<hash>/model[/<dir>]`.
fn sagemaker_parent(url: &str) -> Option<String> {
    let re = regex::Regex::new(r"^(/opt/ml/models/[0-9A-Za-z._]+)/(model)/?([0-9A-Za-z._]+)?$").ok()?;
    re.captures(url).map(|c| c[1].to_string())
}

fn bad(message: String) -> Error {
    Error::invalid(message)
}

/// The model a load's `url` holds, as load options (its config, as JSON, named `target`, and its
/// files) and the URL tritonserver reports for it. `url` is the model's directory when it holds a
/// config.pbtxt; else a repository whose model directory is named `target`, or its only one.
/// Nothing outside the model's directory is read: a link that leads out is refused.
pub fn model_at(url: &str, target: &str, limit: usize) -> Result<(crate::LoadOptions, String), Error> {
    let fail = |why: String| {
        bad(format!(
            "failed to load '{target}' from '{}': {why}",
            url.escape_debug()
        ))
    };
    if url.is_empty() || url.contains('\0') {
        return Err(fail("the url must name a directory".into()));
    }
    let root = std::fs::canonicalize(url).map_err(|e| fail(format!("{e}")))?;
    if !root.is_dir() {
        return Err(fail("it is not a directory".into()));
    }
    let (dir, model_url) = if root.join("config.pbtxt").is_file() {
        (root, sagemaker_parent(url).unwrap_or_else(|| url.to_string()))
    } else {
        (model_subdir(&root, target).map_err(fail)?, url.to_string())
    };
    let mut files = Vec::new();
    let mut total = 0usize;
    collect(&dir, &dir, 0, &mut files, &mut total, limit).map_err(fail)?;
    let mut config = match read_config(&dir, limit.saturating_sub(total)) {
        Ok(Some(text)) => crate::config::parse_pbtxt(&text).map_err(|e| fail(format!("config.pbtxt: {e}")))?,
        Ok(None) => crate::config::ModelConfig::default(),
        Err(e) => return Err(fail(format!("config.pbtxt: {e}"))),
    };
    // The directory's model is served under the target name (tritonserver maps it so).
    config.name = target.to_string();
    let options = crate::LoadOptions {
        config: Some(crate::config::config_to_json(&config).to_string()),
        files,
    };
    Ok((options, model_url))
}

/// A model directory's `config.pbtxt` (None: it has none): a plain file inside the directory, of at
/// most `limit` bytes (what the model's other files left of `--http-max-input-size`).
fn read_config(dir: &FsPath, limit: usize) -> Result<Option<String>, String> {
    use std::io::Read;
    let path = dir.join("config.pbtxt");
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if !meta.is_file() {
        return Err("not a plain file".into());
    }
    if meta.len() > limit as u64 {
        return Err(format!(
            "larger than the limit of {limit} bytes (--http-max-input-size)"
        ));
    }
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(limit as u64).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    Ok(Some(text))
}

/// The model directory of a repository: the one named `target`, else the only one (directories
/// only: a link is not a model directory here, as tritonserver's scan skips them).
fn model_subdir(root: &FsPath, target: &str) -> Result<PathBuf, String> {
    let named = root.join(target);
    if std::fs::symlink_metadata(&named).is_ok_and(|m| m.is_dir()) {
        return Ok(named);
    }
    let entries = std::fs::read_dir(root).map_err(|e| e.to_string())?;
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(entry.path());
        }
    }
    match dirs.len() {
        1 => Ok(dirs.remove(0)),
        0 => Err("it holds no config.pbtxt and no model directory".into()),
        n => Err(format!("it holds {n} model directories and none is named '{target}'")),
    }
}

/// Reads the files under `dir` (relative to `root`) into `files`, within the count and byte limits.
fn collect(
    root: &FsPath,
    dir: &FsPath,
    depth: usize,
    files: &mut Vec<(String, bytes::Bytes)>,
    total: &mut usize,
    limit: usize,
) -> Result<(), String> {
    if depth > MAX_MODEL_DEPTH {
        return Err(format!("its folders nest deeper than {MAX_MODEL_DEPTH}"));
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let relative = path.strip_prefix(root).map_err(|e| e.to_string())?;
        let shown = relative.display().to_string();
        // A link must stay inside the model's directory (`root` is canonical).
        let real = std::fs::canonicalize(&path).map_err(|e| format!("'{shown}': {e}"))?;
        if !real.starts_with(root) {
            return Err(format!("'{shown}' links outside the model directory"));
        }
        let meta = std::fs::metadata(&real).map_err(|e| format!("'{shown}': {e}"))?;
        if meta.is_dir() {
            collect(root, &path, depth + 1, files, total, limit)?;
            continue;
        }
        if !meta.is_file() || shown == "config.pbtxt" {
            continue;
        }
        if files.len() >= MAX_MODEL_FILES {
            return Err(format!("it has more than {MAX_MODEL_FILES} files"));
        }
        *total = total.saturating_add(meta.len() as usize);
        if *total > limit {
            return Err(format!(
                "its files are larger than the limit of {limit} bytes (--http-max-input-size)"
            ));
        }
        let data = std::fs::read(&real).map_err(|e| format!("'{shown}': {e}"))?;
        let name = relative
            .to_str()
            .ok_or_else(|| format!("'{shown}' is not a UTF-8 path"))?;
        files.push((name.to_string(), bytes::Bytes::from(data)));
    }
    Ok(())
}

#[cfg(test)]
#[path = "sagemaker_tests.rs"]
mod tests;
