//! `vak term` in a pseudo-terminal attached to a test server's session, and waiting for its idle prompt.

use super::{Pty, TestServer, TOKEN};

/// `vak term --session SID` over `transport`, in the server's workspace.
pub fn attached(server: &TestServer, transport: &str, sid: &str) -> portable_pty::CommandBuilder {
    let mut cmd = portable_pty::CommandBuilder::new(env!("CARGO_BIN_EXE_vak"));
    cmd.args([
        "term",
        "--url",
        &server.url,
        "--token",
        TOKEN,
        "--transport",
        transport,
        "--session",
        sid,
    ]);
    for v in ["VAK_URL", "VAK_TOKEN", "VAK_HOME", "RUST_LOG"] {
        cmd.env_remove(v);
    }
    cmd.env("TERM", "xterm-256color");
    cmd.cwd(&server.workspace);
    cmd
}

/// The screen once vak term shows its idle prompt.
pub async fn idle(pty: &Pty) -> String {
    pty.wait_until("an idle prompt", |s| {
        !s.contains("running…") && s.lines().any(|l| l.trim_end() == ">")
    })
    .await
}
