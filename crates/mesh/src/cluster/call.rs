//! The asking side of a request stream: one attempt of a request on one link (open a stream, write
//! the request frame, read the answers), with every failure classified by what the peer could have
//! done, for the router's retry rules. Routers call nodes with it, and nodes call routers (BLS).
use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use quinn::{Connection, VarInt};

use super::convert::{answer_from, error_from, Answered, ErrorKind};
use super::frame::{self, FrameError, Limits};
use super::io::{finish_reading, read_frame};
use super::msg::{Message, StatsQuery, StatsReply};
use super::shm::Outbound;
use super::transport::stream_code;
use crate::proto::ModelStatisticsResponse;
use crate::stream::Credit;
use crate::{Error, InferResponse, StreamItem, StreamSender};

/// The other end of a link: its connection, how messages name it ("node 'a'"), and its
/// shared-memory arena when it runs on this host.
#[derive(Clone, Copy)]
pub struct Peer<'a> {
    pub conn: &'a Connection,
    pub name: &'a str,
    pub out: Option<&'a Outbound>,
}

/// How one attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The request never reached the node whole (the link was gone, or died while it was written):
    /// the node cannot have started it.
    NotSent(String),
    /// The node refused it before running it (draining, model not served there).
    Refused(Error),
    /// The node is overloaded and refused it at admission (busy, not dead).
    Overloaded(Error),
    /// The link or stream failed after the request was sent: it may have run.
    Lost(String),
    /// The model ran and answered this error; it goes to the client as is.
    Answered(Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotSent(why) | Failure::Lost(why) => f.write_str(why),
            Failure::Refused(e) | Failure::Overloaded(e) | Failure::Answered(e) => f.write_str(&e.message),
        }
    }
}

impl Failure {
    /// The label a retry after this failure is counted under (`None`: an answer, never retried).
    pub fn metric_reason(&self) -> Option<&'static str> {
        match self {
            Failure::NotSent(_) => Some("not_sent"),
            Failure::Refused(_) => Some("refused"),
            Failure::Overloaded(_) => Some("overloaded"),
            Failure::Lost(_) => Some("lost"),
            Failure::Answered(_) => None,
        }
    }
}

fn from_answer(e: Error, kind: ErrorKind) -> Failure {
    match kind {
        ErrorKind::Answered => Failure::Answered(e),
        ErrorKind::NotStarted => Failure::Refused(e),
        ErrorKind::Overloaded => Failure::Overloaded(e),
    }
}

/// An answer that could not be read. A broken or garbled stream may have run the request, so it
/// counts as lost; an answer refused by this process's own receive budget was produced by the peer,
/// so it is this request's error (never retried, and the peer is not to blame).
fn unreadable(link: Peer<'_>, e: FrameError) -> Failure {
    match e {
        FrameError::Busy { .. } => Failure::Answered(Error::overloaded(format!(
            "the answer of {} could not be taken: {e}; retry later",
            link.name
        ))),
        e => Failure::Lost(format!("{}: {e}", link.name)),
    }
}

/// Why a peer stopped reading a request: its refusal, when it answered one (busy, say); else the
/// request was not sent whole.
async fn refusal(link: Peer<'_>, rx: &mut quinn::RecvStream, limits: &Limits) -> Failure {
    if let Ok(Some(frame)) = read_frame(rx, limits).await {
        if let Message::Answer(a) = frame.message {
            if let Ok(Answered::Error(e, kind)) = answer_from(a.body, &frame.payload) {
                if kind != ErrorKind::Answered {
                    return from_answer(e, kind);
                }
            }
        }
    }
    Failure::NotSent(format!("{} stopped reading the request", link.name))
}

/// Opens a stream and writes the request; `finish`: nothing else follows (a stream's caller sends credit).
async fn open(
    link: Peer<'_>,
    chunks: Vec<Bytes>,
    limits: &Limits,
    finish: bool,
) -> Result<(quinn::SendStream, quinn::RecvStream), Failure> {
    let not_sent = |e: String| Failure::NotSent(format!("{}: {e}", link.name));
    let (mut tx, mut rx) = link.conn.open_bi().await.map_err(|e| not_sent(e.to_string()))?;
    // Until every byte is handed to quinn the peer cannot hold the whole frame, so it cannot run it.
    let mut chunks = super::io::via(chunks, link.out);
    match tx.write_all_chunks(&mut chunks).await {
        Ok(()) => {}
        Err(quinn::WriteError::Stopped(_)) => return Err(refusal(link, &mut rx, limits).await),
        Err(e) => return Err(not_sent(e.to_string())),
    }
    if finish {
        let _ = tx.finish();
    }
    // Written whole: the next request of a client's stream may go (it opens a later stream).
    crate::queued::fire();
    Ok((tx, rx))
}

/// One request that answers once.
pub async fn unary(link: Peer<'_>, chunks: Vec<Bytes>, limits: &Limits) -> Result<InferResponse, Failure> {
    let (_tx, mut rx) = open(link, chunks, limits, true).await?;
    let frame = match read_frame(&mut rx, limits).await {
        Ok(Some(f)) => {
            finish_reading(rx, limits.frame_deadline);
            f
        }
        Ok(None) => {
            return Err(Failure::Lost(format!(
                "{} closed the stream without answering",
                link.name
            )))
        }
        Err(e) => return Err(unreadable(link, e)),
    };
    let Message::Answer(answer) = frame.message else {
        return Err(unreadable(link, FrameError::Invalid("expected an answer".into())));
    };
    match answer_from(answer.body, &frame.payload).map_err(|e| unreadable(link, e))? {
        Answered::Response(r) => Ok(r),
        Answered::Error(e, kind) => Err(from_answer(e, kind)),
        Answered::Empty => Err(unreadable(
            link,
            FrameError::Invalid("an empty answer to a unary request".into()),
        )),
    }
}

/// One request whose answers stream to `sink` as they arrive (a decoupled model sends several).
/// The next answer is read from the link only with a credit of the sink's window in hand, so a client
/// that stops reading leaves the rest in the link's flow control (the node's own window then holds the
/// model back), never in this process. On failure, also says how many answers already reached the client. A client that goes away
/// cancels the request on the node (the stream is reset; the model sees `is_cancelled()`). The
/// stream must open and give its first answer by `first_by` (the request's deadline); a decoupled
/// model may then stream for as long as it likes.
pub async fn stream(
    link: Peer<'_>,
    chunks: Vec<Bytes>,
    limits: &Limits,
    sink: &StreamSender,
    first_by: Instant,
) -> Result<(), (Failure, u32)> {
    let late = || {
        let e = Error::unavailable(format!("the request's deadline passed before {} answered", link.name));
        (Failure::Answered(e), 0)
    };
    let (mut tx, mut rx) = match tokio::time::timeout_at(first_by.into(), open(link, chunks, limits, false)).await {
        Ok(opened) => opened.map_err(|f| (f, 0))?,
        Err(_) => return Err(late()),
    };
    let mut forwarded = 0u32;
    let cancel = |rx: &mut quinn::RecvStream, tx: &mut quinn::SendStream| {
        let _ = rx.stop(VarInt::from_u32(stream_code::CANCELLED));
        let _ = tx.reset(VarInt::from_u32(stream_code::CANCELLED));
    };
    // Client credits held for the answers granted to the peer and not read yet, oldest first.
    let mut held: VecDeque<Credit> = VecDeque::new();
    let mut granting = true;
    loop {
        let mut granted = 0u32;
        while held.len() < GRANT_AHEAD {
            let Some(credit) = sink.try_credit() else { break };
            held.push_back(credit);
            granted += 1;
        }
        if held.is_empty() {
            let credit = tokio::select! {
                credit = sink.credit() => credit,
                _ = tokio::time::sleep_until(first_by.into()), if forwarded == 0 => {
                    cancel(&mut rx, &mut tx);
                    return Err(late());
                }
            };
            let Some(credit) = credit else {
                cancel(&mut rx, &mut tx);
                return Ok(());
            };
            held.push_back(credit);
            granted += 1;
        }
        // A peer that sent its final answer stops reading credit (its stream ends), so a grant that
        // fails is not the stream's failure: reading on finds the final answer, or the real error.
        if granted > 0 && granting {
            granting = grant(&mut tx, granted, limits).await.is_ok();
        }
        let next = tokio::select! {
            next = read_frame(&mut rx, limits) => next,
            _ = tokio::time::sleep_until(first_by.into()), if forwarded == 0 => {
                cancel(&mut rx, &mut tx);
                return Err(late());
            }
            _ = sink.closed() => {
                cancel(&mut rx, &mut tx);
                return Ok(());
            }
        };
        let frame = match next {
            Ok(Some(f)) => f,
            Ok(None) => {
                let why = format!("{} ended the stream before its final answer", link.name);
                return Err((Failure::Lost(why), forwarded));
            }
            Err(e) => return Err((unreadable(link, e), forwarded)),
        };
        let Message::Answer(answer) = frame.message else {
            return Err((
                unreadable(link, FrameError::Invalid("expected an answer".into())),
                forwarded,
            ));
        };
        let last = answer.last;
        let response = match answer_from(answer.body, &frame.payload).map_err(|e| (unreadable(link, e), forwarded))? {
            Answered::Response(r) => Some(Ok(r)),
            // An error before any answer may still be retried elsewhere (if the node never ran it).
            Answered::Error(e, kind) if forwarded == 0 && kind != ErrorKind::Answered => {
                return Err((from_answer(e, kind), 0))
            }
            Answered::Error(e, _) => Some(Err(e)),
            Answered::Empty => None,
        };
        let mut credit = held.pop_front().expect("an answer is read only with a credit held");
        credit.charge(frame.payload.len() as u64);
        let _ = sink.send(StreamItem {
            response,
            last,
            credit: Some(credit),
        });
        forwarded += 1;
        if last {
            let _ = tx.finish();
            finish_reading(rx, limits.frame_deadline);
            return Ok(());
        }
    }
}

/// Answers a streamed request's caller lets the peer send ahead of its client's reading: enough to
/// overlap the next answer with this one, few enough that requests sharing a client's window are
/// not starved by one that holds its credits.
const GRANT_AHEAD: usize = 2;

/// Lets the peer send `answers` more answers on a streamed request.
async fn grant(tx: &mut quinn::SendStream, answers: u32, limits: &Limits) -> Result<(), FrameError> {
    let chunks = frame::encode(&Message::Credit(answers), Default::default(), limits)?;
    tokio::time::timeout(CREDIT_WRITE_TIMEOUT, super::io::write_frame(tx, chunks))
        .await
        .map_err(|_| FrameError::Io(format!("the peer took no credit for {CREDIT_WRITE_TIMEOUT:?}")))?
}

/// How long a credit frame may take to be accepted by the peer's stream.
const CREDIT_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks a node for its statistics of a model (empty name: every model).
pub async fn stats(
    link: Peer<'_>,
    name: &str,
    version: &str,
    limits: &Limits,
) -> Result<ModelStatisticsResponse, Error> {
    let query = Message::StatsQuery(StatsQuery {
        name: name.to_string(),
        version: version.to_string(),
    });
    let chunks = frame::encode(&query, Default::default(), limits)?;
    let (_tx, mut rx) = open(link, chunks, limits, true)
        .await
        .map_err(|f| Error::unavailable(f.to_string()))?;
    let frame = read_frame(&mut rx, limits)
        .await?
        .ok_or_else(|| Error::unavailable(format!("{} closed the statistics stream", link.name)))?;
    finish_reading(rx, limits.frame_deadline);
    match frame.message {
        Message::StatsReply(StatsReply::Stats(bytes)) => prost::Message::decode(bytes.as_slice())
            .map_err(|e| Error::internal(format!("{} sent unreadable statistics: {e}", link.name))),
        Message::StatsReply(StatsReply::Error(w)) => Err(error_from(&w).0),
        _ => Err(Error::internal(format!(
            "{} answered statistics with another frame",
            link.name
        ))),
    }
}
