//! Dev servers against a real server: configs from .vak/launch.toml and package.json listed with their source, started in their own process group, their output on the session's stream and in its logs (tail and bounds), stopped with the whole group gone, a crash seen as running false with its exit code, and a session's deletion stopping its dev servers.

use crate::support::{self, TestServer, DEADLINE};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// A dev server that writes its pid (its group's id: `sh -c` leads the
/// group) and a child's pid, prints three lines and one on stderr, and
/// waits on the child.
const LAUNCH_TOML: &str = r#"
[[launch]]
name = "web"
command = "echo $$ > web.pid; sleep 1000 & echo $! > web.child; echo web-1; echo web-2; echo web-3; echo web-err >&2; echo $GREETING; wait"
env = { GREETING = "hello-from-env" }

[[launch]]
name = "crash"
command = "echo going-down; exit 3"

[[launch]]
name = "dev"
command = "echo shadowed"
cwd = "app"
"#;

const PACKAGE_JSON: &str = r#"{
  "name": "launch-test",
  "version": "1.0.0",
  "private": true,
  "scripts": {
    "dev": "echo not-this",
    "start": "echo $$ > npm.pid; echo npm-start-line; sleep 1000",
    "build": "echo never-listed"
  }
}"#;

fn workspace(ws: &Path) {
    std::fs::create_dir_all(ws.join(".vak")).unwrap();
    std::fs::create_dir_all(ws.join("app")).unwrap();
    std::fs::write(ws.join(".vak/launch.toml"), LAUNCH_TOML).unwrap();
    std::fs::write(ws.join("package.json"), PACKAGE_JSON).unwrap();
}

/// Whether a process of group `pgid` is alive (zombies, which nobody may
/// reap in a container, do not count).
fn group_alive(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        f.len() > 3 && f[0] != "Z" && f[0] != "X" && f[2] == pgid.to_string()
    })
}

/// Whether process `pid` is alive (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|st| {
            st.rsplit_once(')')
                .map(|(_, r)| r.split_whitespace().next() != Some("Z"))
        })
        .unwrap_or(false)
}

async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}");
        support::poll::pause().await;
    }
}

async fn read_pid(path: &Path) -> i32 {
    let mut pid = 0;
    until(&format!("{} written", path.display()), async || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    })
    .await;
    pid
}

fn config<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {list}"))
}

/// The text of the launch_output frames of `name` until `want` is in it.
async fn output_until(sse: &mut support::Sse, name: &str, want: &[&str]) -> String {
    let mut seen = String::new();
    while !want.iter().all(|w| seen.contains(w)) {
        let f = sse.next().await.expect("the stream goes on");
        if f.event == "launch_output" && f.body()["name"] == name {
            seen.push_str(&format!(
                "[{}]{}",
                f.body()["stream"].as_str().unwrap_or("?"),
                f.body()["text"].as_str().unwrap()
            ));
        }
    }
    seen
}

#[tokio::test]
async fn launch_toml_and_npm_configs_start_stream_log_and_stop_with_their_group() {
    let s = TestServer::start().await;
    workspace(&s.workspace);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let base = format!("/sessions/{sid}/launch");

    let (status, list) = s.get(&base).await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["web", "crash", "dev", "start"],
        "launch.toml first, its dev wins, no build"
    );
    assert_eq!(config(&list, "web")["source"], "launch_toml");
    assert_eq!(config(&list, "web")["env"]["GREETING"], "hello-from-env");
    assert_eq!(config(&list, "dev")["source"], "launch_toml");
    assert_eq!(config(&list, "dev")["cwd"], "app");
    assert_eq!(config(&list, "start")["source"], "npm");
    assert_eq!(config(&list, "start")["command"], "npm run start");
    assert_ne!(config(&list, "web")["running"], true);

    // Refusals: no name, an unknown name.
    let (status, e) = s.post(&format!("{base}/start"), json!({})).await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = s.post(&format!("{base}/start"), json!({"name": "nope"})).await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["reason"], "launch_not_found");

    let (status, started) = s.post(&format!("{base}/start"), json!({"name": "web"})).await;
    assert_eq!(status, 200, "{started}");
    assert_eq!(started["name"], "web");
    let pid = started["pid"].as_i64().unwrap() as i32;
    let (status, e) = s.post(&format!("{base}/start"), json!({"name": "web"})).await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["error"]["reason"], "launch_running");

    // Its own process group, led by the `sh -c` whose pid the answer names.
    assert_eq!(read_pid(&s.workspace.join("web.pid")).await, pid);
    let child = read_pid(&s.workspace.join("web.child")).await;
    let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap();
    let pgrp = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(2)
        .unwrap();
    assert_eq!(pgrp, pid.to_string(), "the child is in the dev server's group");

    let seen = output_until(&mut sse, "web", &["web-1", "web-3", "web-err", "hello-from-env"]).await;
    assert!(seen.contains("[stdout]web-1\n"), "{seen}");
    assert!(seen.contains("[stderr]web-err\n"), "{seen}");

    let (status, logs) = s.get(&format!("{base}/logs?name=web")).await;
    assert_eq!(status, 200, "{logs}");
    let texts: Vec<&str> = logs["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    for want in ["web-1", "web-2", "web-3", "web-err", "hello-from-env"] {
        assert!(texts.contains(&want), "{want} in {logs}");
    }
    assert_eq!(logs["running"], true);
    assert_eq!(logs["max_lines"], 1000);
    assert_eq!(logs["max_bytes"], 256 * 1024);
    let (_, tail) = s.get(&format!("{base}/logs?name=web&tail=2")).await;
    assert_eq!(tail["lines"].as_array().unwrap().len(), 2, "{tail}");
    let (status, e) = s.get(&format!("{base}/logs?name=nope")).await;
    assert_eq!(status, 404, "{e}");

    let (_, list) = s.get(&base).await;
    assert_eq!(config(&list, "web")["running"], true);
    assert_eq!(config(&list, "web")["pid"].as_i64().unwrap() as i32, pid);
    assert!(config(&list, "web")["started_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    // The npm script, through `npm run start`.
    let (status, npm) = s.post(&format!("{base}/start"), json!({"name": "start"})).await;
    assert_eq!(status, 200, "{npm}");
    let npm_pgid = npm["pid"].as_i64().unwrap() as i32;
    output_until(&mut sse, "start", &["npm-start-line"]).await;
    let (_, logs) = s.get(&format!("{base}/logs?name=start")).await;
    assert!(logs.to_string().contains("npm-start-line"), "{logs}");
    let script = read_pid(&s.workspace.join("npm.pid")).await;
    assert!(group_alive(npm_pgid));

    // Stopping ends the whole group: the leader, its child, npm's script.
    let (status, stopped) = s.post(&format!("{base}/stop"), json!({"name": "web"})).await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["was_running"], true);
    until("web's group gone", async || !group_alive(pid)).await;
    assert!(!group_alive(pid));
    let (status, stopped) = s.post(&format!("{base}/stop"), json!({"name": "start"})).await;
    assert_eq!(status, 200, "{stopped}");
    until("npm's group gone", async || !group_alive(npm_pgid)).await;
    assert!(!alive(script), "npm's script went with its group");

    let (_, list) = s.get(&base).await;
    assert_ne!(config(&list, "web")["running"], true, "{list}");
    assert!(config(&list, "web")["pid"].as_u64().unwrap_or(0) == 0, "{list}");
    assert!(
        config(&list, "web").get("exit_code").is_none(),
        "stopped, not exited: {list}"
    );
    let (_, again) = s.post(&format!("{base}/stop"), json!({"name": "web"})).await;
    assert_ne!(again["was_running"], true, "{again}");
    let (_, logs) = s.get(&format!("{base}/logs?name=web")).await;
    assert_ne!(logs["running"], true);
    assert!(
        logs.to_string().contains("web-3"),
        "the logs outlive the run: {logs}"
    );
}

#[tokio::test]
async fn a_crashed_dev_server_shows_running_false_and_its_exit_code() {
    let s = TestServer::start().await;
    workspace(&s.workspace);
    let sid = s.create_session().await;
    let base = format!("/sessions/{sid}/launch");
    let (status, started) = s.post(&format!("{base}/start"), json!({"name": "crash"})).await;
    assert_eq!(status, 200, "{started}");
    let mut list = Value::Null;
    until("crash ended", async || {
        list = s.get(&base).await.1;
        config(&list, "crash")["running"] != true
    })
    .await;
    assert_eq!(config(&list, "crash")["exit_code"], 3, "{list}");
    let (_, logs) = s.get(&format!("{base}/logs?name=crash")).await;
    assert!(logs.to_string().contains("going-down"), "{logs}");
    // It can be started again.
    let (status, _) = s.post(&format!("{base}/start"), json!({"name": "crash"})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn deleting_the_session_stops_its_dev_servers_and_a_bad_launch_file_is_400() {
    let s = TestServer::start().await;
    workspace(&s.workspace);
    let sid = s.create_session().await;
    let base = format!("/sessions/{sid}/launch");
    let (status, started) = s.post(&format!("{base}/start"), json!({"name": "web"})).await;
    assert_eq!(status, 200, "{started}");
    let pid = started["pid"].as_i64().unwrap() as i32;
    read_pid(&s.workspace.join("web.child")).await;
    assert!(group_alive(pid));
    let (status, d) = s.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 200, "{d}");
    until("the deleted session's dev server gone", async || {
        !group_alive(pid)
    })
    .await;
    let (status, _) = s.get(&base).await;
    assert_eq!(status, 404, "a deleted session has no launch configs");

    let other = s.create_session().await;
    std::fs::write(
        s.workspace.join(".vak/launch.toml"),
        "[[launch]]\nname = \"x\"\ncommand = \"true\"\nport = 3\n",
    )
    .unwrap();
    let (status, e) = s.get(&format!("/sessions/{other}/launch")).await;
    assert_eq!(status, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("line 4") && msg.contains("port"), "{msg}");
}

#[tokio::test]
async fn the_servers_stop_ends_every_dev_server() {
    let s = TestServer::start().await;
    workspace(&s.workspace);
    let sid = s.create_session().await;
    let (status, started) = s
        .post(&format!("/sessions/{sid}/launch/start"), json!({"name": "web"}))
        .await;
    assert_eq!(status, 200, "{started}");
    let pid = started["pid"].as_i64().unwrap() as i32;
    let child = read_pid(&s.workspace.join("web.child")).await;
    assert!(group_alive(pid) && alive(child));
    tokio::time::timeout(DEADLINE, s.hub().shutdown(std::time::Duration::from_secs(5)))
        .await
        .expect("the hub stops within the deadline");
    // The stop answers once the leader is reaped; the rest of the group follows.
    assert!(!alive(pid), "the leader is gone when shutdown returns");
    until("the group gone after shutdown", async || !group_alive(pid)).await;
    assert!(!alive(child));
}

#[tokio::test]
async fn a_flood_streams_8_mib_then_one_line_and_the_ring_keeps_the_latest_256_kib() {
    let s = TestServer::start().await;
    std::fs::create_dir_all(s.workspace.join(".vak")).unwrap();
    std::fs::write(
        s.workspace.join(".vak/launch.toml"),
        "[[launch]]\nname = \"flood\"\ncommand = \"head -c 9000000 /dev/zero | tr '\\\\0' x | fold -w 4000; echo; echo the-end\"\n",
    )
    .unwrap();
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (status, started) = s
        .post(&format!("/sessions/{sid}/launch/start"), json!({"name": "flood"}))
        .await;
    assert_eq!(status, 200, "{started}");
    let mut streamed = 0usize;
    let note = loop {
        let f = sse.next().await.expect("the stream goes on");
        if f.event != "launch_output" {
            continue;
        }
        let text = f.body()["text"].as_str().unwrap().to_string();
        if text.starts_with("[vak: ") {
            break text;
        }
        assert!(!text.contains("the-end"), "past the cap nothing more is streamed");
        streamed += text.len();
    };
    assert!(note.contains("only in its logs"), "{note}");
    assert!(
        (8 << 20..(8 << 20) + (128 << 10)).contains(&streamed),
        "{streamed}"
    );
    let mut logs = serde_json::Value::Null;
    until("the flood ended", async || {
        logs = s.get(&format!("/sessions/{sid}/launch/logs?name=flood")).await.1;
        logs["running"] != true
    })
    .await;
    let lines = logs["lines"].as_array().unwrap();
    assert_eq!(lines.last().unwrap()["text"], "the-end");
    let kept: usize = lines.iter().map(|l| l["text"].as_str().unwrap().len()).sum();
    assert!(kept <= 256 << 10, "{kept}");
    assert_eq!(
        lines.len() as u64 + logs["dropped"].as_u64().unwrap(),
        2251,
        "every line counted once"
    );
}

#[tokio::test]
async fn over_grpc_a_dev_server_is_listed_started_logged_and_stopped() {
    use vak::proto::v1 as pb;
    let s = TestServer::start().await;
    workspace(&s.workspace);
    let sid = s.create_session().await;
    let mut g = s.grpc().await;
    let list = g
        .list_launch(pb::ListLaunchRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let sources: Vec<(String, pb::LaunchSource)> = list
        .configs
        .iter()
        .map(|c| (c.name.clone(), c.source()))
        .collect();
    assert_eq!(sources[0], ("web".into(), pb::LaunchSource::LaunchToml));
    assert_eq!(sources[3], ("start".into(), pb::LaunchSource::Npm));
    let started = g
        .start_launch(pb::StartLaunchRequest {
            session_id: sid.clone(),
            name: "web".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let again = g
        .start_launch(pb::StartLaunchRequest {
            session_id: sid.clone(),
            name: "web".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
    read_pid(&s.workspace.join("web.child")).await;
    let mut logs = pb::LaunchLogs::default();
    until("web's lines in its logs", async || {
        logs = g
            .get_launch_logs(pb::GetLaunchLogsRequest {
                session_id: sid.clone(),
                name: "web".into(),
                tail: 0,
            })
            .await
            .unwrap()
            .into_inner();
        logs.lines.iter().any(|l| l.text == "web-err")
    })
    .await;
    let err = logs.lines.iter().find(|l| l.text == "web-err").unwrap();
    assert_eq!(err.stream(), pb::OutputStream::Stderr);
    assert_eq!((logs.max_lines, logs.max_bytes), (1000, 256 << 10));
    let stopped = g
        .stop_launch(pb::StopLaunchRequest {
            session_id: sid.clone(),
            name: "web".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stopped.was_running);
    until("web's group gone", async || !group_alive(started.pid as i32)).await;
    let unknown = g
        .stop_launch(pb::StopLaunchRequest {
            session_id: sid,
            name: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}
