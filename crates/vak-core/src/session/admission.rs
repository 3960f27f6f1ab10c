//! Admission: what an incoming prompt or steering text does to a session's turn chain (starts it, is queued as its next leg, is a duplicate of a remembered request id, or is refused for a typed reason), and the chain's queue between legs.

use crate::error::{Error, ErrorKind};
use crate::event::RunOutcome;
use crate::log::folds::REMEMBERED_REQUESTS;
use crate::session::attachments::AttachmentRef;
use crate::stopped::Stopped;
use std::collections::{HashSet, VecDeque};
use tokio_util::sync::CancellationToken;

/// What admission did with an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionState {
    Started,
    Queued,
    Duplicate,
}

impl AdmissionState {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionState::Started => "started",
            AdmissionState::Queued => "queued",
            AdmissionState::Duplicate => "duplicate",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub request_id: String,
    pub state: AdmissionState,
    /// The latest seq at admission: every event this input causes is after it.
    pub after_seq: u64,
}

/// One leg's input: a prompt or steering text, with its images.
#[derive(Clone, Debug)]
pub struct Input {
    pub request_id: String,
    pub text: String,
    pub attachments: Vec<AttachmentRef>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CancelResult {
    pub cancelled: bool,
    pub discarded: u32,
}

/// Why an input, or a change of the whole session, was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The prompt is blank.
    EmptyPrompt,
    /// The request id is not 1 to 128 plain characters.
    BadRequestId,
    /// The session's writer stopped (storage failure, fence, lost lease).
    Stopped(Stopped),
    /// The session is being deleted.
    Deleted,
    /// The server is shutting down.
    ShuttingDown,
    /// The model's history is being changed (clear, undo, compact): its
    /// note is not folded in yet. `input`: an input was refused (and is told
    /// to come again), else a change of the whole session.
    Editing { input: bool },
    /// A run is live (only a change of the whole session is refused for it:
    /// an input is queued instead).
    Running,
    /// `cap` inputs are already queued behind the live run.
    QueueFull { cap: usize },
}

impl Refused {
    /// The error a client gets, in the words it always got.
    pub(crate) fn error(self, session_id: &str) -> Error {
        match self {
            Refused::EmptyPrompt => Error::invalid("the prompt is empty"),
            Refused::BadRequestId => Error::invalid("request_id must be 1 to 128 of A-Z a-z 0-9 - _ . :"),
            Refused::Stopped(s) => s.into(),
            Refused::Deleted => Error::not_found(format!("no session {session_id}: it was deleted")),
            Refused::ShuttingDown => Error::new(ErrorKind::Unavailable, "the server is shutting down"),
            Refused::Editing { input: true } => Error::conflict(
                "the session's history is being changed (clear, undo); send the input again",
            ),
            Refused::Editing { input: false } => {
                Error::conflict("the session's history is being changed (clear, undo)")
            }
            Refused::Running => Error::conflict(format!(
                "session {session_id} has a live run; cancel it and wait for run_finished first"
            )),
            Refused::QueueFull { cap } => Error::new(
                ErrorKind::ResourceExhausted,
                format!("queue_full: {cap} inputs are already queued behind the live run; wait for it or cancel it"),
            ),
        }
    }
}

/// Checks an input's text and settles its request id: the client's, when
/// plain, or a fresh one.
pub(crate) fn request_id(text: &str, given: Option<String>) -> Result<String, Refused> {
    if text.trim().is_empty() {
        return Err(Refused::EmptyPrompt);
    }
    match given.filter(|r| !r.is_empty()) {
        Some(r) => {
            // Echoed to every client: a plain charset, so no bidi or
            // control characters ever reach a terminal or a page.
            let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':');
            if r.len() > 128 || !r.bytes().all(plain) {
                return Err(Refused::BadRequestId);
            }
            Ok(r)
        }
        None => Ok(format!("req_{}", uuid::Uuid::new_v4().simple())),
    }
}

/// The first half of admitting an input, before its id is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The id was admitted before: nothing more happens.
    Duplicate,
    /// Remembered: write the id to the log, then `place` the input.
    Accepted,
}

/// Where an accepted input went once its id was durable.
#[derive(Debug)]
pub(crate) enum Placed {
    /// The session was idle: the input starts a chain (the caller runs it).
    Started(Input),
    /// Queued as the live chain's next leg.
    Queued,
}

/// What the chain does after a leg.
#[derive(Debug)]
pub(crate) enum AfterLeg {
    /// The next queued input runs as the next leg.
    Next(Input),
    /// The chain ends: the session is idle again; `discarded` queued inputs
    /// were dropped (a failed or cancelled leg, shutdown).
    Finished { discarded: usize },
}

/// A session's run state: whether a chain runs, its queued inputs, the
/// request ids it remembers, and what refuses input meanwhile. Kept under
/// the session's run lock.
#[derive(Default)]
pub(crate) struct RunState {
    running: bool,
    closing: bool,
    /// Set with `closing` when the session is being deleted.
    deleted: bool,
    /// The model's history is being changed (clear, undo): admission
    /// answers a conflict meanwhile.
    editing: bool,
    queue: VecDeque<Input>,
    leg_cancel: Option<CancellationToken>,
    admitted: HashSet<String>,
    admitted_order: VecDeque<String>,
}

impl RunState {
    /// Whether a chain runs now.
    pub(crate) fn running(&self) -> bool {
        self.running
    }

    /// Whether the session refuses input for good (shutdown or delete).
    pub(crate) fn closing(&self) -> bool {
        self.closing
    }

    /// The live leg's cancel token (a fresh one when there is none).
    pub(crate) fn leg_token(&self) -> CancellationToken {
        self.leg_cancel.clone().unwrap_or_default()
    }

    /// Remembers an admitted request id; the oldest is forgotten past
    /// `REMEMBERED_REQUESTS`.
    pub(crate) fn remember(&mut self, id: &str) {
        if self.admitted.insert(id.to_string()) {
            self.admitted_order.push_back(id.to_string());
            if self.admitted_order.len() > REMEMBERED_REQUESTS {
                if let Some(old) = self.admitted_order.pop_front() {
                    self.admitted.remove(&old);
                }
            }
        }
    }

    /// Forgets an id whose admission could not be made durable.
    pub(crate) fn forget(&mut self, id: &str) {
        if self.admitted.remove(id) {
            self.admitted_order.retain(|r| r != id);
        }
    }

    /// Refuses new work in a session whose writer `stopped`, that is being
    /// deleted or is closing (shutdown).
    pub(crate) fn open(&self, stopped: Option<Stopped>) -> Result<(), Refused> {
        if let Some(s) = stopped {
            return Err(Refused::Stopped(s));
        }
        if self.deleted {
            return Err(Refused::Deleted);
        }
        if self.closing {
            return Err(Refused::ShuttingDown);
        }
        Ok(())
    }

    /// Refuses a change of the whole session while anything else changes it:
    /// a live run or a history edit, a delete, shutdown.
    pub(crate) fn idle(&self) -> Result<(), Refused> {
        if self.deleted {
            return Err(Refused::Deleted);
        }
        if self.running {
            return Err(Refused::Running);
        }
        if self.editing {
            return Err(Refused::Editing { input: false });
        }
        if self.closing {
            return Err(Refused::ShuttingDown);
        }
        Ok(())
    }

    /// The first half of admission. A remembered id is a duplicate (also in
    /// a closed session: it is the retry of an input that was admitted).
    /// Otherwise the input is refused, or its id remembered at once so a
    /// concurrent retry is a duplicate. `cap` bounds the queued inputs.
    pub(crate) fn check(
        &mut self,
        request_id: &str,
        stopped: Option<Stopped>,
        cap: usize,
    ) -> Result<Checked, Refused> {
        if self.admitted.contains(request_id) {
            return Ok(Checked::Duplicate);
        }
        self.open(stopped)?;
        if self.editing {
            return Err(Refused::Editing { input: true });
        }
        // Refused before it is remembered: the same request_id may come back later.
        if self.running && self.queue.len() >= cap {
            return Err(Refused::QueueFull { cap });
        }
        self.remember(request_id);
        Ok(Checked::Accepted)
    }

    /// The second half, once the input's id is durable: it starts a chain
    /// (with a fresh leg token) when none runs, else it is queued. Refused
    /// when the session was deleted or closed meanwhile; the id stays
    /// remembered, as it is on disk.
    pub(crate) fn place(&mut self, input: Input, stopped: Option<Stopped>) -> Result<Placed, Refused> {
        self.open(stopped)?;
        if self.running {
            self.queue.push_back(input);
            return Ok(Placed::Queued);
        }
        self.running = true;
        self.leg_cancel = Some(CancellationToken::new());
        Ok(Placed::Started(input))
    }

    /// After a leg that ended with `outcome`: a completed leg is followed by
    /// the next queued input (with a fresh leg token); a failed or cancelled
    /// one, or shutdown, ends the chain and discards the queue.
    pub(crate) fn after_leg(&mut self, outcome: RunOutcome) -> AfterLeg {
        let next = if self.closing || outcome != RunOutcome::Completed {
            None
        } else {
            self.queue.pop_front()
        };
        match next {
            Some(input) => {
                self.leg_cancel = Some(CancellationToken::new());
                AfterLeg::Next(input)
            }
            None => {
                let discarded = self.queue.len();
                self.queue.clear();
                self.running = false;
                self.leg_cancel = None;
                AfterLeg::Finished { discarded }
            }
        }
    }

    /// Stops the live leg and discards the queued inputs.
    pub(crate) fn cancel(&mut self) -> CancelResult {
        let discarded = self.queue.len() as u32;
        self.queue.clear();
        if let Some(c) = &self.leg_cancel {
            c.cancel();
        }
        CancelResult {
            cancelled: self.running,
            discarded,
        }
    }

    /// Shutdown: input is refused from now on, and what runs is cancelled.
    pub(crate) fn shut(&mut self) {
        self.closing = true;
        self.cancel();
    }

    /// Starts a change of the model's history (clear, undo, compact):
    /// refused unless idle; input is refused until `end_edit`. `cancel`
    /// becomes the leg token, so cancel and shutdown stop the change too.
    pub(crate) fn begin_edit(&mut self, cancel: Option<CancellationToken>) -> Result<(), Refused> {
        self.idle()?;
        self.editing = true;
        if cancel.is_some() {
            self.leg_cancel = cancel;
        }
        Ok(())
    }

    pub(crate) fn end_edit(&mut self) {
        self.editing = false;
    }

    /// The session is being deleted: input is refused as not found from now on.
    pub(crate) fn mark_deleted(&mut self) {
        self.closing = true;
        self.deleted = true;
    }
}
