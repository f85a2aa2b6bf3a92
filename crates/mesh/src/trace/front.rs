//! The frontends' timestamps of a traced request (Triton's `HTTP_RECV_START` … `HTTP_SEND_END` and
//! `GRPC_WAITREAD_START` … `GRPC_SEND_END`): a frontend serves an infer request inside `serve`, the
//! dispatch's trace of that request is handed back to it instead of being written, and the
//! frontend writes it with its own stamps once the answer is out of its hands. In OpenTelemetry
//! mode the frontend also brings the client's trace context (`traceparent`), and its stamps become
//! the events of the request's root span, which ends when the frontend is done (or dropped: the
//! client went away).
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::otel::context::Carrier;
use super::{ns, otel, write_now, Trace, ACTIVE};
use crate::sync::Locked;

/// Which frontend serves the request, which names its stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend {
    Http,
    Grpc,
}

/// The four points a frontend stamps, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The frontend starts reading the request.
    RecvStart,
    /// The request is read and decoded.
    RecvEnd,
    /// The answer is ready and the frontend starts encoding it.
    SendStart,
    /// The encoded answer is handed to the connection.
    SendEnd,
}

impl Frontend {
    /// Triton's name of a point.
    pub fn name(self, point: Point) -> &'static str {
        match (self, point) {
            (Frontend::Http, Point::RecvStart) => "HTTP_RECV_START",
            (Frontend::Http, Point::RecvEnd) => "HTTP_RECV_END",
            (Frontend::Http, Point::SendStart) => "HTTP_SEND_START",
            (Frontend::Http, Point::SendEnd) => "HTTP_SEND_END",
            (Frontend::Grpc, Point::RecvStart) => "GRPC_WAITREAD_START",
            (Frontend::Grpc, Point::RecvEnd) => "GRPC_WAITREAD_END",
            (Frontend::Grpc, Point::SendStart) => "GRPC_SEND_START",
            (Frontend::Grpc, Point::SendEnd) => "GRPC_SEND_END",
        }
    }
}

/// One request a frontend is serving: the model it names, its stamps so far, and the trace the
/// dispatch sampled for it (if any).
struct Front {
    kind: Frontend,
    model: String,
    stamps: Mutex<Vec<(&'static str, u64)>>,
    trace: Mutex<Option<Trace>>,
    /// The client's trace context (OpenTelemetry mode).
    carrier: Option<Carrier>,
    /// The request's trace, in OpenTelemetry mode: the frontend ends its root span.
    request: Mutex<Option<u64>>,
}

/// Ends the root span of the request a frontend served (OpenTelemetry mode), when `serve` is
/// done or dropped unfinished (`answered` false: the client went away).
struct Close {
    front: Arc<Front>,
    answered: bool,
}

impl Drop for Close {
    fn drop(&mut self) {
        let Some(id) = self.front.request.locked().take() else {
            return;
        };
        let mut stamps = std::mem::take(&mut *self.front.stamps.locked());
        if self.answered {
            stamps.push((self.front.kind.name(Point::SendEnd), ns(Instant::now())));
        }
        otel::front_done(id, &stamps, self.answered);
    }
}

tokio::task_local! {
    static FRONT: Arc<Front>;
}

/// Whether anything traces now: a frontend that must copy the model's name for `serve` does so
/// only then.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Serves one infer request of `model` with `serve` (which calls `stamp` at the points it reaches),
/// then writes the request's trace, if it was sampled, with the frontend's stamps around the
/// dispatch's. Costs one atomic load while nothing traces (or `model` is None: it was not
/// copied because nothing traced when the request came). `carrier`: the client's trace context
/// headers (read only while something traces).
pub async fn serve<T>(
    kind: Frontend,
    model: Option<&str>,
    received: Instant,
    carrier: Option<Carrier>,
    serve: impl Future<Output = T>,
) -> T {
    let Some(model) = model.filter(|_| active()) else {
        return serve.await;
    };
    let front = Arc::new(Front {
        kind,
        model: model.to_string(),
        stamps: Mutex::new(vec![(kind.name(Point::RecvStart), ns(received))]),
        trace: Mutex::new(None),
        carrier,
        request: Mutex::new(None),
    });
    let mut close = Close {
        front: front.clone(),
        answered: false,
    };
    let out = FRONT.scope(front.clone(), serve).await;
    close.answered = true;
    drop(close);
    let end = (kind.name(Point::SendEnd), ns(Instant::now()));
    if let Some(mut trace) = front.trace.locked().take() {
        trace.stamps.append(&mut front.stamps.locked());
        trace.stamps.push(end);
        trace.stamps.sort_by_key(|&(_, at)| at); // in the order they happened
        write_now(&trace);
    }
    out
}

/// Notes that the request being served reached `point` (nothing outside `serve`).
pub fn stamp(point: Point) {
    let _ = FRONT.try_with(|f| {
        f.stamps.locked().push((f.kind.name(point), ns(Instant::now())));
    });
}

/// Whether a frontend serves this request of `model` and has no request of its own yet (it then
/// ends the request's root span: [`own`]), and the client's trace context it brought.
pub(super) fn serving(model: &str) -> (Option<Carrier>, bool) {
    FRONT
        .try_with(|f| match f.request.locked().is_none() && f.model == model {
            true => (f.carrier.clone(), true),
            false => (None, false),
        })
        .unwrap_or((None, false))
}

/// The frontend's request is traced as `id` (OpenTelemetry mode).
pub(super) fn own(id: u64) {
    let _ = FRONT.try_with(|f| *f.request.locked() = Some(id));
}

/// Takes the dispatch's trace of the request a frontend is serving (the first trace of the model
/// it names, so an ensemble's steps in the same task are written as they finish). False when
/// no frontend waits for it.
pub(super) fn claim(trace: &Trace) -> bool {
    FRONT
        .try_with(|f| {
            let mut slot = f.trace.locked();
            let ours = slot.is_none() && trace.parent_id.is_none() && f.model == trace.model;
            if ours {
                *slot = Some(trace.clone());
            }
            ours
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(model: &str) -> Trace {
        Trace {
            id: 1,
            model: model.into(),
            version: 1,
            request_id: String::new(),
            parent_id: None,
            stamps: vec![("REQUEST_START", 1)],
        }
    }

    #[tokio::test]
    async fn a_frontend_claims_the_first_trace_of_its_model_only() {
        assert!(!claim(&trace("m")), "no frontend: written at once");
        ACTIVE.store(true, Ordering::Relaxed);
        let claimed = serve(Frontend::Http, Some("m"), Instant::now(), None, async {
            stamp(Point::RecvEnd);
            let step = claim(&trace("step"));
            let first = claim(&trace("m"));
            let second = claim(&trace("m"));
            stamp(Point::SendStart);
            (step, first, second)
        })
        .await;
        assert_eq!(claimed, (false, true, false));
        assert_eq!(Frontend::Grpc.name(Point::RecvStart), "GRPC_WAITREAD_START");
    }
}
