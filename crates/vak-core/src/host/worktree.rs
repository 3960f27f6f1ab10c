//! The git work behind isolated children: a worktree and branch per child, its work committed, measured, merged into the workspace's branch and removed, with the repository's code-running settings neutralized as in `diff.rs`.
//!
//! Everything runs through `diff.rs`'s runner (cleared environment, no
//! system or global config, no hooks, fsmonitor, filters, external diff,
//! transports), bounded in time and output. The writes add to it: every
//! `merge.<driver>.driver` the repository configures is replaced by `false`
//! (a three-way merge of such a file is a conflict, never a program the
//! repository chose), commits and tags are never signed, merge signature
//! checks and autostash are off, submodules are not recursed, and the
//! identity is vak's (`GIT_AUTHOR_*`/`GIT_COMMITTER_*`, the environment
//! being cleared).

use super::diff::{config_drivers, filter_overrides, Git, Output, Spawn};
use crate::error::{Error, ErrorKind, Result};
use crate::worker::DiffStat;
use std::path::{Path, PathBuf};

/// The most conflicting paths a merge refusal names.
const MAX_CONFLICT_PATHS: usize = 20;

/// The `reason` of a workspace that is not in a git work tree.
pub const NOT_A_GIT_REPO: &str = "not_a_git_repo";
/// The `reason` of a merge that conflicted (and was aborted).
pub const MERGE_CONFLICT: &str = "merge_conflict";
/// The `reason` of a merge git refused to start (local changes in the way).
pub const WORKSPACE_DIRTY: &str = "workspace_dirty";

/// A merge of a child's branch into the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// The workspace's branch ("HEAD" when detached).
    pub into: String,
    pub fast_forward: bool,
    /// The workspace's HEAD after the merge.
    pub commit: String,
}

/// A git repository (the workspace of a parent session) and the overrides
/// every command there runs with.
pub(crate) struct Repo {
    ws: PathBuf,
    program: PathBuf,
    overrides: Vec<(String, String)>,
}

impl Repo {
    /// The repository `ws` is in; 400 `not_a_git_repo` when it is in none
    /// (or git is not installed).
    pub(crate) async fn open(ws: &Path, program: &Path) -> Result<Repo> {
        let probe = Git::new(ws, program, Vec::new());
        let inside = match probe.run(&["rev-parse", "--is-inside-work-tree"], 4096).await {
            Err(Spawn::Missing(e)) => {
                return Err(Error::invalid(format!("git is not installed: {e}")).with_reason(NOT_A_GIT_REPO))
            }
            Err(Spawn::Failed(e)) => return Err(e),
            Ok(out) => out,
        };
        if !inside.ok || inside.stdout.trim_ascii() != b"true" {
            return Err(Error::invalid(format!(
                "the workspace {} is not inside a git work tree: isolated children need one",
                ws.display()
            ))
            .with_reason(NOT_A_GIT_REPO));
        }
        let mut overrides = filter_overrides(&probe).await?;
        for d in config_drivers(&probe, "merge").await? {
            overrides.push((format!("merge.{d}.driver"), "false".into()));
        }
        overrides.extend(
            [
                ("commit.gpgSign", "false"),
                ("tag.gpgSign", "false"),
                ("merge.verifySignatures", "false"),
                ("merge.autoStash", "false"),
                ("rebase.autoStash", "false"),
                ("submodule.recurse", "false"),
                ("merge.ff", "true"),
                ("pull.rebase", "false"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        Ok(Repo {
            ws: ws.to_path_buf(),
            program: program.to_path_buf(),
            overrides,
        })
    }

    fn git(&self) -> Git<'_> {
        Git::new(&self.ws, &self.program, self.overrides.clone())
    }

    async fn run(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        self.git()
            .run_in(dir, args, 256 * 1024)
            .await
            .map_err(Spawn::into_error)
    }

    /// `run`, a failure an error quoting git's stderr.
    async fn must(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        let out = self.run(dir, args).await?;
        if !out.ok {
            return Err(Error::internal(format!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(out.stderr.trim_ascii())
            )));
        }
        Ok(out)
    }

    async fn line(&self, dir: &Path, args: &[&str]) -> Result<String> {
        let out = self.must(dir, args).await?;
        Ok(String::from_utf8_lossy(out.stdout.trim_ascii()).into_owned())
    }

    /// The workspace's folder relative to the repository's top ("" at the top).
    pub(crate) async fn prefix(&self) -> Result<String> {
        let p = self.line(&self.ws, &["rev-parse", "--show-prefix"]).await?;
        Ok(p.trim_end_matches('/').to_string())
    }

    /// A new worktree at `dir` on a new branch `branch` from the
    /// workspace's HEAD; answers the commit it starts from.
    pub(crate) async fn add(&self, branch: &str, dir: &Path) -> Result<String> {
        let base = self
            .line(&self.ws, &["rev-parse", "--verify", "HEAD^{commit}"])
            .await
            .map_err(|_| {
                Error::invalid("the workspace's repository has no commit yet: commit once first")
                    .with_reason(NOT_A_GIT_REPO)
            })?;
        if let Some(parent) = dir.parent() {
            let parent = parent.to_path_buf();
            tokio::task::spawn_blocking(move || crate::home::create_private_dir(&parent))
                .await
                .map_err(|e| Error::internal(e.to_string()))?
                .map_err(|e| Error::internal(format!("cannot create the worktree's folder: {e}")))?;
        }
        let d = dir.display().to_string();
        self.must(&self.ws, &["worktree", "add", "--quiet", "-b", branch, &d, &base])
            .await?;
        Ok(base)
    }

    /// Commits everything in the worktree `dir` ("vak: <what>"); false when
    /// there was nothing to commit.
    pub(crate) async fn commit_all(&self, dir: &Path, message: &str) -> Result<bool> {
        self.must(dir, &["add", "-A", "--", "."]).await?;
        let staged = self
            .run(dir, &["diff", "--cached", "--quiet", "--no-ext-diff"])
            .await?;
        if staged.code == Some(0) {
            return Ok(false);
        }
        self.must(
            dir,
            &["commit", "--quiet", "--no-verify", "--no-gpg-sign", "-m", message],
        )
        .await?;
        Ok(true)
    }

    /// `base..branch`'s size.
    pub(crate) async fn diff_stat(&self, base: &str, branch: &str) -> Result<DiffStat> {
        let out = self
            .must(
                &self.ws,
                &[
                    "diff",
                    "--shortstat",
                    "--no-ext-diff",
                    "--no-textconv",
                    base,
                    branch,
                    "--",
                ],
            )
            .await?;
        Ok(parse_shortstat(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Merges `branch` into the workspace's current branch (a fast-forward
    /// when it can be). A conflict is aborted (nothing changes) and answered
    /// 409 `merge_conflict` naming the paths; a merge git refuses to start
    /// (local changes or untracked files in the way) is 409 `workspace_dirty`.
    pub(crate) async fn merge(&self, branch: &str) -> Result<Merged> {
        let into = match self
            .run(&self.ws, &["symbolic-ref", "--short", "-q", "HEAD"])
            .await?
        {
            o if o.ok => String::from_utf8_lossy(o.stdout.trim_ascii()).into_owned(),
            _ => "HEAD".to_string(),
        };
        let tip = self
            .line(
                &self.ws,
                &["rev-parse", "--verify", &format!("{branch}^{{commit}}")],
            )
            .await?;
        let fast_forward = self
            .run(&self.ws, &["merge-base", "--is-ancestor", "HEAD", &tip])
            .await?
            .code
            == Some(0);
        let merged = self
            .run(
                &self.ws,
                &["merge", "--no-edit", "--ff", "--no-verify", "--quiet", &tip],
            )
            .await?;
        if !merged.ok {
            let unmerged = self
                .run(&self.ws, &["diff", "--name-only", "--diff-filter=U", "-z"])
                .await?;
            let mut paths: Vec<String> = unmerged
                .stdout
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            paths.dedup();
            let merging = self
                .run(&self.ws, &["rev-parse", "-q", "--verify", "MERGE_HEAD"])
                .await?
                .ok;
            if merging || !paths.is_empty() {
                let abort = self.run(&self.ws, &["merge", "--abort"]).await?;
                if !abort.ok {
                    tracing::warn!(
                        "git merge --abort failed: {}",
                        String::from_utf8_lossy(&abort.stderr)
                    );
                }
                let more = paths.len().saturating_sub(MAX_CONFLICT_PATHS);
                paths.truncate(MAX_CONFLICT_PATHS);
                let mut list = paths.join(", ");
                if more > 0 {
                    list.push_str(&format!(" and {more} more"));
                }
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "merging {branch} into {into} conflicts in: {list}; the merge was aborted, nothing changed"
                    ),
                )
                .with_reason(MERGE_CONFLICT));
            }
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "git would not merge {branch} into {into}: the workspace has changes in the way ({}); commit or stash them first",
                    String::from_utf8_lossy(merged.stderr.trim_ascii())
                ),
            )
            .with_reason(WORKSPACE_DIRTY));
        }
        let commit = self.line(&self.ws, &["rev-parse", "HEAD"]).await?;
        Ok(Merged {
            into,
            fast_forward,
            commit,
        })
    }

    /// Removes the worktree at `dir` (whatever it holds) and deletes
    /// `branch`; either being gone already is fine.
    pub(crate) async fn remove(&self, branch: &str, dir: &Path) -> Result<()> {
        let d = dir.display().to_string();
        let _ = self
            .run(&self.ws, &["worktree", "remove", "--force", "--force", &d])
            .await?;
        let gone = dir.to_path_buf();
        tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&gone) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(|e| Error::internal(format!("cannot remove the worktree {d}: {e}")))?;
        self.must(&self.ws, &["worktree", "prune"]).await?;
        let exists = self
            .run(
                &self.ws,
                &["rev-parse", "-q", "--verify", &format!("refs/heads/{branch}")],
            )
            .await?
            .ok;
        if exists {
            self.must(&self.ws, &["branch", "-D", "--quiet", branch]).await?;
        }
        Ok(())
    }
}

/// ` 2 files changed, 3 insertions(+), 1 deletion(-)`.
fn parse_shortstat(s: &str) -> DiffStat {
    let mut stat = DiffStat::default();
    for part in s.trim().split(',') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        if what.starts_with("file") {
            stat.files = n;
        } else if what.starts_with("insertion") {
            stat.insertions = n;
        } else if what.starts_with("deletion") {
            stat.deletions = n;
        }
    }
    stat
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .current_dir(dir)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn repo(dir: &Path) {
        git(dir, &["init", "-q"]);
        std::fs::write(dir.join("a.txt"), "one\ntwo\n").unwrap();
        git(dir, &["add", "."]);
        git(dir, &["commit", "-qm", "first"]);
    }

    #[test]
    fn shortstat_lines_are_parsed() {
        assert_eq!(
            parse_shortstat(" 2 files changed, 3 insertions(+), 1 deletion(-)\n"),
            DiffStat {
                files: 2,
                insertions: 3,
                deletions: 1
            }
        );
        assert_eq!(parse_shortstat(""), DiffStat::default());
    }

    #[tokio::test]
    async fn a_folder_outside_git_is_not_a_git_repo() {
        let d = tempfile::tempdir().unwrap();
        let e = Repo::open(d.path(), Path::new("git")).await.err().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(e.reason, Some(NOT_A_GIT_REPO));
    }

    #[tokio::test]
    async fn a_child_branch_is_added_committed_measured_merged_and_removed() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        repo(&ws);
        let r = Repo::open(&ws, Path::new("git")).await.unwrap();
        let wt = d.path().join("home/worktrees/p/c");
        let base = r.add("vak/p/c", &wt).await.unwrap();
        assert_eq!(base, git(&ws, &["rev-parse", "HEAD"]));
        assert!(
            !r.commit_all(&wt, "vak: candidate c").await.unwrap(),
            "nothing to commit"
        );
        std::fs::write(wt.join("b.txt"), "new\n").unwrap();
        assert!(r.commit_all(&wt, "vak: candidate c").await.unwrap());
        let stat = r.diff_stat(&base, "vak/p/c").await.unwrap();
        assert_eq!((stat.files, stat.insertions, stat.deletions), (1, 1, 0));
        let m = r.merge("vak/p/c").await.unwrap();
        assert!(m.fast_forward);
        assert_eq!(m.into, "main");
        assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "new\n");
        assert_eq!(m.commit, git(&ws, &["rev-parse", "HEAD"]));
        r.remove("vak/p/c", &wt).await.unwrap();
        assert!(!wt.exists());
        assert_eq!(git(&ws, &["branch", "--list", "vak/*"]), "");
    }

    #[tokio::test]
    async fn a_conflict_is_aborted_and_names_its_paths_and_a_dirty_workspace_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        repo(&ws);
        let r = Repo::open(&ws, Path::new("git")).await.unwrap();
        let wt = d.path().join("wt/c");
        r.add("vak/p/c", &wt).await.unwrap();
        std::fs::write(wt.join("a.txt"), "theirs\n").unwrap();
        r.commit_all(&wt, "vak: c").await.unwrap();
        std::fs::write(ws.join("a.txt"), "ours\n").unwrap();
        git(&ws, &["commit", "-qam", "ours"]);
        let head = git(&ws, &["rev-parse", "HEAD"]);
        let e = r.merge("vak/p/c").await.err().unwrap();
        assert_eq!((e.kind, e.reason), (ErrorKind::Conflict, Some(MERGE_CONFLICT)));
        assert!(e.message.contains("a.txt"), "{}", e.message);
        assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head);
        assert_eq!(git(&ws, &["status", "--porcelain"]), "");
        // An untracked file where the branch adds one: git will not merge.
        let wt2 = d.path().join("wt/d");
        r.add("vak/p/d", &wt2).await.unwrap();
        std::fs::write(wt2.join("new.txt"), "theirs\n").unwrap();
        r.commit_all(&wt2, "vak: d").await.unwrap();
        std::fs::write(ws.join("new.txt"), "mine\n").unwrap();
        let e = r.merge("vak/p/d").await.err().unwrap();
        assert_eq!((e.kind, e.reason), (ErrorKind::Conflict, Some(WORKSPACE_DIRTY)));
        assert_eq!(std::fs::read_to_string(ws.join("new.txt")).unwrap(), "mine\n");
    }

    #[tokio::test]
    async fn a_hostile_repository_config_runs_nothing() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        repo(&ws);
        std::fs::write(ws.join(".gitattributes"), "*.txt filter=evil merge=evil\n").unwrap();
        git(&ws, &["add", "."]);
        git(&ws, &["commit", "-qm", "attrs"]);
        let marker = d.path().join("marker");
        let touch = format!("touch {}", marker.display());
        let hooks = d.path().join("hooks");
        std::fs::create_dir(&hooks).unwrap();
        for h in [
            "post-checkout",
            "pre-commit",
            "commit-msg",
            "post-commit",
            "post-merge",
            "pre-merge-commit",
            "prepare-commit-msg",
            "reference-transaction",
        ] {
            for dir in [hooks.clone(), ws.join(".git/hooks")] {
                let p = dir.join(h);
                std::fs::write(&p, format!("#!/bin/sh\n{touch}\n")).unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let cfg = ws.join(".git/config");
        let mut c = std::fs::read_to_string(&cfg).unwrap();
        c.push_str(&format!(
            "[core]\n\thooksPath = {}\n\tfsmonitor = {touch}\n[filter \"evil\"]\n\tclean = {touch}; cat\n\tsmudge = {touch}; cat\n\trequired = false\n[merge \"evil\"]\n\tdriver = {touch}\n[commit]\n\tgpgSign = true\n[gpg]\n\tprogram = {touch}\n[diff]\n\texternal = {touch}\n",
            hooks.display()
        ));
        std::fs::write(&cfg, c).unwrap();
        let r = Repo::open(&ws, Path::new("git")).await.unwrap();
        let wt = d.path().join("wt/c");
        let base = r.add("vak/p/c", &wt).await.unwrap();
        std::fs::write(wt.join("a.txt"), "theirs\n").unwrap();
        assert!(r.commit_all(&wt, "vak: c").await.unwrap());
        r.diff_stat(&base, "vak/p/c").await.unwrap();
        // Both sides change a.txt: the three-way merge would run the driver.
        std::fs::write(ws.join("a.txt"), "ours\n").unwrap();
        let out = Command::new("git")
            .current_dir(&ws)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "core.hooksPath=/dev/null",
            ])
            .args([
                "-c",
                "core.fsmonitor=false",
                "-c",
                "filter.evil.clean=cat",
                "-c",
                "commit.gpgSign=false",
            ])
            .args(["commit", "-qam", "ours", "--no-verify"])
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!marker.exists(), "the test's own commit ran a program");
        let e = r.merge("vak/p/c").await.err().unwrap();
        assert_eq!(e.kind, ErrorKind::Conflict, "{}", e.message);
        r.remove("vak/p/c", &wt).await.unwrap();
        assert!(!marker.exists(), "a program the repository configured was run");
    }
}
