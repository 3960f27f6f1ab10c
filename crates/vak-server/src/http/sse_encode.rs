//! The one SSE encoder: frames as `id:`/`event:`/`data:` lines, `retry:` first, a keepalive comment after a quiet spell (one shared clock for every stream), and the headers every event stream carries.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
pub(crate) use vak_proto::sse::{frame, write_frame, write_head, FRAME_END};

/// A comment is sent after this long without a frame, so proxies and
/// clients see a live connection.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);
/// The shared clock's period: a keepalive comes between `KEEPALIVE` and
/// `KEEPALIVE + TICK` after the last chunk, then every `KEEPALIVE`.
pub(crate) const TICK: Duration = Duration::from_secs(1);
const QUIET_TICKS: u64 = KEEPALIVE.as_secs() / TICK.as_secs();
/// Wake-up lists by due tick, modulo: a due tick is at most
/// `QUIET_TICKS + 1` ahead, so no two pending ticks share a slot.
const SLOTS: usize = 32;
const _: () = assert!(QUIET_TICKS as usize + 1 < SLOTS);
/// How soon an EventSource should reconnect after a cut (it waits ~3 s
/// unless told otherwise).
const RETRY: &[u8] = b"retry: 1000\n";
const KEEPALIVE_COMMENT: &[u8] = b": keepalive\n\n";

/// The keepalive clock a server's event streams share: one task ticks it
/// every `TICK` and wakes the streams whose quiet spell is over, so an idle
/// stream holds no timer of its own (a `Sleep` per stream, re-armed for
/// every chunk, was a tenth of an idle stream's memory and a timer insert
/// and removal per chunk sent).
#[derive(Clone)]
pub struct Keepalive(Arc<Clock>);

struct Clock {
    /// Ticks since the clock started; advanced under `slots`' lock, so a
    /// wake-up is armed either before its tick is taken or not at all.
    now: AtomicU64,
    slots: Mutex<[Vec<Waker>; SLOTS]>,
}

impl Keepalive {
    /// Starts the clock on the current runtime; its task ends once the last
    /// handle (and every stream using it) is gone.
    pub fn start() -> Keepalive {
        let clock = Arc::new(Clock {
            now: AtomicU64::new(0),
            slots: Mutex::new(std::array::from_fn(|_| Vec::new())),
        });
        let weak = Arc::downgrade(&clock);
        tokio::spawn(async move {
            let mut every = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
            // A late tick makes keepalives late, never early.
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(clock) = weak.upgrade() else { return };
                clock.advance();
            }
        });
        Keepalive(clock)
    }
}

impl Clock {
    fn lock(&self) -> MutexGuard<'_, [Vec<Waker>; SLOTS]> {
        // Wakers only: still usable if a holder panicked.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    fn advance(&self) {
        let due = {
            let mut slots = self.lock();
            let now = self.now.load(Ordering::Relaxed) + 1;
            self.now.store(now, Ordering::Release);
            std::mem::take(&mut slots[now as usize % SLOTS])
        };
        for waker in due {
            waker.wake();
        }
    }

    /// Wakes `waker` at tick `due`; false if that tick has come already.
    fn arm(&self, due: u64, waker: &Waker) -> bool {
        let mut slots = self.lock();
        if self.now.load(Ordering::Relaxed) >= due {
            return false;
        }
        slots[due as usize % SLOTS].push(waker.clone());
        true
    }
}

pin_project_lite::pin_project! {
    /// An event stream's body: `retry:` first, then the chunks, and a
    /// keepalive comment whenever they have paused for `KEEPALIVE`. The
    /// chunk stream is held inline: one allocation for the whole body.
    struct EventStream<S> {
        #[pin]
        chunks: S,
        clock: Arc<Clock>,
        // The tick at which a keepalive is due unless a chunk goes first.
        due: u64,
        // The tick a wake-up is armed for on the clock (0: none yet), and
        // the waker it wakes. A chunk moves `due` but not the wake-up: when
        // it fires early the stream arms the next one, so a busy stream
        // touches the clock about once per `KEEPALIVE`, not per chunk.
        armed: u64,
        waker: Option<Waker>,
        retry_sent: bool,
        ended: bool,
    }
}

impl<S: Stream<Item = Bytes>> http_body::Body for EventStream<S> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let this = self.project();
        let data = |b: Bytes| Poll::Ready(Some(Ok(http_body::Frame::data(b))));
        if !*this.retry_sent {
            *this.retry_sent = true;
            return data(Bytes::from_static(RETRY));
        }
        if *this.ended {
            return Poll::Ready(None);
        }
        match this.chunks.poll_next(cx) {
            Poll::Ready(Some(chunk)) => {
                // Sent somewhere within the current tick: a full KEEPALIVE
                // of quiet has passed only after QUIET_TICKS more whole ones.
                *this.due = this.clock.now() + QUIET_TICKS + 1;
                return data(chunk);
            }
            Poll::Ready(None) => {
                *this.ended = true;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        let now = this.clock.now();
        if now < *this.due {
            let still_armed =
                *this.armed > now && this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
            if still_armed {
                return Poll::Pending;
            }
            if this.clock.arm(*this.due, cx.waker()) {
                *this.armed = *this.due;
                *this.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        // Sent on (about) the tick itself: the next is due a KEEPALIVE later.
        *this.due = this.clock.now() + QUIET_TICKS;
        data(Bytes::from_static(KEEPALIVE_COMMENT))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// Encoded chunks (one or more frames each) as a `text/event-stream`
/// response: `retry:` first, a keepalive comment whenever the chunks pause
/// for `KEEPALIVE` (on `keepalive`'s clock), no caching and no proxy
/// buffering.
pub(crate) fn response<S>(chunks: S, keepalive: &Keepalive) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let clock = keepalive.0.clone();
    let due = clock.now() + QUIET_TICKS + 1;
    let body = EventStream {
        chunks,
        clock,
        due,
        armed: 0,
        waker: None,
        retry_sent: false,
        ended: false,
    };
    let mut resp = Body::new(body).into_response();
    // On HTTP/1.1 the stream may leave hyper once its head is out (`edge::handoff`).
    resp.extensions_mut().insert(crate::handoff::LongLived);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::time::Instant;

    #[test]
    fn a_frame_is_id_event_and_one_data_line() {
        assert_eq!(
            &frame("status", Some("7"), br#"{"a":1}"#)[..],
            b"id: 7\nevent: status\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(&frame("resync", None, b"{}")[..], b"event: resync\ndata: {}\n\n");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_comes_first_and_a_quiet_stream_gets_keepalives() {
        let keepalive = Keepalive::start();
        let resp = response(futures_util::stream::pending::<Bytes>(), &keepalive);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let mut body = resp.into_body().into_data_stream();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], RETRY);
        let start = Instant::now();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], KEEPALIVE_COMMENT);
        let quiet = start.elapsed();
        assert!(quiet >= KEEPALIVE && quiet <= KEEPALIVE + TICK, "{quiet:?}");
        // Then one every KEEPALIVE.
        for _ in 0..3 {
            let start = Instant::now();
            assert_eq!(&body.next().await.unwrap().unwrap()[..], KEEPALIVE_COMMENT);
            assert_eq!(start.elapsed(), KEEPALIVE);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_keepalive_while_chunks_flow_and_one_after_they_stop() {
        let keepalive = Keepalive::start();
        let gap = KEEPALIVE - TICK - Duration::from_millis(300);
        let chunks = futures_util::stream::iter(0..8).then(move |i| async move {
            tokio::time::sleep(gap).await;
            Bytes::from(format!("data: {i}\n\n"))
        });
        let chunks = chunks.chain(futures_util::stream::pending());
        let mut body = response(chunks, &keepalive).into_body().into_data_stream();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], RETRY);
        for i in 0..8 {
            let got = body.next().await.unwrap().unwrap();
            assert_eq!(got, format!("data: {i}\n\n"), "chunk {i}");
        }
        let start = Instant::now();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], KEEPALIVE_COMMENT);
        let quiet = start.elapsed();
        assert!(quiet >= KEEPALIVE && quiet <= KEEPALIVE + TICK, "{quiet:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn streams_share_one_clock_and_each_keeps_its_own_quiet_spell() {
        let keepalive = Keepalive::start();
        let mut a = response(futures_util::stream::pending::<Bytes>(), &keepalive)
            .into_body()
            .into_data_stream();
        assert_eq!(&a.next().await.unwrap().unwrap()[..], RETRY);
        // Half-way through a tick, so which of the two wakes first at the
        // same instant does not matter.
        tokio::time::sleep(Duration::from_millis(7500)).await;
        let mut b = response(futures_util::stream::pending::<Bytes>(), &keepalive)
            .into_body()
            .into_data_stream();
        assert_eq!(&b.next().await.unwrap().unwrap()[..], RETRY);
        let start = Instant::now();
        let (a_at, b_at) = tokio::join!(
            async {
                a.next().await.unwrap().unwrap();
                start.elapsed()
            },
            async {
                b.next().await.unwrap().unwrap();
                start.elapsed()
            }
        );
        // a: due at tick 16; b, opened within tick 7, at tick 23.
        assert_eq!(a_at, Duration::from_millis(8500));
        assert_eq!(b_at, Duration::from_millis(15500));
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_stops_with_its_last_handle() {
        let keepalive = Keepalive::start();
        let weak = Arc::downgrade(&keepalive.0);
        let body = response(futures_util::stream::pending::<Bytes>(), &keepalive).into_body();
        drop(keepalive);
        tokio::time::sleep(TICK * 3).await;
        assert!(weak.upgrade().is_some(), "a stream still uses it");
        drop(body);
        assert!(weak.upgrade().is_none());
    }
}
