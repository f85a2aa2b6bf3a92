//! Busy polling (`--busy-poll-us`): for a short window after each request, the async runtime's
//! workers keep polling their sockets instead of sleeping, so the next packet (the node's answer,
//! the client's next request) is read without a wake-up.
//!
//! A sleeping worker costs one wake-up per packet, 35-45 µs on a small VM (benches/results/rounds.md,
//! "Issue 26, fourth part"). Each worker gets a spinner task. While the window is open, a spinner
//! yields instead of finishing; tokio then polls its sockets (`epoll_wait` with no timeout) and
//! runs the spinner again, so the worker never parks. Once no request has started or ended
//! for a whole window, the spinners wait, and the workers sleep as usual. The price is CPU: each
//! worker stays busy through every window. Off (zero) by default.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Whether a spinner keeps going at `now` when the last request started or ended at `last` (all
/// in nanoseconds since the same epoch). A clock that went backwards counts as fresh activity.
pub fn open(now: u64, last: u64, window: u64) -> bool {
    now.saturating_sub(last) <= window
}

struct Spin {
    window: u64,
    epoch: Instant,
    last: AtomicU64,
    spinning: AtomicBool,
    wake: Notify,
    /// Windows the spinners began to poll through (a spinner that found a window open), also
    /// exported as `mesh_busy_poll_windows_total`.
    windows: AtomicU64,
}

impl Spin {
    /// Nanoseconds since the epoch, plus one window, so that the window starts shut (`last` is 0).
    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        elapsed.saturating_add(self.window).saturating_add(1)
    }
}

static SPIN: OnceLock<Spin> = OnceLock::new();

/// Starts `spinners` spinner tasks (one per worker) with this window; zero turns busy polling off.
/// Call once, inside the runtime; a second call changes nothing.
pub fn start(window: Duration, spinners: usize) {
    if window.is_zero() {
        return;
    }
    let spin = Spin {
        window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
        epoch: Instant::now(),
        last: AtomicU64::new(0),
        spinning: AtomicBool::new(true),
        wake: Notify::new(),
        windows: AtomicU64::new(0),
    };
    if SPIN.set(spin).is_err() {
        return;
    }
    let Some(s) = SPIN.get() else { return };
    metrics::describe_counter!(
        "mesh_busy_poll_windows_total",
        "Windows of --busy-poll-us that a spinner polled through (a request started or ended while none was open)"
    );
    tracing::info!(
        window_us = window.as_micros() as u64,
        spinners,
        "busy polling: the workers poll their sockets for this long after each request instead of sleeping"
    );
    for _ in 0..spinners.max(1) {
        tokio::spawn(spinner(s));
    }
}

async fn spinner(s: &'static Spin) {
    loop {
        // Registered before `spinning` clears, so a touch that finds it clear wakes this spinner,
        // and one that still found it set wrote `last` before the check below reads it (both
        // sides use SeqCst): a request never leaves the window shut.
        let notified = s.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        s.spinning.store(false, Ordering::SeqCst);
        if !open(s.now(), s.last.load(Ordering::SeqCst), s.window) {
            notified.await;
        }
        s.spinning.store(true, Ordering::SeqCst);
        s.windows.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("mesh_busy_poll_windows_total").increment(1);
        while open(s.now(), s.last.load(Ordering::SeqCst), s.window) {
            tokio::task::yield_now().await;
        }
    }
}

/// A request started or ended: the window opens again from now. Costs a clock read and an atomic
/// store while busy polling is on; nothing when it is off.
#[inline]
pub fn touch() {
    let Some(s) = SPIN.get() else { return };
    s.last.store(s.now(), Ordering::SeqCst);
    if !s.spinning.load(Ordering::SeqCst) {
        s.wake.notify_waiters();
    }
}

/// Runs `request`, touching when it starts and when it ends.
pub async fn around<T>(request: impl std::future::Future<Output = T>) -> T {
    touch();
    let out = request.await;
    touch();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_stays_open_until_a_whole_window_passes_without_a_request() {
        let w = 300_000; // 300 µs
        assert!(open(1_000_000, 1_000_000, w));
        assert!(open(1_300_000, 1_000_000, w));
        assert!(!open(1_300_001, 1_000_000, w));
        // A request touching later moves the window.
        assert!(open(1_500_000, 1_250_000, w));
        // A clock read that raced a later touch (now < last) is inside the window.
        assert!(open(1_000_000, 1_000_050, w));
    }

    /// Waits until the spinners' flag reads `spinning`, failing with `what` after 60 s (a guard
    /// against a hang, not a timing: the flag stays put once it changed).
    async fn until(spinning: bool, what: &str) {
        let s = SPIN.get().expect("started");
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.spinning.load(Ordering::Acquire) != spinning {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Touches, then waits until a spinner has begun a window since (the count only grows, so no
    /// window is missed however briefly it lasted); fails with `what` after 60 s.
    async fn touch_wakes(what: &str) {
        let s = SPIN.get().expect("started");
        let before = s.windows.load(Ordering::SeqCst);
        touch();
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.windows.load(Ordering::SeqCst) == before {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spinners_run_while_requests_touch_and_stop_after_the_window() {
        start(Duration::from_millis(20), 2);
        until(false, "nothing touched yet: the spinners wait").await;
        touch_wakes("a touch wakes a spinner").await;
        // Other tasks still run while the spinners poll.
        let ran = tokio::spawn(async { 7 })
            .await
            .expect("a task runs beside the spinners");
        assert_eq!(ran, 7);
        until(false, "the spinners stop once the window passes").await;
        // Touched again, they start again.
        touch_wakes("a later touch wakes them again").await;
    }
}
