//! Intent against a real server (issue 35): `GET /intent/explain` reads "delete the build folder" as a
//! high-stakes change that asks a person first, with the signals that set it, on a server whose model
//! is a real HTTP client of a fake model service that records every request: the service sees nothing,
//! and no session, ledger or event comes of it. `GET /intent/policy` gives the defaults and config.toml's
//! values with their sources; bad parameters are 400s naming them.

use crate::support::fake_provider::FakeProvider;
use crate::support::TestServer;
use serde_json::Value;
use vak::proto::v1 as pb;

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every file under `dir` with its size: what "nothing written" is checked against.
fn files(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push((p.display().to_string(), e.metadata().unwrap().len()));
        }
    }
    out.sort();
    out
}

fn because(r: &Value, field: &str) -> Vec<String> {
    r["reading"]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["field"] == field)
        .map(|s| s["because"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn explain_reads_a_high_stakes_change_that_asks_first_and_runs_nothing() {
    let fake = FakeProvider::start().await;
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    let sessions = s.hub().control().config().home.join("sessions");
    let before = files(&sessions);
    let (status, r) = s
        .get(&format!(
            "/intent/explain?prompt={}",
            encode("delete the build folder")
        ))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["reading"]["act"], "change");
    assert_eq!(r["reading"]["stakes"], "high");
    assert_eq!(r["reading"]["horizon"], "now");
    assert_eq!(because(&r, "act"), ["word \"delete\""]);
    assert_eq!(because(&r, "stakes"), ["word \"delete\""]);
    assert_eq!(r["surface"], "api");
    let e = &r["engagement"];
    assert_eq!(e["plan_first"], true);
    assert_eq!(e["mode"], "plan");
    let approvals: Vec<&str> = e["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for t in ["exit_plan_mode", "bash", "write_file"] {
        assert!(approvals.contains(&t), "{t} asks: {approvals:?}");
    }
    assert!(e["route"].as_str().unwrap().starts_with("openai/"), "{e}");
    assert_eq!(r["baseline_diff"]["mode"], "plan");
    assert!(!r["baseline_diff"]["approvals_added"]
        .as_array()
        .unwrap()
        .is_empty());

    // A question reads only; what the caller knows wins over the words.
    let (_, q) = s
        .get(&format!(
            "/intent/explain?prompt={}&surface=app",
            encode("what does main.rs do?")
        ))
        .await;
    assert_eq!(q["reading"]["act"], "ask");
    assert_eq!(q["engagement"]["read_only"], true);
    assert!(q["baseline_diff"]["tools_withheld"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t == "bash"));
    let (_, given) = s
        .get(&format!(
            "/intent/explain?prompt={}&act=review&stakes=low&evidence=",
            encode("delete the build folder")
        ))
        .await;
    assert_eq!(given["reading"]["act"], "review");
    assert_eq!(given["reading"]["stakes"], "low");
    assert_eq!(given["reading"]["evidence"], serde_json::json!([]));
    assert_eq!(because(&given, "act"), ["set by the request"]);

    // Over gRPC the same.
    let mut g = s.grpc().await;
    let x = g
        .explain_intent(pb::ExplainIntentRequest {
            prompt: "run the tests every night".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let reading = x.reading.unwrap();
    assert_eq!(reading.act(), pb::Act::Run);
    assert_eq!(reading.horizon(), pb::Horizon::Scheduled);

    // Nothing was dispatched, written or published.
    assert!(fake.requests().is_empty(), "the model service was called");
    assert_eq!(files(&sessions), before, "the sessions folder changed");
    let (_, listed) = s.get("/sessions").await;
    assert!(listed["sessions"].as_array().unwrap().is_empty());

    // Bad parameters are clear 400s.
    for (query, names) in [
        ("act=destroy", "act \"destroy\""),
        ("stakes=extreme", "stakes \"extreme\""),
        ("surface=fax", "surface \"fax\""),
        ("evidence=tool_ok,vibes", "evidence \"vibes\""),
        ("prompt=x&colour=red", "colour"),
    ] {
        let (status, e) = s.get(&format!("/intent/explain?{query}")).await;
        assert_eq!(status, 400, "{query}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(names),
            "{query}: {e}"
        );
    }
    let long = g
        .explain_intent(pb::ExplainIntentRequest {
            prompt: "a".repeat(64 * 1024 + 1),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(long.code(), tonic::Code::InvalidArgument);
    assert!(long.message().contains("at most 65536"), "{}", long.message());
}

#[tokio::test]
async fn the_policy_names_each_value_and_its_source() {
    let s = TestServer::start().await;
    let (status, p) = s.get("/intent/policy").await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["intent"]["high_stakes_mode"], "default");
    assert_eq!(
        p["intent"]["read_only_acts"],
        serde_json::json!(["ask", "review", "plan"])
    );
    assert_eq!(p["intent"]["plan_first_at"], "high");
    assert_eq!(p["commitment"]["require_evidence"], true);
    assert!(
        p["sources"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["source"] == "default"),
        "{p}"
    );
    let (home, ws) = s.stop().await.unwrap();

    std::fs::write(
        home.path().join("config.toml"),
        "[intent]\nplan_first_at = \"never\"\n\n[commitment]\nrequire_evidence = false\n",
    )
    .unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (_, p) = s.get("/intent/policy").await;
    assert_eq!(p["intent"]["plan_first_at"], "", "never");
    assert_eq!(p["commitment"]["require_evidence"], false, "{p}");
    let source = |key: &str| {
        p["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["key"] == key)
            .map(|x| x["source"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(source("intent.plan_first_at"), "file");
    assert_eq!(source("commitment.require_evidence"), "file");
    assert_eq!(source("intent.high_stakes_mode"), "default");
    // With plan_first_at never, a high-stakes change is held to the mode, not planned first.
    let (_, r) = s
        .get("/intent/explain?prompt=delete%20the%20build%20folder")
        .await;
    assert_eq!(r["engagement"]["plan_first"], false);
    assert_eq!(r["engagement"]["mode"], "default");
    // And a commitment without requirements closes as fulfilled without evidence.
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (status, _) = s
        .run(
            &sid,
            "/plan-items [{\"id\": \"a\", \"text\": \"tidy up\", \"status\": \"done\"}]",
        )
        .await;
    assert_eq!(status, 202);
    sse.until("run_finished").await;
    let (status, c) = s
        .post(
            &format!("/commitments/{sid}.a/close"),
            serde_json::json!({"verdict": "fulfilled"}),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    s.stop().await;

    // A bad value is a startup error naming the key.
    std::fs::write(
        home.path().join("config.toml"),
        "[intent]\nhigh_stakes_mode = \"yolo\"\n",
    )
    .unwrap();
    let cfg = vak::edge::server::ServeConfig::new(
        vak::core::CoreConfig::new(home.path().to_path_buf(), ws.path().to_path_buf()),
        "t".repeat(32),
    );
    let err = vak::edge::server::Server::new(cfg)
        .err()
        .expect("a bad policy refuses to start");
    assert!(err.to_string().contains("high_stakes_mode"), "{err}");
}
