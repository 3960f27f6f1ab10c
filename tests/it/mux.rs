//! The multiplexed /stream end to end: one connection for many sessions, the cursor vector
//! that resumes all of them after a cut, per-session resync, follow/unfollow while live,
//! fairness under a burst, parity with the gRPC Stream RPC, limits, and coworking frames.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use vak::proto::v1 as pb;

// ---- one reader for /stream over SSE and over gRPC ------------------------------------

/// A multiplexed stream, read with deadlines as uniform frames: over SSE as served, over
/// gRPC converted to the same shape (agent and resync data as the Event JSON).
enum Conn {
    Sse(Sse),
    Grpc(tonic::Streaming<pb::StreamMessage>),
}

impl Conn {
    /// The next frame; None when the stream ended (a cut connection ends it too).
    async fn next(&mut self) -> Option<Frame> {
        match self {
            Conn::Sse(s) => s.next().await,
            Conn::Grpc(g) => {
                let m = tokio::time::timeout(DEADLINE, g.message())
                    .await
                    .expect("a gRPC stream message within the deadline")
                    .unwrap_or_else(|s| panic!("the gRPC stream carries no error status: {s:?}"))?;
                Some(grpc_frame(m))
            }
        }
    }
}

/// Opens the gRPC Stream and returns it with its stream_opened frame read.
async fn grpc_stream(c: &mut GrpcClient, sessions: &[&str], cursor: &str) -> (Conn, Frame) {
    let resp = tokio::time::timeout(
        DEADLINE,
        c.stream(pb::StreamRequest {
            sessions: sessions.iter().map(|s| s.to_string()).collect(),
            cursor: cursor.into(),
            host: false,
            config: false,
        }),
    )
    .await
    .expect("Stream answers within the deadline")
    .expect("Stream succeeds");
    let mut conn = Conn::Grpc(resp.into_inner());
    let first = conn.next().await.expect("a first message");
    assert_eq!(first.event, "stream_opened", "{first:?}");
    assert_eq!(first.id, None);
    (conn, first)
}

/// A gRPC Struct as JSON.
fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value_json(v))).collect())
}

fn value_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind as K;
    match &v.kind {
        None | Some(K::NullValue(_)) => Value::Null,
        Some(K::NumberValue(n)) => json!(n),
        Some(K::StringValue(s)) => json!(s),
        Some(K::BoolValue(b)) => json!(b),
        Some(K::StructValue(s)) => struct_json(s),
        Some(K::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
    }
}

/// A gRPC Event in the proto3 JSON mapping the SSE surfaces use (proto field names,
/// every field present): written out here so the comparison checks the server's mapping.
fn event_json(e: &pb::Event) -> Value {
    use pb::event::Kind as K;
    let input = |i: &Option<prost_types::Struct>| i.as_ref().map_or(Value::Null, struct_json);
    let body = match e.kind.as_ref().expect("an event has a kind") {
        K::StreamOpened(o) => {
            json!({"session_id": o.session_id, "latest_seq": o.latest_seq, "stream_id": o.stream_id, "cursor": o.cursor})
        }
        K::UserMessage(m) => {
            let attachments: Vec<Value> = m
                .attachments
                .iter()
                .map(|a| json!({"sha256": a.sha256, "media_type": a.media_type, "name": a.name, "size": a.size}))
                .collect();
            json!({"text": m.text, "request_id": m.request_id, "attachments": attachments})
        }
        K::TurnStarted(t) => json!({"request_id": t.request_id}),
        K::TextDelta(t) => json!({"text": t.text}),
        K::ThinkingDelta(t) => json!({"text": t.text}),
        K::ToolCall(t) => json!({"call_id": t.call_id, "tool": t.tool, "input": input(&t.input)}),
        K::ToolResult(t) => json!({"call_id": t.call_id, "ok": t.ok, "output": t.output}),
        K::ToolOutput(t) => json!({"call_id": t.call_id, "stream": t.stream().json_name(), "text": t.text}),
        K::ApprovalRequested(a) => json!({
            "request_id": a.request_id, "tool": a.tool, "reason": a.reason,
            "input": input(&a.input), "call_id": a.call_id
        }),
        K::ApprovalResolved(a) => {
            json!({"request_id": a.request_id, "outcome": a.outcome().json_name(), "reason": a.reason})
        }
        K::Status(s) => match &s.retrying {
            Some(r) => {
                json!({"busy": s.busy, "retrying": {"attempt": r.attempt, "of": r.of, "reason": r.reason}})
            }
            None => json!({"busy": s.busy}),
        },
        K::RunFinished(r) => json!({"outcome": r.outcome().json_name(), "message": r.message}),
        K::Resync(r) => json!({"reason": r.reason().json_name(), "latest_seq": r.latest_seq}),
        K::SessionClosed(c) => json!({"reason": c.reason}),
        K::Notice(n) => json!({"level": n.level().json_name(), "text": n.text}),
        K::Side(side) => {
            use pb::side::Phase as S;
            let phase = match side.phase.as_ref().expect("a side frame has a phase") {
                S::Started(st) => json!({"started": {"question": st.question, "branch_seq": st.branch_seq}}),
                S::TextDelta(t) => json!({"text_delta": {"text": t.text}}),
                S::Finished(f) => {
                    let outcome = pb::SideOutcome::try_from(f.outcome).map_or("?", |o| o.json_name());
                    let u = f.usage.unwrap_or_default();
                    let usage = json!({
                        "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                        "cache_read_tokens": u.cache_read_tokens, "cache_write_tokens": u.cache_write_tokens
                    });
                    json!({"finished": {"outcome": outcome, "message": f.message, "usage": usage}})
                }
            };
            let mut body = json!({"side_id": side.side_id});
            body.as_object_mut()
                .unwrap()
                .extend(phase.as_object().unwrap().clone());
            body
        }
        K::BackgroundResult(b) => json!({
            "source": b.source().json_name(), "id": b.id, "text": b.text, "alert": b.alert,
            "reason": b.reason().json_name(), "result_id": b.result_id, "arrived_at": b.arrived_at,
            "summarised": b.summarised
        }),
        K::LaunchOutput(o) => json!({"name": o.name, "stream": o.stream().json_name(), "text": o.text}),
        K::DraftDiscarded(d) => {
            json!({"candidate": d.candidate, "branch": d.branch, "why": d.why().json_name()})
        }
        // The mux tests never start children.
        K::Worker(_) | K::Workbench(_) => unreachable!("no children in these tests"),
        K::Commitment(_) | K::GoalUpdate(_) => unreachable!("no plans or steering in these tests"),
    };
    json!({"seq": e.seq, "session_id": e.session_id, kind_of(e): body})
}

/// A Stream message as a frame. Presentation data keeps only what these tests read:
/// seq, session_id and which kind it is (with the snapshot's seq).
fn grpc_frame(m: pb::StreamMessage) -> Frame {
    use pb::presentation_event::Kind as P;
    use pb::stream_message::Frame as F;
    let id = (!m.id.is_empty()).then(|| m.id.clone());
    let frame = m.frame.expect("a stream message has a frame");
    let (event, data) = match &frame {
        F::StreamOpened(o) => (
            "stream_opened",
            json!({"session_id": o.session_id, "latest_seq": o.latest_seq, "stream_id": o.stream_id, "cursor": o.cursor}),
        ),
        F::Agent(e) => ("agent", event_json(e)),
        F::Resync(e) => ("resync", event_json(e)),
        F::SessionClosed(e) => ("session_closed", event_json(e)),
        F::Side(e) => ("side", event_json(e)),
        F::Presentation(p) => {
            let kind = match p.kind.as_ref().expect("a presentation event has a kind") {
                P::Snapshot(t) => json!({"snapshot": {"seq": t.seq}}),
                P::ItemStarted(_) => json!({"item_started": {}}),
                P::TextDelta(_) => json!({"text_delta": {}}),
                P::ItemReplaced(_) => json!({"item_replaced": {}}),
                P::ItemCompleted(_) => json!({"item_completed": {}}),
                P::Goal(_) => json!({"goal": {}}),
            };
            let mut data = json!({"seq": p.seq, "session_id": p.session_id});
            data.as_object_mut()
                .unwrap()
                .extend(kind.as_object().unwrap().clone());
            ("presentation", data)
        }
        F::Coworking(c) => {
            let list = |l: &[pb::Client]| -> Value {
                l.iter()
                    .map(|c| json!({"client_id": c.client_id, "surface": c.surface().json_name(), "attached_at": c.attached_at}))
                    .collect()
            };
            (
                "coworking",
                json!({"session_id": c.session_id, "clients": list(&c.clients), "joined": list(&c.joined), "left": list(&c.left)}),
            )
        }
        F::Host(h) => ("host", json!({"version": h.version, "workspace": h.workspace})),
        F::Config(c) => (
            "config",
            json!({"permission_mode": c.permission_mode().json_name(), "ring": c.ring}),
        ),
    };
    if matches!(
        frame,
        F::Agent(_) | F::Resync(_) | F::SessionClosed(_) | F::Presentation(_) | F::Coworking(_)
    ) {
        assert_eq!(
            data["session_id"].as_str(),
            Some(m.session_id.as_str()),
            "the message names its frame's session"
        );
    }
    Frame {
        id,
        event: event.into(),
        data,
    }
}

// ---- what a client keeps: the frames and the cursor vector they imply --------------------

/// Every frame of one or more connections of a client, checked as it arrives: each agent
/// frame advances its session's entry, and every agent and presentation frame's id is
/// exactly the vector of the frames delivered so far, in follow order.
#[derive(Default)]
struct Log {
    cursor: Vec<(String, u64)>,
    frames: Vec<Frame>,
    last_id: Option<String>,
    /// Sessions resynced since their last agent frame (their seq may go back once).
    resynced: HashSet<String>,
    /// A follow whose entry appears with the first id naming it.
    following: Option<(String, u64)>,
    /// An unfollow whose entry goes with the first id that lacks it.
    unfollowing: Option<String>,
}

fn vector_string(v: &[(String, u64)]) -> String {
    v.iter()
        .map(|(s, q)| format!("{s}:{q}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Log {
    /// Takes a stream_opened frame: its cursor is where this connection starts. Returns the stream_id.
    fn opened(&mut self, opened: &Frame) -> String {
        assert_eq!(opened.event, "stream_opened");
        self.cursor = parse_vector(field(opened, "cursor"));
        let id = field(opened, "stream_id").to_string();
        assert!(id.starts_with("st_"), "{opened:?}");
        id
    }

    fn vector(&self) -> String {
        vector_string(&self.cursor)
    }

    fn follow(&mut self, sid: &str, seq: u64) {
        self.following = Some((sid.to_string(), seq));
    }

    fn unfollow(&mut self, sid: &str) {
        self.unfollowing = Some(sid.to_string());
    }

    #[track_caller]
    fn take(&mut self, f: Frame) {
        if let Some(id) = &f.id {
            let named: Vec<String> = parse_vector(id).into_iter().map(|(s, _)| s).collect();
            if let Some((sid, seq)) = self.following.clone() {
                if named.contains(&sid) {
                    self.cursor.push((sid, seq));
                    self.following = None;
                }
            }
            if let Some(sid) = self.unfollowing.clone() {
                if !named.contains(&sid) {
                    self.cursor.retain(|(s, _)| *s != sid);
                    self.unfollowing = None;
                }
            }
        }
        let sid = f.data["session_id"].as_str().unwrap_or_default().to_string();
        match f.event.as_str() {
            "agent" => {
                let seq = f.seq();
                assert!(seq > 0, "agent frames are numbered: {f:?}");
                let resynced = self.resynced.remove(&sid);
                let entry = self
                    .cursor
                    .iter_mut()
                    .find(|(s, _)| *s == sid)
                    .unwrap_or_else(|| panic!("an agent frame of {sid}, which is not followed: {f:?}"));
                assert!(
                    resynced || seq > entry.1,
                    "seq {seq} of {sid} after {}: {f:?}",
                    entry.1
                );
                entry.1 = seq;
                assert_eq!(
                    f.id.as_deref(),
                    Some(self.vector().as_str()),
                    "an agent frame's id is the vector after it: {f:?}"
                );
                self.last_id = f.id.clone();
            }
            "presentation" => {
                assert!(
                    self.cursor.iter().any(|(s, _)| *s == sid),
                    "a presentation frame of {sid}, which is not followed: {f:?}"
                );
                assert_eq!(
                    f.id.as_deref(),
                    Some(self.vector().as_str()),
                    "a presentation frame's id is the vector so far: {f:?}"
                );
                self.last_id = f.id.clone();
            }
            "resync" => {
                assert_eq!(f.id, None, "resync never moves the cursor");
                assert_eq!(f.data["seq"], 0);
                self.resynced.insert(sid);
            }
            "coworking" | "session_closed" | "host" | "config" => {
                assert_eq!(f.id, None, "{f:?}")
            }
            other => panic!("unexpected frame {other}: {f:?}"),
        }
        self.frames.push(f);
    }

    /// Reads until `done` holds (true) or the stream ends (false).
    async fn read_until(&mut self, conn: &mut Conn, done: impl Fn(&Log) -> bool) -> bool {
        while !done(self) {
            match conn.next().await {
                Some(f) => self.take(f),
                None => return false,
            }
        }
        true
    }

    fn agent(&self, sid: &str) -> Vec<&Frame> {
        self.frames
            .iter()
            .filter(|f| f.event == "agent" && f.data["session_id"] == sid)
            .collect()
    }

    fn seqs(&self, sid: &str) -> Vec<u64> {
        self.agent(sid).iter().map(|f| f.seq()).collect()
    }

    /// How many agent frames of `kind` arrived for `sid`.
    fn count(&self, sid: &str, kind: &str) -> usize {
        self.agent(sid)
            .iter()
            .filter(|f| agent_kind(&f.data) == kind)
            .count()
    }

    fn text(&self, sid: &str) -> String {
        self.agent(sid)
            .iter()
            .filter_map(|f| f.data["text_delta"]["text"].as_str())
            .collect()
    }

    fn resyncs(&self) -> Vec<&Frame> {
        self.frames.iter().filter(|f| f.event == "resync").collect()
    }

    /// Whether the settling snapshot of `sid` at or past `seq` has arrived.
    fn settled(&self, sid: &str, seq: u64) -> bool {
        self.frames.iter().any(|f| {
            f.event == "presentation"
                && f.data["session_id"] == sid
                && f.data.get("snapshot").is_some()
                && f.seq() >= seq
        })
    }
}

/// A string field of a stream_opened frame (its data is the StreamOpened message itself).
#[track_caller]
fn field<'a>(f: &'a Frame, key: &str) -> &'a str {
    f.data[key].as_str().unwrap_or_else(|| panic!("{key} in {f:?}"))
}

/// Opens /stream at `base` (the server or a proxy); `log` starts from its stream_opened.
/// Returns the connection and the stream_id.
async fn open(s: &TestServer, base: &str, query: &str, id: Option<&str>, log: &mut Log) -> (Conn, String) {
    let sse = s.open_stream(base, query, id).await;
    let stream_id = log.opened(sse.opened.as_ref().unwrap());
    (Conn::Sse(sse), stream_id)
}

fn burst(n: usize) -> String {
    (0..n).map(|i| format!("t{i} ")).collect()
}

/// Reads a direct /sessions/:id/events stream until `n` run_finished frames, appending to `into`.
async fn watch_until_finished(sse: &mut Sse, into: &mut Vec<Frame>, n: usize) {
    while into.iter().filter(|f| f.event == "run_finished").count() < n {
        into.push(sse.next().await.expect("the session's event stream stays open"));
    }
}

async fn approve(s: &TestServer, sid: &str, rid: &str) {
    let (code, body) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!((code, &body["outcome"]), (200, &json!("approved")), "{body}");
}

/// The data of the frames, as compared across surfaces.
fn datas(frames: &[&Frame]) -> Vec<Value> {
    frames.iter().map(|f| f.data.clone()).collect()
}

/// GET /stream that must be refused with `code`; returns the error message.
async fn refused(s: &TestServer, code: u16, query: &str, id: Option<&str>) -> String {
    let r = s.stream_request(&s.url, query, id).await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, code, "/stream?{query} with Last-Event-ID {id:?}: {body}");
    let expected = if code == 404 {
        "not_found"
    } else {
        "invalid_argument"
    };
    assert_eq!(body["error"]["code"], expected, "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

// ---- the tests ---------------------------------------------------------------------------

#[tokio::test]
async fn a_cut_connection_resumes_all_three_sessions_exactly_from_the_last_id() {
    // Permission "ask": each run parks on an approval after its first burst, so the
    // cut lands mid-run by construction, not by timing.
    let s = TestServer::start().await;
    let proxy = Proxy::start(s.addr).await;
    let mut sids = Vec::new();
    let mut watchers = Vec::new();
    for _ in 0..3 {
        let sid = s.create_session().await;
        watchers.push(s.events(&sid, None).await);
        sids.push(sid);
    }
    let refs: Vec<&str> = sids.iter().map(String::as_str).collect();
    let query = sessions_query(&refs);
    let mut log = Log::default();
    let (mut conn, _) = open(&s, &proxy.url, &query, None, &mut log).await;
    assert_eq!(
        log.vector(),
        format!("{}:0,{}:0,{}:0", sids[0], sids[1], sids[2]),
        "new sessions start live at 0, in query order"
    );

    const PROMPT: &str = "/burst 150\n/write out.txt cut\n/burst 150";
    for sid in &sids {
        assert_eq!(s.run(sid, PROMPT).await.0, 202);
    }
    let up = log
        .read_until(&mut conn, |l| {
            refs.iter().all(|sid| l.count(sid, "text_delta") >= 1)
        })
        .await;
    assert!(up, "the first connection carries every session until the cut");
    assert_eq!(proxy.cut(), 1, "one connection carries all three sessions");
    // Whatever had already arrived counts; then the stream ends.
    assert!(!log.read_until(&mut conn, |_| false).await);
    for sid in &refs {
        assert_eq!(log.count(sid, "run_finished"), 0, "{sid} is mid-run at the cut");
    }
    let cut_id = log
        .last_id
        .clone()
        .expect("frames with ids arrived before the cut");
    let before_cut: Vec<usize> = refs.iter().map(|sid| log.agent(sid).len()).collect();

    // Two sessions finish while nothing is connected; the third after the reconnect.
    let mut direct: Vec<Vec<Frame>> = vec![Vec::new(); 3];
    let mut asks = Vec::new();
    for (i, w) in watchers.iter_mut().enumerate() {
        direct[i].extend(w.until("approval_requested").await);
        let ask = direct[i].last().unwrap().body()["request_id"]
            .as_str()
            .unwrap()
            .to_string();
        asks.push(ask);
    }
    for i in 0..2 {
        approve(&s, &sids[i], &asks[i]).await;
        watch_until_finished(&mut watchers[i], &mut direct[i], 1).await;
    }

    let (mut conn, _) = open(&s, &proxy.url, &query, Some(&cut_id), &mut log).await;
    assert_eq!(log.vector(), cut_id, "the stream starts from the Last-Event-ID");
    approve(&s, &sids[2], &asks[2]).await;
    watch_until_finished(&mut watchers[2], &mut direct[2], 1).await;
    let done = log
        .read_until(&mut conn, |l| {
            refs.iter().all(|sid| l.count(sid, "run_finished") == 1)
        })
        .await;
    assert!(done, "the second connection stays up");

    let heads = proxy.request_heads();
    assert_eq!(heads.len(), 2, "one reconnect: {heads:?}");
    assert_eq!(header_of(&heads[1], "last-event-id"), Some(cut_id.clone()));
    assert!(log.resyncs().is_empty(), "nothing outgrew the ring");
    let expected_text = format!("{}{}", burst(150), burst(150));
    for (i, sid) in refs.iter().enumerate() {
        let last = direct[i].last().unwrap().seq();
        assert_eq!(
            log.seqs(sid),
            (1..=last).collect::<Vec<_>>(),
            "{sid}: every seq exactly once, in order, across both connections"
        );
        assert_eq!(
            datas(&log.agent(sid)),
            direct[i].iter().map(|f| f.data.clone()).collect::<Vec<_>>(),
            "{sid}: agent frames carry exactly the events of /sessions/:id/events"
        );
        assert_eq!(log.text(sid), expected_text, "{sid}: the text is whole");
        assert!(
            log.agent(sid).len() > before_cut[i],
            "{sid}: the reconnect replayed what the cut lost"
        );
    }
    let final_vector: Vec<(String, u64)> = direct
        .iter()
        .zip(&sids)
        .map(|(d, sid)| (sid.clone(), d.last().unwrap().seq()))
        .collect();
    assert_eq!(log.last_id, Some(vector_string(&final_vector)));
}

#[tokio::test]
async fn every_session_replays_exactly_even_one_whose_gap_outgrew_its_ring() {
    let s = TestServer::start_with(|c| c.core.bus.ring = 16).await;
    let mut sids = Vec::new();
    let mut watchers = Vec::new();
    for _ in 0..3 {
        let sid = s.create_session().await;
        watchers.push(s.events(&sid, None).await);
        sids.push(sid);
    }
    let refs: Vec<&str> = sids.iter().map(String::as_str).collect();
    let query = sessions_query(&refs);
    let mut log = Log::default();
    let (mut conn, _) = open(&s, &s.url, &query, None, &mut log).await;
    let mut direct: Vec<Vec<Frame>> = vec![Vec::new(); 3];
    for (i, sid) in refs.iter().enumerate() {
        s.run(sid, "hello").await;
        watch_until_finished(&mut watchers[i], &mut direct[i], 1).await;
    }
    assert!(
        log.read_until(&mut conn, |l| refs
            .iter()
            .all(|sid| l.count(sid, "run_finished") == 1))
            .await
    );
    let id = log.last_id.clone().unwrap();
    drop(conn);
    let at_cut: Vec<u64> = direct.iter().map(|d| d.last().unwrap().seq()).collect();

    // While disconnected: the first session bursts 10 000 events past its ring of 16
    // (replayed from its ledger), the others publish fewer frames than the ring holds.
    s.run(&sids[0], "/burst 10000").await;
    s.run(&sids[1], "again").await;
    s.run(&sids[2], "once more").await;
    for i in 0..3 {
        watch_until_finished(&mut watchers[i], &mut direct[i], 2).await;
    }
    let latest: Vec<u64> = direct.iter().map(|d| d.last().unwrap().seq()).collect();
    assert!(latest[0] - at_cut[0] > 16 && latest[1] - at_cut[1] < 16 && latest[2] - at_cut[2] < 16);

    let (mut conn, _) = open(&s, &s.url, &query, Some(&id), &mut log).await;
    assert_eq!(log.vector(), id);
    let first_new = log.frames.len();
    assert!(
        log.read_until(&mut conn, |l| refs
            .iter()
            .all(|sid| l.count(sid, "run_finished") == 2))
            .await
    );
    let resyncs = log.resyncs();
    assert!(resyncs.is_empty(), "no session resyncs: {resyncs:?}");
    let new = &log.frames[first_new..];
    let seqs_of = |sid: &str| -> Vec<u64> {
        new.iter()
            .filter(|f| f.event == "agent" && f.data["session_id"] == sid)
            .map(Frame::seq)
            .collect()
    };
    for i in 0..3 {
        assert_eq!(
            seqs_of(&sids[i]),
            (at_cut[i] + 1..=latest[i]).collect::<Vec<_>>(),
            "session {i} replays exactly the frames after its entry"
        );
        // (The direct watcher of the burst may hold merged deltas; the replay never does.)
        if i > 0 {
            assert_eq!(
                datas(&log.agent(&sids[i])),
                direct[i].iter().map(|f| f.data.clone()).collect::<Vec<_>>()
            );
        }
    }
}

#[tokio::test]
async fn follow_and_unfollow_change_a_live_stream_and_its_next_id() {
    let s = TestServer::start().await;
    let a = s.create_session().await;
    let b = s.create_session().await;
    let mut watch_b = s.events(&b, None).await;
    let mut direct_b = Vec::new();
    s.run(&b, "before").await;
    watch_until_finished(&mut watch_b, &mut direct_b, 1).await;
    let latest_b = direct_b.last().unwrap().seq();

    let mut log = Log::default();
    let (mut conn, stream_id) = open(&s, &s.url, &sessions_query(&[&a]), None, &mut log).await;
    assert_eq!(log.vector(), format!("{a}:0"));

    // Refusals: an unknown stream, an unknown session.
    for (path, sid) in [
        ("/stream/st_nosuch/follow", a.as_str()),
        ("/stream/st_nosuch/unfollow", a.as_str()),
        (&format!("/stream/{stream_id}/follow"), "nosuch"),
    ] {
        let (code, e) = s.post(path, json!({"session_id": sid})).await;
        assert_eq!(
            (code, e["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{path}"
        );
        let named = if sid == "nosuch" { "nosuch" } else { "st_nosuch" };
        assert!(e["error"]["message"].as_str().unwrap().contains(named), "{e}");
    }

    // Follow b: its snapshot arrives at once and the id names it from then on.
    let (code, r) = s
        .post(&format!("/stream/{stream_id}/follow"), json!({"session_id": b}))
        .await;
    assert_eq!(
        (code, r),
        (200, json!({"stream_id": stream_id, "sessions": [a, b]}))
    );
    log.follow(&b, latest_b);
    let got = log.read_until(&mut conn, |l| l.settled(&b, latest_b)).await;
    assert!(got, "the follow sends b's snapshot");
    assert_eq!(log.last_id, Some(format!("{a}:0,{b}:{latest_b}")));
    let followed_from = latest_b;
    s.run(&b, "while followed").await;
    watch_until_finished(&mut watch_b, &mut direct_b, 2).await;
    let latest_b = direct_b.last().unwrap().seq();
    assert!(log.read_until(&mut conn, |l| l.settled(&b, latest_b)).await);
    assert_eq!(
        log.seqs(&b),
        (followed_from + 1..=latest_b).collect::<Vec<_>>(),
        "b streams live from its follow point"
    );
    assert_eq!(log.text(&b), "echo: while followed");
    assert_eq!(log.last_id, Some(format!("{a}:0,{b}:{latest_b}")));

    // Unfollow b: its new frames stop, a's still flow, and the id drops b.
    let (code, r) = s
        .post(&format!("/stream/{stream_id}/unfollow"), json!({"session_id": b}))
        .await;
    assert_eq!((code, r), (200, json!({"stream_id": stream_id, "sessions": [a]})));
    log.unfollow(&b);
    let unfollowed_at = log.frames.len();
    s.run(&b, "unseen").await;
    watch_until_finished(&mut watch_b, &mut direct_b, 3).await;
    let unseen_from = latest_b;
    let latest_b = direct_b.last().unwrap().seq();
    s.run(&a, "marker").await;
    assert!(
        log.read_until(&mut conn, |l| l.count(&a, "run_finished") == 1)
            .await
    );
    let after: Vec<&Frame> = log.frames[unfollowed_at..]
        .iter()
        .filter(|f| f.data["session_id"] == b.as_str())
        .collect();
    assert!(after.is_empty(), "nothing of b after the unfollow: {after:?}");
    assert_eq!(log.text(&a), "echo: marker");
    let last_a = log.seqs(&a).last().copied().unwrap();
    assert_eq!(log.last_id, Some(format!("{a}:{last_a}")), "the id lacks b");

    // Following again with `after` replays exactly what was missed.
    let (code, r) = s
        .post(
            &format!("/stream/{stream_id}/follow"),
            json!({"session_id": b, "after": unseen_from}),
        )
        .await;
    assert_eq!(
        (code, r),
        (200, json!({"stream_id": stream_id, "sessions": [a, b]}))
    );
    log.follow(&b, unseen_from);
    let refollowed_at = log.frames.len();
    let finished_b = log.count(&b, "run_finished");
    assert!(
        log.read_until(&mut conn, |l| l.count(&b, "run_finished") == finished_b + 1)
            .await
    );
    let replayed: Vec<u64> = log.frames[refollowed_at..]
        .iter()
        .filter(|f| f.event == "agent" && f.data["session_id"] == b.as_str())
        .map(Frame::seq)
        .collect();
    assert_eq!(replayed, (unseen_from + 1..=latest_b).collect::<Vec<_>>());
    assert_eq!(log.last_id, Some(format!("{a}:{last_a},{b}:{latest_b}")));
}

/// docs/protocol.md section 15: "Unknown stream: 404; unknown session: 404" for follow and
/// unfollow alike, and a malformed session id is a 400 everywhere.
#[tokio::test]
async fn unfollow_refuses_an_unknown_or_malformed_session_like_follow() {
    let s = TestServer::start().await;
    let a = s.create_session().await;
    let mut log = Log::default();
    let (_conn, stream_id) = open(&s, &s.url, &sessions_query(&[&a]), None, &mut log).await;
    for verb in ["follow", "unfollow"] {
        let path = format!("/stream/{stream_id}/{verb}");
        let (code, e) = s.post(&path, json!({"session_id": "nosuch"})).await;
        assert_eq!(
            (code, e["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{verb} of an unknown session: {e}"
        );
        assert!(e["error"]["message"].as_str().unwrap().contains("nosuch"), "{e}");
        let (code, e) = s.post(&path, json!({"session_id": "../x"})).await;
        assert_eq!(
            (code, e["error"]["code"].as_str()),
            (400, Some("invalid_argument")),
            "{verb} of a malformed session id: {e}"
        );
    }
}

// A multi-threaded runtime, as `vak serve` runs: on one thread the burst task, the server and
// this test's reader share one core and the reader falls seconds behind the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_in_one_session_does_not_starve_another_on_the_same_connection() {
    let s = TestServer::start().await;
    let busy = s.create_session().await;
    let quiet = s.create_session().await;
    let mut log = Log::default();
    let (mut conn, _) = open(&s, &s.url, &sessions_query(&[&busy, &quiet]), None, &mut log).await;

    // The largest burst the model takes: it cannot finish within this test's deadlines, so
    // "the quiet run finished first" depends on interleaving alone, not on timing.
    s.run(&busy, "/burst 10000000").await;
    assert!(
        log.read_until(&mut conn, |l| l.count(&busy, "text_delta") >= 1)
            .await
    );
    s.run(&quiet, "hello there").await;
    assert!(
        log.read_until(&mut conn, |l| l.count(&quiet, "run_finished") == 1)
            .await
    );
    assert_eq!(
        log.count(&busy, "run_finished"),
        0,
        "the quiet session finished on this connection while the burst went on"
    );
    let (code, c) = s.post(&format!("/sessions/{busy}/cancel"), json!({})).await;
    assert_eq!(
        (code, c["cancelled"].as_bool()),
        (200, Some(true)),
        "the burst was still running"
    );
    assert!(
        log.read_until(&mut conn, |l| l.count(&busy, "run_finished") == 1)
            .await
    );
    let last = log.agent(&busy).last().unwrap().data.clone();
    assert_eq!(last["run_finished"]["outcome"], "cancelled");
    // Under pressure deltas may merge (a merged frame carries its last seq), but the burst's
    // text is whole up to where it stopped, and the quiet session's frames are exact.
    let text = log.text(&busy);
    let words = text.split_inclusive(' ').count();
    assert!(words > 0);
    assert_eq!(text, burst(words), "the burst's text arrived whole");
    let quiet_seqs = log.seqs(&quiet);
    assert_eq!(quiet_seqs, (1..=quiet_seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(log.text(&quiet), "echo: hello there");
    assert!(log.resyncs().is_empty());
}

/// Reads a /sessions/:id/events stream until a frame with seq >= `n`; returns that seq.
async fn until_seq(sse: &mut Sse, n: u64) -> u64 {
    loop {
        let f = sse.next().await.expect("the event stream stays open");
        if f.seq() >= n {
            return f.seq();
        }
    }
}

/// Fairness where a reader can see it: one that stops reading. Over gRPC with 64 KiB flow
/// control windows, little can wait between the stream and its reader, so while the reader
/// stalls the burst session's queue fills and merges (its tail frame carries the newest seq),
/// and the quiet session's whole run waits in its own queue. When the reader resumes, a fair
/// stream hands the quiet session over within a batch or two; a stream that prefers the busy
/// session drains its queue first, down to the merged tail with a seq of at least `q`, the
/// burst's seq when the quiet run started. A fair stream fails this only if it picks the busy
/// session some thirty times running (about 2^-31).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_gets_the_quiet_session_before_the_bursts_backlog() {
    let s = TestServer::start().await;
    let busy = s.create_session().await;
    let quiet = s.create_session().await;
    let mut busy_events = s.events(&busy, None).await;
    let mut quiet_events = s.events(&quiet, None).await;
    let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut c = pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth(TOKEN.into()));
    let (mut conn, opened) = grpc_stream(&mut c, &[&busy, &quiet], "").await;
    let mut log = Log::default();
    log.opened(&opened);

    s.run(&busy, "/burst 10000000").await;
    // The stall: nothing is read from the stream while the burst runs far past what the
    // windows and the busy session's queue (1024 frames) can hold.
    let q = until_seq(&mut busy_events, 50_000).await;
    s.run(&quiet, "hello there").await;
    quiet_events.until("run_finished").await;

    assert!(
        log.read_until(&mut conn, |l| l.count(&quiet, "run_finished") == 1)
            .await
    );
    let late: Vec<u64> = log.seqs(&busy).into_iter().filter(|seq| *seq >= q).collect();
    assert!(
        late.is_empty(),
        "the busy session's backlog (up to seq {late:?}) came before the quiet session's run"
    );
    assert_eq!(log.count(&busy, "run_finished"), 0);
    let (code, _) = s.post(&format!("/sessions/{busy}/cancel"), json!({})).await;
    assert_eq!(code, 200);
    assert!(
        log.read_until(&mut conn, |l| l.count(&busy, "run_finished") == 1)
            .await
    );
    let text = log.text(&busy);
    assert_eq!(
        text,
        burst(text.split_inclusive(' ').count()),
        "the burst's text is whole"
    );
    assert_eq!(log.text(&quiet), "echo: hello there");
}

#[tokio::test]
async fn the_grpc_stream_matches_sse_and_ids_move_between_the_transports() {
    let s = TestServer::start().await;
    std::fs::write(s.workspace.join("notes.txt"), "some notes").unwrap();
    let mut c = s.grpc().await;
    let a = s.create_session().await;
    let b = s.create_session().await;
    let refs = [a.as_str(), b.as_str()];
    let (mut grpc, opened) = grpc_stream(&mut c, &refs, "").await;
    let (mut glog, mut slog) = (Log::default(), Log::default());
    glog.opened(&opened);
    let (mut sse, _) = open(&s, &s.url, &sessions_query(&refs), None, &mut slog).await;
    assert_eq!(glog.vector(), slog.vector());

    s.run(&a, "/think hmm\nhello world\n/read notes.txt").await;
    s.run(&b, "one two\n/fail nope").await;
    let both_done = |l: &Log| refs.iter().all(|sid| l.count(sid, "run_finished") == 1);
    assert!(glog.read_until(&mut grpc, both_done).await);
    assert!(slog.read_until(&mut sse, both_done).await);
    for sid in refs {
        assert_eq!(
            datas(&glog.agent(sid)),
            datas(&slog.agent(sid)),
            "{sid}: the same agent frames over gRPC and SSE"
        );
        let seqs = glog.seqs(sid);
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    }
    assert_eq!(glog.count(&a, "tool_result"), 1);
    assert_eq!(
        slog.agent(&b).last().unwrap().data["run_finished"]["outcome"],
        "failed"
    );
    assert_eq!(glog.last_id, slog.last_id, "the same vector at the end");

    // An id from the middle of each transport resumes the other one exactly.
    let mid = |l: &Log, n: usize| -> String {
        let ids: Vec<&String> = l
            .frames
            .iter()
            .filter(|f| f.event == "agent")
            .filter_map(|f| f.id.as_ref())
            .collect();
        ids[ids.len() * n / 5].clone()
    };
    let from_grpc = mid(&glog, 2);
    let from_sse = mid(&slog, 3);
    let (mut s2log, mut g2log) = (Log::default(), Log::default());
    let (mut sse2, _) = open(&s, &s.url, "", Some(&from_grpc), &mut s2log).await;
    assert_eq!(s2log.vector(), from_grpc);
    let (mut grpc2, opened2) = grpc_stream(&mut c, &[], &from_sse).await;
    g2log.opened(&opened2);
    assert_eq!(g2log.vector(), from_sse);

    s.run(&a, "again").await;
    s.run(&b, "and again").await;
    let both_twice = |l: &Log| refs.iter().all(|sid| l.count(sid, "run_finished") == 2);
    assert!(glog.read_until(&mut grpc, both_twice).await);
    for (log, conn, from) in [
        (&mut s2log, &mut sse2, &from_grpc),
        (&mut g2log, &mut grpc2, &from_sse),
    ] {
        let start = parse_vector(from);
        let done = |l: &Log| {
            refs.iter().all(|sid| {
                l.seqs(sid).last().copied().unwrap_or(0) == glog.seqs(sid).last().copied().unwrap()
            })
        };
        assert!(log.read_until(conn, done).await);
        for (sid, after) in &start {
            let expected: Vec<&Frame> = glog.agent(sid).into_iter().filter(|f| f.seq() > *after).collect();
            assert_eq!(
                datas(&log.agent(sid)),
                datas(&expected),
                "{sid}: resumed from {after} exactly"
            );
        }
        assert_eq!(log.last_id, glog.last_id);
    }
}

#[tokio::test]
async fn stream_limits_unknown_sessions_and_live_starts() {
    let s = TestServer::start().await;
    let mut sids = Vec::new();
    for _ in 0..65 {
        sids.push(s.create_session().await);
    }
    let refs: Vec<&str> = sids.iter().map(String::as_str).collect();

    // At most 64 sessions: in the query, and in the query and the vector together.
    let full = s.open_stream(&s.url, &sessions_query(&refs[..64]), None).await;
    assert_eq!(
        parse_vector(field(full.opened.as_ref().unwrap(), "cursor")).len(),
        64
    );
    drop(full);
    let m = refused(&s, 400, &sessions_query(&refs), None).await;
    assert!(m.contains("64"), "{m}");
    let vector: String = refs[40..]
        .iter()
        .map(|s| format!("{s}:0"))
        .collect::<Vec<_>>()
        .join(",");
    refused(&s, 400, &sessions_query(&refs[..40]), Some(&vector)).await;
    let all: String = refs
        .iter()
        .map(|s| format!("{s}:0"))
        .collect::<Vec<_>>()
        .join(",");
    refused(&s, 400, "", Some(&all)).await;

    // Malformed and oversized vectors, as Last-Event-ID and as ?cursor=.
    let a = refs[0];
    for bad in [
        "garbage".to_string(),
        format!("{a}:"),
        format!("{a}:x"),
        format!("{a}:1,"),
        format!("{a}:1,{a}:2"),
        format!("{a}:-1"),
        "../etc:1".to_string(),
        format!("{a}:1,{}", "x".repeat(8200)),
    ] {
        refused(&s, 400, &sessions_query(&[a]), Some(&bad)).await;
        let q = format!(
            "session={a}&cursor={}",
            bad.replace(',', "%2C").replace(':', "%3A")
        );
        refused(&s, 400, &q, None).await;
    }

    // Unknown sessions are refused before the stream opens, named.
    let m = refused(&s, 404, &format!("session={a}&session=nosuch"), None).await;
    assert!(m.contains("nosuch"), "{m}");
    let m = refused(&s, 404, &format!("session={a}"), Some("ghost:3")).await;
    assert!(m.contains("ghost"), "{m}");

    // The same refusals over gRPC.
    let mut c = s.grpc().await;
    let req = |sessions: &[&str], cursor: &str| pb::StreamRequest {
        sessions: sessions.iter().map(|s| s.to_string()).collect(),
        cursor: cursor.into(),
        host: false,
        config: false,
    };
    for (r, code) in [
        (req(&refs, ""), tonic::Code::InvalidArgument),
        (req(&[a], "garbage"), tonic::Code::InvalidArgument),
        (req(&[a, "nosuch"], ""), tonic::Code::NotFound),
    ] {
        match c.stream(r).await {
            Ok(_) => panic!("expected {code:?}"),
            Err(st) => assert_eq!(st.code(), code, "{st:?}"),
        }
    }

    // A session in the query but not in the vector starts live; one only in the vector
    // is followed too; Last-Event-ID wins over ?cursor=.
    let b = refs[1];
    let x = refs[2];
    let mut direct = Vec::new();
    for sid in [a, b, x] {
        let mut w = s.events(sid, None).await;
        s.run(sid, "first run").await;
        let mut frames = Vec::new();
        watch_until_finished(&mut w, &mut frames, 1).await;
        direct.push(frames);
    }
    let latest_a = direct[0].last().unwrap().seq();
    let latest_b = direct[1].last().unwrap().seq();
    let query = format!("{}&cursor={x}%3A1", sessions_query(&[a, b]));
    let mut log = Log::default();
    let (mut conn, _) = open(&s, &s.url, &query, Some(&format!("{a}:3,{x}:5")), &mut log).await;
    assert_eq!(log.vector(), format!("{a}:3,{b}:{latest_b},{x}:5"));
    s.run(b, "live").await;
    assert!(
        log.read_until(&mut conn, |l| l.count(b, "run_finished") == 1
            && l.count(a, "run_finished") == 1
            && l.count(x, "run_finished") == 1)
            .await
    );
    assert_eq!(log.seqs(a), (4..=latest_a).collect::<Vec<_>>());
    assert_eq!(
        log.seqs(x),
        (6..=direct[2].last().unwrap().seq()).collect::<Vec<_>>()
    );
    let b_seqs = log.seqs(b);
    assert_eq!(b_seqs[0], latest_b + 1, "b started live: nothing replayed");
    assert_eq!(log.text(b), "echo: live");
}

#[tokio::test]
async fn coworking_frames_show_clients_joining_and_leaving_a_followed_session() {
    let s = TestServer::start().await;
    let a = s.create_session().await;
    let mut log = Log::default();
    let (mut conn, stream_id) = open(&s, &s.url, &sessions_query(&[&a]), None, &mut log).await;
    let coworking = |l: &Log| -> Vec<Frame> {
        l.frames
            .iter()
            .filter(|f| f.event == "coworking")
            .cloned()
            .collect()
    };
    assert!(log.read_until(&mut conn, |l| coworking(l).len() == 1).await);
    let me = coworking(&log)[0].data["clients"][0].clone();
    assert_eq!(
        (&me["client_id"], &me["surface"]),
        (&json!(stream_id), &json!("stream"))
    );
    // When it attached: RFC 3339, a moment ago.
    let at = humantime::parse_rfc3339(me["attached_at"].as_str().unwrap()).unwrap();
    assert!(std::time::SystemTime::now().duration_since(at).unwrap() < crate::support::DEADLINE);
    assert_eq!(
        coworking(&log)[0].data,
        json!({"session_id": a, "clients": [me], "joined": [], "left": []})
    );

    // An SSE subscriber joins, then a gRPC one.
    let events = s.events(&a, None).await;
    assert!(log.read_until(&mut conn, |l| coworking(l).len() == 2).await);
    let joined = coworking(&log)[1].data.clone();
    assert_eq!(joined["session_id"], a.as_str());
    assert_eq!(joined["left"], json!([]));
    let sse_client = joined["joined"][0].clone();
    assert_eq!(joined["joined"].as_array().unwrap().len(), 1, "{joined}");
    assert_eq!(sse_client["surface"], "sse");
    assert_eq!(joined["clients"], json!([me, sse_client]));

    let mut c = s.grpc().await;
    let (grpc_events, _) = grpc_subscribe(&mut c, &a, None).await;
    assert!(log.read_until(&mut conn, |l| coworking(l).len() == 3).await);
    let joined = coworking(&log)[2].data.clone();
    let grpc_client = joined["joined"][0].clone();
    assert_eq!(grpc_client["surface"], "grpc");
    assert_eq!(joined["clients"], json!([me, sse_client, grpc_client]));

    // Both go.
    drop(grpc_events);
    assert!(log.read_until(&mut conn, |l| coworking(l).len() == 4).await);
    assert_eq!(
        coworking(&log)[3].data,
        json!({"session_id": a, "clients": [me, sse_client], "joined": [], "left": [grpc_client]})
    );
    drop(events);
    assert!(log.read_until(&mut conn, |l| coworking(l).len() == 5).await);
    assert_eq!(
        coworking(&log)[4].data,
        json!({"session_id": a, "clients": [me], "joined": [], "left": [sse_client]})
    );
}
