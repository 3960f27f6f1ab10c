//! Restart durability: a second server on the same home continues every session where the
//! first one left it (seq, replay, listing, transcripts, idempotency), survives a torn last
//! ledger line, and settles a run the previous server died in.

use crate::support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// Stops `s` gracefully and starts a new server on the same home and workspace. The temp
/// dirs the first server owned are moved into `keep` so they outlive both servers.
async fn restart(s: TestServer, keep: &mut Vec<(TempDir, TempDir)>) -> TestServer {
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    if let Some(dirs) = s.stop().await {
        keep.push(dirs);
    }
    TestServer::start_in(&home, &ws, |_| {}).await
}

fn ledger_path(home: &Path, sid: &str) -> PathBuf {
    home.join("sessions").join(format!("{sid}.jsonl"))
}

/// The ledger's lines, each parsed (every line must be whole JSON).
#[track_caller]
fn ledger_lines(home: &Path, sid: &str) -> Vec<Value> {
    let raw = std::fs::read_to_string(ledger_path(home, sid)).unwrap();
    assert!(raw.ends_with('\n'), "the ledger ends with a whole line");
    raw.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn ledger line {l:?}: {e}")))
        .collect()
}

/// The event kind of a ledger line, if it records an event.
fn event_kind(line: &Value) -> Option<&str> {
    line["event"]["event"]["kind"].as_str()
}

/// Cuts the ledger after the last line for which `keep_through` holds, as if the server had
/// died right after writing it. Returns the seq of that line. The session index goes too: a
/// server that died there never recorded a later seq (one it had recorded would be marked lost
/// on load: `a_ledger_cut_in_the_middle_never_reissues_a_seq_and_readers_get_history_lost`).
fn cut_ledger_after(home: &Path, sid: &str, keep_through: impl Fn(&Value) -> bool) -> u64 {
    let _ = std::fs::remove_file(home.join("sessions").join("index.json"));
    let path = ledger_path(home, sid);
    let raw = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = raw.lines().collect();
    let last = lines
        .iter()
        .rposition(|l| keep_through(&serde_json::from_str(l).unwrap()))
        .expect("the ledger has such a line");
    let kept = lines[..=last].join("\n") + "\n";
    std::fs::write(&path, kept).unwrap();
    let line: Value = serde_json::from_str(lines[last]).unwrap();
    line["event"]["seq"].as_u64().expect("an event line")
}

/// Opens a stream from the very beginning and reads every retained frame up to `latest`.
async fn all_frames(s: &TestServer, sid: &str) -> Vec<Frame> {
    let mut sse = s.events(sid, Some(0)).await;
    let latest = sse.opened.as_ref().unwrap().body()["latest_seq"]
        .as_u64()
        .unwrap();
    let mut out = Vec::new();
    while out.last().map_or(0, Frame::seq) < latest {
        out.push(sse.next().await.expect("a retained frame"));
    }
    out
}

#[tokio::test]
async fn with_fsync_durability_a_session_serves_and_continues_after_a_restart() {
    use vak::core::Durability;
    let s = TestServer::start_with(|c| c.core.durability = Durability::Fsync).await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/burst 2000").await;
    let before = sse.until("run_finished").await;
    let latest = before.last().unwrap().seq();
    drop(sse);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    let _keep = s.stop().await;
    let s = TestServer::start_in(&home, &ws, |c| c.core.durability = Durability::Fsync).await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "after").await;
    let after = sse.until("run_finished").await;
    assert_eq!(after[0].seq(), latest + 1);
    assert_eq!(text_of(&after), "echo: after");
}

#[tokio::test]
async fn seq_continues_after_a_restart_and_is_never_reused() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "before").await;
    let before = sse.until("run_finished").await;
    let latest = before.last().unwrap().seq();
    drop(sse);

    let s = restart(s, &mut keep).await;
    let mut sse = s.events(&sid, None).await;
    assert_eq!(
        sse.opened.as_ref().unwrap().body()["latest_seq"],
        latest,
        "stream_opened reports the seq the session reached before the restart"
    );
    let (code, adm) = s.run(&sid, "after").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")));
    let after = sse.until("run_finished").await;
    assert_eq!(
        after[0].seq(),
        latest + 1,
        "numbering resumes right after the last seq"
    );
    assert_numbered(&after);
    assert_eq!(text_of(&after), "echo: after");

    // The whole history is one gap-free sequence.
    let all = all_frames(&s, &sid).await;
    let seqs: Vec<u64> = all.iter().map(Frame::seq).collect();
    assert_eq!(seqs, (1..=after.last().unwrap().seq()).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_client_reconnecting_after_a_restart_replays_exactly_what_it_missed_then_goes_live() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "alpha beta gamma delta").await;
    let frames = sse.until("run_finished").await;
    let latest = frames.last().unwrap().seq();
    drop(sse);
    // The client had processed up to the second text_delta when the server went away.
    let seen = frames
        .iter()
        .filter(|f| f.event == "text_delta")
        .nth(1)
        .unwrap()
        .seq();
    let missed: Vec<(u64, String, Value)> = frames
        .iter()
        .filter(|f| f.seq() > seen)
        .map(|f| (f.seq(), f.event.clone(), f.data.clone()))
        .collect();
    assert!(missed.len() >= 3);

    let s = restart(s, &mut keep).await;
    let mut sse = s.events(&sid, Some(seen)).await;
    assert_eq!(sse.opened.as_ref().unwrap().body()["latest_seq"], latest);
    let mut replayed = Vec::new();
    for _ in 0..missed.len() {
        let f = sse.next().await.expect("a replayed frame");
        replayed.push((f.seq(), f.event.clone(), f.data.clone()));
    }
    assert_eq!(
        replayed, missed,
        "exactly the frames after the cursor, as first sent"
    );

    s.run(&sid, "live now").await;
    let live = sse.until("run_finished").await;
    assert_eq!(live[0].seq(), latest + 1, "nothing else was replayed");
    assert_numbered(&live);
    assert_eq!(text_of(&live), "echo: live now");
}

#[tokio::test]
async fn a_restarted_server_lists_attaches_and_serves_identical_transcripts() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    std::fs::write(s.workspace.join("n.txt"), "note body").unwrap();
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/think ponder\nfirst line\n/read n.txt").await;
    let frames = sse.until("run_finished").await;
    let latest = frames.last().unwrap().seq();
    drop(sse);
    let (_, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let (_, _, md) = s.get_text(&format!("/sessions/{sid}/transcript.md")).await;
    assert_eq!(transcript["messages"].as_array().unwrap().len(), 3);
    let (_, list) = s.get("/sessions").await;
    let entry = list["sessions"][0].clone();
    assert_eq!(entry["session_id"], sid.as_str());

    let s = restart(s, &mut keep).await;
    let (code, list) = s.get("/sessions").await;
    assert_eq!(code, 200);
    let sessions = list["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "the persisted session is listed: {list}");
    let mut expected = entry.clone();
    expected["loaded"] = json!(false);
    assert_eq!(sessions[0], expected, "same summary, not loaded until used");
    assert_eq!(sessions[0]["latest_seq"], latest);

    let (code, attached) = s.post(&format!("/sessions/{sid}/attach"), json!({})).await;
    assert_eq!(code, 200);
    let mut loaded = entry.clone();
    loaded["loaded"] = json!(true);
    assert_eq!(attached["session"], loaded);
    let (_, list) = s.get("/sessions").await;
    assert_eq!(list["sessions"][0]["loaded"], true);
    let (code, again) = s.post(&format!("/sessions/{sid}/attach"), json!({})).await;
    assert_eq!((code, &again["session"]), (200, &loaded), "attach is idempotent");

    let (code, t2) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200);
    assert_eq!(
        t2, transcript,
        "the transcript is rebuilt from the ledger unchanged"
    );
    let (code, _, md2) = s.get_text(&format!("/sessions/{sid}/transcript.md")).await;
    assert_eq!(code, 200);
    assert_eq!(md2, md);

    let unknown = "0123456789abcdef0123456789abcdef";
    let (code, e) = s.post(&format!("/sessions/{unknown}/attach"), json!({})).await;
    assert_eq!((code, e["error"]["code"].as_str()), (404, Some("not_found")));
    let (code, _) = s.get(&format!("/sessions/{unknown}/transcript")).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn a_request_id_admitted_before_a_restart_is_still_a_duplicate_after_it() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (_, a) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "once", "request_id": "keep-me"}),
        )
        .await;
    assert_eq!(a["state"], "started");
    sse.until("run_finished").await;
    drop(sse);

    let s = restart(s, &mut keep).await;
    let mut sse = s.events(&sid, None).await;
    for path in ["run", "steering"] {
        let key = if path == "run" { "prompt" } else { "text" };
        let (code, dup) = s
            .post(
                &format!("/sessions/{sid}/{path}"),
                json!({key: "once", "request_id": "keep-me"}),
            )
            .await;
        assert_eq!(
            (code, &dup["request_id"], &dup["state"]),
            (202, &json!("keep-me"), &json!("duplicate")),
            "{path}"
        );
    }
    let (_, fresh) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "fresh", "request_id": "new-one"}),
        )
        .await;
    assert_eq!(fresh["state"], "started");
    let frames = sse.until("run_finished").await;
    let users: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "user_message")
        .map(|f| &f.body()["request_id"])
        .collect();
    assert_eq!(users, [&json!("new-one")], "the duplicate ran nothing");
    assert_eq!(text_of(&frames), "echo: fresh");
}

#[tokio::test]
async fn a_ledger_with_a_half_written_last_line_loads_and_keeps_appending() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "before the tear").await;
    let before = sse.until("run_finished").await;
    let latest = before.last().unwrap().seq();
    drop(sse);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    keep.extend(s.stop().await);

    // A crash in the middle of writing the next line.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(ledger_path(&home, &sid))
            .unwrap();
        f.write_all(br#"{"event":{"seq":999,"event":{"kind":"text_del"#)
            .unwrap();
    }

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(list["sessions"][0]["session_id"], sid.as_str(), "still listed");
    assert_eq!(
        list["sessions"][0]["latest_seq"], latest,
        "the torn line is not counted"
    );
    let mut sse = s.events(&sid, None).await;
    assert_eq!(
        sse.opened.as_ref().unwrap().body()["latest_seq"],
        latest,
        "the torn line is not an event"
    );
    s.run(&sid, "after the tear").await;
    let after = sse.until("run_finished").await;
    assert_eq!(after[0].seq(), latest + 1);
    assert_eq!(text_of(&after), "echo: after the tear");
    let newest = after.last().unwrap().seq();
    drop(sse);

    // On disk every line is whole again, and a further restart replays one gap-free history.
    let s = restart(s, &mut keep).await;
    let lines = ledger_lines(&home, &sid);
    assert!(lines.iter().all(|l| l["event"]["seq"] != 999));
    let all = all_frames(&s, &sid).await;
    let seqs: Vec<u64> = all.iter().map(Frame::seq).collect();
    assert_eq!(seqs, (1..=newest).collect::<Vec<_>>());
    assert_eq!(text_of(&all), "echo: before the tearecho: after the tear");
}

#[tokio::test]
async fn a_graceful_stop_mid_run_cancels_it_exactly_once() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/sleep 60000").await;
    sse.until("turn_started").await;
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    let stopping = tokio::spawn(s.stop());
    let frames = sse.until("run_finished").await;
    assert_eq!(frames.last().unwrap().body()["outcome"], "cancelled");
    let closed = sse.next().await.expect("session_closed follows");
    assert_eq!(closed.event, "session_closed");
    keep.extend(
        tokio::time::timeout(DEADLINE, stopping)
            .await
            .expect("the server stops within the deadline")
            .unwrap(),
    );

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let all = all_frames(&s, &sid).await;
    let finished: Vec<&Frame> = all.iter().filter(|f| f.event == "run_finished").collect();
    assert_eq!(finished.len(), 1, "one run, one run_finished: {all:?}");
    assert_eq!(finished[0].body()["outcome"], "cancelled");
    let last_status = all.iter().rev().find(|f| f.event == "status").unwrap();
    assert_eq!(last_status.body()["busy"], false);
    let (_, list) = s.get("/sessions").await;
    assert_eq!(list["sessions"][0]["busy"], false);
    let (_, again) = s.run(&sid, "next").await;
    assert_eq!(again["state"], "started", "the session is idle after the restart");
}

#[tokio::test]
async fn a_run_the_server_died_in_is_settled_as_failed_when_the_session_loads() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/sleep 60000").await;
    sse.until("turn_started").await;
    drop(sse);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    keep.extend(s.stop().await);

    // Make it a crash: keep the ledger only through turn_started, so its last status is
    // busy:true and no run_finished was ever written.
    let cursor = cut_ledger_after(&home, &sid, |l| event_kind(l) == Some("turn_started"));
    let lines = ledger_lines(&home, &sid);
    let last_status = lines
        .iter()
        .rev()
        .find(|l| event_kind(l) == Some("status"))
        .unwrap();
    assert_eq!(last_status["event"]["event"]["busy"], true);
    assert!(!lines.iter().any(|l| event_kind(l) == Some("run_finished")));

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    // A client that saw everything up to turn_started reconnects: the run is over.
    let mut sse = s.events(&sid, Some(cursor)).await;
    let settled = sse.until("run_finished").await;
    assert_kinds(&settled, &["status", "run_finished"]);
    assert_numbered(&settled);
    assert_eq!(settled[0].seq(), cursor + 1, "settling continues the numbering");
    assert_eq!(settled[0].body()["busy"], false);
    assert_eq!(settled[1].body()["outcome"], "failed");
    assert!(!settled[1].body()["message"].as_str().unwrap().is_empty());

    let (_, list) = s.get("/sessions").await;
    assert_eq!(list["sessions"][0]["busy"], false);
    let (_, adm) = s.run(&sid, "recovered").await;
    assert_eq!(adm["state"], "started");
    let next = sse.until("run_finished").await;
    assert_eq!(text_of(&next), "echo: recovered");
    assert_eq!(next.last().unwrap().body()["outcome"], "completed");
    drop(sse);

    // Settled once, durably: another restart does not settle it again.
    let s = restart(s, &mut keep).await;
    let all = all_frames(&s, &sid).await;
    let outcomes: Vec<&Value> = all
        .iter()
        .filter(|f| f.event == "run_finished")
        .map(|f| &f.body()["outcome"])
        .collect();
    assert_eq!(outcomes, [&json!("failed"), &json!("completed")]);
}

#[tokio::test]
async fn an_approval_and_a_tool_call_pending_when_the_server_died_settle_when_the_session_loads() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/write a.txt never").await;
    let asked = sse.until("approval_requested").await;
    let rid = asked.last().unwrap().body()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    drop(sse);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    keep.extend(s.stop().await);
    let cursor = cut_ledger_after(&home, &sid, |l| event_kind(l) == Some("approval_requested"));

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let mut sse = s.events(&sid, Some(cursor)).await;
    let settled = sse.until("run_finished").await;
    assert_kinds(
        &settled,
        &["approval_resolved", "tool_result", "status", "run_finished"],
    );
    assert_eq!(settled[0].body()["request_id"], rid.as_str());
    assert_eq!(settled[0].body()["outcome"], "expired");
    // The interrupted call gets its one result, like any other call.
    let call_id = asked.last().unwrap().body()["call_id"].clone();
    assert_eq!(settled[1].body()["call_id"], call_id);
    assert_eq!(settled[1].body()["ok"], false);
    assert!(settled[1].body()["output"]
        .as_str()
        .unwrap()
        .contains("interrupted"));
    assert_eq!(settled[3].body()["outcome"], "failed");
    let (code, e) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!((code, e["error"]["code"].as_str()), (409, Some("conflict")));
    assert!(!s.workspace.join("a.txt").exists(), "nothing was written");
}

#[tokio::test]
async fn a_queued_request_id_discarded_before_a_restart_is_still_a_duplicate_after_it() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/sleep 60000").await;
    sse.until("turn_started").await;
    let (_, q) = s
        .post(
            &format!("/sessions/{sid}/steering"),
            json!({"text": "later", "request_id": "queued-1"}),
        )
        .await;
    assert_eq!(q["state"], "queued");
    let (_, c) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!(c, json!({"cancelled": true, "discarded": 1}));
    sse.until("run_finished").await;
    drop(sse);
    // Before the restart a retry is recognised: the input was admitted (then discarded).
    let retry = json!({"text": "later", "request_id": "queued-1"});
    let (_, dup) = s.post(&format!("/sessions/{sid}/steering"), retry.clone()).await;
    assert_eq!(dup["state"], "duplicate");

    let s = restart(s, &mut keep).await;
    let (code, dup) = s.post(&format!("/sessions/{sid}/steering"), retry).await;
    assert_eq!(
        (code, &dup["request_id"], &dup["state"]),
        (202, &json!("queued-1"), &json!("duplicate")),
        "an admitted request_id stays admitted across a restart, even one that never ran"
    );
}

#[tokio::test]
async fn a_ledger_cut_in_the_middle_never_reissues_a_seq_and_readers_get_history_lost() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/burst 3000").await;
    sse.until("run_finished").await;
    drop(sse);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    keep.extend(s.stop().await);
    // Every seq the session issued (run_finished and what came after it).
    let recorded = ledger_lines(&home, &sid)
        .iter()
        .filter_map(|l| l["event"]["seq"].as_u64())
        .max()
        .unwrap();

    // Damage from outside vak: the file is cut in the middle of a line.
    let path = ledger_path(&home, &sid);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let mut sse = s.events(&sid, Some(0)).await;
    let mut kept = 0;
    let resync = loop {
        let f = sse.next().await.expect("the replay goes on");
        if f.event == "resync" {
            break f;
        }
        assert_eq!(f.seq(), kept + 1, "what survived replays gap-free");
        kept = f.seq();
    };
    assert!(
        kept > 100 && kept < recorded,
        "half survived: {kept} of {recorded}"
    );
    let range = |f: &Frame| {
        let b = f.body();
        (b["reason"].clone(), b["from"].clone(), b["to"].clone())
    };
    let lost = (json!("history_lost"), json!(kept + 1), json!(recorded));
    assert_eq!(range(&resync), lost);
    assert!(resync.body()["latest_seq"].as_u64().unwrap() >= recorded);
    // The run the ledger no longer shows finishing is settled after the
    // lost range (nobody waits on it forever): new events number after
    // every seq issued.
    let settled = sse.until("run_finished").await;
    assert_eq!(settled[0].seq(), recorded + 1, "no seq a client saw is reissued");
    assert_numbered(&settled);
    assert_eq!(settled.last().unwrap().body()["outcome"], "failed");
    let latest = settled.last().unwrap().seq();
    assert_eq!(s.latest_seq(&sid).await, latest);

    // A reader whose cursor falls in the lost range is told the same.
    let mut inside = s.events(&sid, Some(recorded - 10)).await;
    let first = inside.next().await.unwrap();
    assert_eq!(first.event, "resync");
    assert_eq!(range(&first), lost);
    drop(inside);

    // A reader that saw all of it before the damage goes on without a resync.
    let mut whole = s.events(&sid, Some(recorded)).await;
    let same = whole.until("run_finished").await;
    assert_eq!(same[0].seq(), recorded + 1);
    assert!(same.iter().all(|f| f.event != "resync"));
    s.run(&sid, "after the cut").await;
    let after = sse.until("run_finished").await;
    assert_eq!(after[0].seq(), latest + 1);
    assert_numbered(&after);
    assert_eq!(text_of(&after), "echo: after the cut");
    let newest = after.last().unwrap().seq();
    drop((sse, whole));

    // The loss is recorded once in the ledger itself, so a restart (even one
    // that rebuilds the session index) keeps numbering after it.
    let s = restart(s, &mut keep).await;
    let marks = ledger_lines(&home, &sid)
        .into_iter()
        .filter(|l| l.get("lost").is_some())
        .collect::<Vec<_>>();
    assert_eq!(marks, [json!({"lost": {"from": kept + 1, "to": recorded}})]);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    keep.extend(s.stop().await);
    std::fs::remove_file(home.join("sessions").join("index.json")).unwrap();
    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let mut sse = s.events(&sid, None).await;
    assert_eq!(sse.opened.as_ref().unwrap().body()["latest_seq"], newest);
    s.run(&sid, "again").await;
    assert_eq!(sse.until("run_finished").await[0].seq(), newest + 1);
}

#[tokio::test]
async fn a_flipped_byte_in_a_ledger_header_leaves_the_session_listed_and_readable() {
    let mut keep = Vec::new();
    let s = TestServer::start().await;
    let (broken, renamed) = (s.create_session().await, s.create_session().await);
    for sid in [&broken, &renamed] {
        let mut sse = s.events(sid, None).await;
        s.run(sid, &format!("hello {sid}")).await;
        sse.until("run_finished").await;
    }
    let before = (all_frames(&s, &broken).await, all_frames(&s, &renamed).await);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    keep.extend(s.stop().await);

    // One flipped bit breaks the JSON of one header ("header" → "iealer" is no
    // record); in the other it lands in the session id.
    let flip = |sid: &str, at: usize| {
        let path = ledger_path(&home, sid);
        let mut raw = std::fs::read(&path).unwrap();
        raw[at] ^= 0x01;
        std::fs::write(&path, raw).unwrap();
    };
    flip(&broken, 2);
    let header = std::fs::read_to_string(ledger_path(&home, &renamed)).unwrap();
    flip(&renamed, header.find(renamed.as_str()).unwrap() + 5);

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let (_, list) = s.get("/sessions").await;
    let mut listed: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["session_id"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut want = vec![broken.as_str(), renamed.as_str()];
    want.sort();
    assert_eq!(listed, want, "both still listed");
    for (sid, was) in [(&broken, &before.0), (&renamed, &before.1)] {
        let now = all_frames(&s, sid).await;
        let data = |f: &[Frame]| f.iter().map(|f| f.data.clone()).collect::<Vec<_>>();
        assert_eq!(data(&now), data(was), "{sid}: every event as it was");
        let mut sse = s.events(sid, None).await;
        s.run(sid, "still mine").await;
        assert_eq!(text_of(&sse.until("run_finished").await), "echo: still mine");
        let first = &ledger_lines(&home, sid)[0];
        assert_eq!(
            first["header"]["session_id"],
            sid.as_str(),
            "the header is whole again"
        );
    }
    assert!(
        !home.join("sessions").join("corrupt").exists(),
        "nothing set aside"
    );
}
