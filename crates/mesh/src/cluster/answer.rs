//! The serving side of a request stream, shared by nodes (requests from a router) and routers (BLS
//! calls from a node): run the request on a `Dispatch`, write its answers, and stop it when the
//! sender cancels the stream.
use quinn::{RecvStream, SendStream, VarInt};

use super::convert::{answer_frame, request_from, trace_of, ErrorKind};
use super::frame::{Frame, FrameError, Limits};
use super::io::{finish_reading, read_frame, via, write_frame};
use super::msg::Message;
use super::shm::Outbound;
use super::transport::stream_code;
use crate::dispatch::Dispatch;
use crate::error::Error;
use crate::request::InferRequest;
use crate::trace::otel::context::Carrier;

/// Answers on `send` with one error, as the final answer.
pub async fn refuse(send: &mut SendStream, error: Error, kind: ErrorKind, limits: &Limits) {
    if let Ok(chunks) = answer_frame(Some(&Err((error, kind))), true, limits) {
        let _ = write_frame(send, chunks).await;
    }
    let _ = send.finish();
}

/// Ends a stream whose first frame was unusable: a clean error answer when the frame was read
/// whole, else a reset; the connection and every other stream go on.
pub async fn reject(mut send: SendStream, mut recv: RecvStream, e: FrameError, limits: &Limits) {
    tracing::debug!("refusing a request stream: {e}");
    match e {
        FrameError::Io(_) | FrameError::Truncated { .. } | FrameError::Slow { .. } => {
            let _ = send.reset(VarInt::from_u32(stream_code::PROTOCOL));
        }
        // Never read, never run: the sender may try another peer.
        FrameError::Busy { .. } => refuse(&mut send, Error::from(e), ErrorKind::Overloaded, limits).await,
        _ => refuse(&mut send, Error::from(e), ErrorKind::Answered, limits).await,
    }
    let _ = recv.stop(VarInt::from_u32(stream_code::PROTOCOL));
}

/// A request read off a request stream: the request, its stream flag, and the sender's trace context.
pub type Received = (InferRequest, bool, Option<Carrier>);

/// Decodes a request frame: the request, its stream flag and trace context, or why the frame is unusable.
pub fn request_of(frame: Frame) -> Result<Received, FrameError> {
    match frame.message {
        Message::Request(head) => {
            let trace = trace_of(&head);
            request_from(head, &frame.payload).map(|(request, stream)| (request, stream, trace))
        }
        other => Err(FrameError::Invalid(format!(
            "a request stream must start with a request, not {}",
            message_name(&other)
        ))),
    }
}

/// A short name of a message, for errors.
pub fn message_name(m: &Message) -> &'static str {
    match m {
        Message::Hello(_) => "hello",
        Message::Welcome(_) => "welcome",
        Message::ModelEvent(_) => "model event",
        Message::LoadReport(_) => "load report",
        Message::Drain => "drain",
        Message::Released => "released",
        Message::Goodbye => "goodbye",
        Message::Request(_) => "request",
        Message::Answer(_) => "answer",
        Message::StatsQuery(_) => "statistics query",
        Message::StatsReply(_) => "statistics reply",
        Message::Place(_) => "place",
        Message::Placed(_) => "placed",
        Message::Evict(_) => "evict",
        Message::MayStop(_) => "may-stop",
        Message::Fence(_) => "fence",
        Message::Fetch(_) => "fetch",
        Message::FileChunk(_) => "file chunk",
        Message::FetchEnd(_) => "fetch end",
        Message::Credit(_) => "credit",
    }
}

async fn write_answer(
    send: &mut SendStream,
    item: Option<&Result<crate::InferResponse, (Error, ErrorKind)>>,
    last: bool,
    limits: &Limits,
    out: Option<&Outbound>,
) -> Result<(), FrameError> {
    let chunks = match answer_frame(item, last, limits) {
        Ok(c) => c,
        // An answer too large for the link is this request's error, not the link's.
        Err(e) => answer_frame(Some(&Err((Error::from(e), ErrorKind::Answered))), last, limits)?,
    };
    write_frame(send, via(chunks, out)).await
}

/// Runs `request` on `dispatch` and writes its answers to `send`: one for a unary request, each as
/// it is produced for a stream, as far as the caller's credit on `recv` allows (a caller that grants
/// none holds the stream, and the node's own window then holds the model back). If the sender stops the stream (its client went away) or the link
/// drops, the request is dropped, which cancels it. `kind_of` says whether an error means the
/// request never ran. Large answers go through `out`, the caller's shared-memory arena, when it
/// runs on this host. The sender's trace context, when it sent one, is the parent of the spans the
/// request makes here ([`crate::trace::linked`]).
pub async fn serve<D: Dispatch + ?Sized>(
    dispatch: &D,
    (request, stream, trace): Received,
    (send, recv): (SendStream, RecvStream),
    (limits, out): (&Limits, Option<&Outbound>),
    kind_of: impl Fn(&Error) -> ErrorKind,
) {
    let served = serve_request(dispatch, request, stream, (send, recv), (limits, out), kind_of);
    crate::trace::linked(trace, served).await
}

async fn serve_request<D: Dispatch + ?Sized>(
    dispatch: &D,
    request: InferRequest,
    stream: bool,
    (mut send, mut recv): (SendStream, RecvStream),
    (limits, out): (&Limits, Option<&Outbound>),
    kind_of: impl Fn(&Error) -> ErrorKind,
) {
    crate::busy::touch();
    let cancelled = send.stopped();
    if !stream {
        let result = tokio::select! {
            r = dispatch.infer(request) => r,
            _ = cancelled => return,
        };
        let answer = result.map_err(|e| {
            let k = kind_of(&e);
            (e, k)
        });
        if write_answer(&mut send, Some(&answer), true, limits, out).await.is_ok() {
            let _ = send.finish();
        }
        // The request was the stream's only frame: its end, read before the stream goes, spares
        // the caller a STOP_SENDING.
        finish_reading(recv, limits.frame_deadline);
        crate::busy::touch();
        return;
    }
    // Each answer's credit is held until its frame is written: a reader that stops holds the producer back.
    let (tx, mut rx) = crate::stream::stream_channel(crate::stream::Window::for_stream());
    let forward = async {
        let mut allowed = 0u64;
        while let Some(item) = rx.recv().await {
            while allowed == 0 {
                match read_frame(&mut recv, limits).await {
                    Ok(Some(Frame {
                        message: Message::Credit(n),
                        ..
                    })) => allowed += u64::from(n),
                    Ok(Some(other)) => {
                        let what = message_name(&other.message);
                        tracing::debug!("a streamed request's caller sent a {what}, not credit");
                        let _ = send.reset(VarInt::from_u32(stream_code::PROTOCOL));
                        return;
                    }
                    // The caller went away (its reset also stops the stream, which cancels the request).
                    Ok(None) | Err(_) => return,
                }
            }
            allowed -= 1;
            let answer = item.response.map(|r| {
                r.map_err(|e| {
                    let k = kind_of(&e);
                    (e, k)
                })
            });
            if write_answer(&mut send, answer.as_ref(), item.last, limits, out)
                .await
                .is_err()
            {
                return;
            }
            if item.last {
                let _ = send.finish();
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(dispatch.infer_stream(request, tx), forward) } => {}
        _ = cancelled => {}
    }
    // Credit the caller sent before it saw the final answer, and its end, are read before the
    // stream goes (a reset caller's stream is already done).
    finish_reading(recv, limits.frame_deadline);
    crate::busy::touch();
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
