//! The command sandbox as a user meets it: the model's `bash` in
//! `workspace-write` writes the workspace and its private temporary
//! directory but nothing outside, cannot read vak's home and has no network
//! unless `[sandbox] network = true`; `read-only` writes nothing; `off` is
//! the server user's full rights; no command sees a provider key or the
//! token; `GET /host` says which sandbox is in force.

use crate::support;
use crate::support::TestServer;
use serde_json::Value;
use vak::core::tools::sandbox::{SandboxConfig, SandboxMode};
use vak::core::PermissionMode;

/// A server whose commands run without asking, in `sandbox`.
async fn server(sandbox: SandboxConfig) -> TestServer {
    TestServer::start_with(|c| {
        c.core.permission = PermissionMode::Bypass;
        c.core.allow_bypass = true;
        c.core.sandbox = sandbox;
    })
    .await
}

fn mode(mode: SandboxMode) -> SandboxConfig {
    SandboxConfig {
        mode,
        ..SandboxConfig::default()
    }
}

/// Runs each command as one `/bash` call of one run; their results (ok, output).
async fn bash(s: &TestServer, commands: &[&str]) -> Vec<(bool, String)> {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let prompt: Vec<String> = commands.iter().map(|c| format!("/bash {c}")).collect();
    assert_eq!(s.run(&sid, &prompt.join("\n")).await.0, 202);
    let frames = sse.until("run_finished").await;
    let results: Vec<(bool, String)> = frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| {
            let b: &Value = f.body();
            (
                b["ok"].as_bool().unwrap(),
                b["output"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(results.len(), commands.len(), "{frames:?}");
    results
}

#[tokio::test]
async fn workspace_write_writes_the_workspace_and_its_temporary_directory_and_nothing_outside() {
    let s = server(SandboxConfig::default()).await;
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("planted");
    std::fs::write(outside.path().join("existing"), "keep").unwrap();
    let r = bash(
        &s,
        &[
            &format!("touch {}", target.display()),
            &format!("echo gone > {}", outside.path().join("existing").display()),
            "echo made > inside.txt && cat inside.txt",
            "echo scratch > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo \"$TMPDIR\"",
            "cat /etc/hostname > /dev/null && echo read-ok",
        ],
    )
    .await;
    assert!(!r[0].0, "{:?}", r[0]);
    assert!(
        r[0].1.contains("[sandbox: write outside the workspace denied]"),
        "{:?}",
        r[0]
    );
    assert!(!target.exists(), "nothing is left outside");
    assert!(!r[1].0, "{:?}", r[1]);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("existing")).unwrap(),
        "keep"
    );
    assert_eq!(r[2], (true, "made\n".to_string()));
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("inside.txt")).unwrap(),
        "made\n"
    );
    assert!(r[3].0, "{:?}", r[3]);
    let tmp = r[3].1.lines().nth(1).unwrap();
    assert!(tmp.contains("vak-sandbox-"), "{tmp}");
    assert!(
        !std::path::Path::new(tmp).exists(),
        "the private temporary directory goes with its command"
    );
    assert_eq!(r[4], (true, "read-ok\n".to_string()), "reading outside works");
}

#[tokio::test]
async fn no_sandbox_reads_vaks_home() {
    let s = server(SandboxConfig::default()).await;
    std::fs::write(s.home.join("token"), "the-token-itself").unwrap();
    let r = bash(
        &s,
        &[
            &format!("cat {}/token", s.home.display()),
            &format!("ls {}", s.home.display()),
            &format!("cat {}/sessions/*.jsonl", s.home.display()),
        ],
    )
    .await;
    for (ok, out) in &r {
        assert!(!ok, "{out}");
        assert!(!out.contains("the-token-itself"), "{out}");
        assert!(!out.contains("user_message"), "no ledger is read: {out}");
    }
    assert!(
        r[0].1.contains("[sandbox: vak's home is not readable]"),
        "{:?}",
        r[0]
    );
}

#[tokio::test]
async fn read_only_writes_nothing_not_even_the_workspace() {
    let s = server(mode(SandboxMode::ReadOnly)).await;
    std::fs::write(s.workspace.join("a.txt"), "body").unwrap();
    let r = bash(
        &s,
        &[
            "echo no > b.txt",
            "cat a.txt",
            "echo x > /dev/null && echo devnull-ok",
        ],
    )
    .await;
    assert!(!r[0].0, "{:?}", r[0]);
    assert!(r[0].1.contains("[sandbox: read-only"), "{:?}", r[0]);
    assert!(!s.workspace.join("b.txt").exists());
    assert_eq!(r[1], (true, "body".to_string()));
    assert_eq!(r[2], (true, "devnull-ok\n".to_string()));
}

#[tokio::test]
async fn the_network_is_off_unless_the_config_turns_it_on() {
    let off = server(SandboxConfig::default()).await;
    let health = format!("curl -sS --max-time 5 {}/health", off.url);
    let r = bash(&off, &[&health]).await;
    assert!(!r[0].0, "{:?}", r[0]);
    assert!(r[0].1.contains("[sandbox: network access denied]"), "{:?}", r[0]);

    let on = server(SandboxConfig {
        network: true,
        ..SandboxConfig::default()
    })
    .await;
    let health = format!("curl -sS --max-time 5 {}/health", on.url);
    let r = bash(&on, &[&health]).await;
    assert!(r[0].0, "{:?}", r[0]);
    assert!(r[0].1.contains("ok"), "{:?}", r[0]);
}

#[tokio::test]
async fn off_is_the_server_users_full_rights() {
    let s = server(mode(SandboxMode::Off)).await;
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("planted");
    let r = bash(&s, &[&format!("touch {}", target.display())]).await;
    assert!(r[0].0, "{:?}", r[0]);
    assert!(target.exists());
}

#[tokio::test]
async fn no_command_sees_a_provider_key_or_the_token() {
    // The environment is process-wide, and every test shares this binary's process:
    // this one sets these in a process of its own.
    if !crate::support::own_process("sandbox::no_command_sees_a_provider_key_or_the_token") {
        return;
    }
    std::env::set_var("OPENAI_API_KEY", "sk-sandbox-test-openai");
    std::env::set_var("ANTHROPIC_API_KEY", "sk-ant-sandbox-test");
    std::env::set_var("VAK_TOKEN", "vak-token-sandbox-test");
    std::env::set_var("MY_OWN_SECRET", "my-own-secret-value");
    std::env::set_var("VAK_SANDBOX_TEST_VISIBLE", "visible-value");
    for sandbox in [mode(SandboxMode::Off), SandboxConfig::default()] {
        let s = server(SandboxConfig {
            scrub_env: vec!["MY_OWN_SECRET".into()],
            ..sandbox
        })
        .await;
        let r = bash(&s, &["env"]).await;
        assert!(r[0].0, "{:?}", r[0]);
        for secret in [
            "sk-sandbox-test-openai",
            "sk-ant-sandbox-test",
            "vak-token-sandbox-test",
            "my-own-secret-value",
        ] {
            assert!(!r[0].1.contains(secret), "{secret} in {}", r[0].1);
        }
        assert!(r[0].1.contains("VAK_SANDBOX_TEST_VISIBLE=visible-value"));
    }
}

#[tokio::test]
async fn host_reports_the_sandbox_in_force() {
    let s = server(SandboxConfig {
        network: true,
        ..SandboxConfig::default()
    })
    .await;
    let (code, host) = s.get("/host").await;
    assert_eq!(code, 200);
    let sb = &host["sandbox"];
    assert_eq!(sb["mode"], "workspace-write");
    assert_eq!(sb["network"], true);
    assert!(sb["landlock_abi"].as_u64().unwrap() >= 3, "{sb}");
    let s = server(mode(SandboxMode::Off)).await;
    let (_, host) = s.get("/host").await;
    assert_eq!(host["sandbox"]["mode"], "off");
}

#[tokio::test]
async fn writable_roots_may_be_written_too() {
    let extra = tempfile::tempdir().unwrap();
    let s = server(SandboxConfig {
        writable_roots: vec![extra.path().to_path_buf()],
        ..SandboxConfig::default()
    })
    .await;
    let r = bash(&s, &[&format!("echo there > {}/x", extra.path().display())]).await;
    assert!(r[0].0, "{:?}", r[0]);
    assert_eq!(
        std::fs::read_to_string(extra.path().join("x")).unwrap(),
        "there\n"
    );
    let (_, host) = s.get("/host").await;
    let canonical = std::fs::canonicalize(extra.path()).unwrap();
    assert_eq!(
        host["sandbox"]["writable_roots"][0],
        canonical.display().to_string()
    );
}

#[tokio::test]
async fn a_missing_writable_root_fails_the_start() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut cfg = vak::edge::server::ServeConfig::new(
        vak::core::CoreConfig::new(home.path().to_path_buf(), ws.path().to_path_buf()),
        support::TOKEN.to_string(),
    );
    cfg.core.sandbox.writable_roots = vec!["/no/such/folder".into()];
    let e = vak::edge::server::Server::new(cfg).err().expect("refused");
    assert!(
        e.message.contains("[sandbox] writable_roots: /no/such/folder"),
        "{}",
        e.message
    );
}
