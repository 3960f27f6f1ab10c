//! Getting from a running server to a logged-in /app: the startup lines (workspace, app URL,
//! how to get the token), `vak token`, `vak serve --print-token` and `vak open` with their
//! one-time login links (`POST /auth/ticket`, redeemed by `POST /auth/login {ticket}` once,
//! within 60 s).

use crate::support::process::vak;
use crate::support::serve::{Serve, Served};
use crate::support::TOKEN;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;

/// `POST /auth/login` with `body`: the status, the JSON answer and the cookie header it set.
async fn login(url: &str, body: Value) -> (u16, Value, Option<String>) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/auth/login"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let cookie = resp
        .headers()
        .get("set-cookie")
        .map(|c| c.to_str().unwrap().split(';').next().unwrap().to_string());
    (status, resp.json().await.unwrap(), cookie)
}

/// The ticket in a login link `URL/app/#ticket=T`.
fn ticket_of(link: &str, url: &str) -> String {
    let rest = link
        .strip_prefix(&format!("{url}/app/#ticket="))
        .unwrap_or_else(|| panic!("a login link to {url}/app/: {link}"));
    assert!(
        rest.len() >= 32 && rest.chars().all(|c| c.is_ascii_hexdigit()),
        "{link}"
    );
    rest.to_string()
}

/// Redeems `ticket` and proves the login works for the API; then that it works only once.
async fn logs_in_once(url: &str, ticket: &str) {
    let (status, body, cookie) = login(url, json!({"ticket": ticket})).await;
    assert_eq!(status, 200, "{body}");
    let key = body["key"].as_str().expect("a session key");
    let cookie = cookie.expect("a login cookie");
    let sessions = reqwest::Client::new()
        .get(format!("{url}/sessions"))
        .header("cookie", cookie)
        .header("x-vak-key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(sessions.status(), 200, "the login reaches the API");
    let (again, body, _) = login(url, json!({"ticket": ticket})).await;
    assert_eq!(again, 401, "a link works once: {body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("vak open"),
        "{body}"
    );
}

#[tokio::test]
async fn startup_prints_the_workspace_the_app_and_with_print_token_a_link_that_works_once() {
    let mut served: Served = Serve::new()
        .no_workspace()
        .args([
            "--home-workspace",
            "--print-token",
            "--permission-mode",
            "accept-edits",
        ])
        .start()
        .await;
    let url = served.url.clone();
    let home = served.dirs.home().to_path_buf();
    let mut next = Vec::new();
    for _ in 0..4 {
        next.push(served.vak.next_line().await);
    }
    let workspace = home.join("workspace");
    assert_eq!(next[0], format!("vak: workspace {}", workspace.display()));
    assert!(workspace.is_dir(), "made on first use");
    assert_eq!(workspace.metadata().unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(
        next[1],
        format!("vak: app {url}/app/ (log in with the token `vak token` prints, or run `vak open`)")
    );
    assert_eq!(next[2], format!("vak: token {TOKEN}"));
    let link = next[3]
        .strip_prefix("vak: login link ")
        .and_then(|l| l.strip_suffix(" (works once, within 60 s)"))
        .unwrap_or_else(|| panic!("{next:?}"));
    logs_in_once(&url, &ticket_of(link, &url)).await;

    // The agent writes there, not in the directory vak was started from.
    let api = served.api();
    let sid = api.create_session().await;
    let mut events = api.events(&sid, None).await;
    let (code, b) = api.run(&sid, "/write notes.md hello there").await;
    assert!(code < 300, "{b}");
    events.until("run_finished").await;
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes.md")).unwrap(),
        "hello there"
    );
}

#[tokio::test]
async fn vak_token_prints_the_running_servers_token_then_the_homes() {
    let served = Serve::new().no_token().start().await;
    let home = served.dirs.home().to_path_buf();
    let kept = std::fs::read_to_string(home.join("token")).unwrap();
    let out = vak(&["token", "--home", home.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), kept);
    served.vak.kill().await;
    // No server: the kept token, from VAK_HOME as well.
    let out = vak(&["token"]).env("VAK_HOME", &home).output().await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), kept);
    let empty = tempfile::tempdir().unwrap();
    let out = vak(&["token", "--home", empty.path().to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no token in the home") && err.contains("vak serve"),
        "{err}"
    );
}

#[tokio::test]
async fn vak_open_gives_the_browser_a_private_page_and_print_a_link_that_works_once() {
    let served = Serve::new().start().await;
    let url = served.url.clone();
    let home = served.dirs.home().to_path_buf();

    let out = vak(&["open", "--print", "--home", home.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    logs_in_once(&url, &ticket_of(stdout.lines().next().unwrap(), &url)).await;

    // A "browser" that records what it was given: a private file, never the link itself.
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("argv");
    let browser = dir.path().join("browser.sh");
    std::fs::write(
        &browser,
        format!(
            "#!/bin/sh\nprintf '%s' \"$*\" > {}.tmp && mv {0}.tmp {0}\n",
            got.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&browser, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = vak(&["open", "--home", home.to_str().unwrap()])
        .env("BROWSER", &browser)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("vak: opening {url}/app/ logged in")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    let argv = loop {
        if let Ok(a) = std::fs::read_to_string(&got) {
            break a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the browser was never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let page = home.join("open.html");
    assert_eq!(argv, page.display().to_string(), "no ticket on a command line");
    assert_eq!(page.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    let html = std::fs::read_to_string(&page).unwrap();
    let at = html.find("#ticket=").expect("the page forwards to the link") + "#ticket=".len();
    let ticket: String = html[at..].chars().take_while(char::is_ascii_hexdigit).collect();
    logs_in_once(&url, &ticket).await;
}

#[tokio::test]
async fn a_login_link_needs_the_token_and_a_login_cannot_make_one() {
    let served = Serve::new().start().await;
    let url = served.url.clone();
    let client = reqwest::Client::new();
    let ticket = |auth: Option<&str>| {
        let mut req = client.post(format!("{url}/auth/ticket"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    assert_eq!(ticket(None).await.unwrap().status(), 401);
    assert_eq!(ticket(Some("Bearer wrong")).await.unwrap().status(), 401);
    let (_, body, cookie) = login(&url, json!({"token": TOKEN})).await;
    let by_login = client
        .post(format!("{url}/auth/ticket"))
        .header("cookie", cookie.unwrap())
        .header("x-vak-key", body["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(by_login.status(), 401, "a login cannot mint more logins");
    let ok = ticket(Some(&format!("Bearer {TOKEN}"))).await.unwrap();
    assert_eq!(ok.status(), 200);
    let body: Value = ok.json().await.unwrap();
    assert_eq!(body["expires_in_s"], 60);
    let t = body["ticket"].as_str().unwrap();
    assert_eq!(body["path"], format!("/app/#ticket={t}"));
    let (bad, body, _) = login(&url, json!({"ticket": "0123456789abcdef0123456789abcdef"})).await;
    assert_eq!((bad, &body["error"]["code"]), (401, &json!("unauthenticated")));
    // Waiting links are bounded: the 16 already used up here and the 17th refused.
    for _ in 1..16 {
        assert_eq!(
            ticket(Some(&format!("Bearer {TOKEN}"))).await.unwrap().status(),
            200
        );
    }
    let refused = ticket(Some(&format!("Bearer {TOKEN}"))).await.unwrap();
    assert_eq!(refused.status(), 429);
    logs_in_once(&url, t).await;
    assert_eq!(
        ticket(Some(&format!("Bearer {TOKEN}"))).await.unwrap().status(),
        200,
        "a used one makes room"
    );
}
