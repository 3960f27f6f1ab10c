//! Per-connection deadlines the protocol libraries do not give: a connection with no request in flight (before its first request head is complete, or idle between requests, or HTTP/2 with no open stream) is closed after a deadline, and a request body must arrive within its own deadline.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one connection is doing: how many requests are in flight (from a
/// complete request head until its response body ends or is dropped), and
/// since when none has been.
pub(crate) struct ConnState {
    inner: Mutex<Activity>,
    /// Signalled whenever a request begins or the last one ends.
    idle: Notify,
}

struct Activity {
    active: usize,
    idle_since: Instant,
    /// Whether a request head has ever completed on this connection.
    served: bool,
}

impl ConnState {
    pub(crate) fn new() -> Arc<ConnState> {
        Arc::new(ConnState {
            inner: Mutex::new(Activity {
                active: 0,
                idle_since: Instant::now(),
                served: false,
            }),
            idle: Notify::new(),
        })
    }

    /// A request head is complete: the connection is busy until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        let mut a = self.lock();
        a.active += 1;
        a.served = true;
        drop(a);
        // The watchdog re-reads the state (it may be sleeping on a long deadline).
        self.idle.notify_one();
        InFlight(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Activity> {
        // The counters stay meaningful even if a holder panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves once the connection has had no request in flight for
    /// `first` (before any request head completed: the first bytes, the
    /// HTTP/2 preface, a HEADERS block without END_HEADERS) or `idle`
    /// (afterwards). A request in progress, such as a quiet SSE or gRPC
    /// stream, is never idle.
    pub(crate) async fn idle_for(&self, first: Duration, idle: Duration) {
        loop {
            let (active, since, served) = {
                let a = self.lock();
                (a.active, a.idle_since, a.served)
            };
            if active > 0 {
                // Woken when the last request in flight ends.
                self.idle.notified().await;
                continue;
            }
            let limit = if served { idle } else { first };
            tokio::select! {
                _ = tokio::time::sleep_until(since + limit) => {}
                // A request began or ended: read the state again.
                _ = self.idle.notified() => continue,
            }
            let a = self.lock();
            if a.active == 0 && a.idle_since == since {
                return;
            }
        }
    }
}

/// One request in flight; dropping it (the response body ended or was
/// dropped, or the request was abandoned) may make the connection idle.
pub(crate) struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut a = self.0.lock();
        a.active = a.active.saturating_sub(1);
        if a.active == 0 {
            a.idle_since = Instant::now();
            drop(a);
            self.0.idle.notify_one();
        }
    }
}

/// A response body that keeps its request counted as in flight until it ends.
pub(crate) struct Tracked<B> {
    inner: B,
    _guard: InFlight,
}

impl<B> Tracked<B> {
    pub(crate) fn new(inner: B, guard: InFlight) -> Self {
        Tracked { inner, _guard: guard }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error a request body yields once its deadline has passed.
#[derive(Debug)]
pub(crate) struct BodyTimeout(pub Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {}",
            humantime::format_duration(self.0)
        )
    }
}

impl std::error::Error for BodyTimeout {}

/// A request body that must be complete within `limit` of its request head.
/// `timed_out` records that the deadline cut it, so the response can say so.
pub(crate) struct DeadlineBody<B> {
    inner: B,
    limit: Duration,
    deadline: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
    done: bool,
}

impl<B> DeadlineBody<B> {
    pub(crate) fn new(inner: B, limit: Duration, timed_out: Arc<AtomicBool>) -> Self {
        DeadlineBody {
            inner,
            limit,
            deadline: Instant::now() + limit,
            sleep: None,
            timed_out,
            done: false,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(r)) => Poll::Ready(Some(r.map_err(Into::into))),
            Poll::Pending => {
                let deadline = self.deadline;
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.done = true;
                        self.timed_out.store(true, Ordering::SeqCst);
                        Poll::Ready(Some(Err(Box::new(BodyTimeout(self.limit)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts an event that may happen thousands of times a second and says when
/// to log it: at most once a second, with how many happened since the last line.
#[derive(Default)]
pub(crate) struct Tally {
    pending: u64,
    last: Option<Instant>,
}

impl Tally {
    /// Counts one; returns the count to log now, if a line is due.
    pub(crate) fn hit(&mut self) -> Option<u64> {
        self.pending += 1;
        let now = Instant::now();
        match self.last {
            Some(last) if now < last + Duration::from_secs(1) => None,
            _ => self.take(now),
        }
    }

    /// When the counted-but-unlogged events are due to be logged.
    pub(crate) fn due(&self) -> Option<Instant> {
        (self.pending > 0).then(|| {
            self.last
                .map_or_else(Instant::now, |l| l + Duration::from_secs(1))
        })
    }

    /// The count to log now, if any is due.
    pub(crate) fn flush(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.due() {
            Some(due) if due <= now => self.take(now),
            _ => None,
        }
    }

    fn take(&mut self, now: Instant) -> Option<u64> {
        self.last = Some(now);
        Some(std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tally_logs_at_most_once_a_second_and_counts_the_rest() {
        let mut t = Tally::default();
        assert_eq!(t.hit(), Some(1), "the first one is logged at once");
        for _ in 0..999 {
            assert_eq!(t.hit(), None);
        }
        assert_eq!(t.flush(), None, "not yet a second later");
        tokio::time::sleep_until(t.due().unwrap()).await;
        assert_eq!(t.flush(), Some(999));
        assert_eq!(t.due(), None);
        assert_eq!(t.flush(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_in_flight_is_never_idle() {
        let state = ConnState::new();
        let guard = state.begin();
        let short = Duration::from_millis(10);
        let idle = state.idle_for(short, short);
        tokio::pin!(idle);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), idle.as_mut())
                .await
                .is_err(),
            "an hour with a request in flight is not idle"
        );
        drop(guard);
        let started = Instant::now();
        idle.await;
        assert!(started.elapsed() >= short, "idle only after the timeout");
    }
}
