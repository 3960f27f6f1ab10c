//! How frames are shown: streamed text and thinking, and one-line entries for prompts, tool calls, tool results, approvals and run outcomes.
//!
//! The renderer only decides what to show; `screen.rs` (interactive) and
//! `oneshot.rs` (stdout and stderr) decide where it goes.

use crate::transport::ApprovalOutcome;
use pb::event::Kind;
use std::collections::HashMap;
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
    approvals: HashMap<String, String>,
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
                out.push(self.result(&tool, r.ok, &r.output));
                out
            }
            Kind::ApprovalRequested(a) => {
                self.approvals.insert(a.request_id.clone(), a.tool.clone());
                Vec::new()
            }
            Kind::ApprovalResolved(a) => {
                let tool = self
                    .approvals
                    .remove(&a.request_id)
                    .unwrap_or_else(|| "tool".into());
                let reason = if a.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", clean(&a.reason))
                };
                vec![match ApprovalOutcome::from_pb(a.outcome()) {
                    Some(ApprovalOutcome::Approved) => line(Style::Good, format!("✓ {tool} approved{reason}")),
                    Some(ApprovalOutcome::Denied) => line(Style::Bad, format!("✗ {tool} denied{reason}")),
                    // Expired, or an outcome a newer server added: shown as sent.
                    _ => line(Style::Note, format!("· {tool} approval {}{reason}", a.outcome().json_name())),
                }]
            }
            Kind::RunFinished(r) => run_end(r.outcome().json_name(), &r.message),
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
    pub(crate) fn pending_approval(&mut self, request_id: &str, tool: &str) {
        self.approvals.insert(request_id.to_string(), tool.to_string());
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
                "run" => out.extend(run_end(m.outcome().json_name(), &m.text)),
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

fn run_end(outcome: &str, message: &str) -> Vec<Piece> {
    match outcome {
        "completed" => Vec::new(),
        "cancelled" => vec![line(Style::Note, format!("⊘ {}", clean(message)))],
        _ => vec![line(Style::Bad, format!("✗ run {outcome}: {}", clean(message)))],
    }
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
mod tests {
    use super::*;

    fn input(pairs: &[(&str, &str)]) -> prost_types::Struct {
        prost_types::Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        prost_types::Value {
                            kind: Some(prost_types::value::Kind::StringValue(v.to_string())),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn tool_entries_are_one_line() {
        let i = input(&[("path", "f.txt"), ("content", "hi")]);
        assert_eq!(
            tool_call_line("write_file", Some(&i)),
            "⚙ write_file f.txt (2 bytes)"
        );
        let i = input(&[("command", "echo a\necho b")]);
        assert_eq!(tool_call_line("bash", Some(&i)), "⚙ bash $ echo a ⏎ echo b");
        assert_eq!(
            tool_result_line("bash", false, "a\nb\n\n[exit status: 1]", None),
            line(Style::Bad, "✗ bash: a (+2 more lines)")
        );
        assert_eq!(
            tool_result_line("bash", true, "a\nb", Some(3)),
            line(Style::Good, "✓ bash: a (+1 more line: /show 3)")
        );
    }

    #[test]
    fn an_mcp_tool_shows_its_input_as_json_and_its_rule_once() {
        use prost_types::value::Kind as V;
        let num = |n| prost_types::Value {
            kind: Some(V::NumberValue(n)),
        };
        let i = prost_types::Struct {
            fields: [("a".to_string(), num(2.0)), ("b".to_string(), num(-0.5))].into(),
        };
        assert_eq!(
            tool_call_line("mcp__demo__add", Some(&i)),
            r#"⚙ mcp__demo__add {"a":2,"b":-0.5}"#
        );
        assert_eq!(
            tool_result_line("mcp__demo__add", true, "5", None),
            line(Style::Good, "✓ mcp__demo__add: 5")
        );
        let rule = |kind: pb::RuleKind, tool: &str, pattern: &str| {
            let mut r = pb::PermissionRule {
                tool: tool.into(),
                pattern: pattern.into(),
                ..Default::default()
            };
            r.set_kind(kind);
            always_line(&r)
        };
        assert_eq!(
            rule(pb::RuleKind::Tool, "mcp__demo__add", "mcp__demo__add"),
            "· always allowing every `mcp__demo__add` call in this workspace"
        );
        assert_eq!(
            rule(pb::RuleKind::Prefix, "bash", "ls"),
            "· always allowing bash `ls` in this workspace"
        );
    }

    #[test]
    fn one_is_singular_everywhere() {
        assert_eq!(count(1, "byte"), "1 byte");
        assert_eq!(
            (count(0, "byte"), count(2, "line")),
            ("0 bytes".into(), "2 lines".into())
        );
        let i = input(&[("path", "f.txt"), ("content", "x")]);
        assert_eq!(
            tool_call_line("write_file", Some(&i)),
            "⚙ write_file f.txt (1 byte)"
        );
        // The server's own phrases for write_file, as the approval question and the result show them.
        assert_eq!(
            tool_text("write_file", "write 1 bytes to a.txt"),
            "write 1 byte to a.txt"
        );
        assert_eq!(
            tool_result_line("write_file", true, "wrote 1 bytes to 1 bytes.txt", None),
            line(Style::Good, "✓ write_file: wrote 1 byte to 1 bytes.txt")
        );
        assert_eq!(
            tool_text("write_file", "wrote 11 bytes to a"),
            "wrote 11 bytes to a"
        );
        // Anything else is the command's own output, shown as it is.
        assert_eq!(tool_text("bash", "wrote 1 bytes to x"), "wrote 1 bytes to x");
    }

    #[test]
    fn outputs_are_kept_for_show_only_when_interactive() {
        let mut r = Render::interactive();
        let call = pb::Event {
            kind: Some(Kind::ToolCall(pb::ToolCall {
                call_id: "c1".into(),
                tool: "bash".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let result = pb::Event {
            kind: Some(Kind::ToolResult(pb::ToolResult {
                call_id: "c1".into(),
                ok: true,
                output: "one\ntwo\nthree\n".into(),
            })),
            ..Default::default()
        };
        r.event(&call);
        assert_eq!(
            r.event(&result),
            vec![line(Style::Good, "✓ bash: one (+2 more lines: /show 1)")]
        );
        assert_eq!(
            full_output(1, &r.outputs()[0]),
            vec![
                line(Style::Info, "── /show 1: ✓ bash output ──"),
                line(Style::Plain, "one"),
                line(Style::Plain, "two"),
                line(Style::Plain, "three"),
            ]
        );
        let mut plain = Render::default();
        plain.event(&call);
        assert_eq!(
            plain.event(&result),
            vec![line(Style::Good, "✓ bash: one (+2 more lines)")]
        );
        assert!(plain.outputs().is_empty());
    }

    #[test]
    fn a_retrying_status_is_one_dim_line_and_a_plain_one_nothing() {
        let status = |retrying| pb::Event {
            kind: Some(Kind::Status(pb::Status { busy: true, retrying })),
            ..Default::default()
        };
        let mut r = Render::default();
        assert!(r.event(&status(None)).is_empty());
        let retrying = pb::Retrying {
            attempt: 1,
            of: 3,
            reason: "could not reach the model service at 127.0.0.1:9 (connection refused)\x1b[2J".into(),
        };
        assert_eq!(
            r.event(&status(Some(retrying))),
            vec![line(
                Style::Dim,
                "retrying 1/3: could not reach the model service at 127.0.0.1:9 (connection refused)[2J"
            )]
        );
    }

    fn child(id: &str, kind: pb::WorkerKind, state: pb::WorkerState) -> pb::Worker {
        let mut w = pb::Worker {
            id: id.into(),
            parent_id: "p".into(),
            prompt: "write the README\nwith care".into(),
            branch: format!("vak/p/{id}"),
            ..Default::default()
        };
        w.set_kind(kind);
        w.set_state(state);
        w
    }

    #[test]
    fn children_and_dev_servers_are_one_line_each() {
        let ev = |kind: Kind| pb::Event {
            seq: 3,
            session_id: "p".into(),
            kind: Some(kind),
        };
        let worker = |phase: pb::WorkerPhase, w: pb::Worker| {
            let mut e = pb::WorkerEvent {
                worker: Some(Box::new(w)),
                ..Default::default()
            };
            e.set_phase(phase);
            Kind::Worker(e)
        };
        let mut r = Render::default();
        let (w, c) = (pb::WorkerKind::Worker, pb::WorkerKind::Candidate);
        assert_eq!(
            r.event(&ev(worker(
                pb::WorkerPhase::Spawned,
                child("c1", w, pb::WorkerState::Running)
            ))),
            vec![line(
                Style::Dim,
                "⑂ worker c1 spawned on vak/p/c1: write the README"
            )]
        );
        let mut done = child("c1", w, pb::WorkerState::Finished);
        done.summary = "Added README.md.\n\nDetails follow.".into();
        done.diff_stat = Some(pb::DiffStat {
            files: 1,
            insertions: 12,
            deletions: 0,
        });
        assert_eq!(
            r.event(&ev(worker(pb::WorkerPhase::Finished, done))),
            vec![line(
                Style::Good,
                "✓ worker c1 finished (1 file +12 -0): Added README.md."
            )]
        );
        let mut failed = child("c2", w, pb::WorkerState::Failed);
        failed.summary = "the model failed".into();
        assert_eq!(
            r.event(&ev(worker(pb::WorkerPhase::Finished, failed))),
            vec![line(Style::Bad, "✗ worker c2 failed: the model failed")]
        );
        let bench = pb::Workbench {
            bestofn_id: "bon_0123456789ab".into(),
            candidate: Some(Box::new(child("c3", c, pb::WorkerState::Running))),
        };
        assert_eq!(
            r.event(&ev(Kind::Workbench(bench))),
            vec![line(Style::Dim, "⑂ candidate c3 running")]
        );
        let mut gone = pb::DraftDiscarded {
            candidate: "c4".into(),
            branch: "vak/p/c4".into(),
            ..Default::default()
        };
        gone.set_why(pb::DiscardReason::KeptOther);
        assert_eq!(
            r.event(&ev(Kind::DraftDiscarded(gone))),
            vec![line(
                Style::Dim,
                "· candidate c4 removed: another candidate was kept (branch vak/p/c4 deleted)"
            )]
        );
        let mut out = pb::LaunchOutput {
            name: "web".into(),
            text: "ready on :3000\nGET /\n".into(),
            ..Default::default()
        };
        out.set_stream(pb::OutputStream::Stdout);
        assert_eq!(
            r.event(&ev(Kind::LaunchOutput(out.clone()))),
            vec![
                line(Style::Dim, "[web] ready on :3000"),
                line(Style::Dim, "[web] GET /"),
            ]
        );
        out.set_stream(pb::OutputStream::Stderr);
        out.text = (1..=25).map(|i| format!("e{i}\n")).collect();
        let shown = r.event(&ev(Kind::LaunchOutput(out)));
        assert_eq!(shown.len(), LAUNCH_LINES + 1);
        assert_eq!(shown[0], line(Style::Note, "[web] e1"));
        assert_eq!(shown[LAUNCH_LINES], line(Style::Dim, "[web] … (+5 more lines)"));
    }

    #[test]
    fn the_worker_list_is_a_line_per_child() {
        assert_eq!(
            worker_list(&[]),
            vec![line(Style::Info, "no workers in this session")]
        );
        let mut done = child("c1", pb::WorkerKind::Candidate, pb::WorkerState::Finished);
        done.summary = "Fixed it.".into();
        done.diff_stat = Some(pb::DiffStat {
            files: 2,
            insertions: 5,
            deletions: 1,
        });
        let mut running = child("c2", pb::WorkerKind::Worker, pb::WorkerState::Running);
        running.branch.clear();
        assert_eq!(
            worker_list(&[done, running]),
            vec![
                line(Style::Info, "2 workers of this session:"),
                line(
                    Style::Plain,
                    "  c1  candidate  finished  vak/p/c1  2 files +5 -1  Fixed it."
                ),
                line(Style::Plain, "  c2  worker  running  write the README"),
            ]
        );
    }

    fn background(source: &str, id: &str, text: &str, reason: Option<&str>) -> pb::BackgroundResult {
        let mut b = pb::BackgroundResult {
            id: id.into(),
            text: text.into(),
            alert: reason.is_some(),
            ..Default::default()
        };
        b.set_source(pb::BackgroundSource::from_json_name(source).expect("a source"));
        if let Some(r) = reason {
            b.set_reason(pb::BackgroundReason::from_json_name(r).expect("a reason"));
        }
        b
    }

    #[test]
    fn a_background_result_is_one_entry_and_an_alert_is_marked_as_one() {
        let ev = |b: pb::BackgroundResult| pb::Event {
            seq: 9,
            session_id: "s".into(),
            kind: Some(Kind::BackgroundResult(b)),
        };
        let mut r = Render::default();
        assert_eq!(
            r.event(&ev(background(
                "script",
                "task_0123456789ab",
                "  all quiet\n",
                None
            ))),
            vec![line(
                Style::Info,
                "⟲ background (script task_0123456789ab): all quiet"
            )]
        );
        assert_eq!(
            r.event(&ev(background(
                "script",
                "task_0123456789ab",
                "exit code 3\ndisk is \x1b[31mfull",
                Some("script_failed")
            ))),
            vec![
                line(
                    Style::Bad,
                    "⚠ script_failed (script task_0123456789ab): exit code 3"
                ),
                line(Style::Note, "  disk is [31mfull"),
            ]
        );
        let mut budget = background(
            "budget",
            "budget:2026-12-04:80",
            "80% of today's budget",
            Some("budget_80"),
        );
        budget.summarised = 2;
        assert_eq!(
            background_lines(&budget),
            vec![line(
                Style::Bad,
                "⚠ budget_80 (budget budget:2026-12-04:80) [2 results summarised]: 80% of today's budget"
            )]
        );
        // A long output is cut, saying where the rest is.
        let long: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let shown = background_lines(&background("task", "task_x", &long, None));
        assert_eq!(shown.len(), 1 + BACKGROUND_LINES + 1);
        assert_eq!(shown[1], line(Style::Plain, "  line 2"));
        assert_eq!(
            shown.last().unwrap(),
            &line(Style::Info, "  … (+9 more lines in the transcript)")
        );
        // An empty text says only where it came from.
        assert_eq!(
            background_lines(&background("worker", "w1", "", None)),
            vec![line(Style::Info, "⟲ background (worker w1)")]
        );
    }

    #[test]
    fn a_transcript_replays_its_background_messages() {
        let mut m = pb::Message {
            text: "all quiet".into(),
            background: Some(background("script", "task_a", "all quiet", None)),
            ..Default::default()
        };
        m.set_role(pb::MessageRole::Background);
        let bare = pb::Message {
            role: pb::MessageRole::Background as i32,
            text: "no result attached".into(),
            ..Default::default()
        };
        let t = pb::Transcript {
            messages: vec![m, bare],
            ..Default::default()
        };
        assert_eq!(
            Render::default().transcript(&t),
            vec![
                line(Style::Info, "⟲ background (script task_a): all quiet"),
                line(Style::Info, "⟲ background: no result attached"),
            ]
        );
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(clean("a\x1b[2Jb\r\n\tc\u{7}"), "a[2Jb\n    c");
    }

    #[test]
    fn live_output_shows_finished_lines_under_the_call_and_the_rest_with_the_result() {
        let mut r = Render::default();
        let ev = |kind| pb::Event {
            seq: 1,
            session_id: "s".into(),
            kind: Some(kind),
        };
        let out = |stream: &str, text: &str| {
            ev(Kind::ToolOutput(pb::ToolOutput {
                call_id: "c".into(),
                stream: pb::OutputStream::from_json_name(stream).expect("a stream") as i32,
                text: text.into(),
            }))
        };
        let dim = |t: &str| line(Style::Dim, t);
        assert_eq!(r.event(&out("stdout", "one\ntw")), vec![dim("  │ one")]);
        assert_eq!(r.event(&out("stderr", "oops\n")), vec![dim("  ! oops")]);
        assert_eq!(r.event(&out("stdout", "o\nthr")), vec![dim("  │ two")]);
        let end = r.event(&ev(Kind::ToolResult(pb::ToolResult {
            call_id: "c".into(),
            ok: true,
            output: "one\ntwo\nthree".into(),
        })));
        assert_eq!(end[0], dim("  │ thr"));
        assert_eq!(end.len(), 2, "{end:?}");
        assert!(r.partial.is_empty());
    }
}
