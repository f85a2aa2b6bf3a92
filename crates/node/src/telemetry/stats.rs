//! Per-version inference statistics (Triton's statistics extension), kept in step with the Prometheus metrics.
use mesh::sync::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh::proto::{InferBatchStatistics, InferStatistics, ModelStatistics, StatisticDuration};

use crate::backend::Timings;
use crate::telemetry::metrics::ModelMetrics;

#[derive(Default)]
struct Duration64 {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Duration64 {
    fn add(&self, d: Duration) {
        self.count.fetch_add(1, Relaxed);
        self.ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }
    fn snapshot(&self) -> Option<StatisticDuration> {
        Some(StatisticDuration {
            count: self.count.load(Relaxed),
            ns: self.ns.load(Relaxed),
        })
    }
}

#[derive(Default, Clone, Copy)]
struct BatchTotals {
    count: u64,
    input_ns: u64,
    infer_ns: u64,
    output_ns: u64,
}

/// Everything recorded about one model version; one call per request updates statistics and metrics.
pub struct ModelStats {
    name: String,
    version: String,
    success: Duration64,
    fail: Duration64,
    queue: Duration64,
    compute_input: Duration64,
    compute_infer: Duration64,
    compute_output: Duration64,
    cache_hit: Duration64,
    cache_miss: Duration64,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    batches: Mutex<BTreeMap<u64, BatchTotals>>,
    pub metrics: ModelMetrics,
    /// Unique to this load of the version: a reload (new weights, same version) starts afresh,
    /// in the response cache's keys too.
    pub load: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ModelStats {
    /// `caches`: the model's config enables the response cache (its cache metrics are exported).
    pub fn new(name: &str, version: i64, caches: bool) -> Self {
        ModelStats {
            name: name.to_string(),
            version: version.to_string(),
            success: Duration64::default(),
            fail: Duration64::default(),
            queue: Duration64::default(),
            compute_input: Duration64::default(),
            compute_infer: Duration64::default(),
            compute_output: Duration64::default(),
            cache_hit: Duration64::default(),
            cache_miss: Duration64::default(),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            last_inference_ms: AtomicU64::new(0),
            batches: Mutex::new(BTreeMap::new()),
            metrics: ModelMetrics::new(name, version, caches),
            load: {
                static LOADS: AtomicU64 = AtomicU64::new(0);
                LOADS.fetch_add(1, Relaxed)
            },
        }
    }

    /// Records a request of `rows` inferences that succeeded; `execution` is the size of the batch it
    /// ran in, given by exactly one request per execution so executions are counted once.
    pub fn success(&self, rows: u64, total: Duration, queue: Duration, t: &Timings, execution: Option<u64>) {
        self.success.add(total);
        self.queue.add(queue);
        self.compute_input.add(t.input);
        self.compute_infer.add(t.infer);
        self.compute_output.add(t.output);
        self.inference_count.fetch_add(rows, Relaxed);
        self.last_inference_ms.store(now_ms(), Relaxed);
        if let Some(batch) = execution {
            self.execution_count.fetch_add(1, Relaxed);
            let mut batches = self.batches.locked();
            let b = batches.entry(batch).or_default();
            b.count += 1;
            b.input_ns += t.input.as_nanos() as u64;
            b.infer_ns += t.infer.as_nanos() as u64;
            b.output_ns += t.output.as_nanos() as u64;
        }
        self.metrics.success(rows, total, queue, t, execution.is_some());
    }

    /// Records a request answered from the response cache, as Triton counts one: a success and a
    /// queue pass (so no compute, inference or execution, and `last_inference` stays), plus the hit.
    pub fn cache_hit(&self, total: Duration, lookup: Duration) {
        self.success.add(total);
        self.queue.add(Duration::ZERO);
        self.cache_hit.add(lookup);
        self.metrics.cache_hit(total, lookup);
    }

    /// Records the cache's share of a request it did not hold (lookup plus insertion).
    pub fn cache_miss(&self, took: Duration) {
        self.cache_miss.add(took);
        self.metrics.cache_miss(took);
    }

    /// Records a failed request under Triton's failure reason.
    pub fn failure(&self, reason: &str, total: Duration) {
        self.fail.add(total);
        self.last_inference_ms.store(now_ms(), Relaxed);
        self.metrics.failure(reason, total);
    }

    /// The statistics extension's view of this version.
    pub fn snapshot(&self) -> ModelStatistics {
        let d = |n: u64, ns: u64| Some(StatisticDuration { count: n, ns });
        let batches = self.batches.locked();
        ModelStatistics {
            name: self.name.clone(),
            version: self.version.clone(),
            last_inference: self.last_inference_ms.load(Relaxed),
            inference_count: self.inference_count.load(Relaxed),
            execution_count: self.execution_count.load(Relaxed),
            inference_stats: Some(InferStatistics {
                success: self.success.snapshot(),
                fail: self.fail.snapshot(),
                queue: self.queue.snapshot(),
                compute_input: self.compute_input.snapshot(),
                compute_infer: self.compute_infer.snapshot(),
                compute_output: self.compute_output.snapshot(),
                cache_hit: self.cache_hit.snapshot(),
                cache_miss: self.cache_miss.snapshot(),
            }),
            batch_stats: batches
                .iter()
                .map(|(&size, b)| InferBatchStatistics {
                    batch_size: size,
                    compute_input: d(b.count, b.input_ns),
                    compute_infer: d(b.count, b.infer_ns),
                    compute_output: d(b.count, b.output_ns),
                })
                .collect(),
            memory_usage: Vec::new(),
            response_stats: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_counts_requests_batches_and_failures() {
        let s = ModelStats::new("m", 1, false);
        let t = Timings {
            input: Duration::from_micros(1),
            infer: Duration::from_micros(10),
            output: Duration::from_micros(2),
        };
        s.success(4, Duration::from_micros(50), Duration::from_micros(5), &t, Some(4));
        s.success(4, Duration::from_micros(50), Duration::ZERO, &t, Some(4));
        s.success(1, Duration::from_micros(20), Duration::ZERO, &t, Some(1));
        // two requests that shared one execution of 3 rows: only the first counts the execution
        s.success(2, Duration::from_micros(20), Duration::ZERO, &t, Some(3));
        s.success(1, Duration::from_micros(20), Duration::ZERO, &t, None);
        s.failure("OTHER", Duration::from_micros(3));
        let snap = s.snapshot();
        assert_eq!((snap.name.as_str(), snap.version.as_str()), ("m", "1"));
        assert_eq!(snap.inference_count, 12);
        assert_eq!(snap.execution_count, 4);
        let st = snap.inference_stats.unwrap();
        assert_eq!(st.success.unwrap().count, 5);
        assert_eq!(st.success.unwrap().ns, 160_000);
        assert_eq!(st.fail.unwrap().count, 1);
        assert_eq!(st.compute_infer.unwrap().ns, 50_000);
        let sizes: Vec<u64> = snap.batch_stats.iter().map(|b| b.batch_size).collect();
        assert_eq!(sizes, vec![1, 3, 4]);
        assert_eq!(snap.batch_stats[2].compute_infer.unwrap().count, 2);
        assert!(snap.last_inference > 0);
    }

    #[test]
    fn a_cache_hit_is_a_success_without_compute_and_a_miss_only_adds_its_time() {
        let s = ModelStats::new("m", 1, true);
        s.cache_miss(Duration::from_micros(3));
        s.cache_hit(Duration::from_micros(9), Duration::from_micros(2));
        let snap = s.snapshot();
        let st = snap.inference_stats.unwrap();
        assert_eq!((st.cache_hit.unwrap().count, st.cache_hit.unwrap().ns), (1, 2_000));
        assert_eq!((st.cache_miss.unwrap().count, st.cache_miss.unwrap().ns), (1, 3_000));
        assert_eq!((st.success.unwrap().count, st.queue.unwrap().count), (1, 1));
        assert_eq!(st.compute_infer.unwrap().count, 0);
        assert_eq!(
            (snap.inference_count, snap.execution_count, snap.last_inference),
            (0, 0, 0)
        );
    }
}
