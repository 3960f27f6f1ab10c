//! gRPC-web end to end over HTTP/1.1 with a plain HTTP client: the framing (binary and text)
//! is built and parsed here by hand, as a browser library would, with no gRPC library involved.

use crate::support::*;
use futures_util::StreamExt;
use prost::Message;
use vak::proto::v1 as pb;

const BINARY: &str = "application/grpc-web+proto";
const TEXT: &str = "application/grpc-web-text";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Binary,
    Text,
}

impl Mode {
    fn content_type(self) -> &'static str {
        match self {
            Mode::Binary => BINARY,
            Mode::Text => TEXT,
        }
    }
}

// ---- base64 (standard alphabet, padded), written out so no codec is shared with the server ----

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes one 4-character quantum (which may end in padding). gRPC-web-text bodies may be
/// several separately padded base64 runs back to back, so decoding goes quantum by quantum.
fn b64_quantum(q: &[u8], out: &mut Vec<u8>) {
    assert_eq!(q.len(), 4, "base64 comes in quanta of 4: {q:?}");
    let val = |c: u8| -> u32 {
        ALPHABET
            .iter()
            .position(|&a| a == c)
            .unwrap_or_else(|| panic!("not base64: {:?}", c as char)) as u32
    };
    let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
    assert!(pad <= 2, "bad padding in {q:?}");
    let mut n = 0u32;
    for &c in &q[..4 - pad] {
        n = (n << 6) | val(c);
    }
    n <<= 6 * pad as u32;
    let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
    out.extend_from_slice(&bytes[..3 - pad]);
}

fn b64_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for q in text.chunks(4) {
        b64_quantum(q, &mut out);
    }
    out
}

// ---- gRPC-web frames -----------------------------------------------------------------------

/// One message in the 5-byte-prefixed framing: flag 0 for data, 0x80 for trailers.
fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits complete frames off the front of `buf`.
fn take_frames(buf: &mut Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        if buf.len() < 5 {
            return out;
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            return out;
        }
        let flag = buf[0];
        let payload = buf[5..5 + len].to_vec();
        buf.drain(..5 + len);
        out.push((flag, payload));
    }
}

/// A trailer frame's `name:value` lines as pairs, names lowercased.
fn parse_trailers(payload: &[u8]) -> Vec<(String, String)> {
    String::from_utf8(payload.to_vec())
        .expect("trailers are text")
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("malformed trailer {l:?}"));
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect()
}

/// A gRPC-web response read as it arrives: data messages first, then one trailer frame.
struct WebStream {
    mode: Mode,
    headers: reqwest::header::HeaderMap,
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    /// Raw (still base64 in text mode) bytes not decoded yet.
    raw: Vec<u8>,
    /// Decoded bytes not yet split into frames.
    buf: Vec<u8>,
    pending: std::collections::VecDeque<(u8, Vec<u8>)>,
    trailers: Option<Vec<(String, String)>>,
}

impl WebStream {
    async fn call(s: &TestServer, mode: Mode, method: &str, msg: &impl Message, token: Option<&str>) -> Self {
        let mut body = frame(0, &msg.encode_to_vec());
        if mode == Mode::Text {
            body = b64_encode(&body).into_bytes();
        }
        let mut req = reqwest::Client::new()
            .post(format!("{}/vak.v1.AgentService/{method}", s.url))
            .header("content-type", mode.content_type())
            .header("accept", mode.content_type())
            .header("x-grpc-web", "1")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = tokio::time::timeout(DEADLINE, req.send())
            .await
            .expect("a gRPC-web answer within the deadline")
            .unwrap();
        assert_eq!(
            resp.status(),
            200,
            "gRPC-web reports errors in grpc-status, not HTTP"
        );
        assert_eq!(resp.version(), reqwest::Version::HTTP_11);
        WebStream {
            mode,
            headers: resp.headers().clone(),
            body: resp.bytes_stream().boxed(),
            raw: Vec::new(),
            buf: Vec::new(),
            pending: Default::default(),
            trailers: None,
        }
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_string())
    }

    /// The next frame; None at the end of the body. Panics past the deadline.
    async fn next_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some(f) = self.pending.pop_front() {
                    return Some(f);
                }
                match self.body.next().await {
                    Some(chunk) => {
                        let chunk = chunk.expect("the body streams without error");
                        match self.mode {
                            Mode::Binary => self.buf.extend_from_slice(&chunk),
                            Mode::Text => {
                                self.raw.extend_from_slice(&chunk);
                                let whole = self.raw.len() / 4 * 4;
                                let quanta: Vec<u8> = self.raw.drain(..whole).collect();
                                self.buf.extend(b64_decode(&quanta));
                            }
                        }
                        self.pending.extend(take_frames(&mut self.buf));
                    }
                    None => {
                        assert!(
                            self.raw.is_empty() && self.buf.is_empty(),
                            "the body ended inside a frame"
                        );
                        return None;
                    }
                }
            }
        })
        .await
        .expect("a gRPC-web frame within the deadline")
    }

    /// The next data message decoded as `M`; panics if the trailers (or the end) come first.
    async fn message<M: Message + Default>(&mut self) -> M {
        match self.next_frame().await {
            Some((0, payload)) => M::decode(payload.as_slice()).expect("a well-formed message"),
            Some((0x80, t)) => panic!("trailers before a message: {:?}", parse_trailers(&t)),
            other => panic!("expected a data frame, got {other:?}"),
        }
    }

    /// Reads to the end: every remaining data message, then the trailers, which must be last.
    async fn finish<M: Message + Default>(&mut self) -> Vec<M> {
        let mut msgs = Vec::new();
        while let Some((flag, payload)) = self.next_frame().await {
            assert!(self.trailers.is_none(), "nothing may follow the trailer frame");
            match flag {
                0 => msgs.push(M::decode(payload.as_slice()).expect("a well-formed message")),
                0x80 => self.trailers = Some(parse_trailers(&payload)),
                f => panic!("unknown frame flag {f:#x}"),
            }
        }
        msgs
    }

    /// grpc-status from the trailer frame or, for a trailers-only answer, the headers.
    fn grpc_status(&self) -> Option<String> {
        self.trailers
            .as_ref()
            .and_then(|t| t.iter().find(|(k, _)| k == "grpc-status").map(|(_, v)| v.clone()))
            .or_else(|| self.header("grpc-status"))
    }
}

async fn create_session_over_grpc_web(mode: Mode) {
    let s = TestServer::start().await;
    let mut r = WebStream::call(
        &s,
        mode,
        "CreateSession",
        &pb::CreateSessionRequest::default(),
        Some(TOKEN),
    )
    .await;
    let ct = r.header("content-type").unwrap_or_default();
    assert!(
        ct.starts_with(mode.content_type()),
        "answered in the dialect asked: {ct:?}"
    );
    let msgs: Vec<pb::CreateSessionResponse> = r.finish().await;
    assert_eq!(msgs.len(), 1, "one response message");
    let trailers = r.trailers.clone().expect("a trailer frame ends the body");
    assert!(
        trailers.contains(&("grpc-status".into(), "0".into())),
        "grpc-status:0 in the trailer frame: {trailers:?}"
    );
    let sid = &msgs[0].session_id;
    assert!(!sid.is_empty());

    // The session is real: REST lists it.
    let (code, list) = s.get("/sessions").await;
    assert_eq!(code, 200);
    assert_eq!(list["sessions"][0]["session_id"], sid.as_str());
}

#[tokio::test]
async fn create_session_over_grpc_web_binary_returns_a_message_then_an_ok_trailer() {
    create_session_over_grpc_web(Mode::Binary).await;
}

#[tokio::test]
async fn create_session_over_grpc_web_text_returns_a_base64_message_then_an_ok_trailer() {
    create_session_over_grpc_web(Mode::Text).await;
}

async fn subscribe_over_grpc_web(mode: Mode) {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let req = pb::SubscribeRequest {
        session_id: sid.clone(),
        after: None,
    };
    let mut stream = WebStream::call(&s, mode, "Subscribe", &req, Some(TOKEN)).await;
    let first: pb::Event = stream.message().await;
    assert_eq!(first.seq, 0);
    match &first.kind {
        Some(pb::event::Kind::StreamOpened(o)) => {
            assert_eq!((o.session_id.as_str(), o.latest_seq), (sid.as_str(), 0))
        }
        other => panic!("the first message must be stream_opened, got {other:?}"),
    }

    let (code, adm) = s.run(&sid, "hello world").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")));
    let mut events = Vec::new();
    loop {
        let e: pb::Event = stream.message().await;
        let done = kind_of(&e) == "run_finished";
        events.push(e);
        if done {
            break;
        }
    }
    assert_grpc_numbered(&events);
    assert_eq!(events[0].seq, 1);
    assert!(events.iter().all(|e| e.session_id == sid));
    assert_eq!(grpc_text_of(&events), "echo: hello world");
    assert_eq!(outcome_of(events.last().unwrap()), "completed");
    assert_eq!(
        events.iter().map(kind_of).collect::<Vec<_>>(),
        [
            "status",
            "user_message",
            "turn_started",
            "text_delta",
            "text_delta",
            "text_delta",
            "status",
            "run_finished"
        ]
    );
}

#[tokio::test]
async fn subscribe_over_grpc_web_binary_streams_the_events_of_a_rest_run() {
    subscribe_over_grpc_web(Mode::Binary).await;
}

#[tokio::test]
async fn subscribe_over_grpc_web_text_streams_the_events_of_a_rest_run() {
    subscribe_over_grpc_web(Mode::Text).await;
}

#[tokio::test]
async fn errors_over_grpc_web_arrive_as_grpc_status() {
    let s = TestServer::start().await;
    let run = pb::RunRequest {
        session_id: "nosuch".into(),
        prompt: "x".into(),
        ..Default::default()
    };
    for mode in [Mode::Binary, Mode::Text] {
        let mut r = WebStream::call(&s, mode, "Run", &run, Some(TOKEN)).await;
        let msgs: Vec<pb::Admission> = r.finish().await;
        assert!(msgs.is_empty(), "{mode:?}: no message on error");
        assert_eq!(r.grpc_status().as_deref(), Some("5"), "{mode:?}: NOT_FOUND");
    }
}

#[tokio::test]
async fn grpc_web_without_the_token_is_unauthenticated() {
    let s = TestServer::start().await;
    for mode in [Mode::Binary, Mode::Text] {
        for token in [None, Some("wrong")] {
            let mut r = WebStream::call(
                &s,
                mode,
                "CreateSession",
                &pb::CreateSessionRequest::default(),
                token,
            )
            .await;
            let msgs: Vec<pb::CreateSessionResponse> = r.finish().await;
            assert!(msgs.is_empty(), "{mode:?} {token:?}: nothing created");
            assert_eq!(
                r.grpc_status().as_deref(),
                Some("16"),
                "{mode:?} {token:?}: UNAUTHENTICATED in headers or trailers"
            );
        }
        let sub = pb::SubscribeRequest {
            session_id: "whatever".into(),
            after: None,
        };
        let mut r = WebStream::call(&s, mode, "Subscribe", &sub, None).await;
        let msgs: Vec<pb::Event> = r.finish().await;
        assert!(msgs.is_empty());
        assert_eq!(r.grpc_status().as_deref(), Some("16"), "{mode:?}: Subscribe");
    }
    let (_, list) = s.get("/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn a_refused_grpc_web_call_is_answered_in_the_grpc_web_dialect() {
    // Browser libraries check the content type before grpc-status: connect-web, for one,
    // turns a response labelled plain `application/grpc` into INTERNAL "unexpected response
    // content type", so the user never learns the token was missing.
    let s = TestServer::start().await;
    for mode in [Mode::Binary, Mode::Text] {
        let r = WebStream::call(
            &s,
            mode,
            "CreateSession",
            &pb::CreateSessionRequest::default(),
            None,
        )
        .await;
        let ct = r.header("content-type").unwrap_or_default();
        assert!(
            ct.starts_with(mode.content_type()),
            "{mode:?}: a refusal of a gRPC-web call must be labelled {}, got {ct:?}",
            mode.content_type()
        );
    }
}
