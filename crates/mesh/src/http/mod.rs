//! KServe v2 HTTP/REST frontend, generic over `Dispatch`.
pub mod codec;
#[doc(hidden)] // public for the fuzz targets (fuzz/)
pub mod compress;
#[doc(hidden)]
pub mod generate;
pub mod json_bounded;
mod json_data;
#[doc(hidden)]
pub mod raw;
pub mod sagemaker;
#[doc(hidden)]
pub mod shm;
mod trace;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::sync::Arc;

use crate::config::{config_to_json, message_to_json};
use crate::dispatch::Dispatch;
use crate::error::{Code, Error};
use crate::metadata::ModelMetadata;
use crate::request::Client;
use crate::shm::SharedMemory;
use crate::trace::front::{self, Frontend, Point};
use crate::trace::otel::context::Carrier;

/// The header that tells where the JSON part of a binary-extension body ends.
pub const HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// Limits and behaviours of the HTTP frontend.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest accepted request body, before and after decompression (Triton's `--http-max-input-size`).
    pub max_input_size: usize,
    /// Headers whose name matches become request parameters (`--http-header-forward-pattern`).
    pub forward_headers: Option<regex::Regex>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            max_input_size: 64 * 1024 * 1024,
            forward_headers: None,
        }
    }
}

/// Adds the headers (or gRPC metadata) whose name matches `pattern` to a request's parameters, as
/// strings, unless the request already has a parameter of that name.
pub fn forward_headers<'a>(
    pattern: &regex::Regex,
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
    parameters: &mut crate::Params,
) {
    for (name, value) in headers {
        if pattern.is_match(name) && !parameters.iter().any(|(k, _)| k == name) {
            let value = String::from_utf8_lossy(value).into_owned();
            parameters.push((name.to_string(), crate::Param::String(value)));
        }
    }
}

/// How an infer request's body is framed and its answer labelled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// KServe v2: Inference-Header-Content-Length, Content-Encoding and Accept-Encoding.
    KServe,
    /// SageMaker: the JSON part's size in the Content-Type, no compression; with `mme`, errors are
    /// 400 (507 for out of memory), as Triton's multi-model invoke answers them.
    SageMaker { mme: bool },
}

struct AppState<D> {
    dispatch: Arc<D>,
    options: HttpOptions,
    shm: Arc<SharedMemory>,
}

/// Builds the `/v2` router over a dispatcher; `shm` is the server's shared-memory registry (the
/// gRPC frontend's too).
pub fn router<D: Dispatch>(dispatch: Arc<D>, options: HttpOptions, shm: Arc<SharedMemory>) -> Router {
    let state = Arc::new(AppState {
        dispatch,
        options,
        shm: shm.clone(),
    });
    Router::new()
        .route("/v2", get(server_metadata::<D>))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready::<D>))
        .route("/v2/models/{model}", get(model_metadata::<D>))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata_v::<D>))
        .route("/v2/models/{model}/ready", get(model_ready::<D>))
        .route("/v2/models/{model}/versions/{version}/ready", get(model_ready_v::<D>))
        .route("/v2/models/{model}/config", get(model_config::<D>))
        .route("/v2/models/{model}/versions/{version}/config", get(model_config_v::<D>))
        .route("/v2/models/{model}/infer", post(infer::<D>))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer_v::<D>))
        .route("/v2/models/{model}/generate", post(generate_once::<D>))
        .route(
            "/v2/models/{model}/versions/{version}/generate",
            post(generate_once_v::<D>),
        )
        .route("/v2/models/{model}/generate_stream", post(generate_stream::<D>))
        .route(
            "/v2/models/{model}/versions/{version}/generate_stream",
            post(generate_stream_v::<D>),
        )
        .route("/v2/models/stats", get(all_stats::<D>))
        .route("/v2/models/{model}/stats", get(model_stats::<D>))
        .route("/v2/models/{model}/versions/{version}/stats", get(model_stats_v::<D>))
        .route("/v2/repository/index", post(repository_index::<D>))
        .route("/v2/logging", get(get_logging).post(post_logging))
        .route("/v2/repository/models/{model}/load", post(load::<D>))
        .route("/v2/repository/models/{model}/unload", post(unload::<D>))
        .fallback(|| async { error_response(&Error::not_found("unknown request path")) })
        .method_not_allowed_fallback(|| async {
            let e = Error::invalid("this HTTP method is not allowed on this path");
            (
                StatusCode::METHOD_NOT_ALLOWED,
                Json(serde_json::json!({ "error": e.message })),
            )
                .into_response()
        })
        .merge(trace::routes())
        .with_state(state)
        .merge(shm::routes(shm))
}

type St<D> = State<Arc<AppState<D>>>;

/// The logging extension: the current settings.
async fn get_logging() -> Response {
    Json(crate::logging::settings()).into_response()
}

/// The logging extension: changes some settings (a JSON object), answers them all.
async fn post_logging(body: Bytes) -> Response {
    use crate::logging::SettingValue;
    use serde_json::Value;
    let parsed: Value = match json_bounded::value(&body) {
        Ok(v) => v,
        Err(e) => return error_response(&Error::invalid(format!("the log settings are not JSON: {e}"))),
    };
    let Value::Object(map) = parsed else {
        return error_response(&Error::invalid("the log settings must be a JSON object"));
    };
    let changes: Vec<(String, SettingValue)> = map
        .into_iter()
        .map(|(k, v)| {
            let value = match v {
                Value::Bool(b) => SettingValue::Bool(b),
                Value::Number(n) => n
                    .as_u64()
                    .map_or_else(|| SettingValue::Str(n.to_string()), SettingValue::Uint),
                Value::String(s) => SettingValue::Str(s),
                other => SettingValue::Str(other.to_string()),
            };
            (k, value)
        })
        .collect();
    match crate::logging::update(&changes) {
        Ok(s) => Json(s).into_response(),
        Err(e) => error_response(&e),
    }
}

/// A model or node name as one URL path segment: everything but RFC 3986's unreserved characters
/// percent-encoded (the clients of the mesh's own APIs use it).
pub fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Renders an error as Triton does: `{"error": "..."}` with the mapped status.
pub fn error_response(e: &Error) -> Response {
    (e.http_status(), Json(serde_json::json!({ "error": e.message }))).into_response()
}

async fn server_metadata<D: Dispatch>(State(s): St<D>) -> Response {
    Json(serde_json::json!({
        "name": crate::server_name(),
        "version": crate::SERVER_VERSION,
        "extensions": s.dispatch.extensions(),
    }))
    .into_response()
}

/// Ready is 200; not ready is 400, as Triton answers.
async fn server_ready<D: Dispatch>(State(s): St<D>) -> StatusCode {
    if s.dispatch.ready() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

fn metadata<D: Dispatch>(s: &AppState<D>, model: &str, version: &str) -> Response {
    match s.dispatch.model(model, version) {
        Ok(view) => Json(ModelMetadata::from_view(&view)).into_response(),
        Err(e) => error_response(&e),
    }
}
async fn model_metadata<D: Dispatch>(State(s): St<D>, Path(m): Path<String>) -> Response {
    metadata(&s, &m, "")
}
async fn model_metadata_v<D: Dispatch>(State(s): St<D>, Path((m, v)): Path<(String, String)>) -> Response {
    metadata(&s, &m, &v)
}

fn ready<D: Dispatch>(s: &AppState<D>, model: &str, version: &str) -> StatusCode {
    match s.dispatch.model(model, version) {
        Ok(view) if view.ready => StatusCode::OK,
        _ => StatusCode::BAD_REQUEST,
    }
}
async fn model_ready<D: Dispatch>(State(s): St<D>, Path(m): Path<String>) -> StatusCode {
    ready(&s, &m, "")
}
async fn model_ready_v<D: Dispatch>(State(s): St<D>, Path((m, v)): Path<(String, String)>) -> StatusCode {
    ready(&s, &m, &v)
}

fn config<D: Dispatch>(s: &AppState<D>, model: &str, version: &str) -> Response {
    match s.dispatch.model(model, version) {
        Ok(view) => Json(config_to_json(&view.config)).into_response(),
        Err(e) => error_response(&e),
    }
}
async fn model_config<D: Dispatch>(State(s): St<D>, Path(m): Path<String>) -> Response {
    config(&s, &m, "")
}
async fn model_config_v<D: Dispatch>(State(s): St<D>, Path((m, v)): Path<(String, String)>) -> Response {
    config(&s, &m, &v)
}

async fn stats<D: Dispatch>(s: &AppState<D>, model: &str, version: &str) -> Response {
    match s.dispatch.model_statistics(model, version).await {
        Ok(r) => Json(message_to_json(&r, "inference.ModelStatisticsResponse")).into_response(),
        Err(e) => error_response(&e),
    }
}
async fn all_stats<D: Dispatch>(State(s): St<D>) -> Response {
    stats(&s, "", "").await
}
async fn model_stats<D: Dispatch>(State(s): St<D>, Path(m): Path<String>) -> Response {
    stats(&s, &m, "").await
}
async fn model_stats_v<D: Dispatch>(State(s): St<D>, Path((m, v)): Path<(String, String)>) -> Response {
    stats(&s, &m, &v).await
}

async fn repository_index<D: Dispatch>(State(s): St<D>, body: Bytes) -> Response {
    let ready_only = match parse_optional_json(&body) {
        Ok(v) => v.get("ready").and_then(|r| r.as_bool()).unwrap_or(false),
        Err(e) => return error_response(&e),
    };
    let rows: Vec<_> = s
        .dispatch
        .repository_index()
        .into_iter()
        .filter(|e| !ready_only || e.state == "READY")
        .map(|e| {
            let mut row = serde_json::json!({ "name": e.name, "state": e.state });
            if !e.version.is_empty() {
                row["version"] = e.version.into();
            }
            if !e.reason.is_empty() {
                row["reason"] = e.reason.into();
            }
            if !e.nodes.is_empty() {
                row["nodes"] = e.nodes.into();
            }
            row
        })
        .collect();
    Json(rows).into_response()
}

fn parse_optional_json(body: &[u8]) -> Result<serde_json::Value, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::json!({}));
    }
    json_bounded::parse(body, "request JSON")
}

/// Reads `{"parameters": {...}}` from a repository request body (which may be empty).
fn repository_parameters(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, Error> {
    let v = parse_optional_json(body)?;
    match v.get("parameters") {
        None => Ok(Default::default()),
        Some(serde_json::Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(Error::invalid(format!("'parameters' must be an object, got {other}"))),
    }
}

/// The load options of an HTTP load body: `config` as a JSON string, `file:<path>` as base64.
pub fn load_options(body: &[u8]) -> Result<crate::LoadOptions, Error> {
    use base64::Engine;
    let mut options = crate::LoadOptions::default();
    for (key, value) in repository_parameters(body)? {
        if key == "config" {
            let text = match value {
                serde_json::Value::String(s) => s,
                serde_json::Value::Object(_) => value.to_string(),
                other => {
                    return Err(Error::invalid(format!(
                        "parameter 'config' must be a JSON string, got {other}"
                    )))
                }
            };
            options.config = Some(text);
        } else if let Some(path) = key.strip_prefix("file:") {
            let text = value
                .as_str()
                .ok_or_else(|| Error::invalid(format!("parameter '{key}' must be base64 text")))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Error::invalid(format!("parameter '{key}' is not valid base64: {e}")))?;
            options.files.push((path.to_string(), Bytes::from(bytes)));
        } else {
            return Err(Error::invalid(format!("unknown load parameter '{key}'")));
        }
    }
    Ok(options)
}

async fn load<D: Dispatch>(State(s): St<D>, Path(m): Path<String>, body: Bytes) -> Response {
    let options = match load_options(&body) {
        Ok(o) => o,
        Err(e) => return error_response(&e),
    };
    match s.dispatch.load_model(&m, options).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => error_response(&e),
    }
}
async fn unload<D: Dispatch>(State(s): St<D>, Path(m): Path<String>, body: Bytes) -> Response {
    let dependents = match repository_parameters(&body) {
        Ok(p) => p.get("unload_dependents").and_then(|v| v.as_bool()).unwrap_or(false),
        Err(e) => return error_response(&e),
    };
    match s.dispatch.unload_model(&m, dependents).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => error_response(&e),
    }
}

/// Who sent a request: the peer of its connection, as the listener recorded it (`ConnectInfo`),
/// or an in-process caller where none did.
pub struct Peer(pub Client);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        Ok(Peer(peer.map_or(Client::Local, |c| Client::Connection(c.0))))
    }
}

async fn infer<D: Dispatch>(
    State(s): St<D>,
    Path(m): Path<String>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_infer(&s, (m, String::new()), client, headers, body, Framing::KServe).await
}
async fn infer_v<D: Dispatch>(
    State(s): St<D>,
    Path((m, v)): Path<(String, String)>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_infer(&s, (m, v), client, headers, body, Framing::KServe).await
}

async fn run_infer<D: Dispatch>(
    s: &AppState<D>,
    (model, version): (String, String),
    client: Client,
    headers: HeaderMap,
    body: Body,
    framing: Framing,
) -> Response {
    let served = async {
        match try_infer(s, (&model, &version), client, &headers, body, framing).await {
            Ok(r) => r,
            Err(e) if framing == (Framing::SageMaker { mme: true }) => sagemaker::mme_error(&e),
            Err(e) => error_response(&e),
        }
    };
    // The client's trace context (OpenTelemetry mode), read only while something traces.
    let carrier = front::active()
        .then(|| Carrier::from_lookup(|k| headers.get(k).map(|v| v.as_bytes())))
        .flatten();
    let received = std::time::Instant::now();
    crate::busy::around(front::serve(Frontend::Http, Some(&model), received, carrier, served)).await
}

async fn try_infer<D: Dispatch>(
    s: &AppState<D>,
    (model, version): (&str, &str),
    client: Client,
    headers: &HeaderMap,
    body: Body,
    framing: Framing,
) -> Result<Response, Error> {
    let limit = s.options.max_input_size;
    let body = read_body(body, limit).await?;
    let kserve = framing == Framing::KServe;
    let (body, header_len) = if kserve {
        let body = compress::decode(headers.get(header::CONTENT_ENCODING), body, limit)?;
        let header_len = kserve_header_len(headers)?;
        (body, header_len)
    } else {
        let header_len = sagemaker::header_length(headers.get(header::CONTENT_TYPE), body.len())?;
        (body, header_len)
    };
    let (mut request, format) = if header_len == Some(0) {
        // A raw binary body: the one input's data, every output answered in binary, as Triton does.
        let view = s.dispatch.model(model, version)?;
        let format = codec::OutputFormat {
            default_binary: true,
            ..Default::default()
        };
        (raw::decode_raw(model, version, &view.config, body)?, format)
    } else {
        codec::decode_request(model, version, body, header_len, &s.shm)?
    };
    if let Some(pattern) = &s.options.forward_headers {
        let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
        forward_headers(pattern, pairs, &mut request.parameters);
    }
    request.client = client;
    front::stamp(Point::RecvEnd);
    let response = s.dispatch.infer(request).await?;
    front::stamp(Point::SendStart);
    let (out, json_len) = codec::encode_response(&response, &format)?;
    let accept = compress::choose(headers.get(header::ACCEPT_ENCODING)).filter(|_| kserve);
    let mut builder = Response::builder().status(StatusCode::OK);
    builder = match json_len {
        Some(n) if !kserve => builder.header(header::CONTENT_TYPE, sagemaker::binary_content_type(n)),
        Some(n) => builder
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header(HEADER_CONTENT_LENGTH, HeaderValue::from(n)),
        None => builder.header(header::CONTENT_TYPE, "application/json"),
    };
    let out = match accept {
        Some(enc) => {
            builder = builder.header(header::CONTENT_ENCODING, enc.name());
            compress::encode(enc, &out)?
        }
        None => out,
    };
    builder
        .body(Body::from(out))
        .map_err(|e| Error::internal(format!("building response: {e}")))
}

/// The KServe Inference-Header-Content-Length, if given.
fn kserve_header_len(headers: &HeaderMap) -> Result<Option<usize>, Error> {
    let Some(v) = headers.get(HEADER_CONTENT_LENGTH) else {
        return Ok(None);
    };
    let n = v.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok());
    n.map(Some)
        .ok_or_else(|| Error::invalid("Inference-Header-Content-Length must be a non-negative integer"))
}

async fn generate_once<D: Dispatch>(
    State(s): St<D>,
    Path(m): Path<String>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_generate(&s, (m, String::new()), client, headers, body, false).await
}
async fn generate_once_v<D: Dispatch>(
    State(s): St<D>,
    Path((m, v)): Path<(String, String)>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_generate(&s, (m, v), client, headers, body, false).await
}
async fn generate_stream<D: Dispatch>(
    State(s): St<D>,
    Path(m): Path<String>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_generate(&s, (m, String::new()), client, headers, body, true).await
}
async fn generate_stream_v<D: Dispatch>(
    State(s): St<D>,
    Path((m, v)): Path<(String, String)>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_generate(&s, (m, v), client, headers, body, true).await
}

/// The generate extension: `stream` picks server-sent events over one JSON answer.
async fn run_generate<D: Dispatch>(
    s: &AppState<D>,
    (model, version): (String, String),
    client: Client,
    headers: HeaderMap,
    body: Body,
    stream: bool,
) -> Response {
    let answer = async {
        let limit = s.options.max_input_size;
        let body = read_body(body, limit).await?;
        let body = compress::decode(headers.get(header::CONTENT_ENCODING), body, limit)?;
        let mut request = generate::request_for(s.dispatch.as_ref(), &model, &version, &body)?;
        request.client = client;
        if let Some(pattern) = &s.options.forward_headers {
            let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
            forward_headers(pattern, pairs, &mut request.parameters);
        }
        front::stamp(Point::RecvEnd);
        if stream {
            generate::generate_stream(s.dispatch.clone(), request).await
        } else {
            generate::generate(s.dispatch.as_ref(), request).await
        }
    };
    // Traced as an infer request is (Triton's HTTP stamps), with the client's trace context.
    let carrier = front::active()
        .then(|| Carrier::from_lookup(|k| headers.get(k).map(|v| v.as_bytes())))
        .flatten();
    let received = std::time::Instant::now();
    let served = async { answer.await.unwrap_or_else(|e| error_response(&e)) };
    front::serve(Frontend::Http, Some(&model), received, carrier, served).await
}

/// Reads a body up to `limit` bytes; a larger body is rejected without being buffered.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, Error> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(limit)),
        Err(e) => Err(Error::invalid(format!("failed to read the request body: {e}"))),
    }
}

fn too_large(limit: usize) -> Error {
    Error::new(
        Code::PayloadTooLarge,
        format!("request body is larger than the limit of {limit} bytes (--http-max-input-size)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Param;

    #[test]
    fn matching_headers_become_string_parameters_without_overriding_the_body() {
        let pattern = regex::Regex::new("^x-fwd-").unwrap();
        let mut params = vec![("x-fwd-kept".to_string(), Param::Int(1))];
        let headers = [
            ("x-fwd-user", &b"alice"[..]),
            ("x-other", &b"no"[..]),
            ("x-fwd-kept", &b"from the header"[..]),
        ];
        forward_headers(&pattern, headers.into_iter(), &mut params);
        assert_eq!(
            params,
            vec![
                ("x-fwd-kept".to_string(), Param::Int(1)),
                ("x-fwd-user".to_string(), Param::String("alice".into())),
            ]
        );
    }
}
