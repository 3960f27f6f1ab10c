//! `vak term` at a terminal: a prompt that stays usable while answers stream in above it, inline approvals, steering, cancel, and reconnects that neither lose nor repeat text.

use super::conn::{
    answer_always_or_once, approval, cancel_call, retry, run_call, steer_call, FailKind, Transport,
};
use super::editor::{Action, Editor};
use super::follow::{follow, Follower, Update};
use super::render::{always_line, clean, full_output, plan_text, tool_text, Piece, Render, Style, PLAN_TOOL};
use super::screen::{PromptLine, Screen, TerminalGuard};
use super::Policy;
use crossterm::event::{Event as TermEvent, EventStream, KeyCode, KeyEventKind, KeyModifiers};
use futures_util::StreamExt;
use pb::event::Kind;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use vak_proto::v1 as pb;

/// The local commands and keys, as `/help` lists them.
pub(crate) const HELP: &[&str] = &[
    "vak term's own commands (any other line, /write or /bash included, goes to the model):",
    "  /help           this list",
    "  /show [N]       the last tool output in full; /show N the Nth (a collapsed entry names its N)",
    "  /workers        the session's workers and best-of-N candidates: state, branch, diff stat",
    "  /skills         the skills promoted for the session's workspace: each is a slash command,",
    "                  /NAME [ARGUMENTS], that asks the model to use it (the line goes to the model)",
    "  /exit, /quit    leave vak term; the session, and a run going on, stay on the server",
    "                  (vak term --session ID attaches again)",
    "  //text          sends /text to the model (//help sends \"/help\")",
    "Keys:",
    "  Enter           send; while a run is going, steer it (the text is queued as its next step)",
    "  Ctrl-C          cancel the running run; at an idle prompt, press it twice to exit",
    "  Ctrl-D          exit (on an empty line)",
    "  Up / Down       history · Ctrl-A / Ctrl-E start / end of line · Ctrl-W delete a word",
    "  Ctrl-U / Ctrl-K delete to the start / end of line · Ctrl-L clear the screen",
    "Approval questions: y approves, n denies, a approves and keeps an always-allow rule on",
    "  the server for this workspace (a command's program and subcommand, or the file): later",
    "  calls it covers run without asking, in every session and client, until the rule is",
    "  deleted (DELETE /permissions/rules/ID). A plan: y approves it (edits then ask first),",
    "  e approves it and lets edits run, n keeps plan mode.",
];

/// What a submitted line means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Command {
    Help,
    Exit,
    /// `/show` (the last tool output) or `/show N`.
    Show(Option<usize>),
    /// `/show` with something that is not a number.
    BadShow,
    /// `/workers`: the session's children.
    Workers,
    /// `/skills`: the promoted skills, each a slash command.
    Skills,
    /// Text for the model (a prompt, or steering while a run is going).
    Send(String),
}

/// Only these exact lines are vak term's own: everything else, other `/`
/// lines included, is the model's. `//` sends a line that starts with one `/`.
pub(crate) fn command(line: &str) -> Command {
    if let Some(rest) = line.strip_prefix("//") {
        return Command::Send(format!("/{rest}"));
    }
    match line.trim() {
        "/help" => Command::Help,
        "/exit" | "/quit" => Command::Exit,
        "/show" => Command::Show(None),
        "/workers" => Command::Workers,
        "/skills" => Command::Skills,
        t => match t.strip_prefix("/show ") {
            Some(n) => match n.trim().parse::<usize>() {
                Ok(n) if n > 0 => Command::Show(Some(n)),
                _ => Command::BadShow,
            },
            None => Command::Send(line.to_string()),
        },
    }
}

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
/// How often the busy indicator moves.
const TICK: Duration = Duration::from_millis(120);

pub(crate) struct Options {
    pub policy: Policy,
    /// The first lines shown: which session, which server, which transport.
    pub header: Vec<String>,
}

struct Approval {
    request_id: String,
    tool: String,
    reason: String,
    /// exit_plan_mode's: answered with the mode to leave plan mode for.
    plan: bool,
}

/// What a call made in the background reports back to the loop.
enum Notice {
    Admitted {
        state: pb::AdmissionState,
        text: String,
    },
    Failed(String),
    /// The session made for the first prompt, or why it could not be.
    Created(Result<String, String>),
    /// The always-allow rule an `[a]lways` answer stored.
    Always(pb::PermissionRule),
    /// What `/workers` asked for.
    Workers(Vec<pb::Worker>),
    /// The promoted skills: asked for with `/skills`, or looked up at the start.
    Skills {
        skills: Vec<pb::Skill>,
        asked: bool,
    },
}

struct Ui {
    conn: Arc<dyn Transport>,
    /// None until the first prompt creates the session (unless one was attached).
    sid: Option<String>,
    /// Lines sent while the session is being created, sent once it exists.
    unsent: Vec<String>,
    creating: bool,
    /// The busy indicator's frame.
    spin: usize,
    policy: Policy,
    screen: Screen,
    editor: Editor,
    render: Render,
    approvals: VecDeque<Approval>,
    busy: bool,
    cancel_sent: bool,
    /// The last key was Ctrl-C: another one exits.
    interrupted: bool,
    reconnecting: bool,
    notices: mpsc::UnboundedSender<Notice>,
}

enum Step {
    Continue,
    Exit(i32),
}

/// `session`: the attached session and its summary; None creates one with the first prompt,
/// so quitting before sending anything leaves no empty session behind.
pub(crate) async fn run(
    conn: Arc<dyn Transport>,
    session: Option<(String, pb::SessionSummary)>,
    o: Options,
) -> vak_proto::Result<i32> {
    let guard = TerminalGuard::enter()
        .map_err(|e| vak_proto::Error::internal(format!("cannot use the terminal: {e}")))?;
    let (tx, notices) = mpsc::unbounded_channel();
    let mut ui = Ui {
        conn: conn.clone(),
        sid: session.as_ref().map(|(sid, _)| sid.clone()),
        unsent: Vec::new(),
        creating: false,
        spin: 0,
        policy: o.policy,
        screen: Screen::new(),
        editor: Editor::default(),
        render: Render::interactive(),
        approvals: VecDeque::new(),
        busy: session.as_ref().is_some_and(|(_, s)| s.busy),
        cancel_sent: false,
        interrupted: false,
        reconnecting: false,
        notices: tx,
    };
    if std::env::var_os("VAK_TERM_TEST_PANIC").is_some() {
        // Lets the tests prove that a panic gives the terminal back.
        panic!("VAK_TERM_TEST_PANIC is set");
    }
    let result = event_loop(&mut ui, conn, o.header, notices).await;
    // Every way out, an error included, leaves the screen tidy for the shell.
    let _ = ui.screen.close();
    drop(guard);
    result
}

async fn next_update(follower: &mut Option<Follower>) -> Option<Update> {
    match follower {
        Some(f) => f.updates.recv().await,
        None => std::future::pending().await,
    }
}

async fn event_loop(
    ui: &mut Ui,
    conn: Arc<dyn Transport>,
    header: Vec<String>,
    mut notices: mpsc::UnboundedReceiver<Notice>,
) -> vak_proto::Result<i32> {
    // Signals that would otherwise kill the process in raw mode end the loop instead.
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut int = signal(SignalKind::interrupt())?;
    ui.show(
        header
            .into_iter()
            .map(|text| Piece::Line {
                style: Style::Info,
                text,
            })
            .collect(),
    )?;
    // The skills a person can type as slash commands, named once at the start.
    ui.skills(false);
    // From seq 0: an attached session's history replays (or is redrawn from its transcript on a resync).
    let mut follower = ui.sid.clone().map(|sid| follow(conn.clone(), sid, Some(0), None));
    let mut keys = EventStream::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let step = tokio::select! {
            u = next_update(&mut follower) => {
                let Some(mut u) = u else {
                    return Err(vak_proto::Error::internal("the event stream stopped"));
                };
                let follower = follower.as_mut().expect("an update came from it");
                let mut pieces = Vec::new();
                // Take everything already waiting, then draw once: a burst of
                // deltas costs one redraw, not one per frame.
                loop {
                    if let Err(e) = ui.update(u, &mut pieces) {
                        ui.show(pieces)?;
                        return Err(e);
                    }
                    match follower.updates.try_recv() {
                        Ok(next) if pieces.len() < 512 => u = next,
                        _ => break,
                    }
                }
                ui.show(pieces)?;
                Step::Continue
            }
            k = keys.next() => match k {
                Some(Ok(ev)) => ui.input(ev)?,
                Some(Err(e)) => return Err(vak_proto::Error::internal(format!("cannot read the terminal: {e}"))),
                None => return Err(vak_proto::Error::internal("the terminal closed")),
            },
            Some(n) = notices.recv() => {
                let p = match n {
                    Notice::Admitted {
                        state: pb::AdmissionState::Queued,
                        text,
                    } => vec![Piece::Line {
                        style: Style::Dim,
                        text: format!("⋯ queued: {}", clean(&text).replace('\n', " ⏎ ")),
                    }],
                    Notice::Admitted { .. } => Vec::new(),
                    Notice::Failed(m) => vec![Piece::Line { style: Style::Note, text: format!("✗ {m}") }],
                    Notice::Created(Ok(sid)) => {
                        ui.creating = false;
                        ui.sid = Some(sid.clone());
                        // From seq 0, like an attached session: nothing of the first run is missed.
                        follower = Some(follow(conn.clone(), sid.clone(), Some(0), None));
                        for text in std::mem::take(&mut ui.unsent) {
                            ui.send(text);
                        }
                        vec![Piece::Line { style: Style::Info, text: format!("· session {sid}") }]
                    }
                    Notice::Always(rule) => vec![Piece::Line { style: Style::Info, text: always_line(&rule) }],
                    Notice::Workers(workers) => super::render::worker_list(&workers),
                    Notice::Skills { skills, asked } => super::render::skill_list(&skills, asked),
                    Notice::Created(Err(m)) => {
                        ui.creating = false;
                        let lost = std::mem::take(&mut ui.unsent).len();
                        vec![Piece::Line {
                            style: Style::Note,
                            text: format!("✗ cannot create a session: {m} (not sent: {})", super::render::count(lost, "line")),
                        }]
                    }
                };
                ui.show(p)?;
                Step::Continue
            }
            _ = tick.tick(), if ui.busy || ui.creating => {
                ui.spin = ui.spin.wrapping_add(1);
                ui.show(Vec::new())?;
                Step::Continue
            }
            _ = int.recv() => ui.interrupt()?,
            _ = term.recv() => Step::Exit(0),
            _ = hup.recv() => Step::Exit(0),
        };
        if let Step::Exit(c) = step {
            return Ok(c);
        }
    }
}

impl Ui {
    fn prompt(&self) -> PromptLine {
        if let Some(a) = self.approvals.front() {
            let choices = if a.plan {
                "[y]es, then ask before edits / [e] yes, accept edits / [n]o, keep planning"
            } else {
                "[y]es / [n]o / [a]lways allow in this workspace"
            };
            return PromptLine {
                prefix: format!(
                    "? {} {}  {choices} ",
                    a.tool,
                    tool_text(&a.tool, &a.reason).replace('\n', " ⏎ "),
                ),
                style: Style::Note,
                input: String::new(),
                cursor: 0,
            };
        }
        PromptLine {
            prefix: if self.busy { "steer> " } else { "> " }.into(),
            style: if self.busy { Style::Dim } else { Style::User },
            input: self.editor.text(),
            cursor: self.editor.cursor(),
        }
    }

    /// The line under the output while something is going on: a run, or the session being made.
    fn activity(&self) -> String {
        let spin = SPINNER[self.spin % SPINNER.len()];
        if self.busy && self.cancel_sent {
            format!("{spin} cancelling…")
        } else if self.busy && !self.approvals.is_empty() {
            "● running · waiting for your answer".to_string()
        } else if self.busy {
            format!("{spin} running… · Ctrl-C cancels · Enter steers")
        } else if self.creating {
            format!("{spin} creating the session…")
        } else {
            String::new()
        }
    }

    fn sid(&self) -> String {
        self.sid.clone().unwrap_or_default()
    }

    fn show(&mut self, pieces: Vec<Piece>) -> vak_proto::Result<()> {
        let activity = self.activity();
        self.screen.set_activity(activity);
        let prompt = self.prompt();
        self.screen.show(pieces, &prompt)?;
        Ok(())
    }

    fn note(&mut self, style: Style, text: impl Into<String>) -> vak_proto::Result<()> {
        self.show(vec![Piece::Line {
            style,
            text: text.into(),
        }])
    }

    /// One update from the follower; what it shows is appended to `pieces`.
    fn update(&mut self, u: Update, pieces: &mut Vec<Piece>) -> vak_proto::Result<()> {
        let e = match u {
            Update::Fatal(f) => return Err(f.into()),
            Update::Reconnecting(why) => {
                self.reconnecting = true;
                self.screen.set_status(format!("reconnecting… ({})", clean(&why)));
                return Ok(());
            }
            Update::Resynced(r) => {
                // The stream could not be resumed exactly: the follower fetched
                // the transcript and goes on after its seq. Redraw from it.
                self.show(std::mem::take(pieces))?;
                self.busy = r.busy;
                self.render = Render::interactive();
                self.screen.clear_all()?;
                pieces.push(Piece::Line {
                    style: Style::Info,
                    text: format!("· resynced session {} from its transcript", self.sid()),
                });
                pieces.extend(self.render.transcript(&r.transcript));
                // Questions still open are behind the new stream's start: ask them again.
                self.approvals.clear();
                for a in &r.pending_approvals {
                    self.render.pending_approval(&a.request_id, &a.tool, &a.call_id);
                    self.approval_requested(&a.request_id, &a.tool, &a.text, a.input.as_ref(), pieces);
                }
                return Ok(());
            }
            Update::Event(e) => e,
        };
        match &e.kind {
            Some(Kind::StreamOpened(_)) if self.reconnecting => {
                self.reconnecting = false;
                self.screen.set_status("");
            }
            Some(Kind::SessionClosed(c)) => {
                self.screen
                    .set_status(format!("{}; reconnecting…", clean(&c.reason)));
            }
            Some(Kind::Status(s)) => {
                self.busy = s.busy;
                if !s.busy {
                    self.cancel_sent = false;
                }
            }
            Some(Kind::ApprovalRequested(a)) => {
                self.approval_requested(&a.request_id, &a.tool, &a.reason, a.input.as_ref(), pieces)
            }
            Some(Kind::ApprovalResolved(r)) => self.approvals.retain(|a| a.request_id != r.request_id),
            _ => {}
        }
        pieces.extend(self.render.event(&e));
        Ok(())
    }

    /// A question: answered at once by the policy, else queued to be asked.
    /// A plan is shown whole first, whoever answers it.
    fn approval_requested(
        &mut self,
        request_id: &str,
        tool: &str,
        reason: &str,
        input: Option<&prost_types::Struct>,
        pieces: &mut Vec<Piece>,
    ) {
        let plan = tool == PLAN_TOOL;
        if plan {
            let text = plan_text(input);
            pieces.push(Piece::Line {
                style: Style::Info,
                text: "── the plan to approve ──".into(),
            });
            pieces.extend(clean(&text).trim_end().split('\n').map(|l| Piece::Line {
                style: Style::Plain,
                text: l.to_string(),
            }));
        }
        let auto = match self.policy {
            Policy::Allow => Some(true),
            Policy::Deny => Some(false),
            Policy::Ask => None,
        };
        match auto {
            // Said once, by the approval_resolved line the answer brings
            // ("✗ bash denied: vak term --approve deny").
            Some(v) => {
                let why = if v { "" } else { "vak term --approve deny" };
                self.answer(approval(&self.sid(), request_id, v, why));
            }
            None => self.approvals.push_back(Approval {
                request_id: request_id.to_string(),
                tool: tool.to_string(),
                reason: reason.to_string(),
                plan,
            }),
        }
    }

    fn answer(&self, req: pb::ApproveRequest) {
        let (conn, tx) = (self.conn.clone(), self.notices.clone());
        tokio::spawn(async move {
            match answer_always_or_once(&conn, req).await {
                // A rule that could not be stored is explained by the notice
                // event the server sends to every client of the session.
                Ok((r, refused)) => {
                    if let Some(rule) = r.rule {
                        let _ = tx.send(Notice::Always(rule));
                    }
                    if let Some(f) = refused {
                        let _ = tx.send(Notice::Failed(format!(
                            "no always-allow rule: {f}; approved once"
                        )));
                    }
                }
                // Settled elsewhere (another client, expiry): the stream shows how.
                Err(f) if matches!(f.kind, FailKind::Conflict | FailKind::NotFound) => {}
                Err(f) => {
                    let _ = tx.send(Notice::Failed(format!("cannot answer the approval: {f}")));
                }
            }
        });
    }

    fn interrupt(&mut self) -> vak_proto::Result<Step> {
        if self.interrupted {
            return Ok(Step::Exit(0));
        }
        self.interrupted = true;
        if self.busy && !self.cancel_sent {
            self.cancel_sent = true;
            let (conn, sid, tx) = (self.conn.clone(), self.sid(), self.notices.clone());
            tokio::spawn(async move {
                if let Err(f) = retry(cancel_call(&conn, &sid)).await {
                    let _ = tx.send(Notice::Failed(format!("cannot cancel: {f}")));
                }
            });
            self.note(Style::Note, "⊘ cancelling the run (Ctrl-C again to exit)")?;
        } else {
            self.editor.clear();
            self.note(Style::Dim, "(Ctrl-C again or Ctrl-D to exit)")?;
        }
        Ok(Step::Continue)
    }

    fn input(&mut self, ev: TermEvent) -> vak_proto::Result<Step> {
        let key = match ev {
            TermEvent::Key(k) if k.kind != KeyEventKind::Release => k,
            TermEvent::Paste(s) if self.approvals.is_empty() => {
                self.interrupted = false;
                self.editor.insert_str(&s);
                self.show(Vec::new())?;
                return Ok(Step::Continue);
            }
            TermEvent::Resize(..) => {
                self.screen.resize();
                self.show(Vec::new())?;
                return Ok(Step::Continue);
            }
            _ => return Ok(Step::Continue),
        };
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && key.code == KeyCode::Char('c') {
            return self.interrupt();
        }
        self.interrupted = false;
        if let Some(a) = self.approvals.front() {
            // The question owns the keyboard until it is answered.
            let mut req = approval(&self.sid(), &a.request_id, false, "");
            match key.code {
                _ if ctrl && key.code == KeyCode::Char('d') => return Ok(Step::Exit(0)),
                _ if ctrl => return Ok(Step::Continue),
                KeyCode::Char('y' | 'Y') => req.approve = Some(true),
                KeyCode::Char('n' | 'N') => {}
                KeyCode::Char('a' | 'A') if !a.plan => {
                    req.approve = Some(true);
                    req.always = Some(true);
                }
                KeyCode::Char('e' | 'E') if a.plan => {
                    req.approve = Some(true);
                    req.mode = Some(pb::PlanExitMode::AcceptEdits as i32);
                }
                _ => return Ok(Step::Continue),
            }
            self.approvals.pop_front();
            self.answer(req);
            self.show(Vec::new())?;
            return Ok(Step::Continue);
        }
        match self.editor.key(key) {
            Action::Eof => return Ok(Step::Exit(0)),
            Action::Interrupt => return self.interrupt(),
            Action::ClearScreen => {
                self.screen.clear_all()?;
                self.show(Vec::new())?;
            }
            Action::Submit(text) => match command(&text) {
                Command::Exit => return Ok(Step::Exit(0)),
                Command::Help => {
                    let lines = HELP
                        .iter()
                        .map(|l| Piece::Line {
                            style: Style::Info,
                            text: l.to_string(),
                        })
                        .collect();
                    self.show(lines)?;
                }
                Command::Show(n) => {
                    let outputs = self.render.outputs();
                    let pieces = match n.or((!outputs.is_empty()).then_some(outputs.len())) {
                        None => vec![Piece::Line {
                            style: Style::Note,
                            text: "no tool output to show yet".into(),
                        }],
                        Some(n) => match outputs.get(n - 1) {
                            Some(o) => full_output(n, o),
                            None => vec![Piece::Line {
                                style: Style::Note,
                                text: format!(
                                    "no tool output {n}: {} so far",
                                    super::render::count(outputs.len(), "output")
                                ),
                            }],
                        },
                    };
                    self.show(pieces)?;
                }
                Command::BadShow => self.note(Style::Note, "usage: /show [N] (N: a number from 1)")?,
                Command::Workers => self.workers()?,
                Command::Skills => {
                    self.skills(true);
                    self.show(Vec::new())?;
                }
                Command::Send(text) => {
                    self.send(text);
                    self.show(Vec::new())?;
                }
            },
            Action::Edited | Action::Ignored => self.show(Vec::new())?,
        }
        Ok(Step::Continue)
    }

    /// `/workers`: lists the session's children once the server answers.
    fn workers(&mut self) -> vak_proto::Result<()> {
        let Some(sid) = self.sid.clone() else {
            return self.note(Style::Note, "no session yet, so no workers");
        };
        let (conn, tx) = (self.conn.clone(), self.notices.clone());
        tokio::spawn(async move {
            let listed = retry(move || {
                let (c, sid) = (conn.clone(), sid.clone());
                Box::pin(async move { c.list_workers(&sid).await })
            })
            .await;
            let _ = tx.send(match listed {
                Ok(w) => Notice::Workers(w),
                Err(f) => Notice::Failed(format!("cannot list the workers: {f}")),
            });
        });
        self.show(Vec::new())
    }

    /// Looks up the promoted skills; `asked` (by `/skills`): a failure is said,
    /// and none is a line of its own. At the start a server without skills says nothing.
    fn skills(&mut self, asked: bool) {
        let (conn, tx, sid) = (self.conn.clone(), self.notices.clone(), self.sid.clone());
        tokio::spawn(async move {
            let listed = retry(move || {
                let (c, sid) = (conn.clone(), sid.clone());
                Box::pin(async move { c.list_skills(sid.as_deref()).await })
            })
            .await;
            let _ = tx.send(match listed {
                Ok(skills) => Notice::Skills { skills, asked },
                Err(f) if asked => Notice::Failed(format!("cannot list the skills: {f}")),
                Err(_) => return,
            });
        });
    }

    /// Idle: a new run. Busy: steering, which the server queues as the run's next leg.
    /// The first line sent creates the session.
    fn send(&mut self, text: String) {
        let Some(sid) = self.sid.clone() else {
            self.unsent.push(text);
            if !self.creating {
                self.creating = true;
                let (conn, tx) = (self.conn.clone(), self.notices.clone());
                tokio::spawn(async move {
                    // Not retried: a create that reached the server would make a second session.
                    let r = conn.create_session().await.map_err(|f| f.to_string());
                    let _ = tx.send(Notice::Created(r));
                });
            }
            return;
        };
        let (conn, tx, busy) = (self.conn.clone(), self.notices.clone(), self.busy);
        tokio::spawn(async move {
            let request_id = format!("term_{}", uuid::Uuid::new_v4().simple());
            let r = if busy {
                retry(steer_call(
                    &conn,
                    pb::SteerRequest {
                        session_id: sid,
                        text: text.clone(),
                        request_id,
                        ..Default::default()
                    },
                ))
                .await
            } else {
                retry(run_call(
                    &conn,
                    pb::RunRequest {
                        session_id: sid,
                        prompt: text.clone(),
                        request_id,
                        ..Default::default()
                    },
                ))
                .await
            };
            let _ = tx.send(match r {
                Ok(a) => Notice::Admitted {
                    state: a.state(),
                    text,
                },
                Err(f) => Notice::Failed(format!("not sent: {f}")),
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_local_commands_stay_local() {
        assert_eq!(command("/help"), Command::Help);
        assert_eq!(command(" /help "), Command::Help);
        assert_eq!(command("/exit"), Command::Exit);
        assert_eq!(command("/quit"), Command::Exit);
        assert_eq!(command("/show"), Command::Show(None));
        assert_eq!(command("/show 2"), Command::Show(Some(2)));
        assert_eq!(command("/show 0"), Command::BadShow);
        assert_eq!(command("/show all"), Command::BadShow);
        assert_eq!(command("/workers"), Command::Workers);
        assert_eq!(command("/skills"), Command::Skills);
        // The model's directives, and anything else, are sent as typed.
        for sent in [
            "/helpme",
            "/workers all",
            "/worker do it",
            "/write a.txt x",
            "/bash ls",
            "/sleep 10",
            "hello",
            "/help\nmore",
        ] {
            assert_eq!(command(sent), Command::Send(sent.into()), "{sent:?}");
        }
        // `//` sends a line that starts with one slash.
        assert_eq!(command("//help"), Command::Send("/help".into()));
        assert_eq!(command("//write x y"), Command::Send("/write x y".into()));
    }

    #[test]
    fn help_names_every_local_command() {
        let help = HELP.join("\n");
        for c in [
            "/help",
            "/show [N]",
            "/workers",
            "/skills",
            "/exit",
            "/quit",
            "//text",
            "Ctrl-C",
            "Ctrl-D",
        ] {
            assert!(help.contains(c), "{c}");
        }
    }
}
