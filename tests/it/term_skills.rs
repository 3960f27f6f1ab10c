//! `vak term` and promoted skills (issue 35): it names them when it starts, `/skills` lists them, and
//! typing `/NAME` has the model use one (the offline model calls `skill__NAME`), in a real pseudo-terminal.

use crate::support::term::{attached, idle};
use crate::support::*;
use serde_json::json;

#[tokio::test]
async fn promoted_skills_are_named_listed_and_run_as_slash_commands() {
    let server = TestServer::start_with(|c| {
        c.core.permission = vak::core::PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await;
    let sid = server.create_session().await;
    let (status, a) = server
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "/bash echo one\n/bash echo two", "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{a}");
    let (status, p) = server
        .post(
            "/skills/proposals",
            json!({"from_session": sid, "name": "echo-twice"}),
        )
        .await;
    assert_eq!(status, 201, "{p}");
    let id = p["id"].as_str().unwrap();
    let (status, s) = server
        .post(&format!("/skills/proposals/{id}/promote"), json!({}))
        .await;
    assert_eq!(status, 200, "{s}");

    for transport in ["sse", "grpc"] {
        let mut pty = Pty::spawn(attached(&server, transport, &sid), 30, 120);
        pty.wait_for("· skills: /echo-twice (/skills says what each does)")
            .await;
        idle(&pty).await;
        pty.send("/skills\r");
        pty.wait_for("  /echo-twice  script  runs: echo one").await;
        pty.send("/echo-twice\r");
        let screen = pty.wait_for("result: one").await;
        assert!(screen.contains("skill__echo-twice"), "{screen}");
        idle(&pty).await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0);
    }
}
