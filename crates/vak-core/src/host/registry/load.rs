//! Loading a persisted session into the registry: from its JSONL ledger (checked, repaired or set aside), or with `--bus` from its JetStream subject under its lease.

use super::{report_stop, watch_lease, LoadError, Registry};
use crate::cluster::jetstream::JetStreamLog;
use crate::cluster::owners::Claim;
use crate::error::{Error, ErrorKind};
use crate::log::ledger::{storage_error, Batch, Log, OpenError, Record};
use crate::log::repair::{self, Remembered, Unrepairable};
use crate::session::lifecycle;
use crate::session::live::Session;
use std::sync::Arc;
use std::time::SystemTime;

impl Registry {
    /// Session `id` from where it is persisted; called once per load, from
    /// the cell every concurrent first use shares.
    pub(super) async fn load(&self, id: &str) -> std::result::Result<Arc<Session>, LoadError> {
        if let Some(client) = &self.rt.cfg.nats {
            // Written here only under the lease: a session whose holder is
            // alive is served there (a dead holder's lease is waited out).
            let lease = match &self.rt.cfg.owners {
                Some(owners) => match owners.claim_or_wait(id).await? {
                    Claim::Mine(lost) => Some((owners, lost)),
                    Claim::Theirs(owner) => return Err(LoadError::Elsewhere(owner)),
                },
                None => None,
            };
            let loaded = async {
                let log = Arc::new(JetStreamLog::open(client.clone(), id).await?);
                if let Some(owners) = &self.rt.cfg.owners {
                    // The first append under the lease: a stale holder's
                    // append that lands later is fenced, never this one.
                    log.write_as(owners.replica());
                    let mut note = Batch::default();
                    note.push(&Record::Lease {
                        replica: owners.replica().to_string(),
                        revision: owners.revision(id).unwrap_or(0),
                    });
                    let l = log.clone();
                    tokio::task::spawn_blocking(move || l.take_over(&note))
                        .await
                        .map_err(|e| Error::internal(e.to_string()))?
                        .map_err(|e| storage_error(&e))?;
                }
                let mut records = log.records().await?;
                if records.is_empty() {
                    return Err(Error::not_found(format!("no session {id}")));
                }
                crate::cluster::shared_index::restore_header(
                    self.rt.cfg.shared_index.as_deref(),
                    id,
                    &mut records,
                )
                .await;
                let rt = self.rt.clone();
                let l: Arc<dyn Log> = log.clone();
                let session = tokio::task::spawn_blocking(move || Session::restore_records(rt, l, records))
                    .await
                    .map_err(|e| Error::internal(e.to_string()))??;
                Ok::<_, Error>((session, log))
            }
            .await;
            let loaded = match (loaded, lease) {
                (Ok((s, log)), Some((_, lost))) => {
                    watch_lease(&s, lost, Some(log));
                    s
                }
                (Ok((s, _)), None) => s,
                (Err(e), lease) => {
                    if let Some((owners, _)) = lease {
                        owners.release(id).await;
                    }
                    return Err(e.into());
                }
            };
            tracing::info!(session = %id, latest_seq = loaded.latest_seq(), "session loaded from JetStream");
            report_stop(&loaded, self.stopped.clone());
            self.note_shared(&loaded).await;
            return Ok(loaded);
        }
        let path = self.ledger_path(id);
        let rt = self.rt.clone();
        let runtimes = self.runtimes.clone();
        let sid = id.to_string();
        let dir = self.rt.cfg.sessions_dir();
        let known = self.index.get(id);
        let loaded = tokio::task::spawn_blocking(move || {
            let remembered = known.as_ref().map(|e| Remembered {
                created_at: e.created_at.clone(),
                workspace: e.workspace.clone(),
            });
            match repair::check_header(&path, &sid, remembered.as_ref()) {
                Ok(_) => {}
                Err(Unrepairable::Io(_)) if !path.exists() => {
                    return Err(Error::not_found(format!("no session {sid}")));
                }
                Err(Unrepairable::Io(e)) => return Err(e),
                Err(Unrepairable::Damaged(why)) => return Err(set_aside(&path, &sid, &why)),
            }
            let recorded = known.map_or(0, |e| e.latest_seq);
            let pick = move |ws: &str| runtimes.reloaded(ws);
            let session = match Session::restore_in(rt, &path, recorded, pick) {
                Ok(session) => session,
                Err(OpenError::Io(_)) if !path.exists() => {
                    return Err(Error::not_found(format!("no session {sid}")));
                }
                Err(OpenError::Io(e)) => return Err(e),
                Err(OpenError::Corrupt(why)) => return Err(set_aside(&path, &sid, &why)),
            };
            session.set_title(lifecycle::read_title(&dir, &sid));
            tracing::info!(
                session = %sid,
                latest_seq = session.latest_seq(),
                "session loaded from its ledger"
            );
            Ok(session)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        report_stop(&loaded, self.stopped.clone());
        self.note(&loaded);
        Ok(loaded)
    }
}

/// Moves an unusable ledger out of the way (`sessions/corrupt/`), so the id
/// answers 404 from now on instead of failing on every request.
fn set_aside(path: &std::path::Path, id: &str, why: &str) -> Error {
    let dir = path.with_file_name("corrupt");
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let to = dir.join(format!("{id}.{stamp}.jsonl"));
    let moved = crate::home::create_private_dir(&dir).and_then(|()| std::fs::rename(path, &to));
    match moved {
        Ok(()) => {
            tracing::error!(session = id, moved_to = %to.display(), "{why}: the ledger was set aside");
            Error::not_found(format!(
                "no session {id}: its ledger was unusable ({why}) and was set aside"
            ))
        }
        Err(e) => {
            tracing::error!(session = id, "{why}; setting it aside failed: {e}");
            Error::new(
                ErrorKind::Unavailable,
                format!("session {id}: unusable ledger ({why})"),
            )
        }
    }
}
