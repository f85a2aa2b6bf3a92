//! A follower router hands an operator's placement change (load, unload, scale, drain, rollout) to the
//! leader over the leader's own HTTP API, and answers with the leader's answer: a Triton client
//! may send `load_model` to any router of the cluster.
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use mesh::http::path_segment;
use mesh::restrict::{http_group, Restrictions};
use mesh::{Code, Error, LoadOptions, Result};
use serde_json::{json, Map, Value};

/// The most of a leader's answer that is read (its answers are a line of JSON).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The HTTP request that carries a change to the leader.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    pub path: String,
    pub body: Value,
}

impl Forward {
    /// Triton's repository extension: `POST /v2/repository/models/{m}/load` with the config and
    /// `file:` overrides as parameters (files base64-encoded, as the protocol has them).
    pub fn load(model: &str, options: &LoadOptions) -> Forward {
        let mut params = Map::new();
        if let Some(config) = &options.config {
            params.insert("config".into(), Value::String(config.clone()));
        }
        for (path, bytes) in &options.files {
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            params.insert(format!("file:{path}"), Value::String(encoded));
        }
        let body = if params.is_empty() {
            json!({})
        } else {
            json!({ "parameters": params })
        };
        Forward {
            path: format!("/v2/repository/models/{}/load", path_segment(model)),
            body,
        }
    }

    pub fn unload(model: &str) -> Forward {
        Forward {
            path: format!("/v2/repository/models/{}/unload", path_segment(model)),
            body: json!({}),
        }
    }

    pub fn scale(model: &str, min: Option<u32>, max: Option<u32>) -> Forward {
        Forward {
            path: format!("/mesh/v1/models/{}/scale", path_segment(model)),
            body: json!({ "min": min, "max": max }),
        }
    }

    /// A rollout command, as the router's API takes it.
    pub fn rollout(model: &str, command: &crate::rollout::Command) -> Forward {
        Forward {
            path: format!("/mesh/v1/models/{}/rollout", path_segment(model)),
            body: command.body(),
        }
    }

    /// A follower's tally of a rollout's answers, for the leader's guard.
    pub fn tally(model: &str, tally: &crate::rollout::Tally) -> Forward {
        Forward {
            path: format!("/mesh/v1/models/{}/rollout", path_segment(model)),
            body: crate::rollout::report::body(tally),
        }
    }

    pub fn drain(node: &str, wait: Duration) -> Forward {
        Forward {
            path: format!(
                "/mesh/v1/nodes/{}/drain?timeout_s={}",
                path_segment(node),
                wait.as_secs().max(1)
            ),
            body: json!({}),
        }
    }

    /// Sends it to the leader at `addr` (HOST:PORT); the leader's error answers come back as the
    /// same kind of error, with its message.
    pub async fn send(&self, leader: &str, addr: &str, wait: Duration, rules: &Restrictions) -> Result<Value> {
        let unreachable = |why: String| {
            Error::unavailable(format!(
                "the placement leader {leader} ({addr}) cannot be reached to make this change: {why}"
            ))
        };
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            let driver = tokio::spawn(conn);
            let mut request = Request::post(&self.path)
                .header("host", addr)
                .header("content-type", "application/json");
            if let Some((key, value)) = http_group(&self.path).and_then(|g| rules.header(g)) {
                request = request.header(key, value);
            }
            let request = request
                .body(Full::new(Bytes::from(self.body.to_string())))
                .map_err(|e| e.to_string())?;
            let answer = sender.send_request(request).await.map_err(|e| e.to_string())?;
            let status = answer.status().as_u16();
            // The leader's answer is small JSON; a larger one is refused, not buffered.
            let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| format!("reading its answer: {e}"))?
                .to_bytes();
            driver.abort();
            Ok::<_, String>((status, body))
        };
        let (status, body) = tokio::time::timeout(wait + Duration::from_secs(5), exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {}s", wait.as_secs() + 5)))?
            .map_err(unreachable)?;
        answer(status, &body)
    }
}

/// The leader's answer as this router's result.
fn answer(status: u16, body: &[u8]) -> Result<Value> {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return Ok(value);
    }
    let message = value.get("error").and_then(Value::as_str).map_or_else(
        || format!("the placement leader answered HTTP {status}"),
        str::to_string,
    );
    if status == 401 || status == 403 {
        // Not the operator's mistake: the leader refused this router (no `cluster` access rule on
        // it, so it takes changes from its own host only, or another key).
        return Err(Error::new(
            Code::Unavailable,
            format!(
                "the placement leader refused this router's forwarded change (HTTP {status}: {message}); \
                 give every router the same `cluster` rule of --http-restricted-api, or send the change \
                 to the leader"
            ),
        ));
    }
    let code = match status {
        400 => Code::InvalidArgument,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        413 => Code::PayloadTooLarge,
        501 => Code::Unsupported,
        502..=504 => Code::Unavailable,
        _ => Code::Internal,
    };
    Err(Error::new(code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_carries_its_config_and_files_as_trition_parameters() {
        let options = LoadOptions {
            config: Some("{\"backend\":\"onnxruntime\"}".into()),
            files: vec![("1/model.onnx".into(), Bytes::from_static(b"\x00\x01onnx"))],
        };
        let f = Forward::load("add sub/x", &options);
        assert_eq!(f.path, "/v2/repository/models/add%20sub%2Fx/load");
        assert_eq!(f.body["parameters"]["config"], "{\"backend\":\"onnxruntime\"}");
        assert_eq!(f.body["parameters"]["file:1/model.onnx"], "AAFvbm54");
        assert_eq!(Forward::load("m", &LoadOptions::default()).body, json!({}));
        assert_eq!(Forward::scale("m", Some(1), None).body, json!({"min": 1, "max": null}));
        let pause = Forward::rollout("a b", &crate::rollout::Command::Pause);
        assert_eq!(
            (pause.path.as_str(), pause.body),
            ("/mesh/v1/models/a%20b/rollout", json!({"action": "pause"}))
        );
    }

    #[test]
    fn the_leaders_errors_keep_their_kind_and_message() {
        let e = answer(404, br#"{"error": "failed to load 'x': no such model directory"}"#).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::NotFound, "failed to load 'x': no such model directory")
        );
        assert_eq!(answer(503, b"{}").unwrap_err().code, Code::Unavailable);
        assert_eq!(answer(400, b"not json").unwrap_err().code, Code::InvalidArgument);
        assert_eq!(answer(200, br#"{"min": 1}"#).unwrap(), json!({"min": 1}));
        // The leader refusing this router is no internal error: it says what to set.
        let e = answer(403, br#"{"error": "This API is restricted"}"#).unwrap_err();
        assert_eq!(e.code, Code::Unavailable);
        assert!(
            e.message.contains("HTTP 403") && e.message.contains("`cluster` rule"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_forward_carries_its_groups_header_and_a_huge_answer_is_refused() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let leader = tokio::spawn(async move {
            let mut heads = Vec::new();
            for body in ["{}".to_string(), format!("\"{}\"", "x".repeat(MAX_ANSWER_BYTES))] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0; 64 * 1024];
                let n = s.read(&mut buf).await.unwrap();
                heads.push(String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase());
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                let _ = s.write_all(answer.as_bytes()).await;
            }
            heads
        });
        let rules = Restrictions::parse(&["cluster:Admin-Key=s3".to_string()], "api").unwrap();
        let wait = Duration::from_secs(2);
        Forward::scale("m", Some(1), None)
            .send("r1", &addr, wait, &rules)
            .await
            .unwrap();
        let e = Forward::drain("n", wait)
            .send("r1", &addr, wait, &rules)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("reading its answer"), "{}", e.message);
        let heads = leader.await.unwrap();
        assert!(heads[0].starts_with("post /mesh/v1/models/m/scale"), "{}", heads[0]);
        assert!(heads[0].contains("admin-key: s3\r\n"), "{}", heads[0]);
        // A group the rules leave open carries no header.
        assert!(Forward::unload("m").path.starts_with("/v2/repository/"));
    }
}
