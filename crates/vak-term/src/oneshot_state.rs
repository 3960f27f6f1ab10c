//! The one-shot run's renderer as a state machine: where the run is (`State`),
//! one function per kind of update, what it prints (through `Out`), what it
//! asks the driver to do (`Effect`) and when the run is over (`Step::Exit`).

use super::conn::approval;
use super::follow::{Resync, Update};
use super::render::{background_lines, clean, plan_text, retrying_line, tool_text, Piece, Render, PLAN_TOOL};
use super::Policy;
use pb::event::Kind;
use std::collections::VecDeque;
use vak_proto::json::to_json;
use vak_proto::v1 as pb;

/// Exit codes: completed, failed (the run, or vak term itself), cancelled.
pub(crate) const EXIT_COMPLETED: i32 = 0;
pub(crate) const EXIT_FAILED: i32 = 1;
pub(crate) const EXIT_CANCELLED: i32 = 130;

/// Where the output goes: the answer (or JSON lines) to stdout, notes to stderr.
pub(crate) trait Out {
    fn stdout(&mut self, s: &[u8]);
    /// One line on stderr, after `vak: `.
    fn note(&mut self, line: &str);
}

/// What the renderer asks its driver to do.
#[derive(Debug, PartialEq)]
pub(crate) enum Effect {
    /// Send this approval answer (without holding up the stream).
    Answer(pb::ApproveRequest),
    /// Ask the server to cancel the run.
    Cancel,
    /// Read answers from stdin: a question is asked.
    ReadStdin,
}

/// What an update did to the run.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    Continue,
    /// The stream is open: the driver asks for the run now.
    Opened,
    /// The run is over (or the user quit): the exit code.
    Exit(i32),
}

/// Where the run is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum State {
    /// The stream is not open yet; the run is not asked for.
    Opening,
    /// The run is asked for; our prompt's leg has not begun (queued, or the
    /// stream has not reached it).
    Waiting,
    /// Our prompt's leg (its user message at `user_seq`): its text, tools and
    /// questions are ours.
    Ours { user_seq: u64 },
    /// Another prompt's leg began after ours: only our run's end is still ours.
    After { user_seq: u64 },
}

impl State {
    fn user_seq(self) -> Option<u64> {
        match self {
            State::Ours { user_seq } | State::After { user_seq } => Some(user_seq),
            State::Opening | State::Waiting => None,
        }
    }

    fn ours(self) -> bool {
        matches!(self, State::Ours { .. })
    }
}

/// The run as admitted.
struct Admitted {
    request_id: String,
    after_seq: u64,
    /// Queued behind another run: a cancel may discard it before it begins.
    queued: bool,
}

/// What has been written to stdout in text mode, so a resync can print only what is missing.
#[derive(Default)]
struct Answer {
    printed: String,
    /// A tool ran since the last text: the next text starts on a new line.
    need_sep: bool,
    clean: bool,
}

impl Answer {
    fn push(&mut self, out: &mut dyn Out, text: &str) {
        let mut s = String::new();
        if self.need_sep && !self.printed.is_empty() && !self.printed.ends_with('\n') {
            s.push('\n');
        }
        self.need_sep = false;
        s.push_str(text);
        self.write(out, &s);
    }

    fn write(&mut self, out: &mut dyn Out, s: &str) {
        if s.is_empty() {
            return;
        }
        self.printed.push_str(s);
        let shown = if self.clean { clean(s) } else { s.to_string() };
        out.stdout(shown.as_bytes());
    }

    fn finish(&mut self, out: &mut dyn Out) {
        if !self.printed.is_empty() && !self.printed.ends_with('\n') {
            self.write(out, "\n");
        }
    }
}

/// The answer text of the leg whose user message is `user`, rebuilt from the
/// transcript exactly as `Answer::push` would have printed it live.
fn transcript_answer(t: &pb::Transcript, user: usize) -> String {
    let mut a = String::new();
    let mut need_sep = false;
    for m in &t.messages[user + 1..] {
        match m.role().json_name() {
            "user" => break,
            "tool" => need_sep = true,
            "assistant" if !m.text.is_empty() => {
                if need_sep && !a.is_empty() && !a.ends_with('\n') {
                    a.push('\n');
                }
                need_sep = false;
                a.push_str(&m.text);
            }
            _ => {}
        }
    }
    a
}

/// An approval question of our leg, waiting for its answer.
struct Pending {
    request_id: String,
    tool: String,
    reason: String,
    /// exit_plan_mode's plan, shown whole before its question.
    plan: String,
}

/// The one-shot renderer.
pub(crate) struct Renderer<O: Out> {
    out: O,
    sid: String,
    prompt: String,
    json: bool,
    policy: Policy,
    state: State,
    admitted: Option<Admitted>,
    answer: Answer,
    render: Render,
    pending: VecDeque<Pending>,
    /// The question on screen, by request id.
    asked: Option<String>,
    stdin_closed: bool,
    interrupted: bool,
    reconnecting: bool,
    effects: Vec<Effect>,
}

impl<O: Out> Renderer<O> {
    /// `clean`: stdout is a terminal (control characters are not printed).
    pub(crate) fn new(out: O, sid: String, prompt: String, json: bool, policy: Policy, clean: bool) -> Self {
        Renderer {
            out,
            sid,
            prompt,
            json,
            policy,
            state: State::Opening,
            admitted: None,
            answer: Answer {
                clean,
                ..Answer::default()
            },
            render: Render::default(),
            pending: VecDeque::new(),
            asked: None,
            stdin_closed: false,
            interrupted: false,
            reconnecting: false,
            effects: Vec::new(),
        }
    }

    #[cfg(test)]
    fn state(&self) -> State {
        self.state
    }

    /// Whether a question waits for a line from stdin.
    pub(crate) fn asking(&self) -> bool {
        self.asked.is_some()
    }

    /// What the driver is to do, in order; taken.
    pub(crate) fn effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    fn note(&mut self, line: &str) {
        self.out.note(line);
    }

    fn emit_json(&mut self, e: &pb::Event) {
        let mut line = to_json(e);
        line.push(b'\n');
        self.out.stdout(&line);
    }

    /// The run was admitted (`request_id` ours): from here on the stream says how it goes.
    pub(crate) fn admitted(&mut self, request_id: String, a: &pb::Admission) {
        self.admitted = Some(Admitted {
            request_id,
            after_seq: a.after_seq,
            queued: a.state() == pb::AdmissionState::Queued,
        });
        self.state = State::Waiting;
    }

    /// One update from the follower (`Fatal` and the end of the stream are the driver's: they end the run with an error).
    pub(crate) fn update(&mut self, u: Update) -> Step {
        match u {
            Update::Reconnecting(why) => {
                if !self.reconnecting {
                    self.note(&format!("reconnecting: {why}"));
                    self.reconnecting = true;
                }
                Step::Continue
            }
            Update::Event(e) => self.event(e),
            Update::Resynced(r) => self.resynced(*r),
            // The driver ends the run on a fatal failure before it gets here.
            Update::Fatal(_) => Step::Continue,
        }
    }

    fn event(&mut self, e: pb::Event) -> Step {
        if self.json {
            self.emit_json(&e);
        }
        let opened = matches!(e.kind, Some(Kind::StreamOpened(_)));
        if opened && self.reconnecting {
            self.note("reconnected");
            self.reconnecting = false;
        }
        if self.state == State::Opening {
            return if opened { Step::Opened } else { Step::Continue };
        }
        let Some(kind) = &e.kind else {
            return Step::Continue;
        };
        let ours = self.state.ours();
        match kind {
            Kind::UserMessage(m) => self.user_message(m, e.seq),
            Kind::TextDelta(t) if ours && !self.json => self.answer.push(&mut self.out, &t.text),
            Kind::ToolCall(_) | Kind::ToolOutput(_) | Kind::ToolResult(_) | Kind::ApprovalResolved(_)
                if ours =>
            {
                self.tool_event(&e)
            }
            Kind::ApprovalRequested(a) if ours => self.approval_requested(&e, a),
            Kind::Notice(n) if ours && !self.json => self.note(&format!("! {}", clean(&n.text))),
            // Our run waits to try the model service again: said on stderr.
            Kind::Status(pb::Status {
                retrying: Some(r), ..
            }) if ours && !self.json => self.note(&retrying_line(r)),
            // Delivered only while the session is idle (before our prompt's
            // leg, or between legs): said on stderr, never mixed into the answer.
            Kind::BackgroundResult(b) if !self.json => {
                for p in background_lines(b) {
                    if let Piece::Line { text, .. } = p {
                        self.note(&text);
                    }
                }
            }
            Kind::RunFinished(r) => return self.run_finished(e.seq, r),
            _ => {}
        }
        Step::Continue
    }

    /// A prompt's leg begins: ours (by request id), or another's.
    fn user_message(&mut self, m: &pb::UserMessage, seq: u64) {
        let mine = self
            .admitted
            .as_ref()
            .is_some_and(|a| m.request_id == a.request_id);
        self.state = match (mine, self.state.user_seq()) {
            (true, _) => State::Ours { user_seq: seq },
            (false, Some(user_seq)) => State::After { user_seq },
            (false, None) => State::Waiting,
        };
    }

    /// A tool's call, output or result, or an approval answered, in our leg: a line on stderr.
    fn tool_event(&mut self, e: &pb::Event) {
        match &e.kind {
            Some(Kind::ToolCall(_)) => self.answer.need_sep = true,
            Some(Kind::ApprovalResolved(r)) => {
                self.pending.retain(|p| p.request_id != r.request_id);
                if self.asked.as_deref() == Some(r.request_id.as_str()) {
                    self.asked = None;
                }
            }
            _ => {}
        }
        for p in self.render.event(e) {
            if let (false, Piece::Line { text, .. }) = (self.json, p) {
                self.note(&text);
            }
        }
    }

    fn approval_requested(&mut self, e: &pb::Event, a: &pb::ApprovalRequested) {
        self.render.event(e);
        self.settle_or_queue(Pending {
            request_id: a.request_id.clone(),
            tool: a.tool.clone(),
            reason: a.reason.clone(),
            plan: plan_text(a.input.as_ref()),
        });
    }

    /// Ours: the first run_finished after our prompt's leg began, or a cancel
    /// that discarded it queued.
    fn run_finished(&mut self, seq: u64, r: &pb::RunFinished) -> Step {
        let queued = self.admitted.as_ref().is_some_and(|a| a.queued);
        let ours = match self.state.user_seq() {
            Some(u) => seq > u,
            None => queued && r.outcome() == pb::RunOutcome::Cancelled,
        };
        match ours {
            true => Step::Exit(self.run_over(r.outcome().json_name(), &r.message)),
            false => Step::Continue,
        }
    }

    /// Our run is over (`outcome`, `message`: its run_finished's): ends the
    /// answer and says how it ended; the exit code.
    fn run_over(&mut self, outcome: &str, message: &str) -> i32 {
        if !self.json {
            self.answer.finish(&mut self.out);
            if self.state.user_seq().is_none() {
                self.note("run cancelled before the prompt ran");
            } else if outcome != "completed" {
                self.note(&format!("run {outcome}: {}", clean(message)));
            }
        }
        match outcome {
            "completed" => EXIT_COMPLETED,
            "cancelled" => EXIT_CANCELLED,
            _ => EXIT_FAILED,
        }
    }

    /// The stream resynced: the transcript stands for every frame up to its
    /// seq and the stream goes on after it; questions still open are asked again.
    fn resynced(&mut self, r: Resync) -> Step {
        let Resync {
            event,
            transcript: t,
            pending_approvals,
            finished_runs,
            ..
        } = r;
        if self.json {
            self.emit_json(&event);
        }
        // Before our prompt is sent, nothing of it can be in a transcript.
        if self.state == State::Opening {
            return Step::Continue;
        }
        self.note("resynced from the transcript");
        self.pending.clear();
        self.asked = None;
        self.catch_up(&t);
        // Our run may have ended at or before the transcript's seq: its
        // run_finished is then behind the new stream's start.
        let after_seq = self.admitted.as_ref().map_or(0, |a| a.after_seq);
        let queued = self.admitted.as_ref().is_some_and(|a| a.queued);
        let ended = finished_runs.iter().find(|r| match self.state.user_seq() {
            Some(u) => r.seq > u,
            None => queued && r.status() == pb::ItemStatus::Cancelled && r.seq > after_seq,
        });
        if let Some(r) = ended {
            return Step::Exit(self.run_over(r.status().json_name(), &r.text));
        }
        if self.state.ours() {
            for a in pending_approvals {
                self.settle_or_queue(Pending {
                    plan: plan_text(a.input.as_ref()),
                    request_id: a.request_id,
                    tool: a.tool,
                    reason: a.text,
                });
            }
        }
        Step::Continue
    }

    /// Finds our prompt in the transcript (every event our input causes is
    /// after the admission's after_seq) and prints what the answer misses of it.
    fn catch_up(&mut self, t: &pb::Transcript) {
        let after_seq = self.admitted.as_ref().map_or(0, |a| a.after_seq);
        let known = self.state.user_seq();
        let user = t.messages.iter().rposition(|m| {
            m.role() == pb::MessageRole::User
                && known.map_or(m.text == self.prompt && m.seq > after_seq, |s| m.seq == s)
        });
        let Some(i) = user else { return };
        let user_seq = t.messages[i].seq;
        self.state = match t.messages[i + 1..]
            .iter()
            .any(|m| m.role() == pb::MessageRole::User)
        {
            false => State::Ours { user_seq },
            true => State::After { user_seq },
        };
        if self.json {
            return;
        }
        let full = transcript_answer(t, i);
        match full.strip_prefix(self.answer.printed.as_str()) {
            Some(rest) => {
                let rest = rest.to_string();
                self.answer.write(&mut self.out, &rest);
            }
            None => self.note("resynced: the text above differs from the transcript"),
        }
        self.answer.need_sep = t
            .messages
            .last()
            .is_some_and(|m| m.role() == pb::MessageRole::Tool);
    }

    /// What the policy says to a question of our leg: Some(answer) at once, None: ask.
    fn verdict(&self) -> Option<bool> {
        match self.policy {
            Policy::Allow => Some(true),
            Policy::Deny => Some(false),
            Policy::Ask if self.stdin_closed => Some(false),
            Policy::Ask => None,
        }
    }

    /// Answers a question of our leg at once (`verdict`), or queues it to be asked.
    fn settle_or_queue(&mut self, p: Pending) {
        let Some(v) = self.verdict() else {
            self.pending.push_back(p);
            return;
        };
        if !self.json {
            let how = if v { "approving" } else { "denying" };
            self.note(&format!("{how} {}: {}", p.tool, tool_text(&p.tool, &p.reason)));
        }
        let reason = if v { "" } else { "vak term --approve deny" };
        self.effects
            .push(Effect::Answer(approval(&self.sid, &p.request_id, v, reason)));
    }

    /// Before waiting for the next update: with no one left to ask, what is
    /// still waiting is denied; else the next queued question is asked, one at a time.
    pub(crate) fn ask_next(&mut self) {
        if self.stdin_closed {
            for p in std::mem::take(&mut self.pending) {
                self.effects
                    .push(Effect::Answer(approval(&self.sid, &p.request_id, false, "")));
            }
        }
        if self.asked.is_some() || self.policy != Policy::Ask {
            return;
        }
        let Some(p) = self.pending.front() else { return };
        let (tool, question, plan) = (p.tool.clone(), tool_text(&p.tool, &p.reason), p.plan.clone());
        let request_id = p.request_id.clone();
        let choices = if tool == PLAN_TOOL {
            self.note("── the plan to approve ──");
            for l in clean(&plan).trim_end().split('\n') {
                self.note(l);
            }
            "[y]es, then ask before edits / [e] yes, accept edits / [n]o, keep planning"
        } else {
            "[y]es / [n]o / [a]lways allow in this workspace"
        };
        self.note(&format!("{tool} wants approval: {question}  {choices} "));
        self.asked = Some(request_id);
        self.effects.push(Effect::ReadStdin);
    }

    /// A line from stdin answers the question asked (None: stdin closed,
    /// which denies it and every later one); a line that is no answer asks again.
    pub(crate) fn answered(&mut self, line: Option<String>) -> Step {
        let Some(p) = self.pending.pop_front() else {
            return Step::Continue;
        };
        self.asked = None;
        let plan = p.tool == PLAN_TOOL;
        let mut req = approval(&self.sid, &p.request_id, true, "");
        let answered = match line {
            None => {
                self.stdin_closed = true;
                self.note("stdin closed: denying");
                req.approve = Some(false);
                true
            }
            Some(l) => match l.to_ascii_lowercase().as_str() {
                "y" | "yes" => true,
                "n" | "no" => {
                    req.approve = Some(false);
                    true
                }
                "a" | "always" if !plan => {
                    req.always = Some(true);
                    true
                }
                "e" if plan => {
                    req.mode = Some(pb::PlanExitMode::AcceptEdits as i32);
                    true
                }
                _ => false,
            },
        };
        if answered {
            self.effects.push(Effect::Answer(req));
        } else {
            self.pending.push_front(p); // asked again
        }
        Step::Continue
    }

    /// Ctrl-C: the first cancels the run, a second quits without waiting for it to settle.
    pub(crate) fn interrupt(&mut self) -> Step {
        if self.interrupted {
            self.answer.finish(&mut self.out);
            return Step::Exit(EXIT_CANCELLED);
        }
        self.interrupted = true;
        self.note("cancelling the run (Ctrl-C again to quit)");
        self.effects.push(Effect::Cancel);
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the renderer printed: stdout, and the note lines.
    #[derive(Default)]
    struct Rec {
        stdout: String,
        notes: Vec<String>,
    }

    impl Out for Rec {
        fn stdout(&mut self, s: &[u8]) {
            self.stdout.push_str(&String::from_utf8_lossy(s));
        }
        fn note(&mut self, line: &str) {
            self.notes.push(line.to_string());
        }
    }

    const OURS: &str = "term_ours";

    fn renderer(json: bool, policy: Policy) -> Renderer<Rec> {
        Renderer::new(Rec::default(), "s1".into(), "p".into(), json, policy, false)
    }

    fn ev(seq: u64, kind: Kind) -> Update {
        Update::Event(pb::Event {
            seq,
            session_id: "s1".into(),
            kind: Some(kind),
        })
    }

    fn opened() -> Update {
        ev(0, Kind::StreamOpened(pb::StreamOpened::default()))
    }

    fn user(seq: u64, request_id: &str) -> Update {
        ev(
            seq,
            Kind::UserMessage(pb::UserMessage {
                text: "p".into(),
                request_id: request_id.into(),
                ..Default::default()
            }),
        )
    }

    fn text(seq: u64, t: &str) -> Update {
        ev(seq, Kind::TextDelta(pb::TextDelta { text: t.into() }))
    }

    fn finished(seq: u64, outcome: &str, message: &str) -> Update {
        ev(
            seq,
            Kind::RunFinished(pb::RunFinished {
                outcome: pb::RunOutcome::from_json_name(outcome).expect("an outcome") as i32,
                message: message.into(),
                stop_reason: None,
            }),
        )
    }

    fn asks(seq: u64, request_id: &str) -> Update {
        ev(
            seq,
            Kind::ApprovalRequested(pb::ApprovalRequested {
                request_id: request_id.into(),
                tool: "bash".into(),
                reason: "ls".into(),
                ..Default::default()
            }),
        )
    }

    /// Opened and admitted to run at once, after seq 3.
    fn started(json: bool, policy: Policy) -> Renderer<Rec> {
        started_as(json, policy, "started")
    }

    /// Opened and admitted (`state`: "started" or "queued"), after seq 3.
    fn started_as(json: bool, policy: Policy, state: &str) -> Renderer<Rec> {
        let mut r = renderer(json, policy);
        assert_eq!(r.update(opened()), Step::Opened);
        let a = pb::Admission {
            request_id: OURS.into(),
            state: pb::AdmissionState::from_json_name(state).expect("a state") as i32,
            after_seq: 3,
            ..Default::default()
        };
        r.admitted(OURS.into(), &a);
        assert_eq!(r.state(), State::Waiting);
        r
    }

    fn feed(r: &mut Renderer<Rec>, updates: Vec<Update>) -> Vec<Step> {
        updates.into_iter().map(|u| r.update(u)).collect()
    }

    fn approve(rid: &str, approve: bool, reason: &str) -> Effect {
        Effect::Answer(approval("s1", rid, approve, reason))
    }

    #[test]
    fn opening_waits_for_stream_opened_and_says_when_it_reconnects() {
        let mut r = renderer(false, Policy::Ask);
        assert_eq!(r.update(text(1, "old")), Step::Continue);
        assert_eq!(r.update(Update::Reconnecting("gone".into())), Step::Continue);
        assert_eq!(
            r.update(Update::Reconnecting("still gone".into())),
            Step::Continue
        );
        assert_eq!(r.state(), State::Opening);
        assert_eq!(r.update(opened()), Step::Opened);
        assert_eq!(r.out.notes, ["reconnecting: gone", "reconnected"]);
        assert_eq!(r.out.stdout, "", "nothing before the run is ours");
    }

    #[test]
    fn a_completed_run_prints_its_leg_only_and_exits_0() {
        let mut r = started(false, Policy::Ask);
        let steps = feed(
            &mut r,
            vec![
                user(4, "someone_else"),
                text(5, "not ours"),
                finished(6, "completed", ""),
                user(7, OURS),
                text(8, "echo: "),
                text(9, "p"),
                ev(10, Kind::ToolCall(pb::ToolCall::default())),
                text(11, "after the tool"),
            ],
        );
        assert!(steps.iter().all(|s| *s == Step::Continue), "{steps:?}");
        assert_eq!(r.state(), State::Ours { user_seq: 7 });
        assert_eq!(
            r.update(finished(12, "completed", "")),
            Step::Exit(EXIT_COMPLETED)
        );
        assert_eq!(r.out.stdout, "echo: p\nafter the tool\n");
        assert!(
            !r.out.notes.iter().any(|n| n.starts_with("run ")),
            "{:?}",
            r.out.notes
        );
    }

    #[test]
    fn a_background_result_before_our_leg_is_a_note_never_part_of_the_answer() {
        let bg = |alert: bool| {
            let mut b = pb::BackgroundResult {
                id: "task_0123456789ab".into(),
                text: if alert {
                    "exit code 3\nno disk"
                } else {
                    "all quiet"
                }
                .into(),
                alert,
                ..Default::default()
            };
            b.set_source(pb::BackgroundSource::Script);
            if alert {
                b.set_reason(pb::BackgroundReason::ScriptFailed);
            }
            Kind::BackgroundResult(b)
        };
        let mut r = started_as(false, Policy::Ask, "queued");
        feed(
            &mut r,
            vec![
                ev(4, bg(false)),
                ev(5, bg(true)),
                user(6, OURS),
                text(7, "answer"),
            ],
        );
        assert_eq!(r.update(finished(8, "completed", "")), Step::Exit(EXIT_COMPLETED));
        assert_eq!(r.out.stdout, "answer\n");
        assert_eq!(
            r.out.notes,
            [
                "⟲ background (script task_0123456789ab): all quiet",
                "⚠ script_failed (script task_0123456789ab): exit code 3",
                "  no disk",
            ]
        );
        // In JSON mode it is a line like every other frame, and no note.
        let mut r = started(true, Policy::Ask);
        feed(&mut r, vec![ev(4, bg(false))]);
        assert!(
            r.out.stdout.contains(r#""background_result":{"source":"script""#),
            "{}",
            r.out.stdout
        );
        assert!(r.out.notes.is_empty(), "{:?}", r.out.notes);
    }

    #[test]
    fn a_retry_of_our_run_is_a_note_never_part_of_the_answer() {
        let retrying = |attempt| {
            Kind::Status(pb::Status {
                busy: true,
                retrying: Some(pb::Retrying {
                    attempt,
                    of: 2,
                    reason: "could not reach the model service at 127.0.0.1:9 (connection refused)".into(),
                }),
            })
        };
        let mut r = started(false, Policy::Ask);
        feed(
            &mut r,
            vec![user(4, OURS), ev(5, retrying(1)), ev(6, retrying(2))],
        );
        let failed = finished(7, "failed", "could not reach the model service at 127.0.0.1:9");
        assert_eq!(r.update(failed), Step::Exit(EXIT_FAILED));
        assert_eq!(r.out.stdout, "");
        assert_eq!(
            r.out.notes,
            [
                "retrying 1/2: could not reach the model service at 127.0.0.1:9 (connection refused)",
                "retrying 2/2: could not reach the model service at 127.0.0.1:9 (connection refused)",
                "run failed: could not reach the model service at 127.0.0.1:9",
            ]
        );
    }

    #[test]
    fn each_way_a_run_ends_has_its_exit_code_and_note() {
        for (outcome, code, note) in [
            ("completed", EXIT_COMPLETED, None),
            ("failed", EXIT_FAILED, Some("run failed: boom")),
            ("cancelled", EXIT_CANCELLED, Some("run cancelled: boom")),
            ("max_turns", EXIT_FAILED, Some("run max_turns: boom")),
        ] {
            let mut r = started(false, Policy::Ask);
            feed(&mut r, vec![user(4, OURS), text(5, "half")]);
            assert_eq!(
                r.update(finished(6, outcome, "boom")),
                Step::Exit(code),
                "{outcome}"
            );
            assert_eq!(r.out.stdout, "half\n", "the answer ends with a newline");
            assert_eq!(r.out.notes.last().map(String::as_str), note, "{outcome}");
        }
    }

    #[test]
    fn a_queued_run_cancelled_before_it_began_exits_130() {
        // Admitted to run at once, a cancelled run before our prompt is another's.
        let mut running = started(false, Policy::Ask);
        assert_eq!(running.update(finished(4, "cancelled", "")), Step::Continue);
        let mut r = started_as(false, Policy::Ask, "queued");
        assert_eq!(
            r.update(finished(4, "completed", "")),
            Step::Continue,
            "the run ahead of ours"
        );
        assert_eq!(r.update(finished(5, "cancelled", "")), Step::Exit(EXIT_CANCELLED));
        assert_eq!(r.out.notes, ["run cancelled before the prompt ran"]);
    }

    #[test]
    fn another_prompt_after_ours_is_not_printed_but_our_run_still_ends() {
        let mut r = started(false, Policy::Ask);
        feed(
            &mut r,
            vec![
                user(4, OURS),
                text(5, "mine"),
                user(6, "steer"),
                text(7, "theirs"),
            ],
        );
        assert_eq!(r.state(), State::After { user_seq: 4 });
        assert_eq!(r.update(finished(8, "completed", "")), Step::Exit(EXIT_COMPLETED));
        assert_eq!(r.out.stdout, "mine\n");
    }

    #[test]
    fn json_mode_prints_every_frame_and_no_text() {
        let mut r = renderer(true, Policy::Ask);
        r.update(opened());
        let a = pb::Admission {
            request_id: OURS.into(),
            state: pb::AdmissionState::Started as i32,
            ..Default::default()
        };
        r.admitted(OURS.into(), &a);
        feed(&mut r, vec![user(1, OURS), text(2, "hi")]);
        assert_eq!(r.update(finished(3, "failed", "x")), Step::Exit(EXIT_FAILED));
        let lines: Vec<&str> = r.out.stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[2].contains("\"hi\""), "{}", lines[2]);
        assert!(r.out.notes.is_empty(), "{:?}", r.out.notes);
    }

    #[test]
    fn questions_are_asked_one_at_a_time_until_answered() {
        let mut r = started(false, Policy::Ask);
        feed(
            &mut r,
            vec![user(4, OURS), asks(5, "a1"), asks(6, "a2"), text(7, "not yet")],
        );
        assert!(r.effects().is_empty(), "nothing answered at once");
        r.ask_next();
        assert!(r.asking());
        assert_eq!(r.effects(), [Effect::ReadStdin]);
        assert!(r.out.notes.last().unwrap().starts_with("bash wants approval: "));
        r.ask_next();
        assert!(r.effects().is_empty(), "one question at a time");
        assert_eq!(r.answered(Some("what?".into())), Step::Continue);
        assert!(r.effects().is_empty(), "no answer: asked again");
        r.ask_next();
        assert_eq!(r.effects(), [Effect::ReadStdin]);
        r.answered(Some("y".into()));
        assert_eq!(r.effects(), [approve("a1", true, "")]);
        r.ask_next();
        assert_eq!(r.effects(), [Effect::ReadStdin]);
        // stdin closes: this one and every later one are denied.
        r.answered(None);
        assert_eq!(r.effects(), [approve("a2", false, "")]);
        assert!(r.out.notes.contains(&"stdin closed: denying".to_string()));
        r.update(asks(8, "a3"));
        assert_eq!(r.effects(), [approve("a3", false, "vak term --approve deny")]);
        assert_eq!(r.out.notes.last().unwrap(), "denying bash: ls");
    }

    #[test]
    fn a_question_answered_elsewhere_is_not_asked_and_others_legs_are_not_ours() {
        let mut r = started(false, Policy::Ask);
        r.update(asks(4, "before_ours"));
        feed(&mut r, vec![user(5, OURS), asks(6, "a1")]);
        feed(
            &mut r,
            vec![ev(
                7,
                Kind::ApprovalResolved(pb::ApprovalResolved {
                    request_id: "a1".into(),
                    ..Default::default()
                }),
            )],
        );
        r.ask_next();
        assert!(!r.asking());
        assert!(r.effects().is_empty());
    }

    #[test]
    fn the_policy_answers_at_once() {
        let mut r = started(false, Policy::Allow);
        feed(&mut r, vec![user(4, OURS), asks(5, "a1")]);
        assert_eq!(r.effects(), [approve("a1", true, "")]);
        assert_eq!(r.out.notes.last().unwrap(), "approving bash: ls");
        r.ask_next();
        assert!(!r.asking());
    }

    #[test]
    fn ctrl_c_cancels_and_a_second_quits_with_130() {
        let mut r = started(false, Policy::Ask);
        feed(&mut r, vec![user(4, OURS), text(5, "part")]);
        assert_eq!(r.interrupt(), Step::Continue);
        assert_eq!(r.effects(), [Effect::Cancel]);
        assert_eq!(r.interrupt(), Step::Exit(EXIT_CANCELLED));
        assert_eq!(r.out.stdout, "part\n");
    }

    fn msg(role: &str, text: &str) -> pb::Message {
        pb::Message {
            role: pb::MessageRole::from_json_name(role).expect("a role") as i32,
            text: text.into(),
            ..Default::default()
        }
    }

    fn resync(messages: Vec<pb::Message>, finished_runs: Vec<pb::TimelineItem>) -> Update {
        Update::Resynced(Box::new(Resync {
            event: pb::Event::default(),
            transcript: pb::Transcript {
                messages,
                ..Default::default()
            },
            pending_approvals: Vec::new(),
            finished_runs,
            busy: false,
        }))
    }

    #[test]
    fn a_resync_prints_only_what_is_missing_and_may_end_the_run() {
        let mut r = started(false, Policy::Ask);
        feed(&mut r, vec![user(4, OURS), text(5, "echo: ")]);
        let mut prompt = msg("user", "p");
        prompt.seq = 4;
        let mut answer = msg("assistant", "echo: p");
        answer.seq = 6;
        assert_eq!(
            r.update(resync(vec![prompt.clone(), answer.clone()], Vec::new())),
            Step::Continue
        );
        assert_eq!(r.out.stdout, "echo: p");
        assert_eq!(r.state(), State::Ours { user_seq: 4 });
        let end = pb::TimelineItem {
            seq: 7,
            status: pb::ItemStatus::Completed as i32,
            ..Default::default()
        };
        assert_eq!(
            r.update(resync(vec![prompt, answer], vec![end])),
            Step::Exit(EXIT_COMPLETED)
        );
        assert_eq!(r.out.stdout, "echo: p\n");
        assert_eq!(
            r.out.notes,
            ["resynced from the transcript", "resynced from the transcript"]
        );
    }

    #[test]
    fn a_resync_finds_our_prompt_by_its_text_after_the_admission() {
        let mut r = started(false, Policy::Ask);
        let mut old = msg("user", "p");
        old.seq = 2;
        let mut ours = msg("user", "p");
        ours.seq = 5;
        let mut tool = msg("tool", "ran");
        tool.seq = 6;
        r.update(resync(
            vec![old, msg("assistant", "before"), ours, tool],
            Vec::new(),
        ));
        assert_eq!(r.state(), State::Ours { user_seq: 5 });
        r.update(text(7, "then"));
        assert_eq!(
            r.out.stdout, "then",
            "nothing printed before the tool: no separator"
        );
    }

    #[test]
    fn the_transcript_answer_matches_the_live_text() {
        let t = pb::Transcript {
            messages: vec![
                msg("user", "old"),
                msg("assistant", "echo: old"),
                msg("user", "p"),
                msg("assistant", "echo: before"),
                msg("tool", "wrote"),
                msg("assistant", "echo: after"),
                msg("user", "next"),
                msg("assistant", "echo: next"),
            ],
            ..Default::default()
        };
        // As printed live: the text after a tool starts on a line of its own; the leg ends at the next prompt.
        assert_eq!(transcript_answer(&t, 2), "echo: before\necho: after");
        assert_eq!(transcript_answer(&t, 0), "echo: old");
    }
}
