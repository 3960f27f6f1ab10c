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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::event::ClientEvent;
    use crate::log::ledger::Ledger;
    use crate::CoreConfig;
    use std::time::Duration;

    use crate::host::registry::tests::hub;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_reads_from_the_last_snapshot_and_equals_the_live_session() {
        let home = tempfile::tempdir().unwrap();
        let small = |c: &mut CoreConfig| c.snapshot_min_bytes = 64 * 1024;
        let h = hub(home.path(), small);
        let s = h.sessions().create().await.unwrap();
        for round in 0..20 {
            let admitted = s
                .admit(format!("round {round}\n/burst 1000"), None)
                .await
                .unwrap();
            assert_ne!(
                admitted.state,
                crate::session::admission::AdmissionState::Duplicate
            );
            // Let the round finish before the next, so each is its own run.
            let mut busy = s.subscribe(Some(admitted.after_seq));
            loop {
                match busy.recv().await {
                    Some(crate::stream::delivery::Delivery::Frame(f))
                        if matches!(f.event, ClientEvent::RunFinished { .. }) =>
                    {
                        break
                    }
                    Some(_) => {}
                    None => panic!("the stream ended"),
                }
            }
        }
        s.flush().await.unwrap();
        let (transcript, timeline, latest) = (s.transcript(), s.timeline(), s.latest_seq());
        let id = s.id().to_string();
        drop(s);
        h.shutdown(Duration::from_secs(5)).await;

        let path = home.path().join("sessions").join(format!("{id}.jsonl"));
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        let snapshots = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("{\"snapshot\":"))
            .count();
        assert!(snapshots >= 2, "{snapshots} snapshots in {lines} lines");
        let mut visited = 0;
        Ledger::open(&path, crate::Durability::Process, |_| visited += 1).unwrap();
        // A load starts at the last snapshot, and the policy keeps what
        // follows it under four times that snapshot's size (plus the batch
        // that made the next one due, at most a round here).
        let text = std::fs::read_to_string(&path).unwrap();
        let all: Vec<&str> = text.lines().collect();
        let last = all.iter().rposition(|l| l.starts_with("{\"snapshot\":")).unwrap();
        assert_eq!(
            visited,
            1 + lines - last,
            "a load parses the header, the last snapshot and what follows it"
        );
        let after: usize = all[last + 1..].iter().map(|l| l.len() + 1).sum();
        assert!(
            after < 4 * all[last].len() + 64 * 1024,
            "{after} bytes after a snapshot of {}",
            all[last].len()
        );

        let h = hub(home.path(), small);
        let again = h.sessions().get(&id).await.unwrap();
        assert_eq!(again.latest_seq(), latest);
        assert_eq!(again.transcript(), transcript);
        assert_eq!(again.timeline(), timeline);
        // Request ids from before the snapshot are still remembered.
        let first = &transcript.messages[0];
        assert_eq!(first.role, crate::log::transcript::Role::User);
        let dup = again
            .admit("again".into(), Some(first_request_id(&again)))
            .await
            .unwrap();
        assert_eq!(dup.state, crate::session::admission::AdmissionState::Duplicate);
        // And the session goes on from there.
        let next = again.admit("after".into(), None).await.unwrap();
        assert_eq!(next.after_seq, latest);
    }

    /// The request id of the session's first run, from its timeline.
    fn first_request_id(s: &Session) -> String {
        s.timeline()
            .items
            .iter()
            .find(|i| !i.request_id.is_empty())
            .map(|i| i.request_id.clone())
            .expect("a user input item carries its request id")
    }

    #[tokio::test]
    async fn an_unusable_ledger_is_set_aside_and_answers_not_found() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |_| {});
        let dir = h.control().config().sessions_dir();
        std::fs::write(dir.join("empty.jsonl"), b"").unwrap();
        std::fs::write(dir.join("garbled.jsonl"), b"{not json\n").unwrap();
        for id in ["empty", "garbled"] {
            let e = h.sessions().get(id).await.map(|_| ()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
            assert!(e.message.contains("set aside"), "{e}");
            assert!(!dir.join(format!("{id}.jsonl")).exists());
            let e = h.sessions().get(id).await.map(|_| ()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::NotFound);
        }
        let aside = std::fs::read_dir(dir.join("corrupt")).unwrap().count();
        assert_eq!(aside, 2, "kept for a person to look at");
    }

    #[tokio::test]
    async fn thinking_signatures_and_usage_survive_a_reload_beside_the_events_they_follow() {
        use crate::event::AgentEvent;
        use crate::provider::{ChatMessage, Thinking, TokenUsage};
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |_| {});
        let s = h.sessions().create().await.unwrap();
        let id = s.id().to_string();
        let usage = TokenUsage {
            input_tokens: 5,
            output_tokens: 3,
            cache_read_tokens: 2,
            cache_write_tokens: 1,
        };
        // One batch as the writer may see it: two signed blocks and their usage.
        for (thinking, sig) in [("a", "sig-a"), ("b", "sig-b")] {
            s.publish(ClientEvent::ThinkingDelta {
                text: thinking.into(),
            });
            s.emit(AgentEvent::ThinkingSignature(sig.into()));
            s.publish(ClientEvent::TextDelta { text: "t".into() });
            s.emit(AgentEvent::Usage(usage));
        }
        s.flush().await.unwrap();
        let live = s.transcript();
        h.shutdown(Duration::from_secs(5)).await;
        drop(s);

        let h = hub(home.path(), |_| {});
        let reloaded = h.sessions().get(&id).await.unwrap().transcript();
        assert_eq!(reloaded, live);
        let signed: Vec<Thinking> = reloaded
            .chat()
            .into_iter()
            .flat_map(|m| match m {
                ChatMessage::Assistant { thinking, .. } => thinking,
                _ => vec![],
            })
            .collect();
        let sigs: Vec<_> = signed
            .iter()
            .map(|t| (t.text.as_str(), t.signature.as_str()))
            .collect();
        assert_eq!(sigs, [("a", "sig-a"), ("b", "sig-b")]);
        assert_eq!(reloaded.usage.cache_read_tokens, 4);
    }
}
