//! `GET /sessions/:id/receipts`: a session's receipts, read from its ledger file (or, with `--bus`, its JetStream log) without loading it and under no lock.

use crate::error::{Error, Result};
use crate::host::hub::Hub;
use crate::log::receipts::{self, Listed};

/// What `include` may name.
const PROMPT: &str = "prompt";

/// Session `id`'s receipts, oldest first (the newest `receipts::MAX_LISTED`),
/// with each model call's prompt when `include` is `prompt`. A malformed id
/// or another `include` is invalid; an unknown session not found.
pub async fn list(hub: &Hub, id: &str, include: Option<&str>) -> Result<Vec<Listed>> {
    crate::ids::validate_session_id(id)?;
    let prompts = match include {
        None => false,
        Some(PROMPT) => true,
        Some(other) => {
            return Err(Error::invalid(format!(
                "include {other:?} is not known: the one include is \"{PROMPT}\""
            ))
            .with_reason("unknown_include"))
        }
    };
    let cfg = hub.control().config();
    let path = cfg.sessions_dir().join(format!("{id}.jsonl"));
    let not_found = || Error::not_found(format!("no session {id}"));
    if let Some(client) = cfg.nats.clone() {
        if !hub.sessions().known(id) {
            return Err(not_found());
        }
        let log = crate::cluster::jetstream::JetStreamLog::open(client, id).await?;
        return Ok(receipts::of_records(log.records().await?, prompts));
    }
    let read = tokio::task::spawn_blocking(move || receipts::read(&path, prompts))
        .await
        .map_err(|e| Error::internal(format!("reading receipts stopped: {e}")))?;
    match read {
        Ok(listed) => Ok(listed),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_found()),
        Err(e) => Err(Error::internal(format!("cannot read the ledger of {id}: {e}"))),
    }
}
