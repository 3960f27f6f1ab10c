//! The data home: where it is, and the server.json that tells local clients the URL and token of the running server.

use crate::error::{Error, Result};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
pub use vak_proto::home::{
    read_server_json, remove_server_json, resolve, server_json, write_server_json, ServerInfo,
};

/// Creates `dir` and any missing parents owner-only (0700), whatever the
/// umask; an existing directory keeps its mode.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Whether other users can read or enter `dir` (its mode gives group or other any bit).
pub fn readable_by_others(dir: &Path) -> Option<u32> {
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// The home's owner: an exclusive OS lock on `server.lock`, held for the
/// process's life. The kernel releases it when the process dies however it
/// dies, so a killed server never blocks a restart, and two live servers can
/// never write one ledger.
#[derive(Debug)]
pub struct HomeLock {
    _file: std::fs::File,
}

/// Why the home could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// A live server owns it; what it says about itself.
    Owned {
        pid: Option<u32>,
        url: Option<String>,
    },
    Io(Error),
}

impl HomeLock {
    /// Creates the home if needed and takes its lock, writing our pid into the
    /// lock file so a refused second server can name the owner.
    pub fn acquire(home: &Path) -> std::result::Result<HomeLock, LockError> {
        create_private_dir(home).map_err(|e| {
            LockError::Io(Error::internal(format!(
                "cannot create the home {}: {e}",
                home.display()
            )))
        })?;
        let path = home.join("server.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| LockError::Io(Error::internal(format!("cannot open {}: {e}", path.display()))))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut file, &mut text);
                let pid = text.trim().parse::<u32>().ok();
                let url = read_server_json(home)
                    .filter(|info| pid.is_some() && info.pid == pid)
                    .map(|info| info.url);
                return Err(LockError::Owned { pid, url });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(LockError::Io(Error::internal(format!(
                    "cannot lock {}: {e}",
                    path.display()
                ))))
            }
        }
        // Ours now: record who we are (the lock, not this text, is what excludes).
        let pid = std::process::id().to_string();
        let written = file
            .set_len(0)
            .and_then(|()| std::io::Seek::rewind(&mut file))
            .and_then(|()| file.write_all(pid.as_bytes()));
        if let Err(e) = written {
            return Err(LockError::Io(Error::internal(format!(
                "cannot write {}: {e}",
                path.display()
            ))));
        }
        Ok(HomeLock { _file: file })
    }
}

/// The bearer token kept in the home (`token`, mode 0600), so restarts keep
/// every client's credentials valid. Made when missing (or empty) or when
/// `rotate` asks for a new one; written to a temporary file and renamed, so a
/// crash never leaves half a token.
pub fn stable_token(home: &Path, rotate: bool) -> Result<String> {
    let path = home.join("token");
    if !rotate {
        match std::fs::read_to_string(&path) {
            Ok(t) if !t.trim().is_empty() => {
                // Someone widened it: the token is a credential, keep it owner-only.
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                return Ok(t.trim().to_string());
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
        }
    }
    let token = generate_token();
    write_private_file(home, "token", format!("{token}\n").as_bytes())?;
    Ok(token)
}

/// Writes `dir/name` with mode 0600 through a temporary file and a rename, so
/// a crash leaves the old file or the new one, never half of one.
pub fn write_private_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let err = |e: std::io::Error| Error::internal(format!("cannot write {}: {e}", path.display()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(())
}

/// A workspace as the home keys what it keeps per workspace (rules, memory
/// notes, search hits): its canonical path (blocking: it resolves symlinks)
/// and the first 64 bits of that path's SHA-256 as hex, a file name that
/// no workspace path can steer.
pub fn workspace_key(workspace: &Path) -> (String, String) {
    let canonical = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    let workspace = canonical.display().to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, workspace.as_bytes());
    let key = digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
    (workspace, key)
}

/// 256 random bits as hex.
pub fn generate_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The URL a local client uses to reach a listener bound to `addr`: an
/// unspecified address (0.0.0.0, ::) is reached through loopback, which the
/// Host check always accepts.
pub fn local_url(scheme: &str, addr: std::net::SocketAddr) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("{scheme}://{}", std::net::SocketAddr::new(ip, addr.port()))
}
