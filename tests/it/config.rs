//! The configuration surface end to end: GET/PATCH /config with revisions and persistence, the key store behind PUT/DELETE /config/key, GET /providers and live model listings, config frames on /stream, the same over gRPC, and config.toml at startup of the real binary. A provider is reached through the real OpenAI/Anthropic clients against a fake model service (tests/it/support/fake_provider.rs).

use crate::support;
use crate::support::fake_provider::{fixture, FakeProvider, Reply};
use crate::support::*;
use serde_json::{json, Value};
use std::path::Path;
use vak::core::provider::{ProviderKind, Secret};
use vak::proto::v1 as pb;

/// A key no test would find by accident.
const KEY: &str = "sk-vaktest-5f2b9c1e7a3d4b6f8e0a1c2d3e4f5a6b";
/// Another, for a second provider.
const ANTHROPIC_KEY: &str = "sk-ant-vaktest-9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a";

/// A base URL that is only ever stored (and probed), never asked for a turn.
const LOCAL: &str = "http://127.0.0.1:9/v1";

/// A base URL where nothing listens: a port taken, then let go.
async fn unreachable_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("http://{}/v1", l.local_addr().unwrap())
}

/// An OpenAI-style 401 that quotes the key back, as api.openai.com does.
fn refused_key_body(key: &str) -> String {
    format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
    )
}

async fn send(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value, String) {
    let mut req = s.http().request(method, format!("{}{path}", s.url));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null), text)
}

async fn patch(s: &TestServer, body: Value) -> (u16, Value) {
    let (st, v, _) = send(s, reqwest::Method::PATCH, "/config", Some(body)).await;
    (st, v)
}

async fn put_key(s: &TestServer, provider: &str, key: &str) {
    let (st, v, _) = send(
        s,
        reqwest::Method::PUT,
        "/config/key",
        Some(json!({"provider": provider, "key": key})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// Runs `prompt` on `sid` and returns its frames up to run_finished.
async fn run_to_end(s: &TestServer, ev: &mut Sse, sid: &str, prompt: &str) -> Vec<Frame> {
    let (st, v) = s.run(sid, prompt).await;
    assert_eq!(st, 202, "{v}");
    ev.until("run_finished").await
}

#[tokio::test]
async fn get_config_shows_the_default_offline_route() {
    let s = TestServer::start().await;
    let (st, v) = s.get("/config").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["route"]["provider"], "offline");
    assert_eq!(v["route"]["model"], "offline");
    assert_eq!(v["route"]["source"], "default");
    assert_eq!(v["route"]["label"], "Offline echo model");
    assert!(v["route"].get("base_url").is_none(), "{v}");
    assert_eq!(v["permission_mode"], "default");
    assert_eq!(v["max_turns"], 50);
    assert!(!v["revision"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn patch_changes_the_route_keylessly_for_a_local_server_with_revisions() {
    let s = TestServer::start().await;
    let r = s.http().get(format!("{}/config", s.url)).send().await.unwrap();
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    let before: Value = r.json().await.unwrap();
    let rev0 = before["revision"].as_str().unwrap().to_string();
    assert_eq!(etag, format!("\"{rev0}\""), "the revision is also the ETag");

    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "llama3", "base_url": LOCAL, "revision": rev0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (_, mut now) = s.get("/config").await;
    now["warnings"] = v["warnings"].clone(); // the PATCH answer's own (its probe's)
    assert_eq!(now, v, "the answer is the new effective configuration");
    assert_eq!(now["route"]["provider"], "openai");
    assert_eq!(now["route"]["model"], "llama3");
    assert_eq!(now["route"]["base_url"], LOCAL);
    assert_eq!(now["route"]["source"], "api");
    assert_eq!(now["route"]["label"], "OpenAI-compatible");
    let rev1 = now["revision"].as_str().unwrap().to_string();
    assert_ne!(rev1, rev0);

    // The old revision is stale, in the body or in If-Match.
    let (st, v) = patch(&s, json!({"model": "other", "revision": rev0})).await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("stale revision"),
        "{v}"
    );
    let r = s
        .http()
        .patch(format!("{}/config", s.url))
        .header("if-match", format!("\"{rev0}\""))
        .json(&json!({"model": "other"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    // The current one in If-Match works; the model changes and the URL stays.
    let r = s
        .http()
        .patch(format!("{}/config", s.url))
        .header("if-match", rev1.as_str())
        .json(&json!({"model": "llama3.1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["route"]["model"], "llama3.1");
    assert_eq!(v["route"]["base_url"], LOCAL);
    assert_ne!(v["revision"], rev1.as_str());

    let r = s
        .http()
        .patch(format!("{}/config", s.url))
        .header("if-match", "*")
        .json(&json!({"model": "llama3.2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "If-Match: * checks nothing");

    // Refusals change nothing.
    let (_, at) = s.get("/config").await;
    let (st, v) = patch(&s, json!({"provider": "gemini"})).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("invalid_argument")),
        "{v}"
    );
    let (st, v) = patch(&s, json!({"provider": "anthropic", "model": "claude-x"})).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["kind"], "no_ai_service", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ANTHROPIC_API_KEY"),
        "{v}"
    );
    let (st, v) = patch(&s, json!({"provider": "anthropic"})).await;
    assert_eq!(st, 400, "switching provider needs a model: {v}");
    let (st, v) = patch(&s, json!({"base_url": "ftp://x"})).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = patch(&s, json!({"provider": "offline", "base_url": LOCAL})).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = patch(&s, json!({"modle": "x"})).await;
    assert_eq!(st, 400, "unknown fields are refused: {v}");
    assert_eq!(s.get("/config").await.1, at);

    // Back to offline: no model needed, the URL goes.
    let (st, v) = patch(&s, json!({"provider": "offline"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["route"]["model"], "offline");
    assert!(v["route"].get("base_url").is_none(), "{v}");
}

#[tokio::test]
async fn a_patched_route_is_persisted_and_a_restart_starts_on_it() {
    let s = TestServer::start().await;
    std::fs::write(
        s.home.join("config.toml"),
        "# my settings\n[server]\ntrusted_hosts = [\"vak.test\"] # keep me\n",
    )
    .unwrap();
    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "qwen", "base_url": LOCAL}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let text = std::fs::read_to_string(s.home.join("config.toml")).unwrap();
    assert!(
        text.contains("# my settings") && text.contains("# keep me"),
        "{text}"
    );
    assert!(
        text.contains("[model]") && text.contains("provider = \"openai\""),
        "{text}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.home.join("config.toml"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let revision = v["revision"].clone();

    let dirs = s.stop().await.unwrap();
    let again = TestServer::start_in(dirs.0.path(), dirs.1.path(), |_| {}).await;
    let (_, v) = again.get("/config").await;
    assert_eq!(v["route"]["provider"], "openai");
    assert_eq!(v["route"]["model"], "qwen");
    assert_eq!(v["route"]["base_url"], LOCAL);
    assert_eq!(v["route"]["source"], "file");
    assert_ne!(v["revision"], revision, "a restart never reuses a revision");
    // Flags win over the file.
    again.stop().await;
    let flagged = TestServer::start_in(dirs.0.path(), dirs.1.path(), |cfg| {
        cfg.core.route_flags.provider = Some(ProviderKind::Offline);
    })
    .await;
    let (_, v) = flagged.get("/config").await;
    assert_eq!(
        (v["route"]["provider"].as_str(), v["route"]["source"].as_str()),
        (Some("offline"), Some("flag"))
    );
    flagged.stop().await;
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn assert_key_in_no_file(home: &Path) {
    assert_in_no_file(home, KEY);
}

/// No file under `home` holds `key`.
fn assert_in_no_file(home: &Path, key: &str) {
    let mut files = Vec::new();
    files_under(home, &mut files);
    assert!(!files.is_empty());
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
            "the key is in {}",
            f.display()
        );
    }
}

fn fingerprint(key: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[tokio::test]
async fn a_stored_key_shows_as_a_fingerprint_and_never_as_itself() {
    let s = TestServer::start().await;
    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers", None).await;
    assert_eq!(st, 200);
    let names: Vec<_> = v["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["offline", "openai", "anthropic"]);
    assert_eq!(v["providers"][1]["configured"], false);
    assert_eq!(v["providers"][1]["pool_size"], 0);

    let (st, v, text) = send(
        &s,
        reqwest::Method::PUT,
        "/config/key",
        Some(json!({"provider": "openai", "key": KEY})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"provider": "openai", "stored": true, "fingerprint": fingerprint(KEY)})
    );
    assert!(!text.contains(KEY));

    let (_, v, text) = send(&s, reqwest::Method::GET, "/providers", None).await;
    assert!(!text.contains(KEY), "{text}");
    let openai = &v["providers"][1];
    assert_eq!(openai["label"], "OpenAI-compatible");
    assert_eq!(openai["configured"], true);
    assert_eq!(openai["pool_size"], 1);
    assert_eq!(openai["fingerprints"], json!([fingerprint(KEY)]));
    assert_eq!(openai["key_sources"], json!(["store"]));
    // A session's ledger, the index, config.toml: no file under the home holds it.
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    s.run(&sid, "hello").await;
    ev.until("run_finished").await;
    assert_key_in_no_file(&s.home);
    let mode = |p: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(s.home.join(p)).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(
        (
            mode("secrets"),
            mode("secrets/keys.enc"),
            mode("secrets/master.key")
        ),
        (0o700, 0o600, 0o600)
    );

    // With the key the route needs no base URL.
    let (st, v) = patch(&s, json!({"provider": "openai", "model": "gpt-x"})).await;
    assert_eq!(st, 200, "{v}");
    assert!(!v.to_string().contains(KEY));

    // Bad keys are refused without echoing them.
    for (body, why) in [
        (json!({"provider": "openai", "key": ""}), "empty"),
        (json!({"provider": "openai", "key": "sk-bad\u{1}x"}), "control"),
        (json!({"provider": "openai", "key": "k".repeat(5000)}), "longer"),
        (json!({"provider": "offline", "key": "sk-abc"}), "no key"),
        (json!({"provider": "nope", "key": "sk-abc"}), "unknown provider"),
    ] {
        let (st, v, _) = send(&s, reqwest::Method::PUT, "/config/key", Some(body)).await;
        assert_eq!(st, 400, "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(why), "{m}");
        assert!(!m.contains("sk-"), "{m}");
    }

    let (st, v, _) = send(
        &s,
        reqwest::Method::DELETE,
        "/config/key",
        Some(json!({"provider": "openai"})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(
        v,
        json!({"provider": "openai", "deleted": true, "shadowed_by_env": false})
    );
    let (_, v, _) = send(
        &s,
        reqwest::Method::DELETE,
        "/config/key",
        Some(json!({"provider": "openai"})),
    )
    .await;
    assert_eq!(v["deleted"], false);
    let (_, v, _) = send(&s, reqwest::Method::GET, "/providers", None).await;
    assert_eq!(v["providers"][1]["pool_size"], 0);
    // The route lost its key: a restart on it would refuse to start, so go offline.
    let (st, _) = patch(&s, json!({"provider": "offline"})).await;
    assert_eq!(st, 200);
    // The key survives a restart while stored.
    let (st, _, _) = send(
        &s,
        reqwest::Method::PUT,
        "/config/key",
        Some(json!({"provider": "anthropic", "key": KEY})),
    )
    .await;
    assert_eq!(st, 200);
    let dirs = s.stop().await.unwrap();
    let again = TestServer::start_in(dirs.0.path(), dirs.1.path(), |_| {}).await;
    let (_, v, _) = send(&again, reqwest::Method::GET, "/providers", None).await;
    assert_eq!(v["providers"][2]["fingerprints"], json!([fingerprint(KEY)]));
    assert_key_in_no_file(&again.home);
    again.stop().await;
}

#[tokio::test]
async fn environment_keys_win_and_pool_with_stored_ones() {
    let fake = FakeProvider::start().await;
    let s = TestServer::start_with(|cfg| {
        cfg.core.env.keys = vec![(ProviderKind::OpenAi, Secret::new("sk-from-env".into()))];
    })
    .await;
    put_key(&s, "openai", KEY).await;
    let (_, v, _) = send(&s, reqwest::Method::GET, "/providers", None).await;
    let openai = &v["providers"][1];
    assert_eq!(openai["pool_size"], 2);
    assert_eq!(openai["key_sources"], json!(["env", "store"]));
    assert_eq!(
        openai["fingerprints"],
        json!([fingerprint("sk-from-env"), fingerprint(KEY)])
    );
    // The service is asked with the environment's key.
    let base = format!("{}/v1", fake.url);
    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "gpt-4.1", "base_url": base}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    fake.script([Reply::status(200, &fixture("openai/models.json"))]);
    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        fake.requests()[0].header("authorization"),
        Some("Bearer sk-from-env")
    );

    let (_, v, _) = send(
        &s,
        reqwest::Method::DELETE,
        "/config/key",
        Some(json!({"provider": "openai"})),
    )
    .await;
    assert_eq!(
        v,
        json!({"provider": "openai", "deleted": true, "shadowed_by_env": true})
    );
}

#[tokio::test]
async fn model_listings_are_live_and_fail_with_a_reason_never_a_fallback() {
    let fake = FakeProvider::start().await;
    let s = TestServer::start().await;
    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/offline/models", None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "offline");
    assert_eq!(v["models"][0]["id"], "offline");

    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["kind"], "no_ai_service", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("OPENAI_API_KEY"),
        "{v}"
    );

    // The provider is what the path names: one vak does not know is not found.
    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/nope/models", None).await;
    assert_eq!((st, &v["error"]["code"]), (404, &json!("not_found")), "{v}");
    assert!(fake.requests().is_empty());

    // With a stored key, against the route's service: what it lists, asked
    // with the key; the answer never holds the key.
    put_key(&s, "openai", KEY).await;
    let base = format!("{}/v1", fake.url);
    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "gpt-4.1", "base_url": base}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    fake.script([Reply::status(200, &fixture("openai/models.json"))]);
    let (st, v, text) = send(&s, reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "openai");
    assert_eq!(
        v["models"],
        json!([
            {"id": "gpt-4.1", "display_name": "gpt-4.1"},
            {"id": "gpt-4.1-mini", "display_name": "gpt-4.1-mini"},
            {"id": "o3", "display_name": "o3"},
            {"id": "text-embedding-3-small", "display_name": "text-embedding-3-small"},
        ])
    );
    assert!(!text.contains(KEY), "{text}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "the PATCH's probe, then the listing");
    assert_eq!(
        (reqs[1].method.as_str(), reqs[1].path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(
        reqs[1].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );

    // A refused key: 502 with the reason; neither the key nor the service's
    // body (which quotes it) comes back.
    fake.script([Reply::status(401, &refused_key_body(KEY))]);
    let (st, v, text) = send(&s, reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 502, "{v}");
    assert_eq!(v["error"]["code"], "bad_gateway");
    assert_eq!(v["error"]["reason"], "auth");
    assert_eq!(v["error"]["message"], "the model service refused the API key");
    assert!(
        !text.contains(KEY) && !text.contains("Incorrect API key"),
        "{text}"
    );
    assert_eq!(fake.requests().len(), 3, "a refused listing is not retried");

    // Anthropic: its own wire format, its own key, as x-api-key.
    put_key(&s, "anthropic", ANTHROPIC_KEY).await;
    let (st, v) = patch(
        &s,
        json!({"provider": "anthropic", "model": "claude-sonnet-4-5", "base_url": fake.url}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    fake.script([Reply::status(200, &fixture("anthropic/models.json"))]);
    let (st, v, text) = send(&s, reqwest::Method::GET, "/providers/anthropic/models", None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "anthropic");
    assert_eq!(
        v["models"],
        json!([
            {"id": "claude-sonnet-4-5-20250929", "display_name": "Claude Sonnet 4.5"},
            {"id": "claude-opus-4-1-20250805", "display_name": "Claude Opus 4.1"},
            {"id": "claude-3-5-haiku-20241022", "display_name": "Claude Haiku 3.5"},
        ])
    );
    assert!(!text.contains(ANTHROPIC_KEY), "{text}");
    let r = &fake.requests()[4];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/v1/models"));
    assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_KEY));
    assert!(r.header("anthropic-version").is_some());
    assert_eq!(r.header("authorization"), None);

    // Against an unreachable local server: 502 with the reason.
    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "m", "base_url": unreachable_url().await}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 502, "{v}");
    assert_eq!(v["error"]["code"], "bad_gateway");
    assert_eq!(v["error"]["reason"], "network");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not reach"),
        "{v}"
    );
    assert_eq!(fake.requests().len(), 5);
    assert_key_in_no_file(&s.home);
}

#[tokio::test]
async fn a_patched_route_is_live_and_carries_the_stored_key_to_the_service_only() {
    let fake = FakeProvider::start().await;
    let s = TestServer::start().await;
    put_key(&s, "openai", KEY).await;
    let base = format!("{}/v1", fake.url);
    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "gpt-4.1", "base_url": base}),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    fake.script([Reply::fixture("openai/text.sse")]);
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    let frames = run_to_end(&s, &mut ev, &sid, "say hello").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "the PATCH's probe, then the turn");
    let r = &reqs[1];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(r.body["model"], "gpt-4.1");
    assert_eq!(
        r.body["messages"].as_array().unwrap().last().unwrap(),
        &json!({"role": "user", "content": "say hello"})
    );
    assert!(!all_text(&frames).contains(KEY));
    let (_, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(!transcript.to_string().contains(KEY));

    // A deleted key is no longer sent: the route goes on keyless (a local
    // server needs none).
    let (st, v, _) = send(
        &s,
        reqwest::Method::DELETE,
        "/config/key",
        Some(json!({"provider": "openai"})),
    )
    .await;
    assert_eq!((st, &v["deleted"]), (200, &json!(true)), "{v}");
    fake.script([Reply::fixture("openai/text.sse")]);
    let frames = run_to_end(&s, &mut ev, &sid, "again").await;
    assert_completed(&frames);
    let reqs = fake.wait_requests(3).await;
    assert_eq!(reqs[2].header("authorization"), None);
    assert_key_in_no_file(&s.home);
}

#[tokio::test]
async fn stream_clients_that_asked_get_a_config_frame_on_every_route_change() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let resp = s
        .http()
        .get(format!("{}/stream?session={sid}&config=1", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut sse = Sse::new(resp);
    let first = next_config(&mut sse).await;
    assert_eq!(first["route"]["provider"], "offline");
    let (_, v) = patch(&s, json!({"provider": "openai", "model": "m", "base_url": LOCAL})).await;
    let mut second = next_config(&mut sse).await;
    second["warnings"] = v["warnings"].clone(); // the PATCH answer's own (its probe's)
    assert_eq!(second, v, "the frame is the GET /config body");
    patch(&s, json!({"model": "n"})).await;
    assert_eq!(next_config(&mut sse).await["route"]["model"], "n");
}

#[tokio::test]
async fn stream_clients_that_did_not_ask_get_no_config_frame() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let open = |query: String| {
        let req = s.http().get(format!("{}/stream?{query}", s.url));
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            Sse::new(resp)
        }
    };
    let mut asked = open(format!("session={sid}&config=1")).await;
    let mut plain = open(format!("session={sid}")).await;
    next_config(&mut asked).await;
    patch(&s, json!({"provider": "openai", "model": "m", "base_url": LOCAL})).await;
    next_config(&mut asked).await;
    let (st, v) = patch(&s, json!({"provider": "offline"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(next_config(&mut asked).await["route"]["provider"], "offline");
    // The changes were delivered; a run's frames come after anything they
    // could have sent the plain stream.
    let (st, v) = s.run(&sid, "hi").await;
    assert_eq!(st, 202, "{v}");
    let mut kinds = Vec::new();
    loop {
        let f = plain.next().await.expect("a frame");
        kinds.push(f.event.clone());
        if f.event == "agent" && agent_kind(&f.data) == "run_finished" {
            break;
        }
    }
    assert!(!kinds.iter().any(|k| k == "config"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "presentation"), "{kinds:?}");
}

async fn next_config(sse: &mut Sse) -> Value {
    loop {
        let f = sse.next().await.expect("a frame");
        if f.event == "config" {
            return f.data;
        }
    }
}

#[tokio::test]
async fn the_same_over_grpc() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let cfg = c.get_config(pb::GetConfigRequest {}).await.unwrap().into_inner();
    let route = cfg.route.clone().unwrap();
    assert_eq!(
        (route.provider.as_str(), route.source().json_name()),
        ("offline", "default")
    );

    let set = c
        .set_key(pb::SetKeyRequest {
            provider: "anthropic".into(),
            key: KEY.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(set.stored);
    assert_eq!(set.fingerprint, fingerprint(KEY));
    let providers = c
        .list_providers(pb::ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(providers.providers[2].pool_size, 1);
    assert!(!format!("{providers:?}").contains(KEY));

    // A Stream that asked for config frames gets one now and one per change.
    let mut stream = c
        .stream(pb::StreamRequest {
            config: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut next_config = async || loop {
        let m = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(pb::stream_message::Frame::Config(c)) = m.frame {
            return c;
        }
    };
    assert_eq!(next_config().await.revision, cfg.revision);

    let stale = c
        .update_config(pb::UpdateConfigRequest {
            model: Some("x".into()),
            revision: Some("not-it".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
    let updated = c
        .update_config(pb::UpdateConfigRequest {
            provider: Some("anthropic".into()),
            model: Some("claude-x".into()),
            revision: Some(cfg.revision.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.route.as_ref().unwrap().source(), pb::RouteSource::Api);
    assert_ne!(updated.revision, cfg.revision);
    assert_eq!(
        next_config().await,
        updated,
        "the config frame is the new configuration"
    );

    let none = c
        .list_models(pb::ListModelsRequest {
            provider: "openai".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::FailedPrecondition);
    assert_eq!(none.metadata().get("vak-error-kind").unwrap(), "no_ai_service");
    let deleted = c
        .delete_key(pb::DeleteKeyRequest {
            provider: "anthropic".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(deleted.deleted && !deleted.shadowed_by_env);
}

// The real binary: startup from config.toml and the environment, logs.

fn vak_serve(home: &Path, ws: &Path, extra: &[&str]) -> Serve {
    Serve::new()
        .token("config-test-token-0123456789abcdef")
        .home(home)
        .workspace(ws)
        .args(extra)
}

/// A running binary: its URL, and its stderr.
struct Running {
    served: Served,
    url: String,
}

impl Running {
    async fn start(serve: Serve) -> Running {
        let served = serve.start().await;
        Running {
            url: served.url.clone(),
            served,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url))
            .bearer_auth("config-test-token-0123456789abcdef");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// Stops it with SIGTERM; every stderr line it wrote (`wait` reads its stderr to the end).
    async fn stop(mut self) -> Vec<String> {
        self.served.vak.signal("TERM");
        self.served.vak.wait().await;
        self.served.vak.log().lines().map(str::to_string).collect()
    }
}

async fn exit_of(serve: Serve) -> (bool, String) {
    let out = serve.output().await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn delete_says_whether_the_environment_still_exports_a_key_and_no_log_line_holds_it() {
    for exported in [false, true] {
        let home = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut serve = vak_serve(home.path(), ws.path(), &[]);
        if exported {
            serve = serve.env("OPENAI_API_KEY", "sk-exported-by-the-environment");
        }
        let v = Running::start(serve).await;
        let (st, body) = v
            .call(
                reqwest::Method::PUT,
                "/config/key",
                Some(json!({"provider": "openai", "key": KEY})),
            )
            .await;
        assert_eq!(st, 200, "{body}");
        let (_, providers) = v.call(reqwest::Method::GET, "/providers", None).await;
        assert_eq!(
            providers["providers"][1]["pool_size"],
            if exported { 2 } else { 1 }
        );
        let (st, body) = v
            .call(
                reqwest::Method::DELETE,
                "/config/key",
                Some(json!({"provider": "openai"})),
            )
            .await;
        assert_eq!(st, 200);
        assert_eq!(
            body,
            json!({"provider": "openai", "deleted": true, "shadowed_by_env": exported})
        );
        let lines = v.stop().await;
        assert!(
            lines.iter().any(|l| l.contains("/config/key")),
            "the access log saw the calls: {lines:?}"
        );
        for l in &lines {
            assert!(
                !l.contains(KEY) && !l.contains("sk-exported"),
                "a log line holds a key: {l}"
            );
        }
        assert_key_in_no_file(home.path());
    }
}

#[tokio::test]
async fn a_stored_key_reaches_the_service_and_no_log_line() {
    let fake = FakeProvider::start().await;
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let v = Running::start(vak_serve(home.path(), ws.path(), &[])).await;
    let (st, body) = v
        .call(
            reqwest::Method::PUT,
            "/config/key",
            Some(json!({"provider": "openai", "key": KEY})),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = v
        .call(
            reqwest::Method::PATCH,
            "/config",
            Some(json!({"provider": "openai", "model": "gpt-4.1", "base_url": format!("{}/v1", fake.url)})),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    fake.script([
        Reply::status(200, &fixture("openai/models.json")),
        Reply::status(401, &refused_key_body(KEY)),
    ]);
    let (st, body) = v
        .call(reqwest::Method::GET, "/providers/openai/models", None)
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["models"][0]["id"], "gpt-4.1");
    let (st, body) = v
        .call(reqwest::Method::GET, "/providers/openai/models", None)
        .await;
    assert_eq!((st, &body["error"]["reason"]), (502, &json!("auth")), "{body}");
    assert!(!body.to_string().contains(KEY), "{body}");
    for r in fake.requests() {
        assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    }
    let lines = v.stop().await;
    // The service's refusal is logged, with the key it quoted taken out.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Incorrect API key provided: [redacted]")),
        "{lines:?}"
    );
    for l in &lines {
        assert!(!l.contains(KEY), "a log line holds the key: {l}");
    }
    assert_key_in_no_file(home.path());
}

#[tokio::test]
async fn config_toml_sections_this_version_ignores_warn_once_and_typos_in_known_ones_stop_startup() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let conf = home.path().join("config.toml");
    std::fs::write(
        &conf,
        "[server]\ntrusted_hosts = []\n\n[model]\nprovider = \"offline\"\n\n[finops]\nmax_day_usd = 5\n\n[mcp.servers.fs]\ncommand = \"x\"\n\n[theme]\nname = \"dark\"\n",
    )
    .unwrap();
    let v = Running::start(vak_serve(home.path(), ws.path(), &["--max-turns", "7"])).await;
    let (_, cfg) = v.call(reqwest::Method::GET, "/config", None).await;
    assert_eq!(cfg["max_turns"], 7);
    assert_eq!(cfg["route"]["source"], "file");
    let lines = v.stop().await;
    let warned: Vec<_> = lines.iter().filter(|l| l.contains("ignored")).collect();
    assert_eq!(warned.len(), 1, "{lines:?}");
    assert!(warned[0].contains("[theme]"), "{}", warned[0]);
    for read in ["[mcp]", "[finops]"] {
        assert!(!warned[0].contains(read), "{read} is read: {}", warned[0]);
    }

    std::fs::write(&conf, "[model]\nprovider = \"offline\"\nmodle = \"x\"\n").unwrap();
    let (ok, stderr) = exit_of(vak_serve(home.path(), ws.path(), &[])).await;
    assert!(!ok);
    assert!(stderr.contains("modle") && stderr.contains("line 3"), "{stderr}");

    std::fs::write(&conf, "[model]\nprovider = \"gemini\"\n").unwrap();
    let (ok, stderr) = exit_of(vak_serve(home.path(), ws.path(), &[])).await;
    assert!(!ok);
    assert!(stderr.contains("unknown provider \"gemini\""), "{stderr}");
}

#[tokio::test]
async fn a_real_provider_without_a_key_is_a_clear_startup_error() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let (ok, stderr) = exit_of(vak_serve(
        home.path(),
        ws.path(),
        &["--provider", "openai", "--model", "gpt-4o"],
    ))
    .await;
    assert!(!ok);
    // The server does not start: the error says what works before it runs.
    for what in [
        "no API key for the openai provider",
        "`OPENAI_API_KEY=… vak serve --provider openai …`",
        "--base-url for a local server",
        "start with --provider offline, store it with PUT /config/key",
    ] {
        assert!(stderr.contains(what), "{what:?} in {stderr}");
    }
    // And it does: a key stored through a server on the offline provider is
    // found by a later start with the real provider.
    let v = Running::start(vak_serve(home.path(), ws.path(), &["--provider", "offline"])).await;
    let (code, _) = v
        .call(
            reqwest::Method::PUT,
            "/config/key",
            Some(serde_json::json!({"provider": "openai", "key": "sk-stored-for-a-later-start"})),
        )
        .await;
    assert_eq!(code, 200);
    v.stop().await;
    let v = Running::start(vak_serve(
        home.path(),
        ws.path(),
        &["--provider", "openai", "--model", "gpt-4o"],
    ))
    .await;
    let (_, cfg) = v.call(reqwest::Method::GET, "/config", None).await;
    assert_eq!(cfg["route"]["provider"].as_str(), Some("openai"), "{cfg}");
    v.stop().await;
    let (ok, stderr) = exit_of(vak_serve(home.path(), ws.path(), &["--provider", "gemini"])).await;
    assert!(!ok);
    assert!(stderr.contains("unknown provider"), "{stderr}");
    let (ok, stderr) = exit_of(vak_serve(home.path(), ws.path(), &["--provider", "anthropic"])).await;
    assert!(!ok);
    assert!(stderr.contains("needs a model"), "{stderr}");
    // Flags over the environment.
    let serve = vak_serve(home.path(), ws.path(), &["--provider", "offline"]).env("VAK_PROVIDER", "openai");
    let v = Running::start(serve).await;
    let (_, cfg) = v.call(reqwest::Method::GET, "/config", None).await;
    assert_eq!(
        (cfg["route"]["provider"].as_str(), cfg["route"]["source"].as_str()),
        (Some("offline"), Some("flag"))
    );
    v.stop().await;
}

#[tokio::test]
async fn a_running_leg_keeps_its_route_and_the_next_one_takes_the_new_route() {
    let (old, new) = (FakeProvider::start().await, FakeProvider::start().await);
    // The old service is reached through a proxy that holds the connection
    // until let through (once the PATCH's probe passed): the leg is surely
    // running when the route changes.
    let gate = HoldProxy::start(old.addr).await;
    let s = TestServer::start_with(|cfg| cfg.core.provider_retries = 0).await;
    let (st, v) = patch(
        &s,
        json!({"provider": "openai", "model": "gpt-4.1", "base_url": format!("{}/v1", gate.url)}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    old.script([Reply::fixture("openai/text.sse")]);
    gate.hold();
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    let (st, _) = s.run(&sid, "first").await;
    assert_eq!(st, 202);
    ev.until("turn_started").await;
    let (st, v) = patch(
        &s,
        json!({"provider": "anthropic", "model": "claude-sonnet-4-5", "base_url": new.url}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    new.script([Reply::fixture("anthropic/text.sse")]); // after the PATCH's probe
    gate.release();
    let frames = ev.until("run_finished").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    let asked = old.wait_requests(2).await;
    assert_eq!(asked[1].path, "/v1/chat/completions");
    assert_eq!(asked[1].body["model"], "gpt-4.1");
    assert_eq!(new.requests().len(), 1, "the running leg kept the old route");

    // The next leg asks the new route.
    let frames = run_to_end(&s, &mut ev, &sid, "second").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    let asked = new.requests();
    assert_eq!(asked.len(), 2, "its probe, then the turn");
    assert_eq!(
        (asked[1].path.as_str(), &asked[1].body["model"]),
        ("/v1/messages", &json!("claude-sonnet-4-5"))
    );
    assert_eq!(old.requests().len(), 2);
}

#[tokio::test]
async fn max_turns_defaults_to_50_without_the_flag() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let v = Running::start(vak_serve(home.path(), ws.path(), &[])).await;
    let (st, cfg) = v.call(reqwest::Method::GET, "/config", None).await;
    assert_eq!((st, &cfg["max_turns"]), (200, &json!(50)), "{cfg}");
    v.stop().await;
}

/// An exported key, distinct from the stored ones.
const ENV_KEY: &str = "sk-env-vaktest-3c1d9e8f7a6b5c4d3e2f1a0b9c8d7e6f";

#[tokio::test]
async fn no_key_reaches_a_log_line_or_a_file_through_failing_turns_listings_and_key_changes() {
    use support::process::STDERR_TAIL;
    let fake = FakeProvider::start().await;
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let served = Serve::new()
        .home(home.path())
        .workspace(ws.path())
        .args(["--provider", "openai", "--model", "gpt-4.1", "--base-url"])
        .arg(format!("{}/v1", fake.url))
        .env("OPENAI_API_KEY", ENV_KEY)
        // As verbose as an operator debugging a provider would make it.
        .env("RUST_LOG", "debug")
        .start()
        .await;
    let s = served.api();
    let mut server = served.vak;
    let mut answers: Vec<Value> = Vec::new();
    let mut call = async |method: reqwest::Method, path: &str, body: Option<Value>| {
        let (st, v) = s.send(method, path, body).await;
        answers.push(v.clone());
        (st, v)
    };
    let (st, v) = call(
        reqwest::Method::PUT,
        "/config/key",
        Some(json!({"provider": "anthropic", "key": ANTHROPIC_KEY})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // Stored, and shadowed by the exported one.
    let (st, v) = call(
        reqwest::Method::PUT,
        "/config/key",
        Some(json!({"provider": "openai", "key": KEY})),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    // Rate limited (retried), then the key refused, quoted back by the service.
    fake.script([
        Reply::status(429, &refused_key_body(ENV_KEY)).header("retry-after-ms", "1"),
        Reply::status(401, &refused_key_body(ENV_KEY)),
    ]);
    let frames = run_to_end(&s, &mut ev, &sid, "hi").await;
    assert_eq!(
        finished(&frames)["message"],
        "the model service refused the API key"
    );
    // An error in the middle of the stream, retried.
    fake.script([
        Reply::fixture("openai/midstream_error.sse"),
        Reply::fixture("openai/text.sse"),
    ]);
    let frames = run_to_end(&s, &mut ev, &sid, "again").await;
    assert_completed(&frames);
    let mut seen = all_text(&frames);
    // Model listings: one answered, one refused.
    fake.script([
        Reply::status(200, &fixture("openai/models.json")),
        Reply::status(401, &refused_key_body(ENV_KEY)),
    ]);
    let (st, v) = call(reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 502, "{v}");
    for r in fake.requests() {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {ENV_KEY}").as_str()),
            "the exported key wins"
        );
    }

    // The stored Anthropic key: overloaded, then refused.
    let (st, v) = call(
        reqwest::Method::PATCH,
        "/config",
        Some(json!({"provider": "anthropic", "model": "claude-sonnet-4-5", "base_url": fake.url})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let asked = fake.requests().len();
    fake.script([
        Reply::status(529, r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
            .header("retry-after-ms", "1"),
        Reply::status(
            401,
            &format!(r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key: {ANTHROPIC_KEY}"}}}}"#),
        ),
        Reply::status(200, &fixture("anthropic/models.json")),
    ]);
    let frames = run_to_end(&s, &mut ev, &sid, "and again").await;
    assert_eq!(
        finished(&frames)["message"],
        "the model service refused the API key"
    );
    seen.push_str(&all_text(&frames));
    let (st, v) = call(reqwest::Method::GET, "/providers/anthropic/models", None).await;
    assert_eq!(st, 200, "{v}");
    for r in &fake.requests()[asked..] {
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_KEY));
    }

    for (provider, shadowed) in [("anthropic", false), ("openai", true)] {
        let (st, v) = call(
            reqwest::Method::DELETE,
            "/config/key",
            Some(json!({"provider": provider})),
        )
        .await;
        assert_eq!((st, &v["shadowed_by_env"]), (200, &json!(shadowed)), "{v}");
    }
    let (_, v) = call(reqwest::Method::GET, "/providers", None).await;
    assert_eq!(v["providers"][1]["pool_size"], 1, "{v}");
    let (_, transcript) = call(reqwest::Method::GET, &format!("/sessions/{sid}/transcript"), None).await;
    assert!(transcript["messages"].as_array().is_some_and(|m| m.len() > 3));

    server.signal("TERM");
    assert!(server.wait().await.success());
    let log = server.log();
    assert!(
        log.len() < STDERR_TAIL,
        "the whole log was captured: {} bytes",
        log.len()
    );
    assert!(
        log.contains("model turn failed") && log.contains("[redacted]"),
        "the failures were logged, the quoted keys taken out: {log}"
    );
    seen.push_str(&serde_json::to_string(&answers).unwrap());
    for key in [ENV_KEY, KEY, ANTHROPIC_KEY] {
        assert!(!log.contains(key), "the log holds {key}: {log}");
        assert!(!seen.contains(key), "a response or frame holds {key}");
        assert_in_no_file(home.path(), key);
    }
}
