//! A request's task as the C API runs it: its first step on the calling thread, the rest on the server's runtime, and a panic inside it (a bug) turned into the request's last answer rather than a request that never ends.
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A request's work, answering through the application's callbacks as it goes.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a panicking task still owes the application: its final answer (an INTERNAL error), unless
/// that went already. It holds the request's release too, so the release follows that answer (the
/// task's own hold on it is dropped while the panic unwinds, before the answer is made).
pub(crate) type OnPanic = Box<dyn FnOnce() + Send>;

/// Runs a request's task: first on the calling thread, so an idle instance answers there with no
/// thread hand-off (its response callback then runs before `TRITONSERVER_ServerInferAsync`
/// returns, as Triton's can on a response-cache hit); what still waits after that first step
/// continues on the server's runtime. A panic anywhere in it, here or there, calls `on_panic` and
/// then drops the task (its release callback follows), so the accepted request ends as it must.
pub(crate) fn run(runtime: &tokio::runtime::Handle, task: Task, on_panic: OnPanic) {
    let _entered = runtime.enter();
    let mut guarded = Guarded {
        task: Some(task),
        on_panic: Some(on_panic),
    };
    let mut cx = Context::from_waker(Waker::noop());
    if Pin::new(&mut guarded).poll(&mut cx).is_pending() {
        // The runtime polls it again at once, so nothing that became ready meanwhile is missed.
        runtime.spawn(guarded);
    }
}

struct Guarded {
    task: Option<Task>,
    on_panic: Option<OnPanic>,
}

impl Future for Guarded {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(());
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| task.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => {
                self.task = None;
                self.on_panic = None; // (its hold on the release)
                Poll::Ready(())
            }
            Err(_) => {
                tracing::error!("a request's task panicked (a bug); it is answered INTERNAL and released");
                if let Some(answer) = self.on_panic.take() {
                    answer();
                }
                self.task = None; // drops the request's release: the release callback follows
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts its drops: stands for a request's release.
    struct Released(Arc<AtomicUsize>);
    impl Drop for Released {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_panic_inline_or_later_answers_once_then_releases() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        for later in [false, true] {
            let (answered, released) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let release = Arc::new(Released(released.clone()));
            let (seen_release, held) = (released.clone(), release.clone());
            let task: Task = Box::pin(async move {
                let _release = release;
                if later {
                    tokio::task::yield_now().await; // the rest runs on the runtime
                }
                panic!("a bug in a request's task");
            });
            let a = answered.clone();
            let on_panic: OnPanic = Box::new(move || {
                // The answer comes before the release, which this closure holds.
                let _release = held;
                assert_eq!(seen_release.load(Ordering::SeqCst), 0);
                a.fetch_add(1, Ordering::SeqCst);
            });
            run(runtime.handle(), task, on_panic);
            let t0 = std::time::Instant::now();
            while released.load(Ordering::SeqCst) == 0 && t0.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(answered.load(Ordering::SeqCst), 1, "later: {later}");
            assert_eq!(released.load(Ordering::SeqCst), 1, "later: {later}");
        }
    }

    #[test]
    fn a_task_that_ends_well_owes_nothing() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let answered = Arc::new(AtomicUsize::new(0));
        let a = answered.clone();
        run(
            runtime.handle(),
            Box::pin(async {}),
            Box::new(move || {
                a.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(answered.load(Ordering::SeqCst), 0);
    }
}
