//! A session's folds: what its published events project into (transcript, presentation
//! timeline, the facts a reload needs, the side log), and the snapshot of them its ledger
//! keeps now and then. Below the session and the ledger, so both can name them.

use crate::background::BackgroundQueue;
use crate::event::{ApprovalOutcome, ClientEvent, Note, SideOutcome, SidePhase};
use crate::log::plan::Plan;
use crate::log::presentation::Presenter;
use crate::log::transcript::Transcript;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Settled approvals remembered per session (so a late second answer is a
/// 409, not a 404); the oldest are forgotten first.
pub(crate) const REMEMBERED_SETTLED: usize = 4096;

/// Admitted request ids a session remembers, so a retried request is a duplicate.
pub(crate) const REMEMBERED_REQUESTS: usize = 4096;

/// The projections of the published events, folded under one lock in seq order.
pub(crate) struct Folds {
    pub(crate) transcript: Transcript,
    pub(crate) presenter: Presenter,
    pub(crate) facts: Facts,
    /// The seq up to which this session has handed its messages to search
    /// (set to the latest seq when it loads: what came before is the
    /// startup reconcile's).
    pub(crate) searched: u64,
    pub(crate) sides: SideLog,
    /// Background results queued and not yet delivered.
    pub(crate) background: BackgroundQueue,
    /// The session's commitments and what the calls they cite did.
    pub(crate) plan: Plan,
}

impl Folds {
    pub(crate) fn new(session_id: &str) -> Folds {
        Folds {
            transcript: Transcript::default(),
            presenter: Presenter::new(session_id),
            facts: Facts::default(),
            searched: 0,
            sides: SideLog::default(),
            background: BackgroundQueue::default(),
            plan: Plan::default(),
        }
    }

    /// Folds an internal fact: a queued background result, or one the
    /// transcript keeps.
    pub(crate) fn note(&mut self, note: &Note) {
        match note {
            Note::Background(p) => self.background.queue(p.n, p.result.clone()),
            note => self.transcript.note(note),
        }
    }

    pub(crate) fn apply(&mut self, seq: u64, event: &ClientEvent) {
        // A side branch: only the side log sees it, so the main
        // conversation's folds are what they would be without it.
        if let ClientEvent::Side { side_id, phase } = event {
            self.sides.apply(seq, side_id, phase);
            return;
        }
        if let ClientEvent::BackgroundResult { upto, .. } = event {
            self.background.delivered(*upto);
        }
        self.transcript.apply(seq, event);
        self.facts.apply(event);
        self.plan.apply(seq, event);
        self.presenter.fold(seq, event);
    }
}

/// What a reload needs beyond the transcript and the timeline: is a run in
/// flight, what it left open, and the ids a retry must find again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Facts {
    pub(crate) busy: bool,
    pub(crate) open_approvals: Vec<String>,
    pub(crate) open_calls: Vec<String>,
    /// The most recent ones only: what the session remembers anyway.
    pub(crate) settled: VecDeque<(String, ApprovalOutcome)>,
    pub(crate) request_ids: VecDeque<String>,
}

impl Facts {
    pub(crate) fn remember_request(&mut self, id: String) {
        if self.request_ids.len() == REMEMBERED_REQUESTS {
            self.request_ids.pop_front();
        }
        self.request_ids.push_back(id);
    }

    pub(crate) fn apply(&mut self, event: &ClientEvent) {
        match event {
            ClientEvent::Status { busy, .. } => self.busy = *busy,
            ClientEvent::UserMessage { request_id, .. } => self.remember_request(request_id.clone()),
            ClientEvent::ApprovalRequested { request_id, .. } => self.open_approvals.push(request_id.clone()),
            ClientEvent::ToolCall { call_id, .. } => self.open_calls.push(call_id.clone()),
            ClientEvent::ToolResult { call_id, .. } => self.open_calls.retain(|c| c != call_id),
            ClientEvent::ApprovalResolved {
                request_id, outcome, ..
            } => {
                self.open_approvals.retain(|r| r != request_id);
                if self.settled.len() == REMEMBERED_SETTLED {
                    self.settled.pop_front();
                }
                self.settled.push_back((request_id.clone(), *outcome));
            }
            _ => {}
        }
    }
}

/// A session's folds as of `seq`, written to its ledger now and then so a
/// reload reads only what came after the last one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub seq: u64,
    pub(crate) transcript: Transcript,
    pub(crate) presenter: Presenter,
    pub(crate) facts: Facts,
    /// Absent in snapshots written before side chat.
    #[serde(default)]
    pub(crate) sides: SideLog,
    /// Absent in snapshots written before background results.
    #[serde(default)]
    pub(crate) background: BackgroundQueue,
    /// Absent in snapshots written before commitments.
    #[serde(default)]
    pub(crate) plan: Plan,
}

/// The side runs a session keeps readable (`GET /sessions/:id/side`);
/// older ones stay in the ledger and on replayed streams.
pub const KEPT: usize = 64;

/// One side run as its frames tell it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SideEntry {
    pub side_id: String,
    pub question: String,
    pub branch_seq: u64,
    /// The seq of its started frame.
    pub seq: u64,
    pub answer: String,
    /// None while it is live.
    pub outcome: Option<SideOutcome>,
    pub message: String,
}

/// The fold of a session's side frames: its most recent side runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SideLog {
    runs: VecDeque<SideEntry>,
}

impl SideLog {
    pub fn apply(&mut self, seq: u64, side_id: &str, phase: &SidePhase) {
        match phase {
            SidePhase::Started { question, branch_seq } => {
                if self.runs.len() == KEPT {
                    self.runs.pop_front();
                }
                self.runs.push_back(SideEntry {
                    side_id: side_id.to_string(),
                    question: question.clone(),
                    branch_seq: *branch_seq,
                    seq,
                    ..SideEntry::default()
                });
            }
            SidePhase::TextDelta { text } => {
                if let Some(e) = self.find(side_id) {
                    e.answer.push_str(text);
                }
            }
            SidePhase::Finished { outcome, message, .. } => {
                if let Some(e) = self.find(side_id) {
                    e.outcome = Some(*outcome);
                    e.message = message.clone();
                }
            }
        }
    }

    fn find(&mut self, side_id: &str) -> Option<&mut SideEntry> {
        self.runs.iter_mut().rev().find(|e| e.side_id == side_id)
    }

    pub fn runs(&self) -> Vec<SideEntry> {
        self.runs.iter().cloned().collect()
    }

    /// The side run left without a finished frame (the server stopped during it).
    pub fn open(&self) -> Option<String> {
        self.runs
            .iter()
            .rev()
            .find(|e| e.outcome.is_none())
            .map(|e| e.side_id.clone())
    }
}
