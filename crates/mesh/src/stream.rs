//! The answers of one streamed request on their way to the client: a channel whose credit window bounds what is
//! produced and not yet consumed, by answers and by bytes, so a client that stops reading slows its producer (a
//! model, or a node across the cluster link) instead of growing a queue.
//!
//! A producer takes a [`Credit`] before it makes (or reads from a link) the next answer, charges the answer's
//! bytes to it, and sends it with the answer; whoever finally hands the answer to the client's connection drops
//! the credit. Async producers wait with [`StreamSender::credit`]; a Python stub, bounded by its own allowance,
//! takes its credits with [`Window::force`].
//!
//! The windows of one client connection's streams also share that connection's window
//! ([`Window::on_connection`]): past a stream's first answer out, a credit needs room in both, so
//! one client that opens many streams and reads none holds a bounded amount, and every stream can
//! always have one answer out (none waits on another stream of its connection).

use crate::sync::Locked;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;

use crate::request::InferResponse;

/// One message of a streamed answer: decoupled models send zero or more per request.
#[derive(Debug)]
pub struct StreamItem {
    /// None for a bare end of stream (Triton's final flag sent without a response).
    pub response: Option<crate::error::Result<InferResponse>>,
    /// The request's final flag: nothing follows for this request.
    pub last: bool,
    /// Held until the item is consumed, for producers that must not run ahead of their reader.
    pub credit: Option<Credit>,
}

impl StreamItem {
    pub fn new(response: Option<crate::error::Result<InferResponse>>, last: bool) -> Self {
        StreamItem {
            response,
            last,
            credit: None,
        }
    }
}

/// Answers a stream may hold produced and not consumed, unless its creator says otherwise.
pub const STREAM_WINDOW_ANSWERS: usize = 16;
/// Bytes of tensors those answers may hold (one answer is always let through, whatever its size).
pub const STREAM_WINDOW_BYTES: u64 = 4 << 20;
/// Answers all the streams of one client connection may hold made and not consumed (past the one
/// each stream may always have out).
pub const CONNECTION_WINDOW_ANSWERS: usize = 256;
/// Bytes of tensors those answers may hold: eight streams' windows, so many streams of one client
/// cannot hold 1024 windows (gRPC's streams per connection) of the server's memory.
pub const CONNECTION_WINDOW_BYTES: u64 = 32 << 20;

#[derive(Debug, Default)]
struct Out {
    answers: usize,
    bytes: u64,
}

impl Out {
    /// Whether the answers out are under `window`'s bounds.
    fn under(&self, window: &Window) -> bool {
        self.answers < window.answers && self.bytes < window.bytes
    }
}

/// A bound on the answers of a stream that are produced and not yet consumed.
#[derive(Debug)]
pub struct Window {
    out: Mutex<Out>,
    woken: Notify,
    answers: usize,
    bytes: u64,
    /// The window of the client connection this stream is on, shared by its streams.
    connection: Option<Arc<Window>>,
}

impl Window {
    /// A window of `answers` answers (at least one) and `bytes` bytes.
    pub fn new(answers: usize, bytes: u64) -> Arc<Window> {
        Window::with(answers, bytes, None)
    }

    fn with(answers: usize, bytes: u64, connection: Option<Arc<Window>>) -> Arc<Window> {
        Arc::new(Window {
            out: Mutex::new(Out::default()),
            woken: Notify::new(),
            answers: answers.max(1),
            bytes,
            connection,
        })
    }

    /// The default window of a client's stream.
    pub fn for_stream() -> Arc<Window> {
        Window::new(STREAM_WINDOW_ANSWERS, STREAM_WINDOW_BYTES)
    }

    /// The default window of a client's stream on a connection whose window is `connection`.
    pub fn on_connection(connection: Arc<Window>) -> Arc<Window> {
        Window::with(STREAM_WINDOW_ANSWERS, STREAM_WINDOW_BYTES, Some(connection))
    }

    /// A window of `answers` and `bytes` of its own within `connection`'s: past its first credit
    /// out, a credit needs room in both.
    pub fn within(answers: usize, bytes: u64, connection: Arc<Window>) -> Arc<Window> {
        Window::with(answers, bytes, Some(connection))
    }

    /// The default window of one client connection, shared by its streams.
    pub fn for_connection() -> Arc<Window> {
        Window::new(CONNECTION_WINDOW_ANSWERS, CONNECTION_WINDOW_BYTES)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Out> {
        self.out.locked()
    }

    /// One more answer out, and its credit (counted by the connection's window too).
    fn credit(self: &Arc<Self>, out: &mut Out) -> Credit {
        out.answers += 1;
        if let Some(c) = &self.connection {
            c.lock().answers += 1;
        }
        Credit {
            window: self.clone(),
            bytes: 0,
            returned: None,
        }
    }

    /// Takes a credit when the window has room: nothing out, or room in it and in its connection's.
    fn try_take(self: &Arc<Self>) -> Option<Credit> {
        let mut out = self.lock();
        let room = out.answers == 0 || (out.under(self) && self.connection.as_ref().is_none_or(|c| c.lock().under(c)));
        room.then(|| self.credit(&mut out))
    }

    /// Takes a credit even when the window is full, for a producer bounded another way (a Python stub's
    /// own allowance): it still counts, so the window's other producers wait for it.
    pub fn force(self: &Arc<Self>) -> Credit {
        self.credit(&mut self.lock())
    }

    /// Takes a credit, waiting (async) while the window is full.
    pub async fn acquire(self: &Arc<Self>) -> Credit {
        loop {
            let woken = self.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Room may also come from another stream of the connection.
            let shared = self.connection.as_ref().map(|c| c.woken.notified());
            let shared = async move {
                match shared {
                    Some(n) => n.await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(shared);
            // Registers the connection's waiter before looking (its notify_waiters is not kept).
            let _ = futures::poll!(shared.as_mut());
            if let Some(credit) = self.try_take() {
                return credit;
            }
            tokio::select! {
                () = woken => {}
                () = shared => {}
            }
        }
    }

    /// Answers out now.
    pub fn out(&self) -> usize {
        self.lock().answers
    }

    /// Bytes charged to the answers out now.
    pub fn bytes_out(&self) -> u64 {
        self.lock().bytes
    }
}

/// One answer's place in a [`Window`], returned when dropped.
pub struct Credit {
    window: Arc<Window>,
    bytes: u64,
    /// Told when the credit is returned (the answer was taken): a producer across a process boundary.
    returned: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Credit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credit")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Credit {
    /// Runs `f` when the credit is returned.
    pub fn on_return(&mut self, f: impl FnOnce() + Send + 'static) {
        self.returned = Some(Box::new(f));
    }

    /// Charges the answer's bytes to the window (the next credit waits while the bytes out pass its bound).
    pub fn charge(&mut self, bytes: u64) {
        self.window.lock().bytes += bytes;
        if let Some(c) = &self.window.connection {
            c.lock().bytes += bytes;
        }
        self.bytes += bytes;
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        let windows = std::iter::once(&self.window).chain(self.window.connection.as_ref());
        for window in windows {
            {
                let mut out = window.lock();
                out.answers = out.answers.saturating_sub(1);
                out.bytes = out.bytes.saturating_sub(self.bytes);
            }
            window.woken.notify_waiters();
        }
        if let Some(f) = self.returned.take() {
            f();
        }
    }
}

/// A stream's client went away: nobody takes its answers any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

/// Where the answers of one streamed request go, as they are produced, with the window of its client.
#[derive(Debug, Clone)]
pub struct StreamSender {
    tx: UnboundedSender<StreamItem>,
    window: Arc<Window>,
}

/// The client's end of a [`StreamSender`].
pub type StreamReceiver = UnboundedReceiver<StreamItem>;

/// A stream of answers bounded by `window` (shared by every request of one client stream, if given to each).
pub fn stream_channel(window: Arc<Window>) -> (StreamSender, StreamReceiver) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (StreamSender { tx, window }, rx)
}

impl StreamSender {
    /// Sends one answer; never waits (a producer that can wait takes a credit first and sends it along).
    /// Errs once the client went away (the answer is dropped, and its credit returned).
    pub fn send(&self, item: StreamItem) -> Result<(), ClientGone> {
        self.tx.send(item).map_err(|_| ClientGone)
    }

    /// A credit for the next answer, waiting while the window is full; `None` once the client went away.
    pub async fn credit(&self) -> Option<Credit> {
        tokio::select! {
            credit = self.window.acquire() => Some(credit),
            _ = self.tx.closed() => None,
        }
    }

    /// A credit for the next answer if the window has room now.
    pub fn try_credit(&self) -> Option<Credit> {
        self.window.try_take()
    }

    /// The window answers of this stream count against.
    pub fn window(&self) -> &Arc<Window> {
        &self.window
    }

    /// Resolves once the client's end is dropped.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Whether the client's end is dropped.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Bytes of tensors an answer carries, as charged to a window.
pub fn response_bytes(response: &InferResponse) -> u64 {
    response.outputs.iter().map(|t| t.tensor.data.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_full_window_holds_the_producer_until_an_answer_is_consumed() {
        let window = Window::new(2, 1 << 20);
        let a = window.acquire().await;
        let mut b = window.acquire().await;
        b.charge(10);
        assert_eq!((window.out(), window.bytes_out()), (2, 10));
        let waiting = tokio::spawn({
            let window = window.clone();
            async move { window.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "a third credit past a window of two");
        drop(a);
        let c = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a returned credit wakes the producer")
            .unwrap();
        drop((b, c));
        assert_eq!((window.out(), window.bytes_out()), (0, 0));
    }

    #[tokio::test]
    async fn bytes_bound_the_window_but_one_answer_always_passes() {
        let window = Window::new(8, 100);
        let mut big = window.acquire().await;
        big.charge(1_000);
        let next = tokio::time::timeout(Duration::from_millis(20), window.acquire()).await;
        assert!(next.is_err(), "bytes past the bound hold the next answer");
        drop(big);
        let mut alone = window.try_take().expect("a credit when none is out");
        alone.charge(5_000);
        assert_eq!(
            window.bytes_out(),
            5_000,
            "an answer larger than the window passes when none is out"
        );
    }

    #[tokio::test]
    async fn streams_of_one_connection_share_its_window_but_each_may_have_one_answer_out() {
        let connection = Window::new(3, 100);
        let (a, b, c) = (
            Window::on_connection(connection.clone()),
            Window::on_connection(connection.clone()),
            Window::on_connection(connection.clone()),
        );
        let mut a1 = a.acquire().await;
        a1.charge(60);
        let a2 = a.acquire().await;
        assert_eq!((connection.out(), connection.bytes_out()), (2, 60));
        let mut b1 = b.try_take().expect("a stream with nothing out always gets one");
        b1.charge(60);
        assert!(a.try_take().is_none(), "the connection's bytes are used up");
        assert!(b.try_take().is_none(), "its second answer needs room in the connection");
        let c1 = c
            .try_take()
            .expect("every stream of the connection still gets its first");
        assert_eq!(connection.out(), 4);
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "no room in the connection");
        drop((a1, a2));
        let b2 = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room made by another stream of the connection wakes the waiter")
            .unwrap();
        drop((b1, b2, c1));
        assert_eq!((connection.out(), connection.bytes_out()), (0, 0));
        let other = Window::for_stream();
        assert!(
            other.try_take().is_some(),
            "another connection's stream is not held back"
        );
    }

    #[tokio::test]
    async fn a_client_that_went_away_ends_the_wait_for_credit() {
        let (sink, rx) = stream_channel(Window::new(1, 1));
        let held = sink.credit().await.expect("a credit");
        drop(rx);
        let none = tokio::time::timeout(Duration::from_secs(5), sink.credit()).await;
        assert!(matches!(none, Ok(None)), "the wait must end when the client is gone");
        drop(held);
    }
}
