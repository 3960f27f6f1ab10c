//! `vak term` and workers (issue 30): a `/worker`'s child shown as one line when it is spawned and one when it finishes with its answer, and `/workers` listing the session's children, in a real pseudo-terminal.

use crate::support::term::{attached, idle};
use crate::support::*;

#[tokio::test]
async fn a_worker_is_a_line_when_spawned_and_when_finished_and_workers_lists_it() {
    let server = TestServer::start_with(|c| {
        c.core.permission = vak::core::PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await;
    let sid = server.create_session().await;
    for transport in ["sse", "grpc"] {
        let mut pty = Pty::spawn(attached(&server, transport, &sid), 30, 120);
        idle(&pty).await;
        if transport == "sse" {
            pty.send("/workers\r");
            pty.wait_for("no workers in this session").await;
            pty.send("/worker {\"prompt\": \"hello from a worker\", \"isolated\": false}\r");
            let screen = pty.wait_for("worker: echo: hello from a worker").await;
            let spawned = screen
                .lines()
                .find(|l| l.contains("⑂ worker ") && l.contains(" spawned: hello from a worker"))
                .unwrap_or_else(|| panic!("no spawned line:\n{screen}"));
            assert_eq!(pty.is_dim(spawned.trim()), Some(true), "{spawned}");
            assert!(
                screen
                    .lines()
                    .any(|l| l.contains("✓ worker ") && l.contains(" finished: echo: hello from a worker")),
                "no finished line:\n{screen}"
            );
            idle(&pty).await;
        }
        pty.send("/workers\r");
        // The listing's line comes after its heading: wait for the line.
        let screen = pty
            .wait_for("  worker  finished  echo: hello from a worker")
            .await;
        assert!(screen.contains("1 worker of this session:"), "{screen}");
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0);
    }
}
