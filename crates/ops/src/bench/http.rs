//! KServe v2 over HTTP/1.1 (hyper): model metadata and config, and inference with binary tensors.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use mesh::http::path_segment;
use serde_json::{json, Value};

use super::inputs::{InputSpec, ModelInfo, RequestTensor};
use super::report::{ErrorKind, RequestError};
use super::{describe, describe_io, SetupError, SetupKind};

/// The header giving the length of the JSON part of a binary-extension body.
const HEADER_LENGTH: &str = "inference-header-content-length";
/// How much of a failed answer's body is kept as its message.
const MAX_ERROR_TEXT: usize = 300;

/// The server: where to connect and what to write in `Host`.
#[derive(Debug)]
pub struct Target {
    url: String,
    /// `host:port` to connect to.
    addr: String,
    /// The `Host` header.
    host: String,
    /// A path prefix from the URL (empty, or `/prefix` without a trailing slash).
    prefix: String,
    timeout: Duration,
}

/// A ready request body: the JSON header and the tensors' bytes after it.
#[derive(Debug)]
pub struct Body {
    path: String,
    header_len: usize,
    bytes: Bytes,
}

impl Target {
    /// Accepts `http://HOST:PORT[/prefix]` or `HOST:PORT`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, SetupError> {
        let url = crate::http::with_scheme(url);
        let parsed = crate::http::Url::parse(&url).map_err(|e| SetupError::usage(format!("--url: {e}")))?;
        Ok(Target {
            url: url.trim_end_matches('/').to_string(),
            addr: format!("{}:{}", parsed.host, parsed.port),
            host: if parsed.port == 80 {
                parsed.host.clone()
            } else {
                format!("{}:{}", parsed.host, parsed.port)
            },
            prefix: parsed.path.trim_end_matches('/').to_string(),
            timeout,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, RequestError> {
        let stream = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| RequestError::new(ErrorKind::Connect, describe_io(&e)))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| RequestError::new(ErrorKind::Connect, describe(&e)))?;
        tokio::spawn(conn);
        Ok(sender)
    }

    /// GETs `path` on a connection of its own: the status and the body.
    async fn get(&self, path: &str) -> Result<(StatusCode, Bytes), SetupError> {
        let exchange = async {
            let mut sender = self.connect().await?;
            let req = self.request(Method::GET, path, Bytes::new(), None);
            let resp = sender.send_request(req).await.map_err(|e| classify(&e))?;
            let status = resp.status();
            let body = resp.into_body().collect().await.map_err(|e| classify(&e))?;
            Ok::<_, RequestError>((status, body.to_bytes()))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) if e.kind == ErrorKind::Connect => Err(SetupError::new(
                SetupKind::Unreachable,
                format!("cannot reach {}: {}", self.url, e.message),
            )),
            Ok(Err(e)) => Err(SetupError::new(
                SetupKind::Unreachable,
                format!("GET {}{path}: {}", self.url, e.message),
            )),
            Err(_) => Err(SetupError::new(
                SetupKind::Unreachable,
                format!(
                    "cannot reach {}: no answer to GET {path} within {:?}",
                    self.url, self.timeout
                ),
            )),
        }
    }

    fn request(&self, method: Method, path: &str, body: Bytes, header_len: Option<usize>) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(hyper::header::HOST, &self.host)
            .header(
                hyper::header::USER_AGENT,
                concat!("mesh-ops/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(n) = header_len {
            b = b
                .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
                .header(HEADER_LENGTH, n);
        }
        b.body(Full::new(body)).expect("a request of valid parts")
    }

    /// Reads the model's inputs (`GET /v2/models/M[/versions/V]`) and max_batch_size (`.../config`).
    pub async fn model_info(&self, model: &str, version: Option<&str>) -> Result<ModelInfo, SetupError> {
        let base = model_path(model, version);
        let named = match version {
            Some(v) => format!("model '{model}' version {v}"),
            None => format!("model '{model}'"),
        };
        let named = named.as_str();
        let answer = |path: String| async move {
            let (status, body) = self.get(&path).await?;
            if !status.is_success() {
                return Err(SetupError::new(
                    SetupKind::UnknownModel,
                    format!(
                        "{named}: {} answered HTTP {}: {}",
                        self.url,
                        status.as_u16(),
                        error_text(&body)
                    ),
                ));
            }
            serde_json::from_slice::<Value>(&body)
                .map_err(|e| SetupError::bad_answer(format!("GET {}{path}: not JSON: {e}", self.url)))
        };
        let metadata = answer(base.clone()).await?;
        let config = answer(format!("{base}/config")).await?;
        parse_model_info(&metadata, &config)
            .map_err(|e| SetupError::bad_answer(format!("{}: metadata of {model}: {e}", self.url)))
    }
}

/// `/v2/models/M` or `/v2/models/M/versions/V`, names percent-encoded.
fn model_path(model: &str, version: Option<&str>) -> String {
    match version {
        Some(v) => format!("/v2/models/{}/versions/{}", path_segment(model), path_segment(v)),
        None => format!("/v2/models/{}", path_segment(model)),
    }
}

/// The inputs from metadata JSON and max_batch_size from config JSON (absent means 0).
pub fn parse_model_info(metadata: &Value, config: &Value) -> Result<ModelInfo, String> {
    let inputs = metadata
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or("no \"inputs\" list")?
        .iter()
        .map(|i| {
            let name = i.get("name").and_then(Value::as_str).ok_or("an input without a name")?;
            let datatype = i
                .get("datatype")
                .and_then(Value::as_str)
                .ok_or(format!("input '{name}' has no datatype"))?;
            let shape = i
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .ok_or(format!("input '{name}' has no integer shape"))?;
            Ok(InputSpec {
                name: name.to_string(),
                datatype: datatype.to_string(),
                shape,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let max_batch_size = match config.get("max_batch_size") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or(format!("config max_batch_size {v} is not a non-negative integer"))?,
    };
    Ok(ModelInfo { inputs, max_batch_size })
}

/// The server's `{"error": "..."}` message, or the body as text.
fn error_text(body: &[u8]) -> String {
    if let Some(msg) = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
    {
        return msg;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".to_string()
    } else {
        text.chars().take(MAX_ERROR_TEXT).collect()
    }
}

/// The infer body for each request variant: the JSON header asks for binary outputs, then the tensors.
pub fn prepare(model: &str, version: Option<&str>, variants: &[Vec<RequestTensor>]) -> Vec<Body> {
    let path = format!("{}/infer", model_path(model, version));
    variants
        .iter()
        .map(|tensors| {
            let inputs: Vec<Value> = tensors
                .iter()
                .map(|t| {
                    json!({"name": t.name, "datatype": t.datatype.wire_name(), "shape": t.shape,
                           "parameters": {"binary_data_size": t.data.len()}})
                })
                .collect();
            let header = serde_json::to_vec(&json!({"inputs": inputs, "parameters": {"binary_data_output": true}}))
                .expect("JSON of plain values");
            let mut bytes = Vec::with_capacity(header.len() + tensors.iter().map(|t| t.data.len()).sum::<usize>());
            bytes.extend_from_slice(&header);
            for t in tensors {
                bytes.extend_from_slice(&t.data);
            }
            Body {
                path: path.clone(),
                header_len: header.len(),
                bytes: Bytes::from(bytes),
            }
        })
        .collect()
}

/// What a failed exchange on a connection counts as.
fn classify(e: &hyper::Error) -> RequestError {
    let kind = if e.is_parse() || e.is_parse_status() || e.is_user() {
        ErrorKind::Protocol
    } else {
        ErrorKind::Disconnected
    };
    RequestError::new(kind, describe(e))
}

/// One kept-alive connection, reopened when it breaks.
pub struct Slot {
    target: Arc<Target>,
    bodies: Arc<Vec<Body>>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Slot {
    pub fn new(target: Arc<Target>, bodies: Arc<Vec<Body>>) -> Self {
        Slot {
            target,
            bodies,
            sender: None,
        }
    }

    pub async fn connect(&mut self) -> Result<(), RequestError> {
        if self.sender.as_ref().is_none_or(SendRequest::is_closed) {
            self.sender = Some(self.target.connect().await?);
        }
        Ok(())
    }

    pub fn reset(&mut self) {
        self.sender = None;
    }

    /// Sends request variant `variant` and reads the whole answer. The connection is kept for the
    /// next request only when the exchange completed (a failed or abandoned one drops it).
    pub async fn infer(&mut self, variant: usize) -> Result<(), RequestError> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.target.connect().await?,
        };
        if sender.ready().await.is_err() {
            // The server closed the idle connection; nothing was sent yet, so dial again.
            sender = self.target.connect().await?;
            sender.ready().await.map_err(|e| classify(&e))?;
        }
        let body = &self.bodies[variant];
        let req = self
            .target
            .request(Method::POST, &body.path, body.bytes.clone(), Some(body.header_len));
        let resp = sender.send_request(req).await.map_err(|e| classify(&e))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| classify(&e))?.to_bytes();
        self.sender = Some(sender);
        if status.is_success() {
            Ok(())
        } else {
            Err(RequestError::new(ErrorKind::Http(status.as_u16()), error_text(&bytes)))
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
