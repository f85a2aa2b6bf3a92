//! One ModelStreamInfer call: its requests read under the stream's budgets, each run as soon as the
//! one before is queued, and their answers written in the order Triton writes them.
use std::net::SocketAddr;
use std::sync::Arc;

use tonic::{Request, Status};

use super::codec::{self, forward_metadata};
use crate::dispatch::Dispatch;
use crate::error::Error;
use crate::proto;
use crate::shm::SharedMemory;
use crate::stream::{stream_channel, Credit, Window};
use crate::sync::Locked;

/// The windows of the client connections with streams open, by (server, client) address: each
/// connection's streams share one (`Window::on_connection`). An entry lives while a stream of its
/// connection does; dead ones are swept as others are added, so the table holds at most one entry
/// per connection with streams plus those that ended since the last sweep.
static CONNECTIONS: std::sync::LazyLock<std::sync::Mutex<ConnectionWindows>> =
    std::sync::LazyLock::new(Default::default);

/// Each connection's window, by (server, client) address.
type ConnectionWindows = std::collections::HashMap<(SocketAddr, SocketAddr), std::sync::Weak<Window>>;

/// The window of a stream on the connection between `local` and `remote` (a stream's own when tonic
/// does not know its connection).
fn stream_window(local: Option<SocketAddr>, remote: Option<SocketAddr>) -> Arc<Window> {
    let (Some(local), Some(remote)) = (local, remote) else {
        return Window::for_stream();
    };
    let mut table = CONNECTIONS.locked();
    if let Some(window) = table.get(&(local, remote)).and_then(std::sync::Weak::upgrade) {
        return Window::on_connection(window);
    }
    table.retain(|_, w| w.strong_count() > 0);
    let window = Window::for_connection();
    table.insert((local, remote), Arc::downgrade(&window));
    Window::on_connection(window)
}

/// Answers of one stream as tonic writes them.
pub(super) type Answers =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::ModelStreamInferResponse, Status>> + Send>>;

/// Serves one ModelStreamInfer call; `shm` is the server's shared-memory registry and metadata
/// matching `forward` becomes request parameters. Reading and running go on in a task of their
/// own, which ends when the client half-closes and every answer is written, or when it goes away.
pub(super) fn serve<D: Dispatch>(
    dispatch: Arc<D>,
    shm: Arc<SharedMemory>,
    forward: Option<Arc<regex::Regex>>,
    r: Request<tonic::Streaming<proto::ModelInferRequest>>,
) -> Answers {
    // One window for every request of the stream: its unread answers are bounded together, and
    // with those of the connection's other streams.
    let window = stream_window(r.local_addr(), r.remote_addr());
    let (metadata, _, mut inbound) = r.into_parts();
    let grpc_errors = wants_grpc_errors(&metadata);
    let metadata = Arc::new(metadata);
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_WINDOW);
    tokio::spawn(async move {
        let mut running = tokio::task::JoinSet::new();
        let mut sequences = SequenceOrder::default();
        // The turn of the latest request whose answers go out in order.
        let mut last_turn = None;
        // The "queued" signal of the latest request (`crate::queued`): requests join their
        // model's queue in stream order, as Triton's do.
        let mut last_queued = None;
        // Bytes of the messages in flight (per task); with their count, bounded by the stream's budget.
        let mut held = 0usize;
        let mut sizes = std::collections::HashMap::new();
        loop {
            // Past the budget the stream is not read: HTTP/2 flow control holds the client back.
            let room = running.len() < STREAM_MAX_INFLIGHT && held < STREAM_MAX_INFLIGHT_BYTES;
            tokio::select! {
                next = inbound.message(), if room => match next {
                    Ok(Some(msg)) => {
                        let (d, shm, tx) = (dispatch.clone(), shm.clone(), tx.clone());
                        let window = window.clone();
                        let (forward, metadata) = (forward.clone(), metadata.clone());
                        let bytes = prost::Message::encoded_len(&msg);
                        held += bytes;
                        // Requests of one sequence run one after the other, in stream order.
                        let (after, done) = sequences.enter(&msg);
                        let turn = (!decoupled(&*dispatch, &msg)).then(|| Turn::next(&mut last_turn));
                        // Each request goes on once the one before is queued (or ended).
                        let (queued, next) = tokio::sync::oneshot::channel();
                        let before = last_queued.replace(next);
                        let task = running.spawn(crate::busy::around(async move {
                            if let Some(before) = before {
                                let _ = before.await;
                            }
                            let forward = forward.as_deref().map(|p| (p, &*metadata));
                            let answer = stream_answers(&*d, &shm, forward, msg, (&tx, window), grpc_errors, turn);
                            if done.in_sequence() {
                                // Its sequence orders it; other requests do not wait behind it.
                                let _ = queued.send(());
                                if let Some(previous) = after {
                                    let _ = previous.await;
                                }
                                answer.await;
                            } else {
                                crate::queued::scope(queued, answer).await;
                            }
                            done.finish();
                        }));
                        sizes.insert(task.id(), bytes);
                    }
                    Ok(None) => break,
                    Err(_) => {
                        running.abort_all();
                        break;
                    }
                },
                Some(finished) = running.join_next_with_id(), if !running.is_empty() => {
                    let id = match finished {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    held -= sizes.remove(&id).unwrap_or(0);
                }
                // The client went away, or an error status ended the stream (`triton_grpc_error`).
                _ = tx.closed() => {
                    running.abort_all();
                    break;
                }
            }
        }
        while running.join_next().await.is_some() {}
    });
    let messages = tokio_stream::wrappers::ReceiverStream::new(rx);
    Box::pin(futures::StreamExt::map(messages, |(m, _credit)| m))
}

/// Answers of one ModelStreamInfer call waiting to be written, before its requests wait for the client.
const STREAM_WINDOW: usize = 64;
/// Requests of one stream running or waiting at once (a sequence's later requests wait for its
/// turn): past either bound the stream is not read until one finishes.
const STREAM_MAX_INFLIGHT: usize = 64;
/// Bytes of those requests' messages at most (the first one in is always taken).
const STREAM_MAX_INFLIGHT_BYTES: usize = 64 << 20;

/// Whether the client asked for `triton_final_response` on every answer, and an empty answer
/// for a bare final flag (tritonclient's `enable_empty_final_response`).
fn wants_final_flag(msg: &proto::ModelInferRequest) -> bool {
    use proto::infer_parameter::ParameterChoice;
    msg.parameters
        .get("triton_enable_empty_final_response")
        .is_some_and(|p| matches!(p.parameter_choice, Some(ParameterChoice::BoolParam(true))))
}

fn final_flag(last: bool) -> proto::InferParameter {
    proto::InferParameter {
        parameter_choice: Some(proto::infer_parameter::ParameterChoice::BoolParam(last)),
    }
}

/// Messages of one ModelStreamInfer call on their way to tonic, each with the window credit of its answer,
/// returned only when tonic takes the message to write it (so a client that stops reading holds the
/// producers back by the window, not by this channel).
type StreamTx = tokio::sync::mpsc::Sender<(Result<proto::ModelStreamInferResponse, Status>, Option<Credit>)>;

/// One stream message; like Triton, every answer says in `triton_final_response` whether it is
/// the request's last, errors included.
fn stream_message(
    error_message: String,
    mut response: proto::ModelInferResponse,
    last: bool,
) -> proto::ModelStreamInferResponse {
    response
        .parameters
        .insert("triton_final_response".into(), final_flag(last));
    proto::ModelStreamInferResponse {
        error_message,
        infer_response: Some(response),
    }
}

/// Whether the stream asked for errors as gRPC statuses (metadata `triton_grpc_error: true`): the
/// first error then ends the stream with its status, as Triton does, instead of an `error_message`.
fn wants_grpc_errors(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get("triton_grpc_error")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// An error for the stream: in `error_message`, or, with `grpc_errors`, the status that ends it.
fn stream_error(
    e: Error,
    echo: &proto::ModelInferResponse,
    last: bool,
    grpc_errors: bool,
) -> Result<proto::ModelStreamInferResponse, Status> {
    match grpc_errors {
        true => Err(Status::from(e)),
        false => Ok(stream_message(e.message, echo.clone(), last)),
    }
}

/// A request's place among the answers of a stream that go out in request order, as Triton sends
/// those of models that are not decoupled: it writes once the request before it has written its
/// last answer (or ended without one), and then lets the next one write.
struct Turn {
    after: Option<tokio::sync::oneshot::Receiver<()>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Turn {
    /// The next turn after `last` (the previous ordered request's), which becomes this one's.
    fn next(last: &mut Option<tokio::sync::oneshot::Receiver<()>>) -> Turn {
        let (done, mine) = tokio::sync::oneshot::channel();
        Turn {
            after: last.replace(mine),
            done: Some(done),
        }
    }

    /// Waits for the previous request's last answer (once; a previous request that ended or was
    /// dropped without answering lets this one go too).
    async fn wait(&mut self) {
        if let Some(after) = self.after.take() {
            let _ = after.await;
        }
    }

    /// This request wrote its last answer: the next one may write.
    fn pass(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

/// Runs one request of a stream and sends its answers (several for a decoupled model) or its error
/// in `error_message` (or as the stream's status with `grpc_errors`), each carrying the request's
/// id. With a `turn`, answers wait for the earlier requests' answers to be written; an answer
/// waiting for its turn gives back its window credit (the stream's in-flight bound holds those).
async fn stream_answers<D: Dispatch>(
    dispatch: &D,
    shm: &SharedMemory,
    forward: Option<(&regex::Regex, &tonic::metadata::MetadataMap)>,
    msg: proto::ModelInferRequest,
    (tx, window): (&StreamTx, Arc<Window>),
    grpc_errors: bool,
    mut turn: Option<Turn>,
) {
    let flagged = wants_final_flag(&msg);
    let echo = proto::ModelInferResponse {
        model_name: msg.model_name.clone(),
        model_version: msg.model_version.clone(),
        id: msg.id.clone(),
        ..Default::default()
    };
    let (mut request, in_use) = match codec::decode_request(msg, shm) {
        Ok(decoded) => decoded,
        Err(e) => {
            if let Some(turn) = turn.as_mut() {
                turn.wait().await;
            }
            let _ = tx.send((stream_error(e, &echo, true, grpc_errors), None)).await;
            return;
        }
    };
    if let Some((pattern, metadata)) = forward {
        forward_metadata(pattern, metadata, &mut request.parameters);
    }
    let (sink, mut answers) = stream_channel(window);
    // Owns the receiver, so a client that went away reads as cancelled to the model.
    let forward = async move {
        loop {
            // A client that went away (even after half-closing) ends the wait at once, not at the next send.
            let mut item = tokio::select! {
                item = answers.recv() => match item {
                    Some(item) => item,
                    None => return,
                },
                _ = tx.closed() => return,
            };
            let mut credit = item.credit.take();
            if let Some(turn) = turn.as_mut() {
                if turn.after.is_some() {
                    credit = None;
                    turn.wait().await;
                }
            }
            let message = match item.response {
                Some(Ok(response)) => match codec::encode_response(response, &in_use) {
                    Ok(encoded) => Ok(stream_message(String::new(), encoded, item.last)),
                    Err(e) => stream_error(e, &echo, item.last, grpc_errors),
                },
                Some(Err(e)) => stream_error(e, &echo, item.last, grpc_errors),
                // A bare final flag becomes an empty answer only for clients that asked for one.
                None if item.last && flagged => Ok(stream_message(String::new(), echo.clone(), true)),
                None => continue,
            };
            let ends = message.is_err();
            let sent = tx.send((message, credit)).await.is_ok();
            if item.last {
                if let Some(turn) = turn.as_mut() {
                    turn.pass();
                }
            }
            if !sent || ends {
                return;
            }
        }
    };
    tokio::join!(dispatch.infer_stream(request, sink), forward);
}

/// Whether the model a stream request names is decoupled (its answers then go out as they come);
/// an unknown model's error is ordered, as Triton orders it.
fn decoupled<D: Dispatch + ?Sized>(dispatch: &D, msg: &proto::ModelInferRequest) -> bool {
    dispatch
        .model(&msg.model_name, &msg.model_version)
        .is_ok_and(|m| m.config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled))
}

/// The requests of one stream that belong to sequences: each waits for the previous request of
/// its sequence (same model and `sequence_id`) to be answered, so a sequence runs in stream order
/// while other requests overlap.
#[derive(Default)]
struct SequenceOrder {
    last: std::collections::HashMap<
        (String, String),
        (tokio::sync::oneshot::Receiver<()>, Arc<std::sync::atomic::AtomicBool>),
    >,
}

/// Marks a sequence request answered (also when its task is dropped).
struct Done(
    Option<tokio::sync::oneshot::Sender<()>>,
    Arc<std::sync::atomic::AtomicBool>,
);

impl Done {
    /// The request belongs to a sequence (it is ordered by its sequence, not by the stream).
    fn in_sequence(&self) -> bool {
        self.0.is_some()
    }

    fn finish(mut self) {
        self.1.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        self.1.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl SequenceOrder {
    /// What a request must wait for (the previous request of its sequence) and how it signals its end.
    fn enter(&mut self, msg: &proto::ModelInferRequest) -> (Option<tokio::sync::oneshot::Receiver<()>>, Done) {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The one rule of mesh::params: a request whose id it refuses is not ordered (it is refused).
        let id = msg
            .parameters
            .get("sequence_id")
            .and_then(|p| p.parameter_choice.clone())
            .map(|choice| vec![("sequence_id".to_string(), codec::param_in(choice))])
            .and_then(|params| crate::params::sequence_id(&params).ok().flatten());
        let Some(id) = id.map(|id| id.to_string()) else {
            return (None, Done(None, flag));
        };
        if self.last.len() >= 1024 {
            self.last
                .retain(|_, (_, done)| !done.load(std::sync::atomic::Ordering::Relaxed));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let previous = self.last.insert((msg.model_name.clone(), id), (rx, flag.clone()));
        (previous.map(|(rx, _)| rx), Done(Some(tx), flag))
    }
}
