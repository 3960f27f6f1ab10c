//! Connections that never finish are closed: every way of holding a connection open without
//! completing a request (silence, half an HTTP/2 preface, an HTTP/2 connection with no stream,
//! a HEADERS block without END_HEADERS, a slow body) is cut within its configured deadline,
//! while a quiet stream in progress is not; the excess over `--max-connections` is refused at
//! once; and a server out of descriptors recovers once the idle connections are reaped.

use crate::support::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The deadlines the tests configure: short, so a cut comes fast.
const SHORT: Duration = Duration::from_millis(200);
/// A deadline longer than any wait in a test: what is cut within DEADLINE was not cut by it.
const NEVER: Duration = Duration::from_secs(300);

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads until the server closes the connection (EOF or reset); returns what it sent.
/// Panics if the connection is still open after the deadline.
async fn read_until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match tcp.read(&mut chunk).await {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("reading from the server: {e}"),
            }
        }
    })
    .await
    .expect("the server closes the connection within the deadline");
    buf
}

/// One HTTP/2 frame: 24-bit length, type, flags, stream id, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The (type, stream, payload) of each whole frame in `bytes`.
fn frames(bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() >= at + 9 {
        let len = (bytes[at] as usize) << 16 | (bytes[at + 1] as usize) << 8 | bytes[at + 2] as usize;
        let kind = bytes[at + 3];
        let stream = u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
        if bytes.len() < at + 9 + len {
            break;
        }
        out.push((kind, stream, bytes[at + 9..at + 9 + len].to_vec()));
        at += 9 + len;
    }
    out
}

/// An HPACK block for `GET /health` (static-table indexes, literals without Huffman).
fn get_health_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
    b.push(0x04); // :path, literal without indexing
    b.push(7);
    b.extend_from_slice(b"/health");
    b.push(0x01); // :authority, literal without indexing
    b.push(9);
    b.extend_from_slice(b"127.0.0.1");
    b
}

/// Sends an HTTP/1.1 request and reads one response: (status line and headers, body).
async fn exchange(tcp: &mut TcpStream, request: &str) -> (String, Vec<u8>) {
    tcp.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(DEADLINE, async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len: usize = header_of(&head, "content-length")
                    .map(|v| v.parse().unwrap())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    return (head, buf[end + 4..end + 4 + len].to_vec());
                }
            }
            let n = tcp.read(&mut chunk).await.expect("a response");
            assert!(
                n > 0,
                "closed before a whole response: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("a response within the deadline")
}

const GET_HEALTH: &str = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let s = TestServer::start_with(|c| c.header_read_timeout = SHORT).await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    let got = read_until_closed(&mut tcp).await;
    assert!(got.is_empty(), "nothing is said to silence: {got:?}");
}

#[tokio::test]
async fn half_an_h2c_preface_is_closed() {
    let s = TestServer::start_with(|c| c.header_read_timeout = SHORT).await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(&PREFACE[..12]).await.unwrap();
    read_until_closed(&mut tcp).await;
}

#[tokio::test]
async fn an_http2_connection_that_opens_no_stream_is_told_goaway_and_closed() {
    let s = TestServer::start_with(|c| c.header_read_timeout = SHORT).await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    let got = frames(&read_until_closed(&mut tcp).await);
    assert_eq!(
        got.first().map(|f| f.0),
        Some(SETTINGS),
        "the server spoke HTTP/2: {got:?}"
    );
    assert!(
        got.iter().any(|f| f.0 == GOAWAY),
        "the client is told the connection is going away: {got:?}"
    );
}

#[tokio::test]
async fn an_http2_connection_idle_after_its_last_stream_is_closed() {
    // The first-request deadline is out of reach: only the idle timeout can close it.
    let s = TestServer::start_with(|c| {
        c.header_read_timeout = NEVER;
        c.idle_timeout = SHORT;
    })
    .await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    tcp.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_health_block()))
        .await
        .unwrap();
    let got = frames(&read_until_closed(&mut tcp).await);
    assert!(
        got.iter().any(|(kind, stream, payload)| *kind == HEADERS
            && *stream == 1
            && payload.first() == Some(&0x88)),
        "GET /health was answered 200 before the idle connection was closed: {got:?}"
    );
    assert!(got.iter().any(|f| f.0 == GOAWAY), "with a GOAWAY: {got:?}");
}

#[tokio::test]
async fn http2_headers_without_end_headers_are_closed() {
    let s = TestServer::start_with(|c| c.header_read_timeout = SHORT).await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    // Half a header block, and the CONTINUATION that would end it never comes.
    tcp.write_all(&frame(HEADERS, END_STREAM, 1, &get_health_block()[..4]))
        .await
        .unwrap();
    let got = frames(&read_until_closed(&mut tcp).await);
    assert!(
        !got.iter().any(|f| f.0 == HEADERS),
        "half a request is never answered: {got:?}"
    );
}

/// Sends `head` announcing a 100-byte body, then 1 byte, then stalls; returns what the
/// server answered before closing the connection.
async fn slow_body(s: &TestServer, head: &str) -> String {
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(b"{").await.unwrap();
    String::from_utf8_lossy(&read_until_closed(&mut tcp).await).to_string()
}

#[tokio::test]
async fn a_slow_body_is_cut_with_408_on_login_and_on_rest_routes() {
    // Only the body deadline is short.
    let s = TestServer::start_with(|c| {
        c.header_read_timeout = NEVER;
        c.idle_timeout = NEVER;
        c.body_read_timeout = SHORT;
    })
    .await;
    let login = slow_body(
        &s,
        "POST /auth/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
    )
    .await;
    assert!(login.starts_with("HTTP/1.1 408 "), "{login}");
    assert!(
        login.contains("the request body did not arrive within 200ms"),
        "{login}"
    );
    assert_eq!(
        header_of(&login, "connection").as_deref(),
        Some("close"),
        "{login}"
    );

    let rest = slow_body(
        &s,
        &format!(
            "POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        ),
    )
    .await;
    assert!(rest.starts_with("HTTP/1.1 408 "), "{rest}");
    let (status, body) = s.get("/sessions").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["sessions"],
        serde_json::json!([]),
        "the cut request created nothing"
    );
}

#[tokio::test]
async fn quiet_sse_grpc_and_connect_streams_outlive_the_idle_timeout() {
    let s = TestServer::start_with(|c| {
        c.header_read_timeout = SHORT;
        c.idle_timeout = SHORT;
    })
    .await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await; // HTTP/1.1
    let mut grpc = s.grpc().await; // HTTP/2
    let (mut events, _) = grpc_subscribe(&mut grpc, &sid, None).await;
    let h1 = reqwest::Client::new();
    let mut connect = crate::connect_stream::subscribe_json(&h1, &s, &sid, &[]).await; // HTTP/1.1
                                                                                       // A connection that goes idle after the streams opened: once it is closed, the idle
                                                                                       // timeout has passed for the streams' connections too.
    let mut sentinel = TcpStream::connect(s.addr).await.unwrap();
    let (head, _) = exchange(&mut sentinel, GET_HEALTH).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    read_until_closed(&mut sentinel).await;

    let (status, _) = s.run(&sid, "hello").await;
    assert_eq!(status, 202);
    let frames = sse.until("run_finished").await;
    assert!(
        !text_of(&frames).is_empty(),
        "the SSE stream is still live: {frames:?}"
    );
    let got = events.until("run_finished").await;
    assert!(
        !grpc_text_of(&got).is_empty(),
        "the gRPC stream is still live: {got:?}"
    );
    let got = connect.until("runFinished").await;
    assert!(
        !crate::connect_stream::text_of_json(&got).is_empty(),
        "the Connect stream is still live: {got:?}"
    );
}

#[tokio::test]
async fn connections_over_the_cap_are_refused_at_once_and_admitted_when_one_closes() {
    // No deadline can close anything during the test: only the cap acts.
    let s = TestServer::start_with(|c| {
        c.max_connections = 3;
        c.header_read_timeout = NEVER;
        c.idle_timeout = NEVER;
    })
    .await;
    let mut served = TcpStream::connect(s.addr).await.unwrap();
    let (head, _) = exchange(&mut served, GET_HEALTH).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let second = TcpStream::connect(s.addr).await.unwrap();
    let _third = TcpStream::connect(s.addr).await.unwrap();

    // Accepted after the three (the backlog is in order), and closed at once.
    let mut fourth = TcpStream::connect(s.addr).await.unwrap();
    let got = read_until_closed(&mut fourth).await;
    assert!(got.is_empty(), "refused without a word: {got:?}");

    let (head, body) = exchange(&mut served, GET_HEALTH).await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "an open connection still works: {head}"
    );
    assert_eq!(body, br#"{"status":"ok"}"#);

    drop(second);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let mut tcp = TcpStream::connect(s.addr).await.unwrap();
        tcp.write_all(GET_HEALTH.as_bytes()).await.unwrap();
        let got = String::from_utf8_lossy(&read_until_or_closed(&mut tcp, b"\r\n\r\n").await).to_string();
        if got.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(got.is_empty(), "refused, or answered 200: {got}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "a new connection is admitted once one closes"
        );
        tokio::task::yield_now().await;
    }
}

/// Reads until `needle` has arrived or the server closed the connection.
async fn read_until_or_closed(tcp: &mut TcpStream, needle: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        while !buf.windows(needle.len()).any(|w| w == needle) {
            match tcp.read(&mut chunk).await {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("reading from the server: {e}"),
            }
        }
    })
    .await
    .expect("an answer or a close within the deadline");
    buf
}

#[tokio::test]
async fn a_server_out_of_descriptors_answers_again_once_idle_connections_are_reaped() {
    // A cap far above the descriptors, so the accept loop really runs out of them.
    let mut served = Serve::new()
        .no_token()
        .prelude("ulimit -n 64")
        .args(["--header-read-timeout", "1s", "--max-connections", "100000"])
        .start()
        .await;
    let (url, addr) = (served.url.clone(), served.addr);
    let started = std::time::Instant::now();

    // More idle connections than the server has descriptors, fewer than a listen backlog
    // holds (so every connect completes at once).
    const IDLE: usize = 120;
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let r = reqwest::Client::new()
        .get(format!("{url}/health"))
        .timeout(DEADLINE)
        .send()
        .await
        .expect("/health answers once the idle connections are reaped");
    assert_eq!(r.status(), 200);
    for tcp in &mut idle {
        read_until_closed(tcp).await;
    }
    let elapsed = started.elapsed();

    // Killed and reaped: its whole log has been read.
    served.vak.signal("KILL");
    served.vak.wait().await;
    let log: Vec<String> = served.vak.log().lines().map(str::to_string).collect();
    assert!(
        log.iter().any(|l| l.contains("open-files limit 64")),
        "the limit is logged once at startup: {log:?}"
    );
    let failures: Vec<&String> = log.iter().filter(|l| l.contains("accept failed")).collect();
    assert!(
        failures.iter().any(|l| l.contains("Too many open files")),
        "the server did run out of descriptors: {log:?}"
    );
    // At most one line a second, each with its count.
    assert!(
        failures.len() as u64 <= elapsed.as_secs() + 1,
        "{} accept-failure lines in {elapsed:?}: {failures:?}",
        failures.len()
    );
}

/// An HTTP/1.1 chunked body: the data of every chunk, and whether the last (zero) chunk
/// ended it. Panics on anything but well-formed chunks.
fn dechunk(mut body: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    while !body.is_empty() {
        let line = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk-size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line]).unwrap(), 16)
            .unwrap_or_else(|e| panic!("chunk size {:?}: {e}", String::from_utf8_lossy(&body[..line])));
        body = &body[line + 2..];
        if size == 0 {
            assert_eq!(body, b"\r\n", "nothing after the last chunk");
            return (data, true);
        }
        data.extend_from_slice(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n", "a chunk ends with CRLF");
        body = &body[size + 2..];
    }
    (data, false)
}

/// A raw HTTP/1.1 `GET /sessions/:id/events`, read up to its stream_opened (what came is returned).
async fn raw_events(s: &TestServer, sid: &str) -> (TcpStream, Vec<u8>) {
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    let req = format!(
        "GET /sessions/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let got = read_until_or_closed(&mut tcp, b"stream_opened").await;
    (tcp, got)
}

#[tokio::test]
async fn an_http1_event_stream_stays_well_chunked_to_its_last_chunk_after_leaving_hyper() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let (mut tcp, mut raw) = raw_events(&s, &sid).await;
    // Everything after stream_opened is written by the event stream's own writer.
    let (status, _) = s.run(&sid, "hello").await;
    assert_eq!(status, 202);
    raw.extend(read_until_or_closed(&mut tcp, b"run_finished").await);
    let (status, body) = s.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 200, "{body}");
    raw.extend(read_until_closed(&mut tcp).await);

    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let (data, last) = dechunk(&raw[end + 4..]);
    assert!(
        last,
        "the stream ends with the last chunk, then the connection closes"
    );
    let text = String::from_utf8(data).unwrap();
    assert!(text.starts_with("retry: 1000\n"), "{text}");
    let kinds: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(kinds.first(), Some(&"stream_opened"), "{kinds:?}");
    assert!(
        kinds.contains(&"text_delta") && kinds.contains(&"run_finished"),
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&"session_closed"), "{kinds:?}");
}

#[tokio::test]
async fn a_client_that_keeps_sending_behind_its_event_stream_is_cut() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let (mut tcp, _) = raw_events(&s, &sid).await;
    // Nobody would answer a request pipelined behind a stream that never ends: past
    // 64 KiB of it the connection is closed instead of read forever.
    let junk = vec![b'x'; 4096];
    let mut cut = false;
    for _ in 0..64 {
        if tcp.write_all(&junk).await.is_err() {
            cut = true;
            break;
        }
    }
    if !cut {
        read_until_closed(&mut tcp).await;
    }
    // The server is fine: a new stream opens.
    s.events(&sid, None).await;
}
