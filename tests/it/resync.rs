//! The resync rule (docs/protocol.md, section 8) against a real `vak serve`, 100 trials per client.
//!
//! A resync's transcript is exact as of its `seq`, but under backpressure the server
//! merges consecutive deltas into one frame that carries only the last seq it covers, so
//! a frame read after a resync can span that seq. The rule every client follows: on
//! `resync`, stop reading that stream, fetch the transcript, show it in place of what
//! was there, and open a new stream after the transcript's seq.
//!
//! Each trial makes that case: `vak serve --ring 256` runs a fast paced run
//! (`/pace`, as fast as the server goes) on a fresh session; a proxy in front of the
//! server, whose side of the connection takes few bytes at a time (small MSS and
//! receive buffer), holds what the server sends while the clients' streams open, so
//! each stalled subscriber's queue fills and merges deltas; then it lets go, waits
//! until the clients have opened their new streams (their transcripts were read while
//! the run was live), and cancels the run. The clients start from a cursor older than
//! the ring (or, for `vak term`, reconnect after a cut with one) and from a cursor
//! ahead of the session, and each must end with exactly the final transcript's
//! assistant text. No trial sleeps: every wait is for frames or coworking frames on the
//! test's own `Stream` of the session, with a deadline.
//! Every trial counts the resyncs it saw: a cursor ahead always gets one; an old cursor
//! gets one while the server cannot serve it exactly (a server that serves old cursors
//! from its ledger sends none, and the text must still be exact). The raw SSE and gRPC
//! trials also run a reader that follows the old rule (keep reading, skip frames with
//! seq <= the transcript's), and print how often it diverged, as evidence that the
//! trials make the case the rule is for.
//!
//! Clients: SSE over plain HTTP (reqwest and the test's SSE parser), gRPC Subscribe
//! (tonic), the multiplexed `/stream` over plain HTTP, `vak term -p` over both
//! transports, the Python client (clients/python/tests/resync_trials.py: blocking and
//! asyncio, `follow` and `follow_many`, SSE and gRPC) and the TypeScript
//! `StreamFollower` (tests/node/resync.mjs, on the client's source bundled by esbuild).

use crate::support;
use crate::support::{Auth, GrpcClient, Serve, Served, Sse, DEADLINE};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use vak::proto::v1 as pb;

const TRIALS: usize = 100;

/// The bearer token (128 bits, so the server prints no warning about it).
const TOKEN: &str = "5eb1c7a4d2e94f0c8b3a6d1e7f209c4b";
/// Frames each session keeps for replay: a cursor of 1 is older than the ring once
/// the run has published a few more than this.
const RING: u64 = 256;
/// A paced run longer than any trial (the test cancels it), fast enough that a held
/// stream's queue fills in a fraction of a second, slow enough that the watcher (and a
/// client replaying from seq 1) keeps up on a debug build.
const PROMPT: &str = "/pace 10000000 20000";
/// Far ahead of any trial's session.
const AHEAD: u64 = 1_000_000_000;
/// Frames published after the held streams opened before the proxy lets go: enough to
/// fill what the server buffers for a held connection (HTTP/1.1 or HTTP/2 send
/// buffers) and the subscriber's 1024-frame queue, so deltas merge. (/stream sends a
/// presentation frame with each agent frame, so it fills first.)
const STALL_SSE: u64 = 5_000;
const STALL_GRPC: u64 = 4_000;
const STALL_STREAM: u64 = 3_000;
/// The Python trials mix SSE, /stream and grpcio (whose window is 64 KiB).
const STALL_PYTHON: u64 = 4_000;
/// vak term's gRPC client keeps tonic's default HTTP/2 window of 2 MiB per stream:
/// the server can send that much to a held stream before its queue fills.
const STALL_TERM_GRPC: u64 = 34_000;
/// Frames published after the clients opened their new streams before the run is
/// cancelled, and the most to wait for those streams.
const LIVE_AFTER: u64 = 300;
const LIVE_MAX: u64 = 8_000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// How long a trial's clients may take to end: a client from a cursor older than the
/// ring reads the whole run (the server replays it from its ledger) before the end.
const END: std::time::Duration = std::time::Duration::from_secs(180);

/// Waits for a trial's clients to end, up to `END`.
async fn within_end<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(END, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} within {END:?}"))
}

/// Waits for `fut` up to the deadline, naming `what` when it does not come.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} within {DEADLINE:?}"))
}

// ---- the server: a real `vak serve` -------------------------------------------------------

struct Vak {
    _served: Served,
    url: String,
    addr: SocketAddr,
    http: reqwest::Client,
    workspace: PathBuf,
}

impl Vak {
    async fn start() -> Vak {
        Vak::start_with_ring(RING).await
    }

    async fn start_with_ring(ring: u64) -> Vak {
        // A held connection must not look idle to the server's reaper (60 s by
        // default): it would close it where the proxy cannot pass that on.
        let served = Serve::new()
            .token(TOKEN)
            .args(["--ring", &ring.to_string(), "--idle-timeout", "1h"])
            .env("RUST_LOG", "vak=warn")
            .start()
            .await;
        Vak {
            url: served.url.clone(),
            addr: served.addr,
            http: authed_http(),
            workspace: served.workspace().to_path_buf(),
            _served: served,
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r = within(
            "a REST answer",
            self.http.post(format!("{}{path}", self.url)).json(&body).send(),
        )
        .await
        .unwrap();
        assert!(r.status().is_success(), "POST {path}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn create_session(&self) -> String {
        self.post("/sessions", json!({})).await["session_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn transcript(&self, sid: &str) -> Value {
        transcript(&self.http, &self.url, sid).await
    }

    async fn grpc(&self) -> GrpcClient {
        grpc_client(&self.url).await
    }
}

fn authed_http() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// A gRPC client whose HTTP/2 connection is up (a first call made): a new connection
/// would wait for the server's SETTINGS, which the proxy may be holding. Its streams
/// have HTTP/2's default window of 64 KiB (grpcio's too; tonic's own default is 2 MiB),
/// so a held stream backs up into the server after that much.
async fn grpc_client(url: &str) -> GrpcClient {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .initial_stream_window_size(Some(65_535));
    let channel = within("a gRPC connection", endpoint.connect()).await.unwrap();
    let mut c = pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth(TOKEN.into()));
    within("ListSessions", c.list_sessions(pb::ListSessionsRequest {}))
        .await
        .unwrap();
    c
}

async fn transcript(http: &reqwest::Client, base: &str, sid: &str) -> Value {
    let r = within(
        "the transcript",
        http.get(format!("{base}/sessions/{sid}/transcript")).send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "GET transcript");
    r.json().await.unwrap()
}

/// The assistant's text in a transcript: its assistant entries, in order.
fn assistant_text(t: &Value) -> String {
    t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["text"].as_str().unwrap_or(""))
        .collect()
}

/// The trials' runs end cancelled, which the transcript records as a `run` entry.
fn run_over(t: &Value) -> bool {
    t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "run")
}

fn seq_of(t: &Value) -> u64 {
    t["seq"].as_u64().unwrap_or(0)
}

// ---- the proxy that holds what the server sends ----------------------------------------------

/// A TCP proxy on 127.0.0.1:0 in front of the server. Its connections to the server
/// announce a small MSS and take a small receive buffer, so the server's kernel buffers
/// hold little of what it sends; while held, it reads nothing from the server (the
/// server's writes then stall at once, as for a client that stopped reading). It can
/// also cut every connection.
struct Valve {
    url: String,
    open: Arc<watch::Sender<bool>>,
    live: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: JoinHandle<()>,
}

impl Valve {
    async fn start(target: SocketAddr) -> Valve {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let open = Arc::new(watch::channel(true).0);
        let live: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (o, l) = (open.clone(), live.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let conn = tokio::spawn(Self::forward(client, target, o.subscribe()));
                let mut live = l.lock().unwrap();
                live.retain(|h| !h.is_finished());
                live.push(conn.abort_handle());
            }
        });
        Valve {
            url,
            open,
            live,
            accept,
        }
    }

    async fn upstream(target: SocketAddr) -> std::io::Result<TcpStream> {
        use std::os::fd::AsRawFd;
        let socket = TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4096)?;
        let mss: libc::c_int = 536;
        // SAFETY: a valid socket descriptor and a c_int option value of the right size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mss as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "TCP_MAXSEG: {}", std::io::Error::last_os_error());
        socket.connect(target).await
    }

    async fn forward(client: TcpStream, target: SocketAddr, mut open: watch::Receiver<bool>) {
        let Ok(server) = Self::upstream(target).await else {
            return;
        };
        let _ = client.set_nodelay(true);
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let up = async {
            let _ = tokio::io::copy(&mut cr, &mut sw).await;
            let _ = sw.shutdown().await;
        };
        let down = async {
            let mut buf = vec![0u8; 4096];
            loop {
                // One chunk is read ahead even while held, so a connection the server
                // closes is closed here at once; past it nothing is read until the release.
                let n = match sr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if open.wait_for(|o| *o).await.is_err() {
                    return;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = down => {}
            _ = async { up.await; std::future::pending::<()>().await } => {}
        }
    }

    /// From now on nothing the server sends is passed on (new connections too).
    fn hold(&self) {
        self.open.send_replace(false);
    }

    fn release(&self) {
        self.open.send_replace(true);
    }

    /// Cuts every live connection.
    fn cut(&self) {
        for h in self.live.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for Valve {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

// ---- the watcher: the test's own view of the run -----------------------------------------------

/// The session on a gRPC `Stream` straight to the server: the latest seq, whether the
/// run finished, and which other clients have attached (coworking frames).
struct Watch {
    stream: tonic::Streaming<pb::StreamMessage>,
    own: String,
    seq: u64,
    finished: bool,
    approvals_asked: usize,
    others: HashSet<String>,
}

impl Watch {
    async fn open(grpc: &mut GrpcClient, sid: &str) -> Watch {
        let resp = within(
            "Stream",
            grpc.stream(pb::StreamRequest {
                sessions: vec![sid.to_string()],
                ..Default::default()
            }),
        )
        .await
        .unwrap();
        let mut w = Watch {
            stream: resp.into_inner(),
            own: String::new(),
            seq: 0,
            finished: false,
            approvals_asked: 0,
            others: HashSet::new(),
        };
        match w.message().await.frame {
            Some(pb::stream_message::Frame::StreamOpened(o)) => w.own = o.stream_id,
            other => panic!("the watcher's first frame is stream_opened, got {other:?}"),
        }
        w
    }

    async fn message(&mut self) -> pb::StreamMessage {
        self.stream
            .message()
            .await
            .expect("the watcher's stream carries no error")
            .expect("the watcher's stream stays open")
    }

    /// Reads until `done(self)`; panics past the deadline naming `what`.
    async fn until(&mut self, what: &str, done: impl Fn(&Watch) -> bool) {
        use pb::stream_message::Frame as F;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !done(self) {
            let m = tokio::time::timeout_at(deadline, self.message())
                .await
                .unwrap_or_else(|_| panic!("{what} within {DEADLINE:?} (seq {})", self.seq));
            match m.frame {
                Some(F::Agent(e)) => {
                    self.seq = self.seq.max(e.seq);
                    match e.kind {
                        Some(pb::event::Kind::RunFinished(_)) => self.finished = true,
                        Some(pb::event::Kind::ApprovalRequested(_)) => self.approvals_asked += 1,
                        _ => {}
                    }
                }
                Some(F::Coworking(c)) => {
                    for client in c.clients.iter().chain(&c.joined) {
                        if client.client_id != self.own {
                            self.others.insert(client.client_id.clone());
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

// ---- one trial ------------------------------------------------------------------------

/// A fresh session with a paced run going on, past the ring.
async fn begin(vak: &Vak, grpc: &mut GrpcClient) -> (String, Watch) {
    let sid = vak.create_session().await;
    let mut watch = Watch::open(grpc, &sid).await;
    vak.post(&format!("/sessions/{sid}/run"), json!({ "prompt": PROMPT }))
        .await;
    watch.until("the run past the ring", |w| w.seq > RING + 8).await;
    (sid, watch)
}

/// The clients' streams are held: once `clients` streams of other clients have
/// subscribed and `stall` more frames went by, lets go. Then waits until the clients
/// have opened `reopens` more streams (a client opens a new stream once it has the
/// transcript for its resync, so its transcript was read while the run was live; at
/// most `LIVE_MAX` frames, for a client that gets no resync or does not reopen), lets
/// `LIVE_AFTER` more frames go by, cancels the run and waits for its end. Returns the
/// final assistant text.
async fn stall_then_end(
    vak: &Vak,
    valve: &Valve,
    sid: &str,
    watch: &mut Watch,
    clients: usize,
    reopens: usize,
    stall: u64,
) -> String {
    watch
        .until("the held clients subscribed", |w| w.others.len() >= clients)
        .await;
    let from = watch.seq;
    watch
        .until("the stall", |w| w.seq >= from + stall || w.finished)
        .await;
    valve.release();
    let from = watch.seq;
    watch
        .until("the clients' new streams", |w| {
            w.others.len() >= clients + reopens || w.seq >= from + LIVE_MAX || w.finished
        })
        .await;
    let from = watch.seq;
    watch
        .until("frames after the new streams", |w| {
            w.seq >= from + LIVE_AFTER || w.finished
        })
        .await;
    vak.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    watch.until("run_finished", |w| w.finished).await;
    let t = vak.transcript(sid).await;
    assert!(run_over(&t), "the run ended cancelled: {t}");
    let text = assistant_text(&t);
    assert!(text.len() > 10_000, "a long answer: {} bytes", text.len());
    text
}

/// What one client ended with.
#[derive(Debug, Default)]
struct Tally {
    text: String,
    resyncs: usize,
    reasons: Vec<String>,
}

impl Tally {
    fn resync(&mut self, reason: &str, t: &Value) -> bool {
        self.resyncs += 1;
        self.reasons.push(reason.to_string());
        self.text = assistant_text(t);
        run_over(t)
    }
}

/// Counts over the trials of one client, printed at the end.
#[derive(Default)]
struct Stats {
    trials: usize,
    resynced: Vec<usize>,
    resyncs: usize,
    old_rule_merged: usize,
    old_rule_diverged: usize,
    started: Option<Instant>,
}

impl Stats {
    fn new(kinds: usize) -> Stats {
        Stats {
            resynced: vec![0; kinds],
            started: Some(Instant::now()),
            ..Stats::default()
        }
    }

    /// The old-rule reader's text and whether its stream carried merged deltas.
    fn old_rule(&mut self, (text, merged): (String, bool), expected: &str) {
        self.old_rule_merged += usize::from(merged);
        self.old_rule_diverged += usize::from(text != expected);
    }

    fn report(&self, client: &str, kinds: &[&str], old_rule: bool) {
        let per: Vec<String> = kinds
            .iter()
            .zip(&self.resynced)
            .map(|(k, n)| format!("{k}: {n} of {} trials saw a resync", self.trials))
            .collect();
        let old = if old_rule {
            format!(
                "; a reader following the old rule got merged deltas in {} and ended with \
                 a different text in {} of {} trials",
                self.old_rule_merged, self.old_rule_diverged, self.trials
            )
        } else {
            String::new()
        };
        eprintln!(
            "resync, {client}: {} trials in {:.1?}, every text exact; {}; {} resyncs in all{old}",
            self.trials,
            self.started.unwrap().elapsed(),
            per.join("; "),
            self.resyncs,
        );
    }
}

/// Checks one trial's clients against the final text and counts their resyncs.
/// `kinds[i]` names client i; a client that started ahead of the session must resync.
#[track_caller]
fn check(stats: &mut Stats, trial: usize, kinds: &[&str], tallies: &[Tally], expected: &str) {
    for ((kind, t), seen) in kinds.iter().zip(tallies).zip(stats.resynced.iter_mut()) {
        if t.text != expected {
            let at = t
                .text
                .bytes()
                .zip(expected.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(t.text.len().min(expected.len()));
            panic!(
                "trial {trial}, {kind}: the text differs from the transcript's at byte {at} \
                 ({} bytes, expected {}; resyncs {:?}): got …{:?}…, expected …{:?}…",
                t.text.len(),
                expected.len(),
                t.reasons,
                &t.text[at.saturating_sub(20)..(at + 40).min(t.text.len())],
                &expected[at.saturating_sub(20)..(at + 40).min(expected.len())],
            );
        }
        if kind.contains("ahead") {
            assert!(
                t.resyncs > 0 && t.reasons.iter().any(|r| r == "cursor_ahead"),
                "trial {trial}, {kind}: a cursor ahead of the session gets a resync: {:?}",
                t.reasons
            );
        }
        if t.resyncs > 0 {
            *seen += 1;
        }
        stats.resyncs += t.resyncs;
    }
    stats.trials += 1;
}

// ---- SSE over plain HTTP -------------------------------------------------------------------

async fn open_events(http: &reqwest::Client, base: &str, sid: &str, after: u64) -> Sse {
    let r = within(
        "the events stream's headers",
        http.get(format!("{base}/sessions/{sid}/events"))
            .header("last-event-id", after.to_string())
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    Sse::new(r)
}

/// The rule: on resync, drop the stream, take the transcript, open a new stream after its seq.
async fn sse_follow(http: reqwest::Client, base: String, sid: String, mut cursor: u64) -> Tally {
    let mut tally = Tally::default();
    loop {
        let mut sse = open_events(&http, &base, &sid, cursor).await;
        while let Some(f) = sse.next().await {
            match f.event.as_str() {
                "resync" => {
                    drop(sse);
                    let t = transcript(&http, &base, &sid).await;
                    if tally.resync(f.body()["reason"].as_str().unwrap(), &t) {
                        return tally;
                    }
                    cursor = seq_of(&t);
                    break;
                }
                "text_delta" => tally.text.push_str(f.body()["text"].as_str().unwrap()),
                "run_finished" => return tally,
                _ => {}
            }
            if f.data["seq"].as_u64().unwrap_or(0) > 0 {
                cursor = f.seq();
            }
        }
    }
}

/// The old rule, for comparison: on resync take the transcript and keep reading the same
/// stream, skipping frames with seq <= the transcript's. Returns its text, and whether
/// the stream carried merged deltas (a seq jump between deltas).
async fn sse_follow_old_rule(http: reqwest::Client, base: String, sid: String, after: u64) -> (String, bool) {
    let mut sse = open_events(&http, &base, &sid, after).await;
    let (mut text, mut skip, mut last, mut merged) = (String::new(), 0, 0, false);
    while let Some(f) = sse.next().await {
        match f.event.as_str() {
            "resync" => {
                let t = transcript(&http, &base, &sid).await;
                text = assistant_text(&t);
                skip = seq_of(&t);
            }
            "text_delta" => {
                merged |= last > 0 && f.seq() > last + 1;
                if f.seq() > skip {
                    text.push_str(f.body()["text"].as_str().unwrap());
                }
            }
            "run_finished" => break,
            _ => {}
        }
        last = f.data["seq"].as_u64().unwrap_or(0);
    }
    (text, merged)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_clients_end_with_the_transcript_text_in_100_trials() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let vak = Vak::start().await;
    let valve = Valve::start(vak.addr).await;
    let mut grpc = vak.grpc().await;
    let via = authed_http();
    let kinds = ["SSE, cursor too old", "SSE, cursor ahead"];
    let mut stats = Stats::new(kinds.len());
    for trial in 0..TRIALS {
        let (sid, mut watch) = begin(&vak, &mut grpc).await;
        valve.hold();
        let followers: Vec<JoinHandle<Tally>> = [1, AHEAD]
            .into_iter()
            .map(|after| tokio::spawn(sse_follow(via.clone(), valve.url.clone(), sid.clone(), after)))
            .collect();
        let old = tokio::spawn(sse_follow_old_rule(
            via.clone(),
            valve.url.clone(),
            sid.clone(),
            1,
        ));
        let expected = stall_then_end(&vak, &valve, &sid, &mut watch, 3, 1, STALL_SSE).await;
        let mut tallies = Vec::new();
        for f in followers {
            tallies.push(within_end("the SSE clients' end", f).await.unwrap());
        }
        check(&mut stats, trial, &kinds, &tallies, &expected);
        stats.old_rule(
            within_end("the old-rule reader's end", old).await.unwrap(),
            &expected,
        );
    }
    stats.report("SSE", &kinds, true);
}

// ---- gRPC Subscribe (tonic) ----------------------------------------------------------------

async fn grpc_follow(mut c: GrpcClient, sid: String, mut cursor: u64) -> Tally {
    use pb::event::Kind as K;
    let mut tally = Tally::default();
    loop {
        let req = pb::SubscribeRequest {
            session_id: sid.clone(),
            after: Some(cursor),
        };
        let mut events = within("Subscribe's headers", c.subscribe(req))
            .await
            .unwrap()
            .into_inner();
        loop {
            let e = within("a gRPC event", events.message()).await;
            let Ok(Some(e)) = e else { break };
            match &e.kind {
                Some(K::Resync(r)) => {
                    drop(events);
                    let t = within(
                        "GetTranscript",
                        c.get_transcript(pb::GetTranscriptRequest {
                            session_id: sid.clone(),
                        }),
                    )
                    .await
                    .unwrap()
                    .into_inner();
                    let t = transcript_json(&t);
                    if tally.resync(r.reason().json_name(), &t) {
                        return tally;
                    }
                    cursor = seq_of(&t);
                    break;
                }
                Some(K::TextDelta(d)) => tally.text.push_str(&d.text),
                Some(K::RunFinished(_)) => return tally,
                _ => {}
            }
            if e.seq > 0 {
                cursor = e.seq;
            }
        }
    }
}

async fn grpc_follow_old_rule(
    mut c: GrpcClient,
    mut direct: GrpcClient,
    sid: String,
    after: u64,
) -> (String, bool) {
    use pb::event::Kind as K;
    let req = pb::SubscribeRequest {
        session_id: sid.clone(),
        after: Some(after),
    };
    let mut events = within("Subscribe's headers", c.subscribe(req))
        .await
        .unwrap()
        .into_inner();
    let (mut text, mut skip, mut last, mut merged) = (String::new(), 0, 0, false);
    while let Ok(Some(e)) = within("a gRPC event", events.message()).await {
        match &e.kind {
            Some(K::Resync(_)) => {
                let t = within(
                    "GetTranscript",
                    direct.get_transcript(pb::GetTranscriptRequest {
                        session_id: sid.clone(),
                    }),
                )
                .await
                .unwrap()
                .into_inner();
                text = assistant_text(&transcript_json(&t));
                skip = t.seq;
            }
            Some(K::TextDelta(d)) => {
                merged |= last > 0 && e.seq > last + 1;
                if e.seq > skip {
                    text.push_str(&d.text);
                }
            }
            Some(K::RunFinished(_)) => break,
            _ => {}
        }
        last = e.seq;
    }
    (text, merged)
}

/// The parts of a gRPC Transcript the trials read, as its JSON would have them.
fn transcript_json(t: &pb::Transcript) -> Value {
    let messages: Vec<Value> = t
        .messages
        .iter()
        .map(|m| json!({"role": m.role().json_name(), "text": m.text}))
        .collect();
    json!({"seq": t.seq, "messages": messages})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_clients_end_with_the_transcript_text_in_100_trials() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let vak = Vak::start().await;
    let valve = Valve::start(vak.addr).await;
    let mut grpc = vak.grpc().await;
    // One HTTP/2 connection through the proxy, up before any trial holds it.
    let via = grpc_client(&valve.url).await;
    let kinds = ["gRPC, cursor too old", "gRPC, cursor ahead"];
    let mut stats = Stats::new(kinds.len());
    for trial in 0..TRIALS {
        let (sid, mut watch) = begin(&vak, &mut grpc).await;
        valve.hold();
        let followers: Vec<JoinHandle<Tally>> = [1, AHEAD]
            .into_iter()
            .map(|after| tokio::spawn(grpc_follow(via.clone(), sid.clone(), after)))
            .collect();
        let old = tokio::spawn(grpc_follow_old_rule(via.clone(), grpc.clone(), sid.clone(), 1));
        let expected = stall_then_end(&vak, &valve, &sid, &mut watch, 3, 1, STALL_GRPC).await;
        let mut tallies = Vec::new();
        for f in followers {
            tallies.push(within_end("the gRPC clients' end", f).await.unwrap());
        }
        check(&mut stats, trial, &kinds, &tallies, &expected);
        stats.old_rule(
            within_end("the old-rule reader's end", old).await.unwrap(),
            &expected,
        );
    }
    stats.report("gRPC", &kinds, true);
}

// ---- the multiplexed /stream over plain HTTP ---------------------------------------------------

/// The rule on /stream: on a session's resync, drop the connection, take that session's
/// transcript, and open the stream again with that session's entry set to its seq.
async fn stream_follow(http: reqwest::Client, base: String, sid: String, after: u64) -> Tally {
    let mut tally = Tally::default();
    let mut vector = format!("{sid}:{after}");
    loop {
        let r = within(
            "the /stream headers",
            http.get(format!("{base}/stream?session={sid}"))
                .header("last-event-id", &vector)
                .send(),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
        let mut sse = Sse::new(r);
        while let Some(f) = sse.next().await {
            if let Some(id) = &f.id {
                vector = id.clone();
            }
            match f.event.as_str() {
                "resync" => {
                    drop(sse);
                    let t = transcript(&http, &base, &sid).await;
                    if tally.resync(f.data["resync"]["reason"].as_str().unwrap(), &t) {
                        return tally;
                    }
                    vector = format!("{sid}:{}", seq_of(&t));
                    break;
                }
                "agent" if f.data.get("text_delta").is_some() => tally
                    .text
                    .push_str(f.data["text_delta"]["text"].as_str().unwrap()),
                "agent" if f.data.get("run_finished").is_some() => return tally,
                _ => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_clients_end_with_the_transcript_text_in_100_trials() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let vak = Vak::start().await;
    let valve = Valve::start(vak.addr).await;
    let mut grpc = vak.grpc().await;
    let via = authed_http();
    let kinds = ["/stream, cursor too old", "/stream, cursor ahead"];
    let mut stats = Stats::new(kinds.len());
    for trial in 0..TRIALS {
        let (sid, mut watch) = begin(&vak, &mut grpc).await;
        valve.hold();
        let followers: Vec<JoinHandle<Tally>> = [1, AHEAD]
            .into_iter()
            .map(|after| tokio::spawn(stream_follow(via.clone(), valve.url.clone(), sid.clone(), after)))
            .collect();
        let expected = stall_then_end(&vak, &valve, &sid, &mut watch, 2, 1, STALL_STREAM).await;
        let mut tallies = Vec::new();
        for f in followers {
            tallies.push(within_end("the /stream clients' end", f).await.unwrap());
        }
        check(&mut stats, trial, &kinds, &tallies, &expected);
    }
    stats.report("/stream", &kinds, false);
}

// ---- vak term -p ------------------------------------------------------------------------------

/// `vak term -p` runs the paced prompt itself; its connection is cut and held while the
/// run goes on, so it comes back with a cursor older than the ring. (vak term takes no
/// cursor from outside, so it has no cursor-ahead case.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vak_term_ends_with_the_transcript_text_in_100_trials() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let vak = Vak::start().await;
    let valve = Valve::start(vak.addr).await;
    let mut grpc = vak.grpc().await;
    let kinds = ["vak term, reconnected with a cursor too old"];
    let mut stats = Stats::new(kinds.len());
    for trial in 0..TRIALS {
        // Every fourth over gRPC: its trials stall longest (the follower above the
        // transport is the same code).
        let (transport, stall) = if trial % 4 == 3 {
            ("grpc", STALL_TERM_GRPC)
        } else {
            ("sse", STALL_SSE)
        };
        let sid = vak.create_session().await;
        let mut watch = Watch::open(&mut grpc, &sid).await;
        let term = support::process::vak(&["term"])
            .args(["--url", &valve.url, "--token", TOKEN, "--transport", transport])
            .args(["--session", &sid, "-p", PROMPT])
            .env_remove("VAK_URL")
            .spawn()
            .expect("vak term starts");
        let out = tokio::spawn(term.wait_with_output());
        watch
            .until("vak term's run past the ring", |w| {
                w.seq > RING + 8 && !w.others.is_empty()
            })
            .await;
        valve.hold();
        valve.cut();
        // Its first stream, and the one it opens again after the cut.
        let expected = stall_then_end(&vak, &valve, &sid, &mut watch, 2, 1, stall).await;
        let out = within_end("vak term's exit", out).await.unwrap().unwrap();
        let (stdout, stderr) = (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        );
        assert_eq!(
            out.status.code(),
            Some(130),
            "trial {trial} ({transport}): a cancelled run exits 130: {stderr}"
        );
        let resyncs = stderr.matches("resynced from the transcript").count();
        let tally = Tally {
            text: stdout.strip_suffix('\n').unwrap_or(&stdout).to_string(),
            resyncs,
            reasons: vec![format!("{transport}: {stderr}")],
        };
        check(&mut stats, trial, &kinds, &[tally], &expected);
    }
    stats.report("vak term (sse and grpc)", &kinds, false);
}

// ---- the Python and TypeScript clients, 100 trials in one process each ---------------------------

/// A driver process speaking the trial protocol: a ready line, then for each trial
/// line it reads, a result line.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Driver {
    async fn spawn(mut cmd: Command) -> Driver {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the driver starts");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut d = Driver { child, stdin, lines };
        let ready = d.line().await;
        assert_eq!(ready["ready"], true, "{ready}");
        d
    }

    async fn line(&mut self) -> Value {
        let line = within_end("a line from the driver", self.lines.next_line())
            .await
            .unwrap()
            .expect("the driver is still running (its stderr says why not)");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    async fn send(&mut self, v: Value) {
        self.stdin.write_all(format!("{v}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn finish(mut self) {
        drop(self.stdin);
        let status = within("the driver's exit", self.child.wait()).await.unwrap();
        assert!(status.success(), "the driver exits 0: {status}");
    }
}

/// Runs `TRIALS` trials through a driver; each trial's result line has one follower
/// per start ("too_old", "ahead") with its text and resyncs.
async fn driven_trials(name: &str, vak: &Vak, valve: &Valve, mut driver: Driver, stall: u64) {
    let mut grpc = vak.grpc().await;
    let kinds = [format!("{name}, cursor too old"), format!("{name}, cursor ahead")];
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    let mut stats = Stats::new(kinds.len());
    for trial in 0..TRIALS {
        let (sid, mut watch) = begin(vak, &mut grpc).await;
        valve.hold();
        driver.send(json!({"trial": trial, "session": sid})).await;
        let expected = stall_then_end(vak, valve, &sid, &mut watch, 2, 1, stall).await;
        let result = driver.line().await;
        assert_eq!(result["trial"], trial, "{result}");
        let variant = result["variant"].as_str().unwrap_or(name).to_string();
        let tallies: Vec<Tally> = result["followers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| Tally {
                text: f["text"].as_str().unwrap().to_string(),
                resyncs: f["resyncs"].as_u64().unwrap() as usize,
                reasons: f["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_str().unwrap().to_string())
                    .collect(),
            })
            .collect();
        let named: Vec<String> = result["followers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| format!("{variant}, {}", f["start"].as_str().unwrap()))
            .collect();
        assert_eq!(named.len(), 2, "{result}");
        assert!(
            named[0].ends_with("too_old") && named[1].ends_with("ahead"),
            "{result}"
        );
        for f in result["followers"].as_array().unwrap() {
            assert_eq!(f["duplicates"].as_u64().unwrap_or(0), 0, "trial {trial}: {f}");
        }
        // Named by variant in a failure, counted per start (too old, ahead).
        let labels: Vec<&str> = named.iter().map(String::as_str).collect();
        check(&mut stats, trial, &labels, &tallies, &expected);
    }
    driver.finish().await;
    stats.report(name, &kinds, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_ends_with_the_transcript_text_in_100_trials() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let root = repo();
    let python = root.join("clients/python");
    // Creates clients/python/.venv and installs the client when missing (as make test-python does).
    // `make test` makes the venv first (make python-client); made here, it is a pip
    // install from PyPI, so its deadline is the install's, not a stream's.
    let setup = tokio::time::timeout(
        std::time::Duration::from_secs(900),
        Command::new(python.join("run-smoke.sh"))
            .arg("--setup-only")
            .status(),
    )
    .await
    .expect("clients/python/run-smoke.sh --setup-only within 15 minutes")
    .expect("clients/python/run-smoke.sh runs");
    assert!(setup.success(), "clients/python/run-smoke.sh --setup-only failed");
    let vak = Vak::start().await;
    let valve = Valve::start(vak.addr).await;
    let mut cmd = Command::new(python.join(".venv/bin/python"));
    cmd.arg(python.join("tests/resync_trials.py"))
        .args([&valve.url, TOKEN])
        .current_dir(&python);
    let driver = Driver::spawn(cmd).await;
    driven_trials("Python", &vak, &valve, driver, STALL_PYTHON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_stream_follower_ends_with_the_transcript_text_in_100_trials() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let root = repo();
    let web = root.join("clients/web");
    let node = root.join("tests/node");
    for (dir, what) in [
        (&web, "@vak/client's build tools"),
        (&node, "the eventsource package"),
    ] {
        assert!(
            dir.join("node_modules/.package-lock.json").is_file(),
            "{} has no node_modules ({what}): run `npm ci --prefix {}` (make test does it)",
            dir.display(),
            dir.display()
        );
    }
    let bundle = bundle_client(&web).await;
    let vak = Vak::start().await;
    let valve = Valve::start(vak.addr).await;
    let mut cmd = Command::new("node");
    cmd.arg(node.join("resync.mjs"))
        .arg(bundle.path().join("vak-client.mjs"))
        .args([&valve.url, TOKEN])
        .current_dir(&node);
    let driver = Driver::spawn(cmd).await;
    driven_trials("TypeScript StreamFollower", &vak, &valve, driver, STALL_STREAM).await;
}

/// The client's current source (src/, with the code `npm ci` generated into src/gen/)
/// bundled into one ES module, so the trials never run a stale dist/.
async fn bundle_client(web: &Path) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let status = within(
        "esbuild",
        Command::new(web.join("node_modules/.bin/esbuild"))
            .arg(web.join("src/index.ts"))
            .args([
                "--bundle",
                "--format=esm",
                "--platform=node",
                "--target=node20",
                "--log-level=warning",
            ])
            .arg(format!(
                "--outfile={}",
                out.path().join("vak-client.mjs").display()
            ))
            .status(),
    )
    .await
    .expect("esbuild runs");
    assert!(status.success(), "esbuild bundles clients/web/src");
    out
}

// ---- vak term: an approval still pending at a resync -------------------------------------------

/// The new stream after a resync starts after the transcript's seq, so an approval
/// requested before it is not sent again: vak term takes the approvals still pending
/// from the presentation timeline and asks them. Here its interactive prompt attaches
/// (from seq 0) to a session whose run waits on an approval far past a ring of 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vak_term_attaching_past_the_ring_asks_a_pending_approval_again() {
    // One client's trials at a time, and no other heavy test beside them: each keeps both
    // cores busy, and a deadline must measure a stuck stream, not a crowded machine.
    let _one = crate::support::heavy().await;
    let vak = Vak::start_with_ring(4).await;
    let mut grpc = vak.grpc().await;
    let sid = vak.create_session().await;
    let mut watch = Watch::open(&mut grpc, &sid).await;
    vak.post(
        &format!("/sessions/{sid}/run"),
        json!({ "prompt": "/burst 20\n/write pending.txt x\nafter" }),
    )
    .await;
    watch
        .until("the approval request", |w| w.approvals_asked == 1)
        .await;
    let mut cmd = portable_pty::CommandBuilder::new(env!("CARGO_BIN_EXE_vak"));
    cmd.args(["term", "--url", &vak.url, "--token", TOKEN, "--session", &sid]);
    for v in ["VAK_URL", "VAK_TOKEN", "VAK_HOME", "RUST_LOG"] {
        cmd.env_remove(v);
    }
    cmd.env("TERM", "xterm-256color");
    cmd.cwd(&vak.workspace);
    let mut pty = support::Pty::spawn(cmd, 30, 120);
    // Attaching replays the session from its start (most of it from the
    // ledger, the ring holds 4 frames): the pending approval is asked again.
    let screen = pty.wait_for("[y]es / [n]o / [a]lways").await;
    assert!(!screen.contains("resynced"), "{screen}");
    assert!(screen.contains("write 1 byte to pending.txt"), "{screen}");
    pty.send("y");
    let screen = pty.wait_for("echo: after").await;
    assert!(screen.contains("✓ write_file approved"), "{screen}");
    assert_eq!(
        std::fs::read_to_string(vak.workspace.join("pending.txt")).unwrap(),
        "x"
    );
    watch.until("run_finished", |w| w.finished).await;
    pty.send("\x04");
    assert_eq!(pty.wait_exit().await, 0);
}
