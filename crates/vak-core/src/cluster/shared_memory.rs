//! Memory notes every replica shares (`--bus`): each tier is one key of the KV bucket `VAK_MEMORY` holding the same Markdown its file holds, changed by compare-and-set on the key's revision.
//!
//! Keys: `user` (the user's profile, `USER.md`) and `ws.<workspace key>`
//! (a workspace's notes, keyed like its file and its rules). A whole tier
//! in one value is what keeps the tier's bounds (200 notes) true across
//! replicas: two replicas adding a note at once both read the tier, one
//! update wins, the other reads again and decides again (`memory.rs`).
//! Every read goes to the stream's leader, as the embedded mode reads the
//! file again at every model turn and listing: a change answered on one
//! replica is listed, and reaches the next model turn, on every replica.
//!
//! A tier the bucket has never held is imported once from the home of the
//! first replica that reads it (its file, when it has notes or a
//! preamble); from then on the bucket is the tier and no replica reads or
//! writes that file.

use crate::error::{Error, Result};
use async_nats::jetstream::kv;
use std::sync::Arc;

/// The KV bucket of memory notes.
pub const BUCKET: &str = "VAK_MEMORY";
/// The key of the user's profile.
pub const USER_KEY: &str = "user";
/// A workspace's notes are `ws.<workspace key>`.
pub const WORKSPACE_PREFIX: &str = "ws.";
/// The largest tier the bucket holds, in bytes of Markdown: 200 notes of
/// 4096 bytes and their headers fit, under NATS's default 1 MiB payload.
pub const MAX_VALUE: usize = 1000 * 1024;

/// This replica's handle on `VAK_MEMORY`.
#[derive(Debug)]
pub struct SharedMemory {
    kv: kv::Store,
}

impl SharedMemory {
    /// Opens the bucket, creating it with `replicas` copies if it is missing.
    pub async fn open(client: async_nats::Client, replicas: usize) -> Result<Arc<SharedMemory>> {
        let config = crate::cluster::jetstream::bucket_config(
            BUCKET,
            "vak: the memory notes every replica shares, one tier per key",
            MAX_VALUE,
            replicas,
        );
        let kv = crate::cluster::jetstream::key_value(&client, config).await?;
        Ok(Arc::new(SharedMemory { kv }))
    }

    /// The tier at `key` and its revision, read from the leader: None when
    /// the bucket never held it (a deleted key reads as an empty tier).
    pub async fn read(&self, key: &str) -> Result<Option<(String, u64)>> {
        Ok(crate::cluster::shared_config::leader_read(&self.kv, key)
            .await?
            .map(|(value, rev)| {
                let text = value.map_or_else(String::new, |v| String::from_utf8_lossy(&v).into_owned());
                (text, rev)
            }))
    }

    /// Writes `text` as the tier at `key` if its revision is still
    /// `expected` (None: the bucket never held it); the new revision, or
    /// None when another replica changed it first. `what` names the tier
    /// in the error a tier past `MAX_VALUE` gets.
    pub async fn write(
        &self,
        key: &str,
        what: &str,
        text: String,
        expected: Option<u64>,
    ) -> Result<Option<u64>> {
        if text.len() > MAX_VALUE {
            return Err(Error::too_large(format!(
                "the {what} memory would be {} bytes; {BUCKET} holds at most {MAX_VALUE} bytes per tier: delete or shorten notes first",
                text.len()
            )));
        }
        crate::cluster::shared_config::cas(&self.kv, key, text.into_bytes(), expected).await
    }
}
