//! Permission modes as a user meets them: which of read_file, write_file and
//! bash run, ask or are refused in each mode; `POST /config/mode` denying
//! pending approvals and cancelling runs before it answers; leaving plan mode
//! through an approved plan (and staying in it when the plan is denied);
//! bypass only with --allow-bypass; the mode in GET /config and in config
//! frames; an approval nobody answers expiring at `--approval-timeout`.

use crate::support::{Frame, Serve, Sse, TestServer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

async fn server(mode: PermissionMode, allow_bypass: bool) -> TestServer {
    TestServer::start_with(|c| {
        c.core.permission = mode;
        c.core.allow_bypass = allow_bypass;
    })
    .await
}

async fn set_mode(s: &TestServer, mode: &str) -> (u16, Value) {
    s.post("/config/mode", json!({ "mode": mode })).await
}

async fn mode_of(s: &TestServer) -> String {
    let (code, v) = s.get("/config").await;
    assert_eq!(code, 200);
    v["permission_mode"].as_str().unwrap().to_string()
}

async fn answer(s: &TestServer, sid: &str, rid: &str, body: Value) -> (u16, Value) {
    s.post(&format!("/sessions/{sid}/approvals/{rid}"), body).await
}

/// What one run did: the tools that asked (each approved), and each tool's
/// result by tool name.
struct Ran {
    asked: Vec<String>,
    results: BTreeMap<String, (bool, String)>,
    frames: Vec<Frame>,
}

/// Runs `prompt` in a new session, approving every approval, to its run_finished.
async fn run_approving(s: &TestServer, prompt: &str) -> Ran {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    assert_eq!(s.run(&sid, prompt).await.0, 202);
    let mut ran = Ran {
        asked: Vec::new(),
        results: BTreeMap::new(),
        frames: Vec::new(),
    };
    let mut tools = BTreeMap::new();
    loop {
        let f = sse.next().await.expect("the stream goes on until run_finished");
        let body = f.body().clone();
        match f.event.as_str() {
            "tool_call" => {
                tools.insert(
                    body["call_id"].to_string(),
                    body["tool"].as_str().unwrap().to_string(),
                );
            }
            "approval_requested" => {
                ran.asked.push(body["tool"].as_str().unwrap().to_string());
                let rid = body["request_id"].as_str().unwrap();
                assert_eq!(answer(s, &sid, rid, json!({"approve": true})).await.0, 200);
            }
            "tool_result" => {
                let tool = tools[&body["call_id"].to_string()].clone();
                let out = (
                    body["ok"].as_bool().unwrap(),
                    body["output"].as_str().unwrap().to_string(),
                );
                ran.results.insert(tool, out);
            }
            _ => {}
        }
        let done = f.event == "run_finished";
        ran.frames.push(f);
        if done {
            return ran;
        }
    }
}

const THREE: &str = "/read a.txt\n/write b.txt B\n/bash echo ran > c.txt";

#[tokio::test]
async fn each_mode_runs_asks_or_refuses_read_write_and_bash() {
    let s = server(PermissionMode::Default, true).await;
    std::fs::write(s.workspace.join("a.txt"), "A").unwrap();
    let asks = |tools: &[&str]| tools.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    for (mode, asked) in [
        ("default", asks(&["write_file", "bash"])),
        ("accept-edits", asks(&["bash"])),
        ("bypass", asks(&[])),
        ("plan", asks(&[])),
    ] {
        let _ = std::fs::remove_file(s.workspace.join("b.txt"));
        let _ = std::fs::remove_file(s.workspace.join("c.txt"));
        let (code, v) = set_mode(&s, mode).await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["config"]["permission_mode"], mode);
        assert_eq!(mode_of(&s).await, mode);
        let ran = run_approving(&s, THREE).await;
        assert_eq!(ran.asked, asked, "{mode}: what asks");
        assert_eq!(
            ran.results["read_file"],
            (true, "A".to_string()),
            "{mode}: reads always run"
        );
        let last = ran.frames.last().unwrap().body();
        assert_eq!(last["outcome"], "completed", "{mode}");
        if mode == "plan" {
            for tool in ["write_file", "bash"] {
                let (ok, out) = &ran.results[tool];
                assert!(!ok, "{mode}: {tool} is refused");
                assert!(
                    out.contains("plan mode") && out.contains("exit_plan_mode"),
                    "{out}"
                );
            }
            assert!(!s.workspace.join("b.txt").exists() && !s.workspace.join("c.txt").exists());
        } else {
            assert!(ran.results["write_file"].0 && ran.results["bash"].0, "{mode}");
            assert_eq!(std::fs::read_to_string(s.workspace.join("b.txt")).unwrap(), "B");
            assert_eq!(
                std::fs::read_to_string(s.workspace.join("c.txt")).unwrap(),
                "ran\n"
            );
        }
    }
}

#[tokio::test]
async fn a_mode_change_denies_pending_approvals_and_cancels_runs_before_it_answers() {
    let s = server(PermissionMode::Default, false).await;
    let (asking, sleeping) = (s.create_session().await, s.create_session().await);
    let mut ask_sse = s.events(&asking, None).await;
    let mut sleep_sse = s.events(&sleeping, None).await;
    s.run(&asking, "/write x.txt X").await;
    let rid = ask_sse.until("approval_requested").await.last().unwrap().body()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    s.run(&sleeping, "/sleep 600000").await;
    sleep_sse.until("turn_started").await;

    let (code, v) = set_mode(&s, "accept-edits").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (&v["changed"], &v["cancelled_runs"], &v["denied_approvals"]),
        (&json!(true), &json!(2), &json!(1))
    );
    // Before the answer, both runs had finished and were visible: their
    // run_finished is at or below the latest seq read right after it.
    let latest = (s.latest_seq(&asking).await, s.latest_seq(&sleeping).await);
    let (_, sessions) = s.get("/sessions").await;
    assert!(sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["busy"] == false));

    let frames = ask_sse.until("run_finished").await;
    let resolved = frames.iter().find(|f| f.event == "approval_resolved").unwrap();
    assert_eq!(resolved.body()["request_id"], rid.as_str());
    assert_eq!(resolved.body()["outcome"], "denied");
    assert_eq!(
        resolved.body()["reason"],
        "the permission mode changed to accept-edits"
    );
    let result = frames.iter().find(|f| f.event == "tool_result").unwrap();
    assert_eq!(result.body()["ok"], false);
    let fin = frames.last().unwrap();
    assert_eq!(fin.body()["outcome"], "cancelled");
    assert!(
        fin.seq() <= latest.0,
        "run_finished {} was visible at {}",
        fin.seq(),
        latest.0
    );
    assert!(!s.workspace.join("x.txt").exists());
    let fin = sleep_sse.until("run_finished").await.pop().unwrap();
    assert_eq!(fin.body()["outcome"], "cancelled");
    assert!(fin.seq() <= latest.1);
    // A settled approval stays settled.
    assert_eq!(answer(&s, &asking, &rid, json!({"approve": true})).await.0, 409);

    // The same mode again touches nothing.
    s.run(&sleeping, "/sleep 600000").await;
    sleep_sse.until("turn_started").await;
    let (code, v) = set_mode(&s, "accept-edits").await;
    assert_eq!(code, 200);
    assert_eq!((&v["changed"], &v["cancelled_runs"]), (&json!(false), &json!(0)));
    let (_, sessions) = s.get("/sessions").await;
    let busy = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["session_id"] == sleeping.as_str());
    assert_eq!(busy.unwrap()["busy"], true, "the run goes on");
    assert_eq!(
        s.post(&format!("/sessions/{sleeping}/cancel"), json!({})).await.0,
        200
    );
    sleep_sse.until("run_finished").await;
}

/// Starts `prompt` in a new session and waits for its exit_plan_mode approval.
async fn plan_asked(s: &TestServer, prompt: &str) -> (String, Sse, Value) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, prompt).await;
    let ask = sse.next_ask().await;
    (sid, sse, ask)
}

#[tokio::test]
async fn an_approved_plan_leaves_plan_mode_for_the_mode_its_answer_names() {
    let s = server(PermissionMode::Plan, false).await;
    let (sid, mut sse, ask) = plan_asked(&s, "/plan 1. write a.txt\n/write a.txt A").await;
    assert_eq!(ask["tool"], "exit_plan_mode");
    assert_eq!(ask["input"]["plan"], "1. write a.txt");
    let rid = ask["request_id"].as_str().unwrap();

    // A bad mode is refused and leaves the approval pending.
    let (code, v) = answer(&s, &sid, rid, json!({"approve": true, "mode": "yolo"})).await;
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("accept-edits or default"),
        "{v}"
    );
    assert_eq!(mode_of(&s).await, "plan");
    let (code, v) = answer(&s, &sid, rid, json!({"approve": true, "mode": "accept-edits"})).await;
    assert_eq!((code, &v["outcome"]), (200, &json!("approved")), "{v}");
    assert_eq!(mode_of(&s).await, "accept-edits");

    let frames = sse.until("run_finished").await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert!(
        !kinds.contains(&"approval_requested"),
        "the write asks nobody: {kinds:?}"
    );
    let results: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| f.body())
        .collect();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["ok"], true);
    assert!(results[0]["output"].as_str().unwrap().contains("accept-edits"));
    assert_eq!(results[1]["ok"], true);
    assert_eq!(std::fs::read_to_string(s.workspace.join("a.txt")).unwrap(), "A");

    // Back to plan; approved with `default` (the default), a write asks.
    assert_eq!(set_mode(&s, "plan").await.0, 200);
    let (sid, mut sse, ask) = plan_asked(&s, "/plan 2. write b.txt\n/write b.txt B").await;
    let rid = ask["request_id"].as_str().unwrap();
    assert_eq!(answer(&s, &sid, rid, json!({"approve": true})).await.0, 200);
    assert_eq!(mode_of(&s).await, "default");
    let ask = sse.next_ask().await;
    assert_eq!(ask["tool"], "write_file");
    let rid = ask["request_id"].as_str().unwrap();
    // A mode answers only a plan.
    let (code, v) = answer(&s, &sid, rid, json!({"approve": true, "mode": "default"})).await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(answer(&s, &sid, rid, json!({"approve": true})).await.0, 200);
    let fin = sse.until("run_finished").await.pop().unwrap();
    assert_eq!(fin.body()["outcome"], "completed");
    assert_eq!(std::fs::read_to_string(s.workspace.join("b.txt")).unwrap(), "B");
}

#[tokio::test]
async fn a_denied_plan_stays_in_plan_mode_and_outside_it_a_plan_asks_nobody() {
    let s = server(PermissionMode::Plan, false).await;
    let (sid, mut sse, ask) = plan_asked(&s, "/plan rewrite it all\n/write c.txt C").await;
    let rid = ask["request_id"].as_str().unwrap();
    let (code, v) = answer(&s, &sid, rid, json!({"approve": false, "reason": "too risky"})).await;
    assert_eq!((code, &v["outcome"]), (200, &json!("denied")));
    let frames = sse.until("run_finished").await;
    let results: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| f.body())
        .collect();
    assert_eq!(results[0]["ok"], false);
    let out = results[0]["output"].as_str().unwrap();
    assert!(out.contains("too risky") && out.contains("plan mode"), "{out}");
    assert_eq!(
        results[1]["ok"], false,
        "still in plan mode: the write is refused"
    );
    assert_eq!(mode_of(&s).await, "plan");
    assert!(!s.workspace.join("c.txt").exists());

    assert_eq!(set_mode(&s, "default").await.0, 200);
    let ran = run_approving(&s, "/plan nothing to approve").await;
    assert!(ran.asked.is_empty());
    let (ok, out) = &ran.results["exit_plan_mode"];
    assert!(!ok && out.contains("not in plan mode"), "{out}");
    assert_eq!(mode_of(&s).await, "default");
}

#[tokio::test]
async fn bypass_needs_allow_bypass_through_the_api_and_at_startup() {
    let s = server(PermissionMode::Default, false).await;
    let (code, v) = set_mode(&s, "bypass").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--allow-bypass"),
        "{v}"
    );
    let (code, v) = set_mode(&s, "yolo").await;
    assert_eq!(code, 400);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("default, accept-edits, plan, bypass"));
    assert_eq!(mode_of(&s).await, "default");

    for mode in ["bypass", "allow"] {
        let out = Serve::new().args(["--permission-mode", mode]).output().await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode}: {err}");
        assert!(
            err.contains("vak: error: --permission-mode bypass") && err.contains("--allow-bypass"),
            "{err}"
        );
    }
}

/// The permission mode of the next config frame on a /stream.
async fn next_config(sse: &mut Sse) -> String {
    loop {
        let f = sse.next().await.expect("a config frame");
        if f.event == "config" {
            return f.data["permission_mode"].as_str().unwrap().to_string();
        }
    }
}

#[tokio::test]
async fn get_config_and_config_frames_follow_the_mode() {
    let s = server(PermissionMode::Default, false).await;
    let sid = s.create_session().await;
    let mut stream = s
        .open_stream(&s.url, &format!("session={sid}&config=1"), None)
        .await;
    assert_eq!(next_config(&mut stream).await, "default");
    assert_eq!(set_mode(&s, "plan").await.0, 200);
    assert_eq!(next_config(&mut stream).await, "plan");
    // Over gRPC: the SetMode RPC.
    let mut grpc = s.grpc().await;
    let r = grpc
        .set_mode(pb::SetModeRequest {
            mode: pb::PermissionMode::AcceptEdits as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.changed);
    assert_eq!(
        r.config.unwrap().permission_mode(),
        pb::PermissionMode::AcceptEdits
    );
    assert_eq!(next_config(&mut stream).await, "accept-edits");
    let e = grpc
        .set_mode(pb::SetModeRequest {
            mode: pb::PermissionMode::Bypass as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // An approved plan (here over gRPC) changes the mode too, and says so
    // on the stream.
    assert_eq!(set_mode(&s, "plan").await.0, 200);
    assert_eq!(next_config(&mut stream).await, "plan");
    let (sid, _sse, ask) = plan_asked(&s, "/plan p").await;
    let approve = |mode: pb::PlanExitMode| pb::ApproveRequest {
        session_id: sid.clone(),
        request_id: ask["request_id"].as_str().unwrap().into(),
        approve: Some(true),
        reason: String::new(),
        mode: Some(mode as i32),
        always: None,
    };
    // No mode named (a plan exit needs one), as REST's "mode": "" is refused.
    let e = grpc
        .approve(approve(pb::PlanExitMode::Unspecified))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let r = grpc
        .approve(approve(pb::PlanExitMode::AcceptEdits))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.outcome(), pb::ApprovalOutcome::Approved);
    assert_eq!(next_config(&mut stream).await, "accept-edits");
    assert_eq!(mode_of(&s).await, "accept-edits");
}

#[tokio::test]
async fn an_unanswered_approval_expires_at_the_approval_timeout_and_the_run_settles() {
    let s = TestServer::start_with(|c| {
        c.core.permission = PermissionMode::Default;
        c.core.approval_timeout = Some(std::time::Duration::from_secs(1));
    })
    .await;
    let sid = s.create_session().await;
    let mut events = s.events(&sid, None).await;
    let (status, b) = s.run(&sid, "/bash echo never-run").await;
    assert!(status < 300, "{b}");
    // Nobody answers: the approval expires, the call is denied, the run ends.
    let frames = events.until("run_finished").await;
    let asked = frames
        .iter()
        .find(|f| f.event == "approval_requested")
        .expect("the bash call asks");
    let rid = asked.body()["request_id"].as_str().unwrap().to_string();
    let resolved = frames
        .iter()
        .find(|f| f.event == "approval_resolved")
        .expect("the approval is resolved");
    assert_eq!(resolved.body()["request_id"], rid.as_str());
    assert_eq!(resolved.body()["outcome"], "expired", "{:?}", resolved.body());
    assert!(
        resolved.body()["reason"]
            .as_str()
            .unwrap()
            .contains("--approval-timeout"),
        "{:?}",
        resolved.body()
    );
    let result = frames
        .iter()
        .find(|f| f.event == "tool_result")
        .expect("the call gets its result");
    assert_eq!(result.body()["ok"], false);
    let output = result.body()["output"].as_str().unwrap();
    assert!(output.contains("the approval expired"), "{output}");
    assert!(!output.contains("never-run\n"), "the command never ran: {output}");
    // An answer after the expiry is refused: the approval is settled.
    let (code, v) = answer(&s, &sid, &rid, json!({"approve": true})).await;
    assert!(code >= 400, "{code} {v}");
}
