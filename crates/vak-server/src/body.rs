//! Bodies on their way through the edge: a response body passed untouched to a watcher that sees each frame and the end and lives exactly as long as the body (the access-log line, a stream permit), and the bounded drain of a refused request's body.

use axum::body::{Body, Bytes, HttpBody};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

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

/// How much of a refused request's body is read (and dropped) before its answer.
const DRAIN_BYTES: usize = 64 << 10;

/// How long a refused request's body is read before the answer goes anyway.
const DRAIN_FOR: Duration = Duration::from_secs(1);

/// Reads what a refused request sent (at most `DRAIN_BYTES`, for at most
/// `DRAIN_FOR`) and drops it. Over HTTP/1.1 hyper polls an unread request
/// body once after the answer and closes the connection if it has not all
/// arrived, without saying so in the answer; a client that writes its body
/// after the headers (Node's HTTP client, connect-node) then gets EPIPE
/// instead of the answer, or its next call on the pooled connection does.
pub(crate) async fn drain(body: Body) {
    use futures_util::StreamExt;
    let mut data = body.into_data_stream();
    let read = async {
        let mut left = DRAIN_BYTES;
        while let Some(Ok(chunk)) = data.next().await {
            left = left.saturating_sub(chunk.len());
            if left == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, read).await;
}
