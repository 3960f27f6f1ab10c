//! Backup export and import: a live server's home copied out with a manifest of sha256s, secrets only when asked and then still encrypted, and brought into a fresh home where every session replays identically; the home itself, tampered files and conflicts are refused or handled; `vak backup` does the same offline and refuses a running home.

use crate::support::process::vak;
use crate::support::serve::Serve;
use crate::support::TestServer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

/// A key string that must never appear in plaintext in a backup.
const KEY: &str = "sk-backup-test-0123456789abcdef";

/// A server whose tools run without approvals, so runs finish on their own.
async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.core.permission = PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await
}

/// Runs `prompt` in `sid` to its end.
async fn run_to_end(s: &TestServer, sid: &str, prompt: &str) {
    let mut sse = s.events(sid, None).await;
    let after = s.latest_seq(sid).await;
    let (code, v) = s.run(sid, prompt).await;
    assert_eq!(code, 202, "{v}");
    loop {
        let f = sse.until("run_finished").await.pop().unwrap();
        if f.seq() > after {
            return;
        }
    }
}

/// Two sessions with runs, one with a tool call; returns their ids.
async fn two_sessions(s: &TestServer) -> Vec<String> {
    let a = s.create_session().await;
    run_to_end(s, &a, "/bash echo from-a-tool").await;
    run_to_end(s, &a, "a second prompt").await;
    let b = s.create_session().await;
    run_to_end(s, &b, "hello from b").await;
    let mut ids = vec![a, b];
    ids.sort();
    ids
}

/// Every frame of `sid` replayed from seq 0 up to its latest: (seq, kind, data).
async fn replay(s: &TestServer, sid: &str) -> Vec<(u64, String, Value)> {
    let latest = s.latest_seq(sid).await;
    let mut sse = s.events(sid, Some(0)).await;
    let mut out = Vec::new();
    while out.last().is_none_or(|(seq, _, _)| *seq < latest) {
        let f = sse.next().await.expect("the replay reaches the latest seq");
        if f.id.is_some() {
            out.push((f.seq(), f.event.clone(), f.data.clone()));
        }
    }
    out
}

/// What a client sees of `sid`: its transcript and its replay.
async fn seen(s: &TestServer, sid: &str) -> (Value, Vec<(u64, String, Value)>) {
    let (code, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200, "{t}");
    (t, replay(s, sid).await)
}

fn sha256(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files_under(&e.path()));
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    out
}

/// Checks `dir/manifest.json` against the files beside it; returns it.
fn verified_manifest(dir: &Path) -> Value {
    let m: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["format"], "vak-backup");
    assert_eq!(m["version"], 1);
    assert!(m["vak_version"].as_str().is_some_and(|v| !v.is_empty()), "{m}");
    assert!(m["created_at"].as_str().is_some_and(|v| !v.is_empty()), "{m}");
    let listed: Vec<&Value> = m["files"].as_array().unwrap().iter().collect();
    for f in &listed {
        let bytes = std::fs::read(dir.join(f["path"].as_str().unwrap())).unwrap();
        assert_eq!(f["size"].as_u64().unwrap(), bytes.len() as u64, "{f}");
        assert_eq!(f["sha256"].as_str().unwrap(), sha256(&bytes), "{f}");
    }
    // Nothing unlisted but the manifest itself.
    assert_eq!(files_under(dir).len(), listed.len() + 1);
    m
}

fn paths(m: &Value) -> Vec<String> {
    m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect()
}

/// Whether any file under `dir` holds `needle`.
fn any_file_holds(dir: &Path, needle: &str) -> bool {
    files_under(dir).iter().any(|p| {
        let bytes = std::fs::read(p).unwrap();
        bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
    })
}

fn reason(v: &Value) -> &str {
    v["error"]["reason"].as_str().unwrap_or_default()
}

fn actions(v: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = v["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|s| {
            (
                s["session_id"].as_str().unwrap().to_string(),
                s["imported_as"].as_str().unwrap().to_string(),
                s["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_live_export_imported_into_a_fresh_home_replays_every_session_identically() {
    let s = server().await;
    s.store_key("openai", KEY).await;
    let ids = two_sessions(&s).await;
    let out = tempfile::tempdir().unwrap();
    let plain = out.path().join("plain");

    // Exported while the server runs.
    let (code, v) = s
        .post("/backup/export", json!({"dest_dir": plain.display().to_string()}))
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["sessions"], 2, "{v}");
    assert_eq!(v["manifest"], plain.join("manifest.json").display().to_string());
    let m = verified_manifest(&plain);
    assert_eq!(v["files"].as_u64().unwrap(), paths(&m).len() as u64 + 1);
    assert_eq!(m["include_secrets"], false);
    assert_eq!(m["sessions"], json!(ids));
    for id in &ids {
        assert!(paths(&m).contains(&format!("sessions/{id}.jsonl")), "{m}");
    }
    assert!(!paths(&m).iter().any(|p| p.starts_with("secrets/")), "{m}");
    assert!(!plain.join("secrets").exists());
    assert!(!any_file_holds(&plain, KEY));

    // With the secrets: the encrypted store and what opens it, never the key itself.
    let secret = out.path().join("secret");
    let (code, v) = s
        .post(
            "/backup/export",
            json!({"dest_dir": secret.display().to_string(), "include_secrets": true}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let m = verified_manifest(&secret);
    assert_eq!(m["include_secrets"], true);
    for p in ["secrets/keys.enc", "secrets/master.key"] {
        assert!(paths(&m).contains(&p.to_string()), "{m}");
    }
    assert!(
        !any_file_holds(&secret, KEY),
        "the key is in a backup in plaintext"
    );

    // A fresh server on a fresh home takes the backup in.
    let fresh = server().await;
    let (code, v) = fresh
        .post("/backup/import", json!({"src_dir": plain.display().to_string()}))
        .await;
    assert_eq!(code, 200, "{v}");
    let imported: Vec<_> = ids
        .iter()
        .map(|id| (id.clone(), id.clone(), "imported".to_string()))
        .collect();
    assert_eq!(actions(&v), imported);
    let (_, list) = fresh.get("/sessions").await;
    for id in &ids {
        assert!(
            list["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["session_id"] == *id),
            "{id} is listed: {list}"
        );
        assert_eq!(seen(&fresh, id).await, seen(&s, id).await, "session {id}");
    }

    // Again: skip keeps the home's sessions; rename brings copies in under new ids.
    let (code, v) = fresh
        .post(
            "/backup/import",
            json!({"src_dir": plain.display().to_string(), "conflict": "skip"}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let skipped: Vec<_> = ids
        .iter()
        .map(|id| (id.clone(), id.clone(), "skipped".to_string()))
        .collect();
    assert_eq!(actions(&v), skipped);
    let (code, v) = fresh
        .post(
            "/backup/import",
            json!({"src_dir": plain.display().to_string(), "conflict": "rename"}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    for (from, to, action) in actions(&v) {
        assert_eq!(action, "renamed");
        assert_ne!(from, to);
        let (t_new, r_new) = seen(&fresh, &to).await;
        let (t_old, r_old) = seen(&s, &from).await;
        assert_eq!(t_new["entries"], t_old["entries"], "{from} as {to}");
        // The same events under the same seqs, only in the new session.
        let without_id = |r: Vec<(u64, String, Value)>| -> Vec<(u64, String, Value)> {
            r.into_iter()
                .map(|(seq, kind, mut data)| {
                    data.as_object_mut().unwrap().remove("session_id");
                    (seq, kind, data)
                })
                .collect()
        };
        assert_eq!(r_new.last().unwrap().2["session_id"], to);
        assert_eq!(without_id(r_new), without_id(r_old), "{from} as {to}");
    }
    // The same over gRPC: the conflict is an enum; an unknown number is refused.
    let mut g = fresh.grpc().await;
    let r = g
        .import_backup(pb::ImportBackupRequest {
            src_dir: plain.display().to_string(),
            conflict: pb::BackupConflict::Skip as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.sessions.len(), 2);
    assert!(
        r.sessions
            .iter()
            .all(|x| x.action == pb::ImportAction::Skipped as i32),
        "{r:?}"
    );
    let e = g
        .import_backup(pb::ImportBackupRequest {
            src_dir: plain.display().to_string(),
            conflict: 99,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Overwriting a session loaded on the server is refused.
    let (code, v) = fresh
        .post(
            "/backup/import",
            json!({"src_dir": plain.display().to_string(), "conflict": "overwrite"}),
        )
        .await;
    assert_eq!((code, reason(&v)), (409, "session_live"), "{v}");

    // After a restart nothing is loaded: overwrite replaces the sessions whole.
    let (home, ws) = fresh.stop().await.unwrap();
    let again = TestServer::start_in(home.path(), ws.path(), |c| {
        c.core.permission = PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await;
    run_to_end(&again, &ids[0], "a prompt the backup does not have").await;
    let (code, v) = again
        .post(
            "/backup/import",
            json!({"src_dir": plain.display().to_string(), "conflict": "overwrite"}),
        )
        .await;
    assert_eq!(
        (code, reason(&v)),
        (409, "session_live"),
        "the one just used is loaded: {v}"
    );
    assert!(again.stop().await.is_none());
    let again = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (code, v) = again
        .post(
            "/backup/import",
            json!({"src_dir": plain.display().to_string(), "conflict": "overwrite"}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let overwritten: Vec<_> = ids
        .iter()
        .map(|id| (id.clone(), id.clone(), "overwritten".to_string()))
        .collect();
    assert_eq!(actions(&v), overwritten);
    for id in &ids {
        assert_eq!(seen(&again, id).await, seen(&s, id).await, "session {id}");
        assert_eq!(again.latest_seq(id).await, s.latest_seq(id).await);
    }
}

#[tokio::test]
async fn the_home_relative_paths_used_folders_and_tampered_backups_are_refused() {
    let s = server().await;
    let ids = two_sessions(&s).await;
    let home = s.home.canonicalize().unwrap();
    let export = |dest: String| {
        let s = &s;
        async move { s.post("/backup/export", json!({ "dest_dir": dest })).await }
    };
    for (dest, why) in [
        (home.display().to_string(), "inside_home"),
        (home.join("backup").display().to_string(), "inside_home"),
        ("relative/dir".to_string(), "relative_path"),
    ] {
        let (code, v) = export(dest.clone()).await;
        assert_eq!((code, reason(&v)), (400, why), "{dest}: {v}");
    }
    assert!(!home.join("backup").exists());
    let out = tempfile::tempdir().unwrap();
    let good = out.path().join("good");
    let (code, v) = export(good.display().to_string()).await;
    assert_eq!(code, 200, "{v}");
    // A folder with something in it is not overwritten.
    let (code, v) = export(good.display().to_string()).await;
    assert_eq!((code, reason(&v)), (400, "dest_not_empty"), "{v}");

    let import = |src: String| {
        let s = &s;
        async move { s.post("/backup/import", json!({ "src_dir": src })).await }
    };
    // Into the home itself, or from inside it.
    let (code, v) = import(home.display().to_string()).await;
    assert_eq!((code, reason(&v)), (400, "inside_home"), "{v}");
    let (code, v) = import(home.join("sessions").display().to_string()).await;
    assert_eq!((code, reason(&v)), (400, "inside_home"), "{v}");
    // A folder without a manifest holds no backup.
    let (code, v) = import(out.path().join("nothing").display().to_string()).await;
    assert_eq!((code, reason(&v)), (404, "no_manifest"), "{v}");

    // One flipped byte in a ledger: refused naming the file, nothing imported.
    let tampered = out.path().join("tampered");
    std::fs::create_dir(&tampered).unwrap();
    let status = std::process::Command::new("cp")
        .args([
            "-a",
            &format!("{}/.", good.display()),
            &tampered.display().to_string(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let victim = tampered.join(format!("sessions/{}.jsonl", ids[1]));
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&victim, bytes).unwrap();
    let fresh = server().await;
    let (code, v) = fresh
        .post(
            "/backup/import",
            json!({"src_dir": tampered.display().to_string()}),
        )
        .await;
    assert_eq!((code, reason(&v)), (400, "manifest_mismatch"), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("sessions/{}.jsonl", ids[1])),
        "{message}"
    );
    let (_, list) = fresh.get("/sessions").await;
    assert_eq!(list["sessions"], json!([]), "{list}");
    // No staging folder is left in the home.
    let left: Vec<_> = std::fs::read_dir(&fresh.home)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".import-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `vak backup ARGS`: exit code, stdout, stderr.
async fn vak_backup(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["backup"];
    all.extend_from_slice(args);
    let out = vak(&all).output().await.unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn vak_backup_works_offline_on_a_stopped_home_and_refuses_a_running_one() {
    let s = server().await;
    let ids = two_sessions(&s).await;
    let mut before = Vec::new();
    for id in &ids {
        before.push(seen(&s, id).await);
    }
    let (code, note) = s
        .post(
            "/memory",
            json!({"text": "BACKUP-NOTE: call me Sam", "scope": "user"}),
        )
        .await;
    assert_eq!(code, 201, "{note}");
    let (home, _ws) = s.stop().await.unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("b");
    let (code, stdout, stderr) = vak_backup(&[
        "export",
        dir.to_str().unwrap(),
        "--home",
        home.path().to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("exported 2 sessions"), "{stdout}");
    verified_manifest(&dir);
    // A relative DIR is taken from the current directory.
    let out2 = vak(&["backup", "export", "rel", "--home", home.path().to_str().unwrap()])
        .current_dir(out.path())
        .output()
        .await
        .unwrap();
    assert!(out2.status.success(), "{}", String::from_utf8_lossy(&out2.stderr));
    assert_eq!(verified_manifest(&out.path().join("rel"))["sessions"], json!(ids));

    // Into a fresh home, then served there: the same sessions, the same events.
    let to_home = tempfile::tempdir().unwrap();
    let to_ws = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = vak_backup(&[
        "import",
        dir.to_str().unwrap(),
        "--home",
        to_home.path().to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    for id in &ids {
        assert!(stdout.contains(&format!("imported    {id}")), "{stdout}");
    }
    assert!(stdout.contains("restored    USER.md"), "{stdout}");
    let served = TestServer::start_in(to_home.path(), to_ws.path(), |_| {}).await;
    for (id, was) in ids.iter().zip(&before) {
        assert_eq!(&seen(&served, id).await, was, "session {id}");
    }
    let (code, memory) = served.get("/memory").await;
    assert_eq!(code, 200, "{memory}");
    assert!(
        memory.to_string().contains("BACKUP-NOTE: call me Sam"),
        "{memory}"
    );
    drop(served);

    // A home a server runs on is refused, naming the server.
    let running = Serve::new().start().await;
    let h = running.dirs.home().to_str().unwrap().to_string();
    let (code, _, stderr) =
        vak_backup(&["export", out.path().join("c").to_str().unwrap(), "--home", &h]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("a server is running on the home"), "{stderr}");
    assert!(stderr.contains(&running.url), "{stderr}");
    assert!(!out.path().join("c").exists());
    let (code, _, stderr) = vak_backup(&["import", dir.to_str().unwrap(), "--home", &h]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("POST /backup/import"), "{stderr}");
}

#[tokio::test]
async fn an_export_during_a_run_copies_a_committed_prefix_of_its_ledger() {
    let s = server().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // Ten seconds of deltas, cancelled once the export is done.
    let (code, v) = s.run(&sid, "/pace 2000 200").await;
    assert_eq!(code, 202, "{v}");
    sse.until("text_delta").await;
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("b");
    let (code, v) = s
        .post("/backup/export", json!({"dest_dir": dest.display().to_string()}))
        .await;
    assert_eq!(code, 200, "{v}");
    let (code, v) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!(code, 200, "{v}");
    sse.until("run_finished").await;
    verified_manifest(&dest);

    let copy = std::fs::read(dest.join(format!("sessions/{sid}.jsonl"))).unwrap();
    let live = std::fs::read(s.home.join(format!("sessions/{sid}.jsonl"))).unwrap();
    assert!(live.starts_with(&copy), "the copy is a prefix of the ledger");
    assert_eq!(copy.last(), Some(&b'\n'), "no torn last line");
    let text = String::from_utf8(copy).unwrap();
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
    assert!(text.contains("text_delta"), "the run had begun");
    assert!(!text.contains("run_finished"), "the copy was taken mid-run");

    // It loads: the cut-off run is settled like one a crash cut off.
    let fresh = server().await;
    let (code, v) = fresh
        .post("/backup/import", json!({"src_dir": dest.display().to_string()}))
        .await;
    assert_eq!(code, 200, "{v}");
    let (code, t) = fresh.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200, "{t}");
    assert!(t.to_string().contains("/pace 2000 200"), "{t}");
    let cut = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["event"]["seq"].as_u64())
        .max()
        .unwrap();
    assert!(fresh.latest_seq(&sid).await >= cut);
}
