//! How frames are shown: streamed text and thinking, and one-line entries for prompts, tool calls, tool results, approvals and run outcomes.
//!
//! The renderer only decides what to show; `screen.rs` (interactive) and
//! `oneshot.rs` (stdout and stderr) decide where it goes.

use crate::transport::ApprovalOutcome;
use pb::event::Kind;
use std::collections::{HashMap, HashSet};
use vak_proto::v1 as pb;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    Plain,
    /// Dimmed, and cut to one line: tool calls and other entries.
    Dim,
    /// Dimmed, and wrapped rather than cut: the header and notes worth reading whole
    /// (`Note` and `User` wrap too; `Dim`, `Good` and `Bad` entries are cut to one line).
    Info,
    User,
    Good,
    Bad,
    Note,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A piece of the assistant's answer (`thinking`: of its thinking, shown dimmed).
    Stream { thinking: bool, text: String },
    /// A complete entry, shown on a line of its own.
    Line { style: Style, text: String },
}

fn line(style: Style, text: impl Into<String>) -> Piece {
    Piece::Line {
        style,
        text: text.into(),
    }
}

/// A tool's result, kept whole so `/show N` can print what the one-line entry collapsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolOutput {
    pub tool: String,
    pub ok: bool,
    pub output: String,
}

/// Remembers what later frames refer back to (a result names only its call).
#[derive(Default)]
pub(crate) struct Render {
    tools: HashMap<String, String>,
    /// An approval asked: its tool, and the call it is about ("" when not known).
    approvals: HashMap<String, (String, String)>,
    /// Calls whose approval was denied or expired: their approval line said
    /// so, and their (failed) result is not shown again. Cleared when a run ends.
    refused: HashSet<String>,
    /// A running tool's live output not yet ended by a newline, per call and stream.
    partial: HashMap<(String, String), String>,
    /// Every tool result shown, in order (numbered from 1 for `/show N`), when `keep_outputs`.
    outputs: Vec<ToolOutput>,
    keep_outputs: bool,
}

impl Render {
    /// A renderer for the interactive prompt: it keeps tool outputs, and a
    /// collapsed result names the `/show N` that prints it whole.
    pub(crate) fn interactive() -> Render {
        Render {
            keep_outputs: true,
            ..Render::default()
        }
    }

    /// The tool outputs seen so far (the first is `/show 1`).
    pub(crate) fn outputs(&self) -> &[ToolOutput] {
        &self.outputs
    }

    fn result(&mut self, tool: &str, ok: bool, output: &str) -> Piece {
        let shown = if self.keep_outputs {
            self.outputs.push(ToolOutput {
                tool: tool.to_string(),
                ok,
                output: output.to_string(),
            });
            Some(self.outputs.len())
        } else {
            None
        };
        tool_result_line(tool, ok, output, shown)
    }

    pub(crate) fn event(&mut self, e: &pb::Event) -> Vec<Piece> {
        let Some(kind) = &e.kind else {
            return Vec::new();
        };
        match kind {
            Kind::UserMessage(m) => user_lines(&m.text),
            Kind::TextDelta(t) => vec![Piece::Stream {
                thinking: false,
                text: clean(&t.text),
            }],
            Kind::ThinkingDelta(t) => vec![Piece::Stream {
                thinking: true,
                text: clean(&t.text),
            }],
            Kind::ToolCall(c) => {
                self.tools.insert(c.call_id.clone(), c.tool.clone());
                vec![line(Style::Dim, tool_call_line(&c.tool, c.input.as_ref()))]
            }
            Kind::ToolOutput(o) => self.live(o),
            Kind::ToolResult(r) => {
                let tool = self.tools.remove(&r.call_id).unwrap_or_else(|| "tool".into());
                let mut out = self.live_rest(&r.call_id);
                // A call that was refused an approval did not run: its result
                // only repeats the denial its approval line showed.
                let repeats_a_denial = self.refused.remove(&r.call_id) && !r.ok;
                if !repeats_a_denial {
                    out.push(self.result(&tool, r.ok, &r.output));
                }
                out
            }
            Kind::ApprovalRequested(a) => {
                self.approvals
                    .insert(a.request_id.clone(), (a.tool.clone(), a.call_id.clone()));
                Vec::new()
            }
            Kind::ApprovalResolved(a) => {
                let (tool, call_id) = self
                    .approvals
                    .remove(&a.request_id)
                    .unwrap_or_else(|| ("tool".into(), String::new()));
                let outcome = ApprovalOutcome::from_pb(a.outcome());
                if outcome != Some(ApprovalOutcome::Approved) && !call_id.is_empty() {
                    self.refused.insert(call_id);
                }
                let reason = if a.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", clean(&a.reason))
                };
                vec![match outcome {
                    Some(ApprovalOutcome::Approved) => line(Style::Good, format!("✓ {tool} approved{reason}")),
                    Some(ApprovalOutcome::Denied) => line(Style::Bad, format!("✗ {tool} denied{reason}")),
                    // Expired, or an outcome a newer server added: shown as sent.
                    _ => line(Style::Note, format!("· {tool} approval {}{reason}", a.outcome().json_name())),
                }]
            }
            Kind::RunFinished(r) => {
                self.refused.clear();
                run_end(r.outcome().json_name(), &r.message, r.stop_reason)
            }
            Kind::Notice(n) => vec![line(Style::Note, format!("! {}", clean(&n.text)))],
            // The server sends it only while the session is idle, so it falls between runs.
            Kind::BackgroundResult(b) => background_lines(b),
            // A run about to try the model service again: one dim line
            // (it stands until the run's next event).
            Kind::Status(pb::Status {
                retrying: Some(r), ..
            }) => vec![line(Style::Dim, retrying_line(r))],
            Kind::StreamOpened(_)
            | Kind::TurnStarted(_)
            | Kind::Status(_)
            | Kind::Resync(_)
            | Kind::SessionClosed(_)
            // Side runs belong to whoever asked them; vak term asks none.
            | Kind::Side(_) => Vec::new(),
            Kind::Worker(w) => w.worker.as_ref().map_or_else(Vec::new, |c| {
                vec![worker_line(w.phase().json_name(), c)]
            }),
            Kind::Workbench(b) => b.candidate.as_ref().map_or_else(Vec::new, |c| {
                vec![worker_line("state", c)]
            }),
            Kind::DraftDiscarded(d) => {
                let why = match d.why() {
                    pb::DiscardReason::KeptOther => "another candidate was kept",
                    _ => "discarded",
                };
                vec![line(
                    Style::Dim,
                    format!("· candidate {} removed: {why} (branch {} deleted)", clean(&d.candidate), clean(&d.branch)),
                )]
            }
            Kind::LaunchOutput(o) => launch_lines(o),
            Kind::Commitment(e) => e.commitment.as_ref().map_or_else(Vec::new, |c| {
                vec![commitment_line(c)]
            }),
            Kind::GoalUpdate(e) => e.update.as_ref().map_or_else(Vec::new, |u| {
                let mut text = format!("↳ goal {}: {}", u.relation().json_name(), clean(&u.text));
                if u.widens_permissions {
                    text.push_str(" (asks for wider permissions: not applied)");
                }
                vec![line(Style::Dim, text)]
            }),
        }
    }

    /// A running tool's live output: each finished line indented and dimmed
    /// under its call; an unfinished one waits for its end (or the result),
    /// up to `LIVE_LINE` bytes.
    fn live(&mut self, o: &pb::ToolOutput) -> Vec<Piece> {
        let stream = o.stream().json_name();
        let key = (o.call_id.clone(), stream.to_string());
        let partial = self.partial.entry(key.clone()).or_default();
        partial.push_str(&clean(&o.text));
        let mut out = Vec::new();
        while let Some(end) = partial.find('\n') {
            let rest = partial.split_off(end + 1);
            out.push(live_line(stream, partial.trim_end_matches('\n')));
            *partial = rest;
        }
        if partial.len() > LIVE_LINE {
            out.push(live_line(stream, partial));
            partial.clear();
        }
        if partial.is_empty() {
            self.partial.remove(&key);
        }
        out
    }

    /// What a finished call's live output left unfinished.
    fn live_rest(&mut self, call_id: &str) -> Vec<Piece> {
        let mut keys: Vec<_> = self
            .partial
            .keys()
            .filter(|(c, _)| c == call_id)
            .cloned()
            .collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|k| self.partial.remove(&k).map(|t| live_line(&k.1, &t)))
            .collect()
    }

    /// An approval still pending when a transcript was redrawn: its resolution comes later, naming only its id.
    pub(crate) fn pending_approval(&mut self, request_id: &str, tool: &str, call_id: &str) {
        self.approvals
            .insert(request_id.to_string(), (tool.to_string(), call_id.to_string()));
    }

    /// A transcript as the pieces its events would have rendered (the redraw after a resync).
    pub(crate) fn transcript(&mut self, t: &pb::Transcript) -> Vec<Piece> {
        let mut out = Vec::new();
        for m in &t.messages {
            match m.role().json_name() {
                "user" => out.extend(user_lines(&m.text)),
                "assistant" => {
                    if !m.thinking().is_empty() {
                        out.push(Piece::Stream {
                            thinking: true,
                            text: clean(m.thinking()),
                        });
                    }
                    if !m.text.is_empty() {
                        out.push(Piece::Stream {
                            thinking: false,
                            text: clean(&m.text),
                        });
                    }
                }
                "tool" => {
                    out.push(line(Style::Dim, tool_call_line(m.tool(), m.input.as_ref())));
                    // A call still waiting for its result has neither output nor ok:
                    // its result comes later, naming only the call.
                    if m.ok() || !m.text.is_empty() {
                        out.push(self.result(m.tool(), m.ok(), &m.text));
                    } else {
                        self.tools.insert(m.call_id().to_string(), m.tool().to_string());
                    }
                }
                "run" => out.extend(run_end(m.outcome().json_name(), &m.text, m.stop_reason)),
                "background" => match &m.background {
                    Some(b) => out.extend(background_lines(b)),
                    // A server that filled in only the text: shown as a plain result.
                    None => out.extend(background_lines(&pb::BackgroundResult {
                        text: m.text.clone(),
                        ..Default::default()
                    })),
                },
                _ => {}
            }
        }
        out
    }
}

/// How a run that did not complete is shown, live (run_finished) and on a redraw (a "run" entry).
/// The longest unfinished line of live output held back for its end.
const LIVE_LINE: usize = 4096;

/// The tool whose approval carries a plan (and is answered with a mode).
pub(crate) const PLAN_TOOL: &str = "exit_plan_mode";

/// What an `[a]lways` answer's rule covers, said once it is stored.
pub(crate) fn always_line(rule: &pb::PermissionRule) -> String {
    let what = clean(&rule.pattern).replace('\n', " ⏎ ");
    // A tool rule (an MCP tool's) is the tool's name: naming it twice says nothing.
    if rule.kind() == pb::RuleKind::Tool {
        return format!("· always allowing every `{what}` call in this workspace");
    }
    let exact = if rule.kind() == pb::RuleKind::Exact {
        " (this exact command)"
    } else {
        ""
    };
    format!(
        "· always allowing {} `{what}`{exact} in this workspace",
        rule.tool
    )
}

/// An exit_plan_mode call's plan (its input's `plan`), "" when it has none.
pub(crate) fn plan_text(input: Option<&prost_types::Struct>) -> String {
    input
        .map(struct_json)
        .and_then(|v| v.get("plan").and_then(|p| p.as_str()).map(str::to_string))
        .unwrap_or_default()
}

/// `  │ line` for stdout, `  ! line` for stderr, dimmed.
fn live_line(stream: &str, text: &str) -> Piece {
    let bar = if stream == "stderr" { "!" } else { "│" };
    line(Style::Dim, format!("  {bar} {text}"))
}

/// A completed run shows nothing (its answer speaks for itself) unless its
/// reply was cut or stopped (`stop_reason`): then one line says so.
fn run_end(outcome: &str, message: &str, stop_reason: Option<i32>) -> Vec<Piece> {
    let mut out = match outcome {
        "completed" => Vec::new(),
        "cancelled" => vec![line(Style::Note, format!("⊘ {}", clean(message)))],
        _ => vec![line(Style::Bad, format!("✗ run {outcome}: {}", clean(message)))],
    };
    if let Some(text) = stopped_line(outcome, message, stop_reason) {
        out.push(line(Style::Note, text));
    }
    out
}

/// The line that says a run's last reply did not end on its own
/// (`run_finished.stop_reason` set): `⚠ cut at the output limit`, `⚠ the
/// model refused`, `⚠ stopped by the provider's content filter`. A reason
/// this client does not know is shown by the run's message.
pub(crate) fn stopped_line(outcome: &str, message: &str, stop_reason: Option<i32>) -> Option<String> {
    let words = match pb::StopReason::try_from(stop_reason?) {
        Ok(pb::StopReason::MaxTokens) => "cut at the output limit".to_string(),
        Ok(pb::StopReason::Refusal) => "the model refused".to_string(),
        Ok(pb::StopReason::ContentFilter) => "stopped by the provider's content filter".to_string(),
        // A newer server's reason: the message (shown already unless completed) says it.
        _ if outcome == "completed" && !message.is_empty() => clean(message),
        _ => return None,
    };
    Some(format!("⚠ {words}"))
}

/// `2 files +5 -1`.
fn diff_stat(d: &pb::DiffStat) -> String {
    format!(
        "{} +{} -{}",
        count(d.files as usize, "file"),
        d.insertions,
        d.deletions
    )
}

/// The first line of `text`, cleaned, "" when blank.
fn first_line(text: &str) -> String {
    clean(text)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// One child of the session as an event shows it, on one line:
/// `⑂ worker ID spawned: PROMPT`, `⑂ candidate ID running`, then
/// `✓ worker ID finished (2 files +5 -1): SUMMARY` (or ✗ failed, · cancelled).
pub(crate) fn worker_line(phase: &str, w: &pb::Worker) -> Piece {
    let who = match w.kind() {
        pb::WorkerKind::Candidate => "candidate",
        _ => "worker",
    };
    let id = clean(&w.id);
    if phase == "spawned" {
        let prompt = first_line(&w.prompt);
        let on = if w.branch.is_empty() {
            String::new()
        } else {
            format!(" on {}", clean(&w.branch))
        };
        return line(Style::Dim, format!("⑂ {who} {id} spawned{on}: {prompt}"));
    }
    let stat = w
        .diff_stat
        .as_ref()
        .map_or(String::new(), |d| format!(" ({})", diff_stat(d)));
    let summary = match first_line(&w.summary) {
        s if s.is_empty() => String::new(),
        s => format!(": {s}"),
    };
    match w.state() {
        pb::WorkerState::Finished => line(Style::Good, format!("✓ {who} {id} finished{stat}{summary}")),
        pb::WorkerState::Failed => line(Style::Bad, format!("✗ {who} {id} failed{summary}")),
        pb::WorkerState::Cancelled => line(Style::Note, format!("· {who} {id} cancelled")),
        other => line(Style::Dim, format!("⑂ {who} {id} {}", other.json_name())),
    }
}

/// The most lines of one piece of a dev server's output shown; `/launch/logs` keeps more.
const LAUNCH_LINES: usize = 20;

/// A dev server's output, a line each: `[NAME] text` (dimmed; stderr as a note).
/// A plan item as its event leaves it: a mark for where it stands, its item
/// id and text; once closed, the verdict and the person's note.
pub(crate) fn commitment_line(c: &pb::Commitment) -> Piece {
    let text = clean(&c.text);
    if let Some(closed) = &c.closed {
        let (style, mark) = match closed.verdict() {
            pb::Verdict::Fulfilled => (Style::Good, "✓"),
            _ => (Style::Dim, "✗"),
        };
        let note = if closed.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", clean(&closed.note))
        };
        return line(
            style,
            format!(
                "{mark} plan [{}] {}: {text}{note}",
                clean(&c.item),
                closed.verdict().json_name()
            ),
        );
    }
    let (style, mark) = match c.status() {
        pb::PlanStatus::InProgress => (Style::Note, "▸"),
        pb::PlanStatus::Done => (Style::Good, "☑"),
        pb::PlanStatus::Dropped => (Style::Dim, "☒"),
        _ => (Style::Dim, "☐"),
    };
    line(
        style,
        format!(
            "{mark} plan [{}] {}: {text}",
            clean(&c.item),
            c.status().json_name()
        ),
    )
}

fn launch_lines(o: &pb::LaunchOutput) -> Vec<Piece> {
    let style = match o.stream() {
        pb::OutputStream::Stderr => Style::Note,
        _ => Style::Dim,
    };
    let name = clean(&o.name);
    let text = clean(&o.text);
    let lines: Vec<&str> = text.trim_end_matches('\n').split('\n').collect();
    let mut out: Vec<Piece> = lines
        .iter()
        .take(LAUNCH_LINES)
        .map(|l| line(style, format!("[{name}] {}", l.trim_end())))
        .collect();
    if lines.len() > LAUNCH_LINES {
        out.push(line(
            Style::Dim,
            format!(
                "[{name}] … (+{} more {})",
                lines.len() - LAUNCH_LINES,
                noun_for(lines.len() - LAUNCH_LINES, "line")
            ),
        ));
    }
    out
}

/// The most skill names vak term's start line shows.
const START_NAMES: usize = 12;

/// The promoted skills as slash commands: the whole list when `asked`
/// (`/skills`), else the one line vak term starts with (none without skills).
pub(crate) fn skill_list(skills: &[pb::Skill], asked: bool) -> Vec<Piece> {
    let names = || skills.iter().map(|s| format!("/{}", clean(&s.name)));
    match (asked, skills.is_empty()) {
        (false, true) => Vec::new(),
        (false, false) => {
            // One line, however many there are (a workspace and the home may have 200 each).
            let mut shown: Vec<String> = names().take(START_NAMES).collect();
            if skills.len() > START_NAMES {
                shown.push(format!("and {} more", skills.len() - START_NAMES));
            }
            vec![line(
                Style::Info,
                format!("· skills: {} (/skills says what each does)", shown.join(" ")),
            )]
        }
        (true, true) => vec![line(
            Style::Info,
            "no skills promoted for this workspace (POST /skills/proposals/ID/promote makes one)",
        )],
        (true, false) => {
            let mut out = vec![line(
                Style::Info,
                format!(
                    "{}; type /NAME [ARGUMENTS] to have the model use one:",
                    count(skills.len(), "skill")
                ),
            )];
            for (s, name) in skills.iter().zip(names()) {
                let kind = match s.kind() {
                    pb::SkillKind::Script => "script",
                    _ => "prompt",
                };
                let scope = match s.scope() {
                    pb::SkillScope::Global => "  (every workspace)",
                    _ => "",
                };
                out.push(line(
                    Style::Plain,
                    format!("  {name}  {kind}  {}{scope}", first_line(&s.description)),
                ));
            }
            out
        }
    }
}

/// `/workers`: the session's children, one line each (or that it has none).
pub(crate) fn worker_list(workers: &[pb::Worker]) -> Vec<Piece> {
    if workers.is_empty() {
        return vec![line(Style::Info, "no workers in this session")];
    }
    let mut out = vec![line(
        Style::Info,
        format!("{} of this session:", count(workers.len(), "worker")),
    )];
    for w in workers {
        let kind = match w.kind() {
            pb::WorkerKind::Candidate => "candidate",
            _ => "worker",
        };
        let mut text = format!("  {}  {kind}  {}", clean(&w.id), w.state().json_name());
        if !w.branch.is_empty() {
            text.push_str(&format!("  {}", clean(&w.branch)));
        }
        if let Some(d) = &w.diff_stat {
            text.push_str(&format!("  {}", diff_stat(d)));
        }
        let about = match first_line(&w.summary) {
            s if s.is_empty() => first_line(&w.prompt),
            s => s,
        };
        if !about.is_empty() {
            text.push_str(&format!("  {about}"));
        }
        out.push(line(Style::Plain, text));
    }
    out
}

/// The most lines of a background result shown; the transcript keeps them all.
const BACKGROUND_LINES: usize = 20;

/// A run about to try the model service again, in one line:
/// `retrying 1/3: could not reach the model service at 127.0.0.1:9 (connection refused)`.
pub(crate) fn retrying_line(r: &pb::Retrying) -> String {
    format!("retrying {}/{}: {}", r.attempt, r.of, clean(&r.reason))
}

/// A background result between runs: `⟲ background (script task_…): first line`
/// (dimmed), or for an alert `⚠ script_failed (script task_…): first line` (red);
/// further lines indented under it, at most `BACKGROUND_LINES`.
pub(crate) fn background_lines(b: &pb::BackgroundResult) -> Vec<Piece> {
    let source = b.source().json_name();
    let from = match (source, b.id.as_str()) {
        ("", "") => String::new(),
        (s, "") | ("", s) => format!(" ({})", clean(s)),
        (s, id) => format!(" ({s} {})", clean(id)),
    };
    let summarised = match b.summarised {
        0 => String::new(),
        n => format!(" [{} summarised]", count(n as usize, "result")),
    };
    let text = clean(&b.text);
    let mut lines = text.trim_end().lines();
    let first = match lines.next().unwrap_or("").trim() {
        "" => String::new(),
        f => format!(": {f}"),
    };
    let (style, head, body) = if b.alert {
        let reason = match b.reason().json_name() {
            "" => "alert",
            r => r,
        };
        (
            Style::Bad,
            format!("⚠ {reason}{from}{summarised}{first}"),
            Style::Note,
        )
    } else {
        (
            Style::Info,
            format!("⟲ background{from}{summarised}{first}"),
            Style::Plain,
        )
    };
    let rest: Vec<&str> = lines.collect();
    let mut out = vec![line(style, head)];
    out.extend(
        rest.iter()
            .take(BACKGROUND_LINES)
            .map(|l| line(body, format!("  {l}"))),
    );
    if rest.len() > BACKGROUND_LINES {
        let n = rest.len() - BACKGROUND_LINES;
        out.push(line(
            Style::Info,
            format!("  … (+{n} more {} in the transcript)", noun_for(n, "line")),
        ));
    }
    out
}

fn user_lines(text: &str) -> Vec<Piece> {
    clean(text)
        .lines()
        .enumerate()
        .map(|(i, l)| line(Style::User, format!("{} {l}", if i == 0 { "›" } else { " " })))
        .collect()
}

pub(crate) use vak_proto::text::{count, noun_for};

/// What the server says about a tool, as shown: cleaned of control
/// characters, and "1 bytes" in write_file's own phrases said as "1 byte"
/// (earlier builds said so, and their ledgers still do; only that
/// fixed phrasing is touched, never a path or a command's output).
pub(crate) fn tool_text(tool: &str, text: &str) -> String {
    let text = clean(text);
    if tool == "write_file" {
        for verb in ["write", "wrote"] {
            if let Some(rest) = text.strip_prefix(&format!("{verb} 1 bytes ")) {
                return format!("{verb} 1 byte {rest}");
            }
        }
    }
    text
}

/// `write_file notes.md (11 bytes)`, `bash $ ls`, `read_file a.txt`; other tools show their input as JSON.
pub(crate) fn tool_call_line(tool: &str, input: Option<&prost_types::Struct>) -> String {
    let input = input.map(struct_json).unwrap_or(serde_json::Value::Null);
    let s = |k: &str| input.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let detail = match tool {
        "read_file" => s("path"),
        "write_file" => format!("{} ({})", s("path"), count(s("content").len(), "byte")),
        "bash" => format!("$ {}", s("command")),
        // The plan itself is shown whole with its question.
        "exit_plan_mode" => {
            let plan = s("plan");
            let more = plan.trim_end().lines().count().saturating_sub(1);
            let first = plan.lines().next().unwrap_or("").to_string();
            match more {
                0 => first,
                n => format!("{first} (+{n} more {})", noun_for(n, "line")),
            }
        }
        _ if input.is_null() => String::new(),
        _ => input.to_string(),
    };
    clean(&format!("⚙ {tool} {detail}")).replace('\n', " ⏎ ")
}

/// `✓ write_file: wrote 11 bytes to notes.md`: the first line of the output,
/// and how many more there are. `shown`: the output's number for `/show N`,
/// named when the entry hides lines.
pub(crate) fn tool_result_line(tool: &str, ok: bool, output: &str, shown: Option<usize>) -> Piece {
    let output = tool_text(tool, output);
    let mut lines = output.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("");
    let more = lines.count();
    let more = match (more, shown) {
        (0, _) => String::new(),
        (n, None) => format!(" (+{n} more {})", noun_for(n, "line")),
        (n, Some(i)) => format!(" (+{n} more {}: /show {i})", noun_for(n, "line")),
    };
    let (mark, style) = if ok {
        ("✓", Style::Good)
    } else {
        ("✗", Style::Bad)
    };
    line(style, format!("{mark} {tool}: {first}{more}"))
}

/// A tool output in full, for `/show`: a heading, then every line.
pub(crate) fn full_output(n: usize, o: &ToolOutput) -> Vec<Piece> {
    let mark = if o.ok { "✓" } else { "✗" };
    let mut out = vec![line(
        Style::Info,
        format!("── /show {n}: {mark} {} output ──", o.tool),
    )];
    let text = tool_text(&o.tool, &o.output);
    let text = text.trim_end_matches('\n');
    if text.is_empty() {
        out.push(line(Style::Info, "(no output)"));
    }
    out.extend(
        text.split('\n')
            .filter(|_| !text.is_empty())
            .map(|l| line(Style::Plain, l)),
    );
    out
}

/// Server text is data, never terminal commands: control characters (an
/// escape sequence could move the cursor or retitle the window) are dropped,
/// tabs become spaces, CRLF becomes LF.
pub(crate) fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push('\n'),
            '\t' => out.push_str("    "),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A protobuf Struct as plain JSON.
pub(crate) fn struct_json(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value_json(v))).collect())
}

fn value_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind as V;
    match &v.kind {
        None | Some(V::NullValue(_)) => serde_json::Value::Null,
        // A Struct's numbers are all f64: a whole one is shown as the integer
        // it was sent as (`{"a":2}`, not `{"a":2.0}`).
        Some(V::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
            serde_json::json!(*n as i64)
        }
        Some(V::NumberValue(n)) => serde_json::json!(n),
        Some(V::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(V::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(V::StructValue(s)) => struct_json(s),
        Some(V::ListValue(l)) => serde_json::Value::Array(l.values.iter().map(value_json).collect()),
    }
}

#[cfg(test)]
mod tests;
