//! One ModelStreamInfer call: its requests read under the stream's and its connection's budgets,
//! each run as soon as the one before is queued, and their answers written in the order Triton
//! writes them.
//!
//! What a connection's streams hold is bounded whatever their number: past its first request in
//! flight, a stream reads a request only with room in its connection's request window
//! ([`CONNECTION_REQUEST_BYTES`]), and the request keeps its bytes there, with those of its answers
//! that wait for their turn or for the client, until its last answer is taken by the connection; a
//! decoupled model's answers are bounded by the connection's answer window ([`crate::stream`]).
//! Every stream can always have one request in flight, so none waits on another of its connection.
//! Every answer waiting for its client is also charged to the server's budget
//! ([`Dispatch::budget`]), so unread answers hold back what the server admits.
use std::net::SocketAddr;
use std::sync::Arc;

use tonic::{Request, Status};

use super::codec::{self, forward_metadata};
use crate::budget::Permit;
use crate::dispatch::Dispatch;
use crate::error::Error;
use crate::proto;
use crate::request::Client;
use crate::shm::SharedMemory;
use crate::stream::{response_bytes, stream_channel, Credit, Window};
use crate::sync::Locked;

/// The windows of the client connections with streams open, by (server, client) address: each
/// connection's streams share them. An entry lives while a stream of its connection does; dead ones
/// are swept as others are added, so the table holds at most one entry per connection with streams
/// plus those that ended since the last sweep.
static CONNECTIONS: std::sync::LazyLock<std::sync::Mutex<ConnectionWindows>> =
    std::sync::LazyLock::new(Default::default);

/// Each connection's windows, by (server, client) address.
type ConnectionWindows = std::collections::HashMap<(SocketAddr, SocketAddr), std::sync::Weak<Connection>>;

/// What the streams of one client connection share: the window of answers made and not taken
/// (`Window::on_connection`), and the window of requests read and not done.
struct Connection {
    answers: Arc<Window>,
    requests: Arc<Window>,
}

impl Connection {
    fn new() -> Arc<Connection> {
        Arc::new(Connection {
            answers: Window::for_connection(),
            requests: Window::new(CONNECTION_REQUESTS, CONNECTION_REQUEST_BYTES),
        })
    }
}

/// The windows of the connection between `local` and `remote` (a stream's own when tonic does not
/// know its connection), which each of its streams holds while it runs.
fn connection_of(local: Option<SocketAddr>, remote: Option<SocketAddr>) -> Arc<Connection> {
    let (Some(local), Some(remote)) = (local, remote) else {
        return Connection::new();
    };
    let mut table = CONNECTIONS.locked();
    if let Some(c) = table.get(&(local, remote)).and_then(std::sync::Weak::upgrade) {
        return c;
    }
    table.retain(|_, c| c.strong_count() > 0);
    let c = Connection::new();
    table.insert((local, remote), Arc::downgrade(&c));
    c
}

/// Answers of one stream as tonic writes them.
pub(super) type Answers =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::ModelStreamInferResponse, Status>> + Send>>;

/// Serves one ModelStreamInfer call; `shm` is the server's shared-memory registry and metadata
/// matching `forward` becomes request parameters. Reading and running go on in a task of their
/// own, which ends when the client half-closes and every answer is written, or when it goes away:
/// then every request of the stream still running is dropped, which the model sees as
/// `is_cancelled()`.
///
/// A client that cancels the call (tritonclient's `stop_stream(cancel_requests=True)`, grpcio's
/// `cancel()`) resets the HTTP/2 stream with CANCEL, which tonic reads on the request side as the
/// end of the stream, like a half-close; so the end of the requests is never taken for the
/// client's going away, and the stream keeps watching for that (its answers' receiver dropped,
/// as hyper drops it on the reset) until its last request is answered.
pub(super) fn serve<D: Dispatch>(
    dispatch: Arc<D>,
    shm: Arc<SharedMemory>,
    forward: Option<Arc<regex::Regex>>,
    r: Request<tonic::Streaming<proto::ModelInferRequest>>,
) -> Answers {
    // The stream's answers are bounded together, and with those of the connection's other streams;
    // its requests with the connection's.
    let connection = connection_of(r.local_addr(), r.remote_addr());
    let window = Window::on_connection(connection.answers.clone());
    let requests = Window::within(
        STREAM_MAX_INFLIGHT,
        CONNECTION_REQUEST_BYTES,
        connection.requests.clone(),
    );
    let client = r.remote_addr().map_or(Client::Local, Client::Connection);
    let (metadata, _, mut inbound) = r.into_parts();
    let grpc_errors = wants_grpc_errors(&metadata);
    let carrier = codec::trace_carrier(&metadata);
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
        // The place in the connection's request window the next request read takes.
        let mut place: Option<Credit> = None;
        // Until the client's side of the stream ends (a half-close, or a cancel: see above).
        let mut reading = true;
        while reading || !running.is_empty() {
            // Past its bounds the stream is not read: HTTP/2 flow control holds the client back.
            let room = running.len() < STREAM_MAX_INFLIGHT;
            tokio::select! {
                credit = requests.acquire(), if reading && room && place.is_none() => place = Some(credit),
                next = inbound.message(), if reading && place.is_some() => match next {
                    Ok(Some(msg)) => {
                        let (d, shm, tx) = (dispatch.clone(), shm.clone(), tx.clone());
                        let window = window.clone();
                        let (forward, metadata, carrier) = (forward.clone(), metadata.clone(), carrier.clone());
                        let mut hold = place.take().expect("read only with a place");
                        hold.charge(prost::Message::encoded_len(&msg) as u64);
                        // Requests of one sequence run one after the other, in stream order.
                        let (after, done) = sequences.enter(&msg);
                        let turn = (!decoupled(&*dispatch, &msg)).then(|| Turn::next(&mut last_turn));
                        // Each request goes on once the one before is queued (or ended).
                        let (queued, next) = tokio::sync::oneshot::channel();
                        let before = last_queued.replace(next);
                        running.spawn(crate::busy::around(async move {
                            if let Some(before) = before {
                                let _ = before.await;
                            }
                            let forward = forward.as_deref().map(|p| (p, &*metadata));
                            let to = Out { tx: &tx, window, hold, client, carrier };
                            let answer = stream_answers(&*d, &shm, forward, msg, to, grpc_errors, turn);
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
                    }
                    // Its requests still running go on until answered, or until the client goes away.
                    Ok(None) => {
                        reading = false;
                        place = None;
                    }
                    Err(_) => {
                        running.abort_all();
                        break;
                    }
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
                // The client went away (after its side ended too), or an error status ended the
                // stream (`triton_grpc_error`): the requests still running are cancelled.
                _ = tx.closed() => {
                    running.abort_all();
                    break;
                }
            }
        }
        drop(place);
        while running.join_next().await.is_some() {}
        // Held until here: the table's entry for the connection lives while one of its streams
        // does, so the connection's next stream shares these windows.
        drop(connection);
    });
    let messages = tokio_stream::wrappers::ReceiverStream::new(rx);
    Box::pin(futures::StreamExt::map(messages, |(m, _held)| m))
}

/// Answers of one ModelStreamInfer call waiting to be written, before its requests wait for the client.
const STREAM_WINDOW: usize = 64;
/// Requests of one stream running or waiting at once (a sequence's later requests wait for its
/// turn): past it the stream is not read until one finishes.
const STREAM_MAX_INFLIGHT: usize = 64;
/// Bytes of requests all the streams of one connection hold, read and not done, with the answers
/// of theirs that wait for their turn or for the client. Past it a stream of the connection is read
/// only when it has no request in flight, until the client takes answers.
pub const CONNECTION_REQUEST_BYTES: u64 = 64 << 20;
/// Requests they hold at once, at most: every stream's in-flight bound, so bytes are the bound.
const CONNECTION_REQUESTS: usize = STREAM_MAX_INFLIGHT * crate::serve::GRPC_MAX_STREAMS as usize;

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

/// Messages of one ModelStreamInfer call on their way to tonic, each with what it keeps charged,
/// returned only when tonic takes the message to write it (so a client that stops reading holds the
/// producers back by the windows, not by this channel).
type StreamTx = tokio::sync::mpsc::Sender<(Result<proto::ModelStreamInferResponse, Status>, Held)>;

/// What an answer on its way to tonic keeps charged until tonic takes it: its credit in the
/// stream's answer window, the request's place in the connection's request window (with the
/// request's last answer), and its bytes in the server's budget.
#[derive(Default)]
struct Held {
    _credit: Option<Credit>,
    _place: Option<Credit>,
    _budget: Option<Permit>,
}

/// Where one request's answers go: the stream's sender and answer window, the request's place in
/// its connection's request window, and who sent it.
struct Out<'a> {
    tx: &'a StreamTx,
    window: Arc<Window>,
    hold: Credit,
    client: Client,
    /// The client's trace context, from the stream's metadata (OpenTelemetry mode).
    carrier: Option<crate::trace::otel::context::Carrier>,
}

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
/// id. With a `turn`, answers wait for the earlier requests' answers to be written; such an answer
/// is charged to the request's place in the connection's request window and gives back its answer
/// window credit (which the earlier answers may need), and the place goes with its last answer.
async fn stream_answers<D: Dispatch>(
    dispatch: &D,
    shm: &SharedMemory,
    forward: Option<(&regex::Regex, &tonic::metadata::MetadataMap)>,
    msg: proto::ModelInferRequest,
    out: Out<'_>,
    grpc_errors: bool,
    mut turn: Option<Turn>,
) {
    let Out {
        tx,
        window,
        hold,
        client,
        carrier,
    } = out;
    use crate::trace::front::{self, Frontend, Point};
    let received = std::time::Instant::now();
    // The name is copied (for the trace) only while anything traces.
    let traced = front::active().then(|| msg.model_name.clone());
    let mut place = Some(hold);
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
            let held = Held {
                _place: place,
                ..Default::default()
            };
            let _ = tx.send((stream_error(e, &echo, true, grpc_errors), held)).await;
            return;
        }
    };
    if let Some((pattern, metadata)) = forward {
        forward_metadata(pattern, metadata, &mut request.parameters);
    }
    request.client = client;
    let (model, budget) = (request.model_name.clone(), dispatch.budget().cloned());
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
            // Until the client takes it, the answer counts against the server's budget.
            let bytes = match &item.response {
                Some(Ok(response)) => response_bytes(response),
                _ => 0,
            };
            let charged = budget
                .as_ref()
                .filter(|_| bytes > 0)
                .map(|b| b.force(&model, client, bytes));
            if let Some(turn) = turn.as_mut() {
                if let Some(place) = place.as_mut() {
                    place.charge(bytes);
                }
                if turn.after.is_some() {
                    credit = None;
                    turn.wait().await;
                }
            }
            front::stamp(Point::SendStart);
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
            let held = Held {
                _credit: credit,
                _place: if item.last { place.take() } else { None },
                _budget: charged,
            };
            let sent = tx.send((message, held)).await.is_ok();
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
    let served = async move {
        front::stamp(Point::RecvEnd);
        tokio::join!(dispatch.infer_stream(request, sink), forward);
    };
    front::serve(Frontend::Grpc, traced.as_deref(), received, carrier, served).await;
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

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
