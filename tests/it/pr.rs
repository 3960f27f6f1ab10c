//! The PR view against a real server and a fake `gh` the test writes: no gh is gh_unavailable, a workspace outside git is not_a_git_repo, gh's "no pull requests found" is no_pr, a PR comes back with its checks counted, and a merge passes `--auto --<method>` to gh (its failure a 502 with gh's stderr, no gh a 409).

use crate::support::TestServer;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A fake gh in `dir`: logs its argv to `dir/argv`, then answers as
/// `dir/mode` says (`nopr`, `pr`, `merge_fail`).
fn fake_gh(dir: &Path) -> PathBuf {
    let d = dir.display();
    let script = format!(
        r#"#!/bin/sh
echo "$*" >> "{d}/argv"
mode=$(cat "{d}/mode")
case "$1 $2" in
"pr view")
  if [ "$mode" = nopr ]; then
    echo 'no pull requests found for branch "main"' >&2
    exit 1
  fi
  cat "{d}/pr.json"
  ;;
"pr merge")
  if [ "$mode" = merge_fail ]; then
    echo "lots of noise before the point" >&2
    echo "X Pull request #7 is not mergeable: the base branch policy prohibits the merge" >&2
    exit 1
  fi
  echo "Pull request #$3 will be automatically merged when all requirements are met"
  ;;
*) echo "unexpected: $*" >&2; exit 2 ;;
esac
"#
    );
    let gh = dir.join("gh");
    std::fs::write(&gh, script).unwrap();
    std::fs::set_permissions(&gh, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("pr.json"),
        r#"{"number":7,"title":"Add the launch view","state":"OPEN","url":"https://github.com/o/r/pull/7","headRefName":"main","statusCheckRollup":[
  {"__typename":"CheckRun","name":"build","status":"COMPLETED","conclusion":"SUCCESS"},
  {"__typename":"CheckRun","name":"lint","status":"COMPLETED","conclusion":"NEUTRAL"},
  {"__typename":"CheckRun","name":"test","status":"COMPLETED","conclusion":"FAILURE"},
  {"__typename":"CheckRun","name":"e2e","status":"IN_PROGRESS","conclusion":""},
  {"__typename":"StatusContext","context":"ci/legacy","state":"SUCCESS"},
  {"__typename":"StatusContext","context":"ci/deploy","state":"PENDING"}]}"#,
    )
    .unwrap();
    gh
}

fn git_init(dir: &Path) {
    crate::support::git::git(dir, &["init", "-q"]);
}

fn set_mode(dir: &Path, mode: &str) {
    std::fs::write(dir.join("mode"), mode).unwrap();
}

fn argv(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("argv"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn without_gh_the_view_says_gh_unavailable() {
    // A bare name is looked up on the server's PATH, which has no such program.
    let s = TestServer::start_with(|c| c.core.gh = "vak-test-no-such-gh".into()).await;
    git_init(&s.workspace);
    let sid = s.create_session().await;
    let (status, v) = s.get(&format!("/sessions/{sid}/pr")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reason"], "gh_unavailable", "{v}");
    assert!(v.get("checks").is_none() && v["number"] == 0, "{v}");
    let (status, e) = s
        .post(
            &format!("/sessions/{sid}/pr/merge"),
            json!({"number": 7, "method": "squash"}),
        )
        .await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["error"]["reason"], "gh_unavailable", "{e}");
}

#[tokio::test]
async fn a_fake_gh_gives_no_pr_then_the_pr_with_its_checks_and_merges_with_the_method() {
    let bin = tempfile::tempdir().unwrap();
    let gh = fake_gh(bin.path());
    let s = TestServer::start_with(|c| c.core.gh = gh).await;
    git_init(&s.workspace);
    let sid = s.create_session().await;
    let path = format!("/sessions/{sid}/pr");

    set_mode(bin.path(), "nopr");
    let (status, v) = s.get(&path).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reason"], "no_pr", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("no pull requests found"),
        "{v}"
    );
    assert_eq!(
        argv(bin.path()),
        ["pr view --json number,title,state,url,headRefName,statusCheckRollup"]
    );

    set_mode(bin.path(), "pr");
    let (status, v) = s.get(&path).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["reason"].as_str().unwrap_or("").is_empty(), "{v}");
    assert_eq!(v["number"], 7);
    assert_eq!(v["title"], "Add the launch view");
    assert_eq!(v["state"], "OPEN");
    assert_eq!(v["url"], "https://github.com/o/r/pull/7");
    assert_eq!(v["head_ref"], "main");
    assert_eq!(
        v["checks"],
        json!({"passing": 3, "failing": 1, "pending": 2}),
        "{v}"
    );

    let merge = format!("/sessions/{sid}/pr/merge");
    let (status, m) = s.post(&merge, json!({"number": 7, "method": "squash"})).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["number"], 7);
    assert_eq!(m["method"], "squash");
    assert!(
        m["output"]
            .as_str()
            .unwrap()
            .contains("will be automatically merged"),
        "{m}"
    );
    assert_eq!(argv(bin.path()).last().unwrap(), "pr merge 7 --auto --squash");
    let (status, _) = s.post(&merge, json!({"number": 7, "method": "rebase"})).await;
    assert_eq!(status, 200);
    assert_eq!(argv(bin.path()).last().unwrap(), "pr merge 7 --auto --rebase");

    // No method, or no number: 400, and gh is not run.
    let runs = argv(bin.path()).len();
    let (status, e) = s.post(&merge, json!({"number": 7})).await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = s.post(&merge, json!({"method": "merge"})).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(argv(bin.path()).len(), runs);

    set_mode(bin.path(), "merge_fail");
    let (status, e) = s.post(&merge, json!({"number": 7, "method": "merge"})).await;
    assert_eq!(status, 502, "{e}");
    assert_eq!(e["error"]["code"], "bad_gateway", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("is not mergeable"), "gh's stderr tail: {msg}");
    assert_eq!(argv(bin.path()).last().unwrap(), "pr merge 7 --auto --merge");
}

#[tokio::test]
async fn a_workspace_outside_git_is_not_a_git_repo() {
    let bin = tempfile::tempdir().unwrap();
    let gh = fake_gh(bin.path());
    set_mode(bin.path(), "pr");
    let s = TestServer::start_with(|c| c.core.gh = gh).await;
    let sid = s.create_session().await;
    let (status, v) = s.get(&format!("/sessions/{sid}/pr")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reason"], "not_a_git_repo", "{v}");
    assert!(argv(bin.path()).is_empty(), "gh is not asked outside git");
}
