//! Serving one admitted request through an ensemble, the same on a node and on the router: the steps
//! run through the server's own `Dispatch`, answering once, or, on a stream with a decoupled step,
//! sending each answer on; what it came to is handed back for the server's statistics.
use super::{run, run_stream, Plan};
use crate::dispatch::Dispatch;
use crate::error::Result;
use crate::request::{InferRequest, InferResponse};
use crate::stream::{stream_channel, StreamSender};

/// What serving one request through an ensemble came to.
#[derive(Debug)]
pub enum Served {
    /// One answer, labelled with the ensemble's version (classify it, then send it).
    Answered(Result<InferResponse>),
    /// Each answer went to the stream; `failed`: the metric reason of an error among them.
    Streamed { failed: Option<&'static str> },
}

impl Served {
    /// The metric reason of the failure, for the ensemble's own statistics; None: it succeeded.
    pub fn failed(&self) -> Option<&'static str> {
        match self {
            Served::Answered(Ok(_)) => None,
            Served::Answered(Err(e)) => Some(e.metric_reason()),
            Served::Streamed { failed } => *failed,
        }
    }
}

/// Runs an admitted request through `plan` (the ensemble at `version`). With a `stream` and a
/// decoupled step each answer of the ensemble goes there as it comes (each answer's credit travels on
/// with it); otherwise it answers once. The caller has refused a decoupled plan without a stream
/// (`validate::needs_stream`).
pub async fn serve<D: Dispatch + ?Sized>(
    plan: &Plan,
    dispatch: &D,
    mut request: InferRequest,
    version: &str,
    stream: Option<StreamSender>,
) -> Served {
    let Some(sink) = stream.filter(|_| plan.decoupled) else {
        let answer = run(plan, dispatch, request).await.map(|mut r| {
            r.model_version = version.to_string();
            r
        });
        return Served::Answered(answer);
    };
    request.model_version = version.to_string();
    // The steps stream into the client's own window; the answers are watched on the way for errors.
    let (tx, mut rx) = stream_channel(sink.window().clone());
    let forward = async {
        let mut failed = None;
        while let Some(item) = rx.recv().await {
            if let Some(Err(e)) = &item.response {
                failed = Some(e.metric_reason());
            }
            let _ = sink.send(item);
        }
        failed
    };
    let ((), failed) = tokio::join!(run_stream(plan, dispatch, request, tx), forward);
    Served::Streamed { failed }
}
