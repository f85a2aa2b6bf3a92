//! A streamed request's "queued" signal: the point where it holds its place in its model's queue,
//! so the next request of the same gRPC stream may go on. Triton hands a stream's requests to its
//! schedulers in stream order, so they join batches in that order; the mesh runs each request in
//! its own task and keeps that order by letting a task go on only once the one before is queued.
//!
//! The signal lives in a task-local: whatever queues the request (a node's instance, the router's
//! link) calls [`fire`] without knowing who waits. A request that ends without firing (an error,
//! a cache hit) releases the next one when its task ends, so a path that never fires only runs
//! requests one after another; it can never hold a stream.
use std::cell::RefCell;
use std::future::Future;

use tokio::sync::oneshot;

tokio::task_local! {
    static QUEUED: RefCell<Option<oneshot::Sender<()>>>;
}

/// Runs `request` with `queued` fired when it is queued, or dropped when it ends.
pub async fn scope<T>(queued: oneshot::Sender<()>, request: impl Future<Output = T>) -> T {
    QUEUED.scope(RefCell::new(Some(queued)), request).await
}

/// The request running in this task holds its place in a queue now (no-op outside [`scope`], and
/// after the first call).
pub fn fire() {
    let _ = QUEUED.try_with(|q| {
        if let Some(tx) = q.borrow_mut().take() {
            let _ = tx.send(());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fired_once_inside_the_scope_and_released_when_the_request_ends_without_it() {
        let (tx, rx) = oneshot::channel();
        let mut rx = Box::pin(rx);
        scope(tx, async {
            assert!(futures::poll!(&mut rx).is_pending(), "not queued yet");
            fire();
            fire();
        })
        .await;
        assert_eq!(rx.await, Ok(()));
        let (tx, rx) = oneshot::channel::<()>();
        scope(tx, async {}).await;
        assert!(rx.await.is_err(), "released, not fired");
        fire(); // outside any scope: nothing happens
    }
}
