//! Every status code the OpenAPI document lists for an operation is one a request here gets, and every status a request here gets is listed: the document promises nothing the server cannot answer and hides nothing it does.
//!
//! Five generic probes cover what every operation shares (an unknown query
//! parameter is 400, no credentials 401, a foreign Host 403, an unknown id in
//! the path 404, a body over the limit 413); the rest are the requests a user would make to meet
//! each documented outcome (a stale sha, a live run, a full queue, a refused
//! key, a server shutting down, ...).

use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// `(METHOD, template)` and a status.
type Pair = (String, String, u16);

/// A body bigger than every server here accepts (their `max_body` is 64 KiB).
const MAX_BODY: usize = 64 << 10;

struct Reached {
    documented: BTreeSet<Pair>,
    /// The operations that need credentials (the others name `security: []`).
    secured: BTreeSet<(String, String)>,
    /// The operations that take a JSON body.
    bodies: BTreeSet<(String, String)>,
    seen: BTreeSet<Pair>,
}

/// Who sends a request.
#[derive(Clone, Copy, PartialEq)]
enum Who {
    /// A client with the token.
    Token,
    /// A client with no credentials.
    Nobody,
    /// A page on another host reaching loopback (DNS rebinding): a foreign Host.
    Rebound,
    /// A client with the token asking for a WebSocket.
    Socket,
}

enum Body {
    None,
    Json(Value),
    Raw(Vec<u8>),
}

impl Reached {
    fn new() -> Reached {
        let doc = super::document();
        let mut documented = BTreeSet::new();
        let mut secured = BTreeSet::new();
        let mut bodies = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if op.get("requestBody").is_some() {
                    bodies.insert((method.to_uppercase(), path.clone()));
                }
                if op.get("security") != Some(&json!([])) {
                    secured.insert((method.to_uppercase(), path.clone()));
                }
                for status in op["responses"].as_object().unwrap().keys() {
                    documented.insert((method.to_uppercase(), path.clone(), status.parse().unwrap()));
                }
            }
        }
        Reached {
            documented,
            secured,
            bodies,
            seen: BTreeSet::new(),
        }
    }

    /// The documented operations as `(METHOD, template)`.
    fn operations(&self) -> BTreeSet<(String, String)> {
        self.documented
            .iter()
            .map(|(m, p, _)| (m.clone(), p.clone()))
            .collect()
    }

    fn lists(&self, method: &str, template: &str, status: u16) -> bool {
        self.documented
            .contains(&(method.to_string(), template.to_string(), status))
    }

    /// Sends the request (with the token when `auth`), checks it gets
    /// `expect` and that the document lists it; answers the JSON body (Null
    /// for an event stream).
    #[allow(clippy::too_many_arguments)]
    async fn hit(
        &mut self,
        s: &TestServer,
        who: Who,
        method: &str,
        template: &str,
        path: &str,
        body: Body,
        expect: u16,
    ) -> Value {
        let client = if matches!(who, Who::Token | Who::Socket) {
            s.http()
        } else {
            reqwest::Client::new()
        };
        let mut req = client.request(method.parse().unwrap(), format!("{}{path}", s.url));
        if who == Who::Rebound {
            req = req.header("host", "vak.attacker.example");
        }
        if who == Who::Socket {
            req = req
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
        }
        req = match body {
            Body::None => req,
            Body::Json(v) => req.json(&v),
            Body::Raw(b) => req.header("content-type", "application/json").body(b),
        };
        let resp = tokio::time::timeout(DEADLINE, req.send())
            .await
            .unwrap_or_else(|_| panic!("{method} {path} answers within the deadline"))
            .unwrap();
        let status = resp.status().as_u16();
        let streaming = status == 101
            || resp
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        // An open event stream or socket is left: its status is what counts here.
        let v = if streaming {
            Value::Null
        } else {
            let text = resp.text().await.unwrap();
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        assert_eq!(status, expect, "{method} {path}: {v}");
        assert!(
            self.lists(method, template, status),
            "{method} {template} answered {status}, which the document does not list: {v}"
        );
        self.seen
            .insert((method.to_string(), template.to_string(), status));
        v
    }

    /// `hit` with the token and a JSON body (or none for GET and DELETE).
    async fn call(
        &mut self,
        s: &TestServer,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        expect: u16,
    ) -> Value {
        let body = body.map_or(Body::None, Body::Json);
        self.hit(s, Who::Token, method, template, path, body, expect)
            .await
    }
}

/// `template` with every `{param}` replaced by `id`.
fn fill(template: &str, id: &str) -> String {
    template
        .split('/')
        .map(|seg| if seg.starts_with('{') { id } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// `template` with every `{param}` replaced by a well-formed id that names nothing.
fn unknown(template: &str) -> String {
    template
        .split('/')
        .map(|seg| match seg {
            "{note_id}" => "mem_000000000000",
            // A commitment's id names its session and item.
            "{id}" if template.starts_with("/commitments/") => "nosuch.nosuch",
            "{id}" if template.starts_with("/skills/proposals/") => "sp_000000000000",
            s if s.starts_with('{') => "nosuch",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// A body `method template` accepts (so that only the path can be wrong).
fn valid_body(takes_body: bool, template: &str, sid: &str) -> Body {
    if !takes_body {
        return Body::None;
    }
    let last = template.rsplit('/').next().unwrap();
    Body::Json(match last {
        "run" => json!({"prompt": "x"}),
        "steering" => json!({"text": "x"}),
        "side" => json!({"question": "x"}),
        "{request_id}" => json!({"approve": true}),
        "{session_id}" => json!({"title": "x"}),
        "{note_id}" => json!({"text": "x"}),
        "follow" | "unfollow" => json!({"session_id": sid}),
        "close" => json!({"verdict": "abandoned"}),
        _ => json!({}),
    })
}

fn small(c: &mut vak::edge::server::ServeConfig) {
    c.max_body = MAX_BODY;
    c.core.max_queued_inputs = 1;
}

// One request per line reads as the table it is.
#[rustfmt::skip]
#[tokio::test]
async fn every_documented_status_is_reached_and_every_status_reached_is_documented() {
    let mut r = Reached::new();
    let s = TestServer::start_with(small).await;
    let sid = s.create_session().await;

    // ---- the generic probes, over every operation ----
    for (method, template) in r.operations() {
        let real = fill(&template, &sid);
        let takes_body = r.bodies.contains(&(method.clone(), template.clone()));
        let body = || {
            if takes_body {
                Body::Json(json!({}))
            } else {
                Body::None
            }
        };
        if r.lists(&method, &template, 400) {
            let sep = if real.contains('?') { '&' } else { '?' };
            r.hit(&s, Who::Token, &method, &template, &format!("{real}{sep}no_such_parameter=1"), body(), 400).await;
        }
        if r.secured.contains(&(method.clone(), template.clone())) {
            r.hit(&s, Who::Nobody, &method, &template, &real, body(), 401).await;
        }
        if r.lists(&method, &template, 403) {
            r.hit(&s, Who::Rebound, &method, &template, &real, body(), 403).await;
        }
        if r.lists(&method, &template, 413) && takes_body {
            let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_BODY));
            r.hit(&s, Who::Token, &method, &template, &real, Body::Raw(big.into_bytes()), 413).await;
        }
        if template.contains('{') && r.lists(&method, &template, 404) {
            r.hit(&s, Who::Token, &method, &template, &unknown(&template), valid_body(takes_body, &template, &sid), 404).await;
        }
    }

    // ---- the server and its surfaces ----
    r.call(&s, "GET", "/health", "/health", None, 200).await;
    r.call(&s, "GET", "/openapi.json", "/openapi.json", None, 200).await;
    r.call(&s, "GET", "/metrics", "/metrics", None, 200).await;
    r.call(&s, "GET", "/admin/status", "/admin/status", None, 200).await;
    r.call(&s, "POST", "/auth/login", "/auth/login", Some(json!({"token": TOKEN})), 200).await;
    r.hit(&s, Who::Nobody, "POST", "/auth/login", "/auth/login", Body::Json(json!({"token": "wrong"})), 401).await;
    r.call(&s, "GET", "/auth/session", "/auth/session", None, 200).await;
    r.call(&s, "POST", "/auth/logout", "/auth/logout", None, 200).await;
    let t = r.call(&s, "POST", "/auth/ticket", "/auth/ticket", None, 200).await;
    r.hit(&s, Who::Nobody, "POST", "/auth/login", "/auth/login", Body::Json(json!({"ticket": t["ticket"]})), 200).await;
    for _ in 0..16 {
        r.call(&s, "POST", "/auth/ticket", "/auth/ticket", None, 200).await;
    }
    r.call(&s, "POST", "/auth/ticket", "/auth/ticket", None, 429).await;
    r.call(&s, "GET", "/doctor", &format!("/doctor?session={sid}"), None, 200).await;
    r.call(&s, "GET", "/doctor", "/doctor?session=bad%20id", None, 400).await;
    r.call(&s, "GET", "/doctor", "/doctor?session=nosuchsession", None, 404).await;
    r.call(&s, "GET", "/sessions/{session_id}/receipts", &format!("/sessions/{sid}/receipts"), None, 200).await;
    // Backup: out of the home and back; a loaded session is not overwritten.
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("b").display().to_string();
    r.call(&s, "POST", "/backup/export", "/backup/export", Some(json!({"dest_dir": dest})), 200).await;
    let home = s.home.display().to_string();
    r.call(&s, "POST", "/backup/export", "/backup/export", Some(json!({"dest_dir": home})), 400).await;
    r.call(&s, "POST", "/backup/import", "/backup/import", Some(json!({"src_dir": dest})), 200).await;
    r.call(&s, "POST", "/backup/import", "/backup/import", Some(json!({"src_dir": home})), 400).await;
    let empty = out.path().display().to_string();
    r.call(&s, "POST", "/backup/import", "/backup/import", Some(json!({"src_dir": empty})), 404).await;
    r.call(&s, "POST", "/backup/import", "/backup/import", Some(json!({"src_dir": dest, "conflict": "overwrite"})), 409).await;

    // ---- configuration ----
    let cfg = r.call(&s, "GET", "/config", "/config", None, 200).await;
    let rev0 = cfg["revision"].as_str().unwrap().to_string();
    r.call(&s, "PATCH", "/config", "/config", Some(json!({"provider": "offline", "model": "echo-2"})), 200).await;
    r.call(&s, "PATCH", "/config", "/config", Some(json!({"model": "echo-3", "revision": rev0})), 409).await;
    r.call(&s, "PUT", "/config/key", "/config/key", Some(json!({"provider": "openai", "key": "sk-test-0123456789"})), 200).await;
    r.call(&s, "DELETE", "/config/key", "/config/key", Some(json!({"provider": "openai"})), 200).await;
    r.call(&s, "POST", "/config/mode", "/config/mode", Some(json!({"mode": "default"})), 200).await;
    r.call(&s, "GET", "/config/mcp", "/config/mcp", None, 200).await;
    r.call(&s, "PUT", "/config/mcp", "/config/mcp", Some(json!({"servers": {}})), 200).await;
    // A config.toml that no longer parses: the table is not changed.
    let conf = s.home.join("config.toml");
    let kept = std::fs::read(&conf).ok();
    std::fs::write(&conf, "[model\n").unwrap();
    r.call(&s, "PUT", "/config/mcp", "/config/mcp", Some(json!({"servers": {}})), 409).await;
    match kept {
        Some(k) => std::fs::write(&conf, k).unwrap(),
        None => std::fs::remove_file(&conf).unwrap(),
    }
    r.call(&s, "GET", "/providers", "/providers", None, 200).await;
    r.call(&s, "GET", "/providers/{provider}/models", "/providers/offline/models", None, 200).await;

    // ---- files ----
    let ws = s.workspace.clone();
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("big.bin"), vec![b'a'; 3 << 20]).unwrap();
    r.call(&s, "GET", "/fs/tree", "/fs/tree", None, 200).await;
    r.call(&s, "GET", "/fs/tree", "/fs/tree?session_id=nope", None, 404).await;
    r.call(&s, "GET", "/fs/dirs", "/fs/dirs", None, 200).await;
    r.call(&s, "GET", "/fs/dirs", "/fs/dirs?path=/", None, 400).await;
    let missing = ws.join("missing");
    r.call(&s, "GET", "/fs/dirs", &format!("/fs/dirs?path={}", missing.display()), None, 404).await;
    let put = |content: &str, sha: Option<&str>| {
        Some(json!({"path": "f.txt", "content": content, "expected_sha": sha}))
    };
    let created = r.call(&s, "PUT", "/fs/file", "/fs/file", put("one", None), 201).await;
    let sha1 = created["sha"].as_str().expect("a sha").to_string();
    r.call(&s, "PUT", "/fs/file", "/fs/file", put("two", Some(&sha1)), 200).await;
    r.call(&s, "PUT", "/fs/file", "/fs/file", put("three", Some(&sha1)), 409).await;
    r.call(&s, "PUT", "/fs/file", "/fs/file", Some(json!({"path": "../outside.txt", "content": "x"})), 400).await;
    r.call(&s, "PUT", "/fs/file", "/fs/file", Some(json!({"path": "g.txt", "content": "x", "session_id": "nope"})), 404).await;
    r.call(&s, "GET", "/fs/file", "/fs/file?path=f.txt", None, 200).await;
    r.call(&s, "GET", "/fs/file", "/fs/file?path=../etc/passwd", None, 400).await;
    r.call(&s, "GET", "/fs/file", "/fs/file?path=nothing.txt", None, 404).await;
    r.call(&s, "GET", "/fs/file", "/fs/file?path=big.bin", None, 413).await;

    // ---- scheduled tasks ----
    r.call(&s, "GET", "/digest", "/digest?days=2", None, 200).await;
    r.call(&s, "GET", "/tasks", "/tasks", None, 200).await;
    let task = r.call(&s, "POST", "/tasks", "/tasks", Some(json!({"name": "t", "script": "true", "session_id": sid})), 201).await;
    let tid = task["task"]["id"].as_str().unwrap().to_string();
    let tp = format!("/tasks/{tid}");
    r.call(&s, "GET", "/tasks/{task_id}", &tp, None, 200).await;
    r.call(&s, "PATCH", "/tasks/{task_id}", &tp, Some(json!({"enabled": false})), 200).await;
    r.call(&s, "POST", "/tasks/{task_id}/run-now", &format!("{tp}/run-now"), None, 202).await;
    r.call(&s, "DELETE", "/tasks/{task_id}", &tp, None, 200).await;
    for i in 0..vak::core::automation::store::MAX_TASKS {
        let t = json!({"name": format!("t{i}"), "prompt": "hi", "session_id": sid, "enabled": false});
        r.call(&s, "POST", "/tasks", "/tasks", Some(t), 201).await;
    }
    r.call(&s, "POST", "/tasks", "/tasks", Some(json!({"name": "one too many", "prompt": "hi"})), 429).await;

    // ---- commitments and intent ----
    let csid = s.create_session().await;
    let (status, ran) = s.post(&format!("/sessions/{csid}/run"), json!({"prompt": "/plan-items [{\"id\": \"a\", \"text\": \"x\", \"status\": \"pending\"}, {\"id\": \"b\", \"text\": \"y\", \"status\": \"pending\"}]", "wait": true})).await;
    assert_eq!(status, 200, "{ran}");
    r.call(&s, "GET", "/commitments", "/commitments", None, 200).await;
    r.call(&s, "GET", "/commitments/{id}", &format!("/commitments/{csid}.a"), None, 200).await;
    r.call(&s, "GET", "/commitments/{id}", "/commitments/no-dot", None, 400).await;
    r.call(&s, "POST", "/commitments/{id}/close", &format!("/commitments/{csid}.a/close"), Some(json!({"verdict": "fulfilled"})), 409).await;
    r.call(&s, "POST", "/commitments/{id}/close", &format!("/commitments/{csid}.a/close"), Some(json!({})), 400).await;
    r.call(&s, "POST", "/commitments/{id}/close", &format!("/commitments/{csid}.a/close"), Some(json!({"verdict": "abandoned"})), 200).await;
    r.call(&s, "GET", "/intent/explain", "/intent/explain?prompt=add%20a%20README", None, 200).await;
    r.call(&s, "GET", "/intent/policy", "/intent/policy", None, 200).await;

    // ---- skills ----
    r.call(&s, "GET", "/skills", "/skills", None, 200).await;
    r.call(&s, "GET", "/skills/proposals", "/skills/proposals", None, 200).await;
    let made = r.call(&s, "POST", "/skills/proposals", "/skills/proposals", Some(json!({"from_session": csid})), 201).await;
    r.call(&s, "POST", "/skills/proposals", "/skills/proposals", Some(json!({"from_session": "nosuch"})), 404).await;
    r.call(&s, "POST", "/skills/proposals", "/skills/proposals", Some(json!({"from_session": csid, "name": "Bad Name"})), 400).await;
    let spid = made["id"].as_str().unwrap().to_string();
    r.call(&s, "POST", "/skills/proposals/{id}/promote", "/skills/proposals/nope/promote", Some(json!({})), 400).await;
    r.call(&s, "POST", "/skills/proposals/{id}/promote", &format!("/skills/proposals/{spid}/promote"), Some(json!({})), 200).await;
    r.call(&s, "POST", "/skills/proposals/{id}/promote", &format!("/skills/proposals/{spid}/promote"), Some(json!({})), 409).await;
    let other = r.call(&s, "POST", "/skills/proposals", "/skills/proposals", Some(json!({"from_session": csid})), 201).await;
    let other = other["id"].as_str().unwrap().to_string();
    r.call(&s, "POST", "/skills/proposals/{id}/reject", &format!("/skills/proposals/{other}/reject"), Some(json!({})), 200).await;
    r.call(&s, "POST", "/skills/proposals/{id}/reject", &format!("/skills/proposals/{other}/reject"), Some(json!({})), 409).await;

    // ---- memory ----
    r.call(&s, "GET", "/memory", "/memory", None, 200).await;
    let note = r.call(&s, "POST", "/memory", "/memory", Some(json!({"text": "tabs, not spaces"})), 201).await;
    let nid = note["id"].as_str().unwrap().to_string();
    r.call(&s, "PATCH", "/memory/{note_id}", &format!("/memory/{nid}"), Some(json!({"text": "spaces"})), 200).await;
    r.call(&s, "DELETE", "/memory/{note_id}", &format!("/memory/{nid}"), None, 200).await;
    for i in 0..vak::core::host::memory::MAX_NOTES {
        r.call(&s, "POST", "/memory", "/memory", Some(json!({"text": format!("note {i}")})), 201).await;
    }
    r.call(&s, "POST", "/memory", "/memory", Some(json!({"text": "one too many"})), 429).await;
    // A profile vak did not write and will not rewrite: not UTF-8, then too big to read.
    let user = s.home.join("USER.md");
    std::fs::write(&user, b"caf\xe9\n").unwrap();
    let user_note = Some(json!({"text": "x", "scope": "user"}));
    r.call(&s, "POST", "/memory", "/memory", user_note.clone(), 409).await;
    r.call(&s, "PATCH", "/memory/{note_id}", "/memory/mem_000000000001", user_note, 409).await;
    r.call(&s, "DELETE", "/memory/{note_id}", "/memory/mem_000000000001?scope=user", None, 409).await;
    std::fs::write(&user, vec![b'a'; vak::core::host::memory::MAX_FILE as usize + 1]).unwrap();
    r.call(&s, "GET", "/memory", "/memory", None, 413).await;
    r.call(&s, "DELETE", "/memory/{note_id}", "/memory/mem_000000000001?scope=user", None, 413).await;
    std::fs::remove_file(&user).unwrap();

    // ---- sessions: lifecycle ----
    r.call(&s, "GET", "/sessions", "/sessions", None, 200).await;
    let run = |p: &str| Some(json!({"prompt": p}));
    let path = |tail: &str| format!("/sessions/{sid}{tail}");
    let t = |tail: &str| format!("/sessions/{{session_id}}{tail}");
    r.call(&s, "POST", "/sessions/{session_id}/undo", &path("/undo"), Some(json!({})), 409).await;
    r.call(&s, "POST", "/sessions/{session_id}/compact", &path("/compact"), Some(json!({})), 409).await;
    r.call(&s, "POST", &t("/run"), &path("/run"), Some(json!({"prompt": "hello", "wait": true})), 200).await;
    r.call(&s, "POST", &t("/undo"), &path("/undo"), Some(json!({})), 200).await;
    r.call(&s, "POST", &t("/run"), &path("/run"), Some(json!({"prompt": "again", "wait": true})), 200).await;
    r.call(&s, "POST", &t("/compact"), &path("/compact"), Some(json!({})), 200).await;
    r.call(&s, "POST", &t("/clear"), &path("/clear"), Some(json!({})), 200).await;
    r.call(&s, "PATCH", &t(""), &path(""), Some(json!({"title": "renamed"})), 200).await;
    r.call(&s, "POST", &t("/attach"), &path("/attach"), Some(json!({})), 200).await;
    r.call(&s, "GET", &t("/transcript"), &path("/transcript"), None, 200).await;
    r.call(&s, "GET", &t("/transcript.md"), &path("/transcript.md"), None, 200).await;
    r.call(&s, "GET", &t("/presentation"), &path("/presentation"), None, 200).await;
    r.call(&s, "GET", &t("/diff"), &path("/diff"), None, 200).await;
    r.call(&s, "GET", "/search", "/search?q=hello", None, 200).await;
    // Search's bounds: no slot free (429), a deadline already past (408).
    let full = TestServer::start_with(|c| c.core.search.max_running = 0).await;
    r.call(&full, "GET", "/search", "/search?q=hello", None, 429).await;
    let late = TestServer::start_with(|c| c.core.search.deadline = Duration::ZERO).await;
    r.call(&late, "GET", "/search", "/search?q=hello", None, 408).await;
    r.call(&s, "POST", &t("/fork"), &path("/fork"), Some(json!({})), 201).await;

    // A live run: whole-session changes are 409, the queue holds one input.
    let mut sse = s.events(&sid, None).await;
    r.call(&s, "POST", &t("/run"), &path("/run"), run("/bash sleep 60"), 202).await;
    let ask = sse.next_ask().await;
    let rid = ask["request_id"].as_str().unwrap().to_string();
    for (method, tail, body) in [
        ("DELETE", "", None),
        ("POST", "/clear", Some(json!({}))),
        ("POST", "/fork", Some(json!({}))),
    ] {
        r.call(&s, method, &t(tail), &path(tail), body, 409).await;
    }
    r.call(&s, "POST", &t("/steering"), &path("/steering"), Some(json!({"text": "queued"})), 202).await;
    r.call(&s, "POST", &t("/steering"), &path("/steering"), Some(json!({"text": "one too many"})), 429).await;
    r.call(&s, "POST", &t("/run"), &path("/run"), run("one too many"), 429).await;
    // The approval is answered once; its rule stays after the run.
    let approval = format!("/sessions/{sid}/approvals/{rid}");
    let ta = "/sessions/{session_id}/approvals/{request_id}";
    r.call(&s, "POST", ta, &approval, Some(json!({"approve": true, "always": true})), 200).await;
    r.call(&s, "POST", ta, &approval, Some(json!({"approve": true})), 409).await;
    r.call(&s, "POST", &t("/cancel"), &path("/cancel"), Some(json!({})), 200).await;
    sse.until("run_finished").await;
    let rules = r.call(&s, "GET", "/permissions/rules", "/permissions/rules", None, 200).await;
    // A workspace no one opened: its rules are not found.
    r.call(&s, "GET", "/permissions/rules", "/permissions/rules?workspace=%2Fnot-open", None, 404).await;
    let rule = rules["rules"][0]["id"]
        .as_str()
        .expect("the always rule")
        .to_string();
    r.call(&s, "DELETE", "/permissions/rules/{id}", &format!("/permissions/rules/{rule}"), None, 200).await;

    // Side chat: one side run at a time.
    r.call(&s, "POST", &t("/side"), &path("/side"), Some(json!({"question": "/sleep 60000"})), 202).await;
    r.call(&s, "POST", &t("/side"), &path("/side"), Some(json!({"question": "and?"})), 409).await;
    r.call(&s, "POST", &t("/side/cancel"), &path("/side/cancel"), Some(json!({})), 200).await;
    r.call(&s, "GET", &t("/side"), &path("/side"), None, 200).await;

    // ---- streams, and their caps (one per client) ----
    let capped = TestServer::start_with(|c| c.max_streams_per_client = 1).await;
    let one = capped.create_session().await;
    let _held = capped
        .http()
        .get(format!("{}/stream?session={one}", capped.url))
        .send()
        .await
        .unwrap();
    assert_eq!(_held.status(), 200);
    r.call(&capped, "GET", "/stream", &format!("/stream?session={one}"), None, 429).await;
    r.call(&capped, "GET", &t("/events"), &format!("/sessions/{one}/events"), None, 429).await;
    r.call(&capped, "GET", &t("/presentation/events"), &format!("/sessions/{one}/presentation/events"), None, 429).await;
    r.call(&s, "GET", "/stream", "/stream?session=nosuch", None, 404).await;
    r.call(&s, "GET", &t("/events"), &path("/events"), None, 200).await;
    r.call(&s, "GET", &t("/presentation/events"), &path("/presentation/events"), None, 200).await;
    r.call(&s, "GET", "/stream", &format!("/stream?session={sid}"), None, 200).await;
    let resp = s
        .http()
        .get(format!("{}/stream?session={sid}", s.url))
        .send()
        .await
        .unwrap();
    let mut mux = Sse::new(resp);
    let opened = mux.next().await.expect("stream_opened");
    let open = &opened.data;
    let stream = open["stream_id"].as_str().expect("a stream id").to_string();
    let other = s.create_session().await;
    let follow = Some(json!({"session_id": other}));
    r.call(&s, "POST", "/stream/{stream_id}/follow", &format!("/stream/{stream}/follow"), follow.clone(), 200).await;
    r.call(&s, "POST", "/stream/{stream_id}/unfollow", &format!("/stream/{stream}/unfollow"), follow, 200).await;
    r.call(&s, "DELETE", &t(""), &format!("/sessions/{other}"), None, 200).await;
    r.call(&s, "POST", "/sessions", "/sessions", Some(json!({})), 201).await;

    // ---- a model service that refuses, then one that never answers ----
    let fake = FakeProvider::start().await;
    let m = TestServer::start_with_route(fake.openai_route(), small).await;
    let msid = m.create_session().await;
    let mpath = |tail: &str| format!("/sessions/{msid}{tail}");
    fake.script([Reply::fixture("openai/text.sse")]);
    r.call(&m, "POST", &t("/run"), &mpath("/run"), Some(json!({"prompt": "hi", "wait": true})), 200).await;
    let refused = r#"{"error": {"message": "Incorrect API key", "type": "invalid_request_error"}}"#;
    fake.script([Reply::status(401, refused)]);
    r.call(&m, "POST", &t("/compact"), &mpath("/compact"), Some(json!({})), 502).await;
    // PATCH /config resolves the route it is given: the providers' list checks the key.
    r.call(&m, "PATCH", "/config", "/config", Some(json!({"provider": "openai", "model": "m", "base_url": format!("{}/v1/", fake.url)})), 200).await;
    fake.script([Reply::status(401, refused)]);
    r.call(&m, "GET", "/providers/{provider}/models", "/providers/openai/models", None, 502).await;
    // A compaction that hangs holds the history: input meanwhile is 409.
    fake.script([Reply::stalling("openai/stalls.sse")]);
    let compacting = {
        let (url, http) = (m.url.clone(), m.http());
        let p = mpath("/compact");
        tokio::spawn(async move { http.post(format!("{url}{p}")).json(&json!({})).send().await })
    };
    fake.wait_requests(4).await;
    r.call(&m, "POST", &t("/run"), &mpath("/run"), Some(json!({"prompt": "now"})), 409).await;
    r.call(&m, "POST", &t("/steering"), &mpath("/steering"), Some(json!({"text": "now"})), 409).await;
    r.call(&m, "POST", &t("/undo"), &mpath("/undo"), Some(json!({})), 409).await;
    r.call(&m, "POST", &t("/compact"), &mpath("/compact"), Some(json!({})), 409).await;

    // ---- workspaces, and the terminal (on, from this machine) ----
    let root = tempfile::tempdir().unwrap();
    let w = TestServer::start_with(|c| {
        c.core.workspace_roots = vec![root.path().to_path_buf()];
        c.web.terminal = true;
        c.web.terminal_shell = Some("/bin/sh".into());
    })
    .await;
    r.call(&w, "GET", "/host", "/host", None, 200).await;
    r.call(&w, "GET", "/workspaces", "/workspaces", None, 200).await;
    let open = |name: &str| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Some(json!({"path": dir}))
    };
    r.call(&w, "POST", "/workspaces/open", "/workspaces/open", open("a"), 200).await;
    r.call(&w, "POST", "/workspaces/open", "/workspaces/open", Some(json!({"path": root.path().join("missing")})), 404).await;
    // The bound: the server's own and "a" are open; 30 more fill it.
    for i in 0..30 {
        r.call(&w, "POST", "/workspaces/open", "/workspaces/open", open(&format!("w{i}")), 200).await;
    }
    r.call(&w, "POST", "/workspaces/open", "/workspaces/open", open("one-more"), 429).await;
    let not_open = root.path().join("one-more");
    r.call(&w, "POST", "/sessions", "/sessions", Some(json!({"workspace": not_open})), 404).await;
    r.hit(&w, Who::Socket, "GET", "/pty", &format!("/pty?workspace={}", not_open.display()), Body::None, 404).await;
    r.hit(&w, Who::Socket, "GET", "/pty", "/pty", Body::None, 101).await;
    // Eight shells at once, the most: a ninth is refused.
    let mut shells = Vec::new();
    while shells.len() < 8 {
        let mut req = format!("ws://{}/pty", w.addr).into_client_request().unwrap();
        req.headers_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        match tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(req)).await.expect("a handshake within the deadline") {
            Ok((ws, _)) => shells.push(ws),
            // The shell of the 101 above may not have ended yet.
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) if resp.status() == 429 => tokio::task::yield_now().await,
            Err(e) => panic!("terminal {}: {e}", shells.len()),
        }
    }
    r.hit(&w, Who::Socket, "GET", "/pty", "/pty", Body::None, 429).await;
    drop(shells);

    // ---- dev servers and the PR view (issue 30), with a fake gh ----
    let bin = tempfile::tempdir().unwrap();
    let gh = bin.path().join("gh");
    std::fs::write(&gh, concat!(
        "#!/bin/sh\n",
        "case \"$1 $2\" in\n",
        "\"pr view\") [ -f \"$0.fail\" ] && { echo 'HTTP 401: Bad credentials' >&2; exit 1; }\n",
        "  echo '{\"number\":1,\"title\":\"t\",\"state\":\"OPEN\",\"url\":\"u\",\"headRefName\":\"main\",\"statusCheckRollup\":[]}' ;;\n",
        "\"pr merge\") [ \"$3\" = 2 ] && { echo 'not mergeable' >&2; exit 1; }; echo merged ;;\n",
        "esac\n",
    )).unwrap();
    std::fs::set_permissions(&gh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let l = TestServer::start_with(|c| c.core.gh = gh.clone()).await;
    let git = std::process::Command::new("git").current_dir(&l.workspace).args(["init", "-q"]).output().unwrap();
    assert!(git.status.success());
    std::fs::create_dir(l.workspace.join(".vak")).unwrap();
    let toml: String = (0..9).map(|i| format!("[[launch]]\nname = \"s{i}\"\ncommand = \"sleep 1000\"\n")).collect();
    std::fs::write(l.workspace.join(".vak/launch.toml"), toml).unwrap();
    let lsid = l.create_session().await;
    let lp = |tail: &str| format!("/sessions/{lsid}{tail}");
    let name = |n: &str| Some(json!({"name": n}));
    r.call(&l, "GET", &t("/launch"), &lp("/launch"), None, 200).await;
    r.call(&l, "POST", &t("/launch/start"), &lp("/launch/start"), name("s0"), 200).await;
    r.call(&l, "POST", &t("/launch/start"), &lp("/launch/start"), name("s0"), 409).await;
    r.call(&l, "POST", &t("/launch/start"), &lp("/launch/start"), Some(json!({})), 400).await;
    r.call(&l, "POST", &t("/launch/start"), &lp("/launch/start"), name("nope"), 404).await;
    for i in 1..8 {
        r.call(&l, "POST", &t("/launch/start"), &lp("/launch/start"), name(&format!("s{i}")), 200).await;
    }
    // Eight run in the session, the most.
    r.call(&l, "POST", &t("/launch/start"), &lp("/launch/start"), name("s8"), 429).await;
    r.call(&l, "GET", &t("/launch/logs"), &lp("/launch/logs?name=s0&tail=5"), None, 200).await;
    r.call(&l, "GET", &t("/launch/logs"), &lp("/launch/logs"), None, 400).await;
    r.call(&l, "GET", &t("/launch/logs"), &lp("/launch/logs?name=nope"), None, 404).await;
    r.call(&l, "POST", &t("/launch/stop"), &lp("/launch/stop"), name("s0"), 200).await;
    r.call(&l, "POST", &t("/launch/stop"), &lp("/launch/stop"), Some(json!({})), 400).await;
    r.call(&l, "POST", &t("/launch/stop"), &lp("/launch/stop"), name("nope"), 404).await;
    r.call(&l, "GET", &t("/pr"), &lp("/pr"), None, 200).await;
    r.call(&l, "POST", &t("/pr/merge"), &lp("/pr/merge"), Some(json!({"number": 1, "method": "squash"})), 200).await;
    r.call(&l, "POST", &t("/pr/merge"), &lp("/pr/merge"), Some(json!({"number": 1})), 400).await;
    r.call(&l, "POST", &t("/pr/merge"), &lp("/pr/merge"), Some(json!({"number": 2, "method": "merge"})), 502).await;
    std::fs::write(bin.path().join("gh.fail"), "").unwrap();
    r.call(&l, "GET", &t("/pr"), &lp("/pr"), None, 502).await;
    // Without gh a merge cannot be tried.
    std::fs::remove_file(&gh).unwrap();
    r.call(&l, "POST", &t("/pr/merge"), &lp("/pr/merge"), Some(json!({"number": 1, "method": "squash"})), 409).await;
    // A launch file that does not parse.
    std::fs::write(l.workspace.join(".vak/launch.toml"), "[[launch]]\nname = 1\n").unwrap();
    r.call(&l, "GET", &t("/launch"), &lp("/launch"), None, 400).await;

    // ---- children and best-of-N, in a git workspace ----
    children(&mut r).await;

    // ---- a server shutting down (the listener still answers): 503 ----
    let d = TestServer::start_with(small).await;
    let dsid = d.create_session().await;
    tokio::time::timeout(DEADLINE, d.hub().shutdown(Duration::from_secs(5)))
        .await
        .expect("the hub stops within the deadline");
    let dpath = |tail: &str| format!("/sessions/{dsid}{tail}");
    r.call(&d, "POST", "/sessions", "/sessions", Some(json!({})), 503).await;
    r.call(&d, "POST", &t("/run"), &dpath("/run"), run("late"), 503).await;
    r.call(&d, "POST", &t("/steering"), &dpath("/steering"), Some(json!({"text": "late"})), 503).await;
    r.call(&d, "POST", &t("/side"), &dpath("/side"), Some(json!({"question": "late"})), 503).await;
    drop(compacting);

    let missing: Vec<_> = r.documented.difference(&r.seen).collect();
    assert!(
        missing.is_empty(),
        "documented but never answered here ({}): {missing:#?}",
        missing.len()
    );
}

/// The workers and best-of-N operations: a best-of-N started (202), listed,
/// a running candidate's keep refused (409), its steering queued then full
/// (429), stopped, discarded and the other kept; a session's 65th child (429).
#[rustfmt::skip]
async fn children(r: &mut Reached) {
    let g = TestServer::start_with(small).await;
    for args in [&["init", "-q"][..], &["commit", "-q", "--allow-empty", "-m", "init"]] {
        let out = std::process::Command::new("git")
            .current_dir(&g.workspace)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let sid = g.create_session().await;
    let t = |tail: &str| format!("/sessions/{{session_id}}{tail}");
    let path = |tail: &str| format!("/sessions/{sid}{tail}");
    let b = r.call(&g, "POST", &t("/bestofn"), &path("/bestofn"), Some(json!({"prompt": "/sleep 60000", "n": 2})), 202).await;
    let (c0, c1) = (b["candidates"][0]["id"].as_str().unwrap().to_string(), b["candidates"][1]["id"].as_str().unwrap().to_string());
    r.call(&g, "GET", &t("/workers"), &path("/workers"), None, 200).await;
    r.call(&g, "POST", &t("/keep"), &path("/keep"), Some(json!({"candidate": c0})), 409).await;
    let steer = "/sessions/{session_id}/workers/{child_id}/steer";
    let steer_c0 = path(&format!("/workers/{c0}/steer"));
    r.call(&g, "POST", steer, &steer_c0, Some(json!({"text": "queued"})), 200).await;
    r.call(&g, "POST", steer, &steer_c0, Some(json!({"text": "one too many"})), 429).await;
    let (_, w) = g.get(&path("/workers")).await;
    assert_eq!(w["workers"][0]["state"], "running", "a refused steer leaves the child running: {w}");
    let stop = "/sessions/{session_id}/workers/{child_id}/stop";
    r.call(&g, "POST", stop, &path(&format!("/workers/{c1}/stop")), Some(json!({})), 200).await;
    r.call(&g, "POST", &t("/discard"), &path("/discard"), Some(json!({"candidate": c0})), 200).await;
    r.call(&g, "POST", &t("/keep"), &path("/keep"), Some(json!({"candidate": c1})), 200).await;
    // A session has at most 64 children.
    let full = g.create_session().await;
    for _ in 0..16 {
        let (status, b) = g.post(&format!("/sessions/{full}/bestofn"), json!({"prompt": "x", "n": 4})).await;
        assert_eq!(status, 202, "{b}");
    }
    let more = Some(json!({"prompt": "x", "n": 2}));
    r.call(&g, "POST", &t("/bestofn"), &format!("/sessions/{full}/bestofn"), more, 429).await;
}
