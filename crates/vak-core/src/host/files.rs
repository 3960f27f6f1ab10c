//! The workspace's files for clients: one file read or written with its SHA-256 (a stale hash is a conflict), the bounded file tree, and folder names under the configured roots.
//!
//! Paths are confined exactly as the file tools' are (`workspace.rs`): the
//! kernel resolves them beneath a descriptor of the workspace, so `..`,
//! absolute paths and symlinks leading out are refused, and only regular
//! files with one link are read or replaced. Every function here blocks:
//! the service calls them through `spawn_blocking`.

use crate::error::{Error, Result};
use crate::tools::{edit, search};
use crate::workspace;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The largest file read or written through the files API. Its base64 form
/// (4/3 larger) still fits the server's 4 MiB request body limit.
pub const MAX_FILE_BYTES: u64 = 2 << 20;
/// Files listed by a tree without a limit, and the largest limit allowed.
pub const DEFAULT_TREE_LIMIT: usize = 1000;
pub const MAX_TREE_LIMIT: usize = 10_000;
/// Folder names one listing returns at most.
pub const MAX_DIRS: usize = 1000;
/// Entries one listing reads at most (a folder of millions of files is cut, not read whole).
const MAX_DIR_SCAN: usize = 100_000;

/// A file as read: its bytes and their SHA-256 (lowercase hex).
#[derive(Debug)]
pub struct FileRead {
    pub path: String,
    pub bytes: Vec<u8>,
    pub sha256: String,
}

/// What a write did.
#[derive(Debug, PartialEq, Eq)]
pub struct FileWritten {
    pub path: String,
    pub sha256: String,
    pub size: u64,
    /// The file did not exist before.
    pub created: bool,
}

/// SHA-256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `bytes` can travel as text: valid UTF-8 without a NUL byte
/// (anything else goes base64).
pub fn is_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

fn too_large(path: &str, size: u64) -> Error {
    Error::too_large(format!(
        "{path}: is {size} bytes; the files API reads and writes files up to {MAX_FILE_BYTES} bytes"
    ))
}

/// A failed open as the error a client can act on: a missing file is not
/// found, everything else (an escape, a symlink, not a file) is refused.
fn open_error(path: &str, verb: &str, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Error::not_found(format!("{path}: no such file")),
        Some(libc::ENOTDIR) => Error::not_found(format!("{path}: a folder on the way is a file")),
        _ => Error::invalid(workspace::explain(path, verb, e)),
    }
}

/// Reads the regular file `path` beneath `ws` whole (at most MAX_FILE_BYTES).
pub fn read(ws: &Path, path: &str) -> Result<FileRead> {
    let parts = workspace::components(path).map_err(Error::invalid)?;
    if parts.is_empty() {
        return Err(Error::invalid(format!(
            "{path}: is the workspace itself, not a file"
        )));
    }
    let root = workspace::open_root(ws).map_err(Error::internal)?;
    let fd = workspace::open_beneath(
        &root,
        &parts,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| open_error(path, "read", e))?;
    let file = File::from(fd);
    let size = workspace::check_regular(&file, path, "read").map_err(Error::invalid)?;
    if size > MAX_FILE_BYTES {
        return Err(too_large(path, size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    (&file)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::internal(format!("cannot read {path}: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(path, bytes.len() as u64));
    }
    let sha256 = sha256_hex(&bytes);
    Ok(FileRead {
        path: parts.join("/"),
        bytes,
        sha256,
    })
}

/// Checks an `expected_sha256`: empty (the file must not exist) or 64 hex digits.
pub fn check_sha(sha: &str) -> Result<String> {
    let sha = sha.to_ascii_lowercase();
    if sha.is_empty() || (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())) {
        Ok(sha)
    } else {
        Err(Error::invalid(
            "expected_sha must be 64 hex digits (the sha256 a read returned), or empty for a file that must not exist yet",
        ))
    }
}

/// Creates or replaces the regular file `path` beneath `ws` with `content`,
/// through a temp file renamed over it (readers see the old or the new file,
/// never half of one), creating missing folders beneath the workspace.
///
/// With `expected`, the file must still have that SHA-256 (empty: must not
/// exist), or nothing is written and the answer is a conflict naming the
/// current hash. The check and the rename happen under an exclusive `flock`
/// of the file's folder, which every write through this API takes, so two
/// clients that read the same version cannot both replace it. (A tool or
/// another program writing the file meanwhile takes no such lock.)
pub fn write(ws: &Path, path: &str, content: &[u8], expected: Option<&str>) -> Result<FileWritten> {
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(path, content.len() as u64));
    }
    let expected = expected.map(check_sha).transpose()?;
    let parts = workspace::components(path).map_err(Error::invalid)?;
    let Some((name, dirs)) = parts.split_last() else {
        return Err(Error::invalid(format!(
            "{path}: is the workspace itself, not a file"
        )));
    };
    let root = workspace::open_root(ws).map_err(Error::internal)?;
    for depth in 1..=dirs.len() {
        workspace::make_dir_beneath(&root, &dirs[..depth]).map_err(|e| {
            Error::invalid(format!(
                "cannot create the folder for {path}: {}",
                workspace::explain(&dirs[..depth].join("/"), "create", e)
            ))
        })?;
    }
    let dir = workspace::open_beneath(
        &root,
        dirs,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| open_error(path, "write", e))?;
    let _locked = Flock::exclusive(&dir)
        .map_err(|e| Error::internal(format!("cannot lock the folder of {path}: {e}")))?;
    let current = current(&dir, name, path)?;
    if let Some(want) = &expected {
        let now = current.as_ref().map_or("", |(sha, _)| sha.as_str());
        if want != now {
            return Err(Error::conflict(if now.is_empty() {
                format!("{path}: expected_sha names a version, but the file does not exist (any more)")
            } else if want.is_empty() {
                format!("{path}: already exists (sha256 {now}); read it and send its sha as expected_sha to replace it")
            } else {
                format!("{path}: changed since it was read: its sha256 is now {now}; read it again")
            }));
        }
    }
    let mode = current.as_ref().map_or(0o644, |(_, mode)| *mode);
    edit::replace(&dir, name, path, content, mode).map_err(Error::internal)?;
    Ok(FileWritten {
        path: parts.join("/"),
        sha256: sha256_hex(content),
        size: content.len() as u64,
        created: current.is_none(),
    })
}

/// The SHA-256 and mode of the file `name` in `dir`, None when it is missing.
/// The file is hashed as it streams in, so a large one costs no memory.
fn current(dir: &OwnedFd, name: &str, path: &str) -> Result<Option<(String, u32)>> {
    let fd = edit::openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    );
    let fd = match fd {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        // The rename would replace the link itself, not the file it names.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::invalid(format!(
                "{path}: is a symlink; write the file it points to"
            )))
        }
        Err(e) => return Err(open_error(path, "write", e)),
    };
    let mut file = File::from(fd);
    workspace::check_regular(&file, path, "written").map_err(Error::invalid)?;
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| Error::internal(format!("cannot read {path}: {e}")))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(Some((hex(ctx.finish().as_ref()), mode)))
}

/// An exclusive advisory lock of an open folder, released when dropped.
struct Flock<'a>(&'a OwnedFd);

impl<'a> Flock<'a> {
    fn exclusive(fd: &'a OwnedFd) -> std::io::Result<Flock<'a>> {
        loop {
            // SAFETY: fd is an open descriptor; flock only takes a lock on it.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(fd));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: the descriptor is still open (borrowed for the lock's life).
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The workspace's files (relative paths, sorted), .gitignore respected, no
/// symlink followed, `.git` left out; at most `limit`, and whether there were more.
pub fn tree(ws: &Path, limit: usize) -> Result<(Vec<String>, bool)> {
    let branch = search::Branch::open(ws, None).map_err(Error::invalid)?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut out = Vec::new();
    let mut more = false;
    let walk_hit = branch
        .files(".", &cancel, |rel, _| {
            if out.len() == limit {
                more = true;
                return false;
            }
            out.push(rel.join("/"));
            true
        })
        .map_err(Error::invalid)?;
    out.sort();
    Ok((out, more || walk_hit))
}

/// One folder's subfolders, for a client choosing a workspace.
#[derive(Debug, PartialEq, Eq)]
pub struct DirListing {
    /// The folder listed (absolute, symlinks resolved).
    pub path: String,
    /// Its parent when that is still inside a root, else empty.
    pub parent: String,
    /// Subfolder names (not symlinks), sorted, at most MAX_DIRS (of the
    /// first MAX_DIR_SCAN entries).
    pub dirs: Vec<String>,
    pub truncated: bool,
    /// The roots (absolute, resolved): nothing outside them is listed.
    pub roots: Vec<String>,
}

/// The `reason` of a path refused for being outside `[server] workspace_roots`.
pub const OUTSIDE_ROOTS: &str = "outside_workspace_roots";

/// `path` (absolute; empty: the first root) resolved (symlinks and `..`
/// first, so the check sees where it really is), refused unless it is
/// inside one of `roots`. Blocking.
pub fn resolve_in_roots(roots: &[PathBuf], path: &str) -> Result<PathBuf> {
    let roots: Vec<PathBuf> = roots.iter().filter_map(|r| r.canonicalize().ok()).collect();
    let Some(first) = roots.first() else {
        return Err(Error::not_found("none of the workspace roots exists"));
    };
    let asked = if path.is_empty() {
        first.clone()
    } else {
        if path.contains('\0') || path.len() > workspace::MAX_PATH_BYTES {
            return Err(Error::invalid(
                "path must be an absolute path without NUL bytes, at most 4096 bytes",
            ));
        }
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(Error::invalid(format!("{path}: give an absolute path")));
        }
        // Symlinks and `..` resolved first, so the root check sees where it really is.
        p.canonicalize().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::not_found(format!("{path}: no such folder")),
            _ => Error::invalid(format!("{path}: {e}")),
        })?
    };
    let inside = |p: &Path| roots.iter().any(|r| p.starts_with(r));
    if !inside(&asked) {
        return Err(Error::invalid(format!(
            "{path}: is outside the workspace roots ([server] workspace_roots)"
        ))
        .with_reason(OUTSIDE_ROOTS));
    }
    Ok(asked)
}

/// Lists the subfolders of `path` (absolute; empty: the first root), which
/// must resolve inside one of `roots`. Names only: no file is opened.
pub fn dirs(roots: &[PathBuf], path: &str) -> Result<DirListing> {
    let asked = resolve_in_roots(roots, path)?;
    let roots: Vec<PathBuf> = roots.iter().filter_map(|r| r.canonicalize().ok()).collect();
    let inside = |p: &Path| roots.iter().any(|r| p.starts_with(r));
    let mut names = Vec::new();
    let mut truncated = false;
    let entries = std::fs::read_dir(&asked).map_err(|e| Error::invalid(format!("{path}: {e}")))?;
    for (scanned, entry) in entries.flatten().enumerate() {
        if scanned == MAX_DIR_SCAN {
            truncated = true;
            break;
        }
        // file_type does not follow a symlink: a link to a folder elsewhere is not offered.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if names.len() == MAX_DIRS {
            truncated = true;
            break;
        }
        names.push(name);
    }
    names.sort();
    let parent = asked
        .parent()
        .filter(|p| inside(p))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    Ok(DirListing {
        path: asked.display().to_string(),
        parent,
        dirs: names,
        truncated,
        roots: roots.iter().map(|r| r.display().to_string()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_sha_changes_nothing_and_a_fresh_one_replaces_the_file() {
        let ws = tempfile::tempdir().unwrap();
        let w = write(ws.path(), "d/a.txt", b"one", Some("")).unwrap();
        assert!(w.created);
        assert_eq!(w.sha256, sha256_hex(b"one"));
        let again = write(ws.path(), "d/a.txt", b"two", Some("")).unwrap_err();
        assert_eq!(again.kind, crate::error::ErrorKind::Conflict);
        let r = read(ws.path(), "d/a.txt").unwrap();
        let w = write(ws.path(), "d/a.txt", b"two", Some(&r.sha256)).unwrap();
        assert!(!w.created);
        let stale = write(ws.path(), "d/a.txt", b"three", Some(&r.sha256)).unwrap_err();
        assert_eq!(stale.kind, crate::error::ErrorKind::Conflict);
        assert!(stale.message.contains(&w.sha256), "{stale}");
        assert_eq!(std::fs::read(ws.path().join("d/a.txt")).unwrap(), b"two");
        assert!(check_sha("xyz").is_err());
    }
}
