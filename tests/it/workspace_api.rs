//! The files API and the session diff against a real server: a file read
//! and written with its sha (a stale sha is 409 and changes nothing), text
//! and base64, every way out of the workspace refused, size caps, the
//! bounded tree, folder names under the roots, and git status + diff of a
//! real repository, including one whose config tries to run a program.

use crate::support;
use crate::support::git::git;
use crate::support::{SecondWorkspace, TestServer};
use serde_json::{json, Value};
use std::path::Path;
use vak::proto::v1 as pb;

async fn put(s: &TestServer, body: Value) -> (u16, Value) {
    s.send(reqwest::Method::PUT, "/fs/file", Some(body)).await
}

/// `v` percent-encoded for a query value.
fn q(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    vak::core::host::files::sha256_hex(bytes)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_file_is_read_and_written_with_its_sha_and_a_stale_sha_changes_nothing() {
    let s = TestServer::start().await;
    let (status, w) = put(
        &s,
        json!({"path": "src/new.txt", "content": "one\n", "expected_sha": ""}),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    assert_eq!(w["created"], true);
    assert_eq!(w["sha"], sha256(b"one\n"));
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("src/new.txt")).unwrap(),
        "one\n"
    );

    let (status, r) = s.get("/fs/file?path=src/new.txt").await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["content"], "one\n");
    assert_eq!(r["encoding"], "utf-8");
    assert_eq!(r["sha"], sha256(b"one\n"));
    assert_eq!(r["size"], 4);
    let first = r["sha"].as_str().unwrap().to_string();

    // Client A writes with the sha it read; client B, with the same sha, is refused.
    let (status, a) = put(
        &s,
        json!({"path": "src/new.txt", "content": "two\n", "expected_sha": first}),
    )
    .await;
    assert_eq!((status, a["created"].as_bool()), (200, Some(false)), "{a}");
    let (status, b) = put(
        &s,
        json!({"path": "src/new.txt", "content": "three\n", "expected_sha": first}),
    )
    .await;
    assert_eq!(status, 409, "{b}");
    assert_eq!(code(&b), "conflict");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains(a["sha"].as_str().unwrap()),
        "{b}"
    );
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("src/new.txt")).unwrap(),
        "two\n"
    );
    // "" means must not exist yet; no expected_sha means unconditional.
    let (status, _) = put(
        &s,
        json!({"path": "src/new.txt", "content": "x", "expected_sha": ""}),
    )
    .await;
    assert_eq!(status, 409);
    let (status, _) = put(&s, json!({"path": "src/new.txt", "content": "last"})).await;
    assert_eq!(status, 200);
    let (status, e) = put(
        &s,
        json!({"path": "src/new.txt", "content": "x", "expected_sha": "abc"}),
    )
    .await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");

    // Binary content travels as base64 both ways.
    let bytes = [0u8, 159, 146, 150, 255, b'\n'];
    let b64 = "AJ+Slv8K";
    let (status, w) = put(
        &s,
        json!({"path": "bin.dat", "content": b64, "encoding": "base64"}),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    assert_eq!(std::fs::read(s.workspace.join("bin.dat")).unwrap(), bytes);
    let (_, r) = s.get("/fs/file?path=bin.dat").await;
    assert_eq!(
        (r["encoding"].as_str(), r["content"].as_str()),
        (Some("base64"), Some(b64))
    );
    assert_eq!(r["sha"], sha256(&bytes));
    let (status, e) = put(&s, json!({"path": "x", "content": "!!", "encoding": "base64"})).await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = put(&s, json!({"path": "x", "content": "a", "encoding": "latin-1"})).await;
    assert_eq!(status, 400, "{e}");

    // The same over gRPC: a stale sha is FAILED_PRECONDITION.
    let mut g = s.grpc().await;
    let read = g
        .read_file(pb::ReadFileRequest {
            path: "src/new.txt".into(),
            session_id: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.content, "last");
    let e = g
        .write_file(pb::WriteFileRequest {
            path: "src/new.txt".into(),
            content: "y".into(),
            encoding: pb::FileEncoding::Unspecified as i32,
            expected_sha: Some(first),
            session_id: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let ok = g
        .write_file(pb::WriteFileRequest {
            path: "src/new.txt".into(),
            content: "y".into(),
            encoding: pb::FileEncoding::Unspecified as i32,
            expected_sha: Some(read.sha),
            session_id: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.sha, sha256(b"y"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_many_clients_writing_over_one_version_at_once_exactly_one_wins() {
    let s = TestServer::start().await;
    let (status, w) = put(&s, json!({"path": "shared.txt", "content": "v0"})).await;
    assert_eq!(status, 201);
    let base = w["sha"].as_str().unwrap().to_string();
    let writers: Vec<_> = (0..16)
        .map(|i| {
            let (http, url, base) = (s.http(), format!("{}/fs/file", s.url), base.clone());
            tokio::spawn(async move {
                let body =
                    json!({"path": "shared.txt", "content": format!("writer {i}"), "expected_sha": base});
                let r = http.put(url).json(&body).send().await.unwrap();
                (i, r.status().as_u16())
            })
        })
        .collect();
    let mut won = Vec::new();
    for w in writers {
        let (i, status) = w.await.unwrap();
        match status {
            200 => won.push(i),
            409 => {}
            other => panic!("writer {i}: {other}"),
        }
    }
    assert_eq!(
        won.len(),
        1,
        "exactly one write over the version they all read: {won:?}"
    );
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("shared.txt")).unwrap(),
        format!("writer {}", won[0])
    );
}

#[tokio::test]
async fn every_way_out_of_the_workspace_is_refused_for_reads_and_writes() {
    let s = TestServer::start().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "secret").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), s.workspace.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), s.workspace.join("out")).unwrap();
    std::fs::create_dir(s.workspace.join("d")).unwrap();
    let secret = outside.path().join("secret").display().to_string();
    for path in [
        "../secret",
        "a/../../secret",
        secret.as_str(),
        "link",
        "out/secret",
    ] {
        let (status, e) = s.get(&format!("/fs/file?path={}", q(path))).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "GET {path}: {e}");
        let (status, e) = put(&s, json!({"path": path, "content": "pwned"})).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "PUT {path}: {e}");
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "secret"
    );
    assert!(!outside.path().join("out").exists());
    for (path, want) in [("a%00b", 400), ("d", 400), ("missing.txt", 404), ("", 400)] {
        let (status, e) = s.get(&format!("/fs/file?path={path}")).await;
        assert_eq!(status, want, "{path}: {e}");
    }
    let (status, e) = s.get(&format!("/fs/file?path={}", "a/".repeat(2100))).await;
    assert_eq!(status, 400, "{e}");
    // A parameter the route does not read is named.
    let (status, e) = s.get("/fs/file?pth=a").await;
    assert_eq!(status, 400, "{e}");
}

#[tokio::test]
async fn files_over_the_cap_are_413_in_both_directions() {
    let s = TestServer::start().await;
    let cap = vak::core::host::files::MAX_FILE_BYTES as usize;
    let (status, e) = put(&s, json!({"path": "big.txt", "content": "a".repeat(cap + 1)})).await;
    assert_eq!((status, code(&e)), (413, "payload_too_large"), "{e}");
    assert!(!s.workspace.join("big.txt").exists());
    // Past the request body limit itself.
    let (status, e) = put(&s, json!({"path": "big.txt", "content": "a".repeat(5 << 20)})).await;
    assert_eq!((status, code(&e)), (413, "payload_too_large"), "{e}");
    std::fs::write(s.workspace.join("huge.txt"), vec![b'a'; cap + 1]).unwrap();
    let (status, e) = s.get("/fs/file?path=huge.txt").await;
    assert_eq!((status, code(&e)), (413, "payload_too_large"), "{e}");
    let mut g = s.grpc().await;
    let e = g
        .read_file(pb::ReadFileRequest {
            path: "huge.txt".into(),
            session_id: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange);
    // Exactly the cap is fine.
    let (status, _) = put(&s, json!({"path": "cap.txt", "content": "a".repeat(cap)})).await;
    assert_eq!(status, 201);
}

fn write(dir: &Path, path: &str, content: &str) {
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

#[tokio::test]
async fn the_tree_respects_gitignore_is_bounded_and_says_when_truncated() {
    let s = TestServer::start().await;
    let ws = &s.workspace;
    write(ws, ".gitignore", "target/\n*.log\n");
    write(ws, "src/main.rs", "");
    write(ws, "src/lib/mod.rs", "");
    write(ws, "target/debug/x", "");
    write(ws, "run.log", "");
    write(ws, ".git/HEAD", "");
    write(ws, "README.md", "");
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "far.txt", "");
    std::os::unix::fs::symlink(outside.path(), ws.join("linked")).unwrap();
    let (status, t) = s.get("/fs/tree").await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        t["files"],
        json!([".gitignore", "README.md", "src/lib/mod.rs", "src/main.rs"])
    );
    assert_eq!(t["truncated"], false);
    let (_, t) = s.get("/fs/tree?limit=2").await;
    assert_eq!(t["files"].as_array().unwrap().len(), 2);
    assert_eq!(t["truncated"], true);
    for bad in ["limit=0", "limit=10001", "limit=abc", "depth=1"] {
        let (status, e) = s.get(&format!("/fs/tree?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
    let mut g = s.grpc().await;
    let t = g
        .list_tree(pb::ListTreeRequest {
            limit: Some(1),
            session_id: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((t.files.len(), t.truncated), (1, true));
}

#[tokio::test]
async fn with_a_session_the_files_api_works_in_that_sessions_workspace() {
    let SecondWorkspace { s, root, sid, .. } = TestServer::with_second_workspace(|root| {
        write(&root.join("main"), "main.txt", "the server's\n");
        write(&root.join("other"), "other.txt", "the other workspace's\n");
    })
    .await;
    let (_, main_session) = s.post("/sessions", json!({})).await;
    let main_sid = main_session["session_id"].as_str().unwrap();

    // The tree: the session's workspace, the server's without one.
    let (status, t) = s.get(&format!("/fs/tree?session_id={sid}")).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["files"], json!(["other.txt"]));
    let (_, t) = s.get(&format!("/fs/tree?session_id={main_sid}")).await;
    assert_eq!(t["files"], json!(["main.txt"]));
    let (_, t) = s.get("/fs/tree").await;
    assert_eq!(t["files"], json!(["main.txt"]));

    // A read and a write land in the session's workspace only.
    let (status, f) = s.get(&format!("/fs/file?path=other.txt&session_id={sid}")).await;
    assert_eq!(status, 200, "{f}");
    assert_eq!(f["content"], "the other workspace's\n");
    let (status, e) = s.get("/fs/file?path=other.txt").await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, w) = put(
        &s,
        json!({"path": "new.txt", "content": "x", "expected_sha": "", "session_id": sid}),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    assert_eq!(std::fs::read_to_string(root.join("other/new.txt")).unwrap(), "x");
    assert!(!root.join("main/new.txt").exists());

    // Over gRPC the same.
    let mut g = s.grpc().await;
    let t = g
        .list_tree(pb::ListTreeRequest {
            limit: None,
            session_id: Some(sid.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.files, ["new.txt", "other.txt"]);

    // An unknown session is 404 and nothing is read or written; an empty one is 400.
    let (status, e) = s.get("/fs/tree?session_id=nope").await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = s.get("/fs/file?path=main.txt&session_id=nope").await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = put(&s, json!({"path": "z.txt", "content": "z", "session_id": "nope"})).await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    assert!(!root.join("main/z.txt").exists());
    let (status, e) = s.get("/fs/tree?session_id=").await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
}

/// An opened workspace swapped for a symlink to a folder outside the roots
/// (or for another folder) after it was opened: every later use re-resolves
/// it and is refused, so nothing outside is read or written.
#[tokio::test]
async fn an_opened_workspace_swapped_for_a_symlink_is_refused_at_every_use() {
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret.txt", "TOP SECRET\n");
    let SecondWorkspace {
        s, root, other, sid, ..
    } = TestServer::with_second_workspace(|root| {
        write(&root.join("main"), "main.txt", "m\n");
        write(&root.join("other"), "other.txt", "o\n");
    })
    .await;
    let (status, _) = s.get(&format!("/fs/file?path=other.txt&session_id={sid}")).await;
    assert_eq!(status, 200);

    // The folder is swapped for a symlink to a folder outside the roots.
    std::fs::rename(root.join("other"), root.join("other-was")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("other")).unwrap();
    let refused = |status: u16, v: &Value| {
        assert_eq!(
            (status, code(v), v["error"]["reason"].as_str()),
            (403, "forbidden", Some("workspace_replaced")),
            "{v}"
        );
        assert!(!v.to_string().contains("TOP SECRET"), "{v}");
    };
    let (status, v) = s.post("/sessions", json!({"workspace": other})).await;
    refused(status, &v);
    let (status, v) = s.get(&format!("/fs/file?path=secret.txt&session_id={sid}")).await;
    refused(status, &v);
    let (status, v) = s.get(&format!("/fs/tree?session_id={sid}")).await;
    refused(status, &v);
    let (status, v) = put(
        &s,
        json!({"path": "planted.txt", "content": "x", "expected_sha": "", "session_id": sid}),
    )
    .await;
    refused(status, &v);
    let (status, v) = s.get(&format!("/sessions/{sid}/diff")).await;
    refused(status, &v);
    // The session's own tools are refused too.
    let mut sse = s.events(&sid, None).await;
    assert_eq!(s.run(&sid, "/read secret.txt\n/ls").await.0, 202);
    let frames = sse.until("run_finished").await;
    let results: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| f.body())
        .collect();
    assert_eq!(results.len(), 2, "{frames:?}");
    for r in results {
        assert_eq!(r["ok"], false, "{r}");
        assert!(
            r["output"].as_str().unwrap().contains("vak uses it no more"),
            "{r}"
        );
    }
    assert!(!support::all_text(&frames).contains("TOP SECRET"));
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing was written outside"
    );

    // Another folder at the same path is not the one opened either...
    std::fs::remove_file(root.join("other")).unwrap();
    write(&root.join("other"), "new.txt", "n\n");
    let (status, v) = s.post("/sessions", json!({"workspace": other})).await;
    refused(status, &v);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("another folder"),
        "{v}"
    );
    let (status, v) = s.get(&format!("/fs/tree?session_id={sid}")).await;
    refused(status, &v);
    // ...until the owner opens it again: new sessions work there; the old
    // session stays bound to the folder it was created in.
    let (status, w) = s
        .post("/workspaces/open", json!({"path": other, "trust": true}))
        .await;
    assert_eq!(status, 200, "{w}");
    let (status, c) = s.post("/sessions", json!({"workspace": other})).await;
    assert_eq!(status, 201, "{c}");
    let fresh = c["session_id"].as_str().unwrap();
    let (status, t) = s.get(&format!("/fs/tree?session_id={fresh}")).await;
    assert_eq!((status, &t["files"]), (200, &json!(["new.txt"])), "{t}");
    let (status, v) = s.get(&format!("/fs/tree?session_id={sid}")).await;
    refused(status, &v);
}

#[tokio::test]
async fn folders_are_listed_only_inside_the_workspace_roots() {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("proj/a")).unwrap();
    std::fs::create_dir_all(root.join("proj/b")).unwrap();
    std::fs::write(root.join("proj/file.txt"), "").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("proj/escape")).unwrap();
    let r = root.clone();
    let s = TestServer::start_with(move |c| c.core.workspace_roots = vec![r]).await;

    let (status, d) = s.get("/fs/dirs").await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["path"], root.display().to_string());
    assert_eq!(d["dirs"], json!(["proj"]));
    assert_eq!(d["roots"], json!([root.display().to_string()]));
    assert_eq!(d["parent"], "", "nothing above the root");
    let proj = root.join("proj").display().to_string();
    let (status, d) = s.get(&format!("/fs/dirs?path={}", q(&proj))).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["dirs"], json!(["a", "b"]), "no files, no symlinks");
    assert_eq!(d["parent"], root.display().to_string());
    let escape = root.join("proj/escape").display().to_string();
    let above = root.join("proj/../..").display().to_string();
    let outside_path = outside.path().display().to_string();
    for bad in [
        escape.as_str(),
        above.as_str(),
        outside_path.as_str(),
        "/",
        "proj",
    ] {
        let (status, e) = s.get(&format!("/fs/dirs?path={}", q(bad))).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{bad}: {e}");
    }
    let missing = root.join("nope").display().to_string();
    let (status, _) = s.get(&format!("/fs/dirs?path={}", q(&missing))).await;
    assert_eq!(status, 404);

    // Unset: the workspace alone.
    let s = TestServer::start().await;
    std::fs::create_dir(s.workspace.join("sub")).unwrap();
    let mut g = s.grpc().await;
    let d = g
        .list_dirs(pb::ListDirsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        d.roots,
        [s.workspace.canonicalize().unwrap().display().to_string()]
    );
    assert_eq!(d.dirs, ["sub"]);
}

#[tokio::test]
async fn the_diff_shows_status_staged_unstaged_and_untracked_changes() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let (status, d) = s.get(&format!("/sessions/{sid}/diff")).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["reason"], "not_a_git_repo");
    assert_eq!(d["files"], json!([]));

    let ws = &s.workspace;
    git(ws, &["init", "-q"]);
    write(ws, "kept.txt", "old line\n");
    write(ws, "staged.txt", "a\n");
    git(ws, &["add", "."]);
    git(ws, &["commit", "-q", "-m", "init"]);
    write(ws, "kept.txt", "new line\n");
    write(ws, "staged.txt", "b\n");
    git(ws, &["add", "staged.txt"]);
    write(ws, "fresh/untracked.txt", "brand new\n");

    let (status, d) = s.get(&format!("/sessions/{sid}/diff")).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["reason"], "", "{d}");
    assert_eq!(
        d["files"],
        json!([
            {"path": "kept.txt", "status": " M", "from": ""},
            {"path": "staged.txt", "status": "M ", "from": ""},
            {"path": "fresh/untracked.txt", "status": "??", "from": ""},
        ])
    );
    let diff = d["diff"].as_str().unwrap();
    for want in [
        "diff --git a/kept.txt b/kept.txt",
        "-old line\n+new line",
        "-a\n+b",
        "+++ b/fresh/untracked.txt",
        "+brand new",
    ] {
        assert!(diff.contains(want), "{want:?} in\n{diff}");
    }
    assert_eq!(d["truncated"], false);

    let (status, _) = s.get("/sessions/nosuch/diff").await;
    assert_eq!(status, 404);
    let mut g = s.grpc().await;
    let d = g
        .get_diff(pb::GetDiffRequest { session_id: sid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.files.len(), 3);
}

#[tokio::test]
async fn a_repository_config_that_names_programs_never_runs_them() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let ws = &s.workspace;
    git(ws, &["init", "-q"]);
    write(ws, "a.txt", "before\n");
    git(ws, &["add", "."]);
    git(ws, &["commit", "-q", "-m", "init"]);
    let elsewhere = tempfile::tempdir().unwrap();
    let marker = elsewhere.path().join("marker");
    let script = elsewhere.path().join("evil.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran \"$@\" >> {}\ncat\n", marker.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let evil = script.display().to_string();
    for (key, value) in [
        ("core.fsmonitor", evil.as_str()),
        ("diff.external", evil.as_str()),
        ("diff.x.textconv", evil.as_str()),
        ("diff.x.command", evil.as_str()),
        ("filter.x.clean", evil.as_str()),
        ("filter.x.smudge", evil.as_str()),
        ("filter.x.process", evil.as_str()),
        ("filter.we=ird.clean", evil.as_str()),
        ("core.pager", evil.as_str()),
    ] {
        git(ws, &["config", key, value]);
    }
    write(
        ws,
        ".git/info/attributes",
        "* filter=x diff=x\n*.txt filter=we=ird\n",
    );
    write(ws, "a.txt", "after\n");
    write(ws, "b.txt", "untracked\n");
    // The setup itself ran nothing yet.
    assert!(!marker.exists());

    let (status, d) = s.get(&format!("/sessions/{sid}/diff")).await;
    assert_eq!(status, 200, "{d}");
    let diff = d["diff"].as_str().unwrap();
    assert!(diff.contains("-before\n+after"), "{diff}");
    assert!(diff.contains("+untracked"), "{diff}");
    assert!(
        !marker.exists(),
        "git ran the repository's program: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

/// The partial-clone attack, planted by the model itself: in `accept-edits`
/// mode `write_file` needs no approval, so the model writes a `.git/config`
/// declaring a promisor remote whose transport runs a command (an ssh
/// command, then an `ext::` URL, each with its protocol allowed by the
/// repository) and a branch naming a commit that is not there. Computing
/// the diff must not fetch it: the marker never appears, and the diff
/// answers. The same setup then makes a plain git run the command, so the
/// test proves the attack was live.
#[tokio::test]
async fn a_partial_clone_config_planted_by_the_model_never_makes_the_diff_fetch() {
    let s = TestServer::start_with(|c| c.core.permission = vak::core::PermissionMode::AcceptEdits).await;
    let ws = &s.workspace;
    git(ws, &["init", "-q"]);
    write(ws, "a.txt", "before\n");
    git(ws, &["add", "."]);
    git(ws, &["commit", "-q", "-m", "init"]);
    write(ws, "a.txt", "after\n");
    let elsewhere = tempfile::tempdir().unwrap();
    let marker = elsewhere.path().join("marker");
    let touch = format!("touch {}", marker.display());
    for (remote, protocol) in [
        ("url = ssh://x/y\n\tpromisor = true".to_string(), "ssh"),
        (
            format!(
                "url = \"ext::sh -c {}\"\n\tpromisor = true",
                touch.replace(' ', "% ")
            ),
            "ext",
        ),
    ] {
        let config = format!(
            "[core]\n\trepositoryformatversion = 1\n\tbare = false\n\tsshCommand = {touch};\n\
             [extensions]\n\tpartialClone = origin\n\
             [protocol]\n\tallow = always\n[protocol \"{protocol}\"]\n\tallow = always\n\
             [remote \"origin\"]\n\t{remote}\n"
        );
        let prompt = format!(
            "/write {}\n/write .git/refs/heads/main {}\n",
            json!({"path": ".git/config", "content": config}),
            "1".repeat(40)
        );
        let sid = s.create_session().await;
        let mut sse = s.events(&sid, None).await;
        assert_eq!(s.run(&sid, &prompt).await.0, 202);
        let frames = sse.until("run_finished").await;
        support::assert_completed(&frames);
        assert_eq!(
            std::fs::read_to_string(ws.join(".git/config")).unwrap(),
            config,
            "the model wrote the config without asking"
        );

        let (status, d) = tokio::time::timeout(support::DEADLINE, s.get(&format!("/sessions/{sid}/diff")))
            .await
            .expect("the diff answers");
        assert!(status == 200 || status == 500, "{status} {d}");
        assert!(
            !marker.exists(),
            "the diff fetched from the promisor remote ({protocol}) and ran its command"
        );

        // The planted setup is live: git without vak's settings runs it.
        let _ = std::process::Command::new("git")
            .current_dir(ws)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["diff", "HEAD"])
            .output()
            .unwrap();
        assert!(marker.exists(), "plain git fetched through {protocol}");
        std::fs::remove_file(&marker).unwrap();
    }
}

#[tokio::test]
async fn without_git_the_reason_says_so() {
    let s = TestServer::start_with(|c| c.core.git = "/nonexistent/bin/git".into()).await;
    let sid = s.create_session().await;
    let (status, d) = s.get(&format!("/sessions/{sid}/diff")).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["reason"], "git_unavailable");
    assert!(d["message"].as_str().unwrap().contains("not installed"), "{d}");
}
