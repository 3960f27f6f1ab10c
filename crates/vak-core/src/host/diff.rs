//! A workspace's git status and unified diff, from the git CLI run with the repository's code-running settings turned off, bounded in time and size.
//!
//! A workspace is untrusted input: its `.git/config` can name programs that
//! git would run while computing a status or a diff. Each is neutralized:
//! `core.fsmonitor` (a hook run by status and diff) is set to false;
//! `diff.external` and `diff.<driver>.command` are ignored with
//! `--no-ext-diff`; `diff.<driver>.textconv` with `--no-textconv`; every
//! `filter.<driver>.clean`/`smudge`/`process` the repository configures is
//! set to empty (no filter); `core.hooksPath` points nowhere. The overrides
//! travel in `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`, so a
//! driver name containing `=` cannot split them. The environment is cleared
//! (no inherited `GIT_DIR`, `GIT_EXTERNAL_DIFF`, pager), system and global
//! config are not read, submodules are ignored (their own config is not
//! consulted), optional locks are off (status never writes the index), and
//! a pathspec of `.` keeps a workspace inside a larger repository to its
//! own files.
//!
//! git never reaches a remote either: a repository that declares itself a
//! partial clone (`extensions.partialClone`, a promisor remote) and names a
//! missing object would make status or diff fetch it, running the config's
//! `core.sshCommand` (or an `ext::` transport's command). `GIT_NO_LAZY_FETCH`
//! stops the fetch (git 2.45, and the 2.39.4+ security releases);
//! `GIT_ALLOW_PROTOCOL` set empty allows no transport at all, overriding the
//! repository's own `protocol.<name>.allow` (which would beat a plain
//! `protocol.allow=never`), for any older git; and the programs a transport
//! could run (ssh command, askpass, credential helper, proxy) are emptied.

use crate::error::{Error, Result};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// The most bytes of unified diff returned (then `truncated`).
pub const MAX_DIFF_BYTES: usize = 1 << 20;
/// The most status entries returned.
pub const MAX_FILES: usize = 5000;
/// Untracked files shown as new-file diffs (the others are listed only).
pub const MAX_UNTRACKED_DIFFS: usize = 50;
/// One git command's time limit.
const GIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Filter drivers overridden at most; a repository with more is refused.
const MAX_FILTERS: usize = 64;

/// Why there is no diff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NotAGitRepo,
    GitUnavailable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAGitRepo => "not_a_git_repo",
            Reason::GitUnavailable => "git_unavailable",
        }
    }
}

/// One changed path, as `git status --porcelain=v1` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStatus {
    /// Relative to the repository's top folder.
    pub path: String,
    /// git's two-letter XY code: index then worktree (`M`, `A`, `D`, `R`,
    /// `C`, `U`, ` `), `??` untracked.
    pub status: String,
    /// The path it was renamed or copied from, else empty.
    pub from: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// Set when there is no diff; `message` says more.
    pub reason: Option<Reason>,
    pub message: String,
    pub files: Vec<FileStatus>,
    pub diff: String,
    /// The diff or the file list was cut at its cap.
    pub truncated: bool,
}

/// Why `ws` has no git work tree to look at (None: it has one), as `diff` decides.
pub async fn probe(ws: &Path, git: &Path) -> Result<Option<(Reason, String)>> {
    let probe = Git::new(ws, git, Vec::new());
    match probe.run(&["rev-parse", "--is-inside-work-tree"], 4096).await {
        Err(Spawn::Missing(e)) => Ok(Some((
            Reason::GitUnavailable,
            format!("git is not installed: {e}"),
        ))),
        Err(Spawn::Failed(e)) => Err(e),
        Ok(out) if out.ok && out.stdout.trim_ascii() == b"true" => Ok(None),
        Ok(_) => Ok(Some((
            Reason::NotAGitRepo,
            "the workspace is not inside a git work tree".into(),
        ))),
    }
}

/// The status and diff of `ws` against HEAD (staged and unstaged changes),
/// with untracked files as new-file diffs.
pub async fn diff(ws: &Path, git: &Path) -> Result<Diff> {
    let no = |reason, message: String| {
        Ok(Diff {
            reason: Some(reason),
            message,
            ..Diff::default()
        })
    };
    let probe = Git::new(ws, git, Vec::new());
    let inside = match probe.run(&["rev-parse", "--is-inside-work-tree"], 4096).await {
        Err(Spawn::Missing(e)) => return no(Reason::GitUnavailable, format!("git is not installed: {e}")),
        Err(Spawn::Failed(e)) => return Err(e),
        Ok(out) => out,
    };
    if !inside.ok || inside.stdout.trim_ascii() != b"true" {
        return no(
            Reason::NotAGitRepo,
            "the workspace is not inside a git work tree".into(),
        );
    }
    let git = Git::new(ws, git, filter_overrides(&probe).await?);
    let status = git
        .must(
            &[
                "status",
                "--porcelain=v1",
                "-z",
                "--untracked-files=all",
                "--ignore-submodules=all",
                "--",
                ".",
            ],
            MAX_DIFF_BYTES,
        )
        .await?;
    let (files, mut truncated) = parse_status(&status.stdout);
    truncated |= status.truncated;
    let has_head = git
        .run(&["rev-parse", "--verify", "--quiet", "HEAD"], 4096)
        .await
        .map_err(Spawn::into_error)?
        .ok;
    const FLAGS: [&str; 5] = [
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--ignore-submodules=all",
        "--src-prefix=a/",
    ];
    let mut diff = Vec::new();
    // HEAD against the worktree covers staged and unstaged changes at once;
    // before the first commit, the index against nothing, then the worktree.
    let ranges: &[&[&str]] = if has_head {
        &[&["diff", "HEAD"]]
    } else {
        &[&["diff", "--cached"], &["diff"]]
    };
    for range in ranges {
        let room = MAX_DIFF_BYTES.saturating_sub(diff.len());
        let args: Vec<&str> = range
            .iter()
            .chain(FLAGS.iter())
            .chain(["--dst-prefix=b/", "--", "."].iter())
            .copied()
            .collect();
        let out = git.must(&args, room).await?;
        truncated |= out.truncated;
        diff.extend_from_slice(&out.stdout);
    }
    let untracked: Vec<&FileStatus> = files.iter().filter(|f| f.status == "??").collect();
    if !untracked.is_empty() {
        let top = git.must(&["rev-parse", "--show-toplevel"], 8192).await?;
        let top = std::path::PathBuf::from(String::from_utf8_lossy(top.stdout.trim_ascii()).into_owned());
        for (i, f) in untracked.into_iter().enumerate() {
            let room = MAX_DIFF_BYTES.saturating_sub(diff.len());
            if i == MAX_UNTRACKED_DIFFS || room == 0 {
                truncated = true;
                break;
            }
            // git shows a symlink as its target's name and never follows it;
            // a hard link may share its contents with a file outside the
            // workspace, so, as for the file tools, it is listed, not shown.
            let shown = std::fs::symlink_metadata(top.join(&f.path)).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.file_type().is_symlink() || (m.file_type().is_file() && m.nlink() == 1)
            });
            if !shown {
                continue;
            }
            let args: Vec<&str> = ["diff", "--no-index"]
                .iter()
                .chain(FLAGS.iter())
                .chain(["--dst-prefix=b/", "--", "/dev/null", f.path.as_str()].iter())
                .copied()
                .collect();
            let out = git.run_in(&top, &args, room).await.map_err(Spawn::into_error)?;
            truncated |= out.truncated;
            diff.extend_from_slice(&out.stdout);
        }
    }
    Ok(Diff {
        reason: None,
        message: String::new(),
        files,
        diff: String::from_utf8_lossy(&diff).into_owned(),
        truncated,
    })
}

/// `filter.<driver>.{clean,smudge,process}` set to empty for every driver
/// the repository's config names.
pub(super) async fn filter_overrides(git: &Git<'_>) -> Result<Vec<(String, String)>> {
    Ok(config_drivers(git, "filter")
        .await?
        .iter()
        .flat_map(|d| ["clean", "smudge", "process"].map(|v| (format!("filter.{d}.{v}"), String::new())))
        .collect())
}

/// The driver names the repository's config declares under `<section>.<driver>.<key>`.
pub(super) async fn config_drivers(git: &Git<'_>, section: &str) -> Result<Vec<String>> {
    let pattern = format!(r"^{section}\.");
    let out = git
        .run(&["config", "--null", "--get-regexp", &pattern], 256 * 1024)
        .await
        .map_err(Spawn::into_error)?;
    let mut drivers: Vec<String> = Vec::new();
    let prefix = format!("{section}.");
    // Each item is `key\nvalue\0`.
    for item in out.stdout.split(|b| *b == 0) {
        let key = item.split(|b| *b == b'\n').next().unwrap_or_default();
        let key = String::from_utf8_lossy(key);
        let Some(rest) = key.strip_prefix(&prefix) else {
            continue;
        };
        let Some((driver, _)) = rest.rsplit_once('.') else {
            continue;
        };
        if !drivers.iter().any(|d| d == driver) {
            drivers.push(driver.to_string());
        }
    }
    if out.truncated || drivers.len() > MAX_FILTERS {
        return Err(Error::invalid(format!(
            "the repository configures more than {MAX_FILTERS} {section} drivers; vak will not run git there"
        )));
    }
    Ok(drivers)
}

/// `XY path\0` entries; a rename or copy is followed by `from\0`.
fn parse_status(out: &[u8]) -> (Vec<FileStatus>, bool) {
    let mut files = Vec::new();
    let mut items = out.split(|b| *b == 0).filter(|i| !i.is_empty());
    while let Some(item) = items.next() {
        if item.len() < 4 {
            continue;
        }
        let status = String::from_utf8_lossy(&item[..2]).into_owned();
        let path = String::from_utf8_lossy(&item[3..]).into_owned();
        let from = if matches!(item[0], b'R' | b'C') {
            items
                .next()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .unwrap_or_default()
        } else {
            String::new()
        };
        if files.len() == MAX_FILES {
            return (files, true);
        }
        files.push(FileStatus { path, status, from });
    }
    (files, false)
}

/// git run with the repository's code-running settings neutralized (see
/// the module doc); `host/worktree.rs` runs its writes through it too.
pub(super) struct Git<'a> {
    ws: &'a Path,
    program: &'a Path,
    overrides: Vec<(String, String)>,
}

pub(super) struct Output {
    pub(super) ok: bool,
    /// The exit code (None when killed by a signal).
    pub(super) code: Option<i32>,
    pub(super) stdout: Vec<u8>,
    /// Its first 8 KiB, for messages and logs only.
    pub(super) stderr: Vec<u8>,
    pub(super) truncated: bool,
}

pub(super) enum Spawn {
    /// The program could not be started at all.
    Missing(std::io::Error),
    Failed(Error),
}

impl Spawn {
    pub(super) fn into_error(self) -> Error {
        match self {
            Spawn::Missing(e) => Error::internal(format!("cannot run git: {e}")),
            Spawn::Failed(e) => e,
        }
    }
}

impl<'a> Git<'a> {
    pub(super) fn new(ws: &'a Path, program: &'a Path, filters: Vec<(String, String)>) -> Git<'a> {
        let mut overrides: Vec<(String, String)> = [
            ("core.fsmonitor", "false"),
            ("core.untrackedCache", "false"),
            ("core.hooksPath", "/dev/null"),
            ("core.pager", "cat"),
            ("diff.external", ""),
            ("color.ui", "false"),
            // No transport, no program a transport would run (see the
            // module doc: the environment carries the rules that win).
            ("protocol.allow", "never"),
            ("core.sshCommand", "false"),
            ("core.askPass", ""),
            ("core.gitProxy", ""),
            ("credential.helper", ""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        overrides.extend(filters);
        Git {
            ws,
            program,
            overrides,
        }
    }

    fn command(&self, dir: &Path) -> Command {
        let mut c = Command::new(self.program);
        c.current_dir(dir)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
            )
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_PAGER", "cat")
            // A missing object is an error, never a fetch from a promisor remote.
            .env("GIT_NO_LAZY_FETCH", "1")
            // Set and empty: no protocol is allowed, whatever the
            // repository's `protocol.<name>.allow` says (env beats config).
            .env("GIT_ALLOW_PROTOCOL", "")
            // Each beats its config counterpart (`core.sshCommand`,
            // `core.askPass`, `core.gitProxy`); empty askpass and proxy
            // mean none, and `false` as the ssh command runs nothing.
            .env("GIT_SSH_COMMAND", "false")
            .env("GIT_ASKPASS", "")
            .env("GIT_PROXY_COMMAND", "")
            // The environment is cleared: commits and merges (worktree.rs)
            // are made as vak.
            .env("GIT_AUTHOR_NAME", "vak")
            .env("GIT_AUTHOR_EMAIL", "vak@localhost")
            .env("GIT_COMMITTER_NAME", "vak")
            .env("GIT_COMMITTER_EMAIL", "vak@localhost")
            .env("GIT_CONFIG_COUNT", self.overrides.len().to_string())
            .arg("--no-pager")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(home) = std::env::var_os("HOME") {
            c.env("HOME", home);
        }
        for (i, (k, v)) in self.overrides.iter().enumerate() {
            c.env(format!("GIT_CONFIG_KEY_{i}"), k)
                .env(format!("GIT_CONFIG_VALUE_{i}"), v);
        }
        c
    }

    pub(super) async fn run(&self, args: &[&str], cap: usize) -> std::result::Result<Output, Spawn> {
        self.run_in(self.ws, args, cap).await
    }

    /// Like `run`, but a failed command is an error naming its stderr.
    pub(super) async fn must(&self, args: &[&str], cap: usize) -> Result<Output> {
        let out = self.run(args, cap).await.map_err(Spawn::into_error)?;
        if !out.ok && !out.truncated {
            return Err(Error::internal(format!("git {} failed", args.join(" "))));
        }
        Ok(out)
    }

    /// Runs git with at most `cap` bytes of its stdout kept (then it is
    /// killed), at most GIT_TIMEOUT long. `git diff --no-index` exits 1
    /// when files differ: that counts as success.
    pub(super) async fn run_in(
        &self,
        dir: &Path,
        args: &[&str],
        cap: usize,
    ) -> std::result::Result<Output, Spawn> {
        let mut child = self.command(dir).args(args).spawn().map_err(Spawn::Missing)?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(Spawn::Failed(Error::internal("git's pipes are missing")));
        };
        let work = async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            let (mut so, mut se) = (stdout.take(cap as u64 + 1), stderr.take(8192));
            let (o, _) = tokio::join!(so.read_to_end(&mut out), se.read_to_end(&mut err));
            o.map_err(|e| Error::internal(format!("cannot read git's output: {e}")))?;
            let truncated = out.len() > cap;
            if truncated {
                out.truncate(cap);
                let _ = child.start_kill();
            }
            let status = child
                .wait()
                .await
                .map_err(|e| Error::internal(format!("git did not finish: {e}")))?;
            if !status.success() && !truncated && status.code() != Some(1) {
                tracing::debug!(args = ?args, stderr = %String::from_utf8_lossy(&err), "git failed");
            }
            let ok = status.success() || (args.contains(&"--no-index") && status.code() == Some(1));
            Ok::<_, Error>(Output {
                ok,
                code: status.code(),
                stdout: out,
                stderr: err,
                truncated,
            })
        };
        match tokio::time::timeout(GIT_TIMEOUT, work).await {
            Ok(r) => r.map_err(Spawn::Failed),
            // The child is killed when it is dropped (kill_on_drop).
            Err(_) => Err(Spawn::Failed(Error::new(
                crate::error::ErrorKind::Unavailable,
                format!("git {} took longer than {GIT_TIMEOUT:?}", args.join(" ")),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_entries_and_renames_are_parsed() {
        let (files, truncated) = parse_status(b" M a.txt\0R  new\0old\0?? u v\0");
        assert!(!truncated);
        assert_eq!(files.len(), 3);
        assert_eq!(
            (files[0].status.as_str(), files[0].path.as_str()),
            (" M", "a.txt")
        );
        assert_eq!((files[1].path.as_str(), files[1].from.as_str()), ("new", "old"));
        assert_eq!((files[2].status.as_str(), files[2].path.as_str()), ("??", "u v"));
    }
}
