//! The file tools and bash as a user meets them: reads cost at most their
//! cap, nothing outside the workspace is read or written even while a
//! symlink is flipped underneath, FIFOs are refused, and a cancel always
//! settles the run and kills what bash started.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use support::{Frame, TestServer, DEADLINE};
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

/// kB of this process's peak resident set (VmHWM) since the last reset.
fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn reading_a_huge_sparse_file_costs_the_server_at_most_its_cap() {
    const GIB: u64 = 1 << 30;
    const CAP: usize = 1 << 20;
    let s = TestServer::start().await;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(s.workspace.join("big.bin")).unwrap();
        f.write_all(&vec![b'x'; 2 * CAP]).unwrap();
        f.set_len(GIB).unwrap(); // the rest is a hole: no disk, all zeros when read
    }
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // Reset the peak to the current RSS (Linux 4.0+), so the peak measured
    // afterwards is this read's, not whatever the test binary did before.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss_kb();
    s.run(&sid, "/read big.bin").await;
    let frames = sse.until("run_finished").await;
    let grown_mib = peak_rss_kb().saturating_sub(before) / 1024;
    eprintln!("peak RSS grew by {grown_mib} MiB");

    let r = &results(&frames)[0];
    assert_eq!(r["ok"], true, "read_file needs no approval and succeeds");
    let out = r["output"].as_str().unwrap();
    let (body, note) = out.split_at(CAP);
    assert!(body.bytes().all(|b| b == b'x'), "the first MiB of the file");
    assert_eq!(
        note,
        "\n[output truncated: big.bin is 1073741824 bytes; this is the first 1048576 bytes]"
    );
    assert!(
        grown_mib < 64,
        "reading 1 MiB of a 1 GiB file grew the server's peak RSS by {grown_mib} MiB"
    );
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
}

#[tokio::test]
async fn a_fifo_is_refused_at_once_and_the_run_finishes() {
    let s = allow_server().await;
    let fifo = s.workspace.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
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

/// Waits (bounded) for process `pid` to exit; false past the deadline.
fn wait_exited(pid: i32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        // ESRCH: it is already gone.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd; fd is ours and closed right after.
    let n = unsafe { libc::poll(&mut p, 1, DEADLINE.as_millis() as i32) };
    unsafe { libc::close(fd) };
    n == 1
}

#[tokio::test]
async fn cancelling_a_slow_bash_settles_the_run_and_kills_its_process_group() {
    let s = allow_server().await;
    let ready = s.workspace.join("ready");
    let c = std::ffi::CString::new(ready.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
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
        tokio::task::spawn_blocking(move || wait_exited(pid))
            .await
            .unwrap(),
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
