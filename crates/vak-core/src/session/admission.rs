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
    /// A steering message that pauses, resumes or cancels the live chain:
    /// it acted on the run and is not the model's input.
    Applied,
}

impl AdmissionState {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionState::Started => "started",
            AdmissionState::Queued => "queued",
            AdmissionState::Duplicate => "duplicate",
            AdmissionState::Applied => "applied",
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
    /// A model this input's leg uses instead of the route's (a task's
    /// `model_pin`), on the route's provider.
    pub model: Option<String>,
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
    /// Paused with input queued: the chain waits for a resume (or a cancel)
    /// on this, then asks again.
    Hold(std::sync::Arc<tokio::sync::Notify>),
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
    /// A steering "pause": the next leg waits until a "resume".
    paused: bool,
    /// Wakes a held chain (resume).
    wake: std::sync::Arc<tokio::sync::Notify>,
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
        if self.paused && !self.closing && outcome == RunOutcome::Completed && !self.queue.is_empty() {
            return AfterLeg::Hold(self.wake.clone());
        }
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
                self.paused = false;
                self.leg_cancel = None;
                AfterLeg::Finished { discarded }
            }
        }
    }

    /// Holds the live chain's next leg until `resume` (steering "pause").
    pub(crate) fn pause(&mut self) {
        self.paused = true;
    }

    /// Releases a held chain (steering "resume").
    pub(crate) fn resume(&mut self) {
        self.paused = false;
        self.wake.notify_one();
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
#[cfg(test)]
mod pause_tests {
    use super::*;

    fn input(id: &str) -> Input {
        Input {
            request_id: id.into(),
            text: "x".into(),
            attachments: Vec::new(),
            model: None,
        }
    }

    #[test]
    fn a_paused_chain_holds_its_next_leg_until_resumed_and_a_cancel_ends_it() {
        let mut run = RunState::default();
        assert!(matches!(run.place(input("a"), None), Ok(Placed::Started(_))));
        run.pause();
        // Nothing queued: the chain ends as it would, and the pause with it.
        assert!(matches!(
            run.after_leg(RunOutcome::Completed),
            AfterLeg::Finished { discarded: 0 }
        ));
        assert!(matches!(run.place(input("b"), None), Ok(Placed::Started(_))));
        assert!(!run.paused, "a new chain is not paused");
        run.pause();
        assert!(matches!(run.place(input("c"), None), Ok(Placed::Queued)));
        assert!(matches!(run.after_leg(RunOutcome::Completed), AfterLeg::Hold(_)));
        assert!(
            matches!(run.after_leg(RunOutcome::Completed), AfterLeg::Hold(_)),
            "still held"
        );
        run.resume();
        assert!(matches!(run.after_leg(RunOutcome::Completed), AfterLeg::Next(i) if i.request_id == "c"));
        run.pause();
        assert!(matches!(run.place(input("d"), None), Ok(Placed::Queued)));
        assert!(matches!(run.after_leg(RunOutcome::Completed), AfterLeg::Hold(_)));
        run.cancel();
        assert!(matches!(
            run.after_leg(RunOutcome::Completed),
            AfterLeg::Finished { discarded: 0 }
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: &str) -> Input {
        Input {
            request_id: id.into(),
            text: format!("text of {id}"),
            attachments: Vec::new(),
            model: None,
        }
    }

    /// Both halves of admission, as `Session::admit_with` runs them with a
    /// durable write that succeeds in between.
    fn admit(run: &mut RunState, id: &str, cap: usize) -> Result<AdmissionState, Refused> {
        match run.check(id, None, cap)? {
            Checked::Duplicate => Ok(AdmissionState::Duplicate),
            Checked::Accepted => match run.place(input(id), None)? {
                Placed::Started(i) => {
                    assert_eq!(i.request_id, id);
                    Ok(AdmissionState::Started)
                }
                Placed::Queued => Ok(AdmissionState::Queued),
            },
        }
    }

    #[test]
    fn an_idle_session_starts_a_chain_and_a_busy_one_queues_its_next_legs_in_order() {
        let mut run = RunState::default();
        assert_eq!(admit(&mut run, "a", 4), Ok(AdmissionState::Started));
        assert!(run.running());
        let leg = run.leg_token();
        assert!(!leg.is_cancelled());
        assert_eq!(admit(&mut run, "b", 4), Ok(AdmissionState::Queued));
        assert_eq!(admit(&mut run, "c", 4), Ok(AdmissionState::Queued));
        // A completed leg is followed by the oldest queued input, with a fresh token.
        match run.after_leg(RunOutcome::Completed) {
            AfterLeg::Next(i) => assert_eq!(i.request_id, "b"),
            other => panic!("{other:?}"),
        }
        assert!(run.running());
        match run.after_leg(RunOutcome::Completed) {
            AfterLeg::Next(i) => assert_eq!(i.request_id, "c"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            run.after_leg(RunOutcome::Completed),
            AfterLeg::Finished { discarded: 0 }
        ));
        assert!(!run.running());
        // Idle again: the next input starts a new chain.
        assert_eq!(admit(&mut run, "d", 4), Ok(AdmissionState::Started));
    }

    #[test]
    fn the_queue_is_bounded_and_a_refused_id_may_come_back() {
        let mut run = RunState::default();
        assert_eq!(admit(&mut run, "a", 2), Ok(AdmissionState::Started));
        assert_eq!(admit(&mut run, "b", 2), Ok(AdmissionState::Queued));
        assert_eq!(admit(&mut run, "c", 2), Ok(AdmissionState::Queued));
        assert_eq!(admit(&mut run, "d", 2), Err(Refused::QueueFull { cap: 2 }));
        // Refused before it was remembered: once there is room, it is admitted.
        assert!(matches!(run.after_leg(RunOutcome::Completed), AfterLeg::Next(_)));
        assert_eq!(admit(&mut run, "d", 2), Ok(AdmissionState::Queued));
        // A cap of 0 queues nothing behind a live run, and never refuses an idle session.
        let mut none = RunState::default();
        assert_eq!(admit(&mut none, "a", 0), Ok(AdmissionState::Started));
        assert_eq!(admit(&mut none, "b", 0), Err(Refused::QueueFull { cap: 0 }));
    }

    #[test]
    fn a_remembered_request_id_is_a_duplicate_even_in_a_closed_session() {
        let mut run = RunState::default();
        assert_eq!(admit(&mut run, "a", 1), Ok(AdmissionState::Started));
        assert_eq!(admit(&mut run, "b", 1), Ok(AdmissionState::Queued));
        assert_eq!(admit(&mut run, "a", 1), Ok(AdmissionState::Duplicate));
        // A duplicate takes no room: the queue is full, yet b's retry is one.
        assert_eq!(admit(&mut run, "b", 1), Ok(AdmissionState::Duplicate));
        run.shut();
        assert_eq!(admit(&mut run, "a", 1), Ok(AdmissionState::Duplicate));
        assert_eq!(admit(&mut run, "new", 1), Err(Refused::ShuttingDown));
        let stopped = Stopped::WriterGone;
        assert_eq!(run.check("b", Some(stopped.clone()), 1), Ok(Checked::Duplicate));
        assert_eq!(
            run.check("new", Some(stopped.clone()), 1),
            Err(Refused::Stopped(stopped))
        );
        // Ids restored from a ledger are remembered the same way.
        let mut restored = RunState::default();
        restored.remember("old");
        assert_eq!(admit(&mut restored, "old", 1), Ok(AdmissionState::Duplicate));
    }

    #[test]
    fn only_the_latest_request_ids_are_remembered() {
        let mut run = RunState::default();
        for i in 0..=REMEMBERED_REQUESTS {
            run.remember(&format!("r{i}"));
        }
        assert_eq!(run.check("r1", None, 1), Ok(Checked::Duplicate));
        assert_eq!(
            run.check(&format!("r{REMEMBERED_REQUESTS}"), None, 1),
            Ok(Checked::Duplicate)
        );
        assert_eq!(
            run.check("r0", None, 1),
            Ok(Checked::Accepted),
            "the oldest was forgotten"
        );
        // Accepting it remembered it, and forgot the oldest then.
        assert_eq!(run.check("r0", None, 1), Ok(Checked::Duplicate));
        assert_eq!(run.check("r1", None, 1), Ok(Checked::Accepted));
    }

    #[test]
    fn an_id_that_could_not_be_made_durable_is_forgotten() {
        let mut run = RunState::default();
        assert_eq!(run.check("a", None, 1), Ok(Checked::Accepted));
        // Remembered at once: a concurrent retry is a duplicate.
        assert_eq!(run.check("a", None, 1), Ok(Checked::Duplicate));
        run.forget("a");
        assert_eq!(run.check("a", None, 1), Ok(Checked::Accepted));
        assert!(!run.running(), "nothing starts before the id is placed");
    }

    #[test]
    fn each_refusal_has_its_precedence() {
        let stopped = Stopped::Deleted;
        let mut run = RunState::default();
        run.begin_edit(None).unwrap();
        assert_eq!(run.check("a", None, 1), Err(Refused::Editing { input: true }));
        assert_eq!(run.idle(), Err(Refused::Editing { input: false }));
        // A stopped writer is named before anything else.
        assert_eq!(
            run.check("a", Some(stopped.clone()), 1),
            Err(Refused::Stopped(stopped.clone()))
        );
        run.end_edit();
        assert_eq!(run.check("a", None, 1), Ok(Checked::Accepted));
        // Deleted or shut while the id was written: placing it is refused,
        // and the id stays remembered, as it is on disk.
        run.mark_deleted();
        assert_eq!(run.place(input("a"), None).err(), Some(Refused::Deleted));
        assert_eq!(run.check("a", None, 1), Ok(Checked::Duplicate));
        assert_eq!(run.check("b", None, 1), Err(Refused::Deleted));
        assert_eq!(run.idle(), Err(Refused::Deleted));
        let mut run = RunState::default();
        assert_eq!(run.check("a", None, 1), Ok(Checked::Accepted));
        assert_eq!(
            run.place(input("a"), Some(stopped.clone())).err(),
            Some(Refused::Stopped(stopped))
        );
    }

    #[test]
    fn a_change_of_the_whole_session_waits_for_idle() {
        let mut run = RunState::default();
        assert_eq!(run.idle(), Ok(()));
        assert_eq!(admit(&mut run, "a", 1), Ok(AdmissionState::Started));
        assert_eq!(run.idle(), Err(Refused::Running));
        assert_eq!(run.begin_edit(None), Err(Refused::Running));
        assert!(matches!(
            run.after_leg(RunOutcome::Completed),
            AfterLeg::Finished { .. }
        ));
        // A compaction's token is the leg token: cancel stops it.
        let compaction = CancellationToken::new();
        run.begin_edit(Some(compaction.clone())).unwrap();
        assert_eq!(run.begin_edit(None), Err(Refused::Editing { input: false }));
        let cancelled = run.cancel();
        assert!(compaction.is_cancelled());
        assert_eq!(
            cancelled,
            CancelResult {
                cancelled: false,
                discarded: 0
            }
        );
        run.end_edit();
        run.shut();
        assert_eq!(run.idle(), Err(Refused::ShuttingDown));
    }

    #[test]
    fn a_failed_or_cancelled_leg_ends_its_chain_and_discards_the_queue() {
        for outcome in [RunOutcome::Failed, RunOutcome::Cancelled, RunOutcome::MaxTurns] {
            let mut run = RunState::default();
            admit(&mut run, "a", 4).unwrap();
            admit(&mut run, "b", 4).unwrap();
            admit(&mut run, "c", 4).unwrap();
            assert!(
                matches!(run.after_leg(outcome), AfterLeg::Finished { discarded: 2 }),
                "{outcome:?}"
            );
            assert!(!run.running());
            assert_eq!(admit(&mut run, "d", 4), Ok(AdmissionState::Started));
        }
        // Shutdown ends the chain after a completed leg too.
        let mut run = RunState::default();
        admit(&mut run, "a", 4).unwrap();
        admit(&mut run, "b", 4).unwrap();
        let leg = run.leg_token();
        run.shut();
        assert!(leg.is_cancelled());
        assert!(matches!(
            run.after_leg(RunOutcome::Completed),
            AfterLeg::Finished { discarded: 0 }
        ));
    }

    #[test]
    fn cancel_stops_the_leg_and_counts_the_discarded_inputs() {
        let mut run = RunState::default();
        assert_eq!(
            run.cancel(),
            CancelResult {
                cancelled: false,
                discarded: 0
            }
        );
        admit(&mut run, "a", 4).unwrap();
        admit(&mut run, "b", 4).unwrap();
        admit(&mut run, "c", 4).unwrap();
        let leg = run.leg_token();
        assert_eq!(
            run.cancel(),
            CancelResult {
                cancelled: true,
                discarded: 2
            }
        );
        assert!(leg.is_cancelled());
        // The cancelled leg still ends the chain; nothing is left to discard.
        assert!(matches!(
            run.after_leg(RunOutcome::Cancelled),
            AfterLeg::Finished { discarded: 0 }
        ));
    }

    #[test]
    fn request_ids_are_plain_or_made_up() {
        assert_eq!(request_id(" \n", Some("a".into())), Err(Refused::EmptyPrompt));
        assert_eq!(request_id("hi", Some("a-b_c.d:9".into())), Ok("a-b_c.d:9".into()));
        assert_eq!(request_id("hi", Some("x".repeat(128))), Ok("x".repeat(128)));
        assert_eq!(
            request_id("hi", Some("x".repeat(129))),
            Err(Refused::BadRequestId)
        );
        for bad in ["a b", "a/b", "é", "a\u{202e}b", "a\nb"] {
            assert_eq!(
                request_id("hi", Some(bad.into())),
                Err(Refused::BadRequestId),
                "{bad:?}"
            );
        }
        for none in [None, Some(String::new())] {
            let made = request_id("hi", none).unwrap();
            let hex = made.strip_prefix("req_").unwrap();
            assert_eq!(hex.len(), 32);
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn each_refusal_reads_as_it_always_did() {
        let cases = [
            (
                Refused::EmptyPrompt,
                ErrorKind::InvalidArgument,
                "the prompt is empty".to_string(),
            ),
            (
                Refused::BadRequestId,
                ErrorKind::InvalidArgument,
                "request_id must be 1 to 128 of A-Z a-z 0-9 - _ . :".into(),
            ),
            (
                Refused::Stopped(Stopped::WriterGone),
                ErrorKind::Unavailable,
                Stopped::WriterGone.reason(),
            ),
            (
                Refused::Deleted,
                ErrorKind::NotFound,
                "no session s1: it was deleted".into(),
            ),
            (
                Refused::ShuttingDown,
                ErrorKind::Unavailable,
                "the server is shutting down".into(),
            ),
            (
                Refused::Editing { input: true },
                ErrorKind::Conflict,
                "the session's history is being changed (clear, undo); send the input again".into(),
            ),
            (
                Refused::Editing { input: false },
                ErrorKind::Conflict,
                "the session's history is being changed (clear, undo)".into(),
            ),
            (
                Refused::Running,
                ErrorKind::Conflict,
                "session s1 has a live run; cancel it and wait for run_finished first".into(),
            ),
            (
                Refused::QueueFull { cap: 3 },
                ErrorKind::ResourceExhausted,
                "queue_full: 3 inputs are already queued behind the live run; wait for it or cancel it"
                    .into(),
            ),
        ];
        for (refused, kind, message) in cases {
            let e = refused.clone().error("s1");
            assert_eq!(
                (e.kind, e.message.as_str()),
                (kind, message.as_str()),
                "{refused:?}"
            );
        }
    }

    /// Admission through a live session whose log is in memory: the
    /// durable write of each admitted id sits between the two halves.
    mod on_a_session {
        use super::*;
        use crate::event::ClientEvent;
        use crate::log::memory::MemLog;
        use crate::route::Route;
        use crate::session::live::Session;
        use crate::session::runtime::Runtime;
        use crate::stream::delivery::Delivery;
        use crate::stream::subscription::Subscription;
        use crate::CoreConfig;
        use std::sync::Arc;
        use std::time::Duration;

        fn session(home: &std::path::Path, log: Arc<MemLog>, cap: usize) -> Arc<Session> {
            let mut cfg = CoreConfig::new(home.into(), home.into());
            cfg.max_queued_inputs = cap;
            let search = crate::host::search::Search::open(home, "ws", None, Vec::new(), cfg.search);
            let sandbox = crate::tools::sandbox::Sandbox::off();
            let rt = Arc::new(Runtime::new(
                cfg,
                Route::offline(),
                search,
                sandbox,
                Arc::default(),
                Arc::new(crate::finops::Finops::open(
                    home,
                    Default::default(),
                    jiff::tz::TimeZone::UTC,
                )),
            ));
            Session::create(rt, "s_mem", "2026-01-01T00:00:00Z".into(), log)
        }

        /// The next frame that `pick` maps to something, within a deadline.
        async fn next<T>(sub: &mut Subscription, mut pick: impl FnMut(&ClientEvent) -> Option<T>) -> T {
            loop {
                match tokio::time::timeout(Duration::from_secs(30), sub.recv()).await {
                    Ok(Some(Delivery::Frame(f))) => {
                        if let Some(t) = pick(&f.event) {
                            return t;
                        }
                    }
                    Ok(Some(_)) => {}
                    other => panic!("the stream ended or stalled: {:?}", other.is_ok()),
                }
            }
        }

        fn admitted_lines(log: &MemLog, id: &str) -> usize {
            let quoted = format!("\"{id}\"");
            log.lines()
                .iter()
                .filter(|l| l.starts_with("{\"admitted\"") && l.contains(&quoted))
                .count()
        }

        #[tokio::test]
        async fn every_outcome_of_a_run_and_its_steering() {
            let home = tempfile::tempdir().unwrap();
            let log = Arc::new(MemLog::default());
            let s = session(home.path(), log.clone(), 2);
            let mut sub = s.subscribe(Some(0));
            // The command waits for an approval: the run stays live until cancelled.
            let first = s
                .admit("/bash echo hi".into(), Some("run-1".into()))
                .await
                .unwrap();
            assert_eq!(first.state, AdmissionState::Started);
            assert_eq!(admitted_lines(&log, "run-1"), 1, "on the log before `started`");
            next(&mut sub, |e| {
                matches!(e, ClientEvent::ApprovalRequested { .. }).then_some(())
            })
            .await;
            for id in ["steer-1", "steer-2"] {
                let queued = s.admit("next step".into(), Some(id.into())).await.unwrap();
                assert_eq!(queued.state, AdmissionState::Queued);
                assert_eq!(admitted_lines(&log, id), 1, "on the log before `queued`");
            }
            let full = s.admit("more".into(), Some("steer-3".into())).await.unwrap_err();
            assert_eq!(full.kind, ErrorKind::ResourceExhausted);
            assert!(
                full.message.starts_with("queue_full: 2 inputs"),
                "{}",
                full.message
            );
            assert_eq!(admitted_lines(&log, "steer-3"), 0, "a refused id is not kept");
            // Retries are duplicates, written once.
            for id in ["run-1", "steer-2"] {
                let dup = s.admit("again".into(), Some(id.into())).await.unwrap();
                assert_eq!(dup.state, AdmissionState::Duplicate);
                assert_eq!(admitted_lines(&log, id), 1);
            }
            let bad = s.admit("x".into(), Some("no spaces".into())).await.unwrap_err();
            assert_eq!(bad.kind, ErrorKind::InvalidArgument);
            let empty = s.admit("  ".into(), None).await.unwrap_err();
            assert_eq!(empty.kind, ErrorKind::InvalidArgument);
            // A whole-session change is refused while the run is live.
            assert_eq!(s.clear_history().await.unwrap_err().kind, ErrorKind::Conflict);
            assert_eq!(
                s.cancel(),
                CancelResult {
                    cancelled: true,
                    discarded: 2
                }
            );
            let outcome = next(&mut sub, |e| match e {
                ClientEvent::RunFinished { outcome, .. } => Some(*outcome),
                _ => None,
            })
            .await;
            assert_eq!(outcome, RunOutcome::Cancelled);
            // Idle again: the refused id comes back and starts a chain.
            let again = s
                .admit("/bash echo hi".into(), Some("steer-3".into()))
                .await
                .unwrap();
            assert_eq!(again.state, AdmissionState::Started);
            s.cancel();
            s.shutdown(Duration::from_secs(5)).await;
            let closed = s.admit("late".into(), None).await.unwrap_err();
            assert_eq!(closed.kind, ErrorKind::Unavailable);
            assert_eq!(closed.message, "the server is shutting down");
        }

        #[tokio::test]
        async fn an_id_the_log_could_not_keep_is_no_duplicate_on_retry() {
            let home = tempfile::tempdir().unwrap();
            let log = Arc::new(MemLog::default());
            let s = session(home.path(), log.clone(), 2);
            log.fail();
            for _ in 0..2 {
                let e = s.admit("hi".into(), Some("lost-1".into())).await.unwrap_err();
                assert_eq!(e.kind, ErrorKind::Unavailable);
                assert!(e.message.starts_with("storage_failed"), "{}", e.message);
            }
            assert_eq!(admitted_lines(&log, "lost-1"), 0);
            assert!(!s.is_busy());
        }
    }
}
