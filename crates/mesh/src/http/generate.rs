//! Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and
//! `.../generate_stream`. A request is one flat JSON object: fields named like an input of the
//! model become that input (a scalar or a flat list, converted to the input's datatype, its shape
//! deduced from the config), `id` is the request id, and every other field is a request parameter
//! (a bool, number or string). Each response is a JSON object of the outputs (a one-element tensor
//! as a scalar, BYTES as strings) with `model_name`, `model_version` and `id`. `generate` answers
//! once; `generate_stream` answers with server-sent events (`data: {...}\n\n`), one per response
//! of the model, errors as `data: {"error": "..."}`, on the same stream path as gRPC's
//! ModelStreamInfer, so decoupled models stream each answer as they send it. Both are traced as
//! infer requests are, with the HTTP stamps (`HTTP_SEND_START` as the first answer is ready).
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value};

use super::json_data;
use crate::config::ModelConfig;
use crate::dispatch::Dispatch;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::request::{InferRequest, InferResponse, Param};
use crate::stream::StreamItem;
use crate::stream::{stream_channel, Credit, Window};
use crate::tensor::{NamedTensor, Tensor};
use crate::trace::front::{self, Point};

/// Server-sent events waiting to be written; each holds its answer's window credit until the body takes it,
/// so a client that stops reading holds the producer back by the stream's window.
const EVENT_WINDOW: usize = 16;

/// The content type of `generate_stream` answers, as Triton sends it.
const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";

/// Builds the inference request a generate body stands for. Fields are taken in the order the
/// body gives them, so the first bad one is the one named; a field given twice is Triton's
/// `input 'X' already exists in request`.
pub fn decode_generate(model: &str, version: &str, config: &ModelConfig, body: &[u8]) -> Result<InferRequest> {
    let Some(fields) = super::json_bounded::object_entries(body, "request JSON buffer")? else {
        return Err(Error::invalid("the generate request must be a JSON object"));
    };
    let mut request = InferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        ..Default::default()
    };
    let mut seen = std::collections::HashSet::new();
    for (key, value) in fields {
        if !seen.insert(key.clone()) {
            let what = if config.input.iter().any(|i| i.name == key) {
                "input"
            } else {
                "parameter"
            };
            return Err(Error::invalid(format!("{what} '{key}' already exists in request")));
        }
        if let Some(spec) = config.input.iter().find(|i| i.name == key) {
            let dtype = DataType::from_config(spec.data_type)
                .ok_or_else(|| Error::invalid(format!("input '{key}' of model '{model}' has no valid data type")))?;
            let tensor = input_tensor(&key, dtype, &spec.dims, config.max_batch_size > 0, &value)?;
            request.inputs.push(NamedTensor { name: key, tensor });
            continue;
        }
        if key == "parameters" {
            // Triton's reserved keyword: an object whose fields are request parameters.
            let Value::Object(nested) = value else {
                return Err(Error::invalid("Expected JSON object for keyword: 'parameters'"));
            };
            for (name, v) in nested {
                let param = parameter(&name, v)
                    .map_err(|e| Error::invalid(format!("Converting keyword: 'parameters': {}", e.message)))?;
                request.parameters.push((name, param));
            }
            continue;
        }
        if key == "id" {
            if let Value::String(s) = value {
                request.id = s;
                continue;
            }
        }
        let param = parameter(&key, value)?;
        request.parameters.push((key, param));
    }
    Ok(request)
}

/// A field that is not an input: a bool, number or string request parameter.
fn parameter(key: &str, value: Value) -> Result<Param> {
    Ok(match value {
        Value::Bool(b) => Param::Bool(b),
        Value::String(s) => Param::String(s),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Param::Int(i),
            (None, Some(u), _) => Param::Uint(u),
            (_, _, Some(f)) => Param::Double(f),
            _ => return Err(invalid_parameter(key)),
        },
        _ => return Err(invalid_parameter(key)),
    })
}

fn invalid_parameter(key: &str) -> Error {
    Error::invalid(format!(
        "parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    ))
}

/// One input from a scalar or a flat list: its values in the input's datatype, its shape the
/// config's dims with the one variable dimension sized from the number of values (and a batch
/// dimension of 1 for batching models).
fn input_tensor(name: &str, dtype: DataType, dims: &[i64], batching: bool, value: &Value) -> Result<Tensor> {
    // Triton's words for a value of the wrong JSON type where they are fixed (strings, booleans).
    let elements: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let wrong = match dtype {
        DataType::Bytes => elements
            .iter()
            .any(|v| !v.is_string())
            .then_some("non-string as string"),
        DataType::Bool => elements
            .iter()
            .any(|v| !v.is_boolean())
            .then_some("non-boolean as boolean"),
        _ => None,
    };
    if let Some(what) = wrong {
        return Err(Error::invalid(format!("input '{name}': attempt to access JSON {what}")));
    }
    let (count, raw) = match value {
        Value::Array(items) => {
            if items.iter().any(|v| v.is_array() || v.is_object()) {
                return Err(Error::invalid(format!(
                    "input '{name}': a generate field must be a scalar or a flat list of values"
                )));
            }
            (items.len(), serde_json::value::to_raw_value(value))
        }
        Value::Object(_) | Value::Null => {
            return Err(Error::invalid(format!(
                "input '{name}': a generate field must be a scalar or a flat list of values, got {value}"
            )))
        }
        scalar => (1, serde_json::value::to_raw_value(&[scalar])),
    };
    let raw = raw.map_err(|e| Error::internal(format!("input '{name}': {e}")))?;
    let data = json_data::parse_data(name, dtype, &raw, count)?;
    let mut shape: Vec<i64> = if batching { vec![1] } else { Vec::new() };
    shape.extend(deduce_dims(name, dims, count)?);
    Tensor::new(dtype, shape, data.freeze()).map_err(|e| Error::invalid(format!("input '{name}': {e}")))
}

/// The config's dims for `count` values: the one variable dimension takes what the fixed ones leave.
fn deduce_dims(name: &str, dims: &[i64], count: usize) -> Result<Vec<i64>> {
    let variable = dims.iter().filter(|&&d| d < 0).count();
    let fixed = dims
        .iter()
        .filter(|&&d| d >= 0)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    let count = count as u64;
    let shown = format!("{dims:?}");
    let misfit = || Error::invalid(format!("input '{name}': {count} values do not fit its shape {shown}"));
    match (variable, fixed) {
        (0, Some(f)) if f == count => Ok(dims.to_vec()),
        (1, Some(f)) if f > 0 && count.is_multiple_of(f) => {
            let size = i64::try_from(count / f).map_err(|_| misfit())?;
            Ok(dims.iter().map(|&d| if d < 0 { size } else { d }).collect())
        }
        (1, Some(0)) if count == 0 => Ok(dims.iter().map(|&d| d.max(0)).collect()),
        (v, _) if v > 1 => Err(Error::invalid(format!(
            "The shape of input '{name}' can not be deduced because there are more than one variable-sized dimension"
        ))),
        _ => Err(misfit()),
    }
}

/// A response as the generate extension's JSON object.
pub fn encode_generate(response: &InferResponse) -> Result<Value> {
    let mut out = Map::new();
    for o in &response.outputs {
        let value = match json_data::to_json_array(&o.name, &o.tensor)? {
            Value::Array(mut items) if items.len() == 1 => items.pop().unwrap_or(Value::Null),
            other => other,
        };
        out.insert(o.name.clone(), value);
    }
    out.insert("model_name".into(), response.model_name.clone().into());
    out.insert("model_version".into(), response.model_version.clone().into());
    if !response.id.is_empty() {
        out.insert("id".into(), response.id.clone().into());
    }
    Ok(Value::Object(out))
}

/// Reads and decodes a generate request for the model and version of its path.
/// The request is also checked against the model's config here, before anything runs, so that a
/// bad request is refused with a JSON error on both endpoints (Triton's synchronous errors), while
/// an error the model answers on `generate_stream` is an event.
pub fn request_for<D: Dispatch>(dispatch: &D, model: &str, version: &str, body: &[u8]) -> Result<InferRequest> {
    let view = dispatch.model(model, version)?;
    let request = decode_generate(model, version, &view.config, body)?;
    crate::validate::check_request(&view.config, &request)?;
    Ok(request)
}

/// `generate`: exactly one response. Decoupled models run on the stream path and must answer once.
pub async fn generate<D: Dispatch>(dispatch: &D, request: InferRequest) -> Result<Response> {
    let view = dispatch.model(&request.model_name, &request.model_version)?;
    let decoupled = view
        .config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    let response = if decoupled {
        let (sink, mut answers) = stream_channel(Window::for_stream());
        let collect = async move {
            let mut responses = Vec::new();
            while let Some(item) = answers.recv().await {
                if let Some(r) = item.response {
                    responses.push(r?);
                    if responses.len() > 1 {
                        break;
                    }
                }
                if item.last {
                    break;
                }
            }
            Ok::<_, Error>(responses)
        };
        let ((), responses) = tokio::join!(dispatch.infer_stream(request, sink), collect);
        let mut responses = responses?;
        match (responses.pop(), responses.is_empty()) {
            (Some(one), true) => one,
            _ => {
                return Err(Error::invalid(
                    "generate expects model to produce exactly 1 response, use generate stream for model that \
                     generates various number of responses",
                ))
            }
        }
    } else {
        dispatch.infer(request).await?
    };
    front::stamp(Point::SendStart);
    Ok(axum::Json(encode_generate(&response)?).into_response())
}

/// `generate_stream`: one server-sent event per response. An error that fails the whole request
/// before any answer (a bad input, a model that raised) is answered as a plain error response.
pub async fn generate_stream<D: Dispatch>(dispatch: Arc<D>, request: InferRequest) -> Result<Response> {
    let (sink, mut answers) = stream_channel(Window::for_stream());
    // The model runs as part of the request its frontend serves (its trace is the frontend's).
    tokio::spawn(front::carry(async move { dispatch.infer_stream(request, sink).await }));
    let first = answers.recv().await;
    front::stamp(Point::SendStart);
    let first = match first {
        // The model's only answer is an error: its status, the error as the stream's one event.
        Some(StreamItem {
            response: Some(Err(e)),
            last: true,
            ..
        }) => {
            let status = e.http_status();
            return event_stream(status, Body::from(answer_event(Err(e))));
        }
        None => None,
        Some(item) => Some(item),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<(Bytes, Option<Credit>)>(EVENT_WINDOW);
    tokio::spawn(async move {
        let mut next = first;
        while let Some(mut item) = next.take() {
            let last = item.last;
            let credit = item.credit.take();
            if let Some(event) = event(item) {
                if tx.send((event, credit)).await.is_err() {
                    return; // the client went away: dropping `answers` cancels the request
                }
            }
            if last {
                return;
            }
            next = tokio::select! {
                item = answers.recv() => item,
                _ = tx.closed() => return,
            };
        }
    });
    let body = futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |(event, _credit)| {
        Ok::<_, std::io::Error>(event)
    });
    event_stream(StatusCode::OK, Body::from_stream(body))
}

fn event_stream(status: StatusCode, body: Body) -> Result<Response> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, EVENT_STREAM)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .map_err(|e| Error::internal(format!("building response: {e}")))
}

/// One answer as a server-sent event; a bare final flag is none.
fn event(item: StreamItem) -> Option<Bytes> {
    item.response.map(answer_event)
}

/// An answer, or its error, as one server-sent event.
fn answer_event(answer: Result<InferResponse>) -> Bytes {
    let value = answer
        .and_then(|response| encode_generate(&response))
        .unwrap_or_else(|e| serde_json::json!({ "error": e.message }));
    Bytes::from(format!("data: {value}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;

    fn cfg() -> ModelConfig {
        parse_pbtxt(
            r#"name: "m" max_batch_size: 0
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
                    { name: "M" data_type: TYPE_FP32 dims: [ 2, -1 ] },
                    { name: "S" data_type: TYPE_STRING dims: [ 1 ] },
                    { name: "V" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]"#,
        )
        .unwrap()
    }

    #[test]
    fn fields_become_inputs_parameters_and_the_id() {
        let body = br#"{"IN": [1, 2, 3], "M": [1, 2, 3, 4], "S": "hi", "id": "r1", "temp": 0.5, "n": 3, "ok": true, "w": "x"}"#;
        let r = decode_generate("m", "", &cfg(), body).unwrap();
        assert_eq!(r.id, "r1");
        assert_eq!(r.input("IN").unwrap().tensor.shape, vec![3]);
        assert_eq!(r.input("M").unwrap().tensor.shape, vec![2, 2]);
        assert_eq!(r.input("S").unwrap().tensor.data.as_ref(), b"\x02\0\0\0hi");
        assert!(r.parameters.contains(&("temp".into(), Param::Double(0.5))));
        assert!(r.parameters.contains(&("n".into(), Param::Int(3))));
        assert!(r.parameters.contains(&("ok".into(), Param::Bool(true))));
        let scalar = decode_generate("m", "", &cfg(), br#"{"IN": 7}"#).unwrap();
        assert_eq!(scalar.inputs[0].tensor.shape, vec![1]);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: [(&[u8], &str); 8] = [
            (br#"{"p": [1]}"#, "parameter 'p' has invalid type"),
            (br#"{"p": {"a": 1}}"#, "parameter 'p' has invalid type"),
            (br#"{"IN": [[1, 2]]}"#, "flat list"),
            (br#"{"IN": "abc"}"#, "string value in INT32 data"),
            (br#"{"M": [1, 2, 3]}"#, "3 values do not fit its shape [2, -1]"),
            (br#"{"V": [1, 2]}"#, "more than one variable-sized dimension"),
            (b"[1]", "must be a JSON object"),
            (b"nope", "failed to parse the request JSON buffer"),
        ];
        for (body, want) in cases {
            let e = decode_generate("m", "", &cfg(), body).unwrap_err();
            assert!(e.message.contains(want), "want '{want}' in '{}'", e.message);
        }
    }

    #[test]
    fn fields_are_read_in_document_order_and_a_duplicate_is_tritons_error() {
        let cfg = parse_pbtxt(
            r#"name: "m" input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] },
                                 { name: "STREAM" data_type: TYPE_BOOL dims: [ 1 ] } ]"#,
        )
        .unwrap();
        let cases: [(&[u8], &str); 7] = [
            (
                br#"{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}"#,
                "input 'PROMPT' already exists in request",
            ),
            (
                br#"{"PROMPT": "a", "STREAM": false, "STREAM": true, "PROMPT": "b"}"#,
                "input 'STREAM' already exists",
            ),
            (br#"{"x": 1, "x": 2}"#, "parameter 'x' already exists in request"),
            (
                br#"{"PROMPT": true, "STREAM": 123}"#,
                "attempt to access JSON non-string as string",
            ),
            (
                br#"{"STREAM": 123, "PROMPT": true}"#,
                "attempt to access JSON non-boolean as boolean",
            ),
            (
                br#"{"PROMPT": {"USER": "hi"}}"#,
                "attempt to access JSON non-string as string",
            ),
            (
                br#"{"PROMPT": "a", "parameters": 1}"#,
                "Expected JSON object for keyword: 'parameters'",
            ),
        ];
        for (body, want) in cases {
            let e = decode_generate("m", "", &cfg, body).unwrap_err();
            assert!(e.message.contains(want), "want '{want}' in '{}'", e.message);
        }
        let e = decode_generate("m", "", &cfg, br#"{"parameters": {"nested": {"twice": 1}}}"#).unwrap_err();
        assert_eq!(
            e.message,
            "Converting keyword: 'parameters': parameter 'nested' has invalid type. It should be either 'int', 'bool', or 'string'."
        );
        let r = decode_generate(
            "m",
            "",
            &cfg,
            br#"{"PROMPT": "a", "parameters": {"REPETITION": 3, "t": "x"}}"#,
        )
        .unwrap();
        assert_eq!(
            r.parameters,
            vec![
                ("REPETITION".into(), Param::Int(3)),
                ("t".into(), Param::String("x".into()))
            ]
        );
    }

    #[test]
    fn responses_map_one_element_tensors_to_scalars_and_bytes_to_strings() {
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            outputs: vec![
                NamedTensor {
                    name: "one".into(),
                    tensor: Tensor::from_values(vec![1, 1], &[5i32]),
                },
                NamedTensor {
                    name: "many".into(),
                    tensor: Tensor::from_values(vec![2], &[1.5f32, 2.5]),
                },
                NamedTensor {
                    name: "text".into(),
                    tensor: Tensor::from_bytes_elements(vec![1], [b"hello"]),
                },
            ],
            ..Default::default()
        };
        let v = encode_generate(&response).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"one": 5, "many": [1.5, 2.5], "text": "hello", "model_name": "m", "model_version": "1"})
        );
    }
}
