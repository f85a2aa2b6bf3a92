//! Prometheus metrics with Triton's names and labels, recorded through the `metrics` crate.
use std::time::Duration;

use metrics::{counter, gauge, Counter, Gauge};
use metrics_exporter_prometheus::PrometheusHandle;

/// Failure reasons Triton labels `nv_inference_request_failure` with.
const REASONS: [&str; 4] = ["REJECTED", "CANCELED", "BACKEND", "OTHER"];

/// Installs the global recorder and returns the handle that renders `/metrics`.
pub fn install() -> Result<PrometheusHandle, String> {
    mesh::telemetry::install(describe)
}

fn describe() {
    use metrics::describe_counter as c;
    c!(
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)"
    );
    c!(
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds"
    );
    c!(
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds"
    );
    c!(
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds"
    );
    c!(
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds"
    );
    metrics::describe_gauge!(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution"
    );
    c!(
        "mesh_instance_executions_total",
        "Executions (batches) run by each model instance"
    );
    c!("nv_cache_num_hits_per_model", "Number of cache hits per model");
    c!(
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds"
    );
    c!("nv_cache_num_misses_per_model", "Number of cache misses per model");
    c!(
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds"
    );
    metrics::describe_gauge!("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]");
    metrics::describe_gauge!("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes");
    metrics::describe_gauge!("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes");
}

/// Metric handles of one model version, made once at load so the hot path only adds.
pub struct ModelMetrics {
    success: Counter,
    failure: [Counter; 4],
    inference_count: Counter,
    exec_count: Counter,
    request_us: Counter,
    queue_us: Counter,
    input_us: Counter,
    infer_us: Counter,
    output_us: Counter,
    pub pending: Gauge,
    /// Only for models whose config enables the response cache, as Triton exports them.
    cache: Option<CacheCounters>,
}

struct CacheCounters {
    hits: Counter,
    hit_us: Counter,
    misses: Counter,
    miss_us: Counter,
}

impl ModelMetrics {
    pub fn new(model: &str, version: i64, caches: bool) -> Self {
        let (m, v) = (model.to_string(), version.to_string());
        let l = || [("model", m.clone()), ("version", v.clone())];
        ModelMetrics {
            success: counter!("nv_inference_request_success", &l()),
            failure: REASONS.map(|r| {
                counter!(
                    "nv_inference_request_failure",
                    // Triton's label order (alphabetical), for scrapers that match lines as text.
                    &[("model", m.clone()), ("reason", r.to_string()), ("version", v.clone())]
                )
            }),
            inference_count: counter!("nv_inference_count", &l()),
            exec_count: counter!("nv_inference_exec_count", &l()),
            request_us: counter!("nv_inference_request_duration_us", &l()),
            queue_us: counter!("nv_inference_queue_duration_us", &l()),
            input_us: counter!("nv_inference_compute_input_duration_us", &l()),
            infer_us: counter!("nv_inference_compute_infer_duration_us", &l()),
            output_us: counter!("nv_inference_compute_output_duration_us", &l()),
            pending: gauge!("nv_inference_pending_request_count", &l()),
            cache: caches.then(|| CacheCounters {
                hits: counter!("nv_cache_num_hits_per_model", &l()),
                hit_us: counter!("nv_cache_hit_duration_per_model", &l()),
                misses: counter!("nv_cache_num_misses_per_model", &l()),
                miss_us: counter!("nv_cache_miss_duration_per_model", &l()),
            }),
        }
    }

    /// A request answered from the cache: a success (with its duration) and a hit.
    pub fn cache_hit(&self, total: Duration, lookup: Duration) {
        self.success.increment(1);
        self.request_us.increment(total.as_micros() as u64);
        self.queue_us.increment(0); // a queue pass of no time, as the statistics count it
        if let Some(c) = &self.cache {
            c.hits.increment(1);
            c.hit_us.increment(lookup.as_micros() as u64);
        }
    }

    /// A request the cache did not hold: the lookup and insertion time.
    pub fn cache_miss(&self, took: Duration) {
        if let Some(c) = &self.cache {
            c.misses.increment(1);
            c.miss_us.increment(took.as_micros() as u64);
        }
    }

    /// Records one successful request of `rows` inferences; `counts_execution` for one request per batch.
    pub fn success(
        &self,
        rows: u64,
        total: Duration,
        queue: Duration,
        t: &crate::backend::Timings,
        counts_execution: bool,
    ) {
        self.success.increment(1);
        self.inference_count.increment(rows);
        if counts_execution {
            self.exec_count.increment(1);
        }
        self.request_us.increment(total.as_micros() as u64);
        self.queue_us.increment(queue.as_micros() as u64);
        self.input_us.increment(t.input.as_micros() as u64);
        self.infer_us.increment(t.infer.as_micros() as u64);
        self.output_us.increment(t.output.as_micros() as u64);
    }

    /// Records one failed request under Triton's reason label.
    pub fn failure(&self, reason: &str, total: Duration) {
        let i = REASONS.iter().position(|r| *r == reason).unwrap_or(3);
        self.failure[i].increment(1);
        self.request_us.increment(total.as_micros() as u64);
    }
}

/// `--metrics-interval-ms` as a sampling interval (tritonserver's default is 2000 ms); refused
/// unless it is a positive number of at most a day.
pub fn sample_interval(ms: Option<f64>) -> Result<Duration, String> {
    let ms = ms.unwrap_or(2000.0);
    if !(ms.is_finite() && ms >= 1.0 && ms <= 86_400_000.0) {
        return Err(format!("--metrics-interval-ms {ms} must be between 1 and 86400000"));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

/// Samples CPU utilization and memory from /proc every `interval`, where /proc exists
/// (`--allow-cpu-metrics false` turns it off: the `nv_cpu_*` metrics are then absent).
pub fn spawn_cpu_sampler(interval: Duration) {
    tokio::spawn(async move {
        let mut last = read_cpu_times();
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let now = read_cpu_times();
            if let (Some((busy0, total0)), Some((busy1, total1))) = (last, now) {
                let dt = total1.saturating_sub(total0);
                if dt > 0 {
                    gauge!("nv_cpu_utilization").set(busy1.saturating_sub(busy0) as f64 / dt as f64);
                }
            }
            last = now;
            if let Some((total, available)) = read_meminfo() {
                gauge!("nv_cpu_memory_total_bytes").set(total as f64);
                gauge!("nv_cpu_memory_used_bytes").set(total.saturating_sub(available) as f64);
            }
        }
    });
}

/// (busy, total) jiffies from the first line of /proc/stat.
fn read_cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// (total, available) bytes from /proc/meminfo.
fn read_meminfo() -> Option<(u64, u64)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |key: &str| -> Option<u64> {
        info.lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|v| v * 1024)
    };
    Some((kb("MemTotal:")?, kb("MemAvailable:")?))
}
