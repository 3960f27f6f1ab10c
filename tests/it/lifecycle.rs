//! Session lifecycle against a real server: delete (streams end with
//! session_closed {reason: deleted}, the ledger goes to the trash, 404 after,
//! also across a restart), rename (listed, bounded, kept across a restart and
//! an index rebuild), fork (replays the parent's events up to at_seq, then
//! its own seqs), 409 while a run is live, a run that answers once it
//! settles (`wait`), clear, undo and compact (the model's next request
//! carries no earlier or undone message, or the summary in their place;
//! clients keep the transcript).

use crate::support;
use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::{grpc_subscribe, Frame, TestServer};
use reqwest::Method;
use serde_json::{json, Value};
use vak::proto::v1 as pb;

/// Runs `prompt` to its run_finished; returns the frames.
async fn run_to_end(s: &TestServer, sid: &str, prompt: &str) -> Vec<Frame> {
    let latest = s.latest_seq(sid).await;
    let mut sse = s.events(sid, Some(latest)).await;
    let (status, body) = s.run(sid, prompt).await;
    assert_eq!(status, 202, "{body}");
    let frames = sse.until("run_finished").await;
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    frames
}

fn listed(list: &Value, sid: &str) -> Option<Value> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["session_id"] == sid)
        .cloned()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn delete_ends_live_streams_with_deleted_moves_the_ledger_to_the_trash_and_404s_after() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let keep = s.create_session().await;
    run_to_end(&s, &sid, "hello").await;
    let mut sse = s.events(&sid, None).await;
    let mut g = s.grpc().await;
    let (mut events, _) = grpc_subscribe(&mut g, &sid, None).await;
    let mut mux = s
        .open_stream(&s.url, &support::sessions_query(&[&sid, &keep]), None)
        .await;

    let (status, body) = s.send(Method::DELETE, &format!("/sessions/{sid}"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"session_id": sid, "deleted": true}));
    let frames = sse.until("session_closed").await;
    assert_eq!(frames.last().unwrap().body()["reason"], "deleted");
    assert!(sse.next().await.is_none(), "the SSE stream ends");
    let closed = events.until("session_closed").await;
    match &closed.last().unwrap().kind {
        Some(pb::event::Kind::SessionClosed(c)) => assert_eq!(c.reason, "deleted"),
        other => panic!("{other:?}"),
    }
    assert!(events.next().await.is_none(), "the gRPC stream ends");
    // On /stream the deleted session's frame says so; the stream follows the others on.
    let frames = mux.until("session_closed").await;
    let closed = frames.last().unwrap();
    assert_eq!(closed.data["session_id"], sid);
    assert_eq!(closed.body()["reason"], "deleted", "{closed:?}");

    let (_, list) = s.get("/sessions").await;
    assert!(listed(&list, &sid).is_none(), "{list}");
    assert!(listed(&list, &keep).is_some(), "other sessions stay");
    for path in [
        format!("/sessions/{sid}/transcript"),
        format!("/sessions/{sid}/diff"),
    ] {
        let (status, _) = s.get(&path).await;
        assert_eq!(status, 404, "{path}");
    }
    let (status, _) = s.run(&sid, "again").await;
    assert_eq!(status, 404);
    let (status, e) = s.send(Method::DELETE, &format!("/sessions/{sid}"), None).await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, _) = s.send(Method::DELETE, "/sessions/bad%20id", None).await;
    assert_eq!(status, 400);
    let trash: Vec<String> = std::fs::read_dir(s.home.join("trash"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        trash.len() == 1 && trash[0].starts_with(&sid) && trash[0].ends_with(".jsonl"),
        "{trash:?}"
    );
    assert!(!s.home.join(format!("sessions/{sid}.jsonl")).exists());

    // gRPC delete, then a restart: neither comes back.
    g.delete_session(pb::DeleteSessionRequest {
        session_id: keep.clone(),
    })
    .await
    .unwrap();
    let e = g
        .delete_session(pb::DeleteSessionRequest {
            session_id: keep.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(list["sessions"], json!([]), "{list}");
    let (status, _) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_live_run_makes_delete_clear_undo_compact_and_an_unpinned_fork_409() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // Default mode: the write waits for an approval, so the run stays live.
    s.run(&sid, "/write a.txt x").await;
    sse.until("approval_requested").await;
    let (status, e) = s.send(Method::DELETE, &format!("/sessions/{sid}"), None).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    let (status, e) = s.post(&format!("/sessions/{sid}/fork"), json!({})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    let (status, e) = s.post(&format!("/sessions/{sid}/clear"), json!({})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    let (status, e) = s.post(&format!("/sessions/{sid}/undo"), json!({})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    let (status, e) = s.post(&format!("/sessions/{sid}/compact"), json!({})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    let mut g = s.grpc().await;
    let e = g
        .delete_session(pb::DeleteSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let (_, list) = s.get("/sessions").await;
    assert!(listed(&list, &sid).is_some(), "a refused delete changes nothing");

    let (status, _) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!(status, 200);
    sse.until("run_finished").await;
    let (status, _) = s.send(Method::DELETE, &format!("/sessions/{sid}"), None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_rename_is_listed_bounded_and_kept_across_a_restart_and_an_index_rebuild() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    run_to_end(&s, &sid, "first prompt").await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(listed(&list, &sid).unwrap()["title"], "first prompt");

    let path = format!("/sessions/{sid}");
    let (status, body) = s
        .send(Method::PATCH, &path, Some(json!({"title": "  My work  "})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["session_id"].as_str(), body["title"].as_str()),
        (Some(sid.as_str()), Some("My work"))
    );
    let (_, list) = s.get("/sessions").await;
    assert_eq!(listed(&list, &sid).unwrap()["title"], "My work");
    // A later prompt does not take the chosen title away.
    run_to_end(&s, &sid, "second prompt").await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(listed(&list, &sid).unwrap()["title"], "My work");

    for bad in [
        json!({"title": ""}),
        json!({"title": "   "}),
        json!({"title": "a\nb"}),
        json!({"title": "x".repeat(81)}),
    ] {
        let (status, e) = s.send(Method::PATCH, &path, Some(bad.clone())).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{bad}: {e}");
    }
    let (status, _) = s
        .send(
            Method::PATCH,
            &path,
            Some(json!({"title": "t", "session_id": "other"})),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = s
        .send(Method::PATCH, "/sessions/nosuch", Some(json!({"title": "t"})))
        .await;
    assert_eq!(status, 404);
    let mut g = s.grpc().await;
    let renamed = g
        .rename_session(pb::RenameSessionRequest {
            session_id: sid.clone(),
            title: "Über — ünïcode".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renamed.title, "Über — ünïcode");

    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(listed(&list, &sid).unwrap()["title"], "Über — ünïcode");
    s.stop().await;
    std::fs::remove_file(home.path().join("sessions/index.json")).unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(
        listed(&list, &sid).unwrap()["title"],
        "Über — ünïcode",
        "rebuilt from the ledgers"
    );
    let (status, _) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(status, 200);
    let (_, list) = s.get("/sessions").await;
    assert_eq!(
        listed(&list, &sid).unwrap()["title"],
        "Über — ünïcode",
        "and once loaded"
    );
}

/// A frame's data without its session id (a fork's frames name the fork).
fn anonymous(f: &Frame) -> Value {
    let mut d = f.data.clone();
    d.as_object_mut().unwrap().remove("session_id");
    d
}

#[tokio::test]
async fn a_fork_replays_the_parents_events_up_to_at_seq_then_continues_with_its_own_seqs() {
    let s = TestServer::start().await;
    let parent = s.create_session().await;
    let first = run_to_end(&s, &parent, "one two").await;
    let at = first.last().unwrap().seq();
    run_to_end(&s, &parent, "three four").await;
    let parent_latest = s.latest_seq(&parent).await;
    assert!(parent_latest > at);

    let (status, body) = s
        .post(&format!("/sessions/{parent}/fork"), json!({"at_seq": at}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["parent_id"].as_str(), body["at_seq"].as_u64()),
        (Some(parent.as_str()), Some(at))
    );
    let child = body["session"]["session_id"].as_str().unwrap().to_string();
    assert_ne!(child, parent);
    assert_eq!(body["session"]["latest_seq"], at);
    assert_eq!(body["session"]["title"], "one two");

    // The fork's history is the parent's first `at` frames, seq for seq.
    let mut from_parent = s.events(&parent, Some(0)).await;
    let mut from_child = s.events(&child, Some(0)).await;
    for seq in 1..=at {
        let p = from_parent.next().await.unwrap();
        let c = from_child.next().await.unwrap();
        assert_eq!(c.seq(), seq);
        assert_eq!(anonymous(&c), anonymous(&p), "seq {seq}");
        assert_eq!(c.data["session_id"], child);
    }
    let (_, t) = s.get(&format!("/sessions/{child}/transcript")).await;
    let texts: Vec<&str> = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["one two", "echo: one two"]);

    // Then it goes on with its own seqs; the parent is untouched.
    let (status, adm) = s.run(&child, "five").await;
    assert_eq!((status, adm["after_seq"].as_u64()), (202, Some(at)), "{adm}");
    let frames = from_child.until("run_finished").await;
    assert_eq!(frames[0].seq(), at + 1);
    assert!(support::text_of(&frames).contains("echo: five"));
    assert_eq!(s.latest_seq(&parent).await, parent_latest);

    // Without at_seq: the parent's latest. Refusals.
    let mut g = s.grpc().await;
    let whole = g
        .fork_session(pb::ForkSessionRequest {
            session_id: parent.clone(),
            at_seq: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(whole.at_seq, parent_latest);
    assert_eq!(whole.session.unwrap().latest_seq, parent_latest);
    let (status, e) = s
        .post(
            &format!("/sessions/{parent}/fork"),
            json!({"at_seq": parent_latest + 1}),
        )
        .await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
    let (status, _) = s.post("/sessions/nosuch/fork", json!({})).await;
    assert_eq!(status, 404);
    let (status, body) = s
        .post(&format!("/sessions/{parent}/fork"), json!({"at_seq": 0}))
        .await;
    assert_eq!(
        (status, body["session"]["latest_seq"].as_u64()),
        (201, Some(0)),
        "{body}"
    );
}

#[tokio::test]
async fn a_run_with_wait_answers_when_it_settles_with_its_outcome_and_final_answer() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let path = format!("/sessions/{sid}/run");
    let (status, a) = s
        .post(&path, json!({"prompt": "hello there", "wait": true}))
        .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["state"], "started");
    assert_eq!(a["result"]["outcome"], "completed", "{a}");
    assert_eq!(a["result"]["answer"], "echo: hello there");
    assert_eq!(a["result"]["seq"], s.latest_seq(&sid).await);
    // Without wait nothing changes: 202 and no result.
    let (status, a) = s.run(&sid, "again").await;
    assert_eq!(status, 202);
    assert!(a.get("result").is_none() || a["result"].is_null(), "{a}");

    // A run cancelled while a caller waits: the caller gets the outcome.
    let other = s.create_session().await;
    let mut sse = s.events(&other, None).await;
    let url = format!("/sessions/{other}/run");
    let waiting = {
        let http = s.http();
        let full = format!("{}{url}", s.url);
        tokio::spawn(async move {
            let r = http
                .post(full)
                .json(&json!({"prompt": "/write a.txt x", "wait": true}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    sse.until("approval_requested").await;
    let (status, _) = s.post(&format!("/sessions/{other}/cancel"), json!({})).await;
    assert_eq!(status, 200);
    let (status, a) = waiting.await.unwrap();
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["result"]["outcome"], "cancelled", "{a}");
    sse.until("run_finished").await;

    // Past wait_seconds the answer is the admission alone; the run goes on.
    let (status, a) = s
        .post(
            &url,
            json!({"prompt": "/write b.txt y", "wait": true, "wait_seconds": 1}),
        )
        .await;
    assert_eq!(status, 202, "{a}");
    assert_eq!(a["state"], "started");
    assert!(a["result"].is_null(), "{a}");
    sse.until("approval_requested").await;
    for bad in [0, 3601] {
        let (status, e) = s
            .post(&path, json!({"prompt": "x", "wait": true, "wait_seconds": bad}))
            .await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
    }

    let mut g = s.grpc().await;
    let a = g
        .run(pb::RunRequest {
            session_id: sid.clone(),
            prompt: "over grpc".into(),
            wait: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let r = a.result.expect("a result");
    assert_eq!(
        (r.outcome(), r.answer.as_str()),
        (pb::RunOutcome::Completed, "echo: over grpc")
    );
}

#[tokio::test]
async fn after_a_clear_the_model_sees_no_earlier_message_and_clients_keep_the_transcript() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("openai/text.sse"),
        Reply::fixture("openai/text.sse"),
        Reply::fixture("openai/text.sse"),
    ]);
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    let sid = s.create_session().await;
    run_to_end(&s, &sid, "remember the word apricot").await;
    let before = s.latest_seq(&sid).await;

    let (status, c) = s.post(&format!("/sessions/{sid}/clear"), json!({})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c, json!({"session_id": sid, "upto_seq": before}));
    run_to_end(&s, &sid, "which word?").await;
    let reqs = fake.wait_requests(2).await;
    let seen = |i: usize| reqs[i].body["messages"].to_string();
    assert!(seen(0).contains("apricot"));
    assert!(seen(1).contains("which word?"), "{}", seen(1));
    assert!(!seen(1).contains("apricot"), "the model still saw: {}", seen(1));
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(
        t.to_string().contains("apricot"),
        "clients keep the whole transcript"
    );

    // The clear is in the ledger: a restarted server's model does not see it either.
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in_with_route(home.path(), ws.path(), fake.openai_route(), |_| {}).await;
    run_to_end(&s, &sid, "and now?").await;
    let reqs = fake.wait_requests(3).await;
    let third = reqs[2].body["messages"].to_string();
    assert!(
        third.contains("which word?") && !third.contains("apricot"),
        "{third}"
    );
    let (status, _) = s.post("/sessions/nosuch/clear", json!({})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_undo_takes_the_last_exchange_back_from_the_model_one_at_a_time() {
    let fake = FakeProvider::start().await;
    fake.script((0..4).map(|_| Reply::fixture("openai/text.sse")));
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    let sid = s.create_session().await;
    run_to_end(&s, &sid, "first alpha").await;
    let second = run_to_end(&s, &sid, "second beta").await;
    let latest = s.latest_seq(&sid).await;
    let user_seq = second.iter().find(|f| f.event == "user_message").unwrap().seq();

    let (status, u) = s.post(&format!("/sessions/{sid}/undo"), json!({})).await;
    assert_eq!(status, 200, "{u}");
    assert_eq!(
        u,
        json!({"session_id": sid, "after_seq": user_seq - 1, "upto_seq": latest})
    );
    run_to_end(&s, &sid, "third gamma").await;
    let reqs = fake.wait_requests(3).await;
    let third = reqs[2].body["messages"].to_string();
    assert!(
        third.contains("first alpha") && third.contains("third gamma"),
        "{third}"
    );
    assert!(
        !third.contains("second beta"),
        "the model still saw the undone exchange: {third}"
    );
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(
        t.to_string().contains("second beta"),
        "clients keep the whole transcript"
    );

    // gamma, then alpha; then nothing is left to undo.
    let mut g = s.grpc().await;
    for _ in 0..2 {
        g.undo_session(pb::UndoSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap();
    }
    let (status, e) = s.post(&format!("/sessions/{sid}/undo"), json!({})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    run_to_end(&s, &sid, "fresh delta").await;
    let reqs = fake.wait_requests(4).await;
    let fourth = reqs[3].body["messages"].to_string();
    for gone in ["alpha", "beta", "gamma"] {
        assert!(!fourth.contains(gone), "{gone} in {fourth}");
    }
    let (status, _) = s.post("/sessions/nosuch/undo", json!({})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_compaction_on_request_replaces_the_history_with_the_models_summary() {
    let fake = FakeProvider::start().await;
    fake.script((0..3).map(|_| Reply::fixture("openai/text.sse")));
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    let sid = s.create_session().await;
    let (status, e) = s.post(&format!("/sessions/{sid}/compact"), json!({})).await;
    assert_eq!(
        (status, code(&e)),
        (409, "conflict"),
        "nothing to compact yet: {e}"
    );
    run_to_end(&s, &sid, "remember the word apricot").await;
    let latest = s.latest_seq(&sid).await;
    let (status, c) = s.post(&format!("/sessions/{sid}/compact"), json!({})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c, json!({"session_id": sid, "upto_seq": latest}));
    assert_eq!(s.latest_seq(&sid).await, latest, "no event is published");
    run_to_end(&s, &sid, "which word?").await;
    let reqs = fake.wait_requests(3).await;
    // The second request asked for the summary; the third sees it instead of the history.
    assert!(reqs[1].body["messages"].to_string().contains("apricot"));
    let third = reqs[2].body["messages"].to_string();
    assert!(
        third.contains("Hello! How can I help you today?"),
        "the summary: {third}"
    );
    assert!(!third.contains("apricot"), "{third}");
    let (status, _) = s.post("/sessions/nosuch/compact", json!({})).await;
    assert_eq!(status, 404);
}
