//! The file tools and bash as a user meets them: reads cost at most their
//! cap, nothing outside the workspace is read or written even while a
//! symlink is flipped underneath, FIFOs are refused, a cancel or a timeout
//! always settles the run and kills what bash started, and bash output
//! reaches clients live, tagged by stream and bounded.

use crate::support;
use crate::support::{exited, mkfifo, Frame, Serve, Served, Sse, TestServer, DEADLINE, TOKEN};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use vak::core::tools;
use vak::core::PermissionMode;

async fn allow_server() -> TestServer {
    TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await
}

fn results(frames: &[Frame]) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| f.body().clone())
        .collect()
}

/// A `vak serve` child process (the built binary), so that its memory is
/// measured alone, not mixed with the tests running beside it.
struct ServerChild {
    served: Served,
    url: String,
    workspace: PathBuf,
}

impl ServerChild {
    async fn start(permission_mode: &str) -> ServerChild {
        let served = Serve::new()
            .args(["--permission-mode", permission_mode, "--allow-bypass"])
            .start()
            .await;
        ServerChild {
            url: served.url.clone(),
            workspace: served.workspace().to_path_buf(),
            served,
        }
    }

    /// A line of /proc/<pid>/status, in kB: `VmHWM` is the peak resident set.
    fn status_kb(&self, field: &str) -> u64 {
        let pid = self.served.vak.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Resets the server's peak RSS to its current RSS (Linux 4.0+) and
    /// returns it, so the peak measured afterwards is what came after.
    fn reset_peak_rss_kb(&self) -> u64 {
        let pid = self.served.vak.pid();
        if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
            // Without the reset the growth measured is a lower bound only.
            eprintln!("cannot reset the server's peak RSS ({e}); measuring from its peak so far");
        }
        self.status_kb("VmHWM:")
    }

    fn http(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap()
    }

    /// A new session and its event stream, open before anything runs.
    async fn session(&self) -> (String, Sse) {
        let r = self
            .http()
            .post(format!("{}/sessions", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let sid = r.json::<Value>().await.unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        let resp = self
            .http()
            .get(format!("{}/sessions/{sid}/events", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "events stream opens");
        let mut sse = Sse::new(resp);
        assert_eq!(sse.next().await.expect("a first frame").event, "stream_opened");
        (sid, sse)
    }

    async fn run(&self, sid: &str, prompt: &str) {
        let r = self
            .http()
            .post(format!("{}/sessions/{sid}/run", self.url))
            .json(&json!({ "prompt": prompt }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        assert_eq!(r.json::<Value>().await.unwrap()["state"], "started");
    }
}

const CAP: usize = 1 << 20;

#[tokio::test]
async fn reading_a_huge_sparse_file_costs_the_server_at_most_its_cap() {
    const SIZE: u64 = 10 << 30;
    let s = ServerChild::start("ask").await;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(s.workspace.join("big.bin")).unwrap();
        f.write_all(&vec![b'x'; 2 * CAP]).unwrap();
        f.set_len(SIZE).unwrap(); // the rest is a hole: no disk, all zeros when read
    }
    let (sid, mut sse) = s.session().await;
    let before = s.reset_peak_rss_kb();
    s.run(&sid, "/read big.bin").await;
    let frames = sse.until("run_finished").await;
    let grown_mib = s.status_kb("VmHWM:").saturating_sub(before) / 1024;
    eprintln!("reading 1 MiB of a 10 GiB file grew the server's peak RSS by {grown_mib} MiB");

    let r = &results(&frames)[0];
    assert_eq!(r["ok"], true, "read_file needs no approval and succeeds");
    let out = r["output"].as_str().unwrap();
    let (body, note) = out.split_at(CAP);
    assert!(body.bytes().all(|b| b == b'x'), "the first MiB of the file");
    assert_eq!(
        note,
        "\n[output truncated: big.bin is 10737418240 bytes; this is the first 1048576 bytes]"
    );
    assert!(
        grown_mib < 64,
        "reading 1 MiB of a 10 GiB file grew the server's peak RSS by {grown_mib} MiB"
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
}

#[tokio::test]
async fn bash_printing_200_mb_streams_live_returns_the_first_mib_and_the_server_holds_far_less() {
    const WRITTEN: usize = 200_000_000;
    let s = ServerChild::start("allow").await;
    let (sid, mut sse) = s.session().await;
    let before = s.reset_peak_rss_kb();
    s.run(
        &sid,
        &format!("/bash head -c {WRITTEN} /dev/zero | tr '\\0' x\nafter"),
    )
    .await;
    let frames = sse.until("run_finished").await;
    let grown_mib = s.status_kb("VmHWM:").saturating_sub(before) / 1024;
    eprintln!("200 MB of bash output grew the server's peak RSS by {grown_mib} MiB");

    let r = &results(&frames)[0];
    assert_eq!(r["ok"], true, "the command succeeded");
    let out = r["output"].as_str().unwrap();
    let (body, note) = out.split_at(CAP);
    assert!(body.bytes().all(|b| b == b'x'), "the first MiB of the output");
    assert_eq!(
        note,
        format!(
            "\n[output truncated: {} of {WRITTEN} bytes cut; this is the first {CAP} bytes]",
            WRITTEN - CAP
        )
    );
    assert!(
        grown_mib < 64,
        "200 MB of output grew the server's peak RSS by {grown_mib} MiB"
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    assert!(support::text_of(&frames).ends_with("echo: after"));
    // Clients saw it live, up to the live cap, then one note.
    let live = live_text(&frames, "stdout");
    assert_eq!(live.len(), tools::LIVE_CAP + tools::LIVE_STOPPED.len());
    assert!(live[..tools::LIVE_CAP].bytes().all(|b| b == b'x'));
    assert!(live.ends_with(tools::LIVE_STOPPED));
    let pieces = frames.iter().filter(|f| f.event == "tool_output").count();
    assert!(pieces < 2_000, "batched at the source: {pieces} frames");
}

#[tokio::test]
async fn a_fifo_is_refused_at_once_and_the_run_finishes() {
    let s = allow_server().await;
    let fifo = s.workspace.join("fifo");
    mkfifo(&fifo);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/read fifo\n/write fifo data\nstill here").await;
    let frames = sse.until("run_finished").await;
    let r = results(&frames);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["ok"], false);
    assert_eq!(
        r[0]["output"],
        "fifo: not a regular file (it is a FIFO); only regular files can be read"
    );
    assert_eq!(r[1]["ok"], false);
    assert!(
        r[1]["output"]
            .as_str()
            .unwrap()
            .starts_with("fifo: not a regular file"),
        "{}",
        r[1]["output"]
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    assert!(support::text_of(&frames).ends_with("echo: still here"));
    // The session is idle again: the next prompt starts at once.
    let (_, body) = s.run(&sid, "again").await;
    assert_eq!(body["state"], "started", "the session is idle: {body}");
}

#[tokio::test]
async fn cancelling_a_slow_bash_settles_the_run_and_kills_its_process_group() {
    let s = allow_server().await;
    let ready = s.workspace.join("ready");
    mkfifo(&ready);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/bash sleep 600 & echo $! > ready; wait\nnever")
        .await;
    // The command writes the sleeper's pid into the FIFO once it runs.
    let pid: i32 = tokio::time::timeout(
        DEADLINE,
        tokio::task::spawn_blocking(move || std::fs::read_to_string(ready).unwrap()),
    )
    .await
    .expect("bash starts within the deadline")
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let (status, body) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!((status, body["cancelled"].clone()), (200, json!(true)), "{body}");
    let frames = sse.until("run_finished").await;
    let calls = frames.iter().filter(|f| f.event == "tool_call").count();
    let r = results(&frames);
    assert_eq!((calls, r.len()), (1, 1), "one tool_call, one tool_result");
    assert_eq!(r[0]["ok"], false);
    assert_eq!(
        r[0]["output"],
        "cancelled: the command and its process group were killed"
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "cancelled");
    assert!(!support::text_of(&frames).contains("never"));
    assert!(
        exited(pid).await,
        "the background sleep {pid} was killed with its group"
    );
    let (_, body) = s.run(&sid, "again").await;
    assert_eq!(body["state"], "started", "the session is idle: {body}");
    let frames = sse.until("run_finished").await;
    assert_eq!(
        frames.iter().filter(|f| f.event == "run_finished").count(),
        1,
        "the cancelled chain published exactly one run_finished"
    );
}

#[tokio::test]
async fn a_command_that_prints_forever_is_stopped_by_cancel() {
    let s = allow_server().await;
    let ready = s.workspace.join("ready");
    mkfifo(&ready);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // The shell writes its pid into the FIFO, then becomes `yes`, which prints forever.
    s.run(&sid, "/bash echo $$ > ready; exec yes\nnever").await;
    let pid: i32 = tokio::time::timeout(
        DEADLINE,
        tokio::task::spawn_blocking(move || std::fs::read_to_string(ready).unwrap()),
    )
    .await
    .expect("bash starts within the deadline")
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let (status, body) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!((status, body["cancelled"].clone()), (200, json!(true)), "{body}");
    let frames = sse.until("run_finished").await;
    let r = results(&frames);
    assert_eq!(r.len(), 1, "one tool_result");
    assert_eq!(
        (r[0]["ok"].clone(), r[0]["output"].clone()),
        (
            json!(false),
            json!("cancelled: the command and its process group were killed")
        )
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "cancelled");
    assert!(!support::text_of(&frames).contains("never"));
    assert!(exited(pid).await, "yes ({pid}) was killed with its group");
}

/// The text of the `tool_output` frames of `stream`, in order.
fn live_text(frames: &[Frame], stream: &str) -> String {
    frames
        .iter()
        .filter(|f| f.event == "tool_output" && f.body()["stream"] == stream)
        .map(|f| f.body()["text"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn bash_output_reaches_clients_live_tagged_by_stream_before_the_command_ends() {
    let s = allow_server().await;
    let go = s.workspace.join("go");
    mkfifo(&go);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // It prints, then waits for the test, which opens `go` only once it saw the print.
    s.run(&sid, "/bash echo started; read x < go; echo \"after $x\" >&2")
        .await;
    let mut seen = Vec::new();
    let call_id = loop {
        let f = sse.next().await.expect("the stream goes on");
        assert_ne!(f.event, "tool_result", "output came live, before the result");
        seen.push(f.clone());
        if f.event == "tool_output" {
            assert_eq!(f.body()["stream"], "stdout");
            assert_eq!(f.body()["text"], "started\n");
            break f.body()["call_id"].as_str().unwrap().to_string();
        }
    };
    let call = seen
        .iter()
        .find(|f| f.event == "tool_call")
        .expect("its tool_call first");
    assert_eq!(call.body()["call_id"], call_id.as_str());
    // The presentation's tool item shows the live output while the command runs.
    let (_, timeline) = s.get(&format!("/sessions/{sid}/presentation")).await;
    let item = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "tool_call")
        .expect("the tool item");
    assert_eq!(
        (item["status"].as_str(), item["text"].as_str()),
        (Some("running"), Some("started\n"))
    );
    tokio::task::spawn_blocking(move || std::fs::write(go, "now\n").unwrap())
        .await
        .unwrap();
    let frames = sse.until("run_finished").await;
    assert_eq!(live_text(&frames, "stderr"), "after now\n");
    assert_eq!(live_text(&frames, "stdout"), "");
    assert!(frames
        .iter()
        .filter(|f| f.event == "tool_output")
        .all(|f| f.body()["call_id"] == call_id.as_str()));
    let r = &results(&frames)[0];
    assert_eq!(
        (r["ok"].as_bool(), r["output"].as_str()),
        (Some(true), Some("started\nafter now\n"))
    );
    // The transcript has the result, not the live pieces; the timeline ends the same.
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let tool_msgs: Vec<_> = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tool_msgs.len(), 1);
    assert_eq!(tool_msgs[0]["text"], "started\nafter now\n");
    let (_, timeline) = s.get(&format!("/sessions/{sid}/presentation")).await;
    let item = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "tool_call")
        .unwrap();
    assert_eq!(
        (item["status"].as_str(), item["text"].as_str()),
        (Some("completed"), Some("started\nafter now\n"))
    );
}

#[tokio::test]
async fn a_bash_command_past_its_timeout_leaves_no_process_behind() {
    let s = allow_server().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(
        &sid,
        "/bash-timeout 1 echo $$; sleep 600 & echo $!; wait\nstill here",
    )
    .await;
    let frames = sse.until("run_finished").await;
    let r = &results(&frames)[0];
    assert_eq!(r["ok"], false);
    let out = r["output"].as_str().unwrap();
    let (pids, note) = out.split_once("\n\n").expect("the pids, then the note");
    assert_eq!(
        note,
        "[timed out after 1 s; the command and its process group were killed]"
    );
    let pids: Vec<i32> = pids.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "the shell and its background sleep: {out}");
    for pid in pids {
        assert!(exited(pid).await, "{pid} was killed with its group");
    }
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    assert!(support::text_of(&frames).ends_with("echo: still here"));
}

#[tokio::test]
async fn a_bad_bash_timeout_is_a_tool_error_and_the_run_goes_on() {
    let s = allow_server().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/bash-timeout 0 echo no\n/bash-timeout 601 echo no\n/bash-timeout soon echo no\n/bash-timeout 600 echo yes")
        .await;
    let frames = sse.until("run_finished").await;
    let r = results(&frames);
    let bad = |v: &str| format!("bash `timeout` must be a whole number of seconds from 1 to 600, got {v}");
    assert_eq!(
        r[0],
        json!({"call_id": r[0]["call_id"], "ok": false, "output": bad("0")})
    );
    assert_eq!(r[1]["output"], bad("601"));
    assert_eq!(r[2]["output"], bad("\"soon\""));
    assert_eq!(
        (r[3]["ok"].as_bool(), r[3]["output"].as_str()),
        (Some(true), Some("yes\n"))
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
}

async fn tool(ws: &Path, name: &str, input: Value) -> tools::ToolOutput {
    tools::run(ws, name, &input, &CancellationToken::new()).await
}

#[tokio::test]
async fn escapes_are_refused_with_clear_messages() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (w, o) = (ws.path(), outside.path());
    std::fs::write(o.join("secret"), "SECRET").unwrap();
    std::fs::create_dir(w.join("inner")).unwrap();
    std::fs::write(w.join("inner/f"), "inside").unwrap();
    std::os::unix::fs::symlink(o, w.join("out")).unwrap();
    std::os::unix::fs::symlink(o.join("secret"), w.join("s")).unwrap();
    std::os::unix::fs::symlink("inner", w.join("alias")).unwrap();
    std::fs::hard_link(o.join("secret"), w.join("hard")).unwrap();

    let long = "d/".repeat(2100) + "f";
    let long_name = "n".repeat(300);
    let cases: &[(&str, &str)] = &[
        ("../x", "../x: `..` would escape the workspace"),
        ("inner/../../x", "inner/../../x: `..` would escape the workspace"),
        (
            "/etc/passwd",
            "/etc/passwd: absolute paths are outside the workspace",
        ),
        ("out/secret", "out/secret: a symlink leads outside the workspace"),
        ("s", "s: a symlink leads outside the workspace"),
        (
            "hard",
            "hard: refused: the file has 2 hard links, and a hard link may be a file outside the workspace",
        ),
        ("a\0b", "the path contains a NUL byte"),
        (&long, "the path is 4201 bytes long; the limit is 4096"),
        ("", "an empty path"),
    ];
    for (path, message) in cases {
        let r = tool(w, "read_file", json!({ "path": path })).await;
        assert_eq!((r.ok, r.output.as_str()), (false, *message), "read {path:?}");
        let wr = tool(w, "write_file", json!({ "path": path, "content": "pwned" })).await;
        assert!(!wr.ok, "write {path:?}: {}", wr.output);
    }
    let r = tool(w, "read_file", json!({ "path": long_name })).await;
    assert_eq!(
        r.output,
        format!("{long_name}: a path component is 300 bytes long; the limit is 255")
    );
    let wr = tool(w, "write_file", json!({"path": "out/new/file", "content": "x"})).await;
    assert!(
        !wr.ok && wr.output.contains("a symlink leads outside the workspace"),
        "{}",
        wr.output
    );
    // Nothing outside changed.
    assert_eq!(std::fs::read_to_string(o.join("secret")).unwrap(), "SECRET");
    let names: Vec<_> = std::fs::read_dir(o)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["secret"]);
    // A symlink that stays inside still works.
    let r = tool(w, "read_file", json!({"path": "alias/f"})).await;
    assert_eq!((r.ok, r.output.as_str()), (true, "inside"));
    let r = tool(w, "write_file", json!({"path": "alias/g", "content": "1"})).await;
    assert!(r.ok, "{}", r.output);
    assert_eq!(std::fs::read_to_string(w.join("inner/g")).unwrap(), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_flipped_during_reads_and_writes_never_lets_them_out() {
    const ATTEMPTS: usize = 3000;
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (w, o) = (ws.path().to_path_buf(), outside.path().to_path_buf());
    std::fs::write(o.join("secret"), "SECRET").unwrap();
    std::fs::create_dir(w.join("inner")).unwrap();
    std::fs::write(w.join("inner/secret"), "inside").unwrap();
    std::os::unix::fs::symlink("inner", w.join("d")).unwrap();
    // `ws/d` flips between `inner` and the outside folder (absolute, then
    // relative through `..`), each flip an atomic rename over the link.
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (w, o, stop) = (w.clone(), o.clone(), stop.clone());
        let rel_out = Path::new("..").join(o.file_name().unwrap());
        std::thread::spawn(move || {
            let targets = [
                Path::new("inner"),
                o.as_path(),
                Path::new("inner"),
                rel_out.as_path(),
            ];
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let tmp = w.join("d.tmp");
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(targets[flips as usize % 4], &tmp).unwrap();
                std::fs::rename(&tmp, w.join("d")).unwrap();
                flips += 1;
            }
            flips
        })
    };
    let (mut inside, mut refused, mut escaped) = (0, 0, Vec::new());
    for i in 0..ATTEMPTS {
        let r = tool(&w, "read_file", json!({"path": "d/secret"})).await;
        // Inside, `d/secret` says "inside" or what a write below put there.
        match (r.ok, r.output.as_str()) {
            (_, m) if m.contains("SECRET") => escaped.push(r.output),
            (true, "inside" | "pwned") => inside += 1,
            (false, _) => refused += 1,
            _ => escaped.push(r.output),
        }
        let path = match i % 3 {
            0 => format!("d/w{i}"),
            1 => format!("d/n{i}/f"),
            _ => "d/secret".to_string(),
        };
        tool(&w, "write_file", json!({"path": path, "content": "pwned"})).await;
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    eprintln!("{ATTEMPTS} reads over {flips} flips: {inside} inside, {refused} refused");
    assert_eq!(escaped, Vec::<String>::new(), "reads that saw the outside file");
    assert_eq!(inside + refused, ATTEMPTS);
    let names: Vec<_> = std::fs::read_dir(&o)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["secret"], "nothing was created outside");
    assert_eq!(std::fs::read_to_string(o.join("secret")).unwrap(), "SECRET");
}
