//! Event types: what the agent loop emits internally, what clients see, and the projection between them.

pub use crate::background::BackgroundResult;
use crate::background::Pending;
use crate::provider::{Image, TokenUsage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// How a run (a turn chain) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    Cancelled,
    Failed,
    /// The leg reached the max-turns cap with the model still calling tools.
    MaxTurns,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Completed => "completed",
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::Failed => "failed",
            RunOutcome::MaxTurns => "max_turns",
        }
    }
}

/// How an approval request was settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalOutcome {
    Approved,
    Denied,
    Expired,
}

impl ApprovalOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalOutcome::Approved => "approved",
            ApprovalOutcome::Denied => "denied",
            ApprovalOutcome::Expired => "expired",
        }
    }
}

/// Which of a command's output pipes a `tool_output` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// How much a notice matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeLevel {
    Info,
    Warning,
}

impl NoticeLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeLevel::Info => "info",
            NoticeLevel::Warning => "warning",
        }
    }
}

/// Why a model's reply stopped when it did not end on its own: the run still
/// completes, and says so (`run_finished.stop_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Cut at the output token limit.
    MaxTokens,
    /// The model refused.
    Refusal,
    /// The provider's content filter stopped it.
    ContentFilter,
}

impl StopReason {
    /// Why a model's reply that ends the run did not end on its own, if so.
    pub fn of(stop: crate::provider::StopReason) -> Option<StopReason> {
        use crate::provider::StopReason as P;
        match stop {
            P::EndTurn | P::ToolUse => None,
            P::MaxTokens => Some(StopReason::MaxTokens),
            P::Refusal => Some(StopReason::Refusal),
            P::ContentFilter => Some(StopReason::ContentFilter),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::MaxTokens => "max_tokens",
            StopReason::Refusal => "refusal",
            StopReason::ContentFilter => "content_filter",
        }
    }

    /// What `run_finished.message` says for it.
    pub fn message(self) -> &'static str {
        match self {
            StopReason::MaxTokens => "cut at the output limit",
            StopReason::Refusal => "the model refused",
            StopReason::ContentFilter => "stopped by the provider's content filter",
        }
    }
}

/// A run about to try the model service again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retrying {
    /// This retry's number, from 1.
    pub attempt: u32,
    /// How many retries the run may make.
    pub of: u32,
    /// Words for a person: what failed, naming the host when unreachable.
    pub reason: String,
}

/// A client-visible event: what the bus numbers, the ledger persists and every
/// surface streams. Stream-level frames (stream_opened, resync, session_closed)
/// are not events: they belong to one subscription and carry no seq.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClientEvent {
    UserMessage {
        text: String,
        request_id: String,
        /// The input's images, by reference (absent from older ledgers).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<AttachmentRef>,
    },
    TurnStarted {
        request_id: String,
    },
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        text: String,
    },
    ToolCall {
        call_id: String,
        tool: String,
        input: Value,
    },
    ToolResult {
        call_id: String,
        ok: bool,
        output: String,
    },
    /// Output of a running tool (bash) as it arrives: live only, its
    /// tool_result carries the output that counts.
    ToolOutput {
        call_id: String,
        stream: OutputStream,
        text: String,
    },
    ApprovalRequested {
        request_id: String,
        tool: String,
        reason: String,
        input: Value,
        call_id: String,
    },
    ApprovalResolved {
        request_id: String,
        outcome: ApprovalOutcome,
        reason: String,
    },
    Status {
        busy: bool,
        /// Present while the run waits to try the model service again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retrying: Option<Retrying>,
    },
    RunFinished {
        outcome: RunOutcome,
        message: String,
        /// Why the last reply stopped, when it did not end on its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<StopReason>,
    },
    /// Something the session's people should know that no other event says
    /// (an always-allow rule that could not be saved). Shown, never part of
    /// the conversation: the transcript and the timeline skip it.
    Notice {
        level: NoticeLevel,
        text: String,
    },
    /// A side run's frame (issue 15): numbered and persisted like the
    /// others, a branch beside the main conversation that the transcript,
    /// the model's main history and the timeline skip.
    Side {
        side_id: String,
        phase: SidePhase,
    },
    /// Background results delivered while the session is idle (issue 29):
    /// one result, or a summary of several that arrived past the queue's bound.
    BackgroundResult {
        #[serde(flatten)]
        result: BackgroundResult,
        /// Every queued result numbered up to this one is delivered by this
        /// event (the ledger's pending queue folds it away).
        upto: u64,
        /// How many results a summary stands for; 0 for a single result.
        #[serde(default, skip_serializing_if = "is_zero")]
        summarised: u32,
    },
    /// A child of this session was spawned, changed state or finished (issue 30).
    Worker {
        phase: crate::worker::WorkerPhase,
        /// Boxed: a child's record is large next to the other events.
        worker: Box<crate::worker::WorkerInfo>,
    },
    /// A best-of-N candidate's state, with its diff stat once finished.
    Workbench {
        bestofn_id: String,
        candidate: Box<crate::worker::WorkerInfo>,
    },
    /// A candidate's worktree and branch were removed.
    DraftDiscarded {
        candidate: String,
        branch: String,
        why: crate::worker::DiscardWhy,
    },
    /// A commitment of the session's plan was created, updated or closed
    /// (issue 35): its whole state after the change.
    Commitment {
        change: crate::commitment::Change,
        /// Boxed: a commitment is large next to the other events.
        commitment: Box<crate::commitment::Commitment>,
    },
    /// A steering message read as an update of the chain's goal (issue 35).
    GoalUpdate {
        /// Boxed: an update is large next to the other events.
        update: Box<crate::goal::GoalUpdate>,
    },
    /// A dev server's output, batched at the source.
    LaunchOutput {
        name: String,
        stream: OutputStream,
        text: String,
    },
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What one side frame says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SidePhase {
    /// The question, and the last main seq the side run's history reflects.
    Started {
        question: String,
        branch_seq: u64,
    },
    TextDelta {
        text: String,
    },
    Finished {
        outcome: SideOutcome,
        message: String,
        #[serde(default)]
        usage: TokenUsage,
    },
}

/// How a side run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideOutcome {
    Completed,
    Cancelled,
    Failed,
}

impl ClientEvent {
    /// A plain busy/idle status (no retry under way).
    pub fn status(busy: bool) -> Self {
        ClientEvent::Status { busy, retrying: None }
    }

    /// How a run ended, with no stop reason.
    pub fn finished(outcome: RunOutcome, message: impl Into<String>) -> Self {
        ClientEvent::RunFinished {
            outcome,
            message: message.into(),
            stop_reason: None,
        }
    }

    /// The snake_case kind: the SSE `event:` name and the gRPC oneof case.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientEvent::UserMessage { .. } => "user_message",
            ClientEvent::TurnStarted { .. } => "turn_started",
            ClientEvent::TextDelta { .. } => "text_delta",
            ClientEvent::ThinkingDelta { .. } => "thinking_delta",
            ClientEvent::ToolCall { .. } => "tool_call",
            ClientEvent::ToolResult { .. } => "tool_result",
            ClientEvent::ToolOutput { .. } => "tool_output",
            ClientEvent::ApprovalRequested { .. } => "approval_requested",
            ClientEvent::ApprovalResolved { .. } => "approval_resolved",
            ClientEvent::Status { .. } => "status",
            ClientEvent::RunFinished { .. } => "run_finished",
            ClientEvent::Notice { .. } => "notice",
            ClientEvent::Side { .. } => "side",
            ClientEvent::BackgroundResult { .. } => "background_result",
            ClientEvent::Worker { .. } => "worker",
            ClientEvent::Workbench { .. } => "workbench",
            ClientEvent::DraftDiscarded { .. } => "draft_discarded",
            ClientEvent::LaunchOutput { .. } => "launch_output",
            ClientEvent::Commitment { .. } => "commitment",
            ClientEvent::GoalUpdate { .. } => "goal_update",
        }
    }

    /// The text `next` appends to `self` when both are deltas of the same
    /// kind (and for tool_output, of the same call and stream): None when
    /// they do not merge.
    fn merge_texts<'a>(&'a self, next: &'a ClientEvent) -> Option<(&'a String, &'a str)> {
        match (self, next) {
            (ClientEvent::TextDelta { text: a }, ClientEvent::TextDelta { text: b })
            | (ClientEvent::ThinkingDelta { text: a }, ClientEvent::ThinkingDelta { text: b }) => {
                Some((a, b))
            }
            (
                ClientEvent::ToolOutput {
                    call_id: c1,
                    stream: s1,
                    text: a,
                },
                ClientEvent::ToolOutput {
                    call_id: c2,
                    stream: s2,
                    text: b,
                },
            ) if c1 == c2 && s1 == s2 => Some((a, b)),
            _ => None,
        }
    }

    /// A delta's text.
    fn delta_text(&self) -> Option<&str> {
        match self {
            ClientEvent::TextDelta { text }
            | ClientEvent::ThinkingDelta { text }
            | ClientEvent::ToolOutput { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The merged delta's text, mutably (the counterpart of `merge_texts`).
    fn delta_text_mut(&mut self) -> Option<&mut String> {
        match self {
            ClientEvent::TextDelta { text }
            | ClientEvent::ThinkingDelta { text }
            | ClientEvent::ToolOutput { text, .. } => Some(text),
            _ => None,
        }
    }

    /// Appends `next` to `self` when both are deltas of the same kind (and
    /// for tool_output, of the same call and stream): the lossless merge a
    /// full subscriber queue relies on. Returns false (and leaves both
    /// untouched) otherwise. The text grows to `merged_capacity`, so what
    /// a merge will cost is known before it happens (`Frame::size_after_absorbing`).
    pub fn try_merge(&mut self, next: &ClientEvent) -> bool {
        let Some(cap) = self
            .merge_texts(next)
            .map(|(a, b)| merged_capacity(a.capacity(), a.len() + b.len()))
        else {
            return false;
        };
        let (Some(a), Some(b)) = (self.delta_text_mut(), next.delta_text()) else {
            return false;
        };
        a.reserve_exact(cap - a.len());
        a.push_str(b);
        true
    }

    /// Whether `try_merge(next)` would merge.
    pub fn merges_with(&self, next: &ClientEvent) -> bool {
        self.merge_texts(next).is_some()
    }

    /// The payload size that merging grows.
    pub fn delta_len(&self) -> Option<usize> {
        match self {
            ClientEvent::TextDelta { text }
            | ClientEvent::ThinkingDelta { text }
            | ClientEvent::ToolOutput { text, .. } => Some(text.len()),
            _ => None,
        }
    }

    /// `approx_size` with a delta's text counted at its capacity: the bytes
    /// it really holds once merges grew it (what a subscriber's queue budget counts).
    pub fn held_size(&self) -> usize {
        let spare = match self {
            ClientEvent::TextDelta { text }
            | ClientEvent::ThinkingDelta { text }
            | ClientEvent::ToolOutput { text, .. } => text.capacity() - text.len(),
            _ => 0,
        };
        self.approx_size() + spare
    }

    /// Roughly the bytes this event holds.
    pub fn approx_size(&self) -> usize {
        const OVERHEAD: usize = 64;
        OVERHEAD
            + match self {
                ClientEvent::UserMessage {
                    text,
                    request_id,
                    attachments,
                } => text.len() + request_id.len() + attachments.len() * 128,
                ClientEvent::TextDelta { text } | ClientEvent::ThinkingDelta { text } => text.len(),
                ClientEvent::ToolOutput { call_id, text, .. } => call_id.len() + text.len(),
                ClientEvent::ToolCall { input, .. } | ClientEvent::ApprovalRequested { input, .. } => {
                    input.to_string().len()
                }
                ClientEvent::ToolResult { output, .. } => output.len(),
                ClientEvent::RunFinished { message, .. } | ClientEvent::Notice { text: message, .. } => {
                    message.len()
                }
                ClientEvent::BackgroundResult { result, .. } => result.text.len() + result.id.len(),
                ClientEvent::Worker { worker: w, .. } | ClientEvent::Workbench { candidate: w, .. } => {
                    w.prompt.len() + w.summary.len() + w.worktree.len() + 128
                }
                ClientEvent::LaunchOutput { name, text, .. } => name.len() + text.len(),
                ClientEvent::GoalUpdate { update } => {
                    update.text.len() + update.signals.iter().map(|s| s.len() + 24).sum::<usize>() + 128
                }
                ClientEvent::Commitment { commitment: c, .. } => {
                    c.text.len()
                        + c.id.len() * 2
                        + c.evidence.iter().map(|e| e.len() + 24).sum::<usize>()
                        + 256
                }
                ClientEvent::Side { side_id, phase } => {
                    side_id.len()
                        + match phase {
                            SidePhase::Started { question, .. } => question.len(),
                            SidePhase::TextDelta { text } => text.len(),
                            SidePhase::Finished { message, .. } => message.len(),
                        }
                }
                _ => 0,
            }
    }
}

/// The most a merged delta's text grows ahead of its length (doubling, for
/// amortized appends); past it a merge allocates only what it needs.
pub const MERGE_GROWTH_LIMIT: usize = 1 << 20;

/// The capacity a delta's text of capacity `cap` has after growing to hold
/// `need` bytes: unchanged when it fits, else doubled (at most to
/// `MERGE_GROWTH_LIMIT`), and never less than `need`.
pub fn merged_capacity(cap: usize, need: usize) -> usize {
    if need <= cap {
        cap
    } else {
        need.max(cap.saturating_mul(2).min(MERGE_GROWTH_LIMIT))
    }
}

/// What the agent loop emits. Most of it is client-visible; the rest is
/// internal bookkeeping that `project` keeps off every client stream.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    Client(ClientEvent),
    /// The provider failed and the runtime is trying again.
    Retry {
        attempt: u32,
        error: String,
    },
    /// A different model route was chosen (reserved for real providers).
    RouteFallback {
        from: String,
        to: String,
    },
    /// The model summarised the history: persisted (the model sees the
    /// summary from then on), never streamed.
    Compaction(Compaction),
    /// A stop-gate note (reserved for real providers).
    StopGate {
        note: String,
    },
    /// A provider error as the provider reported it.
    RawError(String),
    /// Tokens consumed by one provider turn: persisted, never streamed.
    Usage(TokenUsage),
    /// The provider's signature over the thinking just streamed: persisted
    /// (the model needs it back), never streamed.
    ThinkingSignature(String),
    /// A model call's or tool call's receipt: persisted, never streamed.
    Receipt(Box<crate::receipt::Receipt>),
}

/// An internal fact the ledger keeps between events, folded into the
/// transcript in order with them.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    Usage(TokenUsage),
    Signature(String),
    Compaction(Compaction),
    Undo(Undo),
    /// A background result queued for delivery when the session is idle.
    Background(Pending),
    /// A model call's or tool call's receipt (`GET /sessions/:id/receipts`
    /// reads them from the ledger; no fold keeps them).
    Receipt(Box<crate::receipt::Receipt>),
}

/// The last exchange taken back from the model: it no longer sees the
/// messages with a seq in `after_seq + 1 ..= upto_seq` (clients still see them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undo {
    pub after_seq: u64,
    pub upto_seq: u64,
}

/// The history up to `upto_seq` summarised by the model: from then on the
/// model sees `summary` in place of those messages (clients still see them all).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    pub summary: String,
    pub upto_seq: u64,
}

/// Maps an agent event to what clients may see; internal traffic maps to None.
pub fn project(event: AgentEvent) -> Option<ClientEvent> {
    match event {
        AgentEvent::Client(e) => Some(e),
        AgentEvent::Retry { .. }
        | AgentEvent::RouteFallback { .. }
        | AgentEvent::Compaction(_)
        | AgentEvent::StopGate { .. }
        | AgentEvent::RawError(_)
        | AgentEvent::Usage(_)
        | AgentEvent::ThinkingSignature(_)
        | AgentEvent::Receipt(_) => None,
    }
}

/// A numbered event as the bus holds it. Frames are shared (`Arc`) between the
/// ring and every subscriber queue; `encoded_json` lets an edge serialize a frame
/// once for all of its subscribers.
#[derive(Debug)]
pub struct Frame {
    pub seq: u64,
    pub session_id: Arc<str>,
    pub event: ClientEvent,
    /// `event.held_size()`, kept up to date by `absorb`.
    pub size: usize,
    json: OnceLock<bytes::Bytes>,
    /// Made by merging deltas for one subscriber: never in the ring, so
    /// never encoded while queued.
    merged: bool,
}

impl Frame {
    pub fn new(seq: u64, session_id: Arc<str>, event: ClientEvent) -> Self {
        Frame {
            seq,
            session_id,
            size: event.held_size(),
            event,
            json: OnceLock::new(),
            merged: false,
        }
    }

    /// Appends `next` to this frame when both are same-kind deltas: the frame
    /// then carries `next`'s seq, and any cached encoding is dropped.
    pub fn absorb(&mut self, next: &Frame) -> bool {
        if !self.event.try_merge(&next.event) {
            return false;
        }
        self.seq = next.seq;
        self.merged = true;
        self.size = self.event.held_size();
        self.json = OnceLock::new();
        true
    }

    /// What this frame costs a subscriber's queue: its size, plus, for a
    /// frame as published (shared with the ring and every other queue), the
    /// encoding any reader may have cached on it (`encoded_json`), which a
    /// stalled queue keeps alive as long as the frame. A merged frame is
    /// encoded only once it has left the queue (and then counted as the
    /// reader's `Charge`).
    pub fn queued_cost(&self) -> usize {
        if self.merged {
            return self.size;
        }
        let encoded = match self.event.delta_len() {
            // `{"seq":…,"session_id":"…","text_delta":{"text":"…"}}`
            Some(len) => len + self.session_id.len() + 96,
            None => self.event.approx_size(),
        };
        self.size + encoded
    }

    /// What `size` becomes if this frame absorbs `next` (None: they do not merge).
    pub fn size_after_absorbing(&self, next: &Frame) -> Option<usize> {
        let (a, b) = self.event.merge_texts(&next.event)?;
        Some(self.size - a.capacity() + merged_capacity(a.capacity(), a.len() + b.len()))
    }

    /// One frame holding consecutive same-kind deltas `parts` (at least one),
    /// carrying the last one's seq, its text allocated once at its exact length.
    pub fn merged(parts: &[&Frame]) -> Frame {
        let first = &parts[0];
        let mut event = first.event.clone();
        let len: usize = parts.iter().filter_map(|f| f.event.delta_len()).sum();
        if let Some(text) = event.delta_text_mut() {
            let mut all = String::with_capacity(len);
            all.push_str(text);
            *text = all;
        }
        let mut out = Frame::new(first.seq, first.session_id.clone(), event);
        for f in &parts[1..] {
            let merged = out.absorb(f);
            debug_assert!(merged, "parts of one run merge");
        }
        out
    }

    /// Returns this frame's bytes in `encoding`, computing them at most once.
    pub fn encoded_json(&self, make: impl FnOnce(&Frame) -> bytes::Bytes) -> bytes::Bytes {
        self.json.get_or_init(|| make(self)).clone()
    }
}

/// An attachment as ledgers, events and transcripts hold it: a reference
/// to the file `attachments/<sha256>` in the home, never its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRef {
    /// 64 lowercase hex digits of the SHA-256 of the bytes.
    pub sha256: String,
    pub media_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub size: u64,
}

/// The images of a user message, to be loaded before they are sent.
pub fn images(refs: &[AttachmentRef]) -> Vec<Image> {
    refs.iter()
        .map(|r| Image {
            sha256: r.sha256.clone(),
            media_type: r.media_type.clone(),
            data: String::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_events_never_project() {
        for e in [
            AgentEvent::Retry {
                attempt: 1,
                error: "x".into(),
            },
            AgentEvent::RouteFallback {
                from: "a".into(),
                to: "b".into(),
            },
            AgentEvent::Compaction(Compaction {
                summary: "s".into(),
                upto_seq: 3,
            }),
            AgentEvent::StopGate { note: "n".into() },
            AgentEvent::RawError("boom".into()),
            AgentEvent::Usage(TokenUsage {
                input_tokens: 1,
                output_tokens: 2,
                ..TokenUsage::default()
            }),
            AgentEvent::ThinkingSignature("sig".into()),
            AgentEvent::Receipt(Box::new(crate::receipt::Receipt {
                request_id: "r".into(),
                started_at: "t".into(),
                call: crate::receipt::Call::ToolCall(crate::receipt::ToolCallReceipt {
                    call_id: "c".into(),
                    tool: "bash".into(),
                    duration_ms: 1,
                    exit_code: Some(0),
                    output_bytes: 2,
                    outcome: crate::receipt::Outcome::Ok,
                }),
            })),
        ] {
            assert_eq!(project(e), None);
        }
        let ev = ClientEvent::status(true);
        assert_eq!(project(AgentEvent::Client(ev.clone())), Some(ev));
    }

    #[test]
    fn only_same_kind_deltas_merge() {
        let mut a = ClientEvent::TextDelta { text: "a".into() };
        assert!(a.try_merge(&ClientEvent::TextDelta { text: "b".into() }));
        assert_eq!(a, ClientEvent::TextDelta { text: "ab".into() });
        assert!(!a.try_merge(&ClientEvent::ThinkingDelta { text: "c".into() }));
        assert!(!a.try_merge(&ClientEvent::status(false)));
        let mut t = ClientEvent::ThinkingDelta { text: "x".into() };
        assert!(t.try_merge(&ClientEvent::ThinkingDelta { text: "y".into() }));
        assert_eq!(a.delta_len(), Some(2));
        assert_eq!(ClientEvent::status(true).delta_len(), None);
    }

    #[test]
    fn tool_output_merges_only_within_one_call_and_stream() {
        let out = |call: &str, stream, text: &str| ClientEvent::ToolOutput {
            call_id: call.into(),
            stream,
            text: text.into(),
        };
        let mut a = out("c1", OutputStream::Stdout, "ab");
        assert!(a.try_merge(&out("c1", OutputStream::Stdout, "cd")));
        assert_eq!(a, out("c1", OutputStream::Stdout, "abcd"));
        assert!(
            !a.try_merge(&out("c1", OutputStream::Stderr, "x")),
            "another stream"
        );
        assert!(
            !a.try_merge(&out("c2", OutputStream::Stdout, "x")),
            "another call"
        );
        assert!(!a.try_merge(&ClientEvent::TextDelta { text: "x".into() }));
        assert_eq!(a.delta_len(), Some(4));
        assert_eq!(a.kind(), "tool_output");
        assert!(a.approx_size() >= 6);
    }

    #[test]
    fn a_merged_delta_grows_as_predicted_and_a_merged_run_is_allocated_once() {
        let sid: Arc<str> = "s".into();
        let delta = |seq, t: &str| Frame::new(seq, sid.clone(), ClientEvent::TextDelta { text: t.into() });
        let mut tail = delta(1, "ab");
        let mut seq = 1;
        for _ in 0..200 {
            seq += 1;
            let next = delta(seq, "0123456789");
            let want = tail.size_after_absorbing(&next).unwrap();
            assert!(tail.absorb(&next));
            assert_eq!(tail.size, want, "size_after_absorbing says what absorb makes it");
            let ClientEvent::TextDelta { text } = &tail.event else {
                unreachable!()
            };
            assert_eq!(
                tail.size,
                64 + text.capacity(),
                "size counts the text at its capacity"
            );
            assert!(text.capacity() < 2 * text.len() + 16, "doubling, never more");
        }
        assert!(delta(1, "x")
            .size_after_absorbing(&Frame::new(2, sid.clone(), ClientEvent::status(true)))
            .is_none());
        let parts = [delta(1, "ab"), delta(2, "cd"), delta(3, "ef")];
        let merged = Frame::merged(&parts.iter().collect::<Vec<_>>());
        assert_eq!(merged.seq, 3);
        assert_eq!(merged.size, 64 + 6, "exactly its length");
        assert_eq!(merged_capacity(10, 5), 10);
        assert_eq!(merged_capacity(10, 11), 20);
        assert_eq!(
            merged_capacity(MERGE_GROWTH_LIMIT, MERGE_GROWTH_LIMIT + 1),
            MERGE_GROWTH_LIMIT + 1
        );
    }
}
