//! `mesh-ops bench`: a closed-loop load generator over KServe v2 HTTP or gRPC, with a latency summary.

pub mod args;
pub mod grpc;
pub mod histogram;
pub mod http;
pub mod inputs;
pub mod report;

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use args::{parse_duration, BenchArgs, Protocol};
use histogram::Histogram;
use inputs::{InputSource, ModelInfo, RequestTensor};
use report::{ErrorKind, ErrorTally, RequestError, Summary};

/// How long a run lasts when neither --duration nor --requests is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// The pause after a failed connection, so a dead server is not hammered in a tight loop.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Why a run could not start; every kind exits with status 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupKind {
    /// The command line or the input file is wrong.
    Usage,
    /// The server could not be reached.
    Unreachable,
    /// The server does not know the model (or version).
    UnknownModel,
    /// The server answered something the bench cannot use.
    BadAnswer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupError {
    pub kind: SetupKind,
    pub message: String,
}

impl SetupError {
    pub fn new(kind: SetupKind, message: impl Into<String>) -> Self {
        SetupError {
            kind,
            message: message.into(),
        }
    }
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(SetupKind::Usage, message)
    }
    pub fn bad_answer(message: impl Into<String>) -> Self {
        Self::new(SetupKind::BadAnswer, message)
    }
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SetupError {}

/// The description of an error and its causes, innermost I/O errors named plainly
/// (`connection refused`, not `Connection refused (os error 111)`).
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let text = match err.downcast_ref::<std::io::Error>() {
            Some(io) => describe_io(io),
            None => err.to_string(),
        };
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    parts.join(": ")
}

/// An I/O error in plain words.
pub fn describe_io(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    let plain = match e.kind() {
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "connection reset",
        K::ConnectionAborted => "connection aborted",
        K::TimedOut => "timed out",
        K::UnexpectedEof => "connection closed",
        _ => return e.to_string(),
    };
    plain.to_string()
}

/// Runs the command and exits: 0 when every request succeeded, 1 when some failed, 2 when the run
/// could not start.
pub fn main(args: BenchArgs) -> ! {
    let code = match run(&args) {
        Ok(summary) => {
            let text = if args.json {
                serde_json::to_string_pretty(&summary.to_json()).unwrap_or_default()
            } else {
                summary.to_table()
            };
            // A closed stdout (`| head`) is no reason to panic.
            let _ = writeln!(std::io::stdout(), "{text}");
            i32::from(summary.errors.total() > 0)
        }
        Err(e) => {
            eprintln!("mesh-ops bench: {e}");
            2
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}

/// One concurrency slot's connection.
enum Slot {
    Http(http::Slot),
    Grpc(grpc::Slot),
}

impl Slot {
    async fn connect(&mut self) -> Result<(), RequestError> {
        match self {
            Slot::Http(s) => s.connect().await,
            Slot::Grpc(s) => s.connect().await,
        }
    }
    async fn infer(&mut self, variant: usize) -> Result<(), RequestError> {
        match self {
            Slot::Http(s) => s.infer(variant).await,
            Slot::Grpc(s) => s.infer(variant).await,
        }
    }
    /// Forgets the connection after a request was abandoned mid-way.
    fn reset(&mut self) {
        match self {
            Slot::Http(s) => s.reset(),
            Slot::Grpc(s) => s.reset(),
        }
    }
}

/// Counters shared by the workers and the progress line.
struct Shared {
    limit: Option<u64>,
    deadline: Option<Instant>,
    issued: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    /// Whether another request may be sent (claims it when counting requests).
    fn next(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        self.limit
            .is_none_or(|n| self.issued.fetch_add(1, Ordering::Relaxed) < n)
    }
}

/// Reads the model's metadata, builds the requests, runs the clients and gathers what they measured.
pub fn run(args: &BenchArgs) -> Result<Summary, SetupError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| SetupError::usage(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: &BenchArgs) -> Result<Summary, SetupError> {
    let version = args.model_version.as_deref();
    let slot_count = args.concurrency as usize;
    let (url, variants, mut slots) = match args.protocol {
        Protocol::Http => {
            let target = Arc::new(http::Target::new(&args.url, args.timeout)?);
            let variants = request_data(args, &target.model_info(&args.model, version).await?)?;
            let bodies = Arc::new(http::prepare(&args.model, version, &variants));
            let slots: Vec<Slot> = (0..slot_count)
                .map(|_| Slot::Http(http::Slot::new(target.clone(), bodies.clone())))
                .collect();
            (target.url().to_string(), variants.len(), slots)
        }
        Protocol::Grpc => {
            let target = Arc::new(grpc::Target::new(&args.grpc_url, args.timeout)?);
            let variants = request_data(args, &target.model_info(&args.model, version).await?)?;
            let requests = Arc::new(grpc::prepare(&args.model, version, &variants));
            let slots: Vec<Slot> = (0..slot_count)
                .map(|_| Slot::Grpc(grpc::Slot::new(target.clone(), requests.clone())))
                .collect();
            (target.url().to_string(), variants.len(), slots)
        }
    };
    // Connect every slot before the clock starts; a failure here is retried (and counted) in the loop.
    let connects = slots
        .iter_mut()
        .map(|s| tokio::time::timeout(args.timeout, s.connect()));
    futures::future::join_all(connects).await;

    let start = Instant::now();
    let shared = Arc::new(Shared {
        limit: args.requests,
        deadline: args
            .requests
            .is_none()
            .then(|| start + args.duration.unwrap_or(DEFAULT_DURATION)),
        issued: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let interrupt = {
        let shared = shared.clone();
        tokio::spawn(async move {
            // The first Ctrl-C stops sending and waits for the requests in flight; a second one quits.
            if tokio::signal::ctrl_c().await.is_ok() {
                shared.stop.store(true, Ordering::Relaxed);
            }
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!();
                std::process::exit(130);
            }
        })
    };
    let progress = (!args.no_progress && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(draw_progress(shared.clone(), start)));
    let workers: Vec<_> = slots
        .into_iter()
        .enumerate()
        .map(|(i, slot)| tokio::spawn(worker(slot, shared.clone(), i % variants, variants, args.timeout)))
        .collect();
    let mut latency = Histogram::new();
    let mut errors = ErrorTally::default();
    for w in workers {
        match w.await {
            Ok((h, e)) => {
                latency.merge(&h);
                errors.merge(e);
            }
            Err(e) => errors.record(RequestError::new(
                ErrorKind::Protocol,
                format!("client task failed: {e}"),
            )),
        }
    }
    let elapsed = start.elapsed();
    interrupt.abort();
    if let Some(p) = progress {
        p.abort();
        eprint!("\r\x1b[K");
    }
    Ok(Summary {
        model: args.model.clone(),
        model_version: args.model_version.clone().unwrap_or_default(),
        protocol: match args.protocol {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        },
        url,
        concurrency: args.concurrency,
        batch: args.batch,
        elapsed,
        latency_ns: latency,
        errors,
    })
}

/// The request variants: one of random or zero data, or one per entry of the input file.
fn request_data(args: &BenchArgs, info: &ModelInfo) -> Result<Vec<Vec<RequestTensor>>, SetupError> {
    let plan = inputs::plan(info, args.batch, &args.shapes)?;
    match &args.input {
        InputSource::File(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| SetupError::usage(format!("--input {}: {}", path.display(), describe_io(&e))))?;
            inputs::from_json(&text, &plan, args.batch)
                .map_err(|e| SetupError::new(e.kind, format!("--input {}: {}", path.display(), e.message)))
        }
        source => {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id());
            let mut rng = inputs::Rng::new(seed);
            Ok(vec![inputs::generate(
                &plan,
                args.batch,
                *source == InputSource::Zeros,
                &mut rng,
            )?])
        }
    }
}

/// One closed loop: send, wait for the answer, record, repeat while `shared` allows.
async fn worker(
    mut slot: Slot,
    shared: Arc<Shared>,
    first: usize,
    variants: usize,
    timeout: Duration,
) -> (Histogram, ErrorTally) {
    let mut latency = Histogram::new();
    let mut errors = ErrorTally::default();
    let mut variant = first;
    while shared.next() {
        let sent = Instant::now();
        let result = match tokio::time::timeout(timeout, slot.infer(variant)).await {
            Ok(r) => r,
            Err(_) => {
                slot.reset();
                Err(RequestError::new(
                    ErrorKind::Timeout,
                    format!("no answer within {:.3} s", timeout.as_secs_f64()),
                ))
            }
        };
        let took = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match result {
            Ok(()) => {
                latency.record(took);
                shared.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let backoff = e.kind == ErrorKind::Connect;
                errors.record(e);
                shared.failed.fetch_add(1, Ordering::Relaxed);
                if backoff {
                    tokio::time::sleep(CONNECT_BACKOFF).await;
                }
            }
        }
        variant = (variant + 1) % variants;
    }
    (latency, errors)
}

/// Redraws one status line on stderr until aborted.
async fn draw_progress(shared: Arc<Shared>, start: Instant) {
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let secs = start.elapsed().as_secs_f64();
        let ok = shared.ok.load(Ordering::Relaxed);
        let failed = shared.failed.load(Ordering::Relaxed);
        let rate = if secs > 0.0 { (ok + failed) as f64 / secs } else { 0.0 };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{secs:7.1} s  {:>10} requests  {rate:>10.1} req/s  {failed} errors\x1b[K",
            ok + failed
        );
        let _ = err.flush();
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
