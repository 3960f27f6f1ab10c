//! HTTP/1.1 event streams leave hyper once their head and first frames are out: the connection's parser, read and write buffers and service are dropped, and a small writer keeps only the socket and the response body (most of an idle SSE stream's memory was hyper's).

use axum::body::Body;
use bytes::{Buf, Bytes};
use http_body::Body as _;
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A response extension set by a handler whose body is a long-lived event
/// stream: on HTTP/1.1 it may leave hyper (`Parkable`, `Writer`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LongLived;

/// Where a connection's long-lived response body waits for the connection
/// task to take it over, and whether hyper has flushed since. One per
/// connection.
#[derive(Clone, Default)]
pub(crate) struct Park(Arc<Parked>);

#[derive(Default)]
struct Parked {
    body: Mutex<Option<Body>>,
    /// Bytes hyper holds or wrote may not have reached the socket yet: set
    /// when the body parks and on every write, cleared by a completed flush
    /// (hyper flushes its IO only once its own write buffer is empty).
    unflushed: AtomicBool,
}

impl Park {
    fn lock(&self) -> MutexGuard<'_, Option<Body>> {
        self.0.body.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a body is parked and everything before it is on the socket.
    pub(crate) fn ready(&self) -> bool {
        !self.0.unflushed.load(Ordering::Acquire) && self.lock().is_some()
    }

    pub(crate) fn take(&self) -> Option<Body> {
        self.lock().take()
    }

    fn park(&self, body: Option<Body>) {
        self.0.unflushed.store(true, Ordering::Release);
        *self.lock() = body;
    }
}

/// A response body that yields its frames to hyper until the first time it
/// has nothing to send (after at least one frame, so the head goes out with
/// it); then it moves its inner body to the `Park` and stays pending: the
/// connection task sees it there once hyper has flushed, and drops hyper.
pub(crate) struct Parkable {
    inner: Option<Body>,
    park: Park,
    sent: bool,
}

impl Parkable {
    pub(crate) fn new(inner: Body, park: Park) -> Self {
        Parkable {
            inner: Some(inner),
            park,
            sent: false,
        }
    }
}

impl http_body::Body for Parkable {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Pending;
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                this.sent = true;
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Pending if this.sent => {
                this.park.park(this.inner.take());
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_some_and(|b| b.is_end_stream())
    }
}

/// The connection's IO as hyper sees it, shared with the connection task so
/// the task can take it back once hyper is dropped; it tells the `Park`
/// when hyper writes and when a flush completes.
pub(crate) struct SharedIo<T> {
    io: Arc<Mutex<T>>,
    park: Park,
}

impl<T> SharedIo<T> {
    pub(crate) fn new(io: T, park: Park) -> (SharedIo<T>, Arc<Mutex<T>>) {
        let io = Arc::new(Mutex::new(io));
        (SharedIo { io: io.clone(), park }, io)
    }

    fn io(&self) -> MutexGuard<'_, T> {
        self.io.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wrote(&self) {
        self.park.0.unflushed.store(true, Ordering::Release);
    }
}

/// The IO back, once hyper (its other owner) has been dropped.
pub(crate) fn reclaim<T>(io: Arc<Mutex<T>>) -> Option<T> {
    Arc::into_inner(io).map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
}

impl<T: AsyncRead + Unpin> AsyncRead for SharedIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io()).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SharedIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.wrote();
        Pin::new(&mut *self.io()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.wrote();
        Pin::new(&mut *self.io()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut *self.io()).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.park.0.unflushed.store(false, Ordering::Release);
        }
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io()).poll_shutdown(cx)
    }
}

/// Slices gathered for one vectored write (each chunk takes three: size
/// line, data, CRLF).
const MAX_SLICES: usize = 64;
/// Bytes gathered from the body before they are written.
const MAX_QUEUED: usize = 256 * 1024;
/// What a client may send once its stream has left hyper (it can only be a
/// request pipelined behind a stream that never ends, which nobody would
/// answer): beyond this the connection is closed.
const MAX_RECEIVED: usize = 64 * 1024;
const CRLF: &[u8] = b"\r\n";
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes the rest of an HTTP/1.1 response body whose head hyper already
/// sent with `Transfer-Encoding: chunked`: chunks as hyper frames them, the
/// last chunk when the body ends (then the connection closes), and nothing
/// more (the connection just drops, as hyper does) if the body fails. A
/// client that closes its side, or an IO error (the write timeout beneath),
/// ends it and drops the body.
pub(crate) struct Writer<T> {
    io: T,
    body: Body,
    queue: VecDeque<Bytes>,
    queued: usize,
    received: usize,
    ended: bool,
    unflushed: bool,
}

impl<T> Writer<T> {
    pub(crate) fn new(io: T, body: Body) -> Self {
        Writer {
            io,
            body,
            queue: VecDeque::new(),
            queued: 0,
            received: 0,
            ended: false,
            unflushed: false,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Writer<T> {
    /// Ready when the client has gone (EOF, an error, or too much sent).
    fn poll_client(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut buf = [0u8; 64];
        loop {
            let mut rb = ReadBuf::new(&mut buf);
            match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => {
                    self.received += rb.filled().len();
                    if self.received > MAX_RECEIVED {
                        tracing::debug!(
                            "a client sent {} bytes behind its event stream; closed",
                            self.received
                        );
                        return Poll::Ready(());
                    }
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn push(&mut self, b: Bytes) {
        self.queued += b.len();
        self.queue.push_back(b);
    }

    /// Takes what the body has ready into the queue; Ready(false) if the body failed.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        while !self.ended && self.queue.len() + 3 <= MAX_SLICES && self.queued < MAX_QUEUED {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    self.push(Bytes::from(format!("{:X}\r\n", data.len())));
                    self.push(data);
                    self.push(Bytes::from_static(CRLF));
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!("event stream body failed: {e}");
                    return Poll::Ready(false);
                }
                Poll::Ready(None) => {
                    self.push(Bytes::from_static(LAST_CHUNK));
                    self.ended = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(true)
    }

    /// Writes the whole queue.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.queue.is_empty() {
            let n = {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let mut k = 0;
                for (slot, b) in slices.iter_mut().zip(self.queue.iter()) {
                    *slot = IoSlice::new(b);
                    k += 1;
                }
                std::task::ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..k]))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.unflushed = true;
            self.queued -= n;
            let mut left = n;
            while left > 0 {
                let front = self.queue.front_mut().expect("written bytes were queued");
                if front.len() <= left {
                    left -= front.len();
                    self.queue.pop_front();
                } else {
                    front.advance(left);
                    left = 0;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Future for Writer<T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            if this.poll_client(cx).is_ready() {
                return Poll::Ready(());
            }
            let body_pending = match this.fill(cx) {
                Poll::Ready(false) => return Poll::Ready(()),
                Poll::Ready(true) => false,
                Poll::Pending => true,
            };
            match this.poll_drain(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
            if this.unflushed {
                match Pin::new(&mut this.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => this.unflushed = false,
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if this.ended {
                let _ = std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx));
                return Poll::Ready(());
            }
            if body_pending {
                if this.queue.capacity() > 4 {
                    // A burst grew it; a quiet stream keeps nothing.
                    this.queue = VecDeque::new();
                }
                return Poll::Pending;
            }
        }
    }
}
