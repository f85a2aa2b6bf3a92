//! Requests a router sends this node: each arrives on its own stream, is checked (a node that is
//! leaving, or does not serve the model, refuses before running it so the router may retry
//! elsewhere), runs through the node's Dispatch, and is answered on the same stream.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use mesh::cluster::answer::{message_name, refuse, reject, request_of, serve};
use mesh::cluster::convert::{wire_error, ErrorKind};
use mesh::cluster::frame::{self, FrameError};
use mesh::cluster::io::{finish_reading, read_frame, write_frame};
use mesh::cluster::msg::{Message, StatsReply};
use mesh::cluster::shm::Outbound;
use mesh::cluster::Limits;
use mesh::{Code, Dispatch, Error};
use quinn::{RecvStream, SendStream};

use crate::actors::table::ModelTable;
use crate::serving::dispatch::NodeDispatch;

/// What serving a router's request needs.
pub struct Serving {
    pub dispatch: Arc<NodeDispatch>,
    pub table: Arc<ModelTable>,
    pub limits: Limits,
    /// Set once every router released this node: anything still arriving is refused as not started.
    pub leaving: AtomicBool,
    /// Router requests being served now (the node waits for them before it leaves).
    pub active: AtomicUsize,
}

/// Whether an error means the request never ran. A model's request refused as overloaded was
/// refused at admission (the in-flight budget, a full queue), before anything ran. An ensemble's
/// overloaded step is different: earlier steps may have run, so it counts as answered.
fn kind_of(ensemble: bool) -> impl Fn(&Error) -> ErrorKind {
    move |e| {
        if e.code == Code::Overloaded && !ensemble {
            ErrorKind::Overloaded
        } else {
            ErrorKind::Answered
        }
    }
}

struct Active<'a>(&'a AtomicUsize);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Serving {
    /// Serves one stream the router opened on `link` (its connection's number: the router is one
    /// client of the node's budget); large answers go through `out`, the router's shared-memory
    /// arena, when it runs on this host.
    pub async fn stream(&self, mut send: SendStream, mut recv: RecvStream, (link, out): (u64, Option<&Outbound>)) {
        self.active.fetch_add(1, Ordering::AcqRel);
        let _active = Active(&self.active);
        let first = match read_frame(&mut recv, &self.limits).await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => return reject(send, recv, e, &self.limits).await,
        };
        if let Message::StatsQuery(q) = &first.message {
            let reply = match self.dispatch.model_statistics(&q.name, &q.version).await {
                Ok(s) => StatsReply::Stats(prost::Message::encode_to_vec(&s)),
                Err(e) => StatsReply::Error(wire_error(&e, ErrorKind::Answered)),
            };
            if let Ok(chunks) = frame::encode(&Message::StatsReply(reply), Default::default(), &self.limits) {
                let _ = write_frame(&mut send, chunks).await;
            }
            let _ = send.finish();
            finish_reading(recv, self.limits.frame_deadline);
            return;
        }
        if !matches!(first.message, Message::Request(_)) {
            let what = message_name(&first.message);
            let e = FrameError::Invalid(format!("a {what} cannot open a request stream"));
            return reject(send, recv, e, &self.limits).await;
        }
        let (mut request, stream, trace) = match request_of(first) {
            Ok(r) => r,
            Err(e) => return reject(send, recv, e, &self.limits).await,
        };
        if self.leaving.load(Ordering::Acquire) {
            let e = Error::unavailable("this node is leaving the cluster");
            return refuse(&mut send, e, ErrorKind::NotStarted, &self.limits).await;
        }
        let ensemble = match self.table.resolve(&request.model_name, &request.model_version) {
            Ok(v) if v.is_ready() => v.ensemble.is_some(),
            Ok(_) => {
                let e = Error::unavailable(format!(
                    "model '{}' has no ready instance on this node",
                    request.model_name
                ));
                return refuse(&mut send, e, ErrorKind::NotStarted, &self.limits).await;
            }
            Err(e) => return refuse(&mut send, e, ErrorKind::NotStarted, &self.limits).await,
        };
        request.client = mesh::Client::Link(link);
        serve(
            &*self.dispatch,
            (request, stream, trace),
            (send, recv),
            (&self.limits, out),
            kind_of(ensemble),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_model_refused_at_admission_never_ran() {
        let busy = Error::overloaded("queue full");
        let failed = Error::invalid("bad input");
        assert_eq!(kind_of(false)(&busy), ErrorKind::Overloaded);
        assert_eq!(kind_of(false)(&failed), ErrorKind::Answered);
        // In an ensemble, earlier steps may have run before one was refused.
        assert_eq!(kind_of(true)(&busy), ErrorKind::Answered);
        assert_eq!(kind_of(true)(&failed), ErrorKind::Answered);
    }
}
