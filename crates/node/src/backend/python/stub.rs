//! One Python stub process: started on the chosen interpreter, connected over a Unix socket, its output
//! forwarded to the log, and stopped (finalize, then kill) without leaving a zombie.
use mesh::sync::Locked;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ipc::{read_frame, write_frame, Shm};
// The start of a stub's shared-memory name: `mesh::shm` refuses client registrations of it.
use mesh::shm::OWN_SHM_PREFIX;

const STUB_PY: &str = include_str!("../../../python/mesh_stub.py");
const CALLS_PY: &str = include_str!("../../../python/mesh_stub_calls.py");
const PLAIN_PY: &str = include_str!("../../../python/mesh_stub_plain.py");
const UTILS_PY: &str = include_str!("../../../python/triton_python_backend_utils.py");
const METRICS_PY: &str = include_str!("../../../python/mesh_pb_metrics.py");
const HOST_PY: &str = include_str!("../../../python/mesh_pb_host.py");
const TENSORFLOW_PY: &str = include_str!("../../../python/mesh_tensorflow.py");
const CUDA_PY: &str = include_str!("../../../python/mesh_stub_cuda.py");
/// How long a new stub may take to import numpy and connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of the stub's stderr kept for error messages.
const TAIL_LINES: usize = 30;

/// The directory holding this process's stub sources and sockets (made fresh, mode 0700, never an
/// existing directory or a symlink, under the temporary directory), and how many nodes of the
/// process use it: several nodes may run in one process (the embedding APIs), and the directory
/// goes when the last of them stops.
static RUNTIME: Mutex<(Option<PathBuf>, usize)> = Mutex::new((None, 0));

fn write_runtime_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    // Unguessable, so nobody can plant files where the stub's sources go.
    let dir = mesh::private::fresh_dir(&format!("mesh-node-{}-", std::process::id()))?;
    for (name, text) in [
        ("mesh_stub.py", STUB_PY),
        ("mesh_stub_calls.py", CALLS_PY),
        ("mesh_stub_plain.py", PLAIN_PY),
        ("triton_python_backend_utils.py", UTILS_PY),
        ("mesh_pb_metrics.py", METRICS_PY),
        ("mesh_pb_host.py", HOST_PY),
        ("mesh_tensorflow.py", TENSORFLOW_PY),
        ("mesh_stub_cuda.py", CUDA_PY),
    ] {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(name))?;
        std::io::Write::write_all(&mut f, text.as_bytes())?;
    }
    Ok(dir)
}

fn runtime_dir() -> Result<PathBuf, String> {
    let mut runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(dir) = &runtime.0 {
        return Ok(dir.clone());
    }
    let dir = write_runtime_dir().map_err(|e| {
        let tmp = std::env::temp_dir();
        format!(
            "cannot write the python stub to a new directory in {}: {e}",
            tmp.display()
        )
    })?;
    runtime.0 = Some(dir.clone());
    Ok(dir)
}

/// The bundled model file that serves TensorFlow models in a stub (in place of a model.py).
pub fn tensorflow_runner() -> Result<PathBuf, String> {
    Ok(runtime_dir()?.join("mesh_tensorflow.py"))
}

/// A node of this process started: the stub directory stays until every such node stopped.
pub fn node_started() {
    RUNTIME.lock().unwrap_or_else(|p| p.into_inner()).1 += 1;
}

/// A node stopped: the last one removes the stub sources and sockets.
pub fn node_stopped() {
    let mut runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    runtime.1 = runtime.1.saturating_sub(1);
    if runtime.1 == 0 {
        if let Some(dir) = runtime.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Starts stub processes from one thread that lives as long as the node: a stub's parent-death
/// signal fires when the thread that forked it ends, so forking from a short-lived thread (a
/// runtime's blocking pool) would kill healthy stubs.
fn launch(mut command: Command) -> std::io::Result<Child> {
    type Job = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static LAUNCHER: OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> = OnceLock::new();
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls between fork and exec (prctl, getppid, _exit).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            // The stub dies with its node, whatever its model is doing (SIGKILL needs no cooperation).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The node may have died before the signal was armed.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let sender = LAUNCHER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("stub-launcher".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the stub launcher thread");
        Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    let sent = sender.locked().send((command, reply));
    sent.map_err(|_| std::io::Error::other("the stub launcher thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the stub launcher thread is gone"))?
}

/// Where a stub's frames are read: on the instance's thread, or, for a decoupled model (whose
/// threads answer at any time), by a reading thread that hands over what is not a stream answer.
enum Source {
    Direct(BufReader<UnixStream>),
    Routed(std::sync::mpsc::Receiver<std::io::Result<(Value, Vec<u8>)>>),
}

pub struct Stub {
    child: Child,
    reader: Source,
    pub writer: Arc<Mutex<UnixStream>>,
    pub shm: Arc<Shm>,
    pub label: String,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// The stub's decoupled BLS calls still streaming, which it may cancel.
    streaming: Arc<super::bls::Streaming>,
    /// The threads logging its stdout and stderr, joined once it exits (its last lines included).
    logs: Vec<std::thread::JoinHandle<()>>,
    /// Its place among the node's live stubs (an instance's stub; not a passing auto-complete's).
    enrolled: Option<super::live::Enrolled>,
}

/// How long a reaped stub's last output may take to reach the log.
const LAST_LINES: Duration = Duration::from_secs(1);
/// How long a stub whose finalize() answered may take to exit.
const EXIT_AFTER_FINALIZE: Duration = Duration::from_secs(5);

/// Forwards a stub's output lines to the log; stderr lines are also kept for error messages.
fn forward(
    stream: impl std::io::Read + Send + 'static,
    label: String,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) -> Option<std::thread::JoinHandle<()>> {
    let spawned = std::thread::Builder::new().name(format!("{label}-log")).spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            match &tail {
                Some(t) => {
                    tracing::warn!(instance = %label, "{line}");
                    let mut t = t.locked();
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
                None => tracing::info!(instance = %label, "{line}"),
            }
        }
    });
    spawned.ok()
}

impl Stub {
    /// Starts `interpreter mesh_stub.py` and waits for it to connect.
    pub fn start(interpreter: &Path, shm_bytes: usize, spin: Duration, label: &str) -> Result<Stub, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = runtime_dir()?;
        let sock_path = dir.join(format!("stub-{n}.sock"));
        let listener =
            UnixListener::bind(&sock_path).map_err(|e| format!("cannot bind {}: {e}", sock_path.display()))?;
        let shm_dir = Path::new("/dev/shm");
        let shm_dir = if shm_dir.is_dir() { shm_dir } else { dir.as_path() };
        // Unguessable, so no client can register a stub's memory (`register_system` opens any name).
        let shm_path = shm_dir.join(format!(
            "{OWN_SHM_PREFIX}{}-{}",
            std::process::id(),
            mesh::private::unguessable()
        ));
        let shm = Shm::create(&shm_path, shm_bytes)
            .map_err(|e| format!("cannot create shared memory {}: {e}", shm_path.display()))?;
        let mut command = Command::new(interpreter);
        command
            .arg(dir.join("mesh_stub.py"))
            .arg(&sock_path)
            .arg(&shm_path)
            .arg(shm_bytes.to_string())
            .arg(spin.as_micros().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = launch(command)
            .map_err(|e| format!("cannot start the python interpreter '{}': {e}", interpreter.display()))?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let mut logs = Vec::new();
        if let Some(out) = child.stdout.take() {
            logs.extend(forward(out, label.to_string(), None));
        }
        if let Some(err) = child.stderr.take() {
            logs.extend(forward(err, label.to_string(), Some(tail.clone())));
        }
        let stream = accept(&listener, &mut child, &tail);
        let _ = std::fs::remove_file(&sock_path);
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let writer = stream
            .try_clone()
            .map_err(|e| format!("cannot clone the stub socket: {e}"))?;
        Ok(Stub {
            child,
            reader: Source::Direct(BufReader::with_capacity(1 << 16, stream)),
            writer: Arc::new(Mutex::new(writer)),
            streaming: Default::default(),
            shm: Arc::new(shm),
            label: label.to_string(),
            stderr_tail: tail,
            logs,
            enrolled: None,
        })
    }

    /// Counts the stub among the node's live ones (of `model`) until it is reaped and its last
    /// lines are logged.
    pub fn enroll(&mut self, live: &Arc<super::live::LiveStubs>, model: &str) {
        self.enrolled = Some(live.enroll(model, &self.label, self.child.id()));
    }

    /// The last lines the stub wrote to stderr (a traceback, usually).
    pub fn stderr_tail(&self) -> String {
        let t = self.stderr_tail.locked();
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub fn send(&self, header: &Value, blob: &[u8]) -> std::io::Result<()> {
        let mut w = self.writer.locked();
        write_frame(&mut *w, header, blob)
    }

    /// Where BLS answers to this stub go.
    pub fn answers(&self) -> super::bls::Answers {
        super::bls::Answers {
            writer: self.writer.clone(),
            shm: self.shm.clone(),
            routed: self.is_routed(),
            holder: self.holder().into(),
            streaming: self.streaming.clone(),
        }
    }

    /// Who holds this stub's custom metrics: its label and process id (a restarted instance's
    /// stub has the same label).
    pub fn holder(&self) -> String {
        format!("{}#{}", self.label, self.child.id())
    }

    /// Hands the socket to a reading thread: from now on `recv` gets what it passes on.
    pub fn route(
        &mut self,
        rx: std::sync::mpsc::Receiver<std::io::Result<(Value, Vec<u8>)>>,
    ) -> Option<BufReader<UnixStream>> {
        match std::mem::replace(&mut self.reader, Source::Routed(rx)) {
            Source::Direct(r) => Some(r),
            Source::Routed(_) => None,
        }
    }

    /// Whether a frame has started to arrive by `until` (at once when bytes are buffered); a routed
    /// stub is always ready (its reading thread waits instead).
    pub fn readable_by(&mut self, until: Instant) -> bool {
        let Source::Direct(reader) = &mut self.reader else {
            return true;
        };
        if !reader.buffer().is_empty() {
            return true;
        }
        use std::os::fd::AsRawFd;
        let mut fd = libc::pollfd {
            fd: reader.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = until
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        n != 0 // ready, closed or failed: the read that follows tells which
    }

    /// Whether a reading thread has the socket (`route`).
    pub fn is_routed(&self) -> bool {
        matches!(self.reader, Source::Routed(_))
    }

    /// Whether bytes of the next frame are already read from the socket.
    pub fn has_buffered(&self) -> bool {
        matches!(&self.reader, Source::Direct(reader) if !reader.buffer().is_empty())
    }

    /// Polls without sleeping for up to `spin` until bytes are buffered; true if they are. On a VM
    /// this saves the wake-up (a VM exit) when the answer comes quickly.
    pub fn spin_for_data(&mut self, spin: Duration) -> std::io::Result<bool> {
        let Source::Direct(reader) = &mut self.reader else {
            return Ok(false);
        };
        if !reader.buffer().is_empty() {
            return Ok(true);
        }
        if spin.is_zero() {
            return Ok(false);
        }
        use std::io::BufRead;
        reader.get_ref().set_nonblocking(true)?;
        let end = Instant::now() + spin;
        let got = loop {
            match reader.fill_buf() {
                Ok(b) => break !b.is_empty(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < end => std::hint::spin_loop(),
                Err(_) => break false,
            }
        };
        reader.get_ref().set_nonblocking(false)?;
        Ok(got)
    }

    /// Reads the next frame, waiting at most until `deadline`.
    pub fn recv(&mut self, deadline: Option<Instant>) -> std::io::Result<(Value, Vec<u8>)> {
        let timeout = deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        });
        let frame = match &mut self.reader {
            Source::Direct(reader) => {
                reader.get_ref().set_read_timeout(timeout)?;
                read_frame(reader)?
            }
            Source::Routed(rx) => {
                use std::sync::mpsc::RecvTimeoutError;
                let got = match timeout {
                    Some(t) => rx.recv_timeout(t),
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match got {
                    Ok(frame) => frame?,
                    Err(RecvTimeoutError::Timeout) => return Err(std::io::ErrorKind::TimedOut.into()),
                    Err(RecvTimeoutError::Disconnected) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
        };
        self.shm.unlink_once();
        Ok(frame)
    }

    /// Whether the process still runs; Some(status text) once it has exited. A look that reaps
    /// the process takes it out of what a stop may signal in the same step (its pid may be the
    /// kernel's to give again from then on).
    pub fn exited(&mut self) -> Option<String> {
        let child = &mut self.child;
        let mut look = || match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        };
        match &self.enrolled {
            Some(enrolled) => enrolled.reaped_if(|| {
                let seen = look();
                let gone = seen.is_some();
                (seen, gone)
            }),
            None => look(),
        }
    }

    /// Asks the stub to finalize and exit (within `grace`), then kills and reaps it. A node's
    /// stop may kill it sooner (`LiveStubs::kill_all`): the wait then ends at once.
    pub fn stop(&mut self, finalize: bool, grace: Duration) {
        let deadline = Instant::now() + grace;
        if finalize && self.exited().is_none() && self.send(&json!({"op": "finalize"}), &[]).is_ok() {
            // finalize() may log, or raise: its traceback goes to the log.
            while let Ok((frame, _)) = self.recv(Some(deadline)) {
                match frame["op"].as_str() {
                    Some("log") => super::log(&self.label, &frame),
                    Some("metric") => super::metric(&self.answers(), &frame),
                    Some("error") => {
                        let message = frame["message"].as_str().unwrap_or_default().trim_end();
                        tracing::error!(instance = %self.label, "finalize() failed: {message}");
                        break;
                    }
                    Some("ok") => break,
                    _ => {}
                }
            }
        }
        // finalize() is over: the interpreter's exit (its atexit handlers, threads the model left
        // running) gets a few seconds more, not the whole grace.
        let exit_by = deadline.min(Instant::now() + EXIT_AFTER_FINALIZE);
        while self.exited().is_none() && Instant::now() < exit_by {
            std::thread::sleep(Duration::from_millis(5));
        }
        if finalize && self.exited().is_none() {
            tracing::warn!(instance = %self.label, "the python stub did not exit after finalize(); killing it");
        }
        self.reap(true);
    }

    /// Kills and reaps the process (a stub that died or hung: its last lines are not waited for).
    pub fn kill(&mut self) {
        self.reap(false);
    }

    /// Kills and reaps the process; with `last_lines`, waits (briefly) for its last output to be
    /// logged before it stops counting among the node's live stubs.
    fn reap(&mut self, last_lines: bool) {
        if let Some(enrolled) = &self.enrolled {
            enrolled.reaping();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let end = Instant::now() + if last_lines { LAST_LINES } else { Duration::ZERO };
        for log in std::mem::take(&mut self.logs) {
            while !log.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(2));
            }
            if log.is_finished() {
                let _ = log.join();
            }
        }
        self.enrolled = None;
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        crate::telemetry::custom::CUSTOM.release(&self.holder());
        self.kill();
    }
}

/// Waits for the new stub to connect, failing early with its stderr if it exits first.
fn accept(listener: &UnixListener, child: &mut Child, tail: &Mutex<VecDeque<String>>) -> Result<UnixStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let end = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("python stub did not connect: {e}")),
        }
        if let Ok(Some(status)) = child.try_wait() {
            std::thread::sleep(Duration::from_millis(50)); // let the log threads read the last lines
            let t = tail.locked();
            let said: Vec<_> = t.iter().cloned().collect();
            return Err(format!(
                "the python stub exited ({status}) before connecting:\n{}",
                said.join("\n")
            ));
        }
        if Instant::now() > end {
            return Err(format!("the python stub did not connect within {CONNECT_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
