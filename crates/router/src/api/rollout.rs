//! The rollout part of the router's operator API (issue 59): `GET /mesh/v1/models/{m}/rollout`
//! shows a model's rollout as this router's intent holds it, `POST` starts, pauses, resumes,
//! promotes or aborts one (made by the placement leader, stored with its intent). A conflict (a
//! second rollout of a model, a command to one that is over) is answered 409.
use std::sync::Arc;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use mesh::error::Code;
use serde_json::json;

use crate::dispatch::RouterDispatch;
use crate::rollout::Command;

/// An error as this API answers it: the mesh error's HTTP status, 409 for a conflict.
fn refused(e: mesh::Error) -> Response {
    let status = match e.code {
        Code::AlreadyExists => StatusCode::CONFLICT,
        _ => StatusCode::from_u16(e.http_status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    };
    (status, Json(json!({ "error": e.message }))).into_response()
}

async fn show(dispatch: Arc<RouterDispatch>, model: String) -> Response {
    match dispatch.placement.rollout_status(&model) {
        Some(status) => Json(status).into_response(),
        None => refused(mesh::Error::not_found(format!("model '{model}' has no rollout"))),
    }
}

async fn change(dispatch: Arc<RouterDispatch>, model: String, body: &[u8]) -> Response {
    let command = match Command::parse(body) {
        Ok(c) => c,
        Err(e) => return refused(e),
    };
    match dispatch.placement.rollout(&model, command).await {
        Ok(status) => Json(status).into_response(),
        Err(e) => refused(e),
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
