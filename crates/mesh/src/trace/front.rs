//! The frontends' timestamps of a traced request (Triton's `HTTP_RECV_START` … `HTTP_SEND_END` and
//! `GRPC_WAITREAD_START` … `GRPC_SEND_END`): a frontend serves an infer request inside `serve`, the
//! dispatch's trace of that request is handed back to it instead of being written, and the
//! frontend writes it with its own stamps once the answer is out of its hands. In OpenTelemetry
//! mode the frontend also brings the client's trace context (`traceparent`), and its stamps become
//! the events of the request's root span, which ends when the frontend is done (or dropped: the
//! client went away). A frontend dropped unfinished writes the trace it holds with the stamps it
//! has; a trace that finishes after its frontend ended (a cancelled request whose model still ran,
//! [`Held`]; a stream's model, [`carry`]) is written with the frontend's stamps at once.
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::Either;

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
    state: Mutex<State>,
    /// The client's trace context (OpenTelemetry mode).
    carrier: Option<Carrier>,
    /// The request's trace, in OpenTelemetry mode: the frontend ends its root span.
    request: Mutex<Option<u64>>,
}

/// What a frontend has gathered for its request: its stamps, and (trace file mode) its trace.
#[derive(Default)]
struct State {
    stamps: Vec<(&'static str, u64)>,
    /// The dispatch's trace, handed over while `serve` runs; written when it ends.
    trace: Option<Trace>,
    /// A trace was claimed: only the first one of the request's model is the frontend's.
    claimed: bool,
    /// `serve` ended (answered, or dropped: its client went away). A trace that finishes later (a
    /// cancelled request whose model still ran, a stream's model) is written at once, with the
    /// frontend's stamps.
    done: bool,
}

/// What a frontend does with a finished trace ([`State::claim`]).
#[derive(Debug)]
enum Claim {
    /// Not its own: written as any other.
    No,
    /// Held until `serve` ends.
    Held,
    /// Its own, finished after `serve` ended: written now, with the frontend's stamps.
    Write(Trace),
}

impl State {
    /// Takes `trace` if it is the frontend's own: the first trace of the model it names, not a
    /// child. Sans-IO.
    fn claim(&mut self, model: &str, trace: &Trace) -> Claim {
        if trace.parent_id.is_some() || model != trace.model || std::mem::replace(&mut self.claimed, true) {
            return Claim::No;
        }
        if !self.done {
            self.trace = Some(trace.clone());
            return Claim::Held;
        }
        let mut trace = trace.clone();
        trace.stamps.extend_from_slice(&self.stamps);
        Claim::Write(in_order(trace))
    }

    /// `serve` ended at `now` (`answered`, or dropped): the frontend's stamps (with SEND_END when
    /// it answered), and its trace, with them, to write. Sans-IO.
    fn close(&mut self, kind: Frontend, answered: bool, now: u64) -> (Vec<(&'static str, u64)>, Option<Trace>) {
        if answered {
            self.stamps.push((kind.name(Point::SendEnd), now));
        }
        self.done = true;
        let trace = self.trace.take().map(|mut trace| {
            trace.stamps.extend_from_slice(&self.stamps);
            in_order(trace)
        });
        (self.stamps.clone(), trace)
    }
}

/// A trace with its timestamps in the order they happened.
fn in_order(mut trace: Trace) -> Trace {
    trace.stamps.sort_by_key(|&(_, at)| at);
    trace
}

/// Ends what a frontend served, when `serve` is done or dropped unfinished (`answered` false: the
/// client went away): the request's root span (OpenTelemetry mode), and its trace with the stamps
/// the frontend has (trace file mode; a dropped one has no SEND stamps).
struct Close {
    front: Arc<Front>,
    answered: bool,
}

impl Drop for Close {
    fn drop(&mut self) {
        let (stamps, trace) = self
            .front
            .state
            .locked()
            .close(self.front.kind, self.answered, ns(Instant::now()));
        if let Some(id) = self.front.request.locked().take() {
            otel::front_done(id, &stamps, self.answered);
        }
        if let Some(trace) = trace {
            write_now(&trace);
        }
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
/// headers (read only while something traces). Dropped unfinished (the client went away), it
/// writes the trace it holds with the stamps it has.
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
        state: Mutex::new(State {
            stamps: vec![(kind.name(Point::RecvStart), ns(received))],
            ..State::default()
        }),
        carrier,
        request: Mutex::new(None),
    });
    let mut close = Close {
        front: front.clone(),
        answered: false,
    };
    let out = FRONT.scope(front, serve).await;
    close.answered = true;
    out
}

/// Notes that the request being served reached `point` (nothing outside `serve`).
pub fn stamp(point: Point) {
    let _ = FRONT.try_with(|f| {
        f.state.locked().stamps.push((f.kind.name(point), ns(Instant::now())));
    });
}

/// Runs `work` as part of the request the current task's frontend serves (a task it spawns for
/// it: a stream's model), so its trace is that frontend's.
pub fn carry<F: Future>(work: F) -> impl Future<Output = F::Output> {
    match FRONT.try_with(Arc::clone) {
        Ok(front) => Either::Left(FRONT.scope(front, work)),
        Err(_) => Either::Right(work),
    }
}

/// The frontend serving the current request, held for a trace that finishes elsewhere (on an
/// instance's thread, after the request was dropped): see [`Held::record`].
pub struct Held(Arc<Front>);

/// The frontend serving the current request, if any.
pub fn hold() -> Option<Held> {
    FRONT.try_with(|f| Held(f.clone())).ok()
}

impl Held {
    /// Records a finished trace (`mesh::trace::record`) as if inside the frontend's `serve`: its
    /// own trace gets its stamps (written at once if it is done, as a dropped one is).
    pub fn record(self, trace: &Trace) {
        FRONT.sync_scope(self.0, || super::record(trace));
    }
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

/// The frontend's request is traced as `id` (OpenTelemetry mode): the frontend will end its root.
/// False when the frontend has ended already (a stream's model sampled after its client went
/// away): the caller ends the root itself. The check and the store are one step under the
/// request's lock, which `Close` takes after marking the frontend done, so no root is left open.
pub(super) fn own(id: u64) -> bool {
    FRONT
        .try_with(|f| {
            let mut request = f.request.locked();
            if f.state.locked().done {
                return false;
            }
            *request = Some(id);
            true
        })
        .unwrap_or(false)
}

/// Takes the dispatch's trace of the request a frontend is serving (the first trace of the model
/// it names, so an ensemble's steps in the same task are written as they finish). False when
/// no frontend waits for it.
pub(super) fn claim(trace: &Trace) -> bool {
    let claim = FRONT.try_with(|f| f.state.locked().claim(&f.model, trace));
    match claim {
        Ok(Claim::Held) => true,
        Ok(Claim::Write(trace)) => {
            write_now(&trace);
            true
        }
        Ok(Claim::No) | Err(_) => false,
    }
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
            stamps: vec![("REQUEST_START", 3)],
        }
    }

    fn names(trace: &Trace) -> Vec<&'static str> {
        trace.stamps.iter().map(|s| s.0).collect()
    }

    fn received() -> State {
        State {
            stamps: vec![("HTTP_RECV_START", 1), ("HTTP_RECV_END", 2)],
            ..State::default()
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

    #[tokio::test]
    async fn a_request_sampled_after_its_frontend_ended_is_not_left_to_it() {
        ACTIVE.store(true, Ordering::Relaxed);
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (owned_inside, late) = serve(Frontend::Http, Some("m"), Instant::now(), None, async move {
            // A stream's model runs in a task of its own that outlives the frontend.
            let late = tokio::spawn(carry(async move {
                let _ = wait.await;
                own(8)
            }));
            (own(7), late)
        })
        .await;
        assert!(owned_inside, "while it serves, the frontend ends the root");
        go.send(()).unwrap();
        assert!(!late.await.unwrap(), "ended: the sampler must end the root itself");
        assert!(!own(9), "no frontend");
    }

    #[test]
    fn an_answered_frontend_writes_its_trace_with_every_stamp_in_order() {
        let mut state = received();
        assert!(matches!(state.claim("m", &trace("m")), Claim::Held));
        state.stamps.push(("HTTP_SEND_START", 4));
        let (stamps, written) = state.close(Frontend::Http, true, 5);
        assert_eq!(stamps.last(), Some(&("HTTP_SEND_END", 5)));
        let written = written.expect("its trace");
        assert_eq!(
            names(&written),
            [
                "HTTP_RECV_START",
                "HTTP_RECV_END",
                "REQUEST_START",
                "HTTP_SEND_START",
                "HTTP_SEND_END"
            ]
        );
    }

    #[test]
    fn a_dropped_frontend_writes_the_trace_it_holds_without_send_stamps() {
        let mut state = received();
        assert!(matches!(state.claim("m", &trace("m")), Claim::Held));
        let (stamps, written) = state.close(Frontend::Http, false, 9);
        assert_eq!(stamps.len(), 2, "no SEND_END: nothing was sent");
        assert_eq!(
            names(&written.expect("written although the client went away")),
            ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START"]
        );
        assert!(state.close(Frontend::Http, false, 10).1.is_none(), "written once");
    }

    #[test]
    fn a_trace_finished_after_its_frontend_ended_is_written_with_its_stamps() {
        let mut state = received();
        assert!(state.close(Frontend::Grpc, false, 4).1.is_none(), "nothing held yet");
        let mut child = trace("m");
        child.parent_id = Some(7);
        assert!(
            matches!(state.claim("m", &child), Claim::No),
            "a child is not the frontend's"
        );
        assert!(
            matches!(state.claim("m", &trace("other")), Claim::No),
            "another model's"
        );
        let mut late = trace("m");
        late.stamps = vec![("REQUEST_START", 3), ("COMPUTE_END", 20)];
        match state.claim("m", &late) {
            Claim::Write(t) => assert_eq!(
                names(&t),
                ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "COMPUTE_END"]
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(state.claim("m", &trace("m")), Claim::No), "only the first");
    }

    /// A request's future dropped inside `serve` (the client went away) is dropped while the
    /// frontend is still its task's: a trace its drop records is the frontend's.
    #[tokio::test]
    async fn a_trace_recorded_as_the_request_is_dropped_is_the_frontends() {
        use std::sync::atomic::AtomicBool;
        struct RecordsOnDrop(Arc<AtomicBool>);
        impl Drop for RecordsOnDrop {
            fn drop(&mut self) {
                self.0.store(claim(&trace("dropped")), Ordering::Relaxed);
            }
        }
        ACTIVE.store(true, Ordering::Relaxed);
        let claimed = Arc::new(AtomicBool::new(false));
        let guard = RecordsOnDrop(claimed.clone());
        let request = serve(Frontend::Grpc, Some("dropped"), Instant::now(), None, async move {
            let _guard = guard;
            std::future::pending::<()>().await
        });
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(5), request).await;
        assert!(timed_out.is_err());
        assert!(claimed.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_spawned_task_and_a_held_frontend_serve_the_same_request() {
        ACTIVE.store(true, Ordering::Relaxed);
        let spawned = serve(Frontend::Http, Some("carried"), Instant::now(), None, async {
            tokio::spawn(carry(async { claim(&trace("carried")) })).await.unwrap()
        })
        .await;
        assert!(spawned, "the spawned task's trace is the frontend's");
        let held = serve(Frontend::Http, Some("held"), Instant::now(), None, async { hold() }).await;
        let held = held.expect("inside serve");
        let front = held.0.clone();
        assert!(front.state.locked().done && !front.state.locked().claimed);
        assert!(hold().is_none() && !claim(&trace("held")), "outside serve");
        // Recorded on another thread after the frontend ended: written with its stamps.
        std::thread::spawn(move || held.record(&trace("held"))).join().unwrap();
        assert!(front.state.locked().claimed);
    }
}
