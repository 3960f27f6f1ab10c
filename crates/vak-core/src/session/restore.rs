//! Restoring a session from its ledger: the records folded one at a time (from the last snapshot on) into the transcript, the replay ring, the remembered facts and the lost ranges.

use crate::error::{Error, Result};
use crate::event::{ClientEvent, Frame, Note};
use crate::log::folds::{Folds, Snapshot};
use crate::log::ledger::Record;
use std::collections::VecDeque;
use std::sync::Arc;

/// What a ledger says about its session, folded a record at a time from its
/// last snapshot on.
pub(crate) struct Restore {
    ring_size: usize,
    header: Option<(String, String)>,
    /// The header's workspace.
    workspace: Option<String>,
    latest: u64,
    ring: VecDeque<(u64, ClientEvent)>,
    folds: Option<Folds>,
    /// Ranges of seqs the ledger lost (`Record::Lost`), oldest first.
    lost: Vec<(u64, u64)>,
}

impl Restore {
    pub(crate) fn new(ring_size: usize) -> Restore {
        Restore {
            ring_size,
            header: None,
            workspace: None,
            latest: 0,
            ring: VecDeque::new(),
            folds: None,
            lost: Vec::new(),
        }
    }

    fn folds(&mut self) -> &mut Folds {
        let sid = self.header.as_ref().map_or("", |h| h.0.as_str()).to_string();
        self.folds.get_or_insert_with(|| Folds::new(&sid))
    }

    pub(crate) fn visit(&mut self, record: Record) {
        let (seq, event) = match record {
            Record::Header {
                session_id,
                created_at,
                workspace,
            } => {
                self.header = Some((session_id, created_at));
                self.workspace = Some(workspace);
                return;
            }
            Record::Admitted { request_id } => return self.folds().facts.remember_request(request_id),
            Record::Usage(u) => return self.folds().transcript.note(&Note::Usage(u)),
            Record::Signature { signature } => {
                return self.folds().transcript.note(&Note::Signature(signature))
            }
            Record::Compaction(c) => return self.folds().transcript.note(&Note::Compaction(c)),
            Record::Undo(u) => return self.folds().transcript.note(&Note::Undo(u)),
            Record::Lease { .. } | Record::Receipt(_) => return,
            Record::Background(p) => return self.folds().note(&Note::Background(p)),
            Record::Snapshot(snap) => {
                let Snapshot {
                    seq,
                    transcript,
                    presenter,
                    facts,
                    sides,
                    background,
                    plan,
                } = *snap;
                self.latest = self.latest.max(seq);
                self.ring.clear();
                self.folds = Some(Folds {
                    transcript,
                    presenter,
                    facts,
                    searched: 0,
                    sides,
                    background,
                    plan,
                });
                return;
            }
            Record::Lost { from, to } => {
                self.latest = self.latest.max(to);
                crate::log::repair::note_lost(&mut self.lost, from, to);
                return;
            }
            Record::Event { seq, event } => (seq, event),
        };
        if seq <= self.latest {
            tracing::warn!(seq, latest = self.latest, "ignoring an out-of-order ledger event");
            return;
        }
        self.latest = seq;
        self.folds().apply(seq, &event);
        if self.ring.len() == self.ring_size {
            self.ring.pop_front();
        }
        self.ring.push_back((seq, event));
    }

    /// The highest seq the records cover (their lost ranges included), or
    /// `durable`, the log's own, when higher.
    pub(crate) fn covered(&self, durable: u64) -> u64 {
        self.lost
            .iter()
            .fold(durable.max(self.latest), |m, &(_, to)| m.max(to))
    }

    /// The workspace the header names.
    pub(crate) fn take_workspace(&mut self) -> Option<String> {
        self.workspace.take()
    }

    /// What the session is rebuilt from; a ledger with no header is refused.
    pub(crate) fn finish(self) -> Result<Restored> {
        let Restore {
            header,
            latest,
            ring,
            folds,
            lost,
            ..
        } = self;
        let (id, created_at) = header.ok_or_else(|| Error::internal("ledger has no header"))?;
        let sid: Arc<str> = Arc::from(id.as_str());
        let ring = ring
            .into_iter()
            .map(|(seq, event)| Arc::new(Frame::new(seq, sid.clone(), event)))
            .collect();
        Ok(Restored {
            id,
            created_at,
            latest,
            ring,
            folds,
            lost,
        })
    }
}

/// A folded ledger, ready to become a live session.
pub(crate) struct Restored {
    pub(crate) id: String,
    pub(crate) created_at: String,
    /// The latest seq the ledger holds.
    pub(crate) latest: u64,
    /// Its last events, for the bus's replay ring.
    pub(crate) ring: Vec<Arc<Frame>>,
    /// None: no event or snapshot was folded (a fresh fold is kept).
    pub(crate) folds: Option<Folds>,
    /// Ranges of seqs the ledger lost, oldest first.
    pub(crate) lost: Vec<(u64, u64)>,
}
