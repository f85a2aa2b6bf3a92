//! The commands that drive the cluster through its router: `models`, `load`, `unload`, `scale`
//! and `drain` (Triton's repository extension and the router's own `/mesh/v1` API).
use std::time::Duration;

use anyhow::bail;
use mesh::http::path_segment;
use serde_json::{json, Value};

use crate::http;
use crate::placement::models_table;
use crate::render::{pretty_json, sanitize};
use crate::status::{fetch, parse};

/// POSTs `body` to the router; the answer's JSON, or an error naming the URL and the router's reason.
pub(crate) fn post(url: &str, body: &Value, timeout: Duration) -> anyhow::Result<Value> {
    let response = match http::post(url, &body.to_string(), timeout) {
        Ok(r) => r,
        Err(http::Error::Connect(e)) => bail!("cannot reach the router at {url}: {e} (is mesh-router running there?)"),
        Err(http::Error::Protocol(e))
            if e.contains("timed out") || e.contains("WouldBlock") || e.contains("Resource temporarily") =>
        {
            bail!(
                "the router at {url} did not answer within {}s (it may still be working; see mesh-ops status)",
                timeout.as_secs()
            )
        }
        Err(e) => bail!("router at {url}: {e}"),
    };
    answer(&response)
}

/// The router's answer as JSON, or (not 200) an error with its status and reason.
pub(crate) fn answer(response: &http::Response) -> anyhow::Result<Value> {
    let text = String::from_utf8_lossy(&response.body).into_owned();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if response.status != 200 {
        let why = value
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| text.trim().chars().take(300).collect());
        bail!(
            "the router refused ({} {}): {}",
            response.status,
            response.reason,
            sanitize(&why)
        );
    }
    Ok(value)
}

/// `mesh-ops models`: the cluster repository's models, replicas wanted and ready, where they run.
pub fn models(router: &str, json: bool, timeout: Duration) -> anyhow::Result<String> {
    let (url, body) = fetch(router, timeout)?;
    let view = parse(&url, &body)?;
    if json {
        let value: Value = serde_json::from_str(&body)?;
        let placement = value.get("placement").cloned().unwrap_or(Value::Null);
        return Ok(pretty_json(
            &json!({"models": value.get("models"), "placement": placement}).to_string(),
        ));
    }
    if view.placement.models.is_empty() && view.placement.errors.is_empty() {
        return Ok("the router places no models (start it with --model-repository)".into());
    }
    Ok(models_table(&view.placement))
}

/// `mesh-ops load MODEL [--config FILE]`: places (or places again) a model of the cluster
/// repository; returns once a replica is ready.
pub fn load(router: &str, model: &str, config: Option<String>, timeout: Duration) -> anyhow::Result<String> {
    let url = format!(
        "{}/v2/repository/models/{}/load",
        http::base(router),
        path_segment(model)
    );
    let body = match config {
        Some(c) => json!({"parameters": {"config": c}}),
        None => json!({}),
    };
    post(&url, &body, timeout)?;
    Ok(format!("model '{model}' is placed and ready"))
}

/// `mesh-ops unload MODEL`: removes a model from every node.
pub fn unload(router: &str, model: &str, timeout: Duration) -> anyhow::Result<String> {
    let url = format!(
        "{}/v2/repository/models/{}/unload",
        http::base(router),
        path_segment(model)
    );
    post(&url, &json!({}), timeout)?;
    Ok(format!("model '{model}' is unloaded from every node"))
}

/// `mesh-ops scale MODEL --min N --max M`: changes the replica bounds at run time.
pub fn scale(
    router: &str,
    model: &str,
    min: Option<u32>,
    max: Option<u32>,
    timeout: Duration,
) -> anyhow::Result<String> {
    if min.is_none() && max.is_none() {
        bail!("give --min, --max or both");
    }
    let url = format!("{}/mesh/v1/models/{}/scale", http::base(router), path_segment(model));
    let answer = post(&url, &json!({"min": min, "max": max}), timeout)?;
    let bound = |k: &str| {
        answer
            .get(k)
            .and_then(Value::as_u64)
            .map_or("?".into(), |v| v.to_string())
    };
    Ok(format!(
        "model '{model}': replicas between {} and {}",
        bound("min"),
        bound("max")
    ))
}

/// `mesh-ops drain NODE`: moves every placed model off the node; returns once it is empty.
pub fn drain(router: &str, node: &str, timeout: Duration) -> anyhow::Result<String> {
    let url = format!(
        "{}/mesh/v1/nodes/{}/drain?timeout_s={}",
        http::base(router),
        path_segment(node),
        timeout.as_secs().max(1)
    );
    // The router answers within the drain's own timeout; give the socket a little more.
    post(&url, &json!({}), timeout + Duration::from_secs(5))?;
    Ok(format!(
        "node '{node}' is drained: every placed model moved off it; it may be stopped"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_built_and_names_encoded() {
        assert_eq!(http::base("localhost:8000/"), "http://localhost:8000");
        assert_eq!(http::base("http://r:1"), "http://r:1");
        assert_eq!(path_segment("model a/b"), "model%20a%2Fb");
        assert_eq!(path_segment("ok_name-1.2"), "ok_name-1.2");
    }

    #[test]
    fn an_unreachable_router_is_named() {
        let e = scale("http://127.0.0.1:1", "m", Some(1), None, Duration::from_secs(2)).unwrap_err();
        assert!(
            e.to_string().contains("cannot reach the router at http://127.0.0.1:1"),
            "{e}"
        );
        assert!(scale("http://127.0.0.1:1", "m", None, None, Duration::from_secs(1))
            .unwrap_err()
            .to_string()
            .contains("--min, --max"));
    }
}
