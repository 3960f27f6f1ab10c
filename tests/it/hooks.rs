//! Lifecycle hooks end to end, set through `PATCH /config`: a `pre_tool_use` hook that exits 2 blocks a bash call with its stderr before anyone is asked, a `post_tool_use` hook sees the tool's output, a hanging hook is killed with its process group at its timeout while the run goes on, a cancelled run kills its hook, and `session_start` and `stop` hooks get their documents.

use crate::support::{self, exited, Frame, TestServer, DEADLINE};
use serde_json::{json, Value};
use std::path::Path;
use vak::core::PermissionMode;

async fn set_hooks(s: &TestServer, hooks: Value) {
    let (st, v) = s
        .send(reqwest::Method::PATCH, "/config", Some(json!({ "hooks": hooks })))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["hooks_source"], "api", "{v}");
}

/// Waits (bounded) for `path` to exist and reads it as JSON. Hooks write
/// their file whole by renaming a temporary one, so it is never seen half written.
async fn read_json(path: &Path) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        support::poll::pause().await;
    }
}

/// A hook command that saves its stdin document as `name` in the workspace.
fn save_stdin(name: &str) -> String {
    format!("cat > {name}.tmp && mv {name}.tmp {name}")
}

fn bodies<'a>(frames: &'a [Frame], kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f.event == kind)
        .map(|f| f.body())
        .collect()
}

#[tokio::test]
async fn a_pre_tool_use_hook_that_exits_2_blocks_the_call_with_its_reason_before_anyone_is_asked() {
    // Default mode: bash would ask; the hook decides first, so nobody is asked.
    let s = TestServer::start().await;
    std::fs::write(s.workspace.join("a.txt"), "A").unwrap();
    set_hooks(
        &s,
        json!({"pre_tool_use": [{
            "command": format!("{}; echo '  no bash on Fridays  ' >&2; exit 2", save_stdin("pre.json")),
            "matcher": "^bash$"
        }]}),
    )
    .await;
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    let (st, v) = s.run(&sid, "/read a.txt\n/bash echo hi > ran.txt").await;
    assert_eq!(st, 202, "{v}");
    let frames = ev.until("run_finished").await;
    support::assert_completed(&frames);
    assert!(bodies(&frames, "approval_requested").is_empty(), "{frames:#?}");
    let calls = bodies(&frames, "tool_call");
    let results = bodies(&frames, "tool_result");
    assert_eq!((calls.len(), results.len()), (2, 2), "{frames:#?}");
    // The matcher leaves read_file alone.
    assert_eq!(
        (&results[0]["ok"], &results[0]["output"]),
        (&json!(true), &json!("A"))
    );
    assert_eq!(
        (&results[1]["ok"], &results[1]["output"]),
        (&json!(false), &json!("no bash on Fridays"))
    );
    assert!(!s.workspace.join("ran.txt").exists(), "the blocked command ran");
    let doc = read_json(&s.workspace.join("pre.json")).await;
    assert_eq!(doc["event"], "pre_tool_use");
    assert_eq!(doc["session_id"], sid.as_str());
    assert_eq!(doc["tool"], "bash");
    assert_eq!(doc["input"]["command"], "echo hi > ran.txt");
    assert_eq!(doc["call_id"], calls[1]["call_id"]);
    assert_eq!(doc["workspace"], s.workspace.display().to_string());
}

#[tokio::test]
async fn a_post_tool_use_hook_sees_the_tools_output() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await;
    set_hooks(
        &s,
        json!({"post_tool_use": [{"command": save_stdin("post.json")}]}),
    )
    .await;
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    s.run(&sid, "/bash echo hi; echo there").await;
    let frames = ev.until("run_finished").await;
    support::assert_completed(&frames);
    let call = bodies(&frames, "tool_call")[0].clone();
    let doc = read_json(&s.workspace.join("post.json")).await;
    assert_eq!(doc["event"], "post_tool_use");
    assert_eq!(doc["tool"], "bash");
    assert_eq!(doc["call_id"], call["call_id"]);
    assert_eq!(doc["input"]["command"], "echo hi; echo there");
    assert_eq!(
        (&doc["ok"], &doc["output"]),
        (&json!(true), &json!("hi\nthere\n"))
    );
}

/// Reads the pid a hook wrote to `path` (waiting for it, bounded).
async fn pid_in(path: &Path) -> i32 {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pid in {}",
            path.display()
        );
        support::poll::pause().await;
    }
}

#[tokio::test]
async fn a_hanging_hook_is_killed_with_its_group_at_its_timeout_and_the_run_goes_on() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await;
    set_hooks(
        &s,
        json!({"pre_tool_use": [
            // The shell's pid is its process group's id; `exec` keeps it.
            {"command": "echo $$ > hook.pid.tmp && mv hook.pid.tmp hook.pid; exec sleep 1000", "timeout_ms": 1000},
            // Any failure but exit code 2 does not block either.
            {"command": "echo broken >&2; exit 1"}
        ]}),
    )
    .await;
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    s.run(&sid, "/bash echo ran > ran.txt").await;
    let frames = tokio::time::timeout(DEADLINE, ev.until("run_finished"))
        .await
        .expect("the run finishes past the hook's timeout");
    support::assert_completed(&frames);
    let results = bodies(&frames, "tool_result");
    assert_eq!(results[0]["ok"], true, "{frames:#?}");
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("ran.txt")).unwrap(),
        "ran\n"
    );
    let pid = pid_in(&s.workspace.join("hook.pid")).await;
    assert!(exited(pid).await, "the hook ({pid}) was killed at its timeout");
    // Gone once reaped (a zombie still counts as a member for a moment).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    // SAFETY: signal 0 to a process group only checks that it exists.
    while unsafe { libc::killpg(pid, 0) } == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hook's process group ({pid}) outlived it"
        );
        support::poll::pause().await;
    }
}

#[tokio::test]
async fn a_cancelled_run_kills_its_hook() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await;
    set_hooks(
        &s,
        json!({"pre_tool_use": [{"command": "echo $$ > hook.pid.tmp && mv hook.pid.tmp hook.pid; exec sleep 1000", "timeout_ms": 600000}]}),
    )
    .await;
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    s.run(&sid, "/bash echo ran > ran.txt").await;
    let pid = pid_in(&s.workspace.join("hook.pid")).await;
    let (st, v) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!((st, &v["cancelled"]), (200, &json!(true)), "{v}");
    let frames = ev.until("run_finished").await;
    assert_eq!(support::finished(&frames)["outcome"], "cancelled");
    let results = bodies(&frames, "tool_result");
    assert_eq!(results.len(), 1, "{frames:#?}");
    assert_eq!(results[0]["ok"], false);
    assert!(exited(pid).await, "the hook ({pid}) was killed with the run");
    assert!(!s.workspace.join("ran.txt").exists());
}

#[tokio::test]
async fn session_start_and_stop_hooks_get_their_documents() {
    let s = TestServer::start().await;
    set_hooks(
        &s,
        json!({
            "session_start": [{"command": save_stdin("start.json")}],
            // A matcher names tools: an event without one runs every hook.
            "stop": [{"command": save_stdin("stop.json"), "matcher": "^bash$"}]
        }),
    )
    .await;
    let sid = s.create_session().await;
    let start = read_json(&s.workspace.join("start.json")).await;
    assert_eq!(
        start,
        json!({"event": "session_start", "session_id": sid, "workspace": s.workspace.display().to_string()})
    );
    let mut ev = s.events(&sid, None).await;
    s.run(&sid, "hello").await;
    support::assert_completed(&ev.until("run_finished").await);
    let stop = read_json(&s.workspace.join("stop.json")).await;
    assert_eq!(
        stop,
        json!({"event": "stop", "session_id": sid, "workspace": s.workspace.display().to_string(), "outcome": "completed"})
    );
}
