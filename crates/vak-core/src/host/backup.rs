//! Backup and restore of a home: `export` copies it out to a directory with a manifest of every file's size and sha256, `import` verifies such a copy and brings its sessions (and, offline, what else it holds) back in.
//!
//! A backup is a plain directory laid out like a home (`sessions/`,
//! `memory/`, `permissions/`, `attachments/`, `costs/`, `USER.md`,
//! `config.toml`, `tasks.json`, and `secrets/` only when asked) plus
//! `manifest.json`, written last: a directory without one is no backup.
//! Everything here blocks (file I/O); the hub's callers run it on
//! `spawn_blocking`, and nothing here holds a lock.

mod export;
mod import;

pub use export::{export, Exported};
pub(crate) use import::place;
pub use import::{import, import_offline, Action, Conflict, Imported, ImportedSession};

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// The manifest's file name, at the top of a backup.
pub const MANIFEST: &str = "manifest.json";
/// What `format` says in every manifest.
const FORMAT: &str = "vak-backup";
/// The manifest layout this version writes and reads.
pub const FORMAT_VERSION: u64 = 1;
/// A manifest read from a backup is at most this long (a hostile backup
/// cannot make the server read an unbounded file into memory).
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// A backup lists at most this many files...
const MAX_FILES: usize = 200_000;
/// ...of at most this many bytes in all.
const MAX_TOTAL_BYTES: u64 = 1 << 40;

/// The top-level names a backup may hold: files, then folders.
const TOP_FILES: &[&str] = &["USER.md", "config.toml", "tasks.json"];
const TOP_DIRS: &[&str] = &[
    "sessions",
    "memory",
    "permissions",
    "attachments",
    "costs",
    "secrets",
];
/// What opens the key store: copied only with `include_secrets`.
const SECRET_FILES: &[&str] = &["secrets/keys.enc", "secrets/master.key"];

/// `manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// Always `vak-backup`.
    pub format: String,
    pub version: u64,
    pub vak_version: String,
    /// RFC 3339, seconds.
    pub created_at: String,
    pub include_secrets: bool,
    /// The session ids whose ledgers (`sessions/<id>.jsonl`) it holds.
    pub sessions: Vec<String>,
    /// Every file but the manifest, sorted by path.
    pub files: Vec<FileEntry>,
}

/// One file of a backup.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FileEntry {
    /// Relative, `/`-separated, no `.` or `..`.
    pub path: String,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// `export` of the home `hub` serves, off the runtime. Refused with `--bus`
/// (the ledgers are in NATS JetStream, not in the home).
pub async fn export_served(
    hub: &crate::host::hub::Hub,
    dest_dir: &str,
    include_secrets: bool,
) -> Result<Exported> {
    let cfg = hub.control().config();
    if cfg.nats.is_some() {
        return Err(Error::invalid(
            "with --bus, sessions live in NATS JetStream: backup export copies ledger files only",
        ));
    }
    // What each loaded session's writer has appended whole, read before any
    // copy starts: its ledger is copied no further, even if an append in
    // flight then fails and is cut off the file.
    let committed: HashMap<String, u64> = hub
        .sessions()
        .live()
        .iter()
        .filter_map(|s| Some((s.id().to_string(), s.committed_len()?)))
        .collect();
    let (home, dest) = (cfg.home.clone(), dest_dir.to_string());
    tokio::task::spawn_blocking(move || export::export_within(&home, &dest, include_secrets, &committed))
        .await
        .map_err(|e| Error::internal(format!("the backup task stopped: {e}")))?
}

/// `dir` as an absolute path outside the home (`what` names it in errors):
/// relative, the home itself or anything inside it is invalid. Symlinks are
/// resolved in the part of the path that exists, so a link into the home is
/// caught too.
pub(crate) fn outside_home(home: &Path, dir: &str, what: &str) -> Result<PathBuf> {
    if dir.is_empty() {
        return Err(Error::invalid(format!("{what} is required")).with_reason("relative_path"));
    }
    let path = Path::new(dir);
    if !path.is_absolute() {
        return Err(
            Error::invalid(format!("{what} must be an absolute path (got {dir:?})"))
                .with_reason("relative_path"),
        );
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(Error::invalid(format!("{what} must not contain \"..\"")).with_reason("relative_path"));
    }
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    let resolved = canonical_prefix(path);
    if resolved == home || resolved.starts_with(&home) {
        return Err(Error::invalid(format!(
            "{what} {} is the home or inside it ({}); choose a directory outside the home",
            path.display(),
            home.display()
        ))
        .with_reason("inside_home"));
    }
    Ok(resolved)
}

/// `path` with its longest existing prefix canonicalized and the rest appended.
fn canonical_prefix(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path.to_path_buf();
    loop {
        if let Ok(c) = std::fs::canonicalize(&at) {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (at.file_name().map(|n| n.to_os_string()), at.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                at = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Whether `rel` is a path a backup may name: relative, plain components,
/// under one of the known top-level names.
fn allowed_path(rel: &str) -> bool {
    if rel.is_empty() || rel.len() > 4096 || rel.contains('\0') || rel.contains('\\') {
        return false;
    }
    let p = Path::new(rel);
    if !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return false;
    }
    // `a//b` and a trailing `/` normalise away: the text must be the path.
    if p.components().count() != rel.split('/').count() {
        return false;
    }
    let mut parts = rel.split('/');
    let top = parts.next().unwrap_or_default();
    let deeper = parts.next().is_some();
    if deeper {
        TOP_DIRS.contains(&top)
    } else {
        TOP_FILES.contains(&top)
    }
}

/// Copies `len` bytes of `from` to a new file `to` (0600, parents 0700),
/// returning its sha256 as hex. Fails if `from` ends before `len`.
fn copy_hashing(from: &mut impl Read, to: &Path, len: u64) -> std::io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = to.parent() {
        crate::home::create_private_dir(parent)?;
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = from.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the file ended {left} bytes early"),
            ));
        }
        ctx.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    out.sync_all()?;
    Ok(hex(ctx.finish().as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An I/O failure on `path`, as an internal error naming it.
fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::internal(format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_under_known_names_are_allowed() {
        for ok in [
            "sessions/a.jsonl",
            "memory/k.md",
            "USER.md",
            "attachments/ab",
            "costs/2026-01-01.jsonl",
        ] {
            assert!(allowed_path(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "sessions/../../x",
            "sessions/./a",
            "sessions//a",
            "sessions/",
            "token",
            "server.json",
            "sessions",
            "other/x",
            "a\\b",
        ] {
            assert!(!allowed_path(bad), "{bad}");
        }
    }

    #[test]
    fn the_home_and_what_is_inside_it_are_refused() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().display().to_string();
        let reason = |d: &str| outside_home(home.path(), d, "dest_dir").unwrap_err().reason;
        assert_eq!(reason(&h), Some("inside_home"));
        assert_eq!(reason(&format!("{h}/sessions/new")), Some("inside_home"));
        assert_eq!(reason("rel/dir"), Some("relative_path"));
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(home.path(), other.path().join("link")).unwrap();
        let via_link = format!("{}/link/x", other.path().display());
        assert_eq!(reason(&via_link), Some("inside_home"));
        assert!(outside_home(home.path(), &format!("{}/new", other.path().display()), "d").is_ok());
    }
}
