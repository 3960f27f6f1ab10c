//! The session hub: creates sessions, lists them from disk, and keeps exactly one live state per loaded session (loading a persisted one on first use).

use super::ledger::{self, Ledger};
use super::mux::Control;
use super::provider::Provider;
use super::session::{Runtime, Session, SessionInfo};
use super::CoreConfig;
use super::PermissionMode;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub struct Hub {
    rt: Arc<Runtime>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Live multiplexed streams by stream id, for follow/unfollow.
    streams: Mutex<HashMap<String, mpsc::Sender<Control>>>,
    closing: CancellationToken,
}

/// What host frames describe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInfo {
    pub version: String,
    pub workspace: String,
}

/// What config frames describe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigInfo {
    pub permission_mode: String,
    pub ring: u64,
}

/// Session ids are path components and cursor-vector keys: keep them plain.
pub fn validate_session_id(id: &str) -> Result<()> {
    validate_plain_id("session id", id)
}

/// An id a client sends and the server echoes (session, approval): 1 to 64
/// of A-Z a-z 0-9 - _; a refusal echoes at most 80 characters of it.
pub fn validate_plain_id(what: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {what} {:?}: 1 to 64 of A-Z a-z 0-9 - _",
            id.chars().take(80).collect::<String>()
        )))
    }
}

impl Hub {
    /// Prepares the home (creating `sessions/`); fails with a clear message when it is not writable.
    pub fn new(cfg: CoreConfig, provider: Arc<dyn Provider>) -> Result<Hub> {
        let dir = cfg.sessions_dir();
        // Prompts, outputs and file contents live here: owner-only, also when
        // an earlier version created it readable.
        crate::home::create_private_dir(&dir)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
        let probe = dir.join(".write-probe");
        std::fs::write(&probe, b"")
            .and_then(|_| std::fs::remove_file(&probe))
            .map_err(|e| Error::internal(format!("the home {} is not writable: {e}", cfg.home.display())))?;
        Ok(Hub {
            rt: Arc::new(Runtime { cfg, provider }),
            sessions: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            closing: CancellationToken::new(),
        })
    }

    pub fn config(&self) -> &CoreConfig {
        &self.rt.cfg
    }

    pub fn host_info(&self) -> HostInfo {
        HostInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            workspace: self.rt.cfg.workspace.display().to_string(),
        }
    }

    pub fn config_info(&self) -> ConfigInfo {
        ConfigInfo {
            permission_mode: match self.rt.cfg.permission {
                PermissionMode::Ask => "ask",
                PermissionMode::Allow => "allow",
                PermissionMode::Deny => "deny",
            }
            .to_string(),
            ring: self.rt.cfg.bus.ring as u64,
        }
    }

    /// Resolves once the hub has shut down (every session closed).
    pub async fn closed(&self) {
        self.closing.cancelled().await
    }

    pub fn register_stream(&self, stream_id: &str, control: mpsc::Sender<Control>) {
        lock(&self.streams).insert(stream_id.to_string(), control);
    }

    pub fn unregister_stream(&self, stream_id: &str) {
        lock(&self.streams).remove(stream_id);
    }

    pub fn stream_control(&self, stream_id: &str) -> Option<mpsc::Sender<Control>> {
        lock(&self.streams).get(stream_id).cloned()
    }

    fn ledger_path(&self, id: &str) -> PathBuf {
        self.rt.cfg.sessions_dir().join(format!("{id}.jsonl"))
    }

    fn loaded(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        lock(&self.sessions)
    }

    pub fn create(&self) -> Result<Arc<Session>> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let created_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let ledger = Ledger::create(&self.ledger_path(&id), &id, &created_at)?;
        let session = Session::create(self.rt.clone(), &id, created_at, ledger);
        self.loaded().insert(id, session.clone());
        Ok(session)
    }

    /// The live session `id`, loading it from its ledger when it is not in memory yet.
    pub fn get(&self, id: &str) -> Result<Arc<Session>> {
        validate_session_id(id)?;
        let mut loaded = self.loaded();
        if let Some(s) = loaded.get(id) {
            return Ok(s.clone());
        }
        let path = self.ledger_path(id);
        if !path.exists() {
            return Err(Error::not_found(format!("no session {id}")));
        }
        let (ledger, records) = Ledger::open(&path)?;
        let session = Session::restore(self.rt.clone(), ledger, records)?;
        tracing::info!(
            session = id,
            latest_seq = session.latest_seq(),
            "session loaded from its ledger"
        );
        loaded.insert(id.to_string(), session.clone());
        Ok(session)
    }

    /// Explicit attach: the same as `get`, named for the API.
    pub fn attach(&self, id: &str) -> Result<Arc<Session>> {
        self.get(id)
    }

    /// Every persisted session, newest first; loaded ones report live state.
    pub fn list(&self) -> Result<Vec<SessionInfo>> {
        let dir = self.rt.cfg.sessions_dir();
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            let Some(id) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if let Some(s) = self.loaded().get(id).cloned() {
                out.push(s.info());
                continue;
            }
            match ledger::summarize(&path) {
                Ok(s) => out.push(SessionInfo {
                    session_id: s.session_id,
                    created_at: s.created_at,
                    title: s.title,
                    latest_seq: s.latest_seq,
                    loaded: false,
                    busy: false,
                }),
                Err(e) => tracing::warn!(path = %path.display(), "skipping an unreadable ledger: {e}"),
            }
        }
        out.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then(a.session_id.cmp(&b.session_id))
        });
        Ok(out)
    }

    /// Graceful stop: every loaded session refuses new input, cancels its
    /// run, settles, closes its streams and syncs its ledger.
    pub async fn shutdown(&self, grace: Duration) {
        let sessions: Vec<_> = self.loaded().values().cloned().collect();
        let mut tasks = Vec::new();
        for s in sessions {
            tasks.push(tokio::spawn(async move { s.shutdown(grace).await }));
        }
        for t in tasks {
            let _ = t.await;
        }
        self.closing.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
