//! `/doctor` and `vak doctor`: ok on a healthy home, fail for a damaged ledger and an
//! unreachable model service, with what each check saw; `vak doctor` exits 1 on a failure.

use crate::support::process::vak;
use crate::support::serve::Serve;
use crate::support::TestServer;
use serde_json::Value;
use vak::proto::v1 as pb;

/// A loopback port nothing listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check: {report}"))
}

/// Runs a prompt to its end in a new session; returns the session id.
async fn session_with_a_run(s: &TestServer) -> String {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "hello doctor").await;
    sse.until("run_finished").await;
    sid
}

#[tokio::test]
async fn a_healthy_server_is_ok_everywhere_and_reads_a_ledger_to_its_last_seq() {
    let s = TestServer::start().await;
    let sid = session_with_a_run(&s).await;
    let (code, report) = s.get(&format!("/doctor?session={sid}")).await;
    assert_eq!(code, 200, "{report}");
    for c in report["checks"].as_array().unwrap() {
        assert_eq!(c["status"], "ok", "{c}");
    }
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["home", "ledger", "provider", "clock", "open_files"]);
    let latest = s.get(&format!("/sessions/{sid}/transcript")).await.1["seq"].clone();
    assert_eq!(report["facts"]["ledger_seq"], latest, "{report}");
    assert!(check(&report, "ledger")["detail"]
        .as_str()
        .unwrap()
        .contains("without a gap"));
    assert!(report["facts"]["home_free_bytes"].as_u64().unwrap() > 0);
    assert!(report["facts"]["open_files"].as_u64().unwrap() > 0);

    let (code, _) = s.get("/doctor?session=nosuchsession").await;
    assert_eq!(code, 404);
    let (code, _) = s.get("/doctor?session=bad%20id").await;
    assert_eq!(code, 400);

    // gRPC: the same report, typed.
    let mut client = s.grpc().await;
    let r = client
        .get_doctor(pb::GetDoctorRequest { session: None })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.checks.iter().all(|c| c.status == pb::CheckStatus::Ok as i32),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_damaged_ledger_fails_naming_its_line() {
    let s = TestServer::start().await;
    let sid = session_with_a_run(&s).await;
    let path = s.home.join(format!("sessions/{sid}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[2] = "{flipped bytes".into();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let (code, report) = s.get(&format!("/doctor?session={sid}")).await;
    assert_eq!(code, 200);
    let ledger = check(&report, "ledger");
    assert_eq!(ledger["status"], "fail", "{report}");
    assert!(
        ledger["detail"].as_str().unwrap().contains("(line 3)"),
        "{ledger}"
    );
}

#[tokio::test]
async fn an_unreachable_model_service_fails() {
    use vak::core::provider::{connect_with, http::ClientOptions, Endpoint, ProviderKind, Secret};
    let port = dead_port();
    let endpoint = Endpoint {
        kind: ProviderKind::OpenAi,
        base_url: Some(format!("http://127.0.0.1:{port}/v1/")),
        key: Some(Secret::new("sk-test".into())),
    };
    let route = vak::core::session::live::Route {
        provider: connect_with(&endpoint, &ClientOptions::default()).unwrap(),
        model: "gpt-4.1".into(),
        context_window: None,
    };
    let s = TestServer::start_with_route(route, |_| {}).await;
    let (code, report) = s.get("/doctor").await;
    assert_eq!(code, 200);
    let provider = check(&report, "provider");
    assert_eq!(provider["status"], "fail", "{report}");
    let detail = provider["detail"].as_str().unwrap();
    assert!(detail.contains("could not reach the model service"), "{detail}");
    assert!(
        detail.contains(&format!("at 127.0.0.1:{port}")),
        "names the host: {detail}"
    );
    assert!(!detail.contains("sk-test"), "{detail}");
}

/// `vak doctor --home HOME`: its exit code and stdout.
async fn vak_doctor(home: &std::path::Path) -> (Option<i32>, String) {
    let out = vak(&["doctor", "--home", home.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn vak_doctor_prints_the_checks_and_exits_1_when_one_fails() {
    let served = Serve::new().start().await;
    let home = served.dirs.home().to_path_buf();
    let (code, stdout) = vak_doctor(&home).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.starts_with(&format!("vak doctor: {} (vak ", served.url)),
        "{stdout}"
    );
    assert!(stdout.contains("\nok    home "), "{stdout}");
    assert!(!stdout.contains('\x1b'), "no colour into a pipe");
    served.vak.kill().await;

    let base = format!("http://127.0.0.1:{}/v1", dead_port());
    let served = Serve::new()
        .args(["--provider", "openai", "--model", "gpt-4.1", "--base-url", &base])
        .start()
        .await;
    let home = served.dirs.home().to_path_buf();
    let (code, stdout) = vak_doctor(&home).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("\nfail  provider "), "{stdout}");
    let port = base.rsplit(':').next().unwrap().trim_end_matches("/v1");
    assert!(
        stdout.contains(&format!("at 127.0.0.1:{port}")),
        "names the host: {stdout}"
    );
    let json = vak(&["doctor", "--json", "--home", home.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(check(&report, "provider")["status"], "fail");
    assert_eq!(served.vak.terminate().await.code(), Some(0));

    // No server at all.
    let (code, stdout) = vak_doctor(&home).await;
    assert_eq!(code, Some(1));
    assert!(stdout.contains("no server is running"), "{stdout}");
}
