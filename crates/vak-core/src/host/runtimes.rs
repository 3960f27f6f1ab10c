//! The runtime of each workspace sessions run in: the server's own, or one made from it on first use and kept for the process's life (shared by the session registry and the control plane's rules).

use crate::error::{Error, Result};
use crate::host::workspaces::{Pinned, Workspaces};
use crate::session::runtime::Runtime;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) struct Runtimes {
    primary: Arc<Runtime>,
    workspaces: Arc<Workspaces>,
    /// The runtimes of workspaces other than the server's own, by
    /// canonical path.
    made: Mutex<HashMap<String, Arc<Runtime>>>,
}

impl Runtimes {
    pub(crate) fn new(primary: Arc<Runtime>, workspaces: Arc<Workspaces>) -> Runtimes {
        Runtimes {
            primary,
            workspaces,
            made: Mutex::new(HashMap::new()),
        }
    }

    /// The server's own workspace's runtime.
    pub(crate) fn primary(&self) -> &Arc<Runtime> {
        &self.primary
    }

    /// The runtime for sessions in `workspace` (a canonical path): the
    /// primary's own, or one made from it, its folder re-checked now
    /// (`workspaces::recheck`: a folder replaced since it was opened is
    /// refused). A cached runtime whose folder is no longer the one there
    /// (the folder was opened again) is made afresh. Blocking (resolves the
    /// path; a new runtime reads its rules file, outside the lock).
    pub(crate) fn for_workspace(&self, workspace: &str) -> Result<Arc<Runtime>> {
        if workspace == self.primary.workspace() {
            return Ok(self.primary.clone());
        }
        let pin = self.workspaces.pin(Path::new(workspace))?;
        Ok(self.cached(pin))
    }

    /// The runtime for a session reloaded from its ledger in `workspace`:
    /// as `for_workspace`, but a folder that fails the check still gets one
    /// (the session loads, its transcript is served, and each use is refused).
    pub(crate) fn reloaded(&self, workspace: &str) -> Arc<Runtime> {
        if workspace == self.primary.workspace() {
            return self.primary.clone();
        }
        let pin = self.workspaces.pin_reloaded(Path::new(workspace));
        self.cached(pin)
    }

    fn cached(&self, pin: Pinned) -> Arc<Runtime> {
        let key = pin.path.display().to_string();
        let id = pin.id;
        let same = |rt: &Arc<Runtime>| rt.pinned().is_some_and(|p| p.id == id || id.is_none());
        if let Some(rt) = self.made().get(&key).filter(|rt| same(rt)) {
            return rt.clone();
        }
        // Made outside the lock: a new runtime reads its rules file.
        let made = Arc::new(self.primary.in_workspace(pin));
        let mut map = self.made();
        match map.get(&key) {
            Some(rt) if same(rt) => rt.clone(),
            _ => {
                map.insert(key, made.clone());
                made
            }
        }
    }

    /// The runtime of the open workspace at `workspace` (an absolute path,
    /// as `GET /workspaces` lists it; None: the server's own): made on first
    /// use like a session's, its folder re-checked. An empty path is
    /// InvalidArgument; a path no open workspace has is NotFound
    /// (`workspace_not_open`).
    pub(crate) async fn of_open(self: &Arc<Self>, workspace: Option<&str>) -> Result<Arc<Runtime>> {
        let Some(asked) = workspace else {
            return Ok(self.primary.clone());
        };
        if asked.is_empty() {
            return Err(Error::invalid(
                "workspace is empty: give the absolute path of an open workspace (GET /workspaces), \
                 or leave it out for the server's own",
            ));
        }
        let (me, asked) = (self.clone(), asked.to_string());
        tokio::task::spawn_blocking(move || {
            let Some(w) = me.workspaces.find(&asked)? else {
                return Err(Error::not_found(format!(
                    "no open workspace {asked}: GET /workspaces lists the open ones (POST /workspaces/open opens one)"
                ))
                .with_reason("workspace_not_open"));
            };
            if w.primary {
                return Ok(me.primary.clone());
            }
            me.for_workspace(&w.path.display().to_string())
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
    }

    /// Forgets the runtime of `workspace` (a removed child's worktree), so
    /// the map holds only folders still in use.
    pub(crate) fn forget(&self, workspace: &str) {
        self.made().remove(workspace);
    }

    fn made(&self) -> MutexGuard<'_, HashMap<String, Arc<Runtime>>> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }
}
