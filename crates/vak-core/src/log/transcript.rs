//! The transcript: a fold of client events into messages and usage, shared by the live session, a reload from the ledger, and Markdown export.

use crate::event::AttachmentRef;
use crate::event::{BackgroundResult, ClientEvent, Compaction, Note, RunOutcome, StopReason, Undo};
use crate::provider::{ChatMessage, Thinking, TokenUsage, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    User,
    Assistant,
    Tool,
    /// How a run ended, when it did not complete or its reply was cut: its outcome and the human message.
    Run,
    /// A background result delivered while the session was idle.
    Background,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Run => "run",
            Role::Background => "background",
        }
    }
}

/// One transcript entry; see proto `Message` for which fields each role uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub text: String,
    pub thinking: String,
    /// Assistant only: the provider's signature over `thinking`, sent back with it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
    /// Assistant only: the model's stream broke in this message and the turn
    /// was started again (a second turn_started in the run); the model never
    /// sees it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Tool only: the first call of a model turn (the turn's usage was
    /// noted just before it), so `chat` can tell turns apart.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub first_of_turn: bool,
    pub call_id: String,
    pub tool: String,
    pub input: Value,
    pub ok: bool,
    /// Role::Run only: how the run ended (Completed only with a stop reason).
    pub outcome: Option<RunOutcome>,
    /// Role::Run only: why the last reply stopped, when not on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    pub seq: u64,
    /// Role::User only: the input's images, by reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentRef>,
    /// Role::Background only: the result delivered (its text is `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<BackgroundResult>,
}

impl Message {
    fn new(role: Role, seq: u64) -> Self {
        Message {
            role,
            text: String::new(),
            thinking: String::new(),
            signature: String::new(),
            interrupted: false,
            first_of_turn: false,
            call_id: String::new(),
            tool: String::new(),
            input: Value::Null,
            ok: false,
            outcome: None,
            stop_reason: None,
            seq,
            attachments: Vec::new(),
            background: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub messages: Vec<Message>,
    pub usage: TokenUsage,
    /// Each model turn's usage, with the seq of the last event before it ended.
    #[serde(default)]
    pub turns: Vec<(u64, TokenUsage)>,
    /// The seq of the last event folded in: the transcript is exact as of it.
    pub seq: u64,
    /// A model turn just ended (its usage was noted): the next tool call is
    /// the first of that turn's calls.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub turn_ended: bool,
    /// The latest compaction: the model sees its summary instead of the
    /// messages up to its seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
    /// What the last model turn's request and answer came to, in tokens:
    /// how full the model's context window is.
    #[serde(default)]
    pub context_tokens: u64,
    /// Exchanges taken back from the model (`Undo`): it no longer sees
    /// the messages in these seq ranges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undone: Vec<Undo>,
}

/// How a compacted history begins, before the summary.
pub const COMPACTED: &str =
    "[The earlier conversation was compacted to save context. Its summary, which you wrote:]";

impl Transcript {
    /// Folds one published event in; events that do not shape the
    /// conversation (status, approvals, run bookkeeping) leave it unchanged.
    pub fn apply(&mut self, seq: u64, event: &ClientEvent) {
        // A side run is a branch beside the conversation: not in it, and
        // `seq` stays the last main event (a resync resumes before it).
        if let ClientEvent::Side { .. } = event {
            return;
        }
        self.seq = self.seq.max(seq);
        let turn_ended = match event {
            ClientEvent::ToolCall { .. }
            | ClientEvent::UserMessage { .. }
            | ClientEvent::TextDelta { .. }
            | ClientEvent::ThinkingDelta { .. } => std::mem::take(&mut self.turn_ended),
            _ => self.turn_ended,
        };
        match event {
            ClientEvent::UserMessage {
                text, attachments, ..
            } => {
                let mut m = Message::new(Role::User, seq);
                m.text = text.clone();
                m.attachments = attachments.clone();
                self.messages.push(m);
            }
            ClientEvent::TurnStarted { .. } => {
                // Within a run the model's turns follow each other without a
                // turn_started; a second one means the stream broke and the
                // turn starts over.
                if let Some(m) = self.messages.last_mut().filter(|m| m.role == Role::Assistant) {
                    m.interrupted = true;
                }
            }
            ClientEvent::TextDelta { text } => self.assistant(seq).text.push_str(text),
            ClientEvent::ThinkingDelta { text } => {
                // Thinking after a signed block starts a new message: one
                // signature covers one block.
                let m = self.assistant(seq);
                if !m.signature.is_empty() {
                    self.messages.push(Message::new(Role::Assistant, seq));
                }
                self.assistant(seq).thinking.push_str(text)
            }
            ClientEvent::ToolCall { call_id, tool, input } => {
                let mut m = Message::new(Role::Tool, seq);
                m.first_of_turn = turn_ended;
                m.call_id = call_id.clone();
                m.tool = tool.clone();
                m.input = input.clone();
                self.messages.push(m);
            }
            ClientEvent::ToolResult { call_id, ok, output } => {
                if let Some(m) = self
                    .messages
                    .iter_mut()
                    .rev()
                    .find(|m| m.role == Role::Tool && &m.call_id == call_id)
                {
                    m.ok = *ok;
                    m.text = output.clone();
                }
            }
            // A completed run speaks for itself unless its reply was cut or
            // stopped; one that failed or was cancelled says so, with the
            // message its clients were shown.
            ClientEvent::RunFinished {
                outcome,
                message,
                stop_reason,
            } if *outcome != RunOutcome::Completed || stop_reason.is_some() => {
                let mut m = Message::new(Role::Run, seq);
                m.outcome = Some(*outcome);
                m.stop_reason = *stop_reason;
                m.text = message.clone();
                self.messages.push(m);
            }
            ClientEvent::BackgroundResult { result, .. } => {
                let mut m = Message::new(Role::Background, seq);
                m.text = result.text.clone();
                m.background = Some(result.clone());
                self.messages.push(m);
            }
            _ => {}
        }
    }

    /// Folds in an internal fact the ledger keeps beside the events.
    pub fn note(&mut self, note: &Note) {
        match note {
            Note::Usage(u) => {
                self.usage.add(*u);
                self.turns.push((self.seq, *u));
                self.turn_ended = true;
                self.context_tokens =
                    u.input_tokens + u.cache_read_tokens + u.cache_write_tokens + u.output_tokens;
            }
            Note::Compaction(c) => {
                self.compaction = Some(c.clone());
                // Unknown until the next turn reports it; small by design.
                self.context_tokens = 0;
            }
            Note::Undo(u) => {
                self.undone.push(*u);
                self.context_tokens = 0;
            }
            Note::Signature(sig) => {
                if let Some(m) = self.messages.last_mut().filter(|m| m.role == Role::Assistant) {
                    m.signature = sig.clone();
                }
            }
            // The session's background queue folds these, not the transcript;
            // receipts are read from the ledger, never folded.
            Note::Background(_) | Note::Receipt(_) => {}
        }
    }

    /// Whether the model still sees the message opened at `seq` (no undo took it back).
    fn seen(&self, seq: u64) -> bool {
        !self.undone.iter().any(|u| u.after_seq < seq && seq <= u.upto_seq)
    }

    /// The last exchange the model still sees, as the undo that takes it
    /// back up to `latest`: from just before its user message on. None when
    /// the model sees no user message (nothing, or everything compacted).
    pub fn last_exchange(&self, latest: u64) -> Option<Undo> {
        let upto = self.compaction.as_ref().map_or(0, |c| c.upto_seq);
        let user = self
            .messages
            .iter()
            .rev()
            .take_while(|m| m.seq > upto)
            .find(|m| m.role == Role::User && self.seen(m.seq))?;
        Some(Undo {
            after_seq: user.seq - 1,
            upto_seq: latest,
        })
    }

    /// The conversation as a model sees it: the assistant's tool calls
    /// grouped with the text before them, each followed by its result;
    /// interrupted attempts and run notes left out.
    pub fn chat(&self) -> Vec<ChatMessage> {
        let mut out: Vec<ChatMessage> = Vec::new();
        let mut results: Vec<ChatMessage> = Vec::new();
        let mut background = String::new();
        let upto = self.compaction.as_ref().map_or(0, |c| c.upto_seq);
        // A cleared history is a compaction with no summary: nothing stands in for it.
        if let Some(c) = self.compaction.as_ref().filter(|c| !c.summary.is_empty()) {
            out.push(ChatMessage::User {
                text: format!("{COMPACTED}\n\n{}", c.summary),
                images: Vec::new(),
            });
        }
        for m in self.messages.iter().filter(|m| m.seq > upto && self.seen(m.seq)) {
            if m.role != Role::Tool {
                out.append(&mut results);
            }
            match m.role {
                Role::User => out.push(ChatMessage::User {
                    text: if background.is_empty() {
                        m.text.clone()
                    } else {
                        format!("{}\n{}", std::mem::take(&mut background), m.text)
                    },
                    images: crate::event::images(&m.attachments),
                }),
                // The model hears of background results with the next input
                // (a leg always starts with one), so roles still alternate.
                Role::Background => {
                    let (source, id) = m
                        .background
                        .as_ref()
                        .map_or(("background", ""), |b| (b.source.as_str(), b.id.as_str()));
                    let _ = write!(
                        background,
                        "[A background result arrived while you were idle, from {source} {id}:]\n{}\n",
                        m.text
                    );
                }
                Role::Assistant if m.interrupted => {}
                Role::Assistant => {
                    let thinking = if m.thinking.is_empty() {
                        Vec::new()
                    } else {
                        vec![Thinking {
                            text: m.thinking.clone(),
                            signature: m.signature.clone(),
                        }]
                    };
                    out.push(ChatMessage::Assistant {
                        thinking,
                        text: m.text.clone(),
                        tool_calls: Vec::new(),
                    });
                }
                Role::Tool => {
                    if m.first_of_turn {
                        out.append(&mut results);
                    }
                    let call = ToolCall {
                        id: m.call_id.clone(),
                        name: m.tool.clone(),
                        input: m.input.clone(),
                    };
                    // A call belongs to the assistant message of the turn
                    // that made it (the last one pushed), or to an empty one
                    // when that turn said nothing.
                    if results.is_empty() && !matches!(out.last(), Some(ChatMessage::Assistant { .. })) {
                        out.push(ChatMessage::Assistant {
                            thinking: Vec::new(),
                            text: String::new(),
                            tool_calls: Vec::new(),
                        });
                    }
                    if let Some(ChatMessage::Assistant { tool_calls, .. }) = out.last_mut() {
                        tool_calls.push(call);
                    }
                    results.push(ChatMessage::ToolResult {
                        call_id: m.call_id.clone(),
                        content: m.text.clone(),
                        is_error: !m.ok,
                    });
                }
                Role::Run => {}
            }
        }
        out.append(&mut results);
        out
    }

    fn assistant(&mut self, seq: u64) -> &mut Message {
        // An interrupted attempt stays as it was; the retry is a new message.
        if self
            .messages
            .last()
            .is_none_or(|m| m.role != Role::Assistant || m.interrupted)
        {
            self.messages.push(Message::new(Role::Assistant, seq));
        }
        self.messages.last_mut().expect("just pushed")
    }

    /// The messages after the last user message (what the model has produced for it so far).
    pub fn since_last_user(&self) -> (&str, &[Message]) {
        match self.messages.iter().rposition(|m| m.role == Role::User) {
            Some(i) => (&self.messages[i].text, &self.messages[i + 1..]),
            None => ("", &[]),
        }
    }

    /// The Markdown export served at /sessions/:id/transcript.md.
    pub fn markdown(&self, session_id: &str) -> String {
        let mut out = format!("# Session {session_id}\n");
        for m in &self.messages {
            match m.role {
                Role::User => {
                    let _ = write!(out, "\n## User\n\n{}\n", m.text);
                }
                Role::Assistant => {
                    let note = if m.interrupted { " (interrupted)" } else { "" };
                    let _ = write!(out, "\n## Assistant{note}\n\n");
                    if !m.thinking.is_empty() {
                        for line in m.thinking.lines() {
                            let _ = writeln!(out, "> {line}");
                        }
                    }
                    if !m.text.is_empty() {
                        // A blank line between the quoted thinking and the answer.
                        let gap = if m.thinking.is_empty() { "" } else { "\n" };
                        let _ = writeln!(out, "{gap}{}", m.text);
                    }
                }
                Role::Tool => {
                    let status = if m.ok { "ok" } else { "failed" };
                    let _ = write!(
                        out,
                        "\n### Tool `{}` ({status})\n\n```json\n{}\n```\n\n```text\n{}\n```\n",
                        m.tool, m.input, m.text
                    );
                }
                Role::Run => {
                    let outcome = m.outcome.map_or("ended", |o| o.as_str());
                    let why = m
                        .stop_reason
                        .map(|r| format!(" ({})", r.as_str()))
                        .unwrap_or_default();
                    let _ = write!(out, "\n## Run {outcome}{why}\n\n{}\n", m.text);
                }
                Role::Background => {
                    let from = m
                        .background
                        .as_ref()
                        .map(|b| format!(" from {} {}", b.source.as_str(), b.id))
                        .unwrap_or_default();
                    let _ = write!(out, "\n## Background{from}\n\n{}\n", m.text);
                }
            }
        }
        let _ = write!(
            out,
            "\n---\n\nUsage: {} input tokens, {} output tokens.\n",
            self.usage.input_tokens, self.usage.output_tokens
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_fold_into_messages() {
        let mut t = Transcript::default();
        let evs = [
            ClientEvent::UserMessage {
                text: "/read a\nhi".into(),
                request_id: "r".into(),
                attachments: Vec::new(),
            },
            ClientEvent::ThinkingDelta { text: "hm".into() },
            ClientEvent::ToolCall {
                call_id: "c1".into(),
                tool: "read_file".into(),
                input: json!({"path": "a"}),
            },
            ClientEvent::status(true),
            ClientEvent::ToolResult {
                call_id: "c1".into(),
                ok: true,
                output: "A".into(),
            },
            ClientEvent::TextDelta {
                text: "echo: ".into(),
            },
            ClientEvent::TextDelta { text: "hi".into() },
        ];
        for (i, e) in evs.iter().enumerate() {
            t.apply(i as u64 + 1, e);
        }
        let roles: Vec<_> = t.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool, Role::Assistant]);
        assert_eq!(t.messages[2].text, "A");
        assert!(t.messages[2].ok);
        assert_eq!(t.messages[3].text, "echo: hi");
        assert_eq!(t.messages[3].seq, 6);
        let (prompt, since) = t.since_last_user();
        assert_eq!(prompt, "/read a\nhi");
        assert_eq!(since.len(), 3);
        assert_eq!(t.seq, 7, "exact as of the last event folded in");
        let md = t.markdown("s");
        assert!(md.contains("## User\n\n/read a\nhi\n"));
        assert!(md.contains("echo: hi"));
        assert!(md.contains("### Tool `read_file` (ok)"));
    }

    #[test]
    fn runs_that_did_not_complete_say_how_they_ended() {
        let mut t = Transcript::default();
        let finished = |outcome, message: &str| ClientEvent::RunFinished {
            outcome,
            message: message.into(),
            stop_reason: None,
        };
        t.apply(
            1,
            &ClientEvent::UserMessage {
                text: "a".into(),
                request_id: "r".into(),
                attachments: Vec::new(),
            },
        );
        t.apply(2, &finished(RunOutcome::Completed, "completed"));
        t.apply(
            3,
            &ClientEvent::UserMessage {
                text: "b".into(),
                request_id: "s".into(),
                attachments: Vec::new(),
            },
        );
        t.apply(4, &finished(RunOutcome::Failed, "the model failed: boom"));
        t.apply(
            5,
            &ClientEvent::UserMessage {
                text: "c".into(),
                request_id: "u".into(),
                attachments: Vec::new(),
            },
        );
        t.apply(6, &finished(RunOutcome::Cancelled, "cancelled by a client"));
        let roles: Vec<_> = t.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::User, Role::Run, Role::User, Role::Run]);
        assert_eq!(t.messages[2].outcome, Some(RunOutcome::Failed));
        assert_eq!(t.messages[2].text, "the model failed: boom");
        assert_eq!(t.messages[2].seq, 4);
        let md = t.markdown("s");
        assert!(md.contains("\n## Run failed\n\nthe model failed: boom\n"), "{md}");
        assert!(
            md.contains("\n## Run cancelled\n\ncancelled by a client\n"),
            "{md}"
        );
        assert!(!md.contains("Run completed"));
    }

    #[test]
    fn markdown_has_one_blank_line_between_sections() {
        let mut t = Transcript::default();
        t.apply(
            1,
            &ClientEvent::UserMessage {
                text: "q".into(),
                request_id: "r".into(),
                attachments: Vec::new(),
            },
        );
        t.apply(2, &ClientEvent::ThinkingDelta { text: "hmm".into() });
        t.apply(
            3,
            &ClientEvent::RunFinished {
                outcome: RunOutcome::Failed,
                message: "boom".into(),
                stop_reason: None,
            },
        );
        t.apply(
            4,
            &ClientEvent::UserMessage {
                text: "q2".into(),
                request_id: "s".into(),
                attachments: Vec::new(),
            },
        );
        t.apply(5, &ClientEvent::ThinkingDelta { text: "a\nb".into() });
        t.apply(
            6,
            &ClientEvent::TextDelta {
                text: "answer".into(),
            },
        );
        let md = t.markdown("s");
        assert!(!md.contains("\n\n\n"), "{md:?}");
        assert!(md.contains("> hmm\n\n## Run failed\n\nboom\n"), "{md:?}");
        assert!(md.contains("> a\n> b\n\nanswer\n"), "{md:?}");
    }

    fn fold(events: &[ClientEvent]) -> Transcript {
        let mut t = Transcript::default();
        for (i, e) in events.iter().enumerate() {
            t.apply(i as u64 + 1, e);
        }
        t
    }

    fn call(id: &str) -> ClientEvent {
        ClientEvent::ToolCall {
            call_id: id.into(),
            tool: "read_file".into(),
            input: json!({"path": id}),
        }
    }

    fn result(id: &str, ok: bool) -> ClientEvent {
        ClientEvent::ToolResult {
            call_id: id.into(),
            ok,
            output: format!("out {id}"),
        }
    }

    #[test]
    fn chat_groups_a_turns_tool_calls_with_its_text_and_follows_them_with_their_results() {
        let user = |t: &str| ClientEvent::UserMessage {
            text: t.into(),
            request_id: "r".into(),
            attachments: Vec::new(),
        };
        let text = |t: &str| ClientEvent::TextDelta { text: t.into() };
        // As the agent publishes them: each turn's usage is noted when the
        // turn ends, before its calls run one after the other.
        let turn_end = ClientEvent::status(true);
        let mut t = Transcript::default();
        for (i, e) in [
            user("q"),
            ClientEvent::TurnStarted {
                request_id: "r".into(),
            },
            text("let me look"),
            turn_end.clone(),
            call("toolu_1"),
            result("toolu_1", true),
            call("toolu_2"),
            result("toolu_2", false),
            turn_end.clone(),
            call("toolu_3"),
            result("toolu_3", true),
            text("done"),
            turn_end,
            ClientEvent::RunFinished {
                outcome: RunOutcome::Completed,
                message: "completed".into(),
                stop_reason: None,
            },
        ]
        .iter()
        .enumerate()
        {
            if *e == (ClientEvent::status(true)) {
                t.note(&Note::Usage(TokenUsage::default()));
            } else {
                t.apply(i as u64 + 1, e);
            }
        }
        let assistant = |text: &str, ids: &[&str]| ChatMessage::Assistant {
            thinking: vec![],
            text: text.into(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: id.to_string(),
                    name: "read_file".into(),
                    input: json!({"path": id}),
                })
                .collect(),
        };
        let res = |id: &str, is_error: bool| ChatMessage::ToolResult {
            call_id: id.into(),
            content: format!("out {id}"),
            is_error,
        };
        assert_eq!(
            t.chat(),
            [
                ChatMessage::User {
                    text: "q".into(),
                    images: Vec::new()
                },
                assistant("let me look", &["toolu_1", "toolu_2"]),
                res("toolu_1", false),
                res("toolu_2", true),
                assistant("", &["toolu_3"]),
                res("toolu_3", false),
                assistant("done", &[]),
            ]
        );
    }

    #[test]
    fn a_restarted_turn_marks_the_broken_attempt_which_the_model_never_sees_again() {
        let t = fold(&[
            ClientEvent::UserMessage {
                text: "q".into(),
                request_id: "r".into(),
                attachments: Vec::new(),
            },
            ClientEvent::TurnStarted {
                request_id: "r".into(),
            },
            ClientEvent::TextDelta { text: "Hel".into() },
            ClientEvent::TurnStarted {
                request_id: "r".into(),
            },
            ClientEvent::TextDelta {
                text: "Hello!".into(),
            },
        ]);
        let kinds: Vec<_> = t
            .messages
            .iter()
            .map(|m| (m.role, m.interrupted, m.text.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (Role::User, false, "q"),
                (Role::Assistant, true, "Hel"),
                (Role::Assistant, false, "Hello!")
            ]
        );
        assert_eq!(
            t.chat()[1],
            ChatMessage::Assistant {
                thinking: vec![],
                text: "Hello!".into(),
                tool_calls: vec![]
            }
        );
        assert!(t.markdown("s").contains("## Assistant (interrupted)\n\nHel\n"));
    }

    #[test]
    fn signatures_stay_with_the_thinking_they_sign_and_usage_adds_up() {
        let mut t = Transcript::default();
        t.apply(1, &ClientEvent::ThinkingDelta { text: "first".into() });
        t.note(&Note::Signature("sig-1".into()));
        t.apply(
            2,
            &ClientEvent::ThinkingDelta {
                text: "second".into(),
            },
        );
        t.note(&Note::Signature("sig-2".into()));
        t.apply(
            3,
            &ClientEvent::TextDelta {
                text: "answer".into(),
            },
        );
        let u = TokenUsage {
            input_tokens: 10,
            output_tokens: 2,
            cache_read_tokens: 7,
            cache_write_tokens: 1,
        };
        t.note(&Note::Usage(u));
        t.note(&Note::Usage(u));
        let thinking: Vec<_> = t
            .chat()
            .into_iter()
            .filter_map(|m| match m {
                ChatMessage::Assistant { thinking, .. } => Some(thinking),
                _ => None,
            })
            .collect();
        assert_eq!(
            thinking,
            [
                vec![Thinking {
                    text: "first".into(),
                    signature: "sig-1".into()
                }],
                vec![Thinking {
                    text: "second".into(),
                    signature: "sig-2".into()
                }]
            ]
        );
        assert_eq!(t.usage.cache_read_tokens, 14);
        assert_eq!(t.usage.input_tokens, 20);
    }
}
