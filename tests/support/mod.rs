//! Shared helpers for the end-to-end tests: a real server on 127.0.0.1:0, authenticated REST and gRPC clients, and an SSE reader with deadlines.

#![allow(dead_code)]

use futures_util::StreamExt;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use vak::core::CoreConfig;
use vak::edge::server::{ServeConfig, Server};
use vak::proto::v1 as pb;

pub const TOKEN: &str = "test-token";
/// The longest any single wait in a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub type GrpcClient = pb::agent_service_client::AgentServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Auth>,
>;

#[derive(Clone)]
pub struct Auth(pub String);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {}", self.0).parse().unwrap());
        Ok(req)
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub home: PathBuf,
    pub workspace: PathBuf,
    _dirs: Option<(tempfile::TempDir, tempfile::TempDir)>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<vak::Result<()>>>,
}

impl TestServer {
    /// A server with fresh home and workspace and the default configuration.
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let home = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut s = Self::start_in(home.path(), ws.path(), tweak).await;
        s._dirs = Some((home, ws));
        s
    }

    /// A server on an existing home and workspace (restart tests).
    pub async fn start_in(home: &Path, workspace: &Path, tweak: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let mut cfg = ServeConfig::new(
            CoreConfig::new(home.to_path_buf(), workspace.to_path_buf()),
            TOKEN.to_string(),
        );
        tweak(&mut cfg);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::new(cfg).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(listener, async move {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            url: format!("http://{addr}"),
            home: home.to_path_buf(),
            workspace: workspace.to_path_buf(),
            _dirs: None,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// Graceful stop; returns the temp dirs so a restart can reuse them.
    pub async fn stop(mut self) -> Option<(tempfile::TempDir, tempfile::TempDir)> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task)
                .await
                .expect("server stops within the deadline")
                .unwrap()
                .unwrap();
        }
        self._dirs.take()
    }

    pub fn http(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap()
    }

    pub async fn grpc(&self) -> GrpcClient {
        let channel = tonic::transport::Endpoint::from_shared(self.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth(TOKEN.into()))
    }

    pub async fn create_session(&self) -> String {
        let r = self
            .http()
            .post(format!("{}/sessions", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: Value = r.json().await.unwrap();
        v["session_id"].as_str().unwrap().to_string()
    }

    /// POST /sessions/:id/run; returns (status, body).
    pub async fn run(&self, sid: &str, prompt: &str) -> (u16, Value) {
        self.post(
            &format!("/sessions/{sid}/run"),
            serde_json::json!({ "prompt": prompt }),
        )
        .await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http()
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Opens /sessions/:id/events (with `cursor` as Last-Event-ID) and waits for stream_opened.
    pub async fn events(&self, sid: &str, cursor: Option<u64>) -> Sse {
        let mut req = self.http().get(format!("{}/sessions/{sid}/events", self.url));
        if let Some(c) = cursor {
            req = req.header("last-event-id", c.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200, "events stream opens");
        let mut sse = Sse::new(resp);
        let first = sse.next().await.expect("a first frame");
        assert_eq!(first.event, "stream_opened");
        assert_eq!(first.id, None, "stream_opened carries no id");
        sse.opened = Some(first);
        sse
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// One parsed SSE frame.
#[derive(Clone, Debug)]
pub struct Frame {
    pub id: Option<String>,
    pub event: String,
    pub data: Value,
}

impl Frame {
    pub fn seq(&self) -> u64 {
        self.data["seq"].as_u64().unwrap()
    }
    /// The event's payload object (the oneof case).
    pub fn body(&self) -> &Value {
        &self.data[&self.event]
    }
}

pub struct Sse {
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: Vec<u8>,
    pub opened: Option<Frame>,
}

impl Sse {
    pub fn new(resp: reqwest::Response) -> Sse {
        Sse {
            stream: resp.bytes_stream().boxed(),
            buf: Vec::new(),
            opened: None,
        }
    }

    /// The next frame, None when the stream ended; panics past the deadline.
    pub async fn next(&mut self) -> Option<Frame> {
        tokio::time::timeout(DEADLINE, self.next_inner())
            .await
            .expect("an SSE frame within the deadline")
    }

    async fn next_inner(&mut self) -> Option<Frame> {
        loop {
            if let Some(pos) = find(&self.buf, b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = String::from_utf8(block).unwrap();
                let (mut id, mut event, mut data) = (None, String::new(), String::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim_start().to_string());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim_start().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if event.is_empty() && data.is_empty() {
                    continue; // a comment (keepalive)
                }
                let data = serde_json::from_str(&data).unwrap();
                return Some(Frame { id, event, data });
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// Frames up to and including the first of kind `kind`.
    pub async fn until(&mut self, kind: &str) -> Vec<Frame> {
        let mut out = Vec::new();
        loop {
            let f = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before {kind}: {out:?}"));
            let done = f.event == kind;
            out.push(f);
            if done {
                return out;
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The concatenated text of the text_delta frames.
pub fn text_of(frames: &[Frame]) -> String {
    frames
        .iter()
        .filter(|f| f.event == "text_delta")
        .map(|f| f.body()["text"].as_str().unwrap().to_string())
        .collect()
}

/// Asserts that the numbered frames have strictly increasing seqs and that each id equals its seq.
#[track_caller]
pub fn assert_numbered(frames: &[Frame]) {
    let mut last = 0;
    for f in frames {
        let seq = f.seq();
        assert!(seq > last, "seq {seq} after {last}: {frames:?}");
        assert_eq!(f.id.as_deref(), Some(seq.to_string().as_str()));
        last = seq;
    }
}

/// Asserts the kinds of `frames`, in order.
#[track_caller]
pub fn assert_kinds(frames: &[Frame], kinds: &[&str]) {
    let got: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(got, kinds);
}

// ---- gRPC event streams ----------------------------------------------------

/// The snake_case name of a gRPC event's oneof case (the SSE `event:` name), written
/// out here rather than borrowed from the server so the tests check the mapping.
pub fn kind_of(e: &pb::Event) -> &'static str {
    use pb::event::Kind;
    match e.kind.as_ref() {
        None => "none",
        Some(Kind::StreamOpened(_)) => "stream_opened",
        Some(Kind::UserMessage(_)) => "user_message",
        Some(Kind::TurnStarted(_)) => "turn_started",
        Some(Kind::TextDelta(_)) => "text_delta",
        Some(Kind::ThinkingDelta(_)) => "thinking_delta",
        Some(Kind::ToolCall(_)) => "tool_call",
        Some(Kind::ToolResult(_)) => "tool_result",
        Some(Kind::ApprovalRequested(_)) => "approval_requested",
        Some(Kind::ApprovalResolved(_)) => "approval_resolved",
        Some(Kind::Status(_)) => "status",
        Some(Kind::RunFinished(_)) => "run_finished",
        Some(Kind::Resync(_)) => "resync",
        Some(Kind::SessionClosed(_)) => "session_closed",
    }
}

/// A gRPC Subscribe stream read with deadlines.
pub struct GrpcEvents {
    pub stream: tonic::Streaming<pb::Event>,
}

impl GrpcEvents {
    /// The next event; None when the stream ended cleanly. Panics on a status or past the deadline.
    pub async fn next(&mut self) -> Option<pb::Event> {
        tokio::time::timeout(DEADLINE, self.stream.message())
            .await
            .expect("a gRPC event within the deadline")
            .expect("the stream carries no error status")
    }

    /// The next event, which must exist.
    pub async fn expect_next(&mut self) -> pb::Event {
        self.next().await.expect("the stream is still open")
    }

    /// Events up to and including the first of kind `kind`.
    pub async fn until(&mut self, kind: &str) -> Vec<pb::Event> {
        let mut out = Vec::new();
        loop {
            let e = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before {kind}: {out:?}"));
            let done = kind_of(&e) == kind;
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

/// Subscribes over gRPC and returns the stream with its first message (which must be
/// stream_opened, seq 0, naming the session) already read.
pub async fn grpc_subscribe(
    client: &mut GrpcClient,
    sid: &str,
    after: Option<u64>,
) -> (GrpcEvents, pb::StreamOpened) {
    let resp = tokio::time::timeout(
        DEADLINE,
        client.subscribe(pb::SubscribeRequest {
            session_id: sid.to_string(),
            after,
        }),
    )
    .await
    .expect("Subscribe answers within the deadline")
    .expect("Subscribe succeeds");
    let mut events = GrpcEvents {
        stream: resp.into_inner(),
    };
    let first = events.expect_next().await;
    assert_eq!(first.seq, 0, "stream_opened carries seq 0: {first:?}");
    assert_eq!(first.session_id, sid);
    let opened = match first.kind {
        Some(pb::event::Kind::StreamOpened(o)) => o,
        other => panic!("the first message must be stream_opened, got {other:?}"),
    };
    assert_eq!(opened.session_id, sid);
    (events, opened)
}

/// The concatenated text of the text_delta events.
pub fn grpc_text_of(events: &[pb::Event]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::TextDelta(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// Asserts that the events are numbered: seq > 0 and strictly increasing.
#[track_caller]
pub fn assert_grpc_numbered(events: &[pb::Event]) {
    let mut last = 0;
    for e in events {
        assert!(e.seq > last, "seq {} after {last}: {events:?}", e.seq);
        last = e.seq;
    }
}

/// Asserts the kinds of gRPC `events`, in order.
#[track_caller]
pub fn assert_grpc_kinds(events: &[pb::Event], kinds: &[&str]) {
    let got: Vec<&str> = events.iter().map(kind_of).collect();
    assert_eq!(got, kinds);
}

/// The outcome of a run_finished event (panics on any other kind).
#[track_caller]
pub fn outcome_of(e: &pb::Event) -> String {
    match &e.kind {
        Some(pb::event::Kind::RunFinished(r)) => r.outcome.clone(),
        other => panic!("expected run_finished, got {other:?}"),
    }
}

// ---- REST helpers shared by several files ------------------------------------

impl TestServer {
    /// GET `path` as text: (status, content-type, body).
    pub async fn get_text(&self, path: &str) -> (u16, String, String) {
        let r = self
            .http()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, ct, r.text().await.unwrap())
    }
}
