//! A Connect streaming call as one gRPC call: request envelopes in (the one message of a server stream read first, a client stream's transcoded as it arrives), each gRPC answer frame out as an envelope as the client reads it (so a slow reader holds back the stream exactly as a gRPC one does), and the status as the end-of-stream message.

use super::codec::{
    envelope, too_large, Deframer, Encoding, Transcoder, COMPRESSED, COMPRESS_MIN, END_STREAM,
};
use super::error::{copy_metadata, end_stream, stream_error};
use super::{content_type, grpc_request, Prepared};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Router;
use bytes::BytesMut;
use http_body_util::BodyExt;
use std::pin::Pin;
use tokio::time::{Instant, Sleep};
use tonic::{Code, Status};
use tower::ServiceExt;

pub(super) async fn serve(grpc: Router, prep: Prepared, req: Request, max_body: usize) -> Response {
    let codec = prep.transcoder.codec();
    let (accept, encoding) = {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        (
            Encoding::accepted(header("connect-accept-encoding")),
            Encoding::named(header("connect-content-encoding")),
        )
    };
    let encoding = match encoding {
        Ok(e) => e,
        Err(s) => {
            crate::body::drain(req.into_body()).await;
            return stream_error(Some(codec), &s);
        }
    };
    let deadline = prep.timeout.map(|d| Instant::now() + d);
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(parts, Body::empty());
    let body = if prep.client_streaming {
        Body::from_stream(requests(body, prep.transcoder.clone(), encoding, max_body))
    } else {
        match one_message(body, &prep.transcoder, encoding, max_body).await {
            Ok(message) => Body::from(envelope(0, &message)),
            Err(s) => return stream_error(Some(codec), &s),
        }
    };
    let call = grpc.oneshot(grpc_request(req, body));
    let resp = match deadline {
        Some(at) => match tokio::time::timeout_at(at, call).await {
            Ok(r) => r,
            Err(_) => {
                let s = Status::deadline_exceeded("the call's connect-timeout-ms passed");
                return stream_error(Some(codec), &s);
            }
        },
        None => call.await,
    }
    .unwrap_or_else(|never| match never {});
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::OK;
    let h = out.headers_mut();
    copy_metadata(&parts.headers, h, "");
    h.insert(axum::http::header::CONTENT_TYPE, content_type(true, codec));
    if accept == Encoding::Gzip {
        h.insert("connect-content-encoding", HeaderValue::from_static("gzip"));
    }
    *out.body_mut() = match Status::from_header_map(&parts.headers) {
        // Trailers-only: refused before the first message (a stream cap, no such session).
        Some(s) => Body::from(end_stream(
            (s.code() != Code::Ok).then_some(&s),
            &HeaderMap::new(),
        )),
        None => {
            let answers = Answers {
                body,
                frames: Deframer::new(usize::MAX),
                transcoder: prep.transcoder,
                accept,
                deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
                done: false,
            };
            Body::from_stream(futures_util::stream::unfold(answers, |mut a| async move {
                let chunk = a.next().await?;
                Some((Ok::<_, std::convert::Infallible>(chunk), a))
            }))
        }
    };
    out
}

/// The one request message of a server-streaming call.
async fn one_message(
    body: Body,
    t: &Transcoder,
    encoding: Encoding,
    max_body: usize,
) -> Result<Bytes, Status> {
    let bytes = http_body_util::Limited::new(body, max_body + 5)
        .collect()
        .await
        .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
            Ok(_) => too_large(max_body),
            Err(e) => Status::invalid_argument(format!("the request body could not be read: {e}")),
        })?
        .to_bytes();
    let mut frames = Deframer::new(max_body);
    frames.push(&bytes);
    let Some((flags, payload)) = frames.next()? else {
        return Err(Status::invalid_argument("the request holds no whole message"));
    };
    if frames.pending() > 0 {
        return Err(Status::invalid_argument(
            "this RPC takes exactly one request message",
        ));
    }
    t.request(unpack(flags, payload, encoding, max_body)?)
}

/// A request envelope's message, decompressed.
fn unpack(flags: u8, payload: Bytes, encoding: Encoding, max_body: usize) -> Result<Bytes, Status> {
    if flags & END_STREAM != 0 {
        return Err(Status::invalid_argument(
            "a request stream carries no end-of-stream message",
        ));
    }
    if flags & COMPRESSED == 0 {
        return Ok(payload);
    }
    if encoding == Encoding::Identity {
        return Err(Status::invalid_argument(
            "a compressed message, but connect-content-encoding names none",
        ));
    }
    encoding.decode(payload, max_body)
}

/// A client stream's envelopes as gRPC frames, transcoded as they arrive.
fn requests(
    body: Body,
    t: Transcoder,
    encoding: Encoding,
    max_body: usize,
) -> impl futures_util::Stream<Item = Result<Bytes, Status>> + Send {
    let state = (body, Deframer::new(max_body), t, false);
    futures_util::stream::unfold(state, move |(mut body, mut frames, t, done)| async move {
        if done {
            return None;
        }
        loop {
            match frames.next() {
                Err(s) => return Some((Err(s), (body, frames, t, true))),
                Ok(Some((flags, payload))) => {
                    let item = unpack(flags, payload, encoding, max_body)
                        .and_then(|m| t.request(m))
                        .map(|m| envelope(0, &m));
                    let done = item.is_err();
                    return Some((item, (body, frames, t, done)));
                }
                Ok(None) => {}
            }
            match body.frame().await {
                None if frames.pending() == 0 => return None,
                None => {
                    let s = Status::invalid_argument("the request stream ended inside a message");
                    return Some((Err(s), (body, frames, t, true)));
                }
                Some(Err(e)) => {
                    let s = Status::invalid_argument(format!("the request stream broke off: {e}"));
                    return Some((Err(s), (body, frames, t, true)));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        frames.push(&data);
                    }
                }
            }
        }
    })
}

/// The gRPC answer's frames, re-enveloped as the client reads them.
struct Answers {
    body: Body,
    frames: Deframer,
    transcoder: Transcoder,
    accept: Encoding,
    deadline: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl Answers {
    /// The next bytes for the client: every whole message that has arrived,
    /// or the end-of-stream message; None after that.
    async fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        loop {
            let mut chunk = BytesMut::new();
            loop {
                let message = match self.frames.next() {
                    Ok(Some((_, m))) => self.transcoder.response(m),
                    Ok(None) => break,
                    Err(s) => Err(s),
                };
                match message {
                    Ok(m) if self.accept == Encoding::Gzip && m.len() >= COMPRESS_MIN => {
                        chunk.extend_from_slice(&envelope(COMPRESSED, &self.accept.encode(&m)));
                    }
                    Ok(m) => chunk.extend_from_slice(&envelope(0, &m)),
                    Err(s) => {
                        chunk.extend_from_slice(&self.end(Some(&s), &HeaderMap::new()));
                        return Some(chunk.freeze());
                    }
                }
            }
            if !chunk.is_empty() {
                return Some(chunk.freeze());
            }
            let frame = match &mut self.deadline {
                Some(sleep) => tokio::select! {
                    () = sleep.as_mut() => {
                        let s = Status::deadline_exceeded("the call's connect-timeout-ms passed");
                        return Some(self.end(Some(&s), &HeaderMap::new()));
                    }
                    f = self.body.frame() => f,
                },
                None => self.body.frame().await,
            };
            match frame {
                None => {
                    let s = Status::internal("the service's stream ended without a status");
                    return Some(self.end(Some(&s), &HeaderMap::new()));
                }
                Some(Err(e)) => {
                    let s = Status::internal(format!("the service's stream broke off: {e}"));
                    return Some(self.end(Some(&s), &HeaderMap::new()));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.frames.push(&data),
                    Err(frame) => {
                        let Ok(trailers) = frame.into_trailers() else {
                            continue;
                        };
                        return Some(match Status::from_header_map(&trailers) {
                            Some(s) if s.code() == Code::Ok => self.end(None, &trailers),
                            // The status's metadata holds the other trailers.
                            Some(s) => self.end(Some(&s), &HeaderMap::new()),
                            None => self.end(
                                Some(&Status::internal("the service's stream ended without a status")),
                                &trailers,
                            ),
                        });
                    }
                },
            }
        }
    }

    fn end(&mut self, error: Option<&Status>, trailers: &HeaderMap) -> Bytes {
        self.done = true;
        end_stream(error, trailers)
    }
}
