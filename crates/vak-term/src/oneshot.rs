//! `vak term -p PROMPT`: one run, its answer on stdout (or every frame as a JSON line), and an exit code that says how it ended.

use super::conn::{
    answer_always_or_once, approval, cancel_call, retry, run_call, FailKind, Failure, Transport,
};
use super::follow::{follow, Resync, Update};
use super::render::{always_line, clean, plan_text, tool_text, Piece, Render, PLAN_TOOL};
use super::Policy;
use pb::event::Kind;
use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use vak_proto::json::to_json;
use vak_proto::v1 as pb;

/// Exit codes: completed, failed (the run, or vak term itself), cancelled.
pub const EXIT_COMPLETED: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_CANCELLED: i32 = 130;

/// A one-shot run stops trying to reach a server that has been away this long.
const GIVE_UP: Duration = Duration::from_secs(60);

pub struct OneShot {
    pub prompt: String,
    pub json: bool,
    pub policy: Policy,
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
    fn push(&mut self, text: &str) {
        let mut s = String::new();
        if self.need_sep && !self.printed.is_empty() && !self.printed.ends_with('\n') {
            s.push('\n');
        }
        self.need_sep = false;
        s.push_str(text);
        self.write(&s);
    }

    fn write(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.printed.push_str(s);
        let shown = if self.clean { clean(s) } else { s.to_string() };
        let mut out = std::io::stdout().lock();
        // A closed stdout (`| head`) is the reader's choice, not an error of the run.
        let _ = out.write_all(shown.as_bytes()).and_then(|_| out.flush());
    }

    fn finish(&mut self) {
        if !self.printed.is_empty() && !self.printed.ends_with('\n') {
            self.write("\n");
        }
    }
}

/// The answer text of the leg whose user message is `user`, rebuilt from the
/// transcript exactly as `Answer::push` would have printed it live.
fn transcript_answer(t: &pb::Transcript, user: usize) -> String {
    let mut a = String::new();
    let mut need_sep = false;
    for m in &t.messages[user + 1..] {
        match m.role.as_str() {
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

/// Progress and outcome notes go to stderr, so stdout holds only the answer (or the JSON lines).
fn note(msg: &str) {
    eprintln!("vak: {msg}");
}

/// Reads answers to approval questions from stdin, one line each, on a thread
/// of its own (stdin has no async reader that can be abandoned mid-read).
fn stdin_lines() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        loop {
            let mut line = String::new();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    if tx.send(Some(line.trim().to_string())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

struct Pending {
    request_id: String,
    tool: String,
    reason: String,
    /// exit_plan_mode's plan, shown whole before its question.
    plan: String,
}

pub async fn run(conn: Arc<dyn Transport>, sid: String, after: u64, o: OneShot) -> vak_proto::Result<i32> {
    let json = o.json;
    let mut answer = Answer {
        clean: std::io::stdout().is_terminal(),
        ..Answer::default()
    };
    let emit_json = |e: &pb::Event| {
        let mut line = to_json(e);
        line.push(b'\n');
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&line).and_then(|_| out.flush());
    };

    // Ctrl-C cancels the run instead of killing the process; registered
    // before the run exists, so no interrupt can fall in between.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;

    // Open the stream first and wait until it is open, so the run is seen from
    // its first frame; `after` also replays anything published since the
    // caller looked at the session.
    let mut follower = follow(conn.clone(), sid.clone(), Some(after), Some(GIVE_UP));
    let mut reconnecting = false;
    loop {
        match follower.updates.recv().await {
            None => return Err(vak_proto::Error::internal("the event stream stopped")),
            Some(Update::Fatal(f)) => return Err(f.into()),
            Some(Update::Reconnecting(why)) => {
                if !reconnecting {
                    note(&format!("reconnecting: {why}"));
                    reconnecting = true;
                }
            }
            Some(Update::Event(e)) => {
                if json {
                    emit_json(&e);
                }
                if matches!(e.kind, Some(Kind::StreamOpened(_))) {
                    if reconnecting {
                        note("reconnected");
                        reconnecting = false;
                    }
                    break;
                }
            }
            // Before our prompt is sent, nothing of it can be in a transcript.
            Some(Update::Resynced(r)) => {
                if json {
                    emit_json(&r.event);
                }
            }
        }
    }

    let request_id = format!("term_{}", uuid::Uuid::new_v4().simple());
    let admission = retry(run_call(
        &conn,
        pb::RunRequest {
            session_id: sid.clone(),
            prompt: o.prompt.clone(),
            request_id: request_id.clone(),
            ..Default::default()
        },
    ))
    .await?;
    let queued = admission.state == "queued";

    let mut render = Render::default();
    let mut in_our_leg = false;
    let mut our_user_seq: Option<u64> = None;
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut asked: Option<String> = None;
    let mut answers: Option<mpsc::UnboundedReceiver<Option<String>>> = None;
    let mut stdin_closed = false;
    let mut interrupted = false;

    loop {
        // With no one left to ask, what is still waiting is denied.
        if stdin_closed {
            for p in pending.drain(..) {
                spawn_answer(&conn, approval(&sid, &p.request_id, false, ""));
            }
        }
        // Ask the next queued approval question, one at a time.
        if asked.is_none() {
            if let Some(p) = pending.front() {
                if o.policy == Policy::Ask {
                    let choices = if p.tool == PLAN_TOOL {
                        note("── the plan to approve ──");
                        for l in clean(&p.plan).trim_end().split('\n') {
                            note(l);
                        }
                        "[y]es, then ask before edits / [e] yes, accept edits / [n]o, keep planning"
                    } else {
                        "[y]es / [n]o / [a]lways allow in this workspace"
                    };
                    eprintln!(
                        "vak: {} wants approval: {}  {choices} ",
                        p.tool,
                        tool_text(&p.tool, &p.reason),
                    );
                    asked = Some(p.request_id.clone());
                    answers.get_or_insert_with(stdin_lines);
                }
            }
        }
        let update = tokio::select! {
            u = follower.updates.recv() => u,
            line = async { answers.as_mut().unwrap().recv().await }, if asked.is_some() => {
                let Some(p) = pending.pop_front() else { continue };
                asked = None;
                let plan = p.tool == PLAN_TOOL;
                let mut req = approval(&sid, &p.request_id, true, "");
                let answered = match line.flatten() {
                    None => {
                        stdin_closed = true;
                        note("stdin closed: denying");
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
                            req.mode = Some("accept-edits".into());
                            true
                        }
                        _ => false,
                    },
                };
                if answered {
                    spawn_answer(&conn, req);
                } else {
                    pending.push_front(p); // asked again
                }
                continue;
            }
            _ = sigint.recv() => {
                if interrupted {
                    // A second Ctrl-C quits without waiting for the run to settle.
                    answer.finish();
                    return Ok(EXIT_CANCELLED);
                }
                interrupted = true;
                note("cancelling the run (Ctrl-C again to quit)");
                let (c, s) = (conn.clone(), sid.clone());
                tokio::spawn(async move {
                    if let Err(f) = retry(cancel_call(&c, &s)).await {
                        note(&format!("cannot cancel: {f}"));
                    }
                });
                continue;
            }
        };
        let e = match update {
            None => return Err(vak_proto::Error::internal("the event stream stopped")),
            Some(Update::Fatal(f)) => return Err(f.into()),
            Some(Update::Reconnecting(why)) => {
                if !reconnecting {
                    note(&format!("reconnecting: {why}"));
                    reconnecting = true;
                }
                continue;
            }
            Some(Update::Resynced(r)) => {
                let Resync {
                    event,
                    transcript: t,
                    pending_approvals,
                    finished_runs,
                    ..
                } = *r;
                if json {
                    emit_json(&event);
                }
                note("resynced from the transcript");
                // The transcript stands for every frame up to its seq; the
                // stream goes on after it. Questions still open are asked again.
                pending.clear();
                asked = None;
                // Ours: every event our input causes is after the admission's after_seq.
                let user = t.messages.iter().rposition(|m| {
                    m.role == "user"
                        && our_user_seq
                            .map_or(m.text == o.prompt && m.seq > admission.after_seq, |s| m.seq == s)
                });
                if let Some(i) = user {
                    in_our_leg = !t.messages[i + 1..].iter().any(|m| m.role == "user");
                    our_user_seq = Some(t.messages[i].seq);
                    if !json {
                        let full = transcript_answer(&t, i);
                        match full.strip_prefix(answer.printed.as_str()) {
                            Some(rest) => {
                                let rest = rest.to_string();
                                answer.write(&rest);
                            }
                            None => note("resynced: the text above differs from the transcript"),
                        }
                        answer.need_sep = t.messages.last().is_some_and(|m| m.role == "tool");
                    }
                }
                // Our run may have ended at or before the transcript's seq: its
                // run_finished is then behind the new stream's start.
                let ended = finished_runs.iter().find(|r| match our_user_seq {
                    Some(u) => r.seq > u,
                    None => queued && r.status == "cancelled" && r.seq > admission.after_seq,
                });
                if let Some(r) = ended {
                    return Ok(run_over(
                        &mut answer,
                        json,
                        our_user_seq.is_some(),
                        &r.status,
                        &r.text,
                    ));
                }
                if in_our_leg {
                    for a in pending_approvals {
                        let v = verdict(o.policy, stdin_closed);
                        let p = Pending {
                            plan: plan_text(a.input.as_ref()),
                            request_id: a.request_id,
                            tool: a.tool,
                            reason: a.text,
                        };
                        settle_or_queue(v, &conn, &sid, json, &mut pending, p);
                    }
                }
                continue;
            }
            Some(Update::Event(e)) => e,
        };
        if json {
            emit_json(&e);
        }
        let Some(kind) = &e.kind else { continue };
        match kind {
            Kind::StreamOpened(_) if reconnecting => {
                note("reconnected");
                reconnecting = false;
            }
            Kind::UserMessage(m) => {
                in_our_leg = m.request_id == request_id;
                if in_our_leg {
                    our_user_seq = Some(e.seq);
                }
            }
            Kind::TextDelta(t) if in_our_leg && !json => answer.push(&t.text),
            Kind::ToolCall(_) | Kind::ToolOutput(_) | Kind::ToolResult(_) | Kind::ApprovalResolved(_)
                if in_our_leg =>
            {
                if matches!(kind, Kind::ToolCall(_)) {
                    answer.need_sep = true;
                }
                if let Kind::ApprovalResolved(r) = kind {
                    pending.retain(|p| p.request_id != r.request_id);
                    if asked.as_deref() == Some(r.request_id.as_str()) {
                        asked = None;
                    }
                }
                for p in render.event(&e) {
                    if let (false, Piece::Line { text, .. }) = (json, p) {
                        eprintln!("vak: {text}");
                    }
                }
            }
            Kind::ApprovalRequested(a) if in_our_leg => {
                render.event(&e);
                let v = verdict(o.policy, stdin_closed);
                let p = Pending {
                    request_id: a.request_id.clone(),
                    tool: a.tool.clone(),
                    reason: a.reason.clone(),
                    plan: plan_text(a.input.as_ref()),
                };
                settle_or_queue(v, &conn, &sid, json, &mut pending, p);
            }
            Kind::Notice(n) if in_our_leg && !json => note(&format!("! {}", clean(&n.text))),
            // Ours: the first after our prompt's leg began, or a cancel that discarded it queued.
            Kind::RunFinished(r)
                if our_user_seq.map_or(queued && r.outcome == "cancelled", |u| e.seq > u) =>
            {
                return Ok(run_over(
                    &mut answer,
                    json,
                    our_user_seq.is_some(),
                    &r.outcome,
                    &r.message,
                ));
            }
            _ => {}
        }
    }
}

/// Our run is over (`outcome`, `message`: its run_finished's): ends the answer
/// and says how it ended; the exit code. `ran`: our prompt's leg began.
fn run_over(answer: &mut Answer, json: bool, ran: bool, outcome: &str, message: &str) -> i32 {
    if !json {
        answer.finish();
        if !ran {
            note("run cancelled before the prompt ran");
        } else if outcome != "completed" {
            note(&format!("run {outcome}: {}", clean(message)));
        }
    }
    match outcome {
        "completed" => EXIT_COMPLETED,
        "cancelled" => EXIT_CANCELLED,
        _ => EXIT_FAILED,
    }
}

/// What the policy says to a question of our leg: Some(answer) at once, None: ask.
fn verdict(policy: Policy, stdin_closed: bool) -> Option<bool> {
    match policy {
        Policy::Allow => Some(true),
        Policy::Deny => Some(false),
        Policy::Ask if stdin_closed => Some(false),
        Policy::Ask => None,
    }
}

/// Answers a question of our leg at once (`verdict`), or queues it to be asked.
fn settle_or_queue(
    verdict: Option<bool>,
    conn: &Arc<dyn Transport>,
    sid: &str,
    json: bool,
    pending: &mut VecDeque<Pending>,
    p: Pending,
) {
    match verdict {
        Some(v) => {
            if !json {
                let how = if v { "approving" } else { "denying" };
                note(&format!("{how} {}: {}", p.tool, tool_text(&p.tool, &p.reason)));
            }
            let reason = if v { "" } else { "vak term --approve deny" };
            spawn_answer(conn, approval(sid, &p.request_id, v, reason));
        }
        None => pending.push_back(p),
    }
}

/// Sends an approval answer without holding up the stream; a failure is
/// reported, not fatal. A rule an `always` answer stored is said on stderr
/// (one that could not be stored is explained by the server's notice).
fn spawn_answer(conn: &Arc<dyn Transport>, req: pb::ApproveRequest) {
    let (conn, rid) = (conn.clone(), req.request_id.clone());
    tokio::spawn(async move {
        match answer_always_or_once(&conn, req).await {
            Ok((r, refused)) => {
                if let Some(rule) = r.rule {
                    note(&always_line(&rule));
                }
                if let Some(f) = refused {
                    note(&format!("no always-allow rule: {f}; approved once"));
                }
            }
            // Someone else answered first, or the run ended: the stream says which.
            Err(Failure {
                kind: FailKind::Conflict | FailKind::NotFound,
                ..
            }) => {}
            Err(f) => eprintln!("vak: cannot answer approval {rid}: {f}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, text: &str) -> pb::Message {
        pb::Message {
            role: role.into(),
            text: text.into(),
            ..Default::default()
        }
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
