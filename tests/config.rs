//! The configuration surface end to end: GET/PATCH /config with revisions and persistence, the key store behind PUT/DELETE /config/key, GET /providers and live model listings, config frames on /stream, the same over gRPC, and config.toml at startup of the real binary.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use vak::core::config::Connector;
use vak::core::provider::{
    self, Endpoint, Failure, FailureKind, ModelInfo, ModelsFuture, Provider, ProviderError, ProviderKind,
    Sink, TurnFuture, TurnRequest,
};
use vak::edge::server::ServeConfig;
use vak::proto::v1 as pb;

/// A key no test would find by accident.
const KEY: &str = "sk-vaktest-5f2b9c1e7a3d4b6f8e0a1c2d3e4f5a6b";

/// Stands in for the OpenAI/Anthropic clients (built elsewhere): it lists
/// models by connecting to the base URL's port, so an unreachable one fails
/// as the real client would, with `network`.
struct Standin {
    base_url: Option<String>,
}

impl Provider for Standin {
    fn name(&self) -> &str {
        "standin"
    }
    fn turn<'a>(
        &'a self,
        _r: &'a TurnRequest,
        _s: &'a dyn Sink,
        _c: &'a tokio_util::sync::CancellationToken,
    ) -> TurnFuture<'a> {
        Box::pin(async {
            Err(ProviderError::Failed(Failure::new(
                FailureKind::Network,
                "standin",
                false,
            )))
        })
    }
    fn list_models(&self) -> ModelsFuture<'_> {
        Box::pin(async move {
            let url = self
                .base_url
                .clone()
                .unwrap_or_else(|| "https://api.invalid".into());
            let host = url
                .split("://")
                .nth(1)
                .unwrap_or("")
                .split('/')
                .next()
                .unwrap_or("")
                .to_string();
            match tokio::net::TcpStream::connect(&host).await {
                Ok(_) => Ok(vec![ModelInfo {
                    id: "standin-model".into(),
                    display_name: "Stand-in".into(),
                }]),
                Err(e) => Err(Failure::new(
                    FailureKind::Network,
                    format!("connect {host}: {e}"),
                    true,
                )),
            }
        })
    }
}

fn standin() -> Connector {
    Connector::new(|ep: &Endpoint| match ep.kind {
        ProviderKind::Offline => provider::connect(ep),
        _ => Ok(Arc::new(Standin {
            base_url: ep.base_url.clone(),
        }) as Arc<dyn Provider>),
    })
}

/// Whether `provider::connect` has real OpenAI/Anthropic clients yet (they
/// are built in parallel): then the tests use them, else the stand-in.
fn real_clients() -> bool {
    provider::connect(&Endpoint {
        kind: ProviderKind::OpenAi,
        base_url: Some(LOCAL.into()),
        key: None,
    })
    .is_ok()
}

fn with_standin(cfg: &mut ServeConfig) {
    if !real_clients() {
        cfg.core.connector = standin();
    }
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

const LOCAL: &str = "http://127.0.0.1:9/v1";

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
    assert_eq!(v["permission_mode"], "ask");
    assert_eq!(v["max_turns"], 50);
    assert!(!v["revision"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn patch_changes_the_route_keylessly_for_a_local_server_with_revisions() {
    let s = TestServer::start_with(with_standin).await;
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
    let (_, now) = s.get("/config").await;
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
    let s = TestServer::start_with(with_standin).await;
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
    let again = TestServer::start_in(dirs.0.path(), dirs.1.path(), with_standin).await;
    let (_, v) = again.get("/config").await;
    assert_eq!(v["route"]["provider"], "openai");
    assert_eq!(v["route"]["model"], "qwen");
    assert_eq!(v["route"]["base_url"], LOCAL);
    assert_eq!(v["route"]["source"], "file");
    assert_ne!(v["revision"], revision, "a restart never reuses a revision");
    // Flags win over the file.
    again.stop().await;
    let flagged = TestServer::start_in(dirs.0.path(), dirs.1.path(), |cfg| {
        with_standin(cfg);
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
    let mut files = Vec::new();
    files_under(home, &mut files);
    assert!(!files.is_empty());
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
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
    let s = TestServer::start_with(with_standin).await;
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
    let again = TestServer::start_in(dirs.0.path(), dirs.1.path(), with_standin).await;
    let (_, v, _) = send(&again, reqwest::Method::GET, "/providers", None).await;
    assert_eq!(v["providers"][2]["fingerprints"], json!([fingerprint(KEY)]));
    assert_key_in_no_file(&again.home);
    again.stop().await;
}

#[tokio::test]
async fn environment_keys_win_and_pool_with_stored_ones() {
    let s = TestServer::start_with(|cfg| {
        with_standin(cfg);
        cfg.core.env.keys = vec![(ProviderKind::OpenAi, provider::Secret::new("sk-from-env".into()))];
    })
    .await;
    send(
        &s,
        reqwest::Method::PUT,
        "/config/key",
        Some(json!({"provider": "openai", "key": KEY})),
    )
    .await;
    let (_, v, _) = send(&s, reqwest::Method::GET, "/providers", None).await;
    let openai = &v["providers"][1];
    assert_eq!(openai["pool_size"], 2);
    assert_eq!(openai["key_sources"], json!(["env", "store"]));
    assert_eq!(
        openai["fingerprints"],
        json!([fingerprint("sk-from-env"), fingerprint(KEY)])
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
    let s = TestServer::start_with(with_standin).await;
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

    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/nope/models", None).await;
    assert_eq!(st, 400, "{v}");

    // Against an unreachable local server: 502 with the reason.
    patch(&s, json!({"provider": "openai", "model": "m", "base_url": LOCAL})).await;
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

    if real_clients() {
        return;
    }
    // A reachable one answers with what it lists.
    let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", up.local_addr().unwrap());
    let (st, _) = patch(&s, json!({"base_url": url})).await;
    assert_eq!(st, 200);
    let (st, v, _) = send(&s, reqwest::Method::GET, "/providers/openai/models", None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["models"],
        json!([{"id": "standin-model", "display_name": "Stand-in"}])
    );
}

#[tokio::test]
async fn stream_clients_that_asked_get_a_config_frame_on_every_route_change() {
    let s = TestServer::start_with(with_standin).await;
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
    let second = next_config(&mut sse).await;
    assert_eq!(second, v, "the frame is the GET /config body");
    patch(&s, json!({"model": "n"})).await;
    assert_eq!(next_config(&mut sse).await["route"]["model"], "n");
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
    let s = TestServer::start_with(with_standin).await;
    let mut c = s.grpc().await;
    let cfg = c.get_config(pb::GetConfigRequest {}).await.unwrap().into_inner();
    let route = cfg.route.clone().unwrap();
    assert_eq!(
        (route.provider.as_str(), route.source.as_str()),
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
    assert_eq!(updated.route.as_ref().unwrap().source, "api");
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

fn vak_serve(home: &Path, ws: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vak"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--token",
        "config-test-token-0123456789abcdef",
    ])
    .args(extra)
    .arg("--home")
    .arg(home)
    .arg("--workspace")
    .arg(ws);
    for v in [
        "VAK_TOKEN",
        "VAK_HOME",
        "RUST_LOG",
        "VAK_PROVIDER",
        "VAK_MODEL",
        "VAK_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
    ] {
        cmd.env_remove(v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A running binary: its URL, and every stderr line so far.
struct Running {
    child: tokio::process::Child,
    url: String,
    stderr: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Running {
    async fn start(mut cmd: Command) -> Running {
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                sink.lock().unwrap().push(l);
            }
        });
        let url = tokio::time::timeout(DEADLINE, async {
            while let Some(line) = out.next_line().await.unwrap() {
                if let Some(u) = line.split("listening on ").nth(1) {
                    return u.trim().to_string();
                }
            }
            panic!("no listening line; stderr: {:?}", stderr.lock().unwrap());
        })
        .await
        .unwrap();
        Running { child, url, stderr }
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

    async fn stop(mut self) -> Vec<String> {
        let pid = self.child.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let lines = self.stderr.lock().unwrap().clone();
        lines
    }
}

async fn exit_of(mut cmd: Command) -> (bool, String) {
    let out = tokio::time::timeout(DEADLINE, cmd.output())
        .await
        .unwrap()
        .unwrap();
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
        let mut cmd = vak_serve(home.path(), ws.path(), &[]);
        if exported {
            cmd.env("OPENAI_API_KEY", "sk-exported-by-the-environment");
        }
        let v = Running::start(cmd).await;
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
    for name in ["[finops]", "[mcp]", "[theme]"] {
        assert!(warned[0].contains(name), "{}", warned[0]);
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
    assert!(
        stderr.contains("OPENAI_API_KEY") && stderr.contains("PUT /config/key"),
        "{stderr}"
    );
    let (ok, stderr) = exit_of(vak_serve(home.path(), ws.path(), &["--provider", "gemini"])).await;
    assert!(!ok);
    assert!(stderr.contains("unknown provider"), "{stderr}");
    let (ok, stderr) = exit_of(vak_serve(home.path(), ws.path(), &["--provider", "anthropic"])).await;
    assert!(!ok);
    assert!(stderr.contains("needs a model"), "{stderr}");
    // Flags over the environment.
    let mut cmd = vak_serve(home.path(), ws.path(), &["--provider", "offline"]);
    cmd.env("VAK_PROVIDER", "openai");
    let v = Running::start(cmd).await;
    let (_, cfg) = v.call(reqwest::Method::GET, "/config", None).await;
    assert_eq!(
        (cfg["route"]["provider"].as_str(), cfg["route"]["source"].as_str()),
        (Some("offline"), Some("flag"))
    );
    v.stop().await;
}

#[tokio::test]
async fn a_running_leg_keeps_its_route_and_the_next_one_takes_the_new_route() {
    let s = TestServer::start_with(|cfg| {
        with_standin(cfg);
        cfg.core.provider_retries = 0;
    })
    .await;
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    let (st, _) = s.run(&sid, "/sleep 400\nstill offline").await;
    assert_eq!(st, 202);
    ev.until("turn_started").await;
    let (st, v) = patch(&s, json!({"provider": "openai", "model": "m", "base_url": LOCAL})).await;
    assert_eq!(st, 200, "{v}");
    let frames = ev.until("run_finished").await;
    assert!(text_of(&frames).contains("echo: still offline"), "{frames:?}");
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    // The next leg asks the new route (the stand-in fails every turn).
    s.run(&sid, "hello").await;
    let frames = ev.until("run_finished").await;
    assert_eq!(frames.last().unwrap().body()["outcome"], "failed", "{frames:?}");
}
