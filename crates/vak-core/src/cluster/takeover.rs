//! The log side of a takeover (`--bus`): who wrote a session last (asked before a free lease is taken, `owners.rs`), and the new holder's first append, which fences a stale one.
//!
//! Every message carries the replica that wrote it (`Vak-Replica`):
//! `last_writer` reads it off the subject's last message, so that
//! `Owners::claim_checked` can ask that replica whether it still holds the
//! session before taking its expired lease (an election longer than the
//! lease).
//!
//! A holder that was taken over anyway (it was silent: partitioned,
//! stopped) cannot hurt the new one: the new holder's first append is a
//! `Record::Lease` note placed at the subject's head whatever landed there
//! (`JetStreamLog::take_over`), so any later append of the old one fails
//! its compare-and-set.

use crate::cluster::jetstream::{JetStreamLog, H_REPLICA, RETRY_FOR, STREAM, SUBJECT_PREFIX};
use crate::log::ledger::{Batch, Log};
use std::time::{Duration, Instant};

/// How long reading the subject's last message may take.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The replica named on `session`'s last message (None: no message, none
/// named, or the stream cannot be read now).
pub(crate) async fn last_writer(client: &async_nats::Client, session: &str) -> Option<String> {
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
