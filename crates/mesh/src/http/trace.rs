//! The trace extension over HTTP: `GET/POST /v2/trace/setting` (the server's settings) and
//! `/v2/models/{m}/trace/setting` (a model's, over the server's), as Triton answers them.
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde_json::Value;

use super::{error_response, AppState};
use crate::dispatch::Dispatch;
use crate::error::{Error, Result};
use crate::trace::{known_model, tracer, update, Change};

pub(super) fn routes<D: Dispatch>() -> Router<Arc<AppState<D>>> {
    Router::new()
        .route("/v2/trace/setting", get(get_global).post(post_global))
        .route(
            "/v2/models/{model}/trace/setting",
            get(get_model::<D>).post(post_model::<D>),
        )
}

/// A settings body: each value a string, a list of strings, or null (clears the setting).
fn changes(body: &Bytes) -> Result<Vec<Change>> {
    let parsed: Value = super::json_bounded::value(body)
        .map_err(|e| Error::invalid(format!("the trace settings are not JSON: {e}")))?;
    let Value::Object(map) = parsed else {
        return Err(Error::invalid("the trace settings must be a JSON object"));
    };
    map.into_iter()
        .map(|(k, v)| {
            let text = |v: &Value| match v {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                other => Err(Error::invalid(format!(
                    "trace setting '{k}' has an unusable value {other}"
                ))),
            };
            let value = match &v {
                Value::Null => None,
                Value::Array(items) => Some(items.iter().map(text).collect::<Result<Vec<_>>>()?),
                single => Some(vec![text(single)?]),
            };
            Ok((k, value))
        })
        .collect()
}

fn answer(result: Result<crate::trace::Settings>) -> Response {
    match result {
        // As text: in OpenTelemetry mode a repeated setting is a repeated key, in Triton's order.
        Ok(settings) => ([(header::CONTENT_TYPE, "application/json")], settings.to_text()).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn get_global() -> Response {
    answer(Ok(tracer().settings(None)))
}

async fn post_global(body: Bytes) -> Response {
    answer(changes(&body).and_then(|c| update(None, &c)))
}

async fn get_model<D: Dispatch>(State(s): State<Arc<AppState<D>>>, Path(m): Path<String>) -> Response {
    answer(known_model(&*s.dispatch, &m).map(|()| tracer().settings(Some(&m))))
}

async fn post_model<D: Dispatch>(State(s): State<Arc<AppState<D>>>, Path(m): Path<String>, body: Bytes) -> Response {
    answer(
        known_model(&*s.dispatch, &m)
            .and_then(|()| changes(&body))
            .and_then(|c| update(Some(&m), &c)),
    )
}
