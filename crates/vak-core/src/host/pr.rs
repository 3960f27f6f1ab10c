//! The PR view: the pull request of a workspace's branch through the GitHub CLI (`gh pr view`), its checks counted, and merging it (`gh pr merge --auto`), bounded in time and output.

use crate::error::{Error, ErrorKind, Result};
use crate::host::diff;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// One gh command's time limit.
pub const GH_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of gh's stdout read (then it is cut).
const MAX_STDOUT: usize = 1 << 20;
/// The tail of gh's stderr an answer carries.
pub const STDERR_TAIL: usize = 2 << 10;
/// The tail of gh's stdout a merge answers with.
const STDOUT_TAIL: usize = 4 << 10;
/// The fields `gh pr view` is asked for.
const FIELDS: &str = "number,title,state,url,headRefName,statusCheckRollup";

/// Why there is no PR to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NoPr,
    GhUnavailable,
    NotAGitRepo,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    pub passing: u32,
    pub failing: u32,
    pub pending: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Set when there is no PR; `message` says what gh or git said.
    pub reason: Option<Reason>,
    pub message: String,
    pub number: u32,
    pub title: String,
    pub state: String,
    pub url: String,
    pub head_ref: String,
    pub checks: Checks,
}

/// How `gh pr merge` merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Squash,
    Merge,
    Rebase,
}

impl Method {
    fn flag(self) -> &'static str {
        match self {
            Method::Squash => "--squash",
            Method::Merge => "--merge",
            Method::Rebase => "--rebase",
        }
    }
}

/// The gh program `gh` names: a path as it is, a bare name on the
/// server's PATH; None when there is no such executable file.
fn find_gh(gh: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable =
        |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if gh.components().count() > 1 {
        return runnable(gh).then(|| gh.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(gh))
        .find(|p| runnable(p))
}

fn no(reason: Reason, message: String) -> View {
    View {
        reason: Some(reason),
        message,
        ..View::default()
    }
}

/// The lookup of gh on PATH reads directories: call it off the runtime.
async fn locate(gh: &Path) -> Option<PathBuf> {
    let gh = gh.to_path_buf();
    tokio::task::spawn_blocking(move || find_gh(&gh))
        .await
        .ok()
        .flatten()
}

/// The PR of `ws`'s current branch, or why there is none.
pub async fn view(ws: &Path, git: &Path, gh: &Path) -> Result<View> {
    let Some(gh) = locate(gh).await else {
        return Ok(no(Reason::GhUnavailable, "gh is not on the server's PATH".into()));
    };
    if let Some((_, message)) = diff::probe(ws, git).await? {
        return Ok(no(Reason::NotAGitRepo, message));
    }
    let out = run(&gh, ws, &["pr", "view", "--json", FIELDS]).await?;
    if !out.ok {
        // gh says so only in words (its exit code is 1 for every failure).
        if out.stderr.contains("no pull requests found") {
            return Ok(no(Reason::NoPr, out.stderr.trim().to_string()));
        }
        return Err(failed("gh pr view", &out.stderr));
    }
    parse_view(&out.stdout)
}

/// `gh pr merge <number> --auto --<method>` in `ws`: gh's stdout tail, or
/// its failure as a bad gateway with its stderr tail. No gh on this server is
/// a conflict (409 `gh_unavailable`): nothing upstream failed, the server
/// lacks what the operation needs.
pub async fn merge(ws: &Path, gh: &Path, number: u32, method: Method) -> Result<String> {
    if number == 0 {
        return Err(Error::invalid("number is required"));
    }
    let Some(gh) = locate(gh).await else {
        return Err(
            Error::new(ErrorKind::Conflict, "gh is not on the server's PATH").with_reason("gh_unavailable")
        );
    };
    let n = number.to_string();
    let out = run(&gh, ws, &["pr", "merge", &n, "--auto", method.flag()]).await?;
    if !out.ok {
        return Err(failed("gh pr merge", &out.stderr));
    }
    Ok(tail(&out.stdout, STDOUT_TAIL).to_string())
}

fn failed(what: &str, stderr: &str) -> Error {
    Error::new(ErrorKind::Upstream, format!("{what} failed: {}", stderr.trim())).with_reason("gh_failed")
}

/// The last `max` bytes of `s` (at a character boundary).
fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

struct Output {
    ok: bool,
    stdout: String,
    /// Its tail (STDERR_TAIL).
    stderr: String,
}

/// Runs gh in `ws` without a prompt, a pager or colours, at most
/// GH_TIMEOUT long (then it is killed).
async fn run(gh: &Path, ws: &Path, args: &[&str]) -> Result<Output> {
    let mut cmd = tokio::process::Command::new(gh);
    cmd.args(args)
        .current_dir(ws)
        .env("GH_PROMPT_DISABLED", "1")
        .env("GH_NO_UPDATE_NOTIFIER", "1")
        .env("GH_PAGER", "cat")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for k in crate::tools::sandbox::WITHHELD_ENV {
        cmd.env_remove(k);
    }
    let mut child = cmd.spawn().map_err(|e| {
        Error::new(ErrorKind::Upstream, format!("cannot run gh: {e}")).with_reason("gh_failed")
    })?;
    let (Some(so), Some(se)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::internal("gh's pipes are missing"));
    };
    let work = async {
        let (stdout, stderr) = tokio::join!(read_head(so, MAX_STDOUT), read_tail(se, STDERR_TAIL));
        let status = child
            .wait()
            .await
            .map_err(|e| Error::internal(format!("gh did not finish: {e}")))?;
        Ok::<_, Error>(Output {
            ok: status.success(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    };
    match tokio::time::timeout(GH_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            ErrorKind::Upstream,
            format!("gh {} took longer than {GH_TIMEOUT:?}", args.join(" ")),
        )
        .with_reason("gh_timeout")),
    }
}

/// The first `cap` bytes of `pipe`, the rest read and dropped.
async fn read_head(mut pipe: impl AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(out.len()).min(n);
        out.extend_from_slice(&buf[..room]);
    }
    out
}

/// The last `keep` bytes of `pipe`.
async fn read_tail(mut pipe: impl AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() > keep {
            out.drain(..out.len() - keep);
        }
    }
    out
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct GhPr {
    #[serde(default)]
    number: u32,
    #[serde(default)]
    title: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    head_ref_name: String,
    #[serde(default)]
    status_check_rollup: Option<Vec<GhCheck>>,
}

/// A CheckRun (`status`, `conclusion`) or a StatusContext (`state`).
#[derive(serde::Deserialize)]
struct GhCheck {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    conclusion: Option<String>,
    #[serde(default)]
    state: Option<String>,
}

fn parse_view(stdout: &str) -> Result<View> {
    let pr: GhPr = serde_json::from_str(stdout).map_err(|e| {
        Error::new(
            ErrorKind::Upstream,
            format!("gh pr view printed what is not its JSON: {e}"),
        )
        .with_reason("gh_failed")
    })?;
    let mut checks = Checks::default();
    for c in pr.status_check_rollup.unwrap_or_default() {
        match classify(&c) {
            Class::Passing => checks.passing += 1,
            Class::Failing => checks.failing += 1,
            Class::Pending => checks.pending += 1,
        }
    }
    Ok(View {
        reason: None,
        message: String::new(),
        number: pr.number,
        title: pr.title,
        state: pr.state,
        url: pr.url,
        head_ref: pr.head_ref_name,
        checks,
    })
}

enum Class {
    Passing,
    Failing,
    Pending,
}

fn classify(c: &GhCheck) -> Class {
    let upper = |s: &Option<String>| s.as_deref().unwrap_or_default().to_ascii_uppercase();
    // A check run counts by its conclusion once it is completed; a status
    // context by its state.
    let word = if c.status.is_some() || c.conclusion.is_some() {
        if c.status
            .as_ref()
            .is_some_and(|s| !s.eq_ignore_ascii_case("COMPLETED"))
        {
            return Class::Pending;
        }
        upper(&c.conclusion)
    } else {
        upper(&c.state)
    };
    match word.as_str() {
        "SUCCESS" | "NEUTRAL" | "SKIPPED" => Class::Passing,
        "FAILURE" | "CANCELLED" | "TIMED_OUT" | "ACTION_REQUIRED" | "ERROR" | "STARTUP_FAILURE" => {
            Class::Failing
        }
        _ => Class::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_are_counted_from_check_runs_and_status_contexts() {
        let v = parse_view(
            r#"{"number":7,"title":"t","state":"OPEN","url":"u","headRefName":"b","statusCheckRollup":[
            {"__typename":"CheckRun","status":"COMPLETED","conclusion":"SUCCESS"},
            {"__typename":"CheckRun","status":"COMPLETED","conclusion":"SKIPPED"},
            {"__typename":"CheckRun","status":"COMPLETED","conclusion":"TIMED_OUT"},
            {"__typename":"CheckRun","status":"IN_PROGRESS","conclusion":""},
            {"__typename":"StatusContext","state":"ERROR"},
            {"__typename":"StatusContext","state":"PENDING"},
            {"__typename":"StatusContext","state":"SUCCESS"}]}"#,
        )
        .unwrap();
        assert_eq!(
            v.checks,
            Checks {
                passing: 3,
                failing: 2,
                pending: 2
            }
        );
        assert_eq!((v.number, v.head_ref.as_str()), (7, "b"));
        assert!(parse_view("nope").is_err());
    }

    #[test]
    fn a_tail_starts_at_a_character_boundary() {
        assert_eq!(tail("héllo", 4), "llo");
        assert_eq!(tail("ab", 10), "ab");
    }
}
