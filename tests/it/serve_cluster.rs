//! `make serve-cluster` as a person starts it: three nats-server nodes and three `vak serve --bus` replicas, and a session run on one replica read back, the same, from the other two (scripts/serve-cluster.py --check).

use std::time::Duration;

#[tokio::test]
async fn make_serve_cluster_starts_three_replicas_that_share_a_session() {
    // A release build (when stale), three nats-server nodes and three replicas.
    let _heavy = crate::support::heavy().await;
    let nats = std::env::var("VAK_NATS_SERVER")
        .expect("VAK_NATS_SERVER names nats-server: run `make nats` (make test does)");
    let run = tokio::process::Command::new("make")
        .args(["-s", "serve-cluster", "CLUSTER_ARGS=--check"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("VAK_NATS_SERVER", nats)
        .env_remove("VAK_TOKEN")
        .env_remove("VAK_HOME")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(900), run)
        .await
        .expect("make serve-cluster --check ends within 15 minutes (a release build included)")
        .expect("make runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "make serve-cluster failed:\n{stdout}\n{stderr}"
    );
    for r in 1..=3 {
        assert!(
            stdout.contains(&format!("vak replica r{r} listening on http://127.0.0.1:")),
            "replica r{r} said where it listens:\n{stdout}"
        );
    }
    assert_eq!(stdout.matches("transcript on http://").count(), 3, "{stdout}");
    assert!(
        stdout.contains("check passed: every replica serves the same session"),
        "{stdout}"
    );
}
