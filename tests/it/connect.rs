//! The Connect protocol on the one port, unary calls, driven as curl and a Connect client would (plain HTTP, the framing built here by hand): JSON and binary bodies, GET for side-effect-free RPCs, errors with the spec's codes and HTTP statuses and vak's error kind, gzip both ways, Connect-Timeout-Ms, and the guard's rules answered as Connect errors. Streaming is in connect_stream.rs.
//!
//! The Connect conformance suite's runner (a Go program) cannot be fetched
//! here; these tests and connect_stream.rs cover the server cases that apply
//! to unary and server-streaming RPCs, by the suite's case names:
//! - "Basic/*/unary/success", "JSON/*": `curl_style_json_calls_create_and_read_a_session`
//! - "Basic/*/unary/proto": `binary_bodies_carry_the_same_messages`
//! - "Idempotency/*/get" (GET with `encoding`, `message`, `base64`): `side_effect_free_rpcs_answer_get`
//! - "Errors/*" (every code's HTTP status, `details`, metadata on errors):
//!   `errors_carry_the_specs_code_status_and_vaks_error_kind`
//! - "Compression/gzip/*/unary" (request and response): `gzip_works_both_ways`
//! - "Timeouts/*/unary", "Timeout header parsing": `a_call_past_its_timeout_is_deadline_exceeded`
//! - "Unexpected requests" (protocol version, content type, compression,
//!   unknown method): `unsupported_requests_get_clear_refusals`
//! - Server streaming (envelopes, end-stream message with error and metadata,
//!   compression, timeouts, cancellation): connect_stream.rs.

use crate::support::*;
use prost::Message;
use serde_json::{json, Value};
use std::io::{Read, Write};
use vak::proto::v1 as pb;

pub const SERVICE: &str = "/vak.v1.AgentService";

/// A Connect unary POST with a JSON body and the token; (status, headers, body as JSON).
pub async fn call(s: &TestServer, method: &str, body: Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = s
        .http()
        .post(format!("{}{SERVICE}/{method}", s.url))
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// A Connect POST of `method` with the token and `headers` (the content type
/// `application/json` unless they name one).
async fn post(
    s: &TestServer,
    method: &str,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    let mut req = s.http().post(format!("{}{SERVICE}/{method}", s.url));
    if !headers.iter().any(|(k, _)| *k == "content-type") {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body).send().await.unwrap()
}

/// Asserts a Connect error answer: its HTTP status and code; the error JSON.
async fn assert_error(r: reqwest::Response, status: u16, code: &str) -> Value {
    let (got, _, e) = answer(r).await;
    assert_eq!((got, e["code"].as_str()), (status, Some(code)), "{e}");
    e
}

async fn answer(r: reqwest::Response) -> (u16, reqwest::header::HeaderMap, Value) {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let bytes = r.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, headers, v)
}

/// `google.rpc.ErrorInfo`, as a client's own generated code reads it.
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: std::collections::HashMap<String, String>,
}

/// Percent-encodes everything but unreserved characters, as a URL query needs.
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(data).unwrap();
    z.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out).unwrap();
    out
}

#[tokio::test]
async fn curl_style_json_calls_create_and_read_a_session() {
    let s = TestServer::start().await;
    // As curl sends it: no Connect header at all, just the content type.
    let r = post(&s, "CreateSession", &[], "{}").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let (_, _, created) = answer(r).await;
    let sid = created["sessionId"]
        .as_str()
        .expect("lowerCamelCase field names")
        .to_string();

    // The same session through REST: one service behind both.
    let (status, listed) = s.get("/sessions").await;
    assert_eq!(status, 200);
    assert!(listed.to_string().contains(&sid), "{listed}");

    // A run with wait, then its answer, in canonical JSON: enum names, 64-bit ints as strings.
    let (status, _, ran) = call(
        &s,
        "Run",
        json!({"sessionId": sid, "prompt": "hello connect", "wait": true}),
    )
    .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["result"]["outcome"], "RUN_OUTCOME_COMPLETED", "{ran}");
    assert_eq!(ran["result"]["answer"], "echo: hello connect");
    assert!(ran["result"]["seq"].is_string(), "int64 as a string: {ran}");

    // Proto field names are accepted on input too.
    let (status, _, attached) = call(&s, "AttachSession", json!({"session_id": sid})).await;
    assert_eq!(status, 200, "{attached}");
    assert_eq!(attached["session"]["sessionId"], sid);
}

#[tokio::test]
async fn binary_bodies_carry_the_same_messages() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let req = pb::AttachSessionRequest {
        session_id: sid.clone(),
    };
    let r = post(
        &s,
        "AttachSession",
        &[("content-type", "application/proto")],
        req.encode_to_vec(),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/proto");
    let resp = pb::AttachSessionResponse::decode(r.bytes().await.unwrap()).unwrap();
    assert_eq!(resp.session.unwrap().session_id, sid);

    // An error on a binary call is still the error JSON.
    let r = post(
        &s,
        "AttachSession",
        &[("content-type", "application/proto")],
        pb::AttachSessionRequest {
            session_id: "nope".into(),
        }
        .encode_to_vec(),
    )
    .await;
    assert_error(r, 404, "not_found").await;
}

#[tokio::test]
async fn side_effect_free_rpcs_answer_get() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    std::fs::write(s.workspace.join("notes.txt"), "read me over GET\n").unwrap();
    let get = |query: String| {
        let url = format!("{}{SERVICE}/{query}", s.url);
        let http = s.http();
        async move { http.get(url).send().await.unwrap() }
    };

    // JSON in the query, percent-encoded.
    let message = percent(&json!({"path": "notes.txt"}).to_string());
    let r = get(format!("ReadFile?connect=v1&encoding=json&message={message}")).await;
    assert_eq!(r.status(), 200);
    let (_, _, file) = answer(r).await;
    assert_eq!(file["content"], "read me over GET\n", "{file}");

    // Binary, URL-safe base64 without padding.
    use base64::Engine;
    let msg = pb::ListSessionsRequest::default().encode_to_vec();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&msg);
    let r = get(format!(
        "ListSessions?connect=v1&encoding=proto&base64=1&message={b64}"
    ))
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/proto");
    let listed = pb::ListSessionsResponse::decode(r.bytes().await.unwrap()).unwrap();
    assert!(listed.sessions.iter().any(|x| x.session_id == sid));

    // Binary percent-encoded, without base64 (bytes that are no UTF-8 among them).
    let mut msg = pb::ReadFileRequest {
        path: "notes.txt".into(),
        session_id: None,
    }
    .encode_to_vec();
    // An unknown field 15 = 300 (a varint, skipped by the decoder): 0xAC is no UTF-8.
    msg.extend_from_slice(&[0x78, 0xAC, 0x02]);
    let raw: String = msg.iter().map(|b| format!("%{b:02X}")).collect();
    let r = get(format!("ReadFile?connect=v1&encoding=proto&message={raw}")).await;
    assert_eq!(r.status(), 200);
    let file = pb::FileContent::decode(r.bytes().await.unwrap()).unwrap();
    assert_eq!(file.path, "notes.txt");

    // An RPC with side effects is never a GET.
    let r = get("CreateSession?connect=v1&encoding=json&message=%7B%7D".into()).await;
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let (status, sessions) = s.get("/sessions").await;
    assert_eq!(status, 200);
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        1,
        "no session was made: {sessions}"
    );
}

#[tokio::test]
async fn errors_carry_the_specs_code_status_and_vaks_error_kind() {
    let s = TestServer::start().await;
    // not_found: 404.
    let (status, headers, e) = call(&s, "AttachSession", json!({"sessionId": "nope"})).await;
    assert_eq!(status, 404);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(e["code"], "not_found");
    assert!(e["message"].as_str().unwrap().contains("nope"), "{e}");

    // No token: unauthenticated, 401; a wrong one too.
    for token in [None, Some("wrong")] {
        let mut req = reqwest::Client::new()
            .post(format!("{}{SERVICE}/ListSessions", s.url))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        assert_error(req.body("{}").send().await.unwrap(), 401, "unauthenticated").await;
    }

    // invalid_argument: 400, for a body that is not the message.
    let r = post(&s, "CreateSession", &[], json!({"no_such_field": 1}).to_string()).await;
    assert_error(r, 400, "invalid_argument").await;

    // A file over the files API's cap: out_of_range (400), with the kind REST
    // turns into 413, as a header and a google.rpc.ErrorInfo detail.
    let big = vec![b'x'; (2 << 20) + 1];
    std::fs::write(s.workspace.join("big.bin"), big).unwrap();
    let (status, headers, e) = call(&s, "ReadFile", json!({"path": "big.bin"})).await;
    assert_eq!((status, e["code"].as_str()), (400, Some("out_of_range")), "{e}");
    let kinds: Vec<_> = headers.get_all("vak-error-kind").iter().collect();
    assert_eq!(kinds, ["payload_too_large"], "the kind once");
    let detail = &e["details"][0];
    assert_eq!(detail["type"], "google.rpc.ErrorInfo", "{e}");
    assert_eq!(detail["debug"]["metadata"]["kind"], "payload_too_large");
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(detail["value"].as_str().unwrap())
        .unwrap();
    let info = ErrorInfo::decode(raw.as_slice()).unwrap();
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("payload_too_large", "vak")
    );
    assert_eq!(info.metadata["kind"], "payload_too_large");

    // The same kind the REST surface reports for it.
    let (status, rest) = s.get("/fs/file?path=big.bin").await;
    assert_eq!(
        (status, rest["error"]["code"].as_str()),
        (413, Some("payload_too_large"))
    );

    // no_ai_service: failed_precondition (400) with its kind.
    let patch = json!({"provider": "openai", "model": "gpt-4o"}).to_string();
    let r = post(&s, "UpdateConfig", &[], patch).await;
    assert_eq!(r.headers()["vak-error-kind"], "no_ai_service");
    assert_error(r, 400, "failed_precondition").await;
}

#[tokio::test]
async fn gzip_works_both_ways() {
    let s = TestServer::start().await;
    for _ in 0..12 {
        s.create_session().await;
    }
    // A gzipped request, and a response over 1 KiB gzipped because the client accepts it.
    let r = post(
        &s,
        "ListSessions",
        &[("content-encoding", "gzip"), ("accept-encoding", "gzip")],
        gzip(b"{}"),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let body = gunzip(&r.bytes().await.unwrap());
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["sessions"].as_array().unwrap().len(), 12);

    // Without Accept-Encoding the same answer comes plain.
    let r = post(&s, "ListSessions", &[], "{}").await;
    assert!(r.headers().get("content-encoding").is_none());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["sessions"].as_array().unwrap().len(), 12);

    // A gzip bomb past the message limit is refused, not inflated.
    let bomb = gzip(&vec![b' '; 8 << 20]);
    let r = post(&s, "ListSessions", &[("content-encoding", "gzip")], bomb).await;
    assert_error(r, 429, "resource_exhausted").await;
}

#[tokio::test]
async fn a_call_past_its_timeout_is_deadline_exceeded() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let r = post(
        &s,
        "Run",
        &[("connect-timeout-ms", "200")],
        json!({"sessionId": sid, "prompt": "/sleep 20000", "wait": true}).to_string(),
    )
    .await;
    assert_error(r, 504, "deadline_exceeded").await;

    // A timeout header that is no timeout.
    for bad in ["soon", "-1", "12345678901"] {
        let r = post(&s, "ListSessions", &[("connect-timeout-ms", bad)], "{}").await;
        assert_error(r, 400, "invalid_argument").await;
    }
    // A generous one does not get in the way.
    let r = post(&s, "ListSessions", &[("connect-timeout-ms", "30000")], "{}").await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn unsupported_requests_get_clear_refusals() {
    let s = TestServer::start().await;
    // A protocol version other than 1.
    let r = post(&s, "ListSessions", &[("connect-protocol-version", "2")], "{}").await;
    assert_error(r, 400, "invalid_argument").await;

    // A codec vak does not speak: 415 naming the ones it does.
    let r = post(&s, "ListSessions", &[("content-type", "application/xml")], "<x/>").await;
    assert_eq!(r.status(), 415);
    let accepted = r.headers()["accept-post"].to_str().unwrap();
    assert!(accepted.contains("application/json"), "{accepted}");

    // A streaming RPC called as unary: 415 naming the streaming types.
    let r = post(&s, "Subscribe", &[], "{}").await;
    assert_eq!(r.status(), 415);
    let accepted = r.headers()["accept-post"].to_str().unwrap();
    assert!(accepted.contains("application/connect+json"), "{accepted}");

    // A compression it does not speak.
    let r = post(&s, "ListSessions", &[("content-encoding", "br")], "{}").await;
    assert_error(r, 501, "unimplemented").await;

    // No such RPC.
    assert_error(post(&s, "NoSuchThing", &[], "{}").await, 501, "unimplemented").await;
    // A message over --max-body.
    let s2 = TestServer::start_with(|c| c.max_body = 1024).await;
    let big = json!({"workspace": "x".repeat(4096)}).to_string();
    assert_error(
        post(&s2, "CreateSession", &[], big).await,
        429,
        "resource_exhausted",
    )
    .await;
}

#[tokio::test]
async fn the_guard_answers_connect_calls_as_connect_errors() {
    let s = TestServer::start().await;
    // A Host that names no loopback or trusted host: permission_denied, 403.
    let r = post(&s, "ListSessions", &[("host", "evil.example.com")], "{}").await;
    assert_error(r, 403, "permission_denied").await;

    // A page on another origin may not call it.
    let r = post(
        &s,
        "CreateSession",
        &[("origin", "http://evil.example.com")],
        "{}",
    )
    .await;
    assert_error(r, 403, "permission_denied").await;

    // A browser login: the cookie with its session key works, the cookie alone does not.
    let c = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let r = c
        .post(format!("{}/auth/login", s.url))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let key = r.json::<Value>().await.unwrap()["key"]
        .as_str()
        .unwrap()
        .to_string();
    let list = |with_key: bool| {
        let mut req = c
            .post(format!("{}{SERVICE}/ListSessions", s.url))
            .header("content-type", "application/json")
            .body("{}");
        if with_key {
            req = req.header("x-vak-key", key.clone());
        }
        req.send()
    };
    assert_eq!(list(true).await.unwrap().status(), 200);
    assert_error(list(false).await.unwrap(), 401, "unauthenticated").await;
}
