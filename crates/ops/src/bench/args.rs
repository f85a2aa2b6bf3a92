//! The command line of `mesh-ops bench` and its duration syntax.

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::inputs::{InputSource, ShapeOverride};

/// Load-test one model: N closed-loop clients, then a latency and throughput summary.
#[derive(Clone, Debug, Args)]
#[command(
    after_help = "Latencies are of successful requests; throughput counts successful requests \
    (infer/s = req/s x batch).\nExit status: 0 when every request succeeded, 1 when some failed, 2 when the run \
    could not start (bad arguments, server unreachable, unknown model)."
)]
pub struct BenchArgs {
    /// The model to send requests to.
    pub model: String,
    /// The server's HTTP address, http://HOST:PORT or HOST:PORT (used with --protocol http).
    #[arg(long, default_value = "http://localhost:8000")]
    pub url: String,
    /// The protocol used for metadata and inference.
    #[arg(long, value_enum, default_value_t = Protocol::Http)]
    pub protocol: Protocol,
    /// The server's gRPC address, HOST:PORT (used with --protocol grpc).
    #[arg(long, default_value = "localhost:8001")]
    pub grpc_url: String,
    /// The model version to ask for (default: the server's choice).
    #[arg(long, value_name = "V")]
    pub model_version: Option<String>,
    /// Requests in flight: one connection and one closed loop each.
    #[arg(short = 'c', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// How long to send requests, e.g. 10s, 500ms, 2m (default 10s).
    #[arg(long, value_parser = parse_duration, conflicts_with = "requests")]
    pub duration: Option<Duration>,
    /// Send this many requests in all, then stop.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,
    /// Input data: random, zeros, or a perf_analyzer input-data JSON file.
    #[arg(long, default_value = "random", value_name = "random|zeros|FILE.json")]
    pub input: InputSource,
    /// Batch size sent to a batching model (max_batch_size > 0).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// The shape of an input with dynamic dims, without the batch dim (repeatable); other dynamic dims are 1.
    #[arg(long = "shape", value_name = "NAME:D1,D2,...")]
    pub shapes: Vec<ShapeOverride>,
    /// How long one request (or the metadata) may take.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Never draw the progress line (it is drawn only when stderr is a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Http,
    Grpc,
}

/// Parses `10s`, `1.5s`, `500ms`, `250us`, `2m`, `1h` or a bare number of seconds; must be positive.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("'{s}': unknown unit '{other}' (use ms, s, m or h)")),
    };
    number
        .parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v * scale).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("'{s}': expected a positive duration such as 10s or 500ms"))
}
