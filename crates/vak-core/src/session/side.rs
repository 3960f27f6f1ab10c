//! Side chat (issue 15): one model turn on a branch beside the main conversation, streamed as `side` frames and folded into the session's side log, never into its transcript, history or timeline.

use crate::event::{ClientEvent, SideOutcome, SidePhase};
use crate::log::deltas::{Deltas, FREE};
pub use crate::log::folds::{SideEntry, SideLog, KEPT};
use crate::provider::{ChatMessage, ProviderError, ProviderEvent, Sink, TokenUsage};
use crate::session::context::TurnContext;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The longest side question accepted, in bytes.
pub const MAX_QUESTION: usize = 64 * 1024;

/// The main history cut where a side turn can branch off it: a model turn
/// whose tool calls do not all have results yet (the main run is inside
/// them) is left out with those results, since providers refuse a tool call
/// without its result.
pub fn branch_point(mut history: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let Some(i) = history
        .iter()
        .rposition(|m| matches!(m, ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty()))
    else {
        return history;
    };
    let ChatMessage::Assistant { tool_calls, .. } = &history[i] else {
        return history;
    };
    let answered: HashSet<&str> = history[i + 1..]
        .iter()
        .filter_map(|m| match m {
            ChatMessage::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    if tool_calls.iter().all(|c| answered.contains(c.id.as_str())) {
        return history;
    }
    history.truncate(i);
    history
}

/// A side turn's text on its way to the session: bounded like a main turn's
/// deltas, published as side frames; thinking is not shown.
struct SideSink<'a, S> {
    session: &'a S,
    side_id: &'a str,
    deltas: Mutex<Deltas>,
}

impl<S: TurnContext> SideSink<'_, S> {
    fn publish(&self, events: impl IntoIterator<Item = ClientEvent>) {
        for e in events {
            if let ClientEvent::TextDelta { text } = e {
                self.session.publish(ClientEvent::Side {
                    side_id: self.side_id.to_string(),
                    phase: SidePhase::TextDelta { text },
                });
            }
        }
    }
}

impl<S: TurnContext> Sink for SideSink<'_, S> {
    fn send(&self, e: ProviderEvent) {
        if let ProviderEvent::Text(_) = e {
            let ready = self.deltas.lock().unwrap_or_else(|p| p.into_inner()).push(e);
            self.publish(ready);
        }
    }

    fn ready(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.session.pace())
    }
}

/// Runs one side turn: `history` (the main conversation at the branch
/// point) and the question, one attempt, tools defined but never run.
/// Returns how it ended, its message and its usage.
pub(crate) async fn answer(
    session: &impl TurnContext,
    side_id: &str,
    history: Vec<ChatMessage>,
    question: &str,
    cancel: &CancellationToken,
) -> (SideOutcome, String, TokenUsage) {
    let mut messages = match crate::session::agent::with_images(session, branch_point(history)).await {
        Ok(m) => m,
        Err(message) => return (SideOutcome::Failed, message, TokenUsage::default()),
    };
    messages.push(ChatMessage::User {
        text: question.to_string(),
        images: Vec::new(),
    });
    let (route, request) = crate::session::agent::one_turn_request(session, messages).await;
    let sink = SideSink {
        session,
        side_id,
        deltas: Mutex::new(Deltas::new(FREE)),
    };
    let result = route.provider.turn(&request, &sink, cancel).await;
    let held = sink.deltas.lock().unwrap_or_else(|p| p.into_inner()).flush();
    sink.publish(held);
    if let Ok(out) = &result {
        // Priced like a leg's turns, under the side run's id.
        let rt = session.runtime();
        rt.finops()
            .record_usage(session.id(), Some(side_id), &route, out.usage)
            .await;
    }
    match result {
        Ok(out) if out.tool_calls.is_empty() => (SideOutcome::Completed, "completed".into(), out.usage),
        Ok(out) => (
            SideOutcome::Completed,
            "completed (the model asked for tools, which a side run does not run)".into(),
            out.usage,
        ),
        Err(ProviderError::Cancelled) => (
            SideOutcome::Cancelled,
            "cancelled by a client".into(),
            TokenUsage::default(),
        ),
        Err(ProviderError::Failed(f)) => {
            tracing::warn!(session = %session.id(), side_id, kind = ?f.kind, error = %f.detail, "side turn failed");
            (SideOutcome::Failed, f.kind.message(), TokenUsage::default())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "bash".into(),
            input: serde_json::json!({}),
        }
    }

    fn assistant(calls: Vec<ToolCall>) -> ChatMessage {
        ChatMessage::Assistant {
            thinking: Vec::new(),
            text: "t".into(),
            tool_calls: calls,
        }
    }

    fn result(id: &str) -> ChatMessage {
        ChatMessage::ToolResult {
            call_id: id.into(),
            content: "r".into(),
            is_error: false,
        }
    }

    #[test]
    fn a_turn_inside_its_tool_calls_is_left_out_of_the_branch() {
        let user = ChatMessage::User {
            text: "u".into(),
            images: Vec::new(),
        };
        let done = vec![user.clone(), assistant(vec![call("a")]), result("a")];
        assert_eq!(
            branch_point(done.clone()),
            done,
            "every call answered: kept whole"
        );
        let open = vec![user.clone(), assistant(vec![call("a"), call("b")]), result("a")];
        assert_eq!(branch_point(open), vec![user.clone()], "b has no result yet");
        let plain = vec![user.clone(), assistant(Vec::new())];
        assert_eq!(branch_point(plain.clone()), plain);
    }

    #[test]
    fn the_log_keeps_the_recent_runs_and_knows_the_open_one() {
        let mut log = SideLog::default();
        for i in 0..(KEPT as u64 + 3) {
            let id = format!("s{i}");
            let started = SidePhase::Started {
                question: "q".into(),
                branch_seq: i,
            };
            log.apply(i * 3 + 1, &id, &started);
            log.apply(i * 3 + 2, &id, &SidePhase::TextDelta { text: "a".into() });
            log.apply(i * 3 + 3, &id, &SidePhase::TextDelta { text: "b".into() });
            if i < KEPT as u64 + 2 {
                let finished = SidePhase::Finished {
                    outcome: SideOutcome::Completed,
                    message: "completed".into(),
                    usage: TokenUsage::default(),
                };
                log.apply(i * 3 + 3, &id, &finished);
            }
        }
        let runs = log.runs();
        assert_eq!(runs.len(), KEPT);
        assert_eq!(runs[0].side_id, "s3");
        assert_eq!(runs[0].answer, "ab");
        assert_eq!(log.open().as_deref(), Some(format!("s{}", KEPT + 2).as_str()));
    }
}
