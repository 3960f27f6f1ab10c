//! The documentation is tested: every fenced shell block in README.md, docs/ and
//! clients/*/README.md either runs here against a live `vak serve` or names the test that
//! runs it, so a broken README line fails `make test`. Also `make serve` and `make install`,
//! the README's first commands, run as a newcomer runs them.
//!
//! The markers, an HTML comment on the line just before a fence:
//!
//! - `<!-- doc-test: run -->` runs the block in the document's one bash session (`set -eu`,
//!   so any failing command fails the test), in order, in a scratch directory, with `HOME`
//!   a fresh directory whose `~/.local/share/vak` is the home of a running `vak serve`, and
//!   `vak`, grpcurl and buf on PATH. `run expect=TEXT` also requires TEXT in its output.
//!   A `console` block is a transcript: its `$ ` lines (with `\` continuations) are the
//!   commands, the other lines the output they printed when the document was written.
//! - `<!-- doc-test: background expect=TEXT -->` starts the block in the background (a stream
//!   a reader would watch in a second terminal); when the document's blocks are done it must
//!   have printed TEXT, and it is then stopped.
//! - `<!-- PATH[::NAME] ... -->` names the test that runs the block: PATH (from the
//!   repository root) must exist and contain fn NAME when given, and it must contain the
//!   block's first command or read the document itself.
//!
//! Every fence in these documents must say its language, so no command hides in an
//! unlabelled block.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const SHELL: &[&str] = &["sh", "bash", "shell", "console"];
/// A doc's whole run, or a `make serve` that may have to build first.
const LONG: Duration = Duration::from_secs(1800);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, docs/*.md and clients/*/README.md.
fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut docs = vec![root.join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    for client in std::fs::read_dir(root.join("clients")).unwrap() {
        let readme = client.unwrap().path().join("README.md");
        if readme.exists() {
            more.push(readme);
        }
    }
    more.sort();
    docs.extend(more);
    docs
}

#[derive(Debug)]
struct Fence {
    /// 1-based line of the opening fence.
    line: usize,
    info: String,
    /// The HTML comment on the line before, without `<!--` and `-->`.
    marker: Option<String>,
    body: String,
}

impl Fence {
    fn is_shell(&self) -> bool {
        SHELL.contains(&self.info.split_whitespace().next().unwrap_or(""))
    }

    /// The `expect=` text of a doc-test marker.
    fn expect(&self) -> Option<&str> {
        let m = self.marker.as_deref()?;
        m.split_once("expect=").map(|(_, t)| t.trim())
    }

    /// `run` or `background` for doc-test markers.
    fn doc_test(&self) -> Option<&str> {
        let rest = self.marker.as_deref()?.strip_prefix("doc-test:")?;
        rest.split_whitespace().next()
    }

    /// The commands: a `console` transcript's `$ ` lines with their continuations, or
    /// the whole body of any other shell block.
    fn script(&self) -> String {
        if !self.info.starts_with("console") {
            return self.body.clone();
        }
        let mut out = String::new();
        let mut continued = false;
        for line in self.body.lines() {
            let command = if continued {
                Some(line)
            } else {
                line.strip_prefix("$ ")
            };
            if let Some(c) = command {
                out.push_str(c);
                out.push('\n');
                continued = c.trim_end().ends_with('\\');
            }
        }
        out
    }

    /// The first command line: not blank, not a comment, without a trailing `# comment`.
    fn first_command(&self) -> Option<String> {
        self.script()
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.split(" # ").next().unwrap_or(l).trim().to_string())
    }
}

fn fences(doc: &Path) -> Vec<Fence> {
    let text = std::fs::read_to_string(doc).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        // Fences inside list items are indented; their body is, by as much.
        let indent = lines[i].len() - lines[i].trim_start().len();
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{}:{}: a fence that is never closed", doc.display(), i + 1));
        let marker = start
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|l| l.strip_prefix("<!--"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|l| l.trim().to_string());
        out.push(Fence {
            line: start + 1,
            info: info.trim().to_string(),
            marker,
            body: lines[start + 1..end]
                .iter()
                .map(|l| {
                    l.get(indent..)
                        .filter(|_| l.starts_with(&" ".repeat(indent)))
                        .unwrap_or(l.trim_start())
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n",
        });
        i = end + 1;
    }
    out
}

/// What is wrong with one fence's labelling, if anything.
fn check_fence(doc: &Path, f: &Fence) -> Option<String> {
    let at = format!("{}:{}", doc.strip_prefix(repo()).unwrap_or(doc).display(), f.line);
    if f.info.is_empty() {
        return Some(format!(
            "{at}: a fence without a language (use text, json, sh, …)"
        ));
    }
    if !f.is_shell() {
        return None;
    }
    let Some(marker) = f.marker.as_deref() else {
        return Some(format!(
            "{at}: a shell block without a doc-test marker (`<!-- doc-test: run -->` or the test that runs it)"
        ));
    };
    match f.doc_test() {
        Some("run") => return None,
        Some("background") if f.expect().is_some() => return None,
        Some(other) => {
            return Some(format!(
                "{at}: unknown doc-test marker {other:?} (background needs expect=)"
            ))
        }
        None => {}
    }
    let target = marker.split_whitespace().next().unwrap_or("");
    let (path, name) = match target.split_once("::") {
        Some((p, n)) => (p, Some(n)),
        None => (target, None),
    };
    let file = [repo().join(path), doc.parent().unwrap().join(path)]
        .into_iter()
        .find(|p| p.is_file());
    let Some(file) = file else {
        return Some(format!("{at}: the marker names {path:?}, which is not a file"));
    };
    let source = std::fs::read_to_string(&file).unwrap();
    if let Some(name) = name {
        let defined = [
            format!("fn {name}("),
            format!("def {name}("),
            format!("test(\"{name}\""),
        ];
        if !defined.iter().any(|d| source.contains(d.as_str())) {
            return Some(format!("{at}: {path} has no test {name}"));
        }
    }
    let doc_name = doc.file_name().unwrap().to_string_lossy().to_string();
    let command = f.first_command().unwrap_or_default();
    // The command's literal words (not variables or quoted values) all appear in the test:
    // renaming a flag or a make target in the document, or in the test, fails here.
    let words: Vec<&str> = command
        .split_whitespace()
        .filter(|w| !w.contains(['$', '"', '\'', '=', '/', ':']))
        .collect();
    let runs = !words.is_empty() && words.iter().all(|w| source.contains(w));
    if !runs && !source.contains(&doc_name) {
        return Some(format!(
            "{at}: {path} neither runs {command:?} nor reads {doc_name}"
        ));
    }
    None
}

#[test]
fn every_fence_is_labelled_and_every_shell_block_is_run_by_a_test() {
    let mut problems = Vec::new();
    let mut shell = 0;
    for doc in documents() {
        for f in fences(&doc) {
            shell += usize::from(f.is_shell());
            problems.extend(check_fence(&doc, &f));
        }
    }
    assert!(shell > 10, "the documents have shell blocks to check ({shell})");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_marker_rules_catch_what_they_promise() {
    let doc = repo().join("README.md");
    let fence = |marker: Option<&str>, info: &str, body: &str| Fence {
        line: 1,
        info: info.into(),
        marker: marker.map(str::to_string),
        body: body.into(),
    };
    assert!(check_fence(&doc, &fence(None, "", "x\n")).is_some(), "unlabelled");
    assert!(check_fence(&doc, &fence(None, "text", "x\n")).is_none());
    assert!(
        check_fence(&doc, &fence(None, "sh", "ls\n")).is_some(),
        "no marker"
    );
    assert!(check_fence(&doc, &fence(Some("doc-test: run"), "sh", "ls\n")).is_none());
    let dir = tempfile::tempdir().unwrap();
    let listed = dir.path().join("list.md");
    std::fs::write(
        &listed,
        "1. Step:\n\n   <!-- doc-test: run -->\n   ```sh\n   echo a\n     echo b\n   ```\n",
    )
    .unwrap();
    let found = fences(&listed);
    assert_eq!(found.len(), 1, "a fence in a list item is seen");
    assert_eq!(found[0].body, "echo a\n  echo b\n", "and its body dedented");
    assert_eq!(found[0].doc_test(), Some("run"));
    let transcript = fence(
        None,
        "console",
        "$ curl -s a \\\n  -d b\n{\"out\":1}\n$ ls\nfile\n",
    );
    assert_eq!(transcript.script(), "curl -s a \\\n  -d b\nls\n");
    assert_eq!(transcript.first_command().as_deref(), Some("curl -s a \\"));
    assert!(check_fence(&doc, &fence(Some("doc-test: background"), "sh", "ls\n")).is_some());
    assert!(check_fence(&doc, &fence(Some("doc-test: rnu"), "sh", "ls\n")).is_some());
    let covered = |m: &str, body: &str| check_fence(&doc, &fence(Some(m), "sh", body));
    assert!(covered(
        "tests/it/docs.rs::make_serve_starts_the_offline_server_and_a_second_one_exits_2",
        "make serve\n"
    )
    .is_none());
    assert!(covered("tests/it/docs.rs::no_such_test", "make serve\n").is_some());
    assert!(covered("tests/nope.rs", "make serve\n").is_some());
    assert!(
        covered("tests/it/process.rs", "a command no test runs --at-all\n").is_some(),
        "the covering test must run the command (or read the document)"
    );
}

/// A child in its own process group, killed with the group when dropped.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        // SAFETY: kill(2) on our own child's process group; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

fn spawn_group(cmd: &mut Command) -> Group {
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Group(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}")),
    )
}

/// Reads a child's stdout and stderr lines on threads, into one channel.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(l);
        }
    });
    rx
}

/// Waits (up to `within`) for a line containing `needle`; panics with what was seen.
fn wait_for(rx: &mpsc::Receiver<String>, needle: &str, within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(e) => panic!("no {needle:?} ({e:?}); output:\n{}", seen.join("\n")),
        }
    }
}

/// Everything left in the channel once its writers are done (or `within` passes).
fn drain(rx: &mpsc::Receiver<String>, within: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + within;
    let mut out = Vec::new();
    while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
        out.push(l);
    }
    out
}

fn make(args: &[&str]) -> Command {
    let mut cmd = Command::new("make");
    cmd.args(args)
        .current_dir(repo())
        .env_remove("VAK_TOKEN")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS");
    cmd
}

#[test]
fn make_serve_starts_the_offline_server_and_a_second_one_exits_2() {
    // `make serve` builds first when the binary is stale: not beside another heavy test.
    let _heavy = crate::support::heavy_blocking();
    let home = tempfile::tempdir().unwrap();
    let serve = || {
        let mut cmd = make(&["serve"]);
        cmd.env("VAK_HOME", home.path()).env("VAK_LISTEN", "127.0.0.1:0");
        cmd
    };
    let mut first = spawn_group(&mut serve());
    let out = lines_of(&mut first.0);
    let line = wait_for(&out, "listening on http://", LONG);
    let url = line.split("listening on ").nth(1).unwrap().trim().to_string();
    let health = Command::new("curl")
        .args(["-s", &format!("{url}/health")])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&health.stdout), r#"{"status":"ok"}"#);
    // It works in a folder of the home, never in the checkout, and says where, with
    // the app's URL and how to log in.
    let workspace = home.path().join("workspace");
    let said = wait_for(&out, "vak: workspace ", Duration::from_secs(10));
    assert_eq!(said, format!("vak: workspace {}", workspace.display()));
    let app = wait_for(&out, "vak: app ", Duration::from_secs(10));
    assert_eq!(
        app,
        format!("vak: app {url}/app/ (log in with the token `vak token` prints, or run `vak open`)")
    );
    // The README's `/write notes.md …` lands there and leaves the checkout as it was.
    let status = || {
        let out = Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=all"])
            .current_dir(repo())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = status();
    let token = std::fs::read_to_string(home.path().join("token")).unwrap();
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-s", "-H", &format!("Authorization: Bearer {}", token.trim())])
            .args(args)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    curl(&[
        "-X",
        "POST",
        &format!("{url}/config/mode"),
        "-d",
        r#"{"mode":"accept-edits"}"#,
    ]);
    let sid = curl(&["-X", "POST", &format!("{url}/sessions")])["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let ran = curl(&[
        "-X",
        "POST",
        &format!("{url}/sessions/{sid}/run"),
        "-d",
        r#"{"prompt": "/write notes.md hello there", "wait": true}"#,
    ]);
    assert_eq!(ran["result"]["outcome"], "completed", "{ran}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes.md")).unwrap(),
        "hello there"
    );
    assert_eq!(status(), before, "the checkout's git status is unchanged");

    let second = serve().stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(
        second.status.code(),
        Some(2),
        "make passes on the exit 2: {stderr}"
    );
    let pid = std::fs::read_to_string(home.path().join("server.lock")).unwrap();
    assert!(
        stderr.contains(&format!(
            "vak: error: another vak server (pid {pid}, {url}) owns the home"
        )),
        "{stderr}"
    );
    // The first server is unharmed.
    let health = Command::new("curl")
        .args(["-s", &format!("{url}/health")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout), r#"{"status":"ok"}"#);
}

#[test]
fn make_install_puts_a_working_vak_in_prefix_bin() {
    // `make install` builds a release binary when it is stale: not beside another heavy test.
    let _heavy = crate::support::heavy_blocking();
    let prefix = tempfile::tempdir().unwrap();
    let mut cmd = make(&["install", &format!("PREFIX={}", prefix.path().display())]);
    let mut install = spawn_group(&mut cmd);
    let out = lines_of(&mut install.0);
    let status = install.0.wait().unwrap();
    let log = drain(&out, Duration::from_secs(5));
    assert!(status.success(), "make install failed:\n{}", log.join("\n"));
    let vak = prefix.path().join("bin/vak");
    let version = Command::new(&vak).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("vak "));
}

/// The tools the documents use, besides bash and curl: where `make test` installs them.
/// `bin` gets a `vak` link to the binary under test, first on the PATH.
fn tool_path(bin: &Path) -> String {
    let root = repo();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vak"), bin.join("vak")).unwrap();
    let dirs = [
        bin.to_path_buf(),
        root.join("target/tools/venv/bin"),
        root.join("clients/web/node_modules/.bin"),
    ];
    let mut path: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    path.push(std::env::var("PATH").unwrap_or_default());
    path.join(":")
}

fn require_tools(path: &str) {
    for tool in ["bash", "curl", "jq", "grpcurl"] {
        let found = path.split(':').any(|d| Path::new(d).join(tool).is_file());
        assert!(
            found,
            "{tool} is not installed: `make tools` puts grpcurl in target/tools; jq and curl are Debian packages (.ci/run installs them)"
        );
    }
    // docs/protocol.md's MCP example runs a server written with the MCP SDK.
    assert!(
        std::env::var_os("VAK_MCP_PYTHON").is_some(),
        "VAK_MCP_PYTHON is not set: `make mcp` installs the MCP SDK into target/mcp-venv; \
         then VAK_MCP_PYTHON=$PWD/target/mcp-venv/bin/python"
    );
}

/// Runs a document's `run` and `background` blocks as described at the top of this file.
fn run_document(rel: &str) {
    let doc = repo().join(rel);
    let blocks: Vec<Fence> = fences(&doc)
        .into_iter()
        .filter(|f| f.is_shell() && matches!(f.doc_test(), Some("run" | "background")))
        .collect();
    assert!(!blocks.is_empty(), "{rel} has blocks to run");
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let path = tool_path(&bin);
    require_tools(&path);
    let (home_dir, ws, out) = (
        tmp.path().join("home"),
        tmp.path().join("ws"),
        tmp.path().join("out"),
    );
    let cwd = tmp.path().join("cwd");
    for d in [&home_dir, &ws, &out, &cwd] {
        std::fs::create_dir_all(d).unwrap();
    }
    let env = |cmd: &mut Command| {
        cmd.env("HOME", &home_dir)
            .env("PATH", &path)
            .env_remove("VAK_HOME")
            .env_remove("VAK_TOKEN")
            .env_remove("VAK_URL")
            .env_remove("VAK_LISTEN")
            .env_remove("RUST_LOG")
            // The documents show a server with no model keys and the default route.
            .env_remove("VAK_PROVIDER")
            .env_remove("VAK_MODEL")
            .env_remove("VAK_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .current_dir(&cwd);
    };
    let mut serve = Command::new(env!("CARGO_BIN_EXE_vak"));
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(&ws);
    env(&mut serve);
    let mut server = spawn_group(&mut serve);
    let server_out = lines_of(&mut server.0);
    wait_for(&server_out, "listening on http://", Duration::from_secs(60));

    let mut script = String::from("set -eu\nbg_pids=''\n");
    for (i, b) in blocks.iter().enumerate() {
        let file = out.join(i.to_string());
        let body = &b.script();
        if b.doc_test() == Some("background") {
            script.push_str(&format!(
                "{{\n{body}}} > '{f}' 2>&1 &\nbg_pids=\"$bg_pids $!\"\n",
                f = file.display()
            ));
        } else {
            script.push_str(&format!(
                "echo {i} > '{cur}'\n{{\n{body}}} > '{f}' 2>&1\n",
                cur = out.join("current").display(),
                f = file.display()
            ));
        }
    }
    script.push_str("echo done > \"$0.done\"\n");
    let script_path = tmp.path().join("doc.sh");
    std::fs::write(&script_path, &script).unwrap();
    let mut bash = Command::new("bash");
    bash.args(["--noprofile", "--norc"]).arg(&script_path);
    env(&mut bash);
    let mut run = spawn_group(&mut bash);
    let run_out = lines_of(&mut run.0);
    let status = run.0.wait().unwrap();
    let stray = drain(&run_out, Duration::from_secs(1));
    let output_of = |i: usize| std::fs::read_to_string(out.join(i.to_string())).unwrap_or_default();
    let done = tmp.path().join("doc.sh.done").exists();
    if !status.success() || !done {
        let at = std::fs::read_to_string(out.join("current")).unwrap_or_default();
        let i: usize = at.trim().parse().unwrap_or(0);
        panic!(
            "{rel}:{}: the block failed ({status}):\n{}\n--- its output:\n{}\n--- stray output: {stray:?}",
            blocks[i].line,
            blocks[i].body,
            output_of(i)
        );
    }
    for (i, b) in blocks.iter().enumerate() {
        if let Some(expect) = b.expect() {
            // A background stream may still be catching up when the last block is done.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut got = output_of(i);
            while b.doc_test() == Some("background")
                && !got.contains(expect)
                && std::time::Instant::now() < deadline
            {
                crate::support::poll::pause_blocking();
                got = output_of(i);
            }
            assert!(
                got.contains(expect),
                "{rel}:{}: the block's output lacks {expect:?}:\n{got}",
                b.line
            );
        }
    }
    drop(server);
}

#[test]
fn the_readme_tour_runs_against_a_live_server() {
    run_document("README.md");
}

#[test]
fn the_protocol_examples_run_against_a_live_server() {
    run_document("docs/protocol.md");
}

/// Every source file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_invariant_in_architecture_md_names_tests_that_exist() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("## Invariants")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("ARCHITECTURE.md has an Invariants section");
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    rust_files(&repo().join("crates"), &mut files);
    rust_files(&repo().join("tests"), &mut files);
    let mut problems = Vec::new();
    let bullets: Vec<&str> = section.split("\n- ").skip(1).collect();
    assert!(bullets.len() > 5, "{section}");
    for bullet in bullets {
        if bullet.starts_with("Deliberately absent") {
            continue;
        }
        // `module::test` or `module::tests::test`: the file is tests/module.rs, src/**/module.rs or crates/*/src/**/module.rs;
        // `module::sub::test` may also be tests/module/sub.rs (a module file of tests/module.rs).
        let names: Vec<&str> = bullet
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|n| n.contains("::") && !n.contains(' '))
            .collect();
        if names.is_empty() {
            problems.push(format!("no test named for: {}", bullet.lines().next().unwrap()));
        }
        for name in names {
            let parts: Vec<&str> = name.split("::").collect();
            let (module, test) = (parts[0], parts[parts.len() - 1]);
            let nested = |f: &std::path::Path| {
                parts.len() > 2
                    && f.file_stem().is_some_and(|s| s == parts[1])
                    && f.parent()
                        .and_then(|d| d.file_name())
                        .is_some_and(|d| d == module)
            };
            let found = files.iter().any(|f| {
                (f.file_stem().is_some_and(|s| s == module) || nested(f))
                    && std::fs::read_to_string(f)
                        .unwrap()
                        .contains(&format!("fn {test}("))
            });
            if !found {
                problems.push(format!("{name}: no such test"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
