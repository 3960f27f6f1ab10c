//! The one-shot run's renderer as a state machine: where the run is (`State`),
//! one function per kind of update, what it prints (through `Out`), what it
//! asks the driver to do (`Effect`) and when the run is over (`Step::Exit`).

use super::conn::approval;
use super::follow::{Resync, Update};
use super::render::{
    background_lines, clean, plan_text, retrying_line, stopped_line, tool_text, Piece, Render, PLAN_TOOL,
};
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
            true => Step::Exit(self.run_over(r.outcome().json_name(), &r.message, r.stop_reason)),
            false => Step::Continue,
        }
    }

    /// Our run is over (`outcome`, `message`, `stop_reason`: its
    /// run_finished's): ends the answer and says how it ended (and when its
    /// reply was cut or stopped: `⚠ cut at the output limit`); the exit code.
    fn run_over(&mut self, outcome: &str, message: &str, stop_reason: Option<i32>) -> i32 {
        if !self.json {
            self.answer.finish(&mut self.out);
            if self.state.user_seq().is_none() {
                self.note("run cancelled before the prompt ran");
            } else if outcome != "completed" {
                self.note(&format!("run {outcome}: {}", clean(message)));
            }
            if let Some(line) = stopped_line(outcome, message, stop_reason) {
                self.note(&line);
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
            // The timeline item has no stop_reason; the transcript's "run" entry for it does.
            let stop_reason = t
                .messages
                .iter()
                .find(|m| m.role() == pb::MessageRole::Run && m.seq == r.seq)
                .and_then(|m| m.stop_reason);
            return Step::Exit(self.run_over(r.status().json_name(), &r.text, stop_reason));
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
        // Said once, by the approval_resolved line the answer brings
        // ("✗ bash denied: vak term --approve deny"); the call line above says what.
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
mod tests;
