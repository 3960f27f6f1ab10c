//! git for a test's own setup (its own config only, never the machine's): commands and a repository with one commit.

use std::path::Path;

/// Runs git in `dir` with a fixed identity and default branch `main`; its trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `ws` made a repository on `main` with one commit (a README).
pub fn init_repo(ws: &Path) {
    git(ws, &["init", "-q"]);
    std::fs::write(ws.join("README.md"), "hi\n").unwrap();
    git(ws, &["add", "."]);
    git(ws, &["commit", "-q", "-m", "init"]);
}
