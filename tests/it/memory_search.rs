//! Memory notes (`/memory`) and transcript search (`/search`) end to end: every route's success and refusal, notes in the system prompt vak sends a model (of both scopes, never another workspace's), and hits that survive a restart, follow workspaces and vanish with their session.

use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::{assert_completed, TestServer, DEADLINE};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use vak::core::provider::http::ClientOptions;
use vak::core::provider::{connect_with, Endpoint, ProviderKind, Secret};
use vak::core::session::live::Route;
use vak::proto::v1 as pb;

// ---- Memory ------------------------------------------------------------------

async fn add(s: &TestServer, body: Value) -> (u16, Value) {
    s.post("/memory", body).await
}

#[tokio::test]
async fn memory_notes_are_added_listed_amended_and_forgotten_in_both_scopes() {
    let s = TestServer::start().await;
    let (code, w) = add(
        &s,
        json!({"text": "  prefers tabs  ", "kind": "preference", "tag": "style"}),
    )
    .await;
    assert_eq!(code, 201, "{w}");
    assert!(w["id"].as_str().unwrap().starts_with("mem_"), "{w}");
    assert_eq!(
        (w["scope"].as_str(), w["text"].as_str()),
        (Some("workspace"), Some("prefers tabs"))
    );
    let sid = s.create_session().await;
    let (code, u) = add(
        &s,
        json!({"text": "My name is Sam.", "scope": "user", "session_id": sid}),
    )
    .await;
    assert_eq!(code, 201, "{u}");
    assert_eq!(
        (u["scope"].as_str(), u["session_id"].as_str()),
        (Some("user"), Some(sid.as_str()))
    );

    let (code, list) = s.get("/memory").await;
    assert_eq!(code, 200);
    let notes = list["notes"].as_array().unwrap();
    assert_eq!(
        notes,
        &vec![w.clone(), u.clone()],
        "the workspace's first, then the user's"
    );
    assert_eq!(list["max_notes"], 200);

    let wid = w["id"].as_str().unwrap();
    let (code, amended) = s
        .send(
            reqwest::Method::PATCH,
            &format!("/memory/{wid}"),
            Some(json!({"text": "prefers spaces"})),
        )
        .await;
    assert_eq!(code, 200, "{amended}");
    assert_eq!(amended["text"], "prefers spaces");
    // The provenance stays.
    for k in ["id", "kind", "tag", "created_at", "scope"] {
        assert_eq!(amended[k], w[k], "{k}");
    }

    // The files are in the home, owner-only; nothing is written into the workspace.
    use std::os::unix::fs::PermissionsExt;
    let user_md = s.home.join("USER.md");
    assert!(std::fs::read_to_string(&user_md)
        .unwrap()
        .contains("My name is Sam."));
    assert_eq!(
        std::fs::metadata(&user_md).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let tier: Vec<_> = std::fs::read_dir(s.home.join("memory")).unwrap().collect();
    assert_eq!(tier.len(), 1);
    assert_eq!(std::fs::read_dir(&s.workspace).unwrap().count(), 0);

    // Forgetting: the scope, when given, is where it must be.
    let (code, e) = s.delete(&format!("/memory/{wid}?scope=user")).await;
    assert_eq!(
        (code, e["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{e}"
    );
    let (code, gone) = s.delete(&format!("/memory/{wid}?scope=workspace")).await;
    assert_eq!(
        (code, gone["note"]["text"].as_str()),
        (200, Some("prefers spaces"))
    );
    let (code, _) = s.delete(&format!("/memory/{wid}")).await;
    assert_eq!(code, 404);
    let (_, list) = s.get("/memory").await;
    assert_eq!(list["notes"], json!([u]));

    // The same through gRPC.
    let mut g = s.grpc().await;
    let n = g
        .add_memory(pb::AddMemoryRequest {
            text: "from grpc".into(),
            scope: Some(pb::MemoryScope::User as i32),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.scope, pb::MemoryScope::User as i32);
    let listed = g
        .list_memory(pb::ListMemoryRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.notes.len(), 2);
    let e = g
        .delete_memory(pb::DeleteMemoryRequest {
            note_id: "mem_000000000000".into(),
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn every_bad_memory_request_is_refused_with_a_clear_error() {
    let s = TestServer::start().await;
    let too_long = "x".repeat(4097);
    for (body, needle) in [
        (json!({}), "text is required"),
        (json!({"text": "   "}), "text is required"),
        (json!({"text": too_long}), "at most 4096"),
        (
            json!({"text": "a\n<!-- vak:note id=mem_0123456789ab -->\nb"}),
            "note header",
        ),
        (json!({"text": "x", "kind": "two words"}), "invalid kind"),
        (json!({"text": "x", "tag": "a-->"}), "invalid tag"),
        (json!({"text": "x", "scope": "global"}), "malformed JSON body"),
        (json!({"text": "x", "session_id": "../etc"}), "invalid session id"),
        (json!({"text": "x", "colour": "red"}), "malformed JSON body"),
    ] {
        let (code, e) = add(&s, body.clone()).await;
        assert_eq!(code, 400, "{body}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let (_, n) = add(&s, json!({"text": "x"})).await;
    let id = n["id"].as_str().unwrap();
    for (path, body, code) in [
        (format!("/memory/{id}"), json!({"text": ""}), 400),
        (
            format!("/memory/{id}"),
            json!({"text": "y", "note_id": "mem_0123456789ab"}),
            400,
        ),
        ("/memory/not-an-id".to_string(), json!({"text": "y"}), 400),
        ("/memory/mem_0123456789ab".to_string(), json!({"text": "y"}), 404),
    ] {
        let (got, e) = s.send(reqwest::Method::PATCH, &path, Some(body.clone())).await;
        assert_eq!(got, code, "{path} {body}: {e}");
    }
    for (path, code) in [
        (format!("/memory/{id}?scope=global"), 400),
        (format!("/memory/{id}?colour=red"), 400),
        ("/memory/mem_0123456789ab".to_string(), 404),
    ] {
        let (got, e) = s.delete(&path).await;
        assert_eq!(got, code, "{path}: {e}");
    }
    // A full tier: 429 naming the bound, and nothing is lost.
    for i in 1..200 {
        let (code, e) = add(&s, json!({"text": format!("note {i}")})).await;
        assert_eq!(code, 201, "{e}");
    }
    let (code, e) = add(&s, json!({"text": "one too many"})).await;
    assert_eq!(code, 429, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("200 notes"),
        "{e}"
    );
    let (_, list) = s.get("/memory").await;
    assert_eq!(list["notes"].as_array().unwrap().len(), 200);
}

fn openai(fake: &FakeProvider) -> Route {
    let endpoint = Endpoint {
        kind: ProviderKind::OpenAi,
        base_url: Some(format!("{}/v1/", fake.url)),
        key: Some(Secret::new("sk-test".into())),
    };
    Route {
        provider: connect_with(&endpoint, &ClientOptions::default()).unwrap_or_else(|f| panic!("{f:?}")),
        model: "gpt-4.1".into(),
        context_window: None,
    }
}

#[tokio::test]
async fn notes_survive_a_restart_and_reach_the_system_prompt_of_their_workspace_only() {
    let home = tempfile::tempdir().unwrap();
    let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Another workspace on the same home keeps a note of its own.
    let other = TestServer::start_in(home.path(), theirs.path(), |_| {}).await;
    assert_eq!(
        add(&other, json!({"text": "THEIR-NOTE lives elsewhere"})).await.0,
        201
    );
    other.stop().await;
    let s = TestServer::start_in(home.path(), ours.path(), |_| {}).await;
    assert_eq!(add(&s, json!({"text": "OUR-NOTE: run make test"})).await.0, 201);
    assert_eq!(
        add(&s, json!({"text": "USER-NOTE: call me Sam", "scope": "user"}))
            .await
            .0,
        201
    );
    let (_, before) = s.get("/memory").await;
    s.stop().await;

    let fake = FakeProvider::start().await;
    fake.script([Reply::fixture("openai/text.sse")]);
    let s = TestServer::start_in_with_route(home.path(), ours.path(), openai(&fake), |_| {}).await;
    let (_, after) = s.get("/memory").await;
    assert_eq!(after, before, "the notes are the same after a restart");
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    assert!(s.run(&sid, "hello").await.0 < 300);
    assert_completed(&sse.until("run_finished").await);
    let reqs = fake.requests();
    let system = reqs[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.contains("OUR-NOTE: run make test"), "{system}");
    assert!(system.contains("USER-NOTE: call me Sam"), "{system}");
    assert!(!system.contains("THEIR-NOTE"), "{system}");
}

// ---- Search ------------------------------------------------------------------

/// Runs `prompt` in a new session; its id and the seq of its user_message.
async fn session_with(s: &TestServer, prompt: &str) -> (String, u64) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    assert!(s.run(&sid, prompt).await.0 < 300);
    let frames = sse.until("run_finished").await;
    assert_completed(&frames);
    let seq = frames.iter().find(|f| f.event == "user_message").unwrap().seq();
    (sid, seq)
}

/// GET /search until `ok` holds for its hits (indexing is asynchronous), within the deadline.
async fn search_until(s: &TestServer, query: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (code, body) = s.get(&format!("/search?{query}")).await;
        assert_eq!(code, 200, "{query}: {body}");
        let hits = body["hits"].as_array().unwrap().clone();
        if ok(&hits) {
            return hits;
        }
        assert!(Instant::now() < deadline, "{query}: still {hits:?}");
        crate::support::poll::pause().await;
    }
}

fn sessions_of(hits: &[Value]) -> Vec<&str> {
    hits.iter().map(|h| h["session_id"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn search_finds_words_by_session_and_seq_per_workspace_across_restarts_and_deletes() {
    let home = tempfile::tempdir().unwrap();
    let (w1, w2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s = TestServer::start_in(home.path(), w1.path(), |_| {}).await;
    let (a, a_seq) = session_with(&s, "the quokka smiles at dawn").await;
    let (other, _) = session_with(&s, "nothing to see here").await;
    let hits = search_until(&s, "q=quokka", |h| h.len() == 2).await;
    let user = hits.iter().find(|h| h["role"] == "user").unwrap();
    assert_eq!(
        (user["session_id"].as_str(), user["seq"].as_u64()),
        (Some(a.as_str()), Some(a_seq))
    );
    assert_eq!(user["snippet"], "the **quokka** smiles at dawn");
    assert_eq!(user["title"], "the quokka smiles at dawn");
    let ws1 = std::fs::canonicalize(w1.path()).unwrap().display().to_string();
    assert_eq!(user["workspace"].as_str(), Some(ws1.as_str()));
    let answer = hits.iter().find(|h| h["role"] == "assistant").unwrap();
    assert!(answer["seq"].as_u64().unwrap() > a_seq, "{answer}");
    assert!(!sessions_of(&hits).contains(&other.as_str()));
    // Ranked: the message that says it twice comes first.
    let (b, _) = session_with(&s, "quokka quokka quokka").await;
    let hits = search_until(&s, "q=quokka&limit=1", |h| {
        h.len() == 1 && h[0]["session_id"] == b.as_str()
    })
    .await;
    assert_eq!(hits.len(), 1);
    s.stop().await;

    // Another workspace on the same home: its own sessions, or all of them.
    let s = TestServer::start_in(home.path(), w2.path(), |_| {}).await;
    let (c, _) = session_with(&s, "a quokka in the second workspace").await;
    let hits = search_until(&s, "q=quokka", |h| !h.is_empty()).await;
    assert_eq!(
        sessions_of(&hits).iter().filter(|x| **x != c).count(),
        0,
        "{hits:?}"
    );
    let all = search_until(&s, "q=quokka&all=true", |h| h.len() == 6).await;
    for id in [&a, &b, &c] {
        assert!(sessions_of(&all).contains(&id.as_str()), "{id}: {all:?}");
    }
    assert!(all.iter().any(|h| h["workspace"].as_str() == Some(ws1.as_str())));
    s.stop().await;

    // Back in the first workspace, after a restart: the index kept its hits,
    // and a deleted session's vanish.
    let s = TestServer::start_in(home.path(), w1.path(), |_| {}).await;
    let hits = search_until(&s, "q=quokka", |h| h.len() == 4).await;
    assert!(!sessions_of(&hits).contains(&c.as_str()));
    assert_eq!(s.delete(&format!("/sessions/{a}")).await.0, 200);
    let hits = search_until(&s, "q=quokka&all=true", |h| h.len() == 4).await;
    assert!(!sessions_of(&hits).contains(&a.as_str()), "{hits:?}");

    // gRPC answers the same.
    let mut g = s.grpc().await;
    let r = g
        .search(pb::SearchRequest {
            q: "quokka".into(),
            limit: Some(10),
            all: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.workspace, ws1);
    assert_eq!(
        r.hits.iter().map(|h| h.session_id.as_str()).collect::<Vec<_>>(),
        vec![b.as_str(), b.as_str()]
    );
}

#[tokio::test]
async fn a_missing_or_damaged_index_is_rebuilt_from_the_ledgers() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (a, seq) = session_with(&s, "the axolotl regrows").await;
    search_until(&s, "q=axolotl", |h| h.len() == 2).await;
    s.stop().await;
    let db = home.path().join("search/index.db");
    for damage in ["garbage", "remove"] {
        if damage == "remove" {
            for f in ["index.db", "index.db-wal", "index.db-shm"] {
                let _ = std::fs::remove_file(home.path().join("search").join(f));
            }
        } else {
            std::fs::write(&db, b"this is not a database").unwrap();
        }
        let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
        let hits = search_until(&s, "q=axolotl", |h| h.len() == 2).await;
        let user = hits.iter().find(|h| h["role"] == "user").unwrap();
        assert_eq!(
            (user["session_id"].as_str(), user["seq"].as_u64()),
            (Some(a.as_str()), Some(seq)),
            "{damage}"
        );
        s.stop().await;
    }
}

#[tokio::test]
async fn bad_searches_are_refused_with_a_clear_400() {
    let s = TestServer::start().await;
    let long = "a".repeat(257);
    let many = (1..=9).map(|i| format!("w{i}")).collect::<Vec<_>>().join("+");
    for (query, needle) in [
        ("", "q is required"),
        ("q=", "q is required"),
        ("q=***", "q is required"),
        (&*format!("q={long}"), "at most 256"),
        (
            &*format!("q={many}"),
            "9 different words; a query holds at most 8",
        ),
        ("q=ab*", "ab*: a prefix needs at least 3 characters before its *"),
        ("q=caf%C3%A9*", "a prefix takes ASCII letters and digits only"),
        ("q=x&limit=0", "limit 0"),
        ("q=x&limit=101", "limit 101"),
        ("q=x&limit=ten", "whole number"),
        ("q=x&all=yes", "true or false"),
        ("q=x&sort=new", "unknown query parameter"),
    ] {
        let (code, e) = s.get(&format!("/search?{query}")).await;
        assert_eq!(code, 400, "{query}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{query}: {msg}");
    }
    let (code, ok) = s.get("/search?q=nothing&limit=100&all=false").await;
    assert_eq!((code, ok["hits"].clone()), (200, json!([])));
}

// ---- Search bounds -----------------------------------------------------------

/// Eight prefixes, each of which every planted message is full of.
const PREFIXES: [&str; 8] = ["abc", "abd", "abe", "abf", "abg", "abh", "abi", "abj"];

/// The costliest query the bounds allow on the planted messages: eight
/// prefixes, each matching every word of its kind in every message.
fn pathological() -> String {
    PREFIXES.map(|p| format!("{p}*")).join("+")
}

/// Writes `n` session ledgers into `home`, each one user message of
/// `text(i)` then `zzend`: the server indexes them as it starts (the path
/// that catches the index up with every ledger it lacks).
fn plant(home: &std::path::Path, ws: &std::path::Path, n: usize, text: impl Fn(usize) -> String) {
    use vak::core::event::ClientEvent;
    use vak::core::log::ledger::Record;
    let dir = home.join("sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let workspace = std::fs::canonicalize(ws).unwrap().display().to_string();
    for i in 0..n {
        let id = format!("planted{i}");
        let lines = [
            Record::Header {
                session_id: id.clone(),
                created_at: "2026-01-01T00:00:00Z".into(),
                workspace: workspace.clone(),
            },
            Record::Event {
                seq: 1,
                event: ClientEvent::UserMessage {
                    text: format!("{} zzend", text(i)),
                    request_id: format!("r{i}"),
                    attachments: Vec::new(),
                },
            },
        ];
        let body: String = lines
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        std::fs::write(dir.join(format!("{id}.jsonl")), body).unwrap();
    }
}

/// Messages of 8000 words, every one matching one of PREFIXES (about 56
/// KiB, under the 64 KiB indexed per message), 999 different words per
/// prefix (under the 1000 a prefix may stand for). Searched without a
/// deadline, the pathological query takes 40 s here on its own.
const HEAVY: usize = 100;
fn heavy(i: usize) -> String {
    (0..8000)
        .map(|j| format!("{}{}", PREFIXES[j % 8], (i * 7 + j) % 999))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A server on a home planted with HEAVY heavy messages, once they are all indexed.
async fn heavy_server(
    tweak: impl FnOnce(&mut vak::edge::server::ServeConfig),
) -> (TestServer, tempfile::TempDir, tempfile::TempDir) {
    let (home, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    plant(home.path(), ws.path(), HEAVY, heavy);
    let s = TestServer::start_in(home.path(), ws.path(), tweak).await;
    // Snippets of a hundred such messages take a while on a busy machine:
    // a poll past its deadline is asked again.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (code, body) = s.get("/search?q=zzend&all=true&limit=100").await;
        match code {
            200 if body["hits"].as_array().unwrap().len() == HEAVY => break,
            200 | 408 => {}
            _ => panic!("{code} {body}"),
        }
        assert!(Instant::now() < deadline, "still {body}");
        crate::support::poll::pause().await;
    }
    (s, home, ws)
}

/// The costliest query the term bounds let through runs until its deadline
/// and no longer: 408 `deadline_exceeded` (gRPC DEADLINE_EXCEEDED) within
/// the deadline and a margin, and the next search answers.
#[tokio::test]
async fn a_pathological_search_stops_at_its_deadline_and_the_next_one_answers() {
    let (s, _home, _ws) = heavy_server(|_| {}).await;
    let limits = vak::core::host::search::Limits::default();
    let within = limits.deadline + Duration::from_secs(10);
    let path = format!("/search?all=true&limit=100&q={}", pathological());
    let (code, e) = tokio::time::timeout(within, s.get(&path))
        .await
        .expect("the search answers within its deadline and a margin");
    assert_eq!(code, 408, "{e}");
    assert_eq!(e["error"]["code"], "deadline_exceeded", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("ran past its deadline of 2s"), "{msg}");

    let mut g = s.grpc().await;
    let req = pb::SearchRequest {
        q: pathological().replace('+', " "),
        limit: Some(100),
        all: true,
    };
    let status = tokio::time::timeout(within, g.search(req))
        .await
        .expect("the search answers within its deadline and a margin")
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");

    let (code, ok) = s.get("/search?q=zzend&all=true&limit=1").await;
    assert_eq!(
        (code, ok["hits"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{ok}"
    );
}

/// Four searches run at once; a fifth is refused at once with 429
/// `resource_exhausted` (gRPC RESOURCE_EXHAUSTED), not queued. A search
/// whose client disconnects stops its query: with a deadline of ten
/// minutes, the slots come free as soon as the four clients leave.
#[tokio::test]
async fn searches_past_the_cap_get_429_and_a_search_whose_client_left_frees_its_slot() {
    let (s, _home, _ws) = heavy_server(|c| c.core.search.deadline = Duration::from_secs(600)).await;
    let running: Vec<_> = (0..4)
        .map(|_| {
            let (http, url) = (
                s.http(),
                format!("{}/search?all=true&limit=100&q={}", s.url, pathological()),
            );
            tokio::spawn(async move { http.get(url).send().await.map(|r| r.status()) })
        })
        .collect();
    let deadline = Instant::now() + DEADLINE;
    let refused = loop {
        let (code, body) = s.get("/search?q=zzend&all=true&limit=1").await;
        if code == 429 {
            break body;
        }
        assert_eq!(code, 200, "{body}");
        assert!(
            Instant::now() < deadline,
            "the four searches never filled the slots"
        );
        crate::support::poll::pause().await;
    };
    assert_eq!(refused["error"]["code"], "resource_exhausted", "{refused}");
    let msg = refused["error"]["message"].as_str().unwrap();
    assert!(msg.contains("4 searches are running, the most at once"), "{msg}");
    let mut g = s.grpc().await;
    let status = g
        .search(pb::SearchRequest {
            q: "zzend".into(),
            limit: Some(1),
            all: true,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    for r in &running {
        assert!(!r.is_finished(), "a pathological search finished on its own");
        r.abort();
    }
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (code, body) = s.get("/search?q=zzend&all=true&limit=1").await;
        if code == 200 {
            break;
        }
        assert_eq!(code, 429, "{body}");
        assert!(
            Instant::now() < deadline,
            "the searches of the clients that left still hold their slots"
        );
        crate::support::poll::pause().await;
    }
}

/// A prefix that stands for more than 1000 indexed words is refused with a
/// 400 naming the rule; a longer one is searched.
#[tokio::test]
async fn a_prefix_standing_for_too_many_words_is_refused() {
    let (home, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    plant(home.path(), ws.path(), 1, |_| {
        (0..=1000)
            .map(|i| format!("exp{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    });
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    search_until(&s, "q=zzend&all=true", |h| h.len() == 1).await;
    let (code, e) = s.get("/search?q=exp*&all=true").await;
    assert_eq!(code, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("exp*: the prefix matches more than 1000 indexed words; type more of it"),
        "{msg}"
    );
    let (code, ok) = s.get("/search?q=EXP99*&all=true").await;
    assert_eq!(code, 200, "{ok}");
    assert_eq!(ok["hits"].as_array().unwrap().len(), 1, "{ok}");
    let snippet = ok["hits"][0]["snippet"].as_str().unwrap();
    // The sixteen words around the most matches (exp990 to exp999).
    assert!(
        snippet.starts_with('…') && snippet.contains("**exp990** **exp991**"),
        "{snippet}"
    );
}
