//! read_file windows, edit_file, list_dir, glob and grep as a user meets
//! them: driven by the offline model's directives against a real server,
//! each tool's happy path, every way out of the workspace refused, edits that
//! fail leave the file as it was, .gitignore'd files stay out of glob and
//! grep, and long results are capped with a note.

use crate::support::{Frame, TestServer};
use serde_json::{json, Value};
use std::path::Path;
use vak::core::PermissionMode;

async fn allow_server() -> TestServer {
    TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await
}

/// Runs `prompt` in a new session and returns its tool results (ok, output)
/// in order, and the run's frames.
async fn tools(s: &TestServer, prompt: &str) -> (Vec<(bool, String)>, Vec<Frame>) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (status, body) = s.run(&sid, prompt).await;
    assert_eq!((status, body["state"].as_str()), (202, Some("started")), "{body}");
    let frames = sse.until("run_finished").await;
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    let results = frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| {
            let b = f.body();
            (
                b["ok"].as_bool().unwrap(),
                b["output"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (results, frames)
}

fn ok(s: &str) -> (bool, String) {
    (true, s.to_string())
}

fn refused(s: &str) -> (bool, String) {
    (false, s.to_string())
}

fn write(dir: &Path, path: &str, content: impl AsRef<[u8]>) {
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn read(dir: &Path, path: &str) -> String {
    std::fs::read_to_string(dir.join(path)).unwrap()
}

#[tokio::test]
async fn read_file_windows_lines_and_refuses_binary_files() {
    let s = allow_server().await;
    let w = &s.workspace;
    write(w, "f.txt", "l1\nl2\nl3\nl4\n");
    write(w, "zero.bin", b"text then \0 a NUL");
    write(w, "latin1.txt", b"caf\xe9\n");
    let (r, _) = tools(
        &s,
        "/read {\"path\": \"f.txt\", \"offset\": 2, \"limit\": 2}\n\
         /read {\"path\": \"f.txt\", \"offset\": 3}\n\
         /read {\"path\": \"f.txt\", \"offset\": 9}\n\
         /read {\"path\": \"f.txt\", \"offset\": 0}\n\
         /read zero.bin\n\
         /read {\"path\": \"latin1.txt\", \"limit\": 1}\n\
         /read f.txt",
    )
    .await;
    assert_eq!(
        r,
        [
            ok("l2\nl3\n\n[f.txt: lines 2-3 shown; the file continues: read on with offset 4]"),
            ok("l3\nl4\n"),
            refused("f.txt: offset 9 is past the end; the file has 4 lines"),
            refused("read_file: `offset` must be a whole number from 1, got 0"),
            refused("zero.bin: a binary file (it contains NUL bytes in its first 8 KiB); read_file reads text files only"),
            refused("latin1.txt: a binary file (it is not valid UTF-8 in its first 8 KiB); read_file reads text files only"),
            ok("l1\nl2\nl3\nl4\n"),
        ]
    );
}

#[tokio::test]
async fn a_window_past_the_byte_cap_says_where_to_read_on() {
    let s = allow_server().await;
    // 3000 lines of 1000 bytes: 1 MiB holds 1048 whole lines.
    let line = format!("{}\n", "y".repeat(999));
    write(&s.workspace, "long.txt", line.repeat(3000));
    let (r, _) = tools(
        &s,
        "/read {\"path\": \"long.txt\", \"offset\": 1000, \"limit\": 2000}",
    )
    .await;
    let (okay, out) = &r[0];
    assert!(okay);
    let (body, note) = out.split_at(1048 * 1000);
    assert_eq!(body, line.repeat(1048));
    assert_eq!(
        note,
        "\n[long.txt: lines 1000-2047 shown; cut at the 1 MiB output cap: read on with offset 2048]"
    );
}

#[tokio::test]
async fn edit_file_replaces_exactly_once_or_leaves_the_file_unchanged() {
    use std::os::unix::fs::PermissionsExt;
    let s = allow_server().await;
    let w = &s.workspace;
    let original = "let a = 1;\nlet b = 2;\nlet b = 2;\n";
    write(w, "m.rs", original);
    std::fs::set_permissions(w.join("m.rs"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let multi_fails = json!({"path": "m.rs", "edits": [
        {"old_string": "let a = 1;", "new_string": "let a = 10;"},
        {"old_string": "let c", "new_string": "let d"}
    ]});
    let (r, frames) = tools(
        &s,
        &format!(
            "/edit m.rs let z => let y\n\
             /edit m.rs let b = 2; => let b = 3;\n\
             /edit {multi_fails}\n\
             /edit {{\"path\": \"m.rs\", \"old_string\": \"a\", \"new_string\": \"a\"}}\n\
             /edit {{\"path\": \"m.rs\", \"old_string\": \"\", \"new_string\": \"x\"}}\n\
             /read m.rs\n\
             /edit m.rs let a = 1; => let a = 10;\n\
             /edit {{\"path\": \"m.rs\", \"old_string\": \"b = 2\", \"new_string\": \"b = 20\", \"replace_all\": true}}\n\
             /edit {{\"path\": \"m.rs\", \"edits\": [{{\"old_string\": \"10\", \"new_string\": \"11\"}}, {{\"old_string\": \"a = 11\", \"new_string\": \"aa = 12\"}}]}}\n\
             /edit missing.rs a => b"
        ),
    )
    .await;
    assert_eq!(
        r,
        [
            refused("old_string was not found in m.rs; the file is unchanged"),
            refused("old_string matches 2 times in m.rs; give more context to match once, or set replace_all; the file is unchanged"),
            refused("edit 2 of 2: old_string was not found in m.rs; the file is unchanged"),
            refused("edit_file: `old_string` and `new_string` are the same; nothing would change"),
            refused("edit_file: `old_string` is empty; name the exact text to replace"),
            ok(original),
            ok("edited m.rs: 1 replacement"),
            ok("edited m.rs: 2 replacements"),
            ok("edited m.rs: 2 replacements"),
            refused("missing.rs: no such file; write_file creates files"),
        ]
    );
    assert_eq!(read(w, "m.rs"), "let aa = 12;\nlet b = 20;\nlet b = 20;\n");
    let mode = std::fs::metadata(w.join("m.rs")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o640, "the mode is kept");
    let names: Vec<_> = std::fs::read_dir(w)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["m.rs"], "no temp file is left behind");
    let calls: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "tool_call")
        .map(|f| &f.body()["input"])
        .collect();
    assert_eq!(
        calls[0],
        &json!({"path": "m.rs", "old_string": "let z", "new_string": "let y"})
    );
}

#[tokio::test]
async fn edit_file_asks_first_in_the_default_mode() {
    let s = TestServer::start().await;
    write(&s.workspace, "a.txt", "x");
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/edit a.txt x => y").await;
    let frames = sse.until("approval_requested").await;
    let req = frames.last().unwrap().body();
    assert_eq!(req["reason"], "edit a.txt (1 replacement)", "{req}");
    assert_eq!(
        read(&s.workspace, "a.txt"),
        "x",
        "nothing changes before the approval"
    );
}

/// A workspace with a folder, a file, links inside and out, and a folder
/// outside with a secret in it.
fn escapes(w: &Path, outside: &Path) {
    write(outside, "secret.txt", "SECRET needle");
    write(w, "inner/f.txt", "inside needle");
    std::os::unix::fs::symlink(outside, w.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), w.join("s.txt")).unwrap();
}

#[tokio::test]
async fn every_new_tool_refuses_the_ways_out_of_the_workspace() {
    let s = allow_server().await;
    let outside = tempfile::tempdir().unwrap();
    let (w, o) = (s.workspace.clone(), outside.path());
    escapes(&w, o);
    let abs = o.display().to_string();
    let (r, _) = tools(
        &s,
        &format!(
            "/edit ../x a => b\n\
             /edit {abs}/secret.txt SECRET => gone\n\
             /edit s.txt SECRET => gone\n\
             /edit out/secret.txt SECRET => gone\n\
             /ls ..\n\
             /ls {abs}\n\
             /ls out\n\
             /ls s.txt\n\
             /glob * ..\n\
             /glob * {abs}\n\
             /glob * out\n\
             /grep {{\"pattern\": \"needle\", \"path\": \"../x\"}}\n\
             /grep {{\"pattern\": \"needle\", \"path\": \"{abs}\"}}\n\
             /grep {{\"pattern\": \"needle\", \"path\": \"out\"}}\n\
             /grep {{\"pattern\": \"needle\", \"path\": \"s.txt\"}}"
        ),
    )
    .await;
    let absolute = format!("{abs}: absolute paths are outside the workspace");
    let secret_abs = format!("{abs}/secret.txt: absolute paths are outside the workspace");
    let expected = [
        refused("../x: `..` would escape the workspace"),
        refused(&secret_abs),
        refused("s.txt: is a symlink; edit the file it points to"),
        refused("out/secret.txt: a symlink leads outside the workspace"),
        refused("..: `..` would escape the workspace"),
        refused(&absolute),
        refused("out: a symlink leads outside the workspace"),
        refused("s.txt: a symlink leads outside the workspace"),
        refused("..: `..` would escape the workspace"),
        refused(&absolute),
        refused("out: a symlink leads outside the workspace"),
        refused("../x: `..` would escape the workspace"),
        refused(&absolute),
        refused("out: a symlink leads outside the workspace"),
        refused("s.txt: a symlink leads outside the workspace"),
    ];
    assert_eq!(r, expected);
    assert_eq!(read(o, "secret.txt"), "SECRET needle", "nothing outside changed");

    // Walking the workspace never follows the links out.
    let (r, _) = tools(&s, "/glob **/*.txt\n/grep needle\n/ls").await;
    assert_eq!(
        r,
        [
            ok("inner/f.txt"),
            ok("inner/f.txt:1:inside needle"),
            ok(&format!("inner/\nout -> {abs}\ns.txt -> {abs}/secret.txt")),
        ]
    );
}

#[tokio::test]
async fn glob_and_grep_leave_out_gitignored_files_and_list_dir_marks_folders() {
    let s = allow_server().await;
    let w = &s.workspace;
    write(w, ".gitignore", "target/\n*.log\n");
    write(w, "src/main.rs", "fn main() {\n    // TODO: run\n}\n");
    write(w, "src/lib/mod.rs", "// todo: lower case\npub fn f() {}\n");
    write(w, "src/lib/trace.log", "TODO in a log\n");
    write(w, "target/debug/out.rs", "// TODO built\n");
    write(w, "data.bin", b"TODO\0\x01\x02");
    let (r, _) = tools(
        &s,
        "/glob **/*.rs\n\
         /glob *.rs src\n\
         /glob {\"pattern\": \"*.log\", \"path\": \"src/lib\"}\n\
         /grep TODO\n\
         /grep {\"pattern\": \"todo\", \"case_insensitive\": true, \"glob\": \"mod.rs\"}\n\
         /grep {\"pattern\": \"fn \\\\w+\", \"path\": \"src/lib\"}\n\
         /grep fn (\n\
         /glob src/[\n\
         /ls\n\
         /ls src/lib\n\
         /ls src/main.rs",
    )
    .await;
    assert_eq!(
        r,
        [
            ok("src/lib/mod.rs\nsrc/main.rs"),
            ok("src/main.rs"),
            ok("no files match *.log"),
            ok("src/main.rs:2:    // TODO: run"),
            ok("src/lib/mod.rs:1:// todo: lower case"),
            ok("src/lib/mod.rs:2:pub fn f() {}"),
            refused("grep: bad regex \"fn (\": unclosed group"),
            refused("glob: bad pattern \"src/[\": unclosed character class; missing ']'"),
            ok(".gitignore\ndata.bin\nsrc/\ntarget/"),
            ok("mod.rs\ntrace.log"),
            refused("src/main.rs: not a folder"),
        ]
    );
}

#[tokio::test]
async fn long_listings_and_searches_are_capped_with_a_note() {
    let s = allow_server().await;
    let w = &s.workspace;
    for i in 0..1005 {
        write(w, &format!("many/f{i:04}.txt"), "match me\nmatch me too\n");
    }
    let (r, _) = tools(&s, "/ls many\n/glob **/*.txt\n/grep match").await;
    let (ls, glob, grep) = (&r[0].1, &r[1].1, &r[2].1);
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 1001);
    assert_eq!(lines[0], "f0000.txt");
    assert_eq!(lines[999], "f0999.txt");
    assert_eq!(
        lines[1000],
        "[5 more entries not shown; 1005 in all, this is the first 1000]"
    );
    let lines: Vec<&str> = glob.lines().collect();
    assert_eq!(lines.len(), 1001);
    assert_eq!(lines[999], "many/f0999.txt");
    assert_eq!(
        lines[1000],
        "[5 more files match; 1005 in all, this is the first 1000 by path]"
    );
    let lines: Vec<&str> = grep.lines().collect();
    assert_eq!(lines.len(), 1001);
    assert!(lines[0].ends_with(":1:match me"), "{}", lines[0]);
    assert_eq!(
        lines[1000],
        "[1010 more matching lines not shown; this is the first 1000; narrow the pattern, path or glob]"
    );
    assert!(r.iter().all(|(ok, _)| *ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_flipped_during_edits_and_walks_never_lets_them_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const ATTEMPTS: usize = 400;
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (w, o) = (ws.path().to_path_buf(), outside.path().to_path_buf());
    write(&o, "f", "SECRET a b");
    // Its name gives away a listing of the outside folder.
    write(&o, "SECRET.txt", "a");
    write(&w, "inner/f", "a");
    std::os::unix::fs::symlink("inner", w.join("d")).unwrap();
    // `ws/d` flips between `inner` and the outside folder, each flip an
    // atomic rename over the link.
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (w, o, stop) = (w.clone(), o.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let tmp = w.join("d.tmp");
                let _ = std::fs::remove_file(&tmp);
                let target = if flips.is_multiple_of(2) {
                    o.as_path()
                } else {
                    Path::new("inner")
                };
                std::os::unix::fs::symlink(target, &tmp).unwrap();
                std::fs::rename(&tmp, w.join("d")).unwrap();
                flips += 1;
            }
            flips
        })
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut seen = Vec::new();
    for i in 0..ATTEMPTS {
        let (old, new) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
        let inputs = [
            (
                "edit_file",
                json!({"path": "d/f", "old_string": old, "new_string": new}),
            ),
            ("grep", json!({"pattern": "SECRET|a|b", "path": "d"})),
            ("glob", json!({"pattern": "*", "path": "d"})),
            ("list_dir", json!({"path": "d"})),
            ("read_file", json!({"path": "d/f", "offset": 1})),
        ];
        for (tool, input) in inputs {
            let r = vak::core::tools::run(&w, tool, &input, &cancel).await;
            if r.output.contains("SECRET") {
                seen.push(format!("{tool}: {}", r.output));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    eprintln!("{ATTEMPTS} rounds over {flips} flips");
    assert_eq!(seen, Vec::<String>::new(), "outputs that saw the outside file");
    assert_eq!(read(&o, "f"), "SECRET a b", "the outside file is unchanged");
    let mut names: Vec<_> = std::fs::read_dir(&o)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["SECRET.txt", "f"], "nothing was created outside");
}
