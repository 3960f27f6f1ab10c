//! The presentation timeline: a deterministic projection of client events into display items (schema v2), and the semantic events that keep a consumer's copy in step.
//!
//! The same fold runs live, after a reload from the ledger, and inside each
//! presentation stream, so applying a stream's events to its opening snapshot
//! always yields the timeline the session itself holds at that point.
//! Runtime bookkeeping (status, turn_started, admission) never becomes an item.

use crate::event::{ApprovalOutcome, ClientEvent, RunOutcome};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const SCHEMA_VERSION: u32 = 2;

/// The most live output (tool_output) a running tool item shows; its
/// tool_result replaces it with the output that counts.
pub const LIVE_TEXT: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemKind {
    UserInput,
    AssistantText,
    Thinking,
    ToolCall,
    Approval,
    FinalResult,
    /// A background result delivered while the session was idle.
    Background,
    /// A commitment of the session's plan (update_plan), with its status.
    PlanItem,
}

impl ItemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::UserInput => "user_input",
            ItemKind::AssistantText => "assistant_text",
            ItemKind::Thinking => "thinking",
            ItemKind::ToolCall => "tool_call",
            ItemKind::Approval => "approval",
            ItemKind::FinalResult => "final_result",
            ItemKind::Background => "background",
            ItemKind::PlanItem => "plan_item",
        }
    }
}

/// Where an item stands. Kept in snapshots as its snake_case name, the
/// same string clients read (`as_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Text or thinking still arriving.
    Streaming,
    /// A tool call not answered yet.
    Running,
    /// An approval not answered yet.
    Pending,
    Completed,
    Failed,
    Cancelled,
    /// A final result: the run reached the max-turns cap.
    MaxTurns,
    /// A streaming item a new turn cut off (the model's stream broke).
    Interrupted,
    Approved,
    Denied,
    Expired,
}

impl ItemStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::Streaming => "streaming",
            ItemStatus::Running => "running",
            ItemStatus::Pending => "pending",
            ItemStatus::Completed => "completed",
            ItemStatus::Failed => "failed",
            ItemStatus::Cancelled => "cancelled",
            ItemStatus::MaxTurns => "max_turns",
            ItemStatus::Interrupted => "interrupted",
            ItemStatus::Approved => "approved",
            ItemStatus::Denied => "denied",
            ItemStatus::Expired => "expired",
        }
    }
}

impl From<RunOutcome> for ItemStatus {
    fn from(o: RunOutcome) -> ItemStatus {
        match o {
            RunOutcome::Completed => ItemStatus::Completed,
            RunOutcome::Cancelled => ItemStatus::Cancelled,
            RunOutcome::Failed => ItemStatus::Failed,
            RunOutcome::MaxTurns => ItemStatus::MaxTurns,
        }
    }
}

impl From<ApprovalOutcome> for ItemStatus {
    fn from(o: ApprovalOutcome) -> ItemStatus {
        match o {
            ApprovalOutcome::Approved => ItemStatus::Approved,
            ApprovalOutcome::Denied => ItemStatus::Denied,
            ApprovalOutcome::Expired => ItemStatus::Expired,
        }
    }
}

/// One display item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// Stable across restarts: derived from the seq of the event that opened it.
    pub id: String,
    pub kind: ItemKind,
    pub status: ItemStatus,
    pub text: String,
    /// The last seq this item reflects.
    pub seq: u64,
    /// Tool items and approvals: the tool, its call id and input.
    pub tool: String,
    pub call_id: String,
    pub input: Value,
    /// Approvals: the approval request id; user input: the admission request id.
    pub request_id: String,
    /// Plan items: the commitment as it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commitment: Option<Box<crate::commitment::Commitment>>,
}

impl Item {
    fn new(kind: ItemKind, prefix: &str, seq: u64, status: ItemStatus, text: String) -> Item {
        Item {
            id: format!("{prefix}{seq}"),
            kind,
            status,
            text,
            seq,
            tool: String::new(),
            call_id: String::new(),
            input: Value::Null,
            request_id: String::new(),
            commitment: None,
        }
    }

    /// A commitment's plan item: stable id `plan-<item>`, its text, and a
    /// status from the model's (pending, running for in_progress, completed
    /// for done, cancelled for dropped) or, once closed, from its verdict
    /// (completed when fulfilled, cancelled otherwise).
    fn plan(seq: u64, c: &crate::commitment::Commitment) -> Item {
        use crate::commitment::{PlanStatus, Verdict};
        let status = match (&c.closed, c.status) {
            (Some(closed), _) if closed.verdict == Verdict::Fulfilled => ItemStatus::Completed,
            (Some(_), _) => ItemStatus::Cancelled,
            (None, PlanStatus::Pending) => ItemStatus::Pending,
            (None, PlanStatus::InProgress) => ItemStatus::Running,
            (None, PlanStatus::Done) => ItemStatus::Completed,
            (None, PlanStatus::Dropped) => ItemStatus::Cancelled,
        };
        let mut item = Item::new(ItemKind::PlanItem, "plan-", seq, status, c.text.clone());
        item.id = format!("plan-{}", c.item);
        item.commitment = Some(Box::new(c.clone()));
        item
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub schema_version: u32,
    pub session_id: String,
    /// The seq of the last event reflected in the items (0: none).
    pub seq: u64,
    pub items: Vec<Item>,
    /// The latest turn chain's goal (absent before the first prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<crate::goal::GoalState>,
}

/// A semantic change to a timeline.
#[derive(Clone, Debug, PartialEq)]
pub enum PresentationEvent {
    /// The whole timeline: when a stream opens, when a run settles, on resync.
    Snapshot(Timeline),
    ItemStarted(Item),
    /// Text appended to a streaming item.
    TextDelta {
        item_id: String,
        text: String,
        seq: u64,
    },
    /// An item's new full state.
    ItemReplaced(Item),
    /// A streaming item is done.
    ItemCompleted {
        item_id: String,
        status: ItemStatus,
        seq: u64,
    },
    /// The goal's new full state.
    Goal {
        goal: crate::goal::GoalState,
        seq: u64,
    },
}

impl PresentationEvent {
    pub fn kind(&self) -> &'static str {
        match self {
            PresentationEvent::Snapshot(_) => "snapshot",
            PresentationEvent::ItemStarted(_) => "item_started",
            PresentationEvent::TextDelta { .. } => "text_delta",
            PresentationEvent::ItemReplaced(_) => "item_replaced",
            PresentationEvent::ItemCompleted { .. } => "item_completed",
            PresentationEvent::Goal { .. } => "goal",
        }
    }

    pub fn seq(&self) -> u64 {
        match self {
            PresentationEvent::Snapshot(t) => t.seq,
            PresentationEvent::ItemStarted(i) | PresentationEvent::ItemReplaced(i) => i.seq,
            PresentationEvent::TextDelta { seq, .. }
            | PresentationEvent::ItemCompleted { seq, .. }
            | PresentationEvent::Goal { seq, .. } => *seq,
        }
    }
}

impl Timeline {
    pub fn new(session_id: &str) -> Timeline {
        Timeline {
            schema_version: SCHEMA_VERSION,
            session_id: session_id.to_string(),
            seq: 0,
            items: Vec::new(),
            goal: None,
        }
    }

    fn find(&mut self, id: &str) -> Option<&mut Item> {
        self.items.iter_mut().rev().find(|i| i.id == id)
    }

    /// Applies a presentation event: what a consumer does with its stream.
    pub fn apply(&mut self, event: &PresentationEvent) {
        match event {
            PresentationEvent::Snapshot(t) => *self = t.clone(),
            PresentationEvent::ItemStarted(item) => self.items.push(item.clone()),
            PresentationEvent::TextDelta { item_id, text, seq } => {
                if let Some(i) = self.find(item_id) {
                    i.text.push_str(text);
                    i.seq = *seq;
                }
            }
            PresentationEvent::ItemReplaced(item) => {
                if let Some(i) = self.find(&item.id) {
                    *i = item.clone();
                }
            }
            PresentationEvent::ItemCompleted { item_id, status, seq } => {
                if let Some(i) = self.find(item_id) {
                    i.status = *status;
                    i.seq = *seq;
                }
            }
            PresentationEvent::Goal { goal, .. } => self.goal = Some(goal.clone()),
        }
        let seq = event.seq();
        if seq > self.seq {
            self.seq = seq;
        }
    }
}

/// The fold from client events to a timeline, emitting the presentation
/// events that describe each change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Presenter {
    timeline: Timeline,
    /// The index of the item still streaming text or thinking, if any.
    open: Option<usize>,
    /// A turn chain is live: its next user_message is a leg, not a new goal.
    #[serde(default)]
    chain: bool,
    /// Goal updates of a chain admitted but not started yet (it waits for a
    /// first subscriber): folded into its goal when its first prompt comes.
    #[serde(default)]
    early: Vec<crate::goal::GoalUpdate>,
}

impl Presenter {
    pub fn new(session_id: &str) -> Presenter {
        Presenter {
            timeline: Timeline::new(session_id),
            open: None,
            chain: false,
            early: Vec::new(),
        }
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn start(&mut self, item: Item, out: &mut Vec<PresentationEvent>) -> usize {
        out.push(PresentationEvent::ItemStarted(item.clone()));
        self.timeline.items.push(item);
        self.timeline.items.len() - 1
    }

    fn close_open(&mut self, seq: u64, out: &mut Vec<PresentationEvent>) {
        self.close_open_as(ItemStatus::Completed, seq, out)
    }

    fn close_open_as(&mut self, status: ItemStatus, seq: u64, out: &mut Vec<PresentationEvent>) {
        if let Some(idx) = self.open.take() {
            let item = &mut self.timeline.items[idx];
            item.status = status;
            item.seq = seq;
            out.push(PresentationEvent::ItemCompleted {
                item_id: item.id.clone(),
                status,
                seq,
            });
        }
    }

    /// Appends `text` to the open item when it streams `kind`; the item
    /// grown, or None when a new one must start.
    fn extend_open(&mut self, kind: ItemKind, seq: u64, text: &str) -> Option<&Item> {
        let idx = self.open?;
        let timeline = &mut self.timeline;
        if timeline.items[idx].kind != kind {
            return None;
        }
        timeline.seq = timeline.seq.max(seq);
        let item = &mut timeline.items[idx];
        item.text.push_str(text);
        item.seq = seq;
        Some(item)
    }

    fn stream_text(&mut self, kind: ItemKind, seq: u64, text: &str, out: &mut Vec<PresentationEvent>) {
        if let Some(item) = self.extend_open(kind, seq, text) {
            out.push(PresentationEvent::TextDelta {
                item_id: item.id.clone(),
                text: text.to_string(),
                seq,
            });
            return;
        }
        self.close_open(seq, out);
        let prefix = if kind == ItemKind::Thinking {
            "think-"
        } else {
            "text-"
        };
        let item = Item::new(kind, prefix, seq, ItemStatus::Streaming, text.to_string());
        self.open = Some(self.start(item, out));
    }

    fn replace(
        &mut self,
        pred: impl Fn(&Item) -> bool,
        change: impl FnOnce(&mut Item),
        out: &mut Vec<PresentationEvent>,
    ) {
        if let Some(item) = self.timeline.items.iter_mut().rev().find(|i| pred(i)) {
            change(item);
            out.push(PresentationEvent::ItemReplaced(item.clone()));
        }
    }

    fn set_goal(&mut self, goal: crate::goal::GoalState, seq: u64, out: &mut Vec<PresentationEvent>) {
        out.push(PresentationEvent::Goal {
            goal: goal.clone(),
            seq,
        });
        self.timeline.goal = Some(goal);
    }

    /// `apply` for a caller that keeps only the timeline (the session's
    /// own fold): a delta that extends the open item builds no presentation
    /// event, which was three allocations per delta thrown away at once.
    pub fn fold(&mut self, seq: u64, event: &ClientEvent) {
        let extended = match event {
            ClientEvent::TextDelta { text } => self.extend_open(ItemKind::AssistantText, seq, text).is_some(),
            ClientEvent::ThinkingDelta { text } => self.extend_open(ItemKind::Thinking, seq, text).is_some(),
            _ => false,
        };
        if !extended {
            self.apply(seq, event);
        }
    }

    /// Folds one published event in and returns the presentation events it causes.
    pub fn apply(&mut self, seq: u64, event: &ClientEvent) -> Vec<PresentationEvent> {
        let mut out = Vec::new();
        match event {
            ClientEvent::UserMessage { text, request_id, .. } => {
                self.close_open(seq, &mut out);
                // A chain's first prompt sets its goal; later legs' inputs
                // were read as goal updates when they were admitted.
                if !self.chain {
                    self.chain = true;
                    let mut goal = crate::goal::GoalState::new(text);
                    for u in std::mem::take(&mut self.early) {
                        let at = u.at_seq;
                        goal.apply(at, &u);
                    }
                    self.set_goal(goal, seq, &mut out);
                }
                let mut item = Item::new(
                    ItemKind::UserInput,
                    "user-",
                    seq,
                    ItemStatus::Completed,
                    text.clone(),
                );
                item.request_id = request_id.clone();
                self.start(item, &mut out);
            }
            ClientEvent::TextDelta { text } => self.stream_text(ItemKind::AssistantText, seq, text, &mut out),
            ClientEvent::ThinkingDelta { text } => self.stream_text(ItemKind::Thinking, seq, text, &mut out),
            ClientEvent::ToolCall { call_id, tool, input } => {
                self.close_open(seq, &mut out);
                let mut item = Item::new(
                    ItemKind::ToolCall,
                    "tool-",
                    seq,
                    ItemStatus::Running,
                    String::new(),
                );
                item.tool = tool.clone();
                item.call_id = call_id.clone();
                item.input = input.clone();
                self.start(item, &mut out);
            }
            ClientEvent::ToolResult { call_id, ok, output } => self.replace(
                |i| i.kind == ItemKind::ToolCall && &i.call_id == call_id,
                |i| {
                    i.status = if *ok {
                        ItemStatus::Completed
                    } else {
                        ItemStatus::Failed
                    };
                    i.text = output.clone();
                    i.seq = seq;
                },
                &mut out,
            ),
            ClientEvent::ToolOutput { call_id, text, .. } => {
                let running = self.timeline.items.iter_mut().rev().find(|i| {
                    i.kind == ItemKind::ToolCall && &i.call_id == call_id && i.status == ItemStatus::Running
                });
                if let Some(item) = running {
                    // The first LIVE_TEXT bytes, never a split character.
                    let mut take = LIVE_TEXT.saturating_sub(item.text.len()).min(text.len());
                    while !text.is_char_boundary(take) {
                        take -= 1;
                    }
                    if take > 0 {
                        item.text.push_str(&text[..take]);
                        item.seq = seq;
                        out.push(PresentationEvent::TextDelta {
                            item_id: item.id.clone(),
                            text: text[..take].to_string(),
                            seq,
                        });
                    }
                }
            }
            ClientEvent::ApprovalRequested {
                request_id,
                tool,
                reason,
                input,
                call_id,
            } => {
                self.close_open(seq, &mut out);
                let mut item = Item::new(
                    ItemKind::Approval,
                    "approval-",
                    seq,
                    ItemStatus::Pending,
                    reason.clone(),
                );
                item.tool = tool.clone();
                item.call_id = call_id.clone();
                item.input = input.clone();
                item.request_id = request_id.clone();
                self.start(item, &mut out);
            }
            ClientEvent::ApprovalResolved {
                request_id, outcome, ..
            } => self.replace(
                |i| i.kind == ItemKind::Approval && &i.request_id == request_id,
                |i| {
                    i.status = (*outcome).into();
                    i.seq = seq;
                },
                &mut out,
            ),
            ClientEvent::RunFinished { outcome, message, .. } => {
                self.close_open(seq, &mut out);
                self.chain = false;
                if let Some(mut goal) = self.timeline.goal.take() {
                    goal.control = if *outcome == RunOutcome::Cancelled {
                        crate::goal::Control::Cancelled
                    } else {
                        crate::goal::Control::Done
                    };
                    self.set_goal(goal, seq, &mut out);
                }
                let item = Item::new(
                    ItemKind::FinalResult,
                    "result-",
                    seq,
                    (*outcome).into(),
                    message.clone(),
                );
                self.start(item, &mut out);
                self.timeline.seq = seq;
                out.push(PresentationEvent::Snapshot(self.timeline.clone()));
            }
            ClientEvent::BackgroundResult { result, .. } => {
                self.close_open(seq, &mut out);
                let status = if result.alert() {
                    ItemStatus::Failed
                } else {
                    ItemStatus::Completed
                };
                let item = Item::new(
                    ItemKind::Background,
                    "background-",
                    seq,
                    status,
                    result.text.clone(),
                );
                self.start(item, &mut out);
            }
            ClientEvent::Commitment { commitment, .. } => {
                let id = format!("plan-{}", commitment.item);
                match self.timeline.items.iter_mut().rev().find(|i| i.id == id) {
                    Some(old) => {
                        // The plan's own rule, so the item shows what the plan holds.
                        let mut c = old
                            .commitment
                            .take()
                            .map_or_else(|| (**commitment).clone(), |b| *b);
                        crate::commitment::merge(&mut c, commitment);
                        *old = Item::plan(seq, &c);
                        out.push(PresentationEvent::ItemReplaced(old.clone()));
                    }
                    None => {
                        self.close_open(seq, &mut out);
                        let mut c = (**commitment).clone();
                        if c.created_seq == 0 {
                            c.created_seq = seq;
                        }
                        self.start(Item::plan(seq, &c), &mut out);
                    }
                }
            }
            ClientEvent::GoalUpdate { update } => match self.timeline.goal.take() {
                Some(mut goal) if self.chain => {
                    goal.apply(seq, update);
                    self.set_goal(goal, seq, &mut out);
                }
                // Steering of a chain whose first leg has not started yet.
                other => {
                    self.timeline.goal = other;
                    if self.early.len() < crate::goal::MAX_UPDATES {
                        let mut u = (**update).clone();
                        u.at_seq = seq;
                        self.early.push(u);
                    }
                }
            },
            // A turn_started inside a run: the model's stream broke and the
            // turn starts over; what it had streamed stays, marked so.
            ClientEvent::TurnStarted { .. } => self.close_open_as(ItemStatus::Interrupted, seq, &mut out),
            // A notice is shown as it comes, never kept in the timeline.
            // A side run is a branch beside the conversation: not in the timeline.
            // Children and dev servers are shown beside the conversation
            // (their own listings), not in its timeline.
            ClientEvent::Status { .. }
            | ClientEvent::Notice { .. }
            | ClientEvent::Side { .. }
            | ClientEvent::Worker { .. }
            | ClientEvent::Workbench { .. }
            | ClientEvent::DraftDiscarded { .. }
            | ClientEvent::LaunchOutput { .. } => {}
        }
        if let Some(last) = out.last() {
            self.timeline.seq = last.seq().max(self.timeline.seq);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OutputStream;
    use proptest::prelude::*;
    use serde_json::json;

    /// Plausible client-event sequences: runs of deltas, tools with results,
    /// approvals with resolutions, bookkeeping, and settled runs.
    fn events() -> impl Strategy<Value = Vec<ClientEvent>> {
        let step = prop_oneof![
            "[a-z ]{0,6}".prop_map(|t| vec![ClientEvent::TextDelta { text: t }]),
            "[a-z ]{0,6}".prop_map(|t| vec![ClientEvent::ThinkingDelta { text: t }]),
            ("[a-z]{1,4}", any::<bool>(), "[a-zé\n]{0,6}").prop_map(|(c, ok, live)| vec![
                ClientEvent::ToolCall {
                    call_id: c.clone(),
                    tool: "bash".into(),
                    input: json!({"command": c})
                },
                ClientEvent::ToolOutput {
                    call_id: c.clone(),
                    stream: OutputStream::Stdout,
                    text: live.clone(),
                },
                ClientEvent::ToolOutput {
                    call_id: c.clone(),
                    stream: OutputStream::Stderr,
                    text: live,
                },
                ClientEvent::ToolResult {
                    call_id: c,
                    ok,
                    output: "out".into()
                },
            ]),
            ("[a-z]{1,4}", 0..3u8).prop_map(|(r, o)| vec![
                ClientEvent::ApprovalRequested {
                    request_id: r.clone(),
                    tool: "write_file".into(),
                    reason: "why".into(),
                    input: json!({}),
                    call_id: "c".into(),
                },
                ClientEvent::ApprovalResolved {
                    request_id: r,
                    outcome: [
                        ApprovalOutcome::Approved,
                        ApprovalOutcome::Denied,
                        ApprovalOutcome::Expired
                    ][o as usize],
                    reason: String::new(),
                },
            ]),
            "[a-z]{1,8}".prop_map(|t| vec![
                ClientEvent::status(true),
                ClientEvent::UserMessage {
                    text: t,
                    request_id: "r".into(),
                    attachments: Vec::new()
                },
                ClientEvent::TurnStarted {
                    request_id: "r".into()
                },
            ]),
            (0..3u8).prop_map(|o| vec![
                ClientEvent::status(false),
                ClientEvent::RunFinished {
                    outcome: [RunOutcome::Completed, RunOutcome::Cancelled, RunOutcome::Failed][o as usize],
                    message: "done".into(),
                    stop_reason: None,
                },
            ]),
        ];
        prop::collection::vec(step, 0..40).prop_map(|v| v.into_iter().flatten().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Applying the events from any opening snapshot reproduces the fold.
        #[test]
        fn events_applied_to_a_snapshot_equal_the_fold(evs in events(), cut in 0usize..200) {
            let cut = cut.min(evs.len());
            let mut p = Presenter::new("s");
            for (i, e) in evs[..cut].iter().enumerate() {
                p.apply(i as u64 + 1, e);
            }
            let mut consumer = p.timeline().clone();
            for (i, e) in evs.iter().enumerate().skip(cut) {
                for pe in p.apply(i as u64 + 1, e) {
                    if let PresentationEvent::Snapshot(t) = &pe {
                        prop_assert_eq!(t, p.timeline(), "a snapshot is the fold at its seq");
                    }
                    consumer.apply(&pe);
                }
                prop_assert_eq!(&consumer, p.timeline());
            }
            // The fold is deterministic: the same events give the same timeline.
            let mut again = Presenter::new("s");
            for (i, e) in evs.iter().enumerate() {
                again.apply(i as u64 + 1, e);
            }
            prop_assert_eq!(again.timeline(), p.timeline());
            // `fold` (no presentation events built) keeps the same timeline.
            let mut folded = Presenter::new("s");
            for (i, e) in evs.iter().enumerate() {
                folded.fold(i as u64 + 1, e);
            }
            prop_assert_eq!(&folded, &p);
        }
    }

    #[test]
    fn bookkeeping_never_becomes_an_item() {
        let mut p = Presenter::new("s");
        assert!(p.apply(1, &ClientEvent::status(true)).is_empty());
        assert!(p
            .apply(
                2,
                &ClientEvent::TurnStarted {
                    request_id: "r".into()
                }
            )
            .is_empty());
        // A retry's status line is no item either (clients show it aside).
        let retrying = ClientEvent::Status {
            busy: true,
            retrying: Some(crate::event::Retrying {
                attempt: 1,
                of: 4,
                reason: "could not reach the model service at 127.0.0.1:9 (connection refused)".into(),
            }),
        };
        assert!(p.apply(3, &retrying).is_empty());
        assert!(p.timeline().items.is_empty());
        assert_eq!(p.timeline().seq, 0);
    }

    #[test]
    fn a_run_streams_settles_and_snapshots() {
        let mut p = Presenter::new("s");
        p.apply(
            1,
            &ClientEvent::UserMessage {
                text: "hi".into(),
                request_id: "r".into(),
                attachments: Vec::new(),
            },
        );
        let ev = p.apply(
            2,
            &ClientEvent::TextDelta {
                text: "echo: ".into(),
            },
        );
        assert!(matches!(&ev[0], PresentationEvent::ItemStarted(i) if i.status.as_str() == "streaming"));
        let ev = p.apply(3, &ClientEvent::TextDelta { text: "hi".into() });
        assert_eq!(
            ev,
            vec![PresentationEvent::TextDelta {
                item_id: "text-2".into(),
                text: "hi".into(),
                seq: 3
            }]
        );
        let ev = p.apply(
            5,
            &ClientEvent::RunFinished {
                outcome: RunOutcome::Completed,
                message: "completed".into(),
                stop_reason: None,
            },
        );
        let kinds: Vec<_> = ev.iter().map(PresentationEvent::kind).collect();
        assert_eq!(kinds, ["item_completed", "goal", "item_started", "snapshot"]);
        let t = p.timeline();
        let goal = t.goal.as_ref().expect("the first prompt set the goal");
        assert_eq!(
            (goal.objective.as_str(), goal.control),
            ("hi", crate::goal::Control::Done)
        );
        assert_eq!(t.items.len(), 3);
        assert_eq!(t.items[1].text, "echo: hi");
        assert_eq!((t.items[1].status.as_str(), t.items[1].seq), ("completed", 5));
        assert_eq!(t.items[2].kind, ItemKind::FinalResult);
        assert_eq!(t.seq, 5);
    }

    #[test]
    fn steering_before_the_first_leg_starts_is_folded_into_that_chains_goal() {
        use crate::goal::{Control, GoalUpdate, Relation};
        let mut p = Presenter::new("s");
        let update = |relation, text: &str| ClientEvent::GoalUpdate {
            update: Box::new(GoalUpdate {
                relation,
                text: text.into(),
                signals: Vec::new(),
                request_id: "r".into(),
                widens_permissions: false,
                at_seq: 0,
            }),
        };
        // The chain waits for a first subscriber; steering comes meanwhile.
        assert!(p.apply(1, &update(Relation::Add, "also a README")).is_empty());
        p.apply(2, &update(Relation::Pause, "pause"));
        let ev = p.apply(
            3,
            &ClientEvent::UserMessage {
                text: "write docs".into(),
                request_id: "r0".into(),
                attachments: Vec::new(),
            },
        );
        assert!(ev.iter().any(|e| e.kind() == "goal"));
        let goal = p.timeline().goal.as_ref().unwrap();
        assert_eq!(goal.objective, "write docs");
        assert_eq!(goal.additions, ["also a README"]);
        assert_eq!(goal.control, Control::Paused);
        assert_eq!(goal.updates.iter().map(|u| u.at_seq).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn live_output_grows_its_tool_item_up_to_a_cap_and_the_result_replaces_it() {
        let mut p = Presenter::new("s");
        let call = |id: &str| ClientEvent::ToolCall {
            call_id: id.into(),
            tool: "bash".into(),
            input: json!({"command": "x"}),
        };
        let out = |id: &str, text: &str| ClientEvent::ToolOutput {
            call_id: id.into(),
            stream: OutputStream::Stderr,
            text: text.into(),
        };
        p.apply(1, &call("a"));
        let ev = p.apply(2, &out("a", "hi\n"));
        assert_eq!(
            ev,
            vec![PresentationEvent::TextDelta {
                item_id: "tool-1".into(),
                text: "hi\n".into(),
                seq: 2
            }]
        );
        assert!(p.apply(3, &out("nope", "x")).is_empty(), "no such call");
        // Past the cap nothing more is shown, and a character is never split.
        let big = "é".repeat(LIVE_TEXT);
        let ev = p.apply(4, &out("a", &big));
        let PresentationEvent::TextDelta { text, .. } = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(text.len(), LIVE_TEXT - 3 - 1, "whole characters that fit");
        assert!(p.apply(5, &out("a", "é")).is_empty());
        assert_eq!(p.timeline().items[0].status.as_str(), "running");
        p.apply(
            6,
            &ClientEvent::ToolResult {
                call_id: "a".into(),
                ok: true,
                output: "final".into(),
            },
        );
        assert_eq!(p.timeline().items[0].text, "final");
        assert!(
            p.apply(7, &out("a", "late")).is_empty(),
            "a settled call shows no more"
        );
    }

    #[test]
    fn every_item_status_has_its_wire_string_and_keeps_it_in_snapshots() {
        let all = [
            (ItemStatus::Streaming, "streaming"),
            (ItemStatus::Running, "running"),
            (ItemStatus::Pending, "pending"),
            (ItemStatus::Completed, "completed"),
            (ItemStatus::Failed, "failed"),
            (ItemStatus::Cancelled, "cancelled"),
            (ItemStatus::MaxTurns, "max_turns"),
            (ItemStatus::Interrupted, "interrupted"),
            (ItemStatus::Approved, "approved"),
            (ItemStatus::Denied, "denied"),
            (ItemStatus::Expired, "expired"),
        ];
        for (status, s) in all {
            assert_eq!(status.as_str(), s);
            // A snapshot written before the enum (a string) reads back the same.
            assert_eq!(serde_json::to_value(status).unwrap(), json!(s));
            assert_eq!(serde_json::from_value::<ItemStatus>(json!(s)).unwrap(), status);
        }
        for o in [
            RunOutcome::Completed,
            RunOutcome::Cancelled,
            RunOutcome::Failed,
            RunOutcome::MaxTurns,
        ] {
            assert_eq!(ItemStatus::from(o).as_str(), o.as_str());
        }
        for o in [
            ApprovalOutcome::Approved,
            ApprovalOutcome::Denied,
            ApprovalOutcome::Expired,
        ] {
            assert_eq!(ItemStatus::from(o).as_str(), o.as_str());
        }
    }
}
