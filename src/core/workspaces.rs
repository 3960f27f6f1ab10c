//! The workspaces a server has open: its own (`vak serve`'s folder, trusted) and the folders clients opened under `[server] workspace_roots`, bounded.

use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Open workspaces at most (the server's own included): each is a folder a
/// client may start a terminal in, so the list is kept short and refusals
/// past it say so.
pub const MAX_OPEN: usize = 32;

/// One open workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenWorkspace {
    /// Absolute, symlinks resolved.
    pub path: PathBuf,
    /// Whether the owner vouched for its contents. An untrusted workspace
    /// may be listed and browsed, but vak runs no program in it (no
    /// terminal), so a hostile checkout cannot reach a shell through a
    /// file it plants (`.bashrc`-style hooks, direnv files).
    pub trusted: bool,
    /// The server's own workspace (`vak serve`'s folder): sessions run there.
    pub primary: bool,
}

pub struct Workspaces {
    roots: Vec<PathBuf>,
    /// The primary first, then in the order they were opened.
    open: Mutex<Vec<OpenWorkspace>>,
}

impl Workspaces {
    /// `primary` is the server's workspace; `roots` are where others may be
    /// opened (empty: the primary alone, as for `GET /fs/dirs`). Blocking
    /// (resolves paths): for startup.
    pub fn new(primary: &Path, roots: Vec<PathBuf>) -> Workspaces {
        let path = primary.canonicalize().unwrap_or_else(|_| primary.to_path_buf());
        // Resolved once, at startup: a root that does not exist is left out.
        let roots = if roots.is_empty() {
            vec![path.clone()]
        } else {
            roots.iter().filter_map(|r| r.canonicalize().ok()).collect()
        };
        Workspaces {
            roots,
            open: Mutex::new(vec![OpenWorkspace {
                path,
                trusted: true,
                primary: true,
            }]),
        }
    }

    fn list_lock(&self) -> std::sync::MutexGuard<'_, Vec<OpenWorkspace>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where workspaces may be opened (absolute, resolved).
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Every open workspace, the primary first.
    pub fn list(&self) -> Vec<OpenWorkspace> {
        self.list_lock().clone()
    }

    /// The primary workspace.
    pub fn primary(&self) -> OpenWorkspace {
        self.list_lock()[0].clone()
    }

    /// The open workspace at `path` (as given or resolved), if any. Blocking
    /// (resolves the path): call it off the runtime's workers.
    pub fn find(&self, path: &str) -> Option<OpenWorkspace> {
        let resolved = Path::new(path).canonicalize().ok();
        self.list_lock()
            .iter()
            .find(|w| w.path == Path::new(path) || Some(&w.path) == resolved.as_ref())
            .cloned()
    }

    /// Opens the folder `path` (absolute, inside a root), or answers the one
    /// already open there; `trust` only ever raises an open workspace's trust
    /// (a later untrusted open does not take back what the owner granted).
    /// The bool says whether it was newly opened. Blocking (resolves the
    /// path, outside the lock): call it off the runtime's workers.
    pub fn open(&self, path: &str, trust: bool) -> Result<(OpenWorkspace, bool)> {
        if path.is_empty() {
            return Err(Error::invalid("path is required: the absolute folder to open"));
        }
        let resolved = super::files::resolve_in_roots(&self.roots, path).map_err(|e| {
            if e.reason == Some(super::files::OUTSIDE_ROOTS) {
                Error::forbidden(e.message).with_reason(super::files::OUTSIDE_ROOTS)
            } else {
                e
            }
        })?;
        if !resolved.is_dir() {
            return Err(Error::invalid(format!("{path}: is not a folder")));
        }
        let mut open = self.list_lock();
        if let Some(w) = open.iter_mut().find(|w| w.path == resolved) {
            w.trusted |= trust;
            return Ok((w.clone(), false));
        }
        if open.len() >= MAX_OPEN {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!("{MAX_OPEN} workspaces are open already, the most one server keeps"),
            )
            .with_reason("too_many_workspaces"));
        }
        let w = OpenWorkspace {
            path: resolved,
            trusted: trust,
            primary: false,
        };
        open.push(w.clone());
        Ok((w, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_is_confined_bounded_and_idempotent() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let ws = Workspaces::new(&root, vec![]);
        let outside = tempfile::tempdir().unwrap();
        let e = ws.open(&outside.path().display().to_string(), true).unwrap_err();
        assert_eq!(
            (e.kind, e.reason),
            (ErrorKind::PermissionDenied, Some("outside_workspace_roots"))
        );
        for i in 0..MAX_OPEN - 1 {
            std::fs::create_dir(root.join(format!("d{i}"))).unwrap();
            let (w, new) = ws
                .open(&root.join(format!("d{i}")).display().to_string(), false)
                .unwrap();
            assert!(new && !w.trusted && !w.primary);
        }
        let (w, new) = ws.open(&root.join("d0").display().to_string(), true).unwrap();
        assert!(!new && w.trusted, "a second open raises trust, opens nothing");
        let (w, _) = ws.open(&root.join("d0").display().to_string(), false).unwrap();
        assert!(w.trusted, "and never lowers it");
        std::fs::create_dir(root.join("more")).unwrap();
        let e = ws
            .open(&root.join("more").display().to_string(), false)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::ResourceExhausted);
        assert_eq!(ws.list().len(), MAX_OPEN);
        assert!(ws.list()[0].primary);
    }
}
