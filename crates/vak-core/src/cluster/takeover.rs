//! Who may take a free lease (`--bus`): the replica that wrote a session last is asked first, over core NATS, whether it still holds it.
//!
//! A lease expires when its holder cannot renew it for a lease age. A
//! NATS election longer than that (the lease bucket's leader died) expires
//! the lease of a holder that is alive and writing through the same NATS,
//! and the next replica to look would take the session over, ending its
//! live run as "interrupted". So before taking a free lease a replica reads
//! who wrote the session's last message (`Vak-Replica`, which every
//! message carries) and asks that replica (`Owners::ask_holder`, a ping
//! naming the session, answered over core NATS, which does not wait for
//! JetStream). While it answers that it holds the session, the lease is
//! left to it (it takes the key again when its renewal finds it gone); a
//! replica that is gone (no responders), answers that it does not hold
//! it, or stays silent through `ASKS` pings is taken over as before.
//!
//! A holder that was taken over anyway (it was silent: partitioned,
//! stopped) cannot hurt the new one: the new holder's first append is a
//! `Record::Lease` note placed at the subject's head whatever landed there
//! (`JetStreamLog::take_over`), so any later append of the old one fails
//! its compare-and-set.

use crate::cluster::jetstream::{JetStreamLog, H_REPLICA, RETRY_FOR, STREAM, SUBJECT_PREFIX};
use crate::cluster::owners::{Owner, Owners};
use crate::error::{Error, ErrorKind, Result};
use crate::log::ledger::{Batch, Log};
use async_nats::jetstream::kv;
use std::time::{Duration, Instant};

/// How many pings a silent last writer gets before its session is taken
/// (each waits up to the ping timeout): a replica whose NATS node died
/// answers again once its client has moved to another node.
const ASKS: usize = 3;

/// How long reading the subject's last message may take.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The replica that holds `session` although its lease is gone (expired
/// during an election), if the lease is free and the session's last writer
/// says it holds it; None when the lease may be taken (or is held: the
/// caller's create then names the holder).
pub(crate) async fn held_without_lease(
    owners: &Owners,
    kv: &kv::Store,
    session: &str,
) -> Result<Option<Owner>> {
    let entry = kv.entry(session).await.map_err(|e| {
        Error::new(
            ErrorKind::Unavailable,
            format!("cannot read the lease of {session}: {e}"),
        )
    })?;
    if entry.is_some_and(|e| e.operation == kv::Operation::Put) {
        return Ok(None);
    }
    let Some(last) = last_writer(owners.client(), session).await else {
        return Ok(None);
    };
    if last == owners.replica() {
        return Ok(None);
    }
    for _ in 0..ASKS {
        match owners.ask_holder(&last, session).await {
            Some(h) if h.holds => {
                tracing::info!(session, holder = %last, "the lease is free but its last writer still holds the session (its renewal stalled): left to it");
                return Ok(Some(Owner {
                    replica: last,
                    url: h.url,
                }));
            }
            Some(_) => return Ok(None),
            None => {}
        }
    }
    tracing::info!(session, writer = %last, "the session's last writer does not answer: its free lease is taken");
    Ok(None)
}

/// The replica named on `session`'s last message (None: no message, none
/// named, or the stream cannot be read now).
async fn last_writer(client: &async_nats::Client, session: &str) -> Option<String> {
    let ask = client.request(
        format!("$JS.API.DIRECT.GET.{STREAM}.{SUBJECT_PREFIX}{session}"),
        bytes::Bytes::new(),
    );
    let msg = tokio::time::timeout(READ_TIMEOUT, ask).await.ok()?.ok()?;
    if msg.status.is_some_and(|s| s != async_nats::StatusCode::OK) {
        return None;
    }
    let replica = msg.headers.as_ref()?.get(H_REPLICA)?.as_str().to_string();
    Some(replica)
}

impl JetStreamLog {
    /// Appends `batch`, the first records of a replica that just took the
    /// session's lease, at the subject's head whatever is there: a stale
    /// holder's append that landed after this log was opened (retried
    /// across the takeover) is read past and appended after, never fenced
    /// on. Once it is stored, every append of a writer that has not seen it
    /// fails the CAS: the old holder is fenced, the new one never is. An
    /// empty subject (no session, or a deleted one) gets nothing. Blocking,
    /// like `append`.
    pub fn take_over(&self, batch: &Batch) -> std::io::Result<()> {
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            if self.subject_empty() {
                return Ok(());
            }
            match self.append(batch) {
                Ok(()) => return Ok(()),
                Err(e) if self.fenced() && Instant::now() < deadline => {
                    tracing::info!(session = %self.session(), "a stale writer appended while this replica took the session over: appending after it ({e})");
                    self.reread_head().map_err(|e| std::io::Error::other(e.message))?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
