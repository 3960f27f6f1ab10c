//! A read-only copy of a session another replica writes (`--bus`), kept in step from the live path, so its streams and reads are served on any replica.
//!
//! Opening one subscribes `vak.live.<session>` (the stream's RePublish of
//! what it stored) **before** reading the subject, so nothing stored after
//! the read is missed; then folds the subject like a load (`Session::mirror`:
//! no writer, nothing settled). From then on each live message is applied
//! when its position (`Vak-Seq`, or `Vak-Note` n.k) comes right after the
//! last one applied; one at or before it is a duplicate (already read) and
//! is skipped; one further on means messages were missed (a reconnect, a
//! slow consumer), and the gap is filled by reading the subject after the
//! last applied stream sequence with direct gets, never skipped. A record
//! stored in parts (`Vak-Part`) is applied when its last part arrived and
//! the whole matched its digest; a part missing or out of place is a gap. A
//! pack (`Vak-First`) is applied whole when its first record comes right
//! after the last one applied, and skipped when its last one was. A quiet
//! tick reads the subject's head, so a lost last message is found too.
//! Frames come only from what the stream stored, never from the raw
//! subject, so a frame a writer was refused (fenced) is never shown.
//!
//! The mirror's bus numbers nothing: it commits the seqs the log holds, so
//! a cursor means the same on every replica.

use crate::cluster::jetstream::{JetStreamLog, Live, LiveRecords, Position, Stored, LIVE_PREFIX};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{Frame, Note};
use crate::log::ledger::Record;
use crate::log::writer::Visible;
use crate::reasons::CloseReason;
use crate::session::live::Session;
use crate::session::runtime::Runtime;
use crate::stopped::Stopped;
use futures_util::{FutureExt, StreamExt};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often a quiet mirror reads the subject's head.
const TICK: Duration = Duration::from_secs(1);
/// Records applied in one commit at most, give or take one message's (a
/// pack holds up to a message's room of them).
const APPLY_MAX: usize = 1024;

/// Opens the mirror of session `id`; `read_only` is what its writes are refused with.
pub(crate) async fn open(
    rt: Arc<Runtime>,
    client: async_nats::Client,
    id: &str,
    read_only: String,
) -> Result<Arc<Session>> {
    let unavailable = |e: async_nats::SubscribeError| {
        Error::new(ErrorKind::Unavailable, format!("cannot follow session {id}: {e}"))
    };
    let live = client
        .subscribe(format!("{LIVE_PREFIX}{id}"))
        .await
        .map_err(unavailable)?;
    let log = Arc::new(JetStreamLog::open(client, id).await?);
    let stored = log.stored_after(0).await?;
    let Some(last) = stored.last() else {
        return Err(Error::not_found(format!("no session {id}")));
    };
    let (last, pos) = (last.stream_seq, last.position);
    let mut records = stored.into_iter().map(|s| s.record).collect();
    crate::cluster::shared_index::restore_header(rt.cfg.shared_index.as_deref(), id, &mut records).await;
    let l = log.clone();
    let session = tokio::task::spawn_blocking(move || Session::mirror(rt, l, records, &read_only))
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
    tracing::info!(session = %id, latest_seq = session.latest_seq(), "following a session another replica writes");
    tokio::spawn(follow(Arc::downgrade(&session), log, live, last, pos));
    Ok(session)
}

/// Applies what the stream stores to the mirror until it is dropped.
async fn follow(
    mirror: Weak<Session>,
    log: Arc<JetStreamLog>,
    mut live: async_nats::Subscriber,
    mut last: u64,
    mut pos: Position,
) {
    let mut tick = tokio::time::interval(TICK);
    // A record stored in parts is applied once its last part arrived.
    let mut records = LiveRecords::default();
    loop {
        let got = tokio::select! {
            m = live.next() => Some(m),
            _ = tick.tick() => None,
        };
        let Some(s) = mirror.upgrade() else { return };
        let gap = match got {
            Some(None) => {
                s.stop_writing(&Stopped::LiveEnded);
                return;
            }
            Some(Some(msg)) => {
                // Everything the live path already holds goes in one commit:
                // one hand-off per subscriber for the lot, so a mirror that
                // fell behind catches up instead of paying per event.
                let mut ready = Vec::new();
                let mut gap = false;
                let mut next = Some(msg);
                while let Some(msg) = next.take() {
                    match records.next(&msg, pos) {
                        Live::Wait => {}
                        Live::Records(records) => {
                            if let Some(m) = records.last() {
                                (last, pos) = (m.stream_seq, m.position);
                            }
                            ready.extend(records);
                        }
                        Live::Gap => {
                            gap = true;
                            break;
                        }
                    }
                    if ready.len() < APPLY_MAX {
                        // An ended subscription is seen by the next `live.next()`.
                        next = live.next().now_or_never().flatten();
                    }
                }
                apply(&s, ready);
                gap
            }
            None => match log.head().await {
                // A subject only empties when its session is deleted (the
                // holder purged it): this copy closes as the holder's did.
                Ok(0) if log.purged().await.unwrap_or(false) => {
                    tracing::info!(session = %s.id(), "the session was deleted on the replica that wrote it");
                    s.close_streams(CloseReason::Deleted).await;
                    s.stop_writing(&Stopped::Deleted);
                    return;
                }
                Ok(head) => head > last,
                Err(e) => {
                    tracing::debug!(session = %s.id(), "reading the head again later: {e}");
                    false
                }
            },
        };
        if gap {
            // What the live path began of a record is read whole from the subject.
            records.reset();
            match log.stored_after(last).await {
                Ok(stored) => {
                    let missed: Vec<Stored> = stored.into_iter().filter(|m| m.position > pos).collect();
                    if !missed.is_empty() {
                        tracing::info!(session = %s.id(), messages = missed.len(), "the live path missed messages: read them from the stream");
                    }
                    if let Some(m) = missed.last() {
                        (last, pos) = (m.stream_seq, m.position);
                    }
                    apply(&s, missed);
                }
                Err(e) => tracing::warn!(session = %s.id(), "filling a gap in the live path later: {e}"),
            }
        }
    }
}

/// Folds and fans out stored messages, as the writer commits a batch.
fn apply(s: &Session, msgs: Vec<Stored>) {
    if msgs.is_empty() {
        return;
    }
    let sid: Arc<str> = Arc::from(s.id());
    let mut latest = s.latest_seq();
    let (mut frames, mut notes, mut admitted) = (Vec::new(), Vec::new(), Vec::new());
    for m in msgs {
        match m.record {
            Record::Event { seq, event } => {
                latest = seq;
                frames.push(Arc::new(Frame::new(seq, sid.clone(), event)));
            }
            Record::Usage(u) => notes.push((latest, Note::Usage(u))),
            Record::Signature { signature } => notes.push((latest, Note::Signature(signature))),
            Record::Compaction(c) => notes.push((latest, Note::Compaction(c))),
            Record::Undo(u) => notes.push((latest, Note::Undo(u))),
            Record::Background(p) => notes.push((latest, Note::Background(p))),
            Record::Admitted { request_id } => admitted.push(request_id),
            // A mirror shows what clients see; receipts are read from the log.
            Record::Header { .. }
            | Record::Snapshot(_)
            | Record::Lost { .. }
            | Record::Lease { .. }
            | Record::Receipt(_) => {}
        }
    }
    Visible::commit(s, frames, notes, admitted);
}
