//! Prometheus metrics with Triton's names and labels, recorded through the `metrics` crate.
use std::time::Duration;

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use metrics_exporter_prometheus::PrometheusHandle;

/// Failure reasons Triton labels `nv_inference_request_failure` with.
const REASONS: [&str; 4] = ["REJECTED", "CANCELED", "BACKEND", "OTHER"];

/// tritonserver's `--metrics-config` for the latency metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `counter_latencies` (default true): the cumulative `*_duration_us` counters.
    pub counters: bool,
    /// `summary_latencies` (default false): the `*_summary_us` summaries.
    pub summaries: bool,
    /// `summary_quantiles` (`<quantile>:<error>,...`; the errors are accepted and not used).
    pub quantiles: Vec<f64>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            counters: true,
            summaries: false,
            quantiles: vec![0.5, 0.9, 0.95, 0.99, 0.999],
        }
    }
}

impl MetricsConfig {
    /// Parses `--metrics-config <setting>=<value>` entries; an unknown setting or a bad value is
    /// refused with its name.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut config = MetricsConfig::default();
        for entry in entries {
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| format!("--metrics-config '{entry}' must be <setting>=<value>"))?;
            let flag = |v: &str| match v {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(format!("--metrics-config {key} must be true or false, not '{v}'")),
            };
            match key {
                "counter_latencies" => config.counters = flag(value)?,
                "summary_latencies" => config.summaries = flag(value)?,
                "summary_quantiles" => {
                    config.quantiles = value
                        .split(',')
                        .map(|pair| {
                            let q = pair.split(':').next().unwrap_or_default().trim();
                            q.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).ok_or_else(|| {
                                format!("--metrics-config summary_quantiles: '{pair}' is not <quantile>:<error> with a quantile between 0 and 1")
                            })
                        })
                        .collect::<Result<_, _>>()?;
                }
                other => {
                    return Err(format!(
                        "--metrics-config: unknown setting '{other}' (counter_latencies, summary_latencies, summary_quantiles)"
                    ))
                }
            }
        }
        Ok(config)
    }
}

static CONFIG: OnceLock<MetricsConfig> = OnceLock::new();

fn config() -> &'static MetricsConfig {
    CONFIG.get_or_init(MetricsConfig::default)
}

/// Installs the global recorder with `config` and returns the handle that renders `/metrics`.
pub fn install(config: MetricsConfig) -> Result<PrometheusHandle, String> {
    let handle = mesh::telemetry::install(describe, Some(&config.quantiles))?;
    let _ = CONFIG.set(config);
    Ok(handle)
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
    c!(
        "mesh_instance_inline_executions_total",
        "Requests that found their instance idle and ran on the thread that received them instead of the instance's executor thread"
    );
    c!(
        "mesh_python_stub_waits_total",
        "Waits of a Python instance's executor thread for its stub, by how they polled first (spin-microseconds): none, caught or missed"
    );
    c!(
        "mesh_instance_grouped_requests_total",
        "Requests of a model without dynamic batching that travelled to their instance's backend with others (each still its own execution)"
    );
    c!(
        "mesh_instance_restarts_total",
        "Rebuilds of each model instance by its supervisor after its backend failed"
    );
    metrics::describe_gauge!(
        "mesh_instance_ready",
        "Whether each model instance is serving (1) or being rebuilt (0)"
    );
    c!(
        "mesh_node_fenced_commands_total",
        "Commands of a router that no longer leads placement, refused by this node, by command"
    );
    c!(
        "mesh_link_shared_memory_bytes_total",
        "Tensor bytes that crossed the cluster link through shared memory, by direction"
    );
    // The GPU families, with tritonserver's help texts (telemetry/gpu.rs samples them).
    for (name, help) in [
        ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)"),
        ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes"),
        ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes"),
        ("nv_gpu_power_usage", "GPU power usage in watts"),
        ("nv_gpu_power_limit", "GPU power management limit in watts"),
        (
            "nv_energy_consumption",
            "GPU energy consumption in joules since the Triton Server started",
        ),
    ] {
        metrics::describe_gauge!(name, help);
    }
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
    use metrics::describe_histogram as h;
    h!(
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)"
    );
    h!(
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)"
    );
    h!(
        "nv_inference_compute_input_summary_us",
        "Summary of compute input duration in microseconds (does not include cached requests)"
    );
    h!(
        "nv_inference_compute_infer_summary_us",
        "Summary of compute inference duration in microseconds (does not include cached requests)"
    );
    h!(
        "nv_inference_compute_output_summary_us",
        "Summary of compute output duration in microseconds (does not include cached requests)"
    );
    metrics::describe_gauge!("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]");
    metrics::describe_gauge!("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes");
    metrics::describe_gauge!("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes");
}

/// The latencies Triton measures, as they appear in the metric names.
const LATENCIES: [&str; 5] = ["request", "queue", "compute_input", "compute_infer", "compute_output"];

/// Metric handles of one model version, made once at load so the hot path only adds.
pub struct ModelMetrics {
    success: Counter,
    failure: [Counter; 4],
    inference_count: Counter,
    exec_count: Counter,
    /// The `*_duration_us` counters (`counter_latencies`) and the `*_summary_us` summaries
    /// (`summary_latencies`), in the order request, queue, compute input, infer, output.
    counters: Option<[Counter; 5]>,
    summaries: Option<[Histogram; 5]>,
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
            counters: config()
                .counters
                .then(|| LATENCIES.map(|name| counter!(format!("nv_inference_{name}_duration_us"), &l()))),
            summaries: config()
                .summaries
                .then(|| LATENCIES.map(|name| histogram!(format!("nv_inference_{name}_summary_us"), &l()))),
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
        // A queue pass of no time, as the statistics count it; no compute.
        self.latencies(&[Some(total), Some(Duration::ZERO), None, None, None]);
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
        self.latencies(&[Some(total), Some(queue), Some(t.input), Some(t.infer), Some(t.output)]);
    }

    /// Adds each given latency (request, queue, compute input, infer, output) to its counter and
    /// summary, as `--metrics-config` keeps them.
    fn latencies(&self, took: &[Option<Duration>; 5]) {
        for (i, t) in took.iter().enumerate() {
            let Some(t) = t else { continue };
            let us = t.as_micros() as u64;
            if let Some(c) = &self.counters {
                c[i].increment(us);
            }
            if let Some(s) = &self.summaries {
                s[i].record(us as f64);
            }
        }
    }

    /// Records one failed request under Triton's reason label.
    pub fn failure(&self, reason: &str, total: Duration) {
        let i = REASONS.iter().position(|r| *r == reason).unwrap_or(3);
        self.failure[i].increment(1);
        self.latencies(&[Some(total), None, None, None, None]);
    }
}

/// `--metrics-interval-ms` as a sampling interval (tritonserver's default is 2000 ms); refused
/// unless it is a positive number of at most a day.
pub fn sample_interval(ms: Option<f64>) -> Result<Duration, String> {
    let ms = ms.unwrap_or(2000.0);
    if !(ms.is_finite() && (1.0..=86_400_000.0).contains(&ms)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &[&str]) -> Result<MetricsConfig, String> {
        MetricsConfig::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn metrics_config_reads_tritons_latency_settings() {
        assert_eq!(parse(&[]).unwrap(), MetricsConfig::default());
        let c = parse(&[
            "summary_latencies=true",
            "counter_latencies=false",
            "summary_quantiles=0.5:0.05,0.99:0.001",
        ])
        .unwrap();
        assert!(c.summaries && !c.counters);
        assert_eq!(c.quantiles, vec![0.5, 0.99]);
        for (bad, names) in [
            ("histogram=true", "'histogram'"),
            ("summary_latencies=yes", "'yes'"),
            ("summary_quantiles=1.5:0.1", "'1.5:0.1'"),
            ("counter_latencies", "<setting>=<value>"),
        ] {
            let e = parse(&[bad]).unwrap_err();
            assert!(e.contains(names), "{e}");
        }
    }
}
