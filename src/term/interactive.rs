//! `vak term` at a terminal: a prompt that stays usable while answers stream in above it, inline approvals, steering, cancel, and reconnects that neither lose nor repeat text.

use super::conn::{answer_approval, cancel_call, retry, run_call, steer_call, FailKind, Transport};
use super::editor::{Action, Editor};
use super::follow::{follow, transcript_at, Update};
use super::render::{clean, Piece, Render, Style};
use super::screen::{PromptLine, Screen, TerminalGuard};
use super::Policy;
use crate::proto::v1 as pb;
use crossterm::event::{Event as TermEvent, EventStream, KeyCode, KeyEventKind, KeyModifiers};
use futures_util::StreamExt;
use pb::event::Kind;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

pub struct Options {
    pub policy: Policy,
    /// The first lines shown: which session, which server, which transport.
    pub header: Vec<String>,
}

struct Approval {
    request_id: String,
    tool: String,
    reason: String,
}

/// What a call made in the background reports back to the loop.
enum Notice {
    Admitted { state: String, text: String },
    Failed(String),
}

struct Ui {
    conn: Arc<dyn Transport>,
    sid: String,
    policy: Policy,
    screen: Screen,
    editor: Editor,
    render: Render,
    approvals: VecDeque<Approval>,
    /// Tools answered `[a]lways` in this term session: approved without asking.
    always: HashSet<String>,
    busy: bool,
    cancel_sent: bool,
    /// The last key was Ctrl-C: another one exits.
    interrupted: bool,
    reconnecting: bool,
    /// After a resync the redrawn transcript stands for every frame up to this seq.
    skip_through: u64,
    notices: mpsc::UnboundedSender<Notice>,
}

enum Step {
    Continue,
    Exit(i32),
}

pub async fn run(
    conn: Arc<dyn Transport>,
    sid: String,
    summary: pb::SessionSummary,
    o: Options,
) -> crate::Result<i32> {
    let guard = TerminalGuard::enter()
        .map_err(|e| crate::Error::internal(format!("cannot use the terminal: {e}")))?;
    let (tx, notices) = mpsc::unbounded_channel();
    let mut ui = Ui {
        conn: conn.clone(),
        sid: sid.clone(),
        policy: o.policy,
        screen: Screen::new(),
        editor: Editor::default(),
        render: Render::default(),
        approvals: VecDeque::new(),
        always: HashSet::new(),
        busy: summary.busy,
        cancel_sent: false,
        interrupted: false,
        reconnecting: false,
        skip_through: 0,
        notices: tx,
    };
    if std::env::var_os("VAK_TERM_TEST_PANIC").is_some() {
        // Lets the tests prove that a panic gives the terminal back.
        panic!("VAK_TERM_TEST_PANIC is set");
    }
    let result = event_loop(&mut ui, conn, sid, o.header, notices).await;
    // Every way out, an error included, leaves the screen tidy for the shell.
    let _ = ui.screen.close();
    drop(guard);
    result
}

async fn event_loop(
    ui: &mut Ui,
    conn: Arc<dyn Transport>,
    sid: String,
    header: Vec<String>,
    mut notices: mpsc::UnboundedReceiver<Notice>,
) -> crate::Result<i32> {
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
    // From seq 0: an attached session's history replays (or resyncs from the transcript).
    let mut follower = follow(conn, sid, Some(0), None);
    let mut keys = EventStream::new();
    loop {
        let step = tokio::select! {
            u = follower.updates.recv() => {
                let Some(mut u) = u else {
                    return Err(crate::Error::internal("the event stream stopped"));
                };
                let mut pieces = Vec::new();
                // Take everything already waiting, then draw once: a burst of
                // deltas costs one redraw, not one per frame.
                loop {
                    if let Err(e) = ui.update(u, &mut pieces).await {
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
                Some(Err(e)) => return Err(crate::Error::internal(format!("cannot read the terminal: {e}"))),
                None => return Err(crate::Error::internal("the terminal closed")),
            },
            Some(n) = notices.recv() => {
                let p = match n {
                    Notice::Admitted { state, text } if state == "queued" => vec![Piece::Line {
                        style: Style::Dim,
                        text: format!("⋯ queued: {}", clean(&text).replace('\n', " ⏎ ")),
                    }],
                    Notice::Admitted { .. } => Vec::new(),
                    Notice::Failed(m) => vec![Piece::Line { style: Style::Note, text: format!("✗ {m}") }],
                };
                ui.show(p)?;
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
            return PromptLine {
                prefix: format!(
                    "? {} {}  [y]es / [n]o / [a]lways ",
                    a.tool,
                    clean(&a.reason).replace('\n', " ⏎ ")
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

    fn show(&mut self, pieces: Vec<Piece>) -> crate::Result<()> {
        let prompt = self.prompt();
        self.screen.show(pieces, &prompt)?;
        Ok(())
    }

    fn note(&mut self, style: Style, text: impl Into<String>) -> crate::Result<()> {
        self.show(vec![Piece::Line {
            style,
            text: text.into(),
        }])
    }

    /// One update from the follower; what it shows is appended to `pieces`.
    async fn update(&mut self, u: Update, pieces: &mut Vec<Piece>) -> crate::Result<()> {
        let e = match u {
            Update::Fatal(f) => return Err(f.into()),
            Update::Reconnecting(why) => {
                self.reconnecting = true;
                self.screen.set_status(format!("reconnecting… ({})", clean(&why)));
                return Ok(());
            }
            Update::Event(e) => e,
        };
        let shown = !(e.seq > 0 && e.seq <= self.skip_through);
        match &e.kind {
            Some(Kind::StreamOpened(_)) if self.reconnecting => {
                self.reconnecting = false;
                self.screen.set_status("");
            }
            Some(Kind::Resync(_)) => {
                // The cursor cannot be served exactly: redraw from the transcript.
                self.show(std::mem::take(pieces))?;
                let (t, summary) = transcript_at(&self.conn, &self.sid).await?;
                self.skip_through = summary.latest_seq;
                self.busy = summary.busy;
                // Whether a question is still open cannot be told from the
                // transcript: the retained frames that follow ask again those
                // still in the ring (one older than the ring cannot be answered here).
                self.approvals.clear();
                self.render = Render::default();
                self.screen.clear_all()?;
                pieces.push(Piece::Line {
                    style: Style::Info,
                    text: format!("· resynced session {} from its transcript", self.sid),
                });
                pieces.extend(self.render.transcript(&t));
                return Ok(());
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
                let auto = match self.policy {
                    _ if self.always.contains(&a.tool) => Some(true),
                    Policy::Allow => Some(true),
                    Policy::Deny => Some(false),
                    Policy::Ask => None,
                };
                match auto {
                    Some(v) => {
                        if shown {
                            let how = if v { "auto-approving" } else { "auto-denying" };
                            pieces.push(Piece::Line {
                                style: Style::Dim,
                                text: format!("· {how} {}: {}", a.tool, clean(&a.reason)),
                            });
                        }
                        self.answer(&a.request_id, v);
                    }
                    None => self.approvals.push_back(Approval {
                        request_id: a.request_id.clone(),
                        tool: a.tool.clone(),
                        reason: a.reason.clone(),
                    }),
                }
            }
            Some(Kind::ApprovalResolved(r)) => self.approvals.retain(|a| a.request_id != r.request_id),
            _ => {}
        }
        let p = self.render.event(&e);
        if shown {
            pieces.extend(p);
        }
        Ok(())
    }

    fn answer(&self, request_id: &str, approve: bool) {
        let (conn, sid, rid, tx) = (
            self.conn.clone(),
            self.sid.clone(),
            request_id.to_string(),
            self.notices.clone(),
        );
        tokio::spawn(async move {
            match answer_approval(&conn, &sid, &rid, approve, "").await {
                Ok(_) => {}
                // Settled elsewhere (another client, expiry): the stream shows how.
                Err(f) if matches!(f.kind, FailKind::Conflict | FailKind::NotFound) => {}
                Err(f) => {
                    let _ = tx.send(Notice::Failed(format!("cannot answer the approval: {f}")));
                }
            }
        });
    }

    fn interrupt(&mut self) -> crate::Result<Step> {
        if self.interrupted {
            return Ok(Step::Exit(0));
        }
        self.interrupted = true;
        if self.busy && !self.cancel_sent {
            self.cancel_sent = true;
            let (conn, sid, tx) = (self.conn.clone(), self.sid.clone(), self.notices.clone());
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

    fn input(&mut self, ev: TermEvent) -> crate::Result<Step> {
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
            let verdict = match key.code {
                KeyCode::Char('y' | 'Y') if !ctrl => Some(true),
                KeyCode::Char('n' | 'N') if !ctrl => Some(false),
                KeyCode::Char('a' | 'A') if !ctrl => {
                    self.always.insert(a.tool.clone());
                    Some(true)
                }
                KeyCode::Char('d') if ctrl => return Ok(Step::Exit(0)),
                _ => None,
            };
            if let Some(v) = verdict {
                let a = self.approvals.pop_front().expect("checked above");
                self.answer(&a.request_id, v);
                if self.always.contains(&a.tool) {
                    // `always` covers the same tool's requests already waiting, too.
                    let (same, rest): (VecDeque<Approval>, VecDeque<Approval>) =
                        std::mem::take(&mut self.approvals)
                            .into_iter()
                            .partition(|x| x.tool == a.tool);
                    self.approvals = rest;
                    for x in same {
                        self.answer(&x.request_id, true);
                    }
                }
                self.show(Vec::new())?;
            }
            return Ok(Step::Continue);
        }
        match self.editor.key(key) {
            Action::Eof => return Ok(Step::Exit(0)),
            Action::Interrupt => return self.interrupt(),
            Action::ClearScreen => {
                self.screen.clear_all()?;
                self.show(Vec::new())?;
            }
            Action::Submit(text) => {
                self.send(text);
                self.show(Vec::new())?;
            }
            Action::Edited | Action::Ignored => self.show(Vec::new())?,
        }
        Ok(Step::Continue)
    }

    /// Idle: a new run. Busy: steering, which the server queues as the run's next leg.
    fn send(&self, text: String) {
        let (conn, sid, tx, busy) = (
            self.conn.clone(),
            self.sid.clone(),
            self.notices.clone(),
            self.busy,
        );
        tokio::spawn(async move {
            let request_id = format!("term_{}", uuid::Uuid::new_v4().simple());
            let r = if busy {
                retry(steer_call(
                    &conn,
                    pb::SteerRequest {
                        session_id: sid,
                        text: text.clone(),
                        request_id,
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
                    },
                ))
                .await
            };
            let _ = tx.send(match r {
                Ok(a) => Notice::Admitted { state: a.state, text },
                Err(f) => Notice::Failed(format!("not sent: {f}")),
            });
        });
    }
}
