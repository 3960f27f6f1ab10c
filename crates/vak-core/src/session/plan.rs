//! A session's commitments as the agent loop and the API change them: update_plan's items and a close's verdict, each checked against the plan as folded so far and published as `commitment` events.

use crate::commitment::{self, Change, Commitment, Verdict, MAX_NOTE};
use crate::error::{Error, Result};
use crate::event::ClientEvent;
use crate::log::plan::{Recorded, Refusal};
use crate::session::live::Session;

/// What `GET /commitments/:id` shows of one commitment.
#[derive(Clone, Debug, PartialEq)]
pub struct Detail {
    pub commitment: Commitment,
    /// Its most recent events (`log::plan::HISTORY`), oldest first.
    pub events: Vec<Recorded>,
    /// What a `fulfilled` close would still need, in words (empty: it would close).
    pub missing: Vec<String>,
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl Session {
    /// Carries out update_plan: every earlier event folded first (so a
    /// citation of the call just before is known), the items checked
    /// against the plan, their events published and folded; the plan in
    /// words for the model, or why nothing was changed.
    pub(crate) async fn update_plan(&self, input: &serde_json::Value) -> std::result::Result<String, String> {
        let items = commitment::parse_items(input)?;
        self.flush().await.map_err(|e| e.message)?;
        let events = self.with_plan(|p| p.plan_update(self.id(), items, &now()))?;
        for (change, c) in events {
            self.publish(ClientEvent::Commitment {
                change,
                commitment: Box::new(c),
            });
        }
        self.flush().await.map_err(|e| e.message)?;
        Ok(self.with_plan(|p| p.describe()))
    }

    /// The session's commitments, in their natural order.
    pub fn commitments(&self) -> Vec<Commitment> {
        self.with_plan(|p| p.rows().to_vec())
    }

    /// One commitment with its events and what a fulfilled close still needs.
    pub fn commitment(&self, item: &str) -> Result<Detail> {
        self.with_plan(|p| {
            let c = p.get(item).ok_or_else(|| not_found(self.id(), item))?;
            Ok(Detail {
                commitment: c.clone(),
                events: p.history(item),
                missing: p.missing(c, self.runtime().policy().require_evidence),
            })
        })
    }

    /// Closes a commitment with `verdict`: `fulfilled` only when the calls
    /// it cites meet its requirements (else a Conflict with reason
    /// `evidence_missing` naming each missing piece), the other verdicts
    /// always; a closed commitment is not closed again (Conflict
    /// `already_closed`). Returns it closed, once folded.
    pub async fn close_commitment(&self, item: &str, verdict: Verdict, note: String) -> Result<Commitment> {
        if note.len() > MAX_NOTE {
            return Err(Error::invalid(format!(
                "the note is {} bytes; at most {MAX_NOTE}",
                note.len()
            )));
        }
        self.flush().await?;
        let closed = self
            .with_plan(|p| {
                p.plan_close(
                    item,
                    verdict,
                    note,
                    &now(),
                    self.runtime().policy().require_evidence,
                )
            })
            .map_err(|r| refusal(self.id(), item, r))?;
        self.publish(ClientEvent::Commitment {
            change: Change::Closed,
            commitment: Box::new(closed.clone()),
        });
        self.flush().await?;
        // Two closes at once both pass the check; the first folded wins
        // (`commitment::merge`), and the other is told so.
        let now_closed = self.with_plan(|p| p.get(item).and_then(|c| c.closed.clone()));
        match now_closed {
            Some(c) if Some(&c) == closed.closed.as_ref() => {
                Ok(self.with_plan(|p| p.get(item).cloned()).unwrap_or(closed))
            }
            Some(c) => Err(refusal(self.id(), item, Refusal::AlreadyClosed(c.verdict))),
            None => Err(Error::internal("the close was published but is not in the plan")),
        }
    }
}

fn not_found(session: &str, item: &str) -> Error {
    Error::not_found(format!("no commitment {session}.{item}"))
}

fn refusal(session: &str, item: &str, r: Refusal) -> Error {
    match r {
        Refusal::NotFound => not_found(session, item),
        Refusal::AlreadyClosed(v) => Error::conflict(format!(
            "commitment {session}.{item} is already closed as {}",
            v.as_str()
        ))
        .with_reason("already_closed"),
        Refusal::EvidenceMissing { missing, cited } => {
            let cited = if cited.is_empty() {
                "it cites no tool call".to_string()
            } else {
                format!("it cites {}", cited.join(", "))
            };
            Error::conflict(format!(
                "commitment {session}.{item} cannot be closed as fulfilled: the recorded evidence does not support it. Missing: {}; {cited}",
                missing.join("; ")
            ))
            .with_reason("evidence_missing")
        }
    }
}
