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
/// Waits (bounded) for process `pid` to exit; false past the deadline.
pub fn wait_exited(pid: i32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        // ESRCH: it is already gone.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd; fd is ours and closed right after.
    let n = unsafe { libc::poll(&mut p, 1, DEADLINE.as_millis() as i32) };
    unsafe { libc::close(fd) };
    n == 1
}

/// `wait_exited` off the runtime's workers.
pub async fn exited(pid: i32) -> bool {
    tokio::task::spawn_blocking(move || wait_exited(pid))
        .await
        .unwrap()
}

/// Sends `req` straight into a router on `s`'s home and workspace (its
/// configuration tweaked) as if it came from `peer`: a peer address no
/// real socket on this machine can have.
pub async fn from_peer_with(
    s: &TestServer,
    peer: &str,
    req: axum::http::Request<axum::body::Body>,
    tweak: impl FnOnce(&mut ServeConfig),
) -> axum::response::Response {
    use tower::ServiceExt;
    let mut cfg = ServeConfig::new(
        CoreConfig::new(s.home.clone(), s.workspace.clone()),
        TOKEN.to_string(),
    );
    tweak(&mut cfg);
    let hub = std::sync::Arc::new(
        vak::core::host::hub::Hub::new(cfg.core.clone(), vak::core::session::live::Route::offline()).unwrap(),
    );
    let app = vak::edge::server::app(hub, &cfg).await.unwrap();
    let mut req = req;
    req.extensions_mut()
        .insert(vak::edge::listener::PeerAddr(peer.parse().unwrap()));
    app.oneshot(req).await.unwrap()
}

/// `from_peer_with` on the default configuration; the status.
pub async fn from_peer(s: &TestServer, peer: &str, req: axum::http::Request<axum::body::Body>) -> u16 {
    from_peer_with(s, peer, req, |_| {}).await.status().as_u16()
}

/// Makes a FIFO at `path`: a command that opens it waits until the test does.
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

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
    hub: Option<std::sync::Arc<vak::core::host::hub::Hub>>,
    _dirs: Option<(tempfile::TempDir, tempfile::TempDir)>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<vak::Result<()>>>,
}

/// What `TestServer::with_second_workspace` made.
pub struct SecondWorkspace {
    pub s: TestServer,
    /// The canonical root of both workspaces.
    pub root: PathBuf,
    /// `<root>/other`, as a string.
    pub other: String,
    /// A session in `other`.
    pub sid: String,
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
        Self::serve(Server::new(cfg).unwrap(), home, workspace).await
    }

    /// The two-workspace setup: a server on `<root>/main` with `[server]
    /// workspace_roots = [root]`, and a session in `<root>/other`, opened
    /// and trusted. `prepare` writes into the (canonical) root first; the two
    /// folders are made after it if it did not.
    pub async fn with_second_workspace(prepare: impl FnOnce(&Path)) -> SecondWorkspace {
        let roots = tempfile::tempdir().unwrap();
        let root = roots.path().canonicalize().unwrap();
        let home = tempfile::tempdir().unwrap();
        prepare(&root);
        std::fs::create_dir_all(root.join("main")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        let r = root.clone();
        let mut s = Self::start_in(home.path(), &root.join("main"), move |c| {
            c.core.workspace_roots = vec![r];
        })
        .await;
        // The server owns the folders, so they live as long as it does.
        s._dirs = Some((roots, home));
        let other = root.join("other").display().to_string();
        let (status, w) = s
            .post(
                "/workspaces/open",
                serde_json::json!({"path": other, "trust": true}),
            )
            .await;
        assert_eq!(status, 200, "{w}");
        let (status, c) = s.post("/sessions", serde_json::json!({"workspace": other})).await;
        assert_eq!(status, 201, "{c}");
        let sid = c["session_id"].as_str().unwrap().to_string();
        SecondWorkspace { s, root, other, sid }
    }

    /// Serves `server` on 127.0.0.1:0 in this process.
    async fn serve(server: Server, home: &Path, workspace: &Path) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hub = server.hub().clone();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(listener, async move {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            url: format!("http://{addr}"),
            home: home.to_path_buf(),
            workspace: workspace.to_path_buf(),
            hub: Some(hub),
            _dirs: None,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// The core of an in-process server (to drive what no request can, such
    /// as the start of a shutdown while the listener still answers).
    pub fn hub(&self) -> &std::sync::Arc<vak::core::host::hub::Hub> {
        self.hub.as_ref().expect("an in-process server")
    }

    /// The client helpers for a server this test did not start in-process
    /// (a `vak serve` child started with `--token` TOKEN); dropping it stops nothing.
    pub fn remote(url: &str) -> TestServer {
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        TestServer {
            addr,
            url: url.trim_end_matches('/').to_string(),
            home: PathBuf::new(),
            workspace: PathBuf::new(),
            hub: None,
            _dirs: None,
            shutdown: None,
            task: None,
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
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    /// Any method with an optional JSON body; returns (status, body).
    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.http().request(method, format!("{}{path}", self.url));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, path, None).await
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

    /// The body of the next approval_requested.
    pub async fn next_ask(&mut self) -> Value {
        self.until("approval_requested")
            .await
            .pop()
            .unwrap()
            .body()
            .clone()
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
/// The last frame, which must be run_finished; its body.
pub fn finished(frames: &[Frame]) -> &Value {
    let last = frames.last().expect("frames");
    assert_eq!(last.event, "run_finished");
    last.body()
}

#[track_caller]
pub fn assert_completed(frames: &[Frame]) {
    assert_eq!(finished(frames)["outcome"], "completed", "{frames:#?}");
}

/// Everything the client saw, as one text (for leak checks).
pub fn all_text(frames: &[Frame]) -> String {
    frames
        .iter()
        .map(|f| f.data.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

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
        Some(Kind::ToolOutput(_)) => "tool_output",
        Some(Kind::ApprovalRequested(_)) => "approval_requested",
        Some(Kind::ApprovalResolved(_)) => "approval_resolved",
        Some(Kind::Status(_)) => "status",
        Some(Kind::RunFinished(_)) => "run_finished",
        Some(Kind::Resync(_)) => "resync",
        Some(Kind::SessionClosed(_)) => "session_closed",
        Some(Kind::Notice(_)) => "notice",
        Some(Kind::Side(_)) => "side",
        Some(Kind::BackgroundResult(_)) => "background_result",
        Some(Kind::Worker(_)) => "worker",
        Some(Kind::Workbench(_)) => "workbench",
        Some(Kind::DraftDiscarded(_)) => "draft_discarded",
        Some(Kind::LaunchOutput(_)) => "launch_output",
        Some(Kind::Commitment(_)) => "commitment",
        Some(Kind::GoalUpdate(_)) => "goal_update",
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
        Some(pb::event::Kind::RunFinished(r)) => r.outcome().json_name().to_string(),
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
        response_text(r).await
    }

    /// Stores `key` for `provider` (PUT /config/key), asserting it was taken; the answer.
    pub async fn store_key(&self, provider: &str, key: &str) -> Value {
        let (code, v) = self
            .send(
                reqwest::Method::PUT,
                "/config/key",
                Some(serde_json::json!({"provider": provider, "key": key})),
            )
            .await;
        assert_eq!(code, 200, "{v}");
        v
    }
}

/// A response as text: (status, content-type, body).
pub async fn response_text(r: reqwest::Response) -> (u16, String, String) {
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

impl TestServer {
    /// Writes one raw HTTP/1.1 request (a path no client library would normalise) and
    /// returns the whole response as text.
    pub async fn raw_http1_response(&self, head: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, tcp.read_to_end(&mut buf))
            .await
            .expect("the server answers and closes");
        String::from_utf8_lossy(&buf).to_string()
    }
}

/// Writes one raw HTTP/1.1 request and returns the response's status line.
pub async fn raw_http1(s: &TestServer, head: &str) -> String {
    let text = s.raw_http1_response(head).await;
    text.lines().next().unwrap_or("").to_string()
}

// ---- the multiplexed /stream ---------------------------------------------------

impl TestServer {
    /// Opens `GET {base}/stream?{query}` (base: this server's url or a proxy's), with
    /// `last_event_id` as the Last-Event-ID header, and reads its first frame, which must be
    /// stream_opened without an id.
    pub async fn open_stream(&self, base: &str, query: &str, last_event_id: Option<&str>) -> Sse {
        let resp = self.stream_request(base, query, last_event_id).await;
        assert_eq!(resp.status(), 200, "/stream?{query} opens");
        let mut sse = Sse::new(resp);
        let first = sse.next().await.expect("a first frame");
        assert_eq!(first.event, "stream_opened", "{first:?}");
        assert_eq!(first.id, None, "stream_opened carries no id");
        sse.opened = Some(first);
        sse
    }

    /// The raw response to `GET {base}/stream?{query}`, for refusals.
    pub async fn stream_request(
        &self,
        base: &str,
        query: &str,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let mut req = self.http().get(format!("{base}/stream?{query}"));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        tokio::time::timeout(DEADLINE, req.send())
            .await
            .expect("/stream answers within the deadline")
            .unwrap()
    }

    /// The session's latest seq, from GET /sessions.
    pub async fn latest_seq(&self, sid: &str) -> u64 {
        let (code, list) = self.get("/sessions").await;
        assert_eq!(code, 200);
        list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["session_id"] == sid)
            .unwrap_or_else(|| panic!("session {sid} is listed: {list}"))["latest_seq"]
            .as_u64()
            .unwrap()
    }
}

/// `session=A&session=B...` for a /stream query.
pub fn sessions_query(sids: &[&str]) -> String {
    sids.iter()
        .map(|s| format!("session={s}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The kind of an agent frame's event (its one key besides seq and session_id).
pub fn agent_kind(data: &Value) -> String {
    let keys: Vec<&String> = data
        .as_object()
        .unwrap_or_else(|| panic!("an agent frame's data is an object: {data}"))
        .keys()
        .filter(|k| *k != "seq" && *k != "session_id")
        .collect();
    assert_eq!(keys.len(), 1, "one event kind per frame: {data}");
    keys[0].clone()
}

/// Parses a cursor vector `<session>:<seq>,...` (the test's own parser, not the server's).
#[track_caller]
pub fn parse_vector(id: &str) -> Vec<(String, u64)> {
    if id.is_empty() {
        return Vec::new();
    }
    id.split(',')
        .map(|e| {
            let (s, q) = e
                .rsplit_once(':')
                .unwrap_or_else(|| panic!("malformed cursor entry {e:?} in {id:?}"));
            (
                s.to_string(),
                q.parse().unwrap_or_else(|_| panic!("bad seq in {id:?}")),
            )
        })
        .collect()
}

// ---- a TCP proxy that can cut its connections ------------------------------------

/// A TCP proxy on 127.0.0.1:0 in front of `target`. It counts the connections it
/// accepted, records the first request head (request line and headers) each one
/// carried, and can cut every live connection at once, as a network failure would.
pub struct Proxy {
    pub addr: SocketAddr,
    pub url: String,
    state: std::sync::Arc<ProxyState>,
    accept: JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    live: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    heads: std::sync::Mutex<Vec<String>>,
    accepted: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                st.accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let conn = tokio::spawn(Self::forward(client, target, st.clone()));
                let mut live = st.live.lock().unwrap();
                live.retain(|h| !h.is_finished());
                live.push(conn.abort_handle());
            }
        });
        Proxy {
            addr,
            url: format!("http://{addr}"),
            state,
            accept,
        }
    }

    async fn forward(mut client: tokio::net::TcpStream, target: SocketAddr, st: std::sync::Arc<ProxyState>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
            return;
        };
        // Read the first request head so the tests can see what the client sent.
        let mut head = Vec::new();
        let mut buf = [0u8; 8192];
        while find(&head, b"\r\n\r\n").is_none() && head.len() < 64 * 1024 {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let end = find(&head, b"\r\n\r\n").map_or(head.len(), |p| p + 4);
        st.heads
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&head[..end]).into_owned());
        st.changed.notify_waiters();
        if server.write_all(&head).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    }

    /// Cuts every live connection (both sockets close); returns how many there were.
    pub fn cut(&self) -> usize {
        let mut live = self.state.live.lock().unwrap();
        let n = live.iter().filter(|h| !h.is_finished()).count();
        for h in live.drain(..) {
            h.abort();
        }
        n
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The first request head of each connection, in the order they arrived.
    pub fn request_heads(&self) -> Vec<String> {
        self.state.heads.lock().unwrap().clone()
    }

    /// Waits until `n` request heads have been seen; panics past the deadline.
    pub async fn wait_for_requests(&self, n: usize) -> Vec<String> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                let changed = self.state.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let heads = self.request_heads();
                if heads.len() >= n {
                    return heads;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{n} requests through the proxy within the deadline: {:?}",
                self.request_heads()
            )
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// The value of header `name` (case-insensitive) in a raw request head.
pub fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

// ---- a pseudo-terminal for interactive clients (vak term) -----------------------

/// A program running in a real pseudo-terminal. What it writes is fed to a vt100
/// emulator, so a test reads the screen as a person would see it.
pub struct Pty {
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    master: Box<dyn portable_pty::MasterPty + Send>,
    writer: Box<dyn std::io::Write + Send>,
    screen: std::sync::Arc<std::sync::Mutex<vt100::Parser>>,
    changed: std::sync::Arc<tokio::sync::Notify>,
    /// The output ended: every holder of the terminal (the program) closed it.
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Pty {
    /// Starts `cmd` in a `rows` x `cols` terminal.
    pub fn spawn(cmd: portable_pty::CommandBuilder, rows: u16, cols: u16) -> Pty {
        use std::io::Read;
        use std::sync::{Arc, Mutex};
        let pair = portable_pty::native_pty_system()
            .openpty(portable_pty::PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("a pseudo-terminal");
        let child = pair
            .slave
            .spawn_command(cmd)
            .expect("the program starts in the pty");
        // Only the child keeps the slave open, so the reader sees EOF when it exits.
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().unwrap();
        let writer = pair.master.take_writer().unwrap();
        let screen = Arc::new(Mutex::new(vt100::Parser::new(
            rows.try_into().expect("rows > 0"),
            cols.try_into().expect("cols > 0"),
            0,
        )));
        let changed = Arc::new(tokio::sync::Notify::new());
        let ended: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let (s, c, e) = (screen.clone(), changed.clone(), ended.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().process(&buf[..n]);
                c.notify_waiters();
            }
            e.store(true, std::sync::atomic::Ordering::SeqCst);
            c.notify_waiters();
        });
        Pty {
            child,
            master: pair.master,
            writer,
            screen,
            changed,
            ended,
        }
    }

    /// Types `text` (raw bytes: "\r" is Enter, "\x03" Ctrl-C, "\x04" Ctrl-D).
    pub fn send(&mut self, text: &str) {
        use std::io::Write;
        self.writer.write_all(text.as_bytes()).unwrap();
        self.writer.flush().unwrap();
    }

    /// The screen's text, row by row.
    pub fn screen(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    /// Waits until the screen shows `needle`; returns the screen. Panics past the deadline.
    pub async fn wait_for(&self, needle: &str) -> String {
        self.wait_until(needle, |screen| screen.contains(needle)).await
    }

    /// Waits until the screen has a row that is exactly `line` (trailing blanks aside).
    pub async fn wait_for_line(&self, line: &str) -> String {
        self.wait_until(line, |screen| screen.lines().any(|l| l.trim_end() == line))
            .await
    }

    /// Waits until `ok(screen)`; `what` names the wait in the panic past the deadline.
    pub async fn wait_until(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let screen = self.screen();
                if ok(&screen) {
                    return screen;
                }
                changed.await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "the screen shows {what:?} within the deadline; it shows:\n{}",
                self.screen()
            )
        })
    }

    /// Waits for the program to exit (its output ends when it does); returns its exit code.
    pub async fn wait_exit(&mut self) -> u32 {
        tokio::time::timeout(DEADLINE, async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the program exits within the deadline; screen:\n{}",
                self.screen()
            )
        });
        self.child.wait().expect("the exit status").exit_code()
    }

    /// Whether the first cell of the last place the screen shows `needle` is dimmed (None: not shown).
    pub fn is_dim(&self, needle: &str) -> Option<bool> {
        let parser = self.screen.lock().unwrap();
        let screen = parser.screen();
        let (rows, cols) = (screen.size().0.get(), screen.size().1.get());
        let lines: Vec<String> = screen.rows(0, cols).collect();
        (0..rows).rev().find_map(|r| {
            let line = &lines[r as usize];
            let at = line.rfind(needle)?;
            let col = line[..at].chars().count() as u16;
            screen.cell(r, col).map(|c| c.dim())
        })
    }

    /// Whether the terminal is in its normal (cooked) mode: line editing and echo on.
    pub fn is_cooked(&self) -> bool {
        let fd = self.master.as_raw_fd().expect("a unix pty");
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is the open master of this pty; t is a valid termios to fill.
        let rc = unsafe { libc::tcgetattr(fd, &mut t) };
        assert_eq!(rc, 0, "tcgetattr on the pty");
        t.c_lflag & libc::ICANON != 0 && t.c_lflag & libc::ECHO != 0
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

// ---- a proxy that can hold new connections ------------------------------------

/// A TCP proxy on 127.0.0.1:0 that can cut every live connection and, while
/// held, accepts new ones without forwarding them: a client that reconnects
/// waits until `release`, as it would while a network is down.
pub struct HoldProxy {
    pub addr: SocketAddr,
    pub url: String,
    open: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    live: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Notified once an accepted connection is live (and so can be cut).
    changed: std::sync::Arc<tokio::sync::Notify>,
    accept: JoinHandle<()>,
}

impl HoldProxy {
    pub async fn start(target: SocketAddr) -> HoldProxy {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(tokio::sync::watch::channel(true).0);
        let live: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let accepted: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let changed: Arc<tokio::sync::Notify> = Arc::default();
        let (o, l, a, c) = (open.clone(), live.clone(), accepted.clone(), changed.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut gate = o.subscribe();
                let conn = tokio::spawn(async move {
                    if gate.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                {
                    let mut live = l.lock().unwrap();
                    live.retain(|h| !h.is_finished());
                    live.push(conn.abort_handle());
                }
                // Counted once live, so a test that saw the count can cut it.
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                c.notify_waiters();
            }
        });
        HoldProxy {
            addr,
            url: format!("http://{addr}"),
            open,
            live,
            accepted,
            changed,
            accept,
        }
    }

    /// Holds new connections (they wait) until `release`.
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    pub fn release(&self) {
        self.open.send_replace(true);
    }

    /// Cuts every live connection; returns how many there were.
    pub fn cut(&self) -> usize {
        let mut live = self.live.lock().unwrap();
        let n = live.iter().filter(|h| !h.is_finished()).count();
        for h in live.drain(..) {
            h.abort();
        }
        n
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until `n` connections were accepted (each live, so `cut` reaches
    /// it); panics past the deadline.
    pub async fn wait_accepted(&self, n: usize) {
        tokio::time::timeout(DEADLINE, async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.accepted() >= n {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} connections within the deadline, saw {}", self.accepted()))
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

// ---- a server whose route is a given provider ---------------------------------

impl TestServer {
    /// A server with fresh home and workspace whose model route is `route`
    /// (e.g. a real provider client pointed at a fake model service).
    pub async fn start_with_route(
        route: vak::core::session::live::Route,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        let home = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut s = Self::start_in_with_route(home.path(), ws.path(), route, tweak).await;
        s._dirs = Some((home, ws));
        s
    }

    /// A server on an existing home and workspace whose model route is `route` (restart tests).
    pub async fn start_in_with_route(
        home: &Path,
        workspace: &Path,
        route: vak::core::session::live::Route,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        let mut cfg = ServeConfig::new(
            CoreConfig::new(home.to_path_buf(), workspace.to_path_buf()),
            TOKEN.to_string(),
        );
        tweak(&mut cfg);
        Self::serve(Server::with_route(cfg, route).unwrap(), home, workspace).await
    }
}
pub mod fake_provider;
pub mod git;
pub mod nats;
pub mod poll;
pub mod process;
pub mod serve;
pub mod shared;
pub mod term;
pub use serve::{Serve, Served};
pub use shared::{heavy, heavy_blocking, own_process};
