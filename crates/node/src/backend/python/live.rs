//! The node's live Python stubs, from start to their last log line: a stop waits for their
//! `finalize()` and kills, by name, those still running when its time is up.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The node's live stubs.
pub struct LiveStubs {
    state: Mutex<State>,
    gone: tokio::sync::Notify,
    /// How long an unloaded instance's `finalize()` may take (`--exit-timeout-secs`).
    pub grace: Duration,
}

#[derive(Default)]
struct State {
    next: u64,
    live: BTreeMap<u64, Stub>,
}

struct Stub {
    model: String,
    label: String,
    /// Until the process is reaped: a pid that may be signalled (never one the kernel could
    /// have given to another process since).
    pid: Option<u32>,
}

/// One stub's place among the live ones: `reaping` before its process is reaped, dropped once
/// its last output is logged.
pub struct Enrolled {
    stubs: Arc<LiveStubs>,
    id: u64,
}

/// A stub a stop killed because its time was up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Killed {
    pub model: String,
    pub label: String,
}

impl LiveStubs {
    pub fn new(grace: Duration) -> LiveStubs {
        LiveStubs {
            state: Mutex::default(),
            gone: tokio::sync::Notify::new(),
            grace,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a started stub of `model` until the returned place is dropped.
    pub fn enroll(self: &Arc<Self>, model: &str, label: &str, pid: u32) -> Enrolled {
        let mut state = self.state();
        let id = state.next;
        state.next += 1;
        let stub = Stub {
            model: model.to_string(),
            label: label.to_string(),
            pid: Some(pid),
        };
        state.live.insert(id, stub);
        Enrolled {
            stubs: self.clone(),
            id,
        }
    }

    /// How many stubs are live.
    pub fn count(&self) -> usize {
        self.state().live.len()
    }

    /// Waits until every stub is gone or `deadline` passes; true when they are all gone.
    pub async fn wait_gone(&self, deadline: Instant) -> bool {
        loop {
            let notified = self.gone.notified();
            if self.count() == 0 {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // Look again now and then too: a notification may come between the count and the wait.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), notified).await;
        }
    }

    /// Kills (SIGKILL) every stub not yet reaped, and says whose they were.
    pub fn kill_all(&self) -> Vec<Killed> {
        let state = self.state();
        let mut killed = Vec::new();
        for stub in state.live.values() {
            let Some(pid) = stub.pid else { continue };
            let Ok(pid) = libc::pid_t::try_from(pid) else { continue };
            // SAFETY: kill(2) on a child this node started and has not reaped: the lock keeps
            // `reaping` (which comes before the reap) from running meanwhile.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.push(Killed {
                    model: stub.model.clone(),
                    label: stub.label.clone(),
                });
            }
        }
        killed
    }
}

impl Enrolled {
    /// The process is about to be reaped: its pid is no longer signalled.
    pub fn reaping(&self) {
        if let Some(stub) = self.stubs.state().live.get_mut(&self.id) {
            stub.pid = None;
        }
    }

    /// Runs `look`, which may reap the process (a `try_wait`), while no stop can signal it; when
    /// it says it reaped, the pid is no longer signalled.
    pub fn reaped_if<R>(&self, look: impl FnOnce() -> (R, bool)) -> R {
        let mut state = self.stubs.state();
        let (answer, reaped) = look();
        if reaped {
            if let Some(stub) = state.live.get_mut(&self.id) {
                stub.pid = None;
            }
        }
        answer
    }
}

impl Drop for Enrolled {
    fn drop(&mut self) {
        self.stubs.state().live.remove(&self.id);
        self.stubs.gone.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_waits_for_the_stubs_and_kills_only_those_not_reaped() {
        let stubs = Arc::new(LiveStubs::new(Duration::from_secs(30)));
        // Processes of our own to kill: `sleep`, as a stub that outlives its time.
        let mut slow = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut quick = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let a = stubs.enroll("slow", "slow_0", slow.id());
        let b = stubs.enroll("quick", "quick_0", quick.id());
        assert_eq!(stubs.count(), 2);
        assert!(!stubs.wait_gone(Instant::now() + Duration::from_millis(50)).await);

        // `quick` is reaped by a look at whether it exited: its pid is no longer ours to signal.
        let _ = quick.kill();
        let status = b.reaped_if(|| {
            let status = quick.wait().unwrap();
            (status, true)
        });
        assert!(!status.success());
        let killed = stubs.kill_all();
        assert_eq!(
            killed,
            vec![Killed {
                model: "slow".into(),
                label: "slow_0".into()
            }]
        );
        assert!(!slow.wait().unwrap().success(), "killed by the signal");
        drop(b);
        assert_eq!(stubs.count(), 1);

        // The last one going wakes the waiter before its deadline.
        let waiter = {
            let stubs = stubs.clone();
            tokio::spawn(async move { stubs.wait_gone(Instant::now() + Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.reaping();
        drop(a);
        let started = Instant::now();
        assert!(waiter.await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(stubs.kill_all().is_empty());
    }
}
