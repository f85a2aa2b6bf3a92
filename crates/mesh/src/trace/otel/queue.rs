//! The batch span processor's queue and timer, as opentelemetry-cpp 1.13's (tritonserver 2.51's):
//! a queue of `bsp_max_queue_size` ended spans (one more is dropped, with the warning
//! [`DROPPED`] for each), exported every `bsp_schedule_delay` ms, or at once when the queue is
//! half full or holds `bsp_max_export_batch_size` spans; an export drains the queue in batches of
//! at most `bsp_max_export_batch_size` spans, one OTLP request each. Sans-IO: the worker asks
//! [`Queue::next`] what to do at a time it gives.
//!
//! One addition keeps a request's spans in one OTLP request, as a collector's reader expects
//! them (Triton's processor does so only by the chance of its timer): when the timer comes while
//! the queue holds spans of a request still running, the export waits for that request's last
//! span (its root), at most one more delay. A full queue or a full batch exports at once.
use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::SpanData;

use super::config::Bsp;

/// The warning for each span a full queue drops (opentelemetry-cpp's words, which Triton's tests look for).
pub const DROPPED: &str = "BatchSpanProcessor queue is full - dropping span.";

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; `wake`: the worker should look now.
    Queued { wake: bool },
    /// The queue was full.
    Dropped,
}

/// What the worker does next.
#[derive(Debug)]
pub enum Next {
    /// Export these spans (one OTLP request), then ask again.
    Export(Vec<SpanData>),
    /// Wait until this time (None: until woken), or until woken.
    Wait(Option<Instant>),
}

/// Ended spans waiting for export, and the timer.
pub struct Queue {
    bsp: Bsp,
    spans: VecDeque<(u64, SpanData)>,
    /// Requests with spans ended whose root has not.
    open: HashSet<u64>,
    /// When the timer comes next.
    due: Instant,
    /// A threshold was reached: export now.
    woken: bool,
    /// An export cycle is under way: the spans it still sends (those queued when it began, as
    /// opentelemetry-cpp's worker; spans pushed since wait for the next cycle, so that a busy
    /// server sends full batches rather than a stream of small ones).
    draining: usize,
    /// The timer came while a request ran: waiting for it until this time.
    deferred: Option<Instant>,
    /// Export everything now (shutdown).
    flushing: bool,
}

impl Queue {
    pub fn new(bsp: Bsp, now: Instant) -> Self {
        Queue {
            bsp,
            spans: VecDeque::new(),
            open: HashSet::new(),
            due: now + Self::delay_of(bsp),
            woken: false,
            draining: 0,
            deferred: None,
            flushing: false,
        }
    }

    fn delay_of(bsp: Bsp) -> Duration {
        Duration::from_millis(bsp.schedule_delay_ms.into())
    }

    fn delay(&self) -> Duration {
        Self::delay_of(self.bsp)
    }

    /// Queues an ended span of `request` (`last`: its root, the request's last span).
    pub fn push(&mut self, request: u64, span: SpanData, last: bool) -> Pushed {
        let closes = last && self.open.remove(&request);
        if !last {
            self.open.insert(request);
        }
        if self.spans.len() >= self.bsp.max_queue_size as usize {
            return Pushed::Dropped;
        }
        self.spans.push_back((request, span));
        // Spans the running cycle will send count for none of the thresholds: only those waiting
        // for the next cycle do (else each cycle would start the next with a handful).
        let len = self.spans.len() - self.draining.min(self.spans.len());
        let threshold = len >= (self.bsp.max_queue_size / 2) as usize || len >= self.bsp.max_export_batch_size as usize;
        self.woken |= threshold;
        Pushed::Queued {
            wake: threshold || self.bsp.schedule_delay_ms == 0 || (closes && self.deferred.is_some()),
        }
    }

    /// Exports everything queued, now and as it comes (at shutdown).
    pub fn flush(&mut self) {
        self.flushing = true;
    }

    /// Whether nothing waits for export.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn batch(&mut self) -> Next {
        let mut n = self.spans.len().min(self.bsp.max_export_batch_size.max(1) as usize);
        if !self.flushing {
            n = n.min(self.draining);
        }
        self.draining = self.draining.saturating_sub(n);
        Next::Export(self.spans.drain(..n).map(|(_, s)| s).collect())
    }

    /// What the worker does at `now`.
    pub fn next(&mut self, now: Instant) -> Next {
        if self.flushing && !self.spans.is_empty() {
            return self.batch();
        }
        if self.draining > 0 {
            if !self.spans.is_empty() {
                return self.batch();
            }
            self.draining = 0;
        }
        let timer = now >= self.due;
        if !(self.woken || timer) || self.spans.is_empty() {
            if self.spans.is_empty() {
                self.woken = false;
                self.deferred = None;
            }
            if self.delay().is_zero() {
                return Next::Wait(None);
            }
            while self.due <= now {
                self.due += self.delay();
            }
            return Next::Wait(Some(self.due));
        }
        if !self.woken {
            // The timer: wait for the requests whose spans are queued, at most one more delay.
            let waiting = self.spans.iter().any(|(r, _)| self.open.contains(r));
            let until = *self.deferred.get_or_insert(self.due + self.delay());
            if waiting && now < until {
                return Next::Wait(Some(until));
            }
        }
        // An export cycle: it sends what is queued now; the timer counts again from its start.
        self.woken = false;
        self.deferred = None;
        self.draining = self.spans.len();
        self.due = now + self.delay();
        self.batch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::otel::spans::{Clock, Registry};
    use crate::trace::Trace;

    const S: Duration = Duration::from_secs(1);

    fn bsp(queue: u32, delay_ms: u32, batch: u32) -> Bsp {
        Bsp {
            max_queue_size: queue,
            schedule_delay_ms: delay_ms,
            max_export_batch_size: batch,
        }
    }

    /// The spans of one traced request of `model` (compute, model, root), as the registry ends them.
    fn request(id: u64) -> Vec<(u64, SpanData, bool)> {
        let mut reg = Registry::default();
        let now = Clock {
            unix_ns: 1_000_000,
            steady_ns: 10,
        };
        reg.root(id, None, true, now);
        let trace = Trace {
            id,
            model: "m".into(),
            version: 1,
            request_id: String::new(),
            parent_id: None,
            stamps: vec![
                ("REQUEST_START", 20),
                ("COMPUTE_START", 30),
                ("COMPUTE_END", 40),
                ("REQUEST_END", 50),
            ],
        };
        let mut spans = reg.finish(&trace);
        spans.extend(reg.front_done(id, &[], 60, true));
        spans.into_iter().map(|e| (e.request, e.span, e.last)).collect()
    }

    fn exported(next: Next) -> usize {
        match next {
            Next::Export(spans) => spans.len(),
            Next::Wait(w) => panic!("waits ({w:?}) instead of exporting"),
        }
    }

    #[test]
    fn the_timer_exports_everything_queued_in_one_request() {
        let t0 = Instant::now();
        let mut q = Queue::new(Bsp::default(), t0);
        assert!(matches!(q.next(t0), Next::Wait(Some(at)) if at == t0 + 5 * S));
        for (r, span, last) in request(1) {
            assert_eq!(q.push(r, span, last), Pushed::Queued { wake: false });
        }
        assert!(matches!(q.next(t0 + S), Next::Wait(Some(at)) if at == t0 + 5 * S));
        assert_eq!(exported(q.next(t0 + 5 * S)), 3);
        assert!(matches!(q.next(t0 + 5 * S), Next::Wait(Some(at)) if at == t0 + 10 * S));
        assert!(
            matches!(q.next(t0 + 11 * S), Next::Wait(Some(at)) if at == t0 + 15 * S),
            "an empty tick"
        );
    }

    #[test]
    fn the_timer_waits_for_a_running_request_at_most_one_more_delay() {
        let t0 = Instant::now();
        let mut q = Queue::new(Bsp::default(), t0);
        let mut spans = request(1).into_iter();
        for (r, span, last) in spans.by_ref().take(2) {
            q.push(r, span, last);
        }
        assert!(
            matches!(q.next(t0 + 5 * S), Next::Wait(Some(at)) if at == t0 + 10 * S),
            "its root is not in"
        );
        let (r, span, last) = spans.next().unwrap();
        assert_eq!(
            q.push(r, span, last),
            Pushed::Queued { wake: true },
            "the root wakes the worker"
        );
        assert_eq!(exported(q.next(t0 + 6 * S)), 3);
        // A request that never ends holds the export back one delay only.
        let mut q = Queue::new(Bsp::default(), t0);
        let (r, span, _) = request(2).remove(0);
        q.push(r, span, false);
        assert!(matches!(q.next(t0 + 5 * S), Next::Wait(Some(_))));
        assert_eq!(exported(q.next(t0 + 10 * S)), 1);
    }

    #[test]
    fn a_full_batch_exports_at_once_one_span_per_request() {
        let t0 = Instant::now();
        let mut q = Queue::new(bsp(2048, 5000, 1), t0);
        for (r, span, last) in request(1) {
            assert_eq!(q.push(r, span, last), Pushed::Queued { wake: true });
        }
        let batches: Vec<usize> = (0..3).map(|_| exported(q.next(t0))).collect();
        assert_eq!(batches, [1, 1, 1]);
        assert!(matches!(q.next(t0), Next::Wait(Some(_))));
    }

    #[test]
    fn spans_pushed_during_an_export_wait_for_the_next_cycle() {
        let t0 = Instant::now();
        let mut q = Queue::new(bsp(2048, 5000, 3), t0);
        for (r, span, last) in request(1) {
            q.push(r, span, last);
        }
        assert_eq!(exported(q.next(t0)), 3, "a full batch goes at once");
        // A request's spans pushed while that batch was out: under the threshold, they wait.
        for (r, span, last) in request(2).into_iter().take(2) {
            assert_eq!(q.push(r, span, last), Pushed::Queued { wake: false });
        }
        assert!(
            matches!(q.next(t0), Next::Wait(Some(at)) if at == t0 + 5 * S),
            "not a batch of two now"
        );
        // Six queued: the cycle sends the six, in batches of three, and nothing pushed after it began.
        for (r, span, last) in request(3).into_iter().chain(request(4).into_iter().take(1)) {
            q.push(r, span, last);
        }
        assert_eq!(exported(q.next(t0)), 3);
        for (r, span, last) in request(4).into_iter().skip(1) {
            assert_eq!(
                q.push(r, span, last),
                Pushed::Queued { wake: false },
                "the cycle's own spans count for no threshold"
            );
        }
        assert_eq!(exported(q.next(t0)), 3, "the rest of the cycle's six");
        assert_eq!(q.spans.len(), 2, "the two pushed during the cycle wait");
        assert!(
            matches!(q.next(t0), Next::Wait(Some(at)) if at == t0 + 5 * S),
            "for the timer or a threshold, not a batch of two now"
        );
        assert_eq!(exported(q.next(t0 + 5 * S)), 2, "the timer sends them");
    }

    #[test]
    fn a_full_queue_drops_spans() {
        let t0 = Instant::now();
        let mut q = Queue::new(bsp(1, 5000, 512), t0);
        let pushed: Vec<Pushed> = request(1).into_iter().map(|(r, s, l)| q.push(r, s, l)).collect();
        assert_eq!(
            pushed,
            [Pushed::Queued { wake: true }, Pushed::Dropped, Pushed::Dropped]
        );
        assert_eq!(exported(q.next(t0)), 1);
    }

    #[test]
    fn no_delay_exports_each_span_as_it_comes_and_otherwise_sleeps() {
        let t0 = Instant::now();
        let mut q = Queue::new(bsp(2048, 0, 512), t0);
        assert!(matches!(q.next(t0), Next::Wait(None)));
        let mut batches = Vec::new();
        for (r, span, last) in request(1) {
            assert_eq!(q.push(r, span, last), Pushed::Queued { wake: true });
            batches.push(exported(q.next(t0)));
            assert!(matches!(q.next(t0), Next::Wait(None)));
        }
        assert_eq!(batches, [1, 1, 1]);
    }

    #[test]
    fn a_flush_exports_what_is_queued_now() {
        let t0 = Instant::now();
        let mut q = Queue::new(bsp(2048, 5000, 2), t0);
        for (r, span, last) in request(1).into_iter().take(1) {
            q.push(r, span, last);
        }
        assert!(matches!(q.next(t0), Next::Wait(_)));
        q.flush();
        assert_eq!(exported(q.next(t0)), 1);
        assert!(q.is_empty());
    }
}
