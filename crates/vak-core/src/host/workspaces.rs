//! The workspaces a server has open: its own (`vak serve`'s folder, trusted) and the folders clients opened under `[server] workspace_roots`, bounded.
//!
//! An opened workspace is re-resolved at every use (`recheck`): when it is
//! found, when a session is created in it, when a session's runtime is
//! built or fetched, and before each leg, tool call, file read or write and
//! diff of a session there (`Runtime::check_workspace`). Its path must
//! still resolve to itself (no symlink swapped in anywhere along it), lie
//! under the roots, and be the same folder (device and inode) as the one
//! opened; otherwise the use is refused (PermissionDenied,
//! `workspace_replaced`), so a folder swapped for a symlink to the outside
//! never lets a session read or write there. The server's own workspace is
//! the one `vak serve` was started in and is not re-checked.

use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Open workspaces at most (the server's own included): each is a folder a
/// client may start a terminal in, so the list is kept short and refusals
/// past it say so.
pub const MAX_OPEN: usize = 32;

/// Which folder a path named: its device and inode, so a folder replaced at
/// the same path is told from the one that was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirId {
    dev: u64,
    ino: u64,
}

impl DirId {
    fn of(meta: &std::fs::Metadata) -> DirId {
        use std::os::unix::fs::MetadataExt;
        DirId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// The `reason` of a use of a workspace refused because its folder was
/// replaced (by a symlink or another folder) or moved since it was opened.
pub const REPLACED: &str = "workspace_replaced";

/// Re-resolves the open workspace `path` (canonical when it was opened):
/// it must still resolve to itself, lie under `roots` and, when `id` is
/// given, be that folder. Answers the folder's id. Blocking.
pub(crate) fn recheck(path: &Path, roots: &[PathBuf], id: Option<DirId>) -> Result<DirId> {
    let refused = |why: String| {
        Error::forbidden(format!(
            "the workspace {} {why}: vak uses it no more (open the folder again if it is the one you meant)",
            path.display()
        ))
        .with_reason(REPLACED)
    };
    let resolved = match path.canonicalize() {
        Ok(r) => r,
        Err(e) => return Err(refused(format!("cannot be resolved any more ({e})"))),
    };
    if resolved != path {
        return Err(refused(format!(
            "now leads to {} (a symlink was put in its place or on its path)",
            resolved.display()
        )));
    }
    if !roots.iter().any(|r| resolved.starts_with(r)) {
        return Err(refused("is no longer under the workspace roots".into()));
    }
    let meta = std::fs::metadata(&resolved).map_err(|e| refused(format!("cannot be read ({e})")))?;
    if !meta.is_dir() {
        return Err(refused("is no longer a folder".into()));
    }
    let now = DirId::of(&meta);
    match id {
        Some(id) if id != now => Err(refused(
            "is another folder than the one opened (it was replaced or moved)".into(),
        )),
        _ => Ok(now),
    }
}

/// An opened workspace's folder as a session's runtime holds it, so every
/// use can re-check it (`recheck`).
#[derive(Clone, Debug)]
pub(crate) struct Pinned {
    pub(crate) path: PathBuf,
    pub(crate) roots: Vec<PathBuf>,
    /// None when the folder did not pass the check when the runtime was
    /// built (a session reloaded from its ledger): every use is checked
    /// against the path and the roots only, and refused while they fail.
    pub(crate) id: Option<DirId>,
}

impl Pinned {
    /// Blocking.
    pub(crate) fn check(&self) -> Result<()> {
        recheck(&self.path, &self.roots, self.id).map(drop)
    }
}

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
    /// The folder that was opened (None for the primary, never re-checked).
    pub(crate) id: Option<DirId>,
}

pub struct Workspaces {
    roots: Vec<PathBuf>,
    /// `roots` and the home's `worktrees/` (children's worktrees): where a
    /// session's runtime may be pinned, never where a client opens.
    pin_roots: Vec<PathBuf>,
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
            pin_roots: roots.clone(),
            roots,
            open: Mutex::new(vec![OpenWorkspace {
                path,
                trusted: true,
                primary: true,
                id: None,
            }]),
        }
    }

    /// Lets sessions' runtimes be pinned under `dir` too (the home's
    /// `worktrees/`, where isolated children run); clients still open
    /// folders under the roots only. Blocking (resolves `dir`): startup.
    pub(crate) fn with_worktrees(mut self, dir: &Path) -> Workspaces {
        if let Ok(dir) = dir.canonicalize() {
            self.pin_roots.push(dir);
        }
        self
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

    /// The open workspace at `path` (as given or resolved), if any, re-checked
    /// (`recheck`): one whose folder was replaced since it was opened is
    /// refused (PermissionDenied, `workspace_replaced`). Blocking (resolves
    /// the path): call it off the runtime's workers.
    pub fn find(&self, path: &str) -> Result<Option<OpenWorkspace>> {
        let resolved = Path::new(path).canonicalize().ok();
        let found = self
            .list_lock()
            .iter()
            .find(|w| w.path == Path::new(path) || Some(&w.path) == resolved.as_ref())
            .cloned();
        match found {
            Some(w) if !w.primary => {
                recheck(&w.path, &self.roots, w.id)?;
                Ok(Some(w))
            }
            other => Ok(other),
        }
    }

    /// How a runtime for the open workspace `path` (canonical) holds it:
    /// re-checked now, against the folder that was opened when it is open.
    /// Blocking.
    pub(crate) fn pin(&self, path: &Path) -> Result<Pinned> {
        let opened = self
            .list_lock()
            .iter()
            .find(|w| w.path == path)
            .and_then(|w| w.id);
        let id = recheck(path, &self.pin_roots, opened)?;
        Ok(Pinned {
            path: path.to_path_buf(),
            roots: self.pin_roots.clone(),
            id: Some(id),
        })
    }

    /// `pin` for a session reloaded from its ledger, whose workspace may
    /// not be open now: a folder that fails the check is still pinned
    /// (without an id), so the session loads and each use is refused.
    pub(crate) fn pin_reloaded(&self, path: &Path) -> Pinned {
        self.pin(path).unwrap_or_else(|e| {
            tracing::warn!(workspace = %path.display(), "a reloaded session's workspace: {}", e.message);
            Pinned {
                path: path.to_path_buf(),
                roots: self.pin_roots.clone(),
                id: None,
            }
        })
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
        let resolved = crate::host::files::resolve_in_roots(&self.roots, path).map_err(|e| {
            if e.reason == Some(crate::host::files::OUTSIDE_ROOTS) {
                Error::forbidden(e.message).with_reason(crate::host::files::OUTSIDE_ROOTS)
            } else {
                e
            }
        })?;
        let id = match std::fs::metadata(&resolved) {
            Ok(m) if m.is_dir() => DirId::of(&m),
            _ => return Err(Error::invalid(format!("{path}: is not a folder"))),
        };
        let mut open = self.list_lock();
        if let Some(w) = open.iter_mut().find(|w| w.path == resolved) {
            w.trusted |= trust;
            // Opening again is the owner's word that the folder there now
            // (it passed the roots check above) is the one meant.
            if !w.primary {
                w.id = Some(id);
            }
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
            id: Some(id),
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

    #[test]
    fn a_workspace_swapped_for_a_symlink_or_another_folder_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.join("main")).unwrap();
        std::fs::create_dir_all(root.join("w")).unwrap();
        let ws = Workspaces::new(&root.join("main"), vec![root.clone()]);
        let path = root.join("w").display().to_string();
        ws.open(&path, true).unwrap();
        assert!(ws.find(&path).unwrap().is_some());
        assert!(ws.pin(&root.join("w")).is_ok());
        assert!(ws
            .find(&root.join("nope").display().to_string())
            .unwrap()
            .is_none());

        std::fs::rename(root.join("w"), root.join("was")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("w")).unwrap();
        let e = ws.find(&path).unwrap_err();
        assert_eq!((e.kind, e.reason), (ErrorKind::PermissionDenied, Some(REPLACED)));
        assert!(e.message.contains("now leads to"), "{e}");
        assert_eq!(ws.pin(&root.join("w")).unwrap_err().reason, Some(REPLACED));
        // A reloaded session's runtime still gets a pin, which refuses each use.
        assert!(ws.pin_reloaded(&root.join("w")).check().is_err());

        // A symlink to a folder inside the roots is no better: not the one opened.
        std::fs::remove_file(root.join("w")).unwrap();
        std::os::unix::fs::symlink(root.join("was"), root.join("w")).unwrap();
        assert_eq!(ws.find(&path).unwrap_err().reason, Some(REPLACED));
        // Nor is another folder at the same path, until it is opened again.
        std::fs::remove_file(root.join("w")).unwrap();
        std::fs::create_dir(root.join("w")).unwrap();
        let e = ws.find(&path).unwrap_err();
        assert!(e.message.contains("another folder"), "{e}");
        ws.open(&path, false).unwrap();
        assert!(ws.find(&path).unwrap().is_some());
        // The primary is the server's own and is not re-checked.
        assert!(
            ws.find(&root.join("main").display().to_string())
                .unwrap()
                .unwrap()
                .primary
        );
    }
}
