//! Bringing a ledger from outside (a backup's) in as a session: placed by rename and loaded inside the session's own load cell, so no concurrent use ever loads a half-placed or replaced ledger.

use super::{Cell, LoadError, Registry};
use crate::error::{Error, Result};
use crate::ids::validate_session_id;
use std::path::PathBuf;

impl Registry {
    /// Places the ledger at `ledger` (and the chosen title at `title`) as
    /// session `id` and loads it, which lists it. Without `replace`, an id
    /// this home already has is left alone (false). With `replace`, a
    /// session loaded in memory is refused (conflict, `session_live`);
    /// one only on disk is replaced whole. Concurrent uses of `id` wait for
    /// the load this starts and see the placed session.
    pub(crate) async fn adopt(
        &self,
        id: &str,
        ledger: PathBuf,
        title: Option<PathBuf>,
        replace: bool,
    ) -> Result<bool> {
        self.refuse_when_stopping()?;
        validate_session_id(id)?;
        let path = self.ledger_path(id);
        let on_disk = tokio::task::spawn_blocking(move || std::fs::symlink_metadata(path).is_ok())
            .await
            .map_err(|e| Error::internal(e.to_string()))?;
        let cell: Cell = {
            let mut map = self.loaded();
            if map.contains_key(id) {
                if replace {
                    return Err(Error::conflict(format!(
                        "session {id} is loaded on this server: an import overwrites only sessions that are not loaded"
                    ))
                    .with_reason("session_live"));
                }
                return Ok(false);
            }
            if !replace && (on_disk || self.index.get(id).is_some()) {
                return Ok(false);
            }
            let cell = Cell::default();
            map.insert(id.to_string(), cell.clone());
            cell
        };
        let dir = self.rt.cfg.sessions_dir();
        let loaded = cell
            .get_or_try_init(|| async {
                let sid = id.to_string();
                tokio::task::spawn_blocking(move || {
                    crate::host::backup::place(&dir, &sid, &ledger, title.as_deref())
                        .map_err(|e| Error::internal(format!("cannot place the ledger of {sid}: {e}")))
                })
                .await
                .map_err(|e| Error::internal(e.to_string()))??;
                // The old entry's seq is not this ledger's: a load that
                // trusted it would mark seqs past the import's end as lost.
                if replace {
                    self.index.remove(id);
                }
                self.load(id).await
            })
            .await
            .cloned();
        match loaded {
            Ok(s) => {
                // A replaced session's hits go; the placed one's are read.
                if replace {
                    self.rt.search().delete(id);
                    // Its listed commitments are the placed one's (none: none listed).
                    self.rt.portfolio().put(id, s.workspace(), s.commitments());
                }
                self.rt.search().catch_up(id);
                Ok(true)
            }
            Err(LoadError::Failed(e)) => {
                self.forget(id, &cell);
                Err(e)
            }
            Err(LoadError::Elsewhere(o)) => {
                self.forget(id, &cell);
                Err(Error::internal(format!(
                    "session {id} is leased to {}",
                    o.replica
                )))
            }
        }
    }
}
