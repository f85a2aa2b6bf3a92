//! A sampled request's trace, written exactly once: with the timestamps its path gives it, or, dropped unfinished (its client went away), with what it reached, and after the instance ends a compute that had started.
//!
//! The instance running a traced request notes when its compute starts and ends ([`TraceHandle`]).
//! A request dropped while queued is written at once with its QUEUE_START and no compute. One
//! dropped while its compute runs keeps its COMPUTE_START and waits for the instance, which runs
//! its batch to the end anyway: its trace is written then, with the compute's real stamps, as
//! Triton reports a cancelled request's compute once its backend has executed it.
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mesh::sync::Locked;
use mesh::trace::front::{self, Held};
use mesh::trace::{ns, Trace};
use mesh::InferRequest;

use crate::actors::model::LoadedVersion;
use crate::backend::Timings;

/// A timestamp, by Triton's name.
type Stamp = (&'static str, Instant);

/// A traced request's trace: who it is, the stamps it reached, and its compute as its instance
/// notes it. Dropped unfinished (answered from the cache, refused after admission, or its client
/// went away), it is written with what it reached.
pub(crate) struct Traced {
    /// Taken when the trace is written (once).
    meta: Option<Meta>,
    start: Instant,
    /// When it was handed to its instance (or its ensemble began): it waits in the model's queue.
    queued: Option<Instant>,
    compute: Arc<Compute>,
}

/// Who a trace is, as its file entry or its spans name it.
struct Meta {
    id: u64,
    /// The trace of the request this one is made for (an ensemble's, a BLS caller's).
    parent: Option<u64>,
    model: String,
    version: i64,
    request_id: String,
}

impl Meta {
    fn trace(self, stamps: Vec<Stamp>) -> Trace {
        Trace {
            id: self.id,
            model: self.model,
            version: self.version,
            request_id: self.request_id,
            parent_id: self.parent,
            stamps: stamps.into_iter().map(|(name, at)| (name, ns(at))).collect(),
        }
    }
}

impl Traced {
    /// Whether this request is traced (Triton's sampling, [`mesh::trace::sample`]): decided once.
    pub(crate) fn sample(model: &LoadedVersion, request: &InferRequest, start: Instant) -> Option<Traced> {
        let id = mesh::trace::sample(&request.model_name)?;
        Some(Traced {
            meta: Some(Meta {
                id,
                parent: mesh::trace::parent(),
                model: request.model_name.clone(),
                version: model.version,
                request_id: request.id.clone(),
            }),
            start,
            queued: None,
            compute: Arc::default(),
        })
    }

    /// The trace id (what requests made on this one's behalf are traced under).
    pub fn id(&self) -> u64 {
        self.meta.as_ref().map_or(0, |m| m.id)
    }

    /// What the instance that runs the request is given: its trace id, and where it notes its compute.
    pub fn handle(&self) -> TraceHandle {
        TraceHandle {
            id: self.id(),
            compute: self.compute.clone(),
        }
    }

    /// The request waits in its model's queue from `at` on.
    pub fn queued(&mut self, at: Instant) {
        self.queued.get_or_insert(at);
    }

    /// Writes the trace with these timestamps.
    pub fn finish(mut self, stamps: Vec<(&'static str, u64)>) {
        if let Some(meta) = self.meta.take() {
            let mut trace = meta.trace(Vec::new());
            trace.stamps = stamps;
            mesh::trace::record(&trace);
        }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let Some(meta) = self.meta.take() else {
            return;
        };
        // Inside the frontend serving the request, if any: a trace written later is still its own.
        let waiting = Waiting {
            meta,
            front: front::hold(),
        };
        let now = Instant::now();
        let written = self.compute.0.locked().dropped(self.start, self.queued, now, waiting);
        if let Some((stamps, waiting)) = written {
            // Written here, in the frontend's task: `record` finds it.
            mesh::trace::record(&waiting.meta.trace(stamps));
        }
    }
}

/// A traced request as the instance running it sees it: its trace id (a Python model's
/// `request.trace()`), and where the instance notes when the request's compute ran.
#[derive(Clone)]
pub struct TraceHandle {
    id: u64,
    compute: Arc<Compute>,
}

impl TraceHandle {
    /// The request's trace id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its compute starts: the instance hands its batch to the backend at `at`.
    pub fn compute_started(&self, at: Instant) {
        self.compute.0.locked().start(at);
    }

    /// Its compute ended at `end`, with the execution's `timings`. A trace that waits for it (its
    /// request was dropped meanwhile) is written now.
    pub fn compute_ended(&self, timings: &Timings, end: Instant) {
        let waiting = self.compute.0.locked().end(timings, end);
        if let Some((stamps, waiting)) = waiting {
            waiting.write(stamps);
        }
    }
}

/// A traced request's compute as its instance notes it, shared by its trace and the instance.
#[derive(Default)]
pub struct Compute(Mutex<Progress<Waiting>>);

impl Drop for Compute {
    /// The instance let the request go without ending its compute (it cannot, but should it): a
    /// trace that waits is written with its compute ended now.
    fn drop(&mut self) {
        let progress = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some((stamps, waiting)) = progress.end(&Timings::default(), Instant::now()) {
            waiting.write(stamps);
        }
    }
}

/// A dropped request's trace that waits for its compute to end.
struct Waiting {
    meta: Meta,
    /// The frontend that served it.
    front: Option<Held>,
}

impl Waiting {
    fn write(self, stamps: Vec<Stamp>) {
        let trace = self.meta.trace(stamps);
        match self.front {
            Some(front) => front.record(&trace),
            None => mesh::trace::record(&trace),
        }
    }
}

/// When a request's compute started and ended, and what waits for its end (`W`, a dropped
/// request's trace). Sans-IO.
#[derive(Debug)]
struct Progress<W> {
    started: Option<Instant>,
    ended: Option<[Stamp; 3]>,
    waiting: Option<(Vec<Stamp>, W)>,
}

impl<W> Default for Progress<W> {
    fn default() -> Self {
        Progress {
            started: None,
            ended: None,
            waiting: None,
        }
    }
}

impl<W> Progress<W> {
    /// The compute starts at `at` (the first call counts).
    fn start(&mut self, at: Instant) {
        self.started.get_or_insert(at);
    }

    /// The compute ended at `end`: what waited for it, with its stamps completed (the compute's,
    /// then REQUEST_END as the instance lets the request go).
    fn end(&mut self, timings: &Timings, end: Instant) -> Option<(Vec<Stamp>, W)> {
        let ended = compute_stamps(self.started.unwrap_or(end), timings, end);
        self.ended = Some(ended);
        let (mut stamps, waiting) = self.waiting.take()?;
        stamps.extend(ended);
        stamps.push(("REQUEST_END", end));
        Some((stamps, waiting))
    }

    /// The request (admitted at `start`, queued at `queued`) is dropped unfinished at `now`: the
    /// stamps to write now, or None when its compute runs (`waiting` then waits for its end).
    /// A request dropped once queued was cancelled: no answer completes.
    fn dropped(
        &mut self,
        start: Instant,
        queued: Option<Instant>,
        now: Instant,
        waiting: W,
    ) -> Option<(Vec<Stamp>, W)> {
        let mut stamps = vec![("REQUEST_START", start)];
        stamps.extend(queued.map(|at| ("QUEUE_START", at)));
        match (self.started, self.ended) {
            (Some(started), None) => {
                stamps.push(("COMPUTE_START", started));
                self.waiting = Some((stamps, waiting));
                return None;
            }
            (Some(started), Some(ended)) => {
                stamps.push(("COMPUTE_START", started));
                stamps.extend(ended);
                stamps.push(("REQUEST_END", now.max(ended[2].1)));
            }
            (None, _) => {
                stamps.push(("REQUEST_END", now));
                if queued.is_none() {
                    stamps.push(("INFER_RESPONSE_COMPLETE", now));
                }
            }
        }
        Some((stamps, waiting))
    }
}

/// The stamps of a compute that started at `start` and ended at `end`: its input ends `input`
/// after its start, its output starts `output` before its end (Triton's COMPUTE_INPUT_END,
/// COMPUTE_OUTPUT_START, COMPUTE_END).
fn compute_stamps(start: Instant, timings: &Timings, end: Instant) -> [Stamp; 3] {
    let start = start.min(end);
    let input_end = start.checked_add(timings.input).map_or(end, |at| at.min(end));
    let output_start = end.checked_sub(timings.output).map_or(end, |at| at.max(input_end));
    [
        ("COMPUTE_INPUT_END", input_end),
        ("COMPUTE_OUTPUT_START", output_start),
        ("COMPUTE_END", end),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn names(stamps: &[Stamp]) -> Vec<&'static str> {
        stamps.iter().map(|s| s.0).collect()
    }

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn a_request_dropped_before_it_was_queued_is_written_with_its_start_and_end() {
        let t = Instant::now();
        let (stamps, ()) = Progress::default().dropped(t, None, at(t, 5), ()).unwrap();
        assert_eq!(
            names(&stamps),
            ["REQUEST_START", "REQUEST_END", "INFER_RESPONSE_COMPLETE"]
        );
    }

    #[test]
    fn a_request_cancelled_in_the_queue_has_its_queue_start_and_no_compute() {
        let t = Instant::now();
        let (stamps, ()) = Progress::default().dropped(t, Some(at(t, 1)), at(t, 5), ()).unwrap();
        assert_eq!(names(&stamps), ["REQUEST_START", "QUEUE_START", "REQUEST_END"]);
        assert_eq!(stamps[1].1, at(t, 1));
    }

    #[test]
    fn a_request_cancelled_while_it_runs_waits_for_its_computes_real_end() {
        let t = Instant::now();
        let mut p = Progress::default();
        p.start(at(t, 2));
        assert!(p.dropped(t, Some(at(t, 1)), at(t, 5), "trace").is_none(), "it waits");
        let timings = Timings {
            input: Duration::from_millis(1),
            output: Duration::from_millis(2),
            ..Timings::default()
        };
        let (stamps, w) = p.end(&timings, at(t, 100)).expect("written at the end");
        assert_eq!(w, "trace");
        assert_eq!(
            names(&stamps),
            [
                "REQUEST_START",
                "QUEUE_START",
                "COMPUTE_START",
                "COMPUTE_INPUT_END",
                "COMPUTE_OUTPUT_START",
                "COMPUTE_END",
                "REQUEST_END"
            ]
        );
        let times: Vec<Instant> = stamps.iter().map(|s| s.1).collect();
        assert_eq!(times[2..], [at(t, 2), at(t, 3), at(t, 98), at(t, 100), at(t, 100)]);
        assert!(p.end(&timings, at(t, 101)).is_none(), "written once");
    }

    #[test]
    fn a_request_dropped_after_its_compute_ended_is_written_at_once_with_it() {
        let t = Instant::now();
        let mut p = Progress::default();
        p.start(at(t, 2));
        assert!(p.end(&Timings::default(), at(t, 10)).is_none(), "nothing waits");
        let (stamps, ()) = p.dropped(t, Some(at(t, 1)), at(t, 12), ()).unwrap();
        assert_eq!(
            names(&stamps)[2..],
            [
                "COMPUTE_START",
                "COMPUTE_INPUT_END",
                "COMPUTE_OUTPUT_START",
                "COMPUTE_END",
                "REQUEST_END"
            ]
        );
        assert_eq!(stamps.last().unwrap().1, at(t, 12));
    }

    #[test]
    fn compute_stamps_stay_inside_the_compute() {
        let t = Instant::now();
        let long = Timings {
            input: Duration::from_secs(5),
            output: Duration::from_secs(5),
            ..Timings::default()
        };
        let [(_, input_end), (_, output_start), (_, end)] = compute_stamps(t, &long, at(t, 10));
        assert_eq!((input_end, output_start, end), (at(t, 10), at(t, 10), at(t, 10)));
        let [(_, input_end), (_, output_start), _] = compute_stamps(t, &Timings::default(), at(t, 10));
        assert_eq!((input_end, output_start), (t, at(t, 10)));
    }

    /// The trace and the instance share the compute: whichever comes second writes the trace.
    #[test]
    fn the_shared_compute_writes_a_waiting_trace_once_its_instance_ends_it() {
        let compute = Arc::new(Compute::default());
        let handle = TraceHandle {
            id: 1,
            compute: compute.clone(),
        };
        let t = Instant::now();
        handle.compute_started(t);
        assert_eq!(compute.0.locked().started, Some(t));
        handle.compute_ended(&Timings::default(), at(t, 3));
        assert!(compute.0.locked().ended.is_some() && compute.0.locked().waiting.is_none());
    }
}
