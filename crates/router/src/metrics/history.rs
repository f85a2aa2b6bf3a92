//! Each model's recent traffic through the router, for the console's charts: one sample per interval
//! (requests/s, failures, p50 and p99 latency) in a fixed-size ring per model. Sans-IO: every call
//! takes the time, so the tests drive it with a fake clock.
//!
//! Bounded: at most `max_models` series of `samples` samples each, plus one latency histogram per
//! series for the interval being filled (`BUCKETS` counters). With the defaults (256 models × 120
//! samples of 16 bytes, and 672 bytes of histogram) that is under 1 MiB. A model with no request in
//! the whole window is dropped, and a model beyond the bound is not recorded until one is dropped.
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::histogram::Histogram;

/// How the history samples and how much of it it keeps.
#[derive(Debug, Clone, Copy)]
pub struct HistorySettings {
    /// One sample per interval.
    pub interval: Duration,
    /// Samples kept per model: the window is `interval × samples`.
    pub samples: usize,
    /// Models kept at once.
    pub max_models: usize,
}

impl Default for HistorySettings {
    /// One sample every 5 s for the last 10 minutes, for up to 256 models.
    fn default() -> Self {
        HistorySettings {
            interval: Duration::from_secs(5),
            samples: 120,
            max_models: 256,
        }
    }
}

/// One closed interval of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Requests that succeeded.
    pub ok: u32,
    /// Requests that failed.
    pub failed: u32,
    /// Latency quantiles of all the interval's requests, in microseconds (0: no request).
    pub p50_us: u32,
    pub p99_us: u32,
}

impl Sample {
    pub fn requests(&self) -> u64 {
        u64::from(self.ok) + u64::from(self.failed)
    }
}

/// One model's samples, and the interval being filled.
struct Series {
    /// Closed samples, oldest first; the last one is interval `current - 1`.
    ring: VecDeque<Sample>,
    /// The index of the interval being filled.
    current: u64,
    histogram: Histogram,
    ok: u32,
    failed: u32,
}

impl Series {
    fn new(index: u64, samples: usize) -> Self {
        Series {
            ring: VecDeque::with_capacity(samples),
            current: index,
            histogram: Histogram::new(),
            ok: 0,
            failed: 0,
        }
    }

    /// Closes the intervals before `index`: the one being filled, then empty ones.
    fn roll(&mut self, index: u64, samples: usize) {
        if index <= self.current {
            return;
        }
        let closed = Sample {
            ok: self.ok,
            failed: self.failed,
            p50_us: self.histogram.quantile(0.5),
            p99_us: self.histogram.quantile(0.99),
        };
        self.push(closed, samples);
        let empty = (index - self.current - 1).min(samples as u64);
        for _ in 0..empty {
            self.push(Sample::default(), samples);
        }
        self.current = index;
        self.histogram.clear();
        (self.ok, self.failed) = (0, 0);
    }

    fn push(&mut self, sample: Sample, samples: usize) {
        if self.ring.len() == samples {
            self.ring.pop_front();
        }
        self.ring.push_back(sample);
    }

    fn idle(&self) -> bool {
        self.ok == 0 && self.failed == 0 && self.ring.iter().all(|s| s.requests() == 0)
    }
}

/// One model's samples as the console reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelHistory {
    pub name: String,
    /// The last `samples` closed intervals, oldest first, the last one just closed.
    pub samples: Vec<Sample>,
}

/// Every model's recent traffic.
pub struct History {
    settings: HistorySettings,
    /// Interval 0 starts here.
    epoch: Instant,
    series: HashMap<String, Series>,
}

impl History {
    pub fn new(settings: HistorySettings, now: Instant) -> Self {
        let settings = HistorySettings {
            interval: settings.interval.max(Duration::from_millis(1)),
            samples: settings.samples.max(1),
            max_models: settings.max_models,
        };
        History {
            settings,
            epoch: now,
            series: HashMap::new(),
        }
    }

    pub fn settings(&self) -> HistorySettings {
        self.settings
    }

    fn index(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.epoch);
        (since.as_nanos() / self.settings.interval.as_nanos()) as u64
    }

    /// One finished request of `model`, answered after `took`.
    pub fn record(&mut self, model: &str, took: Duration, ok: bool, now: Instant) {
        let (index, samples) = (self.index(now), self.settings.samples);
        if !self.series.contains_key(model) {
            if self.series.len() >= self.settings.max_models {
                self.drop_idle(index);
            }
            if self.series.len() >= self.settings.max_models {
                return;
            }
            self.series.insert(model.to_string(), Series::new(index, samples));
        }
        let Some(s) = self.series.get_mut(model) else { return };
        s.roll(index, samples);
        s.histogram.add(took);
        if ok {
            s.ok = s.ok.saturating_add(1);
        } else {
            s.failed = s.failed.saturating_add(1);
        }
    }

    fn drop_idle(&mut self, index: u64) {
        let samples = self.settings.samples;
        self.series.retain(|_, s| {
            s.roll(index, samples);
            !s.idle()
        });
    }

    /// Every model with a request in the window, by name, with its closed samples: `samples` of
    /// them, the older ones empty where the model had no history yet.
    pub fn snapshot(&mut self, now: Instant) -> Vec<ModelHistory> {
        let index = self.index(now);
        self.drop_idle(index);
        let n = self.settings.samples;
        let mut out: Vec<ModelHistory> = self
            .series
            .iter()
            .map(|(name, s)| {
                let mut samples = vec![Sample::default(); n - s.ring.len()];
                samples.extend(s.ring.iter().copied());
                ModelHistory {
                    name: name.clone(),
                    samples,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn settings(samples: usize, max_models: usize) -> HistorySettings {
        HistorySettings {
            interval: Duration::from_secs(5),
            samples,
            max_models,
        }
    }

    #[test]
    fn an_interval_closes_into_a_sample_with_its_rate_and_quantiles() {
        let t0 = Instant::now();
        let mut h = History::new(settings(4, 8), t0);
        // 98 fast requests, 2 slow ones, one failure, all in interval 0.
        for i in 0..100 {
            let took = if i < 98 { 10 * MS } else { 500 * MS };
            h.record("m", took, i != 0, t0 + MS * i);
        }
        // Interval 0 is still open: nothing closed yet.
        let open = h.snapshot(t0 + Duration::from_secs(4));
        assert_eq!(open[0].samples, vec![Sample::default(); 4]);
        let s = h.snapshot(t0 + Duration::from_secs(5));
        assert_eq!(s.len(), 1);
        let last = s[0].samples[3];
        assert_eq!((last.ok, last.failed), (99, 1));
        assert!((9_000..=11_000).contains(&last.p50_us), "{last:?}");
        // The 99th of 100 is one of the slow ones.
        assert!((450_000..=550_000).contains(&last.p99_us), "{last:?}");
        assert_eq!(s[0].samples[..3], [Sample::default(); 3]);
    }

    #[test]
    fn quiet_intervals_are_empty_samples_and_the_ring_keeps_the_last_ones() {
        let t0 = Instant::now();
        let mut h = History::new(settings(3, 8), t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        h.record("m", MS, true, at(0)); // interval 0
        h.record("m", MS, true, at(6)); // interval 1
        h.record("m", MS, true, at(7));
        h.record("m", MS, true, at(16)); // interval 3; 2 was quiet
        let s = h.snapshot(at(20)); // closes 3
        let counts: Vec<u64> = s[0].samples.iter().map(Sample::requests).collect();
        assert_eq!(counts, [2, 0, 1], "0 fell out of the ring of 3");
        assert_eq!(s[0].samples[1].p50_us, 0);
    }

    #[test]
    fn a_model_idle_for_the_whole_window_is_dropped() {
        let t0 = Instant::now();
        let mut h = History::new(settings(3, 8), t0);
        h.record("m", MS, true, t0);
        assert_eq!(
            h.snapshot(t0 + Duration::from_secs(15)).len(),
            1,
            "interval 0 is still in the ring"
        );
        assert!(h.snapshot(t0 + Duration::from_secs(20)).is_empty());
        // A gap far longer than the window costs no more than the window.
        h.record("m", MS, true, t0 + Duration::from_secs(1_000_000));
        let s = h.snapshot(t0 + Duration::from_secs(1_000_005));
        assert_eq!(s[0].samples.iter().map(Sample::requests).collect::<Vec<_>>(), [0, 0, 1]);
    }

    #[test]
    fn models_beyond_the_bound_wait_for_an_idle_one_to_go() {
        let t0 = Instant::now();
        let mut h = History::new(settings(2, 2), t0);
        h.record("a", MS, true, t0);
        h.record("b", MS, true, t0);
        h.record("c", MS, true, t0);
        let names = |h: &mut History, s| -> Vec<String> {
            h.snapshot(t0 + Duration::from_secs(s))
                .into_iter()
                .map(|m| m.name)
                .collect()
        };
        assert_eq!(names(&mut h, 5), ["a", "b"]);
        // `b` keeps busy; `a` goes idle for the window (2 intervals) and makes room for `c`.
        h.record("b", MS, true, t0 + Duration::from_secs(6));
        h.record("c", MS, true, t0 + Duration::from_secs(11));
        assert_eq!(names(&mut h, 11), ["a", "b"], "interval 0 is still in a's window");
        h.record("c", MS, true, t0 + Duration::from_secs(16));
        assert_eq!(names(&mut h, 16), ["b", "c"]);
    }
}
