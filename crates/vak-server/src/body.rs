//! A response body passed through untouched to a watcher that sees each frame and the end, and lives exactly as long as the body: the access-log line, a stream permit.

use axum::body::{Body, Bytes, HttpBody};
use std::pin::Pin;
use std::task::{Context, Poll};

/// What rides along a response body.
pub(crate) trait Watch: Send + Unpin + 'static {
    /// A frame on its way out (data or trailers).
    fn frame(&mut self, _frame: &http_body::Frame<Bytes>) {}
    /// The body ended (called at most once before the watcher is dropped,
    /// and not at all when the client cut the body short).
    fn end(&mut self) {}
}

struct Watched<W: Watch> {
    inner: Body,
    watch: W,
    ended: bool,
}

impl<W: Watch> Watched<W> {
    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            self.watch.end();
        }
    }
}

/// `body` with `watch` riding along.
pub(crate) fn watched<W: Watch>(body: Body, watch: W) -> Body {
    Body::new(Watched {
        inner: body,
        watch,
        ended: false,
    })
}

impl<W: Watch> HttpBody for Watched<W> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => self.watch.frame(frame),
            Poll::Ready(None) => self.end(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<W: Watch> Drop for Watched<W> {
    fn drop(&mut self) {
        // hyper stops polling once a body says it is at its end.
        if self.inner.is_end_stream() {
            self.end();
        }
    }
}
