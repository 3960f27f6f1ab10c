//! What changes a persisted session as a whole: delete (to the trash, or purged from the stream), rename, fork (a new session from another's history); the blocking file work is `session/lifecycle.rs`'s.

use super::{served_elsewhere, Located, Registry};
use crate::cluster::jetstream::JetStreamLog;
use crate::error::{Error, Result};
use crate::log::ledger::{storage_error, Batch, Log, Record};
use crate::reasons::CloseReason;
use crate::session::lifecycle;
use crate::session::live::{Session, SessionInfo};
use std::sync::Arc;
use std::time::SystemTime;

impl Registry {
    /// Deletes session `id`: refused (conflict) while a run is live; its
    /// streams end with session_closed {reason: "deleted"}, its ledger moves
    /// to the home's trash, it leaves the listing, and the id is not found
    /// from then on.
    pub async fn delete(&self, id: &str) -> Result<()> {
        if let Some(client) = self.rt.cfg.nats.clone() {
            return self.delete_shared(id, &client).await;
        }
        let s = self.get(id).await?;
        s.begin_delete()?;
        // No dev server outlives its session; its children go with it.
        self.launches.stop_session(id).await;
        if let Some(hook) = self.delete_hook() {
            hook.deleting(id).await;
        }
        s.close_streams(CloseReason::Deleted).await;
        let (home, dir, sid) = (
            self.rt.cfg.home.clone(),
            self.rt.cfg.sessions_dir(),
            id.to_string(),
        );
        let moved = tokio::task::spawn_blocking(move || lifecycle::move_to_trash(&home, &dir, &sid))
            .await
            .map_err(|e| Error::internal(e.to_string()))?;
        // Dropped from the map only after the move: until then a concurrent
        // use finds the deleted session (which refuses input), never a
        // reload of the ledger. Also after a failed move, so the next use
        // loads the session again as it is on disk.
        {
            let mut map = self.loaded();
            if map
                .get(id)
                .is_some_and(|c| c.get().is_some_and(|live| Arc::ptr_eq(live, &s)))
            {
                map.remove(id);
            }
        }
        let to = moved?;
        self.index.remove(id);
        self.rt.search().delete(id);
        self.rt.portfolio().remove(id);
        self.save_index().await;
        tracing::info!(session = id, trash = %to.display(), "session deleted");
        Ok(())
    }

    /// `delete` with `--bus`, on the replica holding the session (a delete
    /// sent elsewhere is forwarded here): its subject is purged from the
    /// stream (there is no trash), its summary leaves the shared index, and
    /// then its lease is given back, so until the purge is done nobody else
    /// loads it, and after it a load finds no session (404). Other
    /// replicas' mirrors find the subject empty and close their streams
    /// with `deleted` too (`mirror.rs`).
    async fn delete_shared(&self, id: &str, client: &async_nats::Client) -> Result<()> {
        let s = match self.find(id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => return Err(served_elsewhere(id, &owner)),
        };
        s.begin_delete()?;
        self.launches.stop_session(id).await;
        if let Some(hook) = self.delete_hook() {
            hook.deleting(id).await;
        }
        s.close_streams(CloseReason::Deleted).await;
        let purged = crate::cluster::jetstream::purge_session(client, id).await;
        if purged.is_ok() {
            if let Some(shared) = &self.rt.cfg.shared_index {
                if let Err(e) = shared.remove(id).await {
                    tracing::warn!(session = id, "{}", e.message);
                }
            }
        }
        // Dropped from the map (as after a failed move to the trash, the
        // next use loads what the stream still holds).
        let cell = self.loaded().get(id).cloned();
        if let Some(cell) = cell {
            self.forget(id, &cell);
        }
        if let Some(owners) = &self.rt.cfg.owners {
            owners.release(id).await;
        }
        purged?;
        self.index.remove(id);
        self.rt.search().delete(id);
        self.rt.portfolio().remove(id);
        self.save_index().await;
        tracing::info!(
            session = id,
            "session deleted: its subject purged from the stream"
        );
        Ok(())
    }

    /// Gives session `id` a title of the client's choosing (kept in
    /// `sessions/<id>.title`, so it survives restarts and index rebuilds).
    pub async fn rename(&self, id: &str, title: &str) -> Result<SessionInfo> {
        let title = lifecycle::validate_title(title)?;
        // Only the holder renames (a forwarded rename reaches it): a title
        // kept by a replica that does not write the session would diverge.
        let s = match self.find(id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => return Err(served_elsewhere(id, &owner)),
        };
        let (dir, sid, t) = (self.rt.cfg.sessions_dir(), id.to_string(), title.clone());
        tokio::task::spawn_blocking(move || lifecycle::write_title(&dir, &sid, &t))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        s.set_title(Some(title));
        self.note_shared(&s).await;
        self.save_index().await;
        Ok(s.info())
    }

    /// A new session whose history is `id`'s up to `at_seq` (absent: its
    /// latest, refused while a run is live): the same events under the same
    /// seqs, then its own from at_seq + 1. Returns it and the seq it was cut at.
    pub async fn fork(&self, id: &str, at_seq: Option<u64>) -> Result<(Arc<Session>, u64)> {
        self.refuse_when_stopping()?;
        if let Some(client) = self.rt.cfg.nats.clone() {
            return self.fork_shared(id, at_seq, &client).await;
        }
        let parent = self.get(id).await?;
        let at = fork_point(&parent, id, at_seq)?;
        // Everything up to `at` is in the ledger file before it is copied.
        parent.flush().await?;
        let child = uuid::Uuid::new_v4().simple().to_string();
        let created_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let (from, to, cid) = (self.ledger_path(id), self.ledger_path(&child), child.clone());
        // The fork keeps its parent's workspace.
        let ws = parent.workspace().to_string();
        tokio::task::spawn_blocking(move || lifecycle::fork_ledger(&from, &to, &cid, &created_at, &ws, at))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        let forked = self.get(&child).await?;
        // The parent's messages the fork copied are its hits too.
        self.rt.search().catch_up(&child);
        self.save_index().await;
        tracing::info!(session = %child, parent = id, at_seq = at, "session forked");
        Ok((forked, at))
    }

    /// `fork` with `--bus`, on any replica (a fork only reads its parent):
    /// the parent's records up to `at` as the stream holds them (what a
    /// file fork copies: events and the notes after them, not admissions or
    /// snapshots) are appended under a new header to a new subject, which
    /// this replica then loads, taking its lease.
    async fn fork_shared(
        &self,
        id: &str,
        at_seq: Option<u64>,
        client: &async_nats::Client,
    ) -> Result<(Arc<Session>, u64)> {
        let parent = match self.find(id).await? {
            Located::Local(s) => {
                // Everything up to `at` is in the stream before it is read.
                s.flush().await?;
                s
            }
            // A mirror shows only what the stream stored.
            Located::Remote(owner) => self.mirror(id, &owner).await?,
        };
        let at = fork_point(&parent, id, at_seq)?;
        let records = JetStreamLog::open(client.clone(), id).await?.records().await?;
        let child = uuid::Uuid::new_v4().simple().to_string();
        let mut batch = Batch::default();
        batch.push(&Record::Header {
            session_id: child.clone(),
            created_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            workspace: parent.workspace().to_string(),
        });
        for r in &records {
            match r {
                Record::Event { seq, .. } if *seq > at => break,
                Record::Event { .. }
                | Record::Usage(_)
                | Record::Signature { .. }
                | Record::Compaction(_)
                | Record::Undo(_)
                | Record::Lost { .. } => batch.push(r),
                Record::Header { .. }
                | Record::Admitted { .. }
                | Record::Snapshot(_)
                | Record::Lease { .. }
                // Receipts stay the parent's: its calls, not the fork's.
                | Record::Receipt(_)
                // Undelivered results stay the parent's to deliver.
                | Record::Background(_) => {}
            }
        }
        // Nobody knows the new id yet: no lease is needed to write it, and
        // the first use below takes it.
        let log = Arc::new(JetStreamLog::open(client.clone(), &child).await?);
        tokio::task::spawn_blocking(move || log.append(&batch))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
            .map_err(|e| storage_error(&e))?;
        let forked = self.get(&child).await?;
        self.save_index().await;
        tracing::info!(session = %child, parent = id, at_seq = at, "session forked into a new subject");
        Ok((forked, at))
    }
}

/// Where a fork of `parent` is cut: `at_seq` (at most its latest seq), or
/// its latest, refused while a run is live.
fn fork_point(parent: &Session, id: &str, at_seq: Option<u64>) -> Result<u64> {
    let latest = parent.latest_seq();
    match at_seq {
        Some(at) if at > latest => Err(Error::invalid(format!(
            "at_seq {at} is past the session's latest seq {latest}"
        ))),
        Some(at) => Ok(at),
        None if parent.is_busy() => Err(Error::conflict(format!(
            "session {id} has a live run; give at_seq or wait for run_finished"
        ))),
        None => Ok(latest),
    }
}
