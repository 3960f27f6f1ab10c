//! The session index every replica shares (`--bus`): the KV bucket `VAK_SESSIONS`, one key per session holding its summary, written by the replica that writes the session and read whole by `GET /sessions` on any replica.
//!
//! Why a bucket rather than each replica's `index.json`: a session created
//! on one replica must be listed on all of them, and a rename made through
//! any of them (forwarded to the holder) must read the same everywhere.
//! The holder puts the summary when it creates, loads, renames or unloads
//! the session (`Registry::note`); create and rename wait for the put, so a
//! listing made after their answer, on any replica, shows them.
//!
//! Bounded: a summary is at most `MAX_VALUE` bytes, the bucket at most
//! `MAX_SESSIONS` summaries' worth (`max_bytes`; a put past it is refused by
//! the server with a clear error), and a listing reads at most
//! `MAX_SESSIONS` entries within `LIST_TIMEOUT`.

use crate::error::{Error, ErrorKind, Result};
use crate::host::index::Entry;
use crate::log::ledger::Record;
use async_nats::jetstream::kv;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The KV bucket of session summaries.
pub const BUCKET: &str = "VAK_SESSIONS";
/// The most summaries a bucket holds and a listing reads.
pub const MAX_SESSIONS: usize = 100_000;
/// The largest summary, in bytes (a title is at most 80 characters).
pub const MAX_VALUE: usize = 1024;
/// How long a listing may take to read the bucket.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// One session's summary, the value of its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub created_at: String,
    pub title: String,
    /// The latest seq when the holder last wrote the summary.
    pub latest_seq: u64,
    /// The workspace of the replica that wrote it.
    pub workspace: String,
    /// When the holder last wrote it (RFC 3339).
    pub updated_at: String,
}

fn nats_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{what}: {e}"))
}

/// The shared session index of one replica.
#[derive(Debug)]
pub struct SharedIndex {
    kv: kv::Store,
    workspace: String,
}

impl SharedIndex {
    /// Opens the bucket, creating it with `replicas` copies if it is missing.
    pub async fn open(
        client: async_nats::Client,
        replicas: usize,
        workspace: String,
    ) -> Result<Arc<SharedIndex>> {
        let config = kv::Config {
            max_bytes: (MAX_SESSIONS * MAX_VALUE) as i64,
            ..crate::cluster::jetstream::bucket_config(
                BUCKET,
                "vak: every session's summary, for listing on any replica",
                MAX_VALUE,
                replicas,
            )
        };
        let kv = crate::cluster::jetstream::key_value(&client, config).await?;
        Ok(Arc::new(SharedIndex { kv, workspace }))
    }

    /// Writes the summary of `e` (its holder calls this).
    pub async fn put(&self, e: &Entry) -> Result<()> {
        let value = serde_json::to_vec(&Summary {
            created_at: e.created_at.clone(),
            title: e.title.clone(),
            latest_seq: e.latest_seq,
            workspace: self.workspace.clone(),
            updated_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        if value.len() > MAX_VALUE {
            return Err(Error::too_large(format!(
                "the summary of session {} is {} bytes; the session index holds at most {MAX_VALUE}",
                e.session_id,
                value.len()
            )));
        }
        self.kv
            .put(&e.session_id, value.into())
            .await
            .map(|_| ())
            .map_err(|err| {
                nats_error(
                    &format!("cannot write session {} to the session index", e.session_id),
                    err,
                )
            })
    }

    /// Drops session `id`'s summary (the session was deleted).
    pub async fn remove(&self, id: &str) -> Result<()> {
        self.kv
            .purge(id)
            .await
            .map_err(|e| nats_error(&format!("cannot remove session {id} from the session index"), e))
    }

    /// The summary of session `id`, if the bucket has one.
    pub async fn get(&self, id: &str) -> Option<Summary> {
        let value = self.kv.get(id).await.ok()??;
        serde_json::from_slice(&value).ok()
    }

    /// Every session's summary (at most `MAX_SESSIONS`), as index entries.
    pub async fn list(&self) -> Result<Vec<Entry>> {
        tokio::time::timeout(LIST_TIMEOUT, self.read_all())
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("the session index VAK_SESSIONS was not read in {LIST_TIMEOUT:?}"),
                )
            })?
    }

    async fn read_all(&self) -> Result<Vec<Entry>> {
        // Fresh stream info (the store's `status` is the info cached at open).
        let held = self
            .kv
            .stream
            .clone()
            .info()
            .await
            .map_err(|e| nats_error("cannot read the session index", e))?
            .state
            .messages;
        let mut out = Vec::new();
        if held == 0 {
            return Ok(out);
        }
        // The last value of every key, then `delta` (what is still pending)
        // reaches 0: everything the bucket held when the read began.
        let mut watch = self
            .kv
            .watch_with_history(">")
            .await
            .map_err(|e| nats_error("cannot read the session index", e))?;
        let mut read = 0usize;
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| nats_error("cannot read the session index", e))?;
            read += 1;
            if entry.operation == kv::Operation::Put {
                if let Ok(s) = serde_json::from_slice::<Summary>(&entry.value) {
                    out.push(Entry {
                        session_id: entry.key,
                        created_at: s.created_at,
                        title: s.title,
                        latest_seq: s.latest_seq,
                        usage: Default::default(),
                        workspace: s.workspace,
                    });
                }
            }
            if entry.delta == 0 || read >= MAX_SESSIONS {
                break;
            }
        }
        Ok(out)
    }
}

/// Gives `records` (a session's subject as the stream keeps it) the header
/// record a fold starts from, when the stream's retention
/// (`max_msgs_per_subject`) dropped it with the oldest messages: the id is
/// the subject's, the creation time the shared summary's (else unknown,
/// empty). What was dropped with it is history no replica can show: a
/// cursor into it gets `resync {reason: "history_unavailable"}`.
pub async fn restore_header(shared: Option<&SharedIndex>, id: &str, records: &mut Vec<Record>) {
    if records.is_empty() || matches!(records.first(), Some(Record::Header { .. })) {
        return;
    }
    let created_at = match shared {
        Some(shared) => shared.get(id).await.map(|s| s.created_at).unwrap_or_default(),
        None => String::new(),
    };
    tracing::info!(
        session = id,
        "the stream no longer holds the session's first records: folding what it keeps"
    );
    records.insert(
        0,
        Record::Header {
            session_id: id.to_string(),
            created_at,
            workspace: String::new(),
        },
    );
}
