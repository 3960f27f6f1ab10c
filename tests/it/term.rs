//! `vak term` against a real server: one-shot runs over both transports (text, JSON, exit codes, approvals), --list, server.json discovery, resuming across cut connections and a resync, and the interactive mode in a real pseudo-terminal.

use crate::support;
use crate::support::*;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const TRANSPORTS: [&str; 2] = ["sse", "grpc"];

/// `vak term ARGS` with a clean environment (no VAK_* or RUST_LOG from whoever runs the tests).
fn term(args: &[&str]) -> Command {
    let mut cmd = support::process::vak(&["term"]);
    cmd.args(args).env_remove("VAK_URL");
    cmd
}

/// `vak term --url URL --token TOKEN --transport T ARGS`.
fn term_at(url: &str, transport: &str, args: &[&str]) -> Command {
    let mut cmd = term(&["--url", url, "--token", TOKEN, "--transport", transport]);
    cmd.args(args);
    cmd
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn output(mut cmd: Command) -> Output {
    let out = tokio::time::timeout(DEADLINE, cmd.output())
        .await
        .expect("vak term exits within the deadline")
        .unwrap();
    Output {
        code: out.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// A running `vak term` whose stderr is read line by line (it asks its questions there).
struct Running {
    child: Child,
    stderr: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn spawn(mut cmd: Command) -> Running {
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("vak term starts");
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut err = BufReader::new(err);
            while let Some(line) = crate::support::process::next_line_lossy(&mut err).await {
                let _ = tx.send(line);
            }
        });
        Running {
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle`.
    async fn stderr_line(&mut self, needle: &str) -> String {
        loop {
            let line = tokio::time::timeout(DEADLINE, self.stderr.recv())
                .await
                .unwrap_or_else(|_| panic!("stderr shows {needle:?} within the deadline: {:?}", self.seen))
                .unwrap_or_else(|| panic!("stderr ended before {needle:?}: {:?}", self.seen));
            self.seen.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
    }

    async fn write_stdin(&mut self, text: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Waits for the exit: (code, stdout, the rest of stderr).
    async fn finish(mut self) -> Output {
        let out = tokio::time::timeout(DEADLINE, self.child.wait_with_output())
            .await
            .expect("vak term exits within the deadline")
            .unwrap();
        // The reader task ends at stderr's EOF, which the exit brings.
        while let Some(l) = tokio::time::timeout(DEADLINE, self.stderr.recv())
            .await
            .expect("stderr ends within the deadline")
        {
            self.seen.push(l);
        }
        Output {
            code: out.status.code().expect("an exit code, not a signal"),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: self.seen.join("\n"),
        }
    }
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON line: {e}: {l:?}")))
        .collect()
}

// ---- one-shot ----------------------------------------------------------------

#[tokio::test]
async fn one_shot_prints_exactly_the_answer_and_exits_0() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let out = output(term_at(&server.url, t, &["-p", "hello world"])).await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        assert_eq!(out.stdout, "echo: hello world\n", "{t}");
        assert_eq!(out.stderr, "", "{t}: nothing but the answer on a completed run");
        // Lines of one turn are joined by the model; text after a tool starts a new line.
        let out = output(term_at(
            &server.url,
            t,
            &["-p", "one\ntwo\n/read nothing.txt\nthree"],
        ))
        .await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        assert_eq!(out.stdout, "echo: one\necho: two\necho: three\n", "{t}");
        assert!(
            out.stderr.contains("read_file"),
            "{t}: tool entries go to stderr: {}",
            out.stderr
        );
    }
}

#[tokio::test]
async fn a_failed_run_exits_1_with_the_reason() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let out = output(term_at(&server.url, t, &["-p", "/fail x"])).await;
        assert_eq!(out.code, 1, "{t}: {}", out.stderr);
        assert_eq!(out.stdout, "", "{t}");
        assert!(
            out.stderr.contains("run failed: the model failed: x"),
            "{t}: {}",
            out.stderr
        );
        let retries = out
            .stderr
            .lines()
            .filter(|l| l.contains("retrying "))
            .collect::<Vec<_>>();
        assert_eq!(
            retries.last(),
            Some(&"vak: retrying 4/4: the model failed: x"),
            "{t}: {}",
            out.stderr
        );
    }
}

#[tokio::test]
async fn a_run_cancelled_by_another_client_exits_130() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let sid = server.create_session().await;
        let mut events = server.events(&sid, None).await;
        let running = Running::spawn(term_at(
            &server.url,
            t,
            &["--session", &sid, "-p", "/sleep 60000"],
        ));
        events.until("turn_started").await;
        let (code, body) = server
            .post(&format!("/sessions/{sid}/cancel"), serde_json::json!({}))
            .await;
        assert_eq!((code, body["cancelled"].as_bool()), (200, Some(true)), "{t}");
        let out = running.finish().await;
        assert_eq!(out.code, 130, "{t}: {}", out.stderr);
        assert!(out.stderr.contains("run cancelled"), "{t}: {}", out.stderr);
    }
}

#[tokio::test]
async fn ctrl_c_cancels_the_run_and_exits_130() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let sid = server.create_session().await;
        let mut events = server.events(&sid, None).await;
        let running = Running::spawn(term_at(
            &server.url,
            t,
            &["--session", &sid, "-p", "/sleep 60000"],
        ));
        events.until("turn_started").await;
        let pid = running.child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let finished = events.until("run_finished").await;
        assert_eq!(
            finished.last().unwrap().body()["outcome"],
            "cancelled",
            "{t}: the server saw a cancel"
        );
        let out = running.finish().await;
        assert_eq!(out.code, 130, "{t}: {}", out.stderr);
    }
}

#[tokio::test]
async fn json_output_is_every_frame_as_a_line_in_the_sse_schema() {
    let server = TestServer::start().await;
    let mut kinds_by_transport = Vec::new();
    for t in TRANSPORTS {
        let out = output(term_at(
            &server.url,
            t,
            &["--output", "json", "-p", "a b\n/think hm"],
        ))
        .await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        let frames = json_lines(&out.stdout);
        assert_eq!(agent_kind(&frames[0]), "stream_opened", "{t}: {frames:?}");
        assert_eq!(frames[0]["seq"], 0);
        let sid = frames[0]["session_id"].as_str().unwrap();
        let numbered = &frames[1..];
        let mut last = 0;
        for f in numbered {
            let seq = f["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("{t}: seq is a number: {f}"));
            assert!(seq > last, "{t}: seq {seq} after {last}");
            last = seq;
            assert_eq!(f["session_id"], sid);
        }
        let text: String = numbered
            .iter()
            .filter(|f| agent_kind(f) == "text_delta")
            .map(|f| f["text_delta"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "echo: a b", "{t}");
        let end = numbered.last().unwrap();
        assert_eq!(end["run_finished"]["outcome"], "completed", "{t}");
        // Exactly what the server's SSE stream carries for the same frames.
        let mut sse = server.events(sid, Some(0)).await;
        let replay = sse.until("run_finished").await;
        let replay: Vec<Value> = replay.into_iter().map(|f| f.data).collect();
        assert_eq!(
            numbered,
            replay.as_slice(),
            "{t}: the SSE data, byte for byte in meaning"
        );
        kinds_by_transport.push(numbered.iter().map(agent_kind).collect::<Vec<_>>());
    }
    assert_eq!(
        kinds_by_transport[0], kinds_by_transport[1],
        "both transports show the same frames"
    );
}

#[tokio::test]
async fn a_one_shot_run_prints_a_command_s_live_output_to_stderr() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let prompt = "/bash echo hi; echo oops >&2; exit 3";
        let out = output(term_at(&server.url, t, &["--approve", "allow", "-p", prompt])).await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        assert!(out.stderr.contains("vak:   │ hi\n"), "{t}: {}", out.stderr);
        assert!(out.stderr.contains("vak:   ! oops\n"), "{t}: {}", out.stderr);
        assert!(out.stderr.contains("vak: ✗ bash: "), "{t}: {}", out.stderr);
        assert!(
            !out.stdout.contains("hi"),
            "{t}: stdout is the answer only: {}",
            out.stdout
        );
    }
}

#[tokio::test]
async fn approvals_follow_the_approve_flag_and_default_to_deny_without_a_terminal() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let file = format!("allowed-{t}.txt");
        let prompt = format!("/write {file} hi");
        let out = output(term_at(&server.url, t, &["--approve", "allow", "-p", &prompt])).await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        assert_eq!(
            std::fs::read_to_string(server.workspace.join(&file)).unwrap(),
            "hi",
            "{t}"
        );
        assert!(out.stderr.contains("wrote 2 bytes"), "{t}: {}", out.stderr);

        for (name, flags) in [("denied", &["--approve", "deny"][..]), ("default", &[][..])] {
            let file = format!("{name}-{t}.txt");
            let prompt = format!("/write {file} hi");
            let mut args = flags.to_vec();
            args.extend(["-p", prompt.as_str()]);
            let out = output(term_at(&server.url, t, &args)).await;
            assert_eq!(
                out.code, 0,
                "{t} {name}: a refused tool does not fail the run: {}",
                out.stderr
            );
            assert!(
                !server.workspace.join(&file).exists(),
                "{t} {name}: nothing written"
            );
            // Said once: the approval's line, not again by the call's result.
            assert_eq!(out.stderr.matches("✗").count(), 1, "{t} {name}: {}", out.stderr);
            assert!(
                out.stderr
                    .contains("✗ write_file denied: vak term --approve deny"),
                "{t} {name}: {}",
                out.stderr
            );
        }
    }
}

#[tokio::test]
async fn approve_ask_reads_the_answer_from_stdin() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let file = format!("asked-{t}.txt");
        let prompt = format!("/write {file} yes");
        let mut running = Running::spawn(term_at(&server.url, t, &["--approve", "ask", "-p", &prompt]));
        let q = running.stderr_line("[y]es / [n]o / [a]lways").await;
        assert!(q.contains(&format!("write 3 bytes to {file}")), "{t}: {q}");
        running.write_stdin("y\n").await;
        let out = running.finish().await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        assert_eq!(
            std::fs::read_to_string(server.workspace.join(&file)).unwrap(),
            "yes",
            "{t}"
        );
    }
}

async fn set_mode(server: &TestServer, mode: &str) {
    let (code, v) = server
        .post("/config/mode", serde_json::json!({ "mode": mode }))
        .await;
    assert_eq!(code, 200, "{v}");
}

/// Waits for a one-shot run to exit 0 having asked `n` approval questions.
async fn finished_after_questions(running: Running, n: usize) {
    let out = running.finish().await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stderr.matches("wants approval").count(), n, "{}", out.stderr);
}

#[tokio::test]
async fn a_one_shot_always_keeps_a_rule_and_a_plan_is_shown_and_answered_with_a_mode() {
    let server = TestServer::start().await;
    for (t, program) in [("sse", "ls"), ("grpc", "pwd")] {
        // A rule covers the program with plain words after it (no options).
        let prompt = format!("/bash {program}\n/bash {program} plain\n/write once-{t}.txt x");
        let mut running = Running::spawn(term_at(&server.url, t, &["--approve", "ask", "-p", &prompt]));
        let q = running
            .stderr_line("[y]es / [n]o / [a]lways allow in this workspace")
            .await;
        assert!(q.contains(&format!("run `{program}`")), "{t}: {q}");
        running.write_stdin("a\n").await;
        running
            .stderr_line(&format!("always allowing bash `{program}` in this workspace"))
            .await;
        // The second command is covered: the next question is the write's.
        let q = running.stderr_line("wants approval").await;
        assert!(q.contains("write_file"), "{t}: {q}");
        running.write_stdin("n\n").await;
        finished_after_questions(running, 2).await;
    }
    assert_eq!(
        server.get("/permissions/rules").await.1["rules"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // A call no rule can cover (a path outside the workspace): approved once instead.
    let mut running = Running::spawn(term_at(
        &server.url,
        "sse",
        &["--approve", "ask", "-p", "/write ../outside.txt x"],
    ));
    running.stderr_line("wants approval").await;
    running.write_stdin("a\n").await;
    let said = running.stderr_line("no always-allow rule").await;
    assert!(
        said.contains("no always-allow rule can cover this write_file call")
            && said.ends_with("approved once"),
        "{said}"
    );
    running.stderr_line("✓ write_file approved").await;
    finished_after_questions(running, 1).await;

    set_mode(&server, "plan").await;
    let prompt = "/plan 1. write planned.txt\n/write planned.txt P";
    let mut running = Running::spawn(term_at(&server.url, "grpc", &["--approve", "ask", "-p", prompt]));
    running.stderr_line("── the plan to approve ──").await;
    running.stderr_line("vak: 1. write planned.txt").await;
    let q = running.stderr_line("wants approval").await;
    assert!(
        q.contains("[y]es, then ask before edits / [e] yes, accept edits / [n]o, keep planning"),
        "{q}"
    );
    running.write_stdin("a\n").await; // not a choice for a plan: asked again
    running.stderr_line("wants approval").await;
    running.write_stdin("e\n").await;
    // The plan, asked twice; the write asks nobody.
    finished_after_questions(running, 2).await;
    assert_eq!(
        std::fs::read_to_string(server.workspace.join("planned.txt")).unwrap(),
        "P"
    );
    assert_eq!(server.get("/config").await.1["permission_mode"], "accept-edits");
}

#[tokio::test]
async fn attaching_prints_only_the_new_answer() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let sid = server.create_session().await;
        let first = output(term_at(&server.url, t, &["--session", &sid, "-p", "first"])).await;
        assert_eq!(first.stdout, "echo: first\n", "{t}");
        let second = output(term_at(&server.url, t, &["--session", &sid, "-p", "second"])).await;
        assert_eq!(second.stdout, "echo: second\n", "{t}");
        let missing = output(term_at(&server.url, t, &["--session", "nosuch", "-p", "x"])).await;
        assert_eq!(missing.code, 1, "{t}");
        assert!(
            missing.stderr.contains("no session nosuch"),
            "{t}: {}",
            missing.stderr
        );
    }
}

#[tokio::test]
async fn list_shows_the_sessions() {
    let server = TestServer::start().await;
    let sid = server.create_session().await;
    let mut events = server.events(&sid, None).await;
    server.run(&sid, "a title\nmore").await;
    events.until("run_finished").await;
    for t in TRANSPORTS {
        let out = output(term_at(&server.url, t, &["--list"])).await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&sid))
            .unwrap_or_else(|| panic!("{t}: {sid} is listed: {}", out.stdout));
        assert!(line.ends_with("a title"), "{t}: {line}");

        let out = output(term_at(&server.url, t, &["--list", "--output", "json"])).await;
        let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        let s = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == sid.as_str())
            .unwrap();
        assert_eq!(s["title"], "a title", "{t}");
        assert!(s["latest_seq"].as_u64().unwrap() > 0);
    }
}

#[tokio::test]
async fn the_server_is_found_through_server_json_in_the_home() {
    let server = TestServer::start().await;
    let home = tempfile::tempdir().unwrap();
    vak::home::write_server_json(home.path(), &server.url, TOKEN).unwrap();
    let home_arg = home.path().to_str().unwrap();
    for t in TRANSPORTS {
        let out = output(term(&["--home", home_arg, "--transport", t, "-p", "found"])).await;
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, "echo: found\n"),
            "{t}: {}",
            out.stderr
        );
        let mut cmd = term(&["--transport", t, "-p", "by env"]);
        cmd.env("VAK_HOME", home.path());
        let out = output(cmd).await;
        assert_eq!(out.stdout, "echo: by env\n", "{t}: {}", out.stderr);
    }
    let empty = tempfile::tempdir().unwrap();
    let out = output(term(&["--home", empty.path().to_str().unwrap(), "-p", "x"])).await;
    assert_eq!(out.code, 1);
    let want = format!("{} does not exist", empty.path().join("server.json").display());
    assert!(out.stderr.contains(&want), "{}", out.stderr);
    let out = output(term(&["--url", &server.url, "--token", "wrong", "-p", "x"])).await;
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.starts_with("vak: error: ") && out.stderr.contains("Bearer"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn an_https_server_is_trusted_through_its_certificate_only() {
    let home = tempfile::tempdir().unwrap();
    let tls = vak::edge::tls::self_signed(home.path()).unwrap();
    let server = TestServer::start_with(|c| c.tls = Some(tls.config.clone())).await;
    let url = format!("https://{}", server.addr);
    vak::home::write_server_json(home.path(), &url, TOKEN).unwrap();
    let no_home = tempfile::tempdir().unwrap();
    let cert = tls.cert_path.to_str().unwrap();
    for t in TRANSPORTS {
        // Found through the home, whose development certificate is then trusted.
        let out = output(term(&[
            "--home",
            home.path().to_str().unwrap(),
            "--transport",
            t,
            "-p",
            "found",
        ]))
        .await;
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, "echo: found\n"),
            "{t}: {}",
            out.stderr
        );
        let mut cmd = term_at(&url, t, &["--ca-cert", cert, "-p", "named"]);
        cmd.env("HOME", no_home.path());
        let out = output(cmd).await;
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, "echo: named\n"),
            "{t}: {}",
            out.stderr
        );
        // No roots are built in: without the certificate there is nothing to trust.
        let mut cmd = term_at(&url, t, &["-p", "x"]);
        cmd.env("HOME", no_home.path());
        let out = output(cmd).await;
        assert_eq!(out.code, 1, "{t}");
        assert!(out.stderr.contains("--ca-cert"), "{t}: {}", out.stderr);
    }
}

// ---- resuming ------------------------------------------------------------------

/// The run waits on an approval while every connection is cut; the answer
/// then lets it finish while the client reconnects with its cursor.
#[tokio::test]
async fn a_cut_connection_resumes_with_no_text_lost_or_repeated() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let proxy = Proxy::start(server.addr).await;
        let file = format!("cut-{t}.txt");
        let prompt = format!("before\n/write {file} x\nafter");
        let mut running = Running::spawn(term_at(&proxy.url, t, &["--approve", "ask", "-p", &prompt]));
        running.stderr_line("[y]es / [n]o / [a]lways").await;
        let accepted = proxy.accepted();
        assert!(proxy.cut() >= 1, "{t}: the stream's connection was live");
        running.write_stdin("y\n").await;
        let out = running.finish().await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        assert_eq!(
            out.stdout, "echo: before\necho: after\n",
            "{t}: the whole text, once"
        );
        assert!(out.stderr.contains("reconnecting"), "{t}: {}", out.stderr);
        assert!(proxy.accepted() > accepted, "{t}: it connected again");
        assert_eq!(
            std::fs::read_to_string(server.workspace.join(&file)).unwrap(),
            "x",
            "{t}"
        );
    }
}

/// Disconnected while more frames than the ring holds go by, the client gets a
/// resync: it rebuilds the answer from the transcript, still printing each piece once.
#[tokio::test]
async fn a_cut_longer_than_the_ring_resumes_from_the_ledger_without_a_resync() {
    let server = TestServer::start_with(|cfg| cfg.core.bus.ring = 4).await;
    for t in TRANSPORTS {
        let proxy = HoldProxy::start(server.addr).await;
        let sid = server.create_session().await;
        let mut events = server.events(&sid, None).await;
        let file = format!("resync-{t}.txt");
        let prompt = format!("before\n/write {file} x\n/burst 20\nafter");
        let mut running = Running::spawn(term_at(
            &proxy.url,
            t,
            &["--session", &sid, "--approve", "ask", "-p", &prompt],
        ));
        running.stderr_line("[y]es / [n]o / [a]lways").await;
        proxy.hold();
        assert!(proxy.cut() >= 1, "{t}");
        // Answered by another client while this one is away; the run then ends.
        let asked = events.until("approval_requested").await;
        let rid = asked.last().unwrap().body()["request_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, _) = server
            .post(
                &format!("/sessions/{sid}/approvals/{rid}"),
                serde_json::json!({"approve": true}),
            )
            .await;
        assert_eq!(code, 200);
        events.until("run_finished").await;
        proxy.release();
        let out = running.finish().await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        let burst: String = (0..20).map(|i| format!("t{i} ")).collect();
        assert_eq!(out.stdout, format!("echo: before\n{burst}\necho: after\n"), "{t}");
        assert!(out.stderr.contains("reconnecting"), "{t}: {}", out.stderr);
        // The ring holds 4 frames; the server replays the rest from disk.
        assert!(!out.stderr.contains("resynced"), "{t}: {}", out.stderr);
    }
}

// ---- interactive -----------------------------------------------------------------

/// Waits until vak term is idle: the run over (no busy indicator) and the plain prompt drawn.
async fn wait_idle(pty: &Pty) -> String {
    pty.wait_until("an idle prompt", |s| {
        !s.contains("running…") && s.lines().any(|l| l.trim_end() == ">")
    })
    .await
}

fn term_in_pty(url: &str, transport: &str, cwd: &Path) -> portable_pty::CommandBuilder {
    let mut cmd = portable_pty::CommandBuilder::new(env!("CARGO_BIN_EXE_vak"));
    cmd.args(["term", "--url", url, "--token", TOKEN, "--transport", transport]);
    for v in ["VAK_URL", "VAK_TOKEN", "VAK_HOME", "RUST_LOG"] {
        cmd.env_remove(v);
    }
    cmd.env("TERM", "xterm-256color");
    cmd.cwd(cwd);
    cmd
}

#[tokio::test]
async fn interactive_prompt_approval_and_exit_in_a_real_terminal() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 100);
        pty.wait_for("vak term · new session").await;
        let file = format!("typed-{t}.txt");
        pty.send(&format!("/write {file} hello\r"));
        let screen = pty.wait_for("[y]es / [n]o / [a]lways").await;
        assert!(
            screen.contains(&format!("write 5 bytes to {file}")),
            "{t}:\n{screen}"
        );
        pty.send("y");
        let screen = pty.wait_for(&format!("wrote 5 bytes to {file}")).await;
        assert!(
            screen.contains(&format!("› /write {file} hello")),
            "{t}: the prompt is shown:\n{screen}"
        );
        assert!(screen.contains("✓ write_file approved"), "{t}:\n{screen}");
        assert_eq!(
            std::fs::read_to_string(server.workspace.join(&file)).unwrap(),
            "hello",
            "{t}"
        );
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}: Ctrl-D at an empty prompt exits 0");
        assert!(pty.is_cooked(), "{t}: the terminal is restored");
    }
}

#[tokio::test]
async fn a_running_command_s_output_shows_live_dimmed_under_its_call() {
    let server = TestServer::start_with(|c| c.core.permission = vak::core::PermissionMode::Allow).await;
    for t in TRANSPORTS {
        let go = server.workspace.join(format!("go-{t}"));
        mkfifo(&go);
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 100);
        pty.wait_for("vak term · new session").await;
        // It prints, then waits until the test saw the print on the screen.
        pty.send(&format!(
            "/bash echo started; echo warned >&2; read x < go-{t}; echo \"got $x\"\r"
        ));
        let screen = pty.wait_for("│ started").await;
        pty.wait_for("! warned").await;
        assert!(
            !screen.contains("✓ bash"),
            "{t}: the command still runs:\n{screen}"
        );
        assert_eq!(pty.is_dim("│ started"), Some(true), "{t}: live output is dimmed");
        let go2 = go.clone();
        tokio::task::spawn_blocking(move || std::fs::write(go2, "it\n").unwrap())
            .await
            .unwrap();
        pty.wait_for("│ got it").await;
        pty.wait_for("✓ bash: ").await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn interactive_steering_is_queued_and_ctrl_c_cancels_then_exits() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 100);
        pty.wait_for("vak term · new session").await;
        pty.send("/think pondering\r");
        pty.wait_for_line("pondering").await;
        wait_idle(&pty).await;
        assert_eq!(pty.is_dim("pondering"), Some(true), "{t}: thinking is dimmed");
        assert_eq!(
            pty.is_dim("› /think pondering"),
            Some(false),
            "{t}: the prompt is not"
        );
        pty.send("/sleep 60000\r");
        pty.wait_for("steer> ").await;
        pty.send("also this\r");
        pty.wait_for("⋯ queued: also this").await;
        pty.send("\x03");
        let screen = pty.wait_for("cancelled by a client").await;
        assert!(screen.contains("Ctrl-C again to exit"), "{t}:\n{screen}");
        pty.send("\x03");
        assert_eq!(pty.wait_exit().await, 0, "{t}: the second Ctrl-C exits");
        assert!(pty.is_cooked(), "{t}: the terminal is restored");
    }
}

#[tokio::test]
async fn a_panic_still_restores_the_terminal() {
    let server = TestServer::start().await;
    let mut cmd = term_in_pty(&server.url, "sse", &server.workspace);
    cmd.env("VAK_TERM_TEST_PANIC", "1");
    let mut pty = Pty::spawn(cmd, 30, 100);
    pty.wait_for("VAK_TERM_TEST_PANIC is set").await;
    assert_eq!(pty.wait_exit().await, 101, "a panic's exit code");
    assert!(pty.is_cooked(), "the panic hook restored the terminal");
}

/// An interactive session loses its connection while a run waits on an
/// approval that another client then answers; `burst` frames make the gap
/// longer than a small ring (replayed from the ledger) or not (from the ring).
async fn interactive_resumes(ring: Option<usize>) {
    let server = TestServer::start_with(|cfg| {
        if let Some(r) = ring {
            cfg.core.bus.ring = r;
        }
    })
    .await;
    for t in TRANSPORTS {
        let proxy = HoldProxy::start(server.addr).await;
        let sid = server.create_session().await;
        let mut events = server.events(&sid, None).await;
        let mut cmd = term_in_pty(&proxy.url, t, &server.workspace);
        cmd.args(["--session", &sid]);
        let mut pty = Pty::spawn(cmd, 30, 120);
        pty.wait_for("vak term · session").await;
        let file = format!("resume-{t}.txt");
        // A bracketed paste: one prompt of several lines.
        pty.send(&format!(
            "\x1b[200~before\n/write {file} x\n/burst 20\nafter\x1b[201~\r"
        ));
        pty.wait_for("[y]es / [n]o / [a]lways").await;
        proxy.hold();
        assert!(proxy.cut() >= 1, "{t}");
        pty.wait_for("reconnecting").await;
        let asked = events.until("approval_requested").await;
        let rid = asked.last().unwrap().body()["request_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, _) = server
            .post(
                &format!("/sessions/{sid}/approvals/{rid}"),
                serde_json::json!({"approve": true}),
            )
            .await;
        assert_eq!(code, 200);
        events.until("run_finished").await;
        proxy.release();
        let screen = pty.wait_for("echo: after").await;
        assert!(
            !screen.contains("resynced"),
            "{t}: a gap longer than the ring is replayed from disk, not resynced:\n{screen}"
        );
        for once in [
            "echo: before",
            "t0 t1 ",
            "t19",
            "echo: after",
            &format!("wrote 1 byte to {file}"),
        ] {
            assert_eq!(
                screen.matches(once).count(),
                1,
                "{t}: {once:?} is shown once:\n{screen}"
            );
        }
        assert!(
            !screen.contains("[y]es"),
            "{t}: the question answered elsewhere is gone:\n{screen}"
        );
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
        assert!(pty.is_cooked(), "{t}");
    }
}

#[tokio::test]
async fn interactive_reconnects_with_its_cursor() {
    interactive_resumes(None).await;
}

#[tokio::test]
async fn interactive_reconnects_past_the_ring_from_the_ledger() {
    interactive_resumes(Some(4)).await;
}

// ---- interactive: local commands, indicators, layout -------------------------------

/// The rows of `screen` from the first that starts with `first` up to (not
/// including) the next that starts with `stop`, trailing blanks trimmed.
fn rows_from(screen: &str, first: &str, stop: &str) -> Vec<String> {
    let rows: Vec<&str> = screen.lines().map(str::trim_end).collect();
    let start = rows
        .iter()
        .position(|r| r.starts_with(first))
        .unwrap_or_else(|| panic!("a row starts with {first:?}:\n{screen}"));
    rows[start..]
        .iter()
        .enumerate()
        .take_while(|(i, r)| *i == 0 || !r.starts_with(stop))
        .map(|(_, r)| r.to_string())
        .collect()
}

async fn session_count(server: &TestServer) -> usize {
    let (code, body) = server.get("/sessions").await;
    assert_eq!(code, 200, "{body}");
    body["sessions"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn help_exit_and_quit_are_handled_by_vak_term_and_double_slash_reaches_the_model() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let sessions = session_count(&server).await;
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 40, 110);
        let screen = pty.wait_for("Ctrl-D exits · /help").await;
        assert!(screen.contains("vak term · new session"), "{t}:\n{screen}");
        pty.send("/help\r");
        let screen = pty
            .wait_for("e approves it and lets edits run, n keeps plan mode")
            .await;
        for shown in [
            "/show [N]",
            "Ctrl-C",
            "cancel the running run",
            "Ctrl-D",
            "//text",
        ] {
            assert!(screen.contains(shown), "{t}: /help lists {shown:?}:\n{screen}");
        }
        assert!(
            !screen.contains("echo: /help"),
            "{t}: /help is not a prompt:\n{screen}"
        );
        pty.send("/exit\r");
        assert_eq!(pty.wait_exit().await, 0, "{t}: /exit exits 0");
        assert!(pty.is_cooked(), "{t}");
        assert_eq!(
            session_count(&server).await,
            sessions,
            "{t}: nothing was sent to a model (no session was even made)"
        );

        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 40, 110);
        pty.wait_for("vak term · new session").await;
        pty.send("//help\r");
        pty.wait_for_line("echo: /help").await;
        // Other slash lines are the model's, as before.
        pty.send("/think deep\r");
        pty.wait_for_line("deep").await;
        pty.send("/quit\r");
        assert_eq!(pty.wait_exit().await, 0, "{t}: /quit exits 0");
        assert!(pty.is_cooked(), "{t}");
    }
}

#[tokio::test]
async fn a_busy_indicator_shows_while_a_run_is_live_and_goes_when_it_ends() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 100);
        pty.wait_for("vak term · new session").await;
        assert!(!pty.screen().contains("running"), "{t}: idle at the start");
        pty.send("/sleep 60000\r");
        let screen = pty.wait_for("running…").await;
        let rows = rows_from(&screen, "› /sleep 60000", "steer> ");
        assert!(
            rows.iter().any(|r| r.contains("running… · Ctrl-C cancels")),
            "{t}: the indicator is in the live region above the prompt:\n{screen}"
        );
        pty.send("\x03");
        pty.wait_for("cancelled by a client").await;
        pty.wait_until("no indicator after the cancel", |s| {
            !s.contains("running…") && !s.contains("cancelling…")
        })
        .await;
        pty.send("quick\r");
        pty.wait_for_line("echo: quick").await;
        // No indicator once the run completed.
        wait_idle(&pty).await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn streamed_text_wraps_between_words_and_only_long_words_break() {
    let server = TestServer::start().await;
    let words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec";
    let long = "x".repeat(70);
    for t in TRANSPORTS {
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 40);
        pty.wait_for("vak term · new session").await;
        pty.send(&format!("{words}\r"));
        pty.wait_until("the whole answer", |s| s.matches("quebec").count() == 2)
            .await;
        let screen = wait_idle(&pty).await;
        // Rows broken at spaces join back, with one space each, into the text.
        let answer = rows_from(&screen, "echo: alpha", ">");
        assert!(answer.len() > 1, "{t}: the answer needs several rows:\n{screen}");
        assert_eq!(
            answer.join(" "),
            format!("echo: {words}"),
            "{t}: no word cut:\n{screen}"
        );
        let prompt = rows_from(&screen, "› alpha", "echo: alpha");
        assert_eq!(
            prompt.join(" "),
            format!("› {words}"),
            "{t}: the prompt's entry too:\n{screen}"
        );

        pty.send(&format!("{long}\r"));
        // The word moves to a row of its own, and breaks at the terminal's edge.
        let rows = [
            "echo:".to_string(),
            "x".repeat(40),
            "x".repeat(30),
            ">".to_string(),
        ];
        pty.wait_until("the long word in rows of 40 and 30", |s| {
            let all: Vec<&str> = s.lines().map(str::trim_end).collect();
            all.windows(4).any(|w| w == rows)
        })
        .await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn the_reconnect_notice_is_drawn_below_the_last_output_line() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let proxy = HoldProxy::start(server.addr).await;
        let mut pty = Pty::spawn(term_in_pty(&proxy.url, t, &server.workspace), 20, 80);
        pty.wait_for("vak term · new session").await;
        pty.send("hello there\r");
        pty.wait_for_line("echo: hello there").await;
        // The answer's line is still the unfinished one at the bottom when the connection drops.
        proxy.hold();
        assert!(proxy.cut() >= 1, "{t}");
        let screen = pty.wait_for("reconnecting…").await;
        let rows = rows_from(&screen, "› hello there", ">");
        assert_eq!(
            rows[1], "echo: hello there",
            "{t}: the answer is intact:\n{screen}"
        );
        assert!(
            rows[2].starts_with("reconnecting…"),
            "{t}: the notice comes right below it:\n{screen}"
        );
        proxy.release();
        let screen = pty
            .wait_until("the notice gone", |s| !s.contains("reconnecting…"))
            .await;
        assert_eq!(screen.matches("echo: hello there").count(), 1, "{t}:\n{screen}");
        pty.send("again\r");
        let screen = pty.wait_for_line("echo: again").await;
        assert_eq!(
            rows_from(&screen, "› hello there", "echo: again"),
            ["› hello there", "echo: hello there", "› again"],
            "{t}: nothing of the notice is left in the output:\n{screen}"
        );
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn one_byte_is_singular_in_what_vak_term_shows() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        let file = format!("one-{t}.txt");
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 120);
        pty.wait_for("vak term · new session").await;
        pty.send(&format!("/write {file} x\r"));
        let screen = pty.wait_for("[y]es / [n]o").await;
        assert!(
            screen.contains(&format!("⚙ write_file {file} (1 byte)")),
            "{t}:\n{screen}"
        );
        assert!(
            screen.contains(&format!("write 1 byte to {file}")),
            "{t}:\n{screen}"
        );
        pty.send("y");
        let screen = pty
            .wait_for(&format!("✓ write_file: wrote 1 byte to {file}"))
            .await;
        assert!(!screen.contains("1 bytes"), "{t}:\n{screen}");
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");

        // The one-shot run's entries on stderr too; more than one stays plural.
        let prompt = format!("/write one-shot-{t}.txt y\n/write two-{t}.txt yz");
        let out = output(term_at(&server.url, t, &["--approve", "allow", "-p", &prompt])).await;
        assert_eq!(out.code, 0, "{t}: {}", out.stderr);
        for shown in [
            format!("write_file one-shot-{t}.txt (1 byte)"),
            format!("wrote 1 byte to one-shot-{t}.txt"),
            format!("write_file two-{t}.txt (2 bytes)"),
            format!("wrote 2 bytes to two-{t}.txt"),
        ] {
            assert!(out.stderr.contains(&shown), "{t}: {shown:?} in {}", out.stderr);
        }
        assert!(!out.stderr.contains("1 bytes"), "{t}: {}", out.stderr);
    }
}

#[tokio::test]
async fn always_keeps_a_rule_on_the_server_says_what_it_covers_and_applies_when_attached_again() {
    let server = TestServer::start().await;
    std::fs::write(server.workspace.join("seen.txt"), "").unwrap();
    std::fs::write(server.workspace.join("again.txt"), "").unwrap();
    for t in TRANSPORTS {
        let (x, y) = (format!("x-{t}.txt"), format!("y-{t}.txt"));
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 140);
        pty.wait_for("vak term · new session").await;
        pty.send(&format!(
            "\x1b[200~/bash ls\n/bash ls seen.txt\n/write {x} 1\x1b[201~\r"
        ));
        let screen = pty.wait_for("[y]es / [n]o").await;
        assert!(
            screen.contains(
                "? bash run `ls` in the workspace  [y]es / [n]o / [a]lways allow in this workspace"
            ),
            "{t}:\n{screen}"
        );
        pty.send("a");
        pty.wait_for("· always allowing bash `ls` in this workspace")
            .await;
        // The second ls is covered by the rule and not asked; the write, another tool, is.
        let screen = pty.wait_for(&format!("? write_file write 1 byte to {x}")).await;
        assert!(screen.contains("⚙ bash $ ls seen.txt"), "{t}:\n{screen}");
        assert_eq!(screen.matches("✓ bash approved").count(), 1, "{t}:\n{screen}");
        assert_eq!(screen.matches("✓ bash: ").count(), 2, "{t}:\n{screen}");
        pty.send("n");
        pty.wait_for("✗ write_file denied").await;
        let screen = wait_idle(&pty).await;
        assert_eq!(screen.matches("denied").count(), 1, "{t}: said once:\n{screen}");
        let sid = screen
            .lines()
            .find_map(|l| l.trim_end().strip_prefix("· session "))
            .unwrap_or_else(|| panic!("{t}: the new session is named:\n{screen}"))
            .to_string();
        pty.send("/exit\r");
        assert_eq!(pty.wait_exit().await, 0, "{t}");

        // The rule is the server's: attached again, a command it covers runs unasked.
        let mut cmd = term_in_pty(&server.url, t, &server.workspace);
        cmd.args(["--session", &sid]);
        let mut pty = Pty::spawn(cmd, 30, 140);
        pty.wait_for(&format!("vak term · session {sid}")).await;
        wait_idle(&pty).await;
        pty.send(&format!("\x1b[200~/bash ls again.txt\n/write {y} 2\x1b[201~\r"));
        let screen = pty.wait_for("[y]es / [n]o").await;
        assert!(screen.contains("⚙ bash $ ls again.txt"), "{t}:\n{screen}");
        assert!(
            screen.contains(&format!("? write_file write 1 byte to {y}")),
            "{t}: only the write asks:\n{screen}"
        );
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");

        // The next transport starts without rules.
        let (_, v) = server.get("/permissions/rules").await;
        let rules = v["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{t}: {v}");
        let id = rules[0]["id"].as_str().unwrap();
        assert_eq!(server.delete(&format!("/permissions/rules/{id}")).await.0, 200);
    }
}

#[tokio::test]
async fn a_plan_is_shown_whole_and_approving_it_chooses_the_mode() {
    let server = TestServer::start_with(|c| c.core.permission = vak::core::PermissionMode::Plan).await;
    for (t, key, mode) in [("sse", "e", "accept-edits"), ("grpc", "y", "default")] {
        set_mode(&server, "plan").await;
        let file = format!("plan-{t}.txt");
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 140);
        pty.wait_for("vak term · new session").await;
        pty.send(&format!(
            "\x1b[200~/plan Step one: write {file}, then stop.\n/write {file} P\x1b[201~\r"
        ));
        let screen = pty
            .wait_for("[y]es, then ask before edits / [e] yes, accept edits / [n]o, keep planning")
            .await;
        assert_eq!(
            rows_from(&screen, "── the plan to approve ──", "?")[..2],
            [
                "── the plan to approve ──".to_string(),
                format!("Step one: write {file}, then stop.")
            ],
            "{t}:\n{screen}"
        );
        assert!(
            !screen.contains("[a]lways"),
            "{t}: a plan is approved once:\n{screen}"
        );
        pty.send("a"); // not a choice here: still asked
        pty.send(key);
        pty.wait_for("✓ exit_plan_mode approved").await;
        let (_, config) = server.get("/config").await;
        assert_eq!(config["permission_mode"], mode, "{t}");
        if mode == "default" {
            // Edits ask again in the default mode.
            pty.wait_for(&format!("? write_file write 1 byte to {file}"))
                .await;
            pty.send("y");
        }
        pty.wait_for(&format!("✓ write_file: wrote 1 byte to {file}"))
            .await;
        wait_idle(&pty).await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn show_prints_a_collapsed_tool_output_in_full() {
    let server = TestServer::start().await;
    std::fs::write(server.workspace.join("lines.txt"), "first\nsecond\nthird\n").unwrap();
    for t in TRANSPORTS {
        let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 100);
        pty.wait_for("vak term · new session").await;
        pty.send("/show\r");
        pty.wait_for("no tool output to show yet").await;
        pty.send("/read lines.txt\r");
        pty.wait_for("✓ read_file: first (+2 more lines: /show 1)").await;
        // The run goes on after the tool result (the model answers it); /show
        // while it runs is printed above the spinner and the steer prompt.
        wait_idle(&pty).await;
        assert!(!pty.screen().contains("second"), "{t}: collapsed");
        pty.send("/show\r");
        let screen = pty.wait_for_line("third").await;
        assert_eq!(
            rows_from(&screen, "── /show 1", ">"),
            ["── /show 1: ✓ read_file output ──", "first", "second", "third"],
            "{t}:\n{screen}"
        );
        pty.send("/read missing.txt\r");
        pty.wait_for("✗ read_file: cannot read missing.txt").await;
        pty.send("/show 1\r");
        pty.wait_until("the first output again, whole", |s| {
            s.matches("── /show 1").count() == 2 && s.matches("third").count() == 2
        })
        .await;
        pty.send("/show 3\r");
        pty.wait_for("no tool output 3: 2 outputs so far").await;
        pty.send("/show x\r");
        pty.wait_for("usage: /show [N]").await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn quitting_before_the_first_prompt_leaves_no_session_behind() {
    let server = TestServer::start().await;
    for t in TRANSPORTS {
        for keys in ["\x04", "\x03\x03", "/help\r/quit\r"] {
            let mut pty = Pty::spawn(term_in_pty(&server.url, t, &server.workspace), 30, 100);
            pty.wait_for("vak term · new session").await;
            pty.send(keys);
            assert_eq!(pty.wait_exit().await, 0, "{t} {keys:?}");
        }
        let out = output(term_at(&server.url, t, &["--list"])).await;
        assert_eq!((out.code, out.stdout.as_str()), (0, ""), "{t}: {}", out.stderr);
    }
    // The first prompt makes the session, which then stays.
    let mut pty = Pty::spawn(term_in_pty(&server.url, "sse", &server.workspace), 30, 100);
    pty.wait_for("vak term · new session").await;
    pty.send("keep me\r");
    let screen = pty.wait_for_line("echo: keep me").await;
    let sid = screen
        .lines()
        .find_map(|l| l.trim_end().strip_prefix("· session "))
        .unwrap_or_else(|| panic!("the new session is named:\n{screen}"))
        .to_string();
    pty.send("\x04");
    assert_eq!(pty.wait_exit().await, 0);
    let out = output(term_at(&server.url, "grpc", &["--list"])).await;
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.stdout);
    assert!(out.stdout.starts_with(&sid), "{}", out.stdout);
}

// ---- a restarted server with a new token ----------------------------------------------

/// A `vak serve` process on `port` with `home` and `token`; killed when dropped.
async fn serve_at(home: &Path, workspace: &Path, port: u16, token: &str) -> Served {
    Serve::new()
        .listen(&format!("127.0.0.1:{port}"))
        .token(token)
        .home(home)
        .workspace(workspace)
        .start()
        .await
}

#[tokio::test]
async fn a_server_restarted_with_a_new_token_is_followed_through_server_json() {
    for t in TRANSPORTS {
        let (home, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let first = serve_at(home.path(), workspace.path(), port, "token-a").await;

        // No --url or --token: both come from the home's server.json.
        let mut cmd = portable_pty::CommandBuilder::new(env!("CARGO_BIN_EXE_vak"));
        cmd.args(["term", "--transport", t, "--home"]);
        cmd.arg(home.path());
        for v in ["VAK_URL", "VAK_TOKEN", "VAK_HOME", "RUST_LOG"] {
            cmd.env_remove(v);
        }
        cmd.env("TERM", "xterm-256color");
        cmd.cwd(workspace.path());
        let mut pty = Pty::spawn(cmd, 30, 100);
        pty.wait_for("vak term · new session").await;
        pty.send("before the restart\r");
        pty.wait_for_line("echo: before the restart").await;

        // kill() waits for the exit, so the home's lock and the port are free again.
        first.vak.kill().await;
        pty.wait_for("reconnecting…").await;
        let second = serve_at(home.path(), workspace.path(), port, "token-b").await;
        assert_eq!(second.url, first.url, "{t}: the same address");
        let old = reqwest::Client::new()
            .get(format!("{}/sessions", second.url))
            .bearer_auth("token-a")
            .send()
            .await
            .unwrap();
        assert_eq!(old.status(), 401, "{t}: the old token is refused now");

        pty.wait_until("reconnected", |s| !s.contains("reconnecting…"))
            .await;
        pty.send("after the restart\r");
        let screen = pty.wait_for_line("echo: after the restart").await;
        assert!(!screen.contains("credentials"), "{t}:\n{screen}");
        assert_eq!(
            screen.matches("echo: before the restart").count(),
            1,
            "{t}:\n{screen}"
        );

        // Restarted elsewhere (another port, another token): server.json still leads to it.
        second.vak.kill().await;
        pty.wait_for("reconnecting…").await;
        let third = serve_at(home.path(), workspace.path(), 0, "token-c").await;
        assert_ne!(third.url, first.url, "{t}");
        pty.wait_until("reconnected", |s| !s.contains("reconnecting…"))
            .await;
        pty.send("on another port\r");
        pty.wait_for_line("echo: on another port").await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}
