//! A session's log read back from `VAK_EV`: batched direct gets from a stream sequence on, whole records put back together (parts, packs) for a load or a mirror, events after a cursor for a replay.

use super::chunks;
use super::packs;
use super::{
    lock, position_of, JetStreamLog, Link, Position, Stored, H_NOTE, H_SEQ, MARK_EVERY, READ_BATCH,
    READ_BYTES, REQUEST_TIMEOUT, STREAM,
};
use crate::error::{Error, Result};
use crate::event::ClientEvent;
use crate::log::ledger::Record;
use async_nats::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::oneshot;

/// Why a read failed.
pub(super) enum ReadError {
    /// Worth asking again (no answer in time, no responders).
    Again(String),
    /// What is stored cannot be shown (a broken set of parts; a follower
    /// a moment behind only ever lacks whole batches): never asked again.
    Broken(Error),
}

impl Link {
    /// Every message of the subject after stream sequence `after`, in
    /// order, with its stream sequence and position.
    /// A record cut in parts counts at its last part's stream sequence; one
    /// whose parts are incomplete or altered is an error.
    pub(crate) async fn stored_after(&self, after: u64) -> Result<Vec<Stored>> {
        let mut out = Vec::new();
        let mut next = after + 1;
        let mut records = chunks::Records::default();
        loop {
            let (got, more) = self
                .direct_batch(next, READ_BATCH)
                .await
                .map_err(|e| Error::internal(format!("cannot read the log of {}: {e}", self.session)))?;
            let ended = !more;
            for (stream_seq, headers, payload) in got {
                next = stream_seq + 1;
                let Some(position) = position_of(&headers) else {
                    tracing::error!(subject = %self.subject, stream_seq, "a message with neither {H_SEQ} nor {H_NOTE} is left out");
                    continue;
                };
                let pack = packs::first_of(&headers).map_err(|b| self.broken(stream_seq, &b))?;
                if let Some(first) = pack {
                    let unpacked = records
                        .pack_next()
                        .and_then(|()| packs::unpack(first, position, &payload))
                        .map_err(|b| self.broken(stream_seq, &b))?;
                    out.extend(unpacked.into_iter().map(|(position, record)| Stored {
                        stream_seq,
                        position,
                        record,
                    }));
                    continue;
                }
                let payload = match records.push(position, &headers, payload) {
                    Ok(Some(whole)) => whole,
                    Ok(None) => continue,
                    Err(broken) => return Err(self.broken(stream_seq, &broken)),
                };
                match serde_json::from_slice::<Record>(&payload) {
                    Ok(record) => out.push(Stored {
                        stream_seq,
                        position,
                        record,
                    }),
                    Err(e) => {
                        tracing::error!(subject = %self.subject, stream_seq, "an unreadable record is left out: {e}")
                    }
                }
            }
            if ended {
                return Ok(out);
            }
        }
    }

    /// Events with seq > `after`, up to `max`, from stream sequence `from` on.
    async fn read_from(
        &self,
        from: u64,
        after: u64,
        max: usize,
    ) -> std::result::Result<Vec<(u64, ClientEvent)>, ReadError> {
        let mut out = Vec::new();
        let mut next = from.max(1);
        // Only events go in (a note's parts are skipped whole).
        let mut records = chunks::Records::default();
        loop {
            let ask = READ_BATCH.max(max - out.len());
            let (got, more) = self.direct_batch(next, ask).await.map_err(ReadError::Again)?;
            let ended = !more;
            for (stream_seq, headers, payload) in got {
                next = stream_seq + 1;
                let pack =
                    packs::first_of(&headers).map_err(|b| ReadError::Broken(self.broken(stream_seq, &b)))?;
                if pack.is_some() {
                    let events = records
                        .pack_next()
                        .and_then(|()| {
                            packs::events_after(&payload, after, |seq| {
                                if seq % MARK_EVERY == 0 {
                                    lock(&self.seen).marks.insert(seq, stream_seq);
                                }
                            })
                        })
                        .map_err(|b| ReadError::Broken(self.broken(stream_seq, &b)))?;
                    out.extend(events);
                    if out.len() >= max {
                        out.truncate(max);
                        return Ok(out);
                    }
                    continue;
                }
                let Some(seq) = headers.get(H_SEQ).and_then(|v| v.as_str().parse::<u64>().ok()) else {
                    continue;
                };
                let first = headers
                    .get(chunks::H_PART)
                    .is_none_or(|p| p.as_str().starts_with("1/"));
                if seq % MARK_EVERY == 0 && first {
                    // A read starts at a record's first message.
                    lock(&self.seen).marks.insert(seq, stream_seq);
                }
                if seq <= after {
                    continue;
                }
                let payload = match records.push(Position { after: seq, notes: 0 }, &headers, payload) {
                    Ok(Some(whole)) => whole,
                    Ok(None) => continue,
                    Err(broken) => return Err(ReadError::Broken(self.broken(stream_seq, &broken))),
                };
                match serde_json::from_slice::<Record>(&payload) {
                    Ok(Record::Event { seq: s, event }) if s == seq => out.push((seq, event)),
                    Ok(_) => {
                        tracing::warn!(subject = %self.subject, stream_seq, "a message whose {H_SEQ} does not match its record is skipped")
                    }
                    Err(e) => {
                        tracing::warn!(subject = %self.subject, stream_seq, "an unreadable message is skipped in a replay: {e}")
                    }
                }
                if out.len() >= max {
                    return Ok(out);
                }
            }
            if ended {
                return Ok(out);
            }
        }
    }

    /// Up to `n` messages of the subject from stream sequence `from` (and
    /// about `READ_BYTES` at most: a pack is up to a message's payload
    /// room), in one batched direct get; and whether the subject holds
    /// more after them.
    async fn direct_batch(
        &self,
        from: u64,
        n: usize,
    ) -> std::result::Result<(Vec<(u64, HeaderMap, Bytes)>, bool), String> {
        let inbox = self.client.new_inbox();
        let mut sub = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| e.to_string())?;
        let body = serde_json::json!({
            "seq": from,
            "next_by_subj": self.subject,
            "batch": n,
            "max_bytes": READ_BYTES,
        })
        .to_string();
        self.client
            .publish_with_reply(format!("$JS.API.DIRECT.GET.{STREAM}"), inbox, body.into())
            .await
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        loop {
            let msg = match tokio::time::timeout(REQUEST_TIMEOUT, sub.next()).await {
                Ok(Some(msg)) => msg,
                Ok(None) => return Err("the read's subscription ended".into()),
                Err(_) => return Err(format!("a direct get gave no answer in {REQUEST_TIMEOUT:?}")),
            };
            // The end of a batch says how many messages it left; a server
            // that does not is taken to have stopped early only at `n`.
            let pending = (msg.status.map(|s| s.as_u16()) == Some(204))
                .then(|| {
                    msg.headers
                        .as_ref()?
                        .get("Nats-Num-Pending")?
                        .as_str()
                        .parse::<u64>()
                        .ok()
                })
                .flatten();
            match direct_answer(msg)? {
                Some(found) => out.push(found),
                // The end of the batch (or nothing at all).
                None => {
                    let more = pending.map_or(out.len() >= n, |p| p > 0);
                    return Ok((out, more));
                }
            }
        }
    }
}

/// A direct get's answer: the message's stream sequence and headers, None if there is none.
pub(super) fn stored(msg: async_nats::Message) -> std::result::Result<Option<(u64, HeaderMap)>, String> {
    Ok(direct_answer(msg)?.map(|(seq, headers, _)| (seq, headers)))
}

/// One message of a direct get's answer: its stream sequence, headers and
/// payload; None for no message (404) or the end of a batch (204).
fn direct_answer(msg: async_nats::Message) -> std::result::Result<Option<(u64, HeaderMap, Bytes)>, String> {
    match msg.status {
        Some(StatusCode::NOT_FOUND) => return Ok(None),
        Some(s) if s.as_u16() == 204 => return Ok(None),
        Some(StatusCode::NO_RESPONDERS) => return Err("no responders for a direct get".into()),
        Some(s) if s != StatusCode::OK => {
            return Err(format!(
                "a direct get failed: {s} {}",
                msg.description.unwrap_or_default()
            ))
        }
        _ => {}
    }
    let headers = msg.headers.unwrap_or_default();
    let seq = headers
        .get("Nats-Sequence")
        .and_then(|v| v.as_str().parse::<u64>().ok())
        .ok_or("a direct get answer with no Nats-Sequence")?;
    Ok(Some((seq, headers, msg.payload)))
}

impl JetStreamLog {
    /// `Link::read_from` run on the runtime, waited for on this blocking
    /// thread (no lock is held meanwhile).
    pub(super) fn read_from(
        &self,
        from: u64,
        after: u64,
        max: usize,
    ) -> std::result::Result<Vec<(u64, ClientEvent)>, ReadError> {
        let (done, answer) = oneshot::channel();
        let link = self.link.clone();
        self.rt.spawn(async move {
            let _ = done.send(link.read_from(from, after, max).await);
        });
        answer.blocking_recv().unwrap_or_else(|_| {
            Err(ReadError::Broken(Error::internal(format!(
                "cannot read the log of {}: the runtime is shutting down",
                self.link.session
            ))))
        })
    }
}
