//! The rollout part of the router's operator API (issue 59): `GET /mesh/v1/models/{m}/rollout`
//! shows a model's rollout as this router's intent holds it, `POST` starts, pauses, resumes,
//! promotes or aborts one (made by the placement leader, stored with its intent), and takes a
//! follower's tally of answers for the leader's guard. A conflict (a second rollout of a model, a
//! command to one that is over) is answered 409.
use std::sync::Arc;

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::error_response;
use crate::dispatch::RouterDispatch;
use crate::rollout::{report, Command};

async fn show(dispatch: Arc<RouterDispatch>, model: String) -> Response {
    match dispatch.placement.rollout_status(&model) {
        Some(mut status) => {
            let started = status["started_ms"].as_u64().unwrap_or(0);
            if let Some(shadow) = dispatch.shadow_status(&model, started) {
                // This router's shadows (each router compares its own).
                status["shadow_results"] = shadow;
            }
            Json(status).into_response()
        }
        None => error_response(mesh::Error::not_found(format!("model '{model}' has no rollout"))),
    }
}

async fn change(dispatch: Arc<RouterDispatch>, model: String, body: &[u8]) -> Response {
    let value = match Command::read(body) {
        Ok(v) => v,
        Err(e) => return error_response(e),
    };
    // A follower's tally of answers for the leader's guard (`rollout::report`).
    if report::is_report(&value) {
        let taken = report::parse(&value).and_then(|t| dispatch.placement.merge_tally(&model, &t));
        return match taken {
            Ok(()) => Json(serde_json::json!({})).into_response(),
            Err(e) => error_response(e),
        };
    }
    let command = match Command::from_value(value) {
        Ok(c) => c,
        Err(e) => return error_response(e),
    };
    match dispatch.placement.rollout(&model, command).await {
        Ok(status) => Json(status).into_response(),
        Err(e) => error_response(e),
    }
}

pub fn routes(dispatch: Arc<RouterDispatch>) -> Router {
    let d = dispatch.clone();
    Router::new().route(
        "/mesh/v1/models/{model}/rollout",
        get(move |Path(model): Path<String>| show(dispatch.clone(), model)).post(
            move |Path(model): Path<String>, body: axum::body::Bytes| {
                let d = d.clone();
                async move { change(d, model, &body).await }
            },
        ),
    )
}
