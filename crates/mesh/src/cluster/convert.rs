//! Requests, responses and errors to and from link frames: tensors go into the payload as shared
//! `Bytes` and come back out as slices of the receive buffer; every received field is checked.
use bytes::Bytes;

use super::frame::{self, FrameError, Limits, Payload, MAX_DIMS};
use super::msg::{self, Answer, AnswerBody, Message, OutputWanted, RequestHead, ResponseHead, TensorHead, WireError};
use crate::dtype::DataType;
use crate::error::{Code, Error, Result};
use crate::request::{Client, InferRequest, InferResponse, Param, Params, RequestedOutput};
use crate::tensor::{NamedTensor, Tensor};
use crate::trace::otel::context::{Carrier, MAX_TRACEPARENT};

/// Whether a request that failed with this error ever ran, which decides whether retrying it is safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The node ran (or may have run) the request and this is its answer: never retried.
    Answered,
    /// The node refused before running it (draining, model not served there): safe to retry elsewhere.
    NotStarted,
    /// The node refused because it is overloaded (busy, not dead): safe to retry elsewhere.
    Overloaded,
}

impl ErrorKind {
    fn number(self) -> u8 {
        match self {
            ErrorKind::Answered => 0,
            ErrorKind::NotStarted => 1,
            ErrorKind::Overloaded => 2,
        }
    }
    /// Unknown numbers read as `Answered`, which is never retried.
    fn from_number(n: u8) -> Self {
        match n {
            1 => ErrorKind::NotStarted,
            2 => ErrorKind::Overloaded,
            _ => ErrorKind::Answered,
        }
    }
}

/// The link's number for each error code (stable across versions; new codes get new numbers).
pub fn code_number(code: Code) -> u8 {
    match code {
        Code::InvalidArgument => 1,
        Code::NotFound => 2,
        Code::Unavailable => 3,
        Code::Unsupported => 4,
        Code::Internal => 5,
        Code::AlreadyExists => 6,
        Code::Cancelled => 7,
        Code::PayloadTooLarge => 8,
        Code::Overloaded => 9,
        Code::Unknown => 10,
    }
}

/// An unknown number reads as INTERNAL.
pub fn code_from(n: u8) -> Code {
    match n {
        1 => Code::InvalidArgument,
        2 => Code::NotFound,
        3 => Code::Unavailable,
        4 => Code::Unsupported,
        6 => Code::AlreadyExists,
        7 => Code::Cancelled,
        8 => Code::PayloadTooLarge,
        9 => Code::Overloaded,
        10 => Code::Unknown,
        _ => Code::Internal,
    }
}

pub fn dtype_code(d: DataType) -> u8 {
    DataType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

pub fn dtype_from(n: u8) -> Option<DataType> {
    DataType::ALL.get(n as usize).copied()
}

pub fn wire_error(e: &Error, kind: ErrorKind) -> WireError {
    WireError {
        code: code_number(e.code),
        kind: kind.number(),
        message: e.message.clone(),
    }
}

pub fn error_from(w: &WireError) -> (Error, ErrorKind) {
    (
        Error::new(code_from(w.code), w.message.clone()),
        ErrorKind::from_number(w.kind),
    )
}

fn params_to_wire(params: &Params) -> Vec<msg::Param> {
    params
        .iter()
        .map(|(key, value)| msg::Param {
            key: key.clone(),
            value: match value {
                Param::Bool(b) => msg::ParamValue::Bool(*b),
                Param::Int(i) => msg::ParamValue::Int(*i),
                Param::Uint(u) => msg::ParamValue::Uint(*u),
                Param::Double(d) => msg::ParamValue::Double(*d),
                Param::String(s) => msg::ParamValue::String(s.clone()),
            },
        })
        .collect()
}

fn params_from_wire(params: Vec<msg::Param>) -> Params {
    params
        .into_iter()
        .map(|p| {
            let v = match p.value {
                msg::ParamValue::Bool(b) => Param::Bool(b),
                msg::ParamValue::Int(i) => Param::Int(i),
                msg::ParamValue::Uint(u) => Param::Uint(u),
                msg::ParamValue::Double(d) => Param::Double(d),
                msg::ParamValue::String(s) => Param::String(s),
            };
            (p.key, v)
        })
        .collect()
}

fn tensors_to_wire(tensors: &[NamedTensor], payload: &mut Payload) -> Vec<TensorHead> {
    tensors
        .iter()
        .map(|t| {
            let (offset, len) = payload.push(t.tensor.data.clone());
            TensorHead {
                name: t.name.clone(),
                dtype: dtype_code(t.tensor.dtype),
                shape: t.tensor.shape.clone(),
                offset,
                len,
            }
        })
        .collect()
}

/// Tensors as slices of the received payload, each checked (type, shape, range, size or BYTES framing).
fn tensors_from_wire(heads: Vec<TensorHead>, payload: &Bytes) -> Result<Vec<NamedTensor>, FrameError> {
    heads
        .into_iter()
        .map(|h| {
            let dtype = dtype_from(h.dtype)
                .ok_or_else(|| FrameError::Invalid(format!("tensor '{}' has unknown data type {}", h.name, h.dtype)))?;
            if h.shape.len() > MAX_DIMS {
                return Err(FrameError::Invalid(format!(
                    "tensor '{}' has {} dimensions, more than {MAX_DIMS}",
                    h.name,
                    h.shape.len()
                )));
            }
            let data = frame::slice(payload, h.offset, h.len)?;
            let tensor = Tensor::new(dtype, h.shape, data)
                .map_err(|e| FrameError::Invalid(format!("tensor '{}': {}", h.name, e.message)))?;
            Ok(NamedTensor { name: h.name, tensor })
        })
        .collect()
}

/// The frame that opens a request stream. `stream`: the sender takes several answers; `trace`: the
/// sender's trace context, which the receiver's spans continue.
pub fn request_frame(
    request: &InferRequest,
    stream: bool,
    trace: Option<&Carrier>,
    limits: &Limits,
) -> Result<Vec<Bytes>, FrameError> {
    let mut payload = Payload::default();
    let inputs = tensors_to_wire(&request.inputs, &mut payload);
    let head = RequestHead {
        model: request.model_name.clone(),
        version: request.model_version.clone(),
        id: request.id.clone(),
        outputs: request
            .outputs
            .iter()
            .map(|o| OutputWanted {
                name: o.name.clone(),
                class_count: o.class_count.unwrap_or(0),
            })
            .collect(),
        parameters: params_to_wire(&request.parameters),
        inputs,
        stream,
        traceparent: trace.and_then(|t| t.traceparent.clone()).unwrap_or_default(),
        tracestate: trace.and_then(|t| t.tracestate.clone()).unwrap_or_default(),
    };
    frame::encode(&Message::Request(head), payload, limits)
}

/// The largest `tracestate` taken from a peer (W3C's 32 members fit; a longer one is dropped).
pub const MAX_TRACESTATE: usize = 512;

/// The trace context a request's head carries: None when it has none, or one too long to be a
/// W3C context (the request itself is served; only its trace stands alone).
pub fn trace_of(head: &RequestHead) -> Option<Carrier> {
    if head.traceparent.is_empty() || head.traceparent.len() > MAX_TRACEPARENT {
        return None;
    }
    Some(Carrier {
        traceparent: Some(head.traceparent.clone()),
        tracestate: (!head.tracestate.is_empty() && head.tracestate.len() <= MAX_TRACESTATE)
            .then(|| head.tracestate.clone()),
    })
}

/// The request a `Request` frame carries, its inputs sharing the frame's payload; and its stream flag.
pub fn request_from(head: RequestHead, payload: &Bytes) -> Result<(InferRequest, bool), FrameError> {
    let inputs = tensors_from_wire(head.inputs, payload)?;
    let request = InferRequest {
        model_name: head.model,
        model_version: head.version,
        id: head.id,
        inputs,
        outputs: head
            .outputs
            .into_iter()
            .map(|o| RequestedOutput {
                name: o.name,
                class_count: (o.class_count > 0).then_some(o.class_count),
            })
            .collect(),
        parameters: params_from_wire(head.parameters),
        // The link it came on says who sent it.
        client: Client::Local,
    };
    Ok((request, head.stream))
}

/// One answer frame: a response (its outputs in the payload), an error with its kind, or a bare final flag.
pub fn answer_frame(
    answer: Option<&std::result::Result<InferResponse, (Error, ErrorKind)>>,
    last: bool,
    limits: &Limits,
) -> Result<Vec<Bytes>, FrameError> {
    let mut payload = Payload::default();
    let body = match answer {
        None => AnswerBody::Empty,
        Some(Ok(r)) => AnswerBody::Response(ResponseHead {
            model: r.model_name.clone(),
            version: r.model_version.clone(),
            id: r.id.clone(),
            parameters: params_to_wire(&r.parameters),
            outputs: tensors_to_wire(&r.outputs, &mut payload),
        }),
        Some(Err((e, kind))) => AnswerBody::Error(wire_error(e, *kind)),
    };
    frame::encode(&Message::Answer(Answer { last, body }), payload, limits)
}

/// What an answer frame says.
#[derive(Debug)]
pub enum Answered {
    Response(InferResponse),
    Error(Error, ErrorKind),
    Empty,
}

pub fn answer_from(body: AnswerBody, payload: &Bytes) -> Result<Answered, FrameError> {
    Ok(match body {
        AnswerBody::Empty => Answered::Empty,
        AnswerBody::Error(w) => {
            let (e, kind) = error_from(&w);
            Answered::Error(e, kind)
        }
        AnswerBody::Response(h) => Answered::Response(InferResponse {
            model_name: h.model,
            model_version: h.version,
            id: h.id,
            outputs: tensors_from_wire(h.outputs, payload)?,
            parameters: params_from_wire(h.parameters),
        }),
    })
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
