//! Waiting for a run to settle, for callers that want its outcome and final answer in one answer (`POST /sessions/:id/run` with `wait`).

use crate::event::{ClientEvent, RunOutcome};
use crate::log::transcript::Role;
use crate::session::live::Session;
use crate::stream::delivery::Delivery;
use std::time::Duration;

/// The longest a caller may wait, and the wait when it names none.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);
pub const DEFAULT_WAIT: Duration = Duration::from_secs(600);

/// How a run ended, as the caller that waited for it sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// run_finished's outcome and human message.
    pub outcome: RunOutcome,
    pub message: String,
    /// The text of the last assistant message of the run ("" when the model
    /// said nothing, e.g. a run that failed before its first answer).
    pub answer: String,
    /// The seq of the run_finished.
    pub seq: u64,
}

/// Waits, at most `limit`, for the first run_finished after `after_seq`
/// (the chain an admission joined settles with exactly one); None past the
/// limit or when the session closes first. Reads the session's stream
/// from `after_seq` (ring, else ledger), so nothing published between the
/// admission and this call is missed.
pub async fn settled(session: &Session, after_seq: u64, limit: Duration) -> Option<Settled> {
    let mut sub = session.subscribe(Some(after_seq));
    let finished = async {
        loop {
            match sub.recv().await? {
                Delivery::Frame(f) => {
                    if let ClientEvent::RunFinished { outcome, message, .. } = &f.event {
                        return Some((f.seq, *outcome, message.clone()));
                    }
                }
                Delivery::Resync { .. } => {}
                Delivery::End(_) => return None,
            }
        }
    };
    let (seq, outcome, message) = tokio::time::timeout(limit, finished).await.ok()??;
    // The folds are applied before a frame reaches any subscriber, so the
    // transcript already holds the run's last answer.
    let answer = session
        .transcript()
        .messages
        .iter()
        .rev()
        .take_while(|m| m.seq > after_seq)
        .find(|m| m.role == Role::Assistant && m.seq < seq)
        .map(|m| m.text.clone())
        .unwrap_or_default();
    Some(Settled {
        outcome,
        message,
        answer,
        seq,
    })
}
