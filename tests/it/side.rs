//! Side chat against a real server (issue 15): a side question asked during
//! a live main run streams its answer on `side` frames (per-session SSE,
//! gRPC Subscribe, the multiplexed /stream) while the main run's events and
//! transcript stay what they are without it, also after a restart; the side
//! turn sees the main conversation and the main history never sees the side
//! turn; one side run at a time (409 side_busy), cancel, 404 for an unknown
//! session.

use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::{assert_numbered, grpc_subscribe, kind_of, Frame, Sse, TestServer};
use serde_json::{json, Value};

/// A main run that stays live until the test approves its write: the side
/// question is asked while it waits.
const MAIN: &str = "first line\n/write a.txt hello\nafter the write";

fn code(e: &Value) -> &str {
    e["error"]["code"].as_str().unwrap_or("")
}

/// A frame with the ids a run makes up (request, call and approval ids) and
/// its seq left out: what must be equal between two runs of MAIN.
fn shape(f: &Frame) -> Value {
    let mut body = f.body().clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("request_id");
        o.remove("call_id");
    }
    json!({"event": f.event, "body": body})
}

/// The transcript's messages without seqs and call ids.
async fn messages(s: &TestServer, sid: &str) -> Vec<Value> {
    let (status, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(status, 200, "{t}");
    t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut m = m.clone();
            let o = m.as_object_mut().unwrap();
            o.remove("seq");
            o.remove("call_id");
            m
        })
        .collect()
}

/// Reads frames until the side run `side_id` has finished; returns them all.
async fn until_side_finished(sse: &mut Sse, side_id: &str) -> Vec<Frame> {
    let mut out = Vec::new();
    loop {
        let f = sse
            .next()
            .await
            .expect("the stream goes on until the side run finished");
        let done = f.event == "side" && f.body()["side_id"] == side_id && f.body().get("finished").is_some();
        out.push(f);
        if done {
            return out;
        }
    }
}

/// Runs MAIN to its end in a new session, asking `side` (if any) while it
/// waits for its approval. Returns the session and every frame it streamed.
async fn main_run(s: &TestServer, side: Option<&str>) -> (String, Vec<Frame>, Option<String>) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (status, a) = s.run(&sid, MAIN).await;
    assert_eq!(status, 202, "{a}");
    let mut frames = sse.until("approval_requested").await;
    let ask = frames.last().unwrap().body().clone();
    let mut side_id = None;
    if let Some(q) = side {
        let (status, adm) = s
            .post(&format!("/sessions/{sid}/side"), json!({"question": q}))
            .await;
        assert_eq!(status, 202, "{adm}");
        let id = adm["side_id"].as_str().unwrap().to_string();
        assert!(id.starts_with("side_"), "{adm}");
        assert!(adm["after_seq"].as_u64().unwrap() >= frames.last().unwrap().seq());
        frames.extend(until_side_finished(&mut sse, &id).await);
        side_id = Some(id);
    }
    let rid = ask["request_id"].as_str().unwrap();
    let (status, r) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    frames.extend(sse.until("run_finished").await);
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    (sid, frames, side_id)
}

fn side_frames(frames: &[Frame]) -> Vec<&Frame> {
    frames.iter().filter(|f| f.event == "side").collect()
}

fn side_text(frames: &[&Frame]) -> String {
    frames
        .iter()
        .filter_map(|f| f.body()["text_delta"]["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_side_chat_during_a_live_run_leaves_the_main_run_unchanged_and_survives_a_restart() {
    let s = TestServer::start().await;
    let (plain, plain_frames, _) = main_run(&s, None).await;
    let (sid, frames, side_id) = main_run(&s, Some("what is going on")).await;
    let side_id = side_id.unwrap();
    // One gap-free seq space: side frames take ordinary session seqs.
    assert_numbered(&frames);

    // The main run, without its side frames, is the run without a side chat.
    let main: Vec<Value> = frames.iter().filter(|f| f.event != "side").map(shape).collect();
    let alone: Vec<Value> = plain_frames.iter().map(shape).collect();
    assert_eq!(main, alone);
    assert_eq!(messages(&s, &sid).await, messages(&s, &plain).await);
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(!t.to_string().contains("going on"), "{t}");
    let (_, p) = s.get(&format!("/sessions/{sid}/presentation")).await;
    assert!(!p.to_string().contains("going on"), "{p}");

    // The side answer: started (with its branch point), deltas, finished.
    let side = side_frames(&frames);
    let started = &side[0].body()["started"];
    assert_eq!(started["question"], "what is going on");
    let ask_seq = frames
        .iter()
        .find(|f| f.event == "approval_requested")
        .unwrap()
        .seq();
    let branch = started["branch_seq"].as_u64().unwrap();
    assert!(branch <= ask_seq && branch > 0, "{started}");
    assert_eq!(side_text(&side), "echo: what is going on");
    let finished = &side.last().unwrap().body()["finished"];
    assert_eq!(finished["outcome"], "SIDE_OUTCOME_COMPLETED", "{finished}");
    assert!(side.iter().all(|f| f.body()["side_id"] == side_id.as_str()));
    let (status, h) = s.get(&format!("/sessions/{sid}/side")).await;
    assert_eq!(status, 200, "{h}");
    let runs = h["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{h}");
    assert_eq!(runs[0]["answer"], "echo: what is going on");
    assert_eq!(runs[0]["outcome"], "SIDE_OUTCOME_COMPLETED");
    assert_eq!(runs[0]["seq"].as_u64(), Some(side[0].seq()));
    let before = messages(&s, &sid).await;

    // Both survive a restart: the replay shows the side frames again, seq
    // for seq, the transcript is unchanged, the side log reads the same.
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let mut sse = s.events(&sid, Some(0)).await;
    let replayed = sse.until("run_finished").await;
    let seqs = |fs: &[Frame]| fs.iter().map(|f| (f.seq(), f.event.clone())).collect::<Vec<_>>();
    assert_eq!(seqs(&replayed), seqs(&frames));
    let again: Vec<Value> = side_frames(&replayed).iter().map(|f| f.data.clone()).collect();
    let first: Vec<Value> = side.iter().map(|f| f.data.clone()).collect();
    assert_eq!(again, first);
    assert_eq!(messages(&s, &sid).await, before);
    let (_, h2) = s.get(&format!("/sessions/{sid}/side")).await;
    assert_eq!(h2, h);

    // gRPC Subscribe and the multiplexed stream name them `side` too.
    let mut g = s.grpc().await;
    let (mut events, _) = grpc_subscribe(&mut g, &sid, Some(0)).await;
    let grpc = events.until("run_finished").await;
    let kinds: Vec<&str> = grpc.iter().map(kind_of).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "side").count(), side.len());
    let mut mux = s
        .open_stream(&s.url, &format!("session={sid}&cursor={sid}:0"), None)
        .await;
    let mut mux_side = Vec::new();
    loop {
        let f = mux.next().await.unwrap();
        if f.event == "side" {
            assert!(
                f.id.as_deref().unwrap().ends_with(&format!(":{}", f.data["seq"])),
                "{f:?}"
            );
            mux_side.push(f.data.clone());
        }
        if f.event == "agent" && f.data.get("run_finished").is_some() {
            break;
        }
    }
    assert_eq!(mux_side, first);
}

#[tokio::test]
async fn a_second_side_run_is_409_side_busy_until_the_first_is_cancelled() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let path = format!("/sessions/{sid}/side");
    let (status, adm) = s.post(&path, json!({"question": "/sleep 600000"})).await;
    assert_eq!(status, 202, "{adm}");
    let id = adm["side_id"].as_str().unwrap().to_string();
    let (status, e) = s.post(&path, json!({"question": "another"})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    assert_eq!(e["error"]["reason"], "side_busy", "{e}");
    // A side run holds off a delete, as a main run does.
    let (status, e) = s.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(
        (status, e["error"]["reason"].as_str()),
        (409, Some("side_busy")),
        "{e}"
    );
    // A main run is admitted beside it.
    let (status, a) = s.run(&sid, "main beside").await;
    assert_eq!((status, a["state"].as_str()), (202, Some("started")), "{a}");

    let (status, c) = s.post(&format!("{path}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c, json!({"cancelled": true, "side_id": id}));
    let frames = until_side_finished(&mut sse, &id).await;
    let finished = &frames.last().unwrap().body()["finished"];
    assert_eq!(finished["outcome"], "SIDE_OUTCOME_CANCELLED", "{finished}");
    assert_eq!(finished["message"], "cancelled by a client");
    // Nothing live: cancel says so; a new side run is admitted.
    let (status, c) = s.post(&format!("{path}/cancel"), json!({})).await;
    assert_eq!((status, c["cancelled"].as_bool()), (200, Some(false)), "{c}");
    let (status, adm) = s.post(&path, json!({"question": "now"})).await;
    assert_eq!(status, 202, "{adm}");
    until_side_finished(&mut sse, adm["side_id"].as_str().unwrap()).await;

    // A permission mode change cancels a live side run too, before it answers.
    let (_, adm) = s.post(&path, json!({"question": "/sleep 600000"})).await;
    let (status, m) = s.post("/config/mode", json!({"mode": "plan"})).await;
    assert_eq!(status, 200, "{m}");
    assert!(m["cancelled_runs"].as_u64() >= Some(1), "{m}");
    let frames = until_side_finished(&mut sse, adm["side_id"].as_str().unwrap()).await;
    let finished = &frames.last().unwrap().body()["finished"];
    assert_eq!(finished["outcome"], "SIDE_OUTCOME_CANCELLED", "{finished}");

    // Refusals: unknown session, empty question, oversized question, over gRPC too.
    let (status, e) = s.post("/sessions/nosuch/side", json!({"question": "q"})).await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = s.post("/sessions/nosuch/side/cancel", json!({})).await;
    assert_eq!(status, 404, "{e}");
    let (status, e) = s.get("/sessions/nosuch/side").await;
    assert_eq!(status, 404, "{e}");
    let (status, e) = s.post(&path, json!({"question": "  "})).await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
    let big = "x".repeat(64 * 1024 + 1);
    let (status, e) = s.post(&path, json!({"question": big})).await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
    let mut g = s.grpc().await;
    let e = g
        .side_run(vak::proto::v1::SideRunRequest {
            session_id: "nosuch".into(),
            question: "q".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn the_side_turn_sees_the_main_conversation_and_the_main_history_never_sees_it() {
    let fake = FakeProvider::start().await;
    fake.script((0..3).map(|_| Reply::fixture("openai/text.sse")));
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "remember apricot").await;
    sse.until("run_finished").await;
    let (status, adm) = s
        .post(
            &format!("/sessions/{sid}/side"),
            json!({"question": "which fruit, quickly?"}),
        )
        .await;
    assert_eq!(status, 202, "{adm}");
    let side = until_side_finished(&mut sse, adm["side_id"].as_str().unwrap()).await;
    let side: Vec<&Frame> = side.iter().filter(|f| f.event == "side").collect();
    assert_eq!(side_text(&side), "Hello! How can I help you today?");
    s.run(&sid, "and next").await;
    sse.until("run_finished").await;

    let reqs = fake.wait_requests(3).await;
    let seen = |i: usize| reqs[i].body["messages"].to_string();
    assert!(
        seen(1).contains("apricot") && seen(1).contains("which fruit"),
        "the side turn sees the main conversation: {}",
        seen(1)
    );
    assert!(
        seen(2).contains("apricot") && !seen(2).contains("which fruit"),
        "the main history never sees the side turn: {}",
        seen(2)
    );
}
