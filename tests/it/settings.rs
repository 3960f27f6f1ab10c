//! The settings `PATCH /config` changes besides the route, end to end: max_turns (the next run stops after that many turns), theme and hooks, each shown by `GET /config` with its source (flag, file, api, default), one revision for all of them (a stale one is 409), bad values refused naming the field, and config.toml written keeping the rest of the file byte for byte and read back at the next start.

use crate::support::{self, Serve, TestServer};
use serde_json::{json, Value};
use vak::core::PermissionMode;

/// `hooks` as GET /config shows it: every event, an empty list when it has none.
fn shown(hooks: Value) -> Value {
    let mut all = json!({"pre_tool_use": [], "post_tool_use": [], "session_start": [], "stop": []});
    for (k, v) in hooks.as_object().unwrap() {
        all[k] = v.clone();
    }
    all
}

async fn patch(s: &TestServer, body: Value) -> (u16, Value) {
    s.send(reqwest::Method::PATCH, "/config", Some(body)).await
}

#[tokio::test]
async fn get_config_shows_each_setting_with_its_source() {
    let s = TestServer::start().await;
    let (st, v) = s.get("/config").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["max_turns"], &v["max_turns_source"]),
        (&json!(50), &json!("default"))
    );
    assert_eq!(
        (&v["theme"], &v["theme_source"]),
        (&json!("system"), &json!("default"))
    );
    assert_eq!(
        (&v["hooks"], &v["hooks_source"]),
        (&shown(json!({})), &json!("default")),
        "{v}"
    );

    // The real binary: --max-turns is a flag, and it wins over the file.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        "[agent]\nmax_turns = 9\n\n[app]\ntheme = \"light\"\n\n[[hooks.stop]]\ncommand = \"true\"\ntimeout_ms = 500\n",
    )
    .unwrap();
    let served = Serve::new()
        .home(home.path())
        .args(["--max-turns", "7"])
        .start()
        .await;
    let (st, v) = served.api().get("/config").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["max_turns"], &v["max_turns_source"]),
        (&json!(7), &json!("flag"))
    );
    assert_eq!(
        (&v["theme"], &v["theme_source"]),
        (&json!("light"), &json!("file"))
    );
    assert_eq!(
        (&v["hooks"], &v["hooks_source"]),
        (
            &shown(json!({"stop": [{"command": "true", "timeout_ms": 500}]})),
            &json!("file")
        )
    );
    drop(served);
    let served = Serve::new().home(home.path()).start().await;
    let (_, v) = served.api().get("/config").await;
    assert_eq!(
        (&v["max_turns"], &v["max_turns_source"]),
        (&json!(9), &json!("file"))
    );
}

#[tokio::test]
async fn an_unknown_key_or_a_bad_value_in_the_files_sections_stops_startup_naming_it() {
    for (text, named) in [
        ("[agent]\nmax_turn = 3\n", "max_turn"),
        ("[agent]\nmax_turns = 0\n", "[agent] max_turns"),
        ("[app]\ntheme = \"purple\"\n", "purple"),
        (
            "[[hooks.pre_tool_use]]\ncommand = \"x\"\nmatcher = \"(\"\n",
            "[hooks].pre_tool_use[0].matcher",
        ),
        ("[[hooks.pre_tool_use]]\ncomand = \"x\"\n", "comand"),
    ] {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("config.toml"), text).unwrap();
        let out = Serve::new().home(home.path()).output().await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(stderr.contains(named), "{text}: {stderr}");
    }
}

#[tokio::test]
async fn patch_max_turns_stops_the_next_run_after_that_many_turns() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await;
    let (st, v) = patch(&s, json!({"max_turns": 3})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["max_turns"], &v["max_turns_source"]),
        (&json!(3), &json!("api"))
    );
    // Each /bash line is one model turn that calls a tool: four want a fifth turn.
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    s.run(&sid, "/bash echo 1\n/bash echo 2\n/bash echo 3\n/bash echo 4")
        .await;
    let frames = ev.until("run_finished").await;
    let end = support::finished(&frames);
    assert_eq!(end["outcome"], "max_turns", "{frames:#?}");
    assert!(
        end["message"].as_str().unwrap().contains("3 model turns"),
        "{end}"
    );
    let results = frames.iter().filter(|f| f.event == "tool_result").count();
    assert_eq!(results, 3);
}

#[tokio::test]
async fn every_setting_shares_the_one_revision_and_a_stale_one_is_409() {
    let s = TestServer::start().await;
    let (_, v) = s.get("/config").await;
    let rev0 = v["revision"].as_str().unwrap().to_string();
    let (st, v) = patch(&s, json!({"theme": "dark", "revision": rev0})).await;
    assert_eq!(st, 200, "{v}");
    let rev1 = v["revision"].as_str().unwrap().to_string();
    assert_ne!(rev1, rev0);
    assert_eq!((&v["theme"], &v["theme_source"]), (&json!("dark"), &json!("api")));
    // The route keeps its own source: only the theme changed.
    assert_eq!(v["route"]["source"], "default");
    for stale in [
        json!({"max_turns": 4, "revision": rev0}),
        json!({"hooks": {}, "revision": rev0}),
        json!({"model": "offline", "revision": rev0}),
    ] {
        let (st, v) = patch(&s, stale.clone()).await;
        assert_eq!(st, 409, "{stale}: {v}");
    }
    // If-Match is the body's revision.
    let r = s
        .http()
        .patch(format!("{}/config", s.url))
        .header("if-match", format!("\"{rev0}\""))
        .json(&json!({"max_turns": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let r = s
        .http()
        .patch(format!("{}/config", s.url))
        .header("if-match", format!("\"{rev1}\""))
        .json(&json!({"max_turns": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_ne!(v["revision"], json!(rev1));
    assert_eq!((&v["max_turns"], &v["theme"]), (&json!(4), &json!("dark")));
    let (_, v) = s.get("/config").await;
    assert_eq!((&v["max_turns"], &v["theme"]), (&json!(4), &json!("dark")));
}

#[tokio::test]
async fn a_bad_value_is_400_naming_its_field_and_changes_nothing() {
    let s = TestServer::start().await;
    let (_, before) = s.get("/config").await;
    for (body, named) in [
        (json!({"max_turns": 0}), "max_turns"),
        (json!({"max_turns": 1001}), "max_turns"),
        (json!({"theme": "purple"}), "theme"),
        (json!({"theme": "THEME_UNSPECIFIED"}), "theme"),
        (
            json!({"hooks": {"pre_tool_use": [{"command": "true", "matcher": "(unclosed"}]}}),
            "hooks.pre_tool_use[0].matcher",
        ),
        (
            json!({"hooks": {"stop": [{"command": "true", "timeout_ms": 600001}]}}),
            "hooks.stop[0].timeout_ms",
        ),
        (
            json!({"hooks": {"stop": [{"command": ""}]}}),
            "hooks.stop[0].command",
        ),
        (
            json!({"hooks": {"stop": vec![json!({"command": "true"}); 17]}}),
            "hooks.stop",
        ),
        (json!({"hooks": {"start": []}}), "start"),
    ] {
        let (st, v) = patch(&s, body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default().to_string() + &v.to_string();
        assert!(message.contains(named), "{body}: {v}");
    }
    let (_, after) = s.get("/config").await;
    assert_eq!(after, before);
}

#[tokio::test]
async fn patch_writes_config_toml_keeping_the_rest_byte_for_byte_and_a_restart_reads_it_back() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let original = "# my settings\n[server]\ntrusted_hosts = [\"example.test\"] # keep me\n\n# the agent\n[agent]\nmax_turns = 20 # was twenty\n\n[model]\n# offline for now\nprovider = \"offline\"\n\n[finops]\nmax_day_usd = 5\n";
    let conf = home.path().join("config.toml");
    std::fs::write(&conf, original).unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (_, v) = s.get("/config").await;
    assert_eq!(
        (&v["max_turns"], &v["max_turns_source"]),
        (&json!(20), &json!("file"))
    );
    let hooks = json!({
        "pre_tool_use": [{"command": "echo \"quoted\" >&2; exit 2", "matcher": "^bash$", "timeout_ms": 1500}],
        "stop": [{"command": "true"}]
    });
    let (st, v) = patch(&s, json!({"max_turns": 7, "theme": "dark", "hooks": hooks})).await;
    assert_eq!(st, 200, "{v}");
    let written = std::fs::read_to_string(&conf).unwrap();
    let kept = original.replace("max_turns = 20 #", "max_turns = 7 #");
    assert!(written.starts_with(&kept), "{written}");
    assert!(written[kept.len()..].contains("theme = \"dark\""), "{written}");
    s.stop().await;

    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (_, v) = s.get("/config").await;
    assert_eq!(
        (&v["max_turns"], &v["max_turns_source"]),
        (&json!(7), &json!("file"))
    );
    assert_eq!(
        (&v["theme"], &v["theme_source"]),
        (&json!("dark"), &json!("file"))
    );
    assert_eq!((&v["hooks"], &v["hooks_source"]), (&shown(hooks), &json!("file")));
    // Clearing the hooks removes them from the file, and nothing else.
    let (st, v) = patch(&s, json!({"hooks": {}})).await;
    assert_eq!((st, &v["hooks"]), (200, &shown(json!({}))), "{v}");
    let written = std::fs::read_to_string(&conf).unwrap();
    assert!(
        written.starts_with(&kept) && !written.contains("hooks"),
        "{written}"
    );
    s.stop().await;
}
