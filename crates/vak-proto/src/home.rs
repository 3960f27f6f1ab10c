//! Where the data home is, and the server.json in it that tells local clients (vak term,
//! scripts) the URL and token of the running server.

use crate::error::{Error, Result};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `--home`, else $VAK_HOME (clap fills both into `explicit`), else ~/.local/share/vak.
pub fn resolve(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    match std::env::var_os("HOME") {
        Some(h) if !h.is_empty() => Ok(PathBuf::from(h).join(".local/share/vak")),
        _ => Err(Error::invalid(
            "no home: pass --home or set VAK_HOME (HOME is not set)",
        )),
    }
}

pub fn server_json(home: &Path) -> PathBuf {
    home.join("server.json")
}

/// Writes server.json with mode 0600 (also when it already existed with a wider mode).
pub fn write_server_json(home: &Path, url: &str, token: &str) -> Result<()> {
    let path = server_json(home);
    let body = serde_json::json!({ "url": url, "token": token, "pid": std::process::id() });
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", path.display())))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(format!("{body:#}\n").as_bytes())?;
    Ok(())
}

/// Removes server.json if it still describes this process.
pub fn remove_server_json(home: &Path) {
    let path = server_json(home);
    let ours = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("pid").and_then(|p| p.as_u64()))
        == Some(u64::from(std::process::id()));
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// What server.json says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct ServerInfo {
    pub url: String,
    pub token: String,
    #[serde(default)]
    pub pid: Option<u32>,
}

/// server.json, if it exists and parses.
pub fn read_server_json(home: &Path) -> Option<ServerInfo> {
    let bytes = std::fs::read(server_json(home)).ok()?;
    serde_json::from_slice(&bytes).ok()
}
