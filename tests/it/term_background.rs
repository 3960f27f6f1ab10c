//! `vak term` and background results (issue 29): a script task's output and its alert printed between runs in a real pseudo-terminal, a result that arrives during a run printed after that run's end, and the results replayed when a session is attached again.

use crate::support;
use crate::support::term::{attached, idle};
use crate::support::*;
use serde_json::{json, Value};

async fn run_now(s: &TestServer, id: &str) {
    let (st, v) = s.post(&format!("/tasks/{id}/run-now"), json!({})).await;
    assert_eq!(st, 202, "{v}");
}

async fn set_script(s: &TestServer, id: &str, script: &str) {
    let (st, v) = s
        .send(
            reqwest::Method::PATCH,
            &format!("/tasks/{id}"),
            Some(json!({ "script": script })),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

/// Waits (bounded) until the task's last fire has this outcome and is not `before`
/// (its slot: a run-now's is `now-<unix-ms>`, one of its own per fire).
async fn fired(s: &TestServer, id: &str, outcome: &str, before: &Value) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (st, v) = s.get(&format!("/tasks/{id}")).await;
        assert_eq!(st, 200, "{v}");
        let last = &v["task"]["last_fire"];
        if last["outcome"] == outcome && &last["slot"] != before {
            return last.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "never {outcome}: {v}");
        support::poll::pause().await;
    }
}

#[tokio::test]
async fn background_results_are_printed_between_runs_and_replayed_when_attached_again() {
    let server = TestServer::start_with(|c| c.core.permission = vak::core::PermissionMode::Allow).await;
    let sid = server.create_session().await;
    let (st, v) = server
        .post(
            "/tasks",
            json!({"name": "watchdog", "script": "echo '  all quiet  '", "session_id": sid}),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let id = v["task"]["id"].as_str().unwrap().to_string();

    let mut pty = Pty::spawn(attached(&server, "sse", &sid), 30, 120);
    idle(&pty).await;

    // Idle: printed at once, dimmed, naming where it came from.
    run_now(&server, &id).await;
    let quiet = format!("⟲ background (script {id}): all quiet");
    pty.wait_for(&quiet).await;
    assert_eq!(pty.is_dim(&quiet), Some(true), "a plain result is dimmed");

    // An alert: its reason first, not dimmed, the stderr under it.
    set_script(&server, &id, "echo 'disk is full' >&2; exit 3").await;
    let before = fired(&server, &id, "delivered", &Value::Null).await["slot"].clone();
    run_now(&server, &id).await;
    let alert = format!("⚠ script_failed (script {id})");
    // The stderr line comes after the alert's: wait for it, not the alert.
    let screen = pty.wait_for("disk is full").await;
    assert!(screen.contains(&alert), "{screen}");
    assert_eq!(pty.is_dim(&alert), Some(false), "an alert stands out");
    let before = fired(&server, &id, "script_failed", &before).await["slot"].clone();

    // During a run: held back until the run is over, then printed below its output.
    let go = server.workspace.join("go");
    mkfifo(&go);
    pty.send("/bash read x < go; echo \"got $x\"\r");
    pty.wait_for("⚙ bash $ read x < go").await;
    set_script(&server, &id, "echo during the run").await;
    run_now(&server, &id).await;
    fired(&server, &id, "delivered", &before).await;
    assert!(
        !pty.screen().contains("during the run"),
        "nothing is printed inside a run:\n{}",
        pty.screen()
    );
    tokio::task::spawn_blocking(move || std::fs::write(go, "it\n").unwrap())
        .await
        .unwrap();
    let during = format!("⟲ background (script {id}): during the run");
    let screen = pty.wait_for(&during).await;
    let (ran, shown) = (screen.find("✓ bash: got it"), screen.find(&during));
    assert!(
        matches!((ran, shown), (Some(r), Some(b)) if r < b),
        "the result comes after the run's output:\n{screen}"
    );
    idle(&pty).await;
    pty.send("\x04");
    assert_eq!(pty.wait_exit().await, 0);

    // Attached again (over gRPC this time), the session's history replays with its results.
    let mut again = Pty::spawn(attached(&server, "grpc", &sid), 30, 120);
    let screen = again.wait_for(&during).await;
    assert!(screen.contains(&quiet) && screen.contains(&alert), "{screen}");
    again.send("\x04");
    assert_eq!(again.wait_exit().await, 0);
}
