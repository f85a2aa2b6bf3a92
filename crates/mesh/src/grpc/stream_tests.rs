//! A ModelStreamInfer call whose client goes away cancels the requests it still runs, however its
//! request side ended: a cancel (RST_STREAM CANCEL, which tonic reads as the end of the requests),
//! a half-close, or an error.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::{mpsc, Notify};
use tonic::{Request, Status};

use super::serve;
use crate::dispatch::Dispatch;
use crate::proto;
use crate::request::{InferRequest, InferResponse};
use crate::shm::SharedMemory;
use crate::{IndexEntry, ModelView};

/// A model whose requests run until they are dropped (cancelled), which it records.
#[derive(Default)]
struct Endless {
    started: Notify,
    cancelled: AtomicBool,
}

/// Marks its request cancelled when the request's future is dropped before it ends.
struct OnDrop<'a>(&'a AtomicBool);

impl Drop for OnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Dispatch for Endless {
    async fn infer(&self, _: InferRequest) -> crate::Result<InferResponse> {
        let _cancelled = OnDrop(&self.cancelled);
        self.started.notify_one();
        std::future::pending().await
    }
    fn ready(&self) -> bool {
        true
    }
    fn model(&self, _: &str, _: &str) -> crate::Result<ModelView> {
        Err(crate::Error::not_found("no views here"))
    }
    fn repository_index(&self) -> Vec<IndexEntry> {
        Vec::new()
    }
}

/// How the client's side of the stream ends once its request runs.
enum End {
    /// tritonclient's `stop_stream(cancel_requests=True)`: hyper reports the RST_STREAM CANCEL as
    /// a `Cancelled` error, which tonic's request decoder turns into the end of the stream.
    Cancel,
    /// The client half-closes, as `stop_stream()` without cancelling does.
    HalfClose,
    /// Any other error on the request side.
    Error,
}

/// One request as a gRPC frame on the wire (no compression).
fn request_frame() -> Bytes {
    let msg = proto::ModelInferRequest {
        model_name: "endless".into(),
        ..Default::default()
    };
    let body = prost::Message::encode_to_vec(&msg);
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

type BodyItem = Result<Frame<Bytes>, Status>;

/// Serves a stream whose client sends one request, then ends its side as `end` says once the
/// request runs; returns the model and the stream's answers (what hyper holds for the client).
async fn started(end: End) -> (Arc<Endless>, super::Answers) {
    let model = Arc::new(Endless::default());
    let (body_tx, body_rx) = mpsc::channel::<BodyItem>(4);
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(body_rx));
    let decoder = tonic::codec::Codec::decoder(&mut tonic_prost::ProstCodec::<
        proto::ModelStreamInferResponse,
        proto::ModelInferRequest,
    >::default());
    let inbound = tonic::Streaming::new_request(decoder, body, None, None);
    let started = model.started.notified();
    let answers = serve(
        model.clone(),
        Arc::new(SharedMemory::default()),
        None,
        Request::new(inbound),
    );
    body_tx.send(Ok(Frame::data(request_frame()))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the request runs");
    match end {
        End::Cancel => body_tx.send(Err(Status::cancelled("stream reset"))).await.unwrap(),
        End::HalfClose => drop(body_tx),
        End::Error => body_tx.send(Err(Status::internal("connection lost"))).await.unwrap(),
    }
    (model, answers)
}

/// Whether the model's request is cancelled within `within`.
async fn cancelled_within(model: &Endless, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if model.cancelled.load(Ordering::SeqCst) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    model.cancelled.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_client_that_cancels_its_stream_cancels_the_requests_still_running() {
    let (model, answers) = started(End::Cancel).await;
    // Its requests' end alone is not the client going away (it reads as a half-close)...
    assert!(!cancelled_within(&model, Duration::from_millis(100)).await);
    // ...which the reset shows when hyper drops the stream's answers.
    drop(answers);
    assert!(
        cancelled_within(&model, Duration::from_secs(5)).await,
        "the running request was not cancelled"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_after_half_closing_cancels_the_requests_still_running() {
    let (model, answers) = started(End::HalfClose).await;
    assert!(
        !cancelled_within(&model, Duration::from_millis(100)).await,
        "a half-close lets the requests run"
    );
    drop(answers);
    assert!(
        cancelled_within(&model, Duration::from_secs(5)).await,
        "the running request was not cancelled"
    );
}

#[tokio::test]
async fn an_error_on_the_request_side_cancels_the_requests_still_running() {
    let (model, _answers) = started(End::Error).await;
    assert!(
        cancelled_within(&model, Duration::from_secs(5)).await,
        "the running request was not cancelled"
    );
}
