//! What every mesh binary does around its work: logging, the async runtime, and SIGINT/SIGTERM.
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

/// Logs at `level` ("error" … "trace") for the mesh's own crates and warnings for dependencies;
/// `MESH_LOG` (an env-filter) overrides it. The log goes to standard output, or appended to `file`
/// (`--log-file`), which is created with mode 0600 and never opened through a symbolic link.
pub fn init_logging(crates: &[&str], level: &str, file: Option<&std::path::Path>) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // The mesh's crates pass every level here; the logging extension's settings decide at each
    // line (`crate::logging::allows`), so `/v2/logging` can change them at run time. MESH_LOG
    // (EnvFilter syntax) still narrows what is written, with every level allowed.
    let env = tracing_subscriber::EnvFilter::try_from_env("MESH_LOG");
    crate::logging::set_verbose(match (env.is_ok(), level) {
        (true, _) | (false, "trace") => 2,
        (false, "debug") => 1,
        _ => 0,
    });
    let mut filter = String::from("warn");
    for c in crates {
        filter.push_str(&format!(",{c}=trace"));
    }
    // A dynamic filter: asked at every line, never cached per callsite (a plain filter_fn is).
    let live = tracing_subscriber::filter::dynamic_filter_fn(|meta, _| crate::logging::allows(meta.level()));
    let layer = tracing_subscriber::fmt::layer().with_target(false);
    let layer = match file {
        Some(path) => {
            let f = open_log(path).map_err(|e| format!("cannot open --log-file {}: {e}", path.display()))?;
            crate::logging::set_file(&path.to_string_lossy());
            layer.with_ansi(false).with_writer(std::sync::Mutex::new(f)).boxed()
        }
        // Colours only on a terminal: a pipe or a log collector gets plain text.
        None => layer
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(env.unwrap_or_else(|_| filter.into()))
        .with(layer.with_filter(live))
        .try_init();
    Ok(())
}

/// Opens a log file for appending: created 0600 if missing, refused if it is a symbolic link.
fn open_log(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Async worker threads: `TOKIO_WORKER_THREADS` when it is a positive number, else one per core
/// (tokio's own default; a value tokio would refuse falls back to it instead of stopping start-up).
/// Fewer workers mean fewer cross-thread wake-ups per request: on a 2-vCPU host shared by a router,
/// a node and a client, one router worker saved 15-20 µs of router CPU per routed request, while a
/// node with one worker served unbatched models that run inline about a sixth slower
/// (benches/results/rounds.md, "Issue 26, second part").
pub fn workers(cores: usize, env: Option<&str>) -> usize {
    match env.and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ => cores.max(1),
    }
}

static WORKERS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// The runtime's worker threads (1 before [`run`] started it).
pub fn worker_count() -> usize {
    WORKERS.get().copied().unwrap_or(1)
}

/// Runs `main` on a multi-threaded runtime with [`workers`] threads; an error is logged and
/// makes the exit code a failure.
pub fn run(main: impl Future<Output = Result<(), String>>) -> ExitCode {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = workers(cores, std::env::var("TOKIO_WORKER_THREADS").ok().as_deref());
    let _ = WORKERS.set(threads);
    tracing::info!(
        workers = threads,
        cores,
        "async runtime (TOKIO_WORKER_THREADS sets the worker count)"
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    };
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Resolves at the first SIGTERM or SIGINT.
pub async fn wait_for_signal() -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}

/// Waits for the listeners to drain, at most `timeout`; says so when they did not.
pub async fn drain(servers: Vec<tokio::task::JoinHandle<()>>, timeout: Duration) {
    let drained = tokio::time::timeout(timeout, async {
        for s in servers {
            let _ = s.await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("in-flight requests did not finish within --exit-timeout-secs; exiting anyway");
    }
}

/// The host's name, for default node and router names.
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::workers;

    #[test]
    fn log_files_are_private_and_never_followed_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::private::fresh_dir("mesh-log-test-").unwrap();
        let path = dir.join("server.log");
        drop(super::open_log(&path).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let link = dir.join("link.log");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(super::open_log(&link).is_err(), "a symbolic link must not be followed");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn one_per_core_unless_the_environment_says() {
        assert_eq!(workers(0, None), 1);
        assert_eq!(workers(16, None), 16);
        assert_eq!(workers(2, Some(" 1 ")), 1);
        // Nonsense falls back to the rule instead of failing start-up.
        assert_eq!(workers(8, Some("0")), 8);
        assert_eq!(workers(8, Some("many")), 8);
    }
}
