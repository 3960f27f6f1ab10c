//! The Connect protocol's streaming calls on the one port, the envelopes built and read here by hand: Subscribe, Stream and PresentationEvents in JSON and binary over HTTP/1.1 and HTTP/2, the end-of-stream message (a clean end, an error, a timeout), gzip per message, a slow reader merged losslessly, the stream caps and a cancelled stream's permit, and a bidi stream (reflection) as `buf curl` uses it. Conformance case names: see connect.rs.

use crate::connect::SERVICE;
use crate::support::*;
use futures_util::StreamExt;
use prost::Message;
use serde_json::{json, Value};
use std::io::Read;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vak::proto::v1 as pb;

const COMPRESSED: u8 = 1;
const END: u8 = 2;

fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![flags];
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b
}

/// Splits bytes into envelopes as they arrive.
#[derive(Default)]
struct Deframer(Vec<u8>);

impl Deframer {
    fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        if self.0.len() < 5 {
            return None;
        }
        let len = u32::from_be_bytes(self.0[1..5].try_into().unwrap()) as usize;
        if self.0.len() < 5 + len {
            return None;
        }
        let flags = self.0[0];
        let payload = self.0[5..5 + len].to_vec();
        self.0.drain(..5 + len);
        Some((flags, payload))
    }
}

/// A Connect stream's envelopes, each read under the deadline.
pub struct Envelopes {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    frames: Deframer,
}

impl Envelopes {
    fn new(r: reqwest::Response) -> Envelopes {
        assert_eq!(r.status(), 200, "a Connect stream answers 200");
        Envelopes {
            body: r.bytes_stream().boxed(),
            frames: Deframer::default(),
        }
    }

    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if let Some(e) = self.frames.next() {
                return Some(e);
            }
            let chunk = tokio::time::timeout(DEADLINE, self.body.next())
                .await
                .expect("an envelope within the deadline")?;
            self.frames.0.extend_from_slice(&chunk.unwrap());
        }
    }

    /// JSON envelopes up to the one whose event kind is `kind`.
    pub async fn until(&mut self, kind: &str) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let (flags, payload) = self
                .next()
                .await
                .unwrap_or_else(|| panic!("the stream ended before {kind}"));
            assert_eq!(
                flags & END,
                0,
                "ended before {kind}: {}",
                String::from_utf8_lossy(&payload)
            );
            let payload = if flags & COMPRESSED != 0 {
                gunzip(&payload)
            } else {
                payload
            };
            let v: Value = serde_json::from_slice(&payload).unwrap();
            let done = kind_of_json(&v) == kind;
            out.push(v);
            if done {
                return out;
            }
        }
    }
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out).unwrap();
    out
}

/// The oneof of an event in canonical JSON: its one key besides seq and sessionId.
fn kind_of_json(v: &Value) -> &str {
    v.as_object()
        .unwrap()
        .keys()
        .find(|k| !matches!(k.as_str(), "seq" | "sessionId"))
        .map_or("", |k| k.as_str())
}

pub fn text_of_json(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["textDelta"]["text"].as_str())
        .collect()
}

/// Opens `method` as a Connect stream with one request message.
async fn open(
    c: &reqwest::Client,
    s: &TestServer,
    method: &str,
    codec: &str,
    msg: &[u8],
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = c
        .post(format!("{}{SERVICE}/{method}", s.url))
        .bearer_auth(TOKEN)
        .header("content-type", format!("application/connect+{codec}"))
        .header("connect-protocol-version", "1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(envelope(0, msg)).send().await.unwrap()
}

/// Subscribe as a Connect JSON stream, read up to its stream_opened.
pub async fn subscribe_json(
    c: &reqwest::Client,
    s: &TestServer,
    sid: &str,
    headers: &[(&str, &str)],
) -> Envelopes {
    let msg = json!({"sessionId": sid}).to_string();
    let r = open(c, s, "Subscribe", "json", msg.as_bytes(), headers).await;
    assert_eq!(r.headers()["content-type"], "application/connect+json");
    let mut e = Envelopes::new(r);
    let opened = e.until("streamOpened").await;
    assert_eq!(opened.len(), 1, "{opened:?}");
    e
}

#[tokio::test]
async fn subscribe_follows_a_run_in_json_and_binary_over_http1_and_http2() {
    let s = TestServer::start().await;
    let h1 = reqwest::Client::new();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for (client, name) in [(&h1, "HTTP/1.1"), (&h2, "HTTP/2")] {
        // JSON.
        let sid = s.create_session().await;
        let mut events = subscribe_json(client, &s, &sid, &[]).await;
        let (status, body) = s.run(&sid, "one two three").await;
        assert_eq!(status, 202, "{body}");
        let got = events.until("runFinished").await;
        assert_eq!(text_of_json(&got), "echo: one two three", "{name}");
        let seqs: Vec<u64> = got
            .iter()
            .map(|e| e["seq"].as_str().unwrap().parse().unwrap())
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{name}: gap-free {seqs:?}"
        );
        assert_eq!(
            got.last().unwrap()["runFinished"]["outcome"],
            "RUN_OUTCOME_COMPLETED"
        );

        // Binary.
        let sid = s.create_session().await;
        let msg = pb::SubscribeRequest {
            session_id: sid.clone(),
            after: None,
        }
        .encode_to_vec();
        let r = open(client, &s, "Subscribe", "proto", &msg, &[]).await;
        assert_eq!(r.headers()["content-type"], "application/connect+proto");
        let mut env = Envelopes::new(r);
        let (_, first) = env.next().await.unwrap();
        assert_eq!(
            kind_of(&pb::Event::decode(first.as_slice()).unwrap()),
            "stream_opened"
        );
        let (status, body) = s.run(&sid, "binary too").await;
        assert_eq!(status, 202, "{body}");
        let mut got = Vec::new();
        loop {
            let (flags, payload) = env.next().await.unwrap();
            assert_eq!(flags, 0, "{name}");
            let e = pb::Event::decode(payload.as_slice()).unwrap();
            let done = kind_of(&e) == "run_finished";
            got.push(e);
            if done {
                break;
            }
        }
        assert_eq!(grpc_text_of(&got), "echo: binary too", "{name}");
        assert_grpc_numbered(&got);
    }
}

#[tokio::test]
async fn stream_and_presentation_events_are_served_too() {
    let s = TestServer::start().await;
    let c = reqwest::Client::new();
    let sid = s.create_session().await;
    let msg = json!({"sessions": [sid]}).to_string();
    let mut mux = Envelopes::new(open(&c, &s, "Stream", "json", msg.as_bytes(), &[]).await);
    let msg = json!({"sessionId": sid}).to_string();
    let mut pres = Envelopes::new(open(&c, &s, "PresentationEvents", "json", msg.as_bytes(), &[]).await);
    let (status, body) = s.run(&sid, "seen twice").await;
    assert_eq!(status, 202, "{body}");
    // The multiplexed stream wraps each session's events; read until the run's end shows.
    let mut text = String::new();
    loop {
        let (flags, payload) = mux.next().await.unwrap();
        assert_eq!(flags, 0);
        let v: Value = serde_json::from_slice(&payload).unwrap();
        if let Some(t) = v.pointer("/agent/textDelta/text").and_then(Value::as_str) {
            text.push_str(t);
        }
        if v.pointer("/agent/runFinished").is_some() {
            break;
        }
    }
    assert_eq!(text, "echo: seen twice");
    let (flags, payload) = pres.next().await.unwrap();
    assert_eq!(flags, 0);
    let v: Value = serde_json::from_slice(&payload).unwrap();
    assert!(v.is_object(), "{v}");
}

#[tokio::test]
async fn the_end_of_stream_message_carries_the_error_or_the_timeout() {
    let s = TestServer::start().await;
    let c = reqwest::Client::new();
    // No such session: HTTP 200 all the same, and the error in the end-of-stream message.
    let msg = json!({"sessionId": "nope"}).to_string();
    let r = open(&c, &s, "Subscribe", "json", msg.as_bytes(), &[]).await;
    assert_eq!(r.status(), 200);
    let mut env = Envelopes::new(r);
    let (flags, payload) = env.next().await.unwrap();
    assert_eq!(flags, END);
    let end: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(end["error"]["code"], "not_found", "{end}");
    assert!(env.next().await.is_none(), "nothing after the end");

    // A live stream past its Connect-Timeout-Ms ends with deadline_exceeded.
    let sid = s.create_session().await;
    let mut env = subscribe_json(&c, &s, &sid, &[("connect-timeout-ms", "300")]).await;
    let (flags, payload) = env.next().await.unwrap();
    assert_eq!(flags, END);
    let end: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(end["error"]["code"], "deadline_exceeded", "{end}");

    // A missing token: unauthenticated, in the stream's own shape.
    let r = reqwest::Client::new()
        .post(format!("{}{SERVICE}/Subscribe", s.url))
        .header("content-type", "application/connect+json")
        .body(envelope(0, json!({"sessionId": sid}).to_string().as_bytes()))
        .send()
        .await
        .unwrap();
    let mut env = Envelopes::new(r);
    let (flags, payload) = env.next().await.unwrap();
    assert_eq!(flags, END);
    let end: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(end["error"]["code"], "unauthenticated", "{end}");

    // A request that holds no message.
    let r = c
        .post(format!("{}{SERVICE}/Subscribe", s.url))
        .bearer_auth(TOKEN)
        .header("content-type", "application/connect+json")
        .body(vec![0u8, 0, 0])
        .send()
        .await
        .unwrap();
    let (flags, payload) = Envelopes::new(r).next().await.unwrap();
    assert_eq!(flags, END);
    let end: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");
}

#[tokio::test]
async fn gzip_streams_both_ways() {
    let s = TestServer::start().await;
    let c = reqwest::Client::new();
    let sid = s.create_session().await;
    let msg = json!({"sessionId": sid}).to_string();
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut z, msg.as_bytes()).unwrap();
    let r = c
        .post(format!("{}{SERVICE}/Subscribe", s.url))
        .bearer_auth(TOKEN)
        .header("content-type", "application/connect+json")
        .header("connect-content-encoding", "gzip")
        .header("connect-accept-encoding", "gzip")
        .body(envelope(COMPRESSED, &z.finish().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["connect-content-encoding"], "gzip");
    let mut env = Envelopes::new(r);
    let (status, body) = s.run(&sid, "/burst 3 4000").await;
    assert_eq!(status, 202, "{body}");
    let mut compressed = 0;
    let mut text = String::new();
    loop {
        let (flags, payload) = env.next().await.unwrap();
        assert_eq!(flags & END, 0);
        let payload = if flags & COMPRESSED != 0 {
            compressed += 1;
            gunzip(&payload)
        } else {
            payload
        };
        let v: Value = serde_json::from_slice(&payload).unwrap();
        if let Some(t) = v["textDelta"]["text"].as_str() {
            text.push_str(t);
        }
        if v.get("runFinished").is_some() {
            break;
        }
    }
    assert_eq!(text.len(), 3 * 4000);
    assert!(
        compressed >= 3,
        "every delta over 1 KiB came compressed ({compressed})"
    );
}

/// Incremental HTTP/1.1 chunked decoding of a response read off a raw socket.
struct Chunked {
    raw: Vec<u8>,
    head_done: bool,
    out: Deframer,
}

impl Chunked {
    /// Moves whole chunks from `raw` into the envelope buffer.
    fn decode(&mut self) {
        if !self.head_done {
            let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_string();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            assert!(
                head.to_ascii_lowercase().contains("transfer-encoding: chunked"),
                "{head}"
            );
            self.raw.drain(..end + 4);
            self.head_done = true;
        }
        loop {
            let Some(line) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&self.raw[..line]).unwrap().trim(), 16).unwrap();
            if self.raw.len() < line + 2 + size + 2 {
                return;
            }
            self.out.0.extend_from_slice(&self.raw[line + 2..line + 2 + size]);
            self.raw.drain(..line + 2 + size + 2);
        }
    }
}

#[tokio::test]
async fn a_slow_connect_reader_merges_losslessly() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    // A reader on a socket with a tiny receive buffer that reads nothing while the burst goes by.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut tcp = sock.connect(s.addr).await.unwrap();
    let body = envelope(0, json!({"sessionId": sid}).to_string().as_bytes());
    let head = format!(
        "POST {SERVICE}/Subscribe HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/connect+json\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body).await.unwrap();
    const DELTAS: usize = 2000;
    const SIZE: usize = 4096;
    let (status, b) = s.run(&sid, &format!("/burst {DELTAS} {SIZE}")).await;
    assert_eq!(status, 202, "{b}");
    // The run settles whatever the reader does.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (_, listed) = s.get("/sessions").await;
        let me = listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["session_id"] == sid.as_str())
            .cloned()
            .unwrap_or_default();
        if me["busy"] != true && me["latest_seq"].as_u64().unwrap_or(0) > 3 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the run settles: {me}");
        crate::support::poll::pause().await;
    }
    // Now it reads: every delta's text, in order, merged where it fell behind, no resync.
    let mut c = Chunked {
        raw: Vec::new(),
        head_done: false,
        out: Deframer::default(),
    };
    let mut buf = vec![0u8; 64 << 10];
    let mut text = String::new();
    let mut deltas = 0;
    let mut last_seq = 0u64;
    'read: loop {
        let n = tokio::time::timeout(DEADLINE, tcp.read(&mut buf))
            .await
            .expect("bytes within the deadline")
            .unwrap();
        assert!(n > 0, "the stream ended early");
        c.raw.extend_from_slice(&buf[..n]);
        c.decode();
        while let Some((flags, payload)) = c.out.next() {
            assert_eq!(flags, 0, "{}", String::from_utf8_lossy(&payload));
            let v: Value = serde_json::from_slice(&payload).unwrap();
            let kind = kind_of_json(&v).to_string();
            assert_ne!(kind, "resync", "a slow Connect reader is merged, never resynced");
            if let Some(seq) = v["seq"].as_str() {
                let seq: u64 = seq.parse().unwrap();
                assert!(seq > last_seq, "in order: {seq} after {last_seq}");
                last_seq = seq;
            }
            if let Some(t) = v["textDelta"]["text"].as_str() {
                deltas += 1;
                text.push_str(t);
            }
            if kind == "runFinished" {
                break 'read;
            }
        }
    }
    assert_eq!(text.len(), DELTAS * SIZE, "every delta's text arrives");
    for i in [0, 1, DELTAS / 2, DELTAS - 1] {
        assert!(text.contains(&format!("t{i}_")), "delta {i} is there");
    }
    assert!(
        deltas < DELTAS,
        "the stalled reader's deltas were merged ({deltas} frames)"
    );
}

#[tokio::test]
async fn the_stream_caps_hold_and_a_cancelled_stream_frees_its_permit() {
    let s = TestServer::start_with(|c| c.max_streams_per_client = 1).await;
    let c = reqwest::Client::new();
    let sid = s.create_session().await;
    let first = subscribe_json(&c, &s, &sid, &[]).await;
    // The cap is the same for every protocol: a second Connect stream and a gRPC one are refused.
    let msg = json!({"sessionId": sid}).to_string();
    let (flags, payload) = Envelopes::new(open(&c, &s, "Subscribe", "json", msg.as_bytes(), &[]).await)
        .next()
        .await
        .unwrap();
    assert_eq!(flags, END);
    let end: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(end["error"]["code"], "resource_exhausted", "{end}");
    let mut grpc = s.grpc().await;
    let refused = grpc
        .subscribe(pb::SubscribeRequest {
            session_id: sid.clone(),
            after: None,
        })
        .await
        .expect_err("over the cap");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);

    // The client goes away: its permit comes back.
    drop(first);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let mut env = Envelopes::new(open(&c, &s, "Subscribe", "json", msg.as_bytes(), &[]).await);
        let (flags, payload) = env.next().await.unwrap();
        if flags == 0 {
            let v: Value = serde_json::from_slice(&payload).unwrap();
            assert_eq!(kind_of_json(&v), "streamOpened");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancelled stream's permit never came back"
        );
        crate::support::poll::pause().await;
    }
}

#[tokio::test]
async fn a_bidi_stream_reaches_reflection_over_http2() {
    use tonic_reflection::pb::v1::{
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};
    let s = TestServer::start().await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let r = h2
        .post(format!(
            "{}/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            s.url
        ))
        .header("content-type", "application/connect+proto")
        .body(envelope(0, &req.encode_to_vec()))
        .send()
        .await
        .unwrap();
    let mut env = Envelopes::new(r);
    let (flags, payload) = env.next().await.unwrap();
    assert_eq!(flags, 0);
    let resp = ServerReflectionResponse::decode(payload.as_slice()).unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("{resp:?}")
    };
    assert!(
        list.service.iter().any(|s| s.name == "vak.v1.AgentService"),
        "{list:?}"
    );
    // The request stream ended with the body: the answer stream ends cleanly.
    let (flags, payload) = env.next().await.unwrap();
    assert_eq!(flags, END);
    let end: Value = serde_json::from_slice(&payload).unwrap();
    assert!(end.get("error").is_none(), "{end}");
}
