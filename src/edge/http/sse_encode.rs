//! The one SSE encoder: frames as `id:`/`event:`/`data:` lines, `retry:` first, a keepalive comment after a quiet spell, and the headers every event stream carries.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use std::convert::Infallible;
use std::time::Duration;

/// A comment is sent after this long without a frame, so proxies and
/// clients see a live connection.
pub const KEEPALIVE: Duration = Duration::from_secs(15);
/// How soon an EventSource should reconnect after a cut (it waits ~3 s
/// unless told otherwise).
const RETRY: &[u8] = b"retry: 1000\n";
const KEEPALIVE_COMMENT: &[u8] = b": keepalive\n\n";

/// Appends one frame: `id:` when given, `event:`, and the JSON as one
/// `data:` line (compact JSON never contains a raw newline).
pub fn write_frame(out: &mut BytesMut, name: &str, id: Option<&str>, json: &[u8]) {
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}

/// One frame on its own.
pub fn frame(name: &str, id: Option<&str>, json: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(json.len() + name.len() + 32);
    write_frame(&mut out, name, id, json);
    out.freeze()
}

/// Encoded chunks (one or more frames each) as a `text/event-stream`
/// response: `retry:` first, a keepalive comment whenever the chunks pause
/// for `KEEPALIVE`, no caching and no proxy buffering.
pub fn response<S>(chunks: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let chunks = Box::pin(chunks);
    let body = futures_util::stream::unfold(Some(chunks), |state| async move {
        let mut chunks = state?;
        tokio::select! {
            next = chunks.next() => next.map(|b| (Ok::<_, Infallible>(b), Some(chunks))),
            _ = tokio::time::sleep(KEEPALIVE) => Some((Ok(Bytes::from_static(KEEPALIVE_COMMENT)), Some(chunks))),
        }
    });
    let body = futures_util::stream::once(std::future::ready(Ok(Bytes::from_static(RETRY)))).chain(body);
    let mut resp = Body::from_stream(body).into_response();
    // On HTTP/1.1 the stream may leave hyper once its head is out (`edge::handoff`).
    resp.extensions_mut().insert(crate::edge::handoff::LongLived);
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
        let resp = response(futures_util::stream::pending::<Bytes>());
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let mut body = resp.into_body().into_data_stream();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], RETRY);
        let start = tokio::time::Instant::now();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], KEEPALIVE_COMMENT);
        assert_eq!(start.elapsed(), KEEPALIVE);
    }
}
