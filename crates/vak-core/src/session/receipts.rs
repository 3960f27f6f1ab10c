//! The agent loop's receipts: a model call's attempts and a tool call's cost, emitted as ledger notes (never client events) when the call ends.

use crate::event::AgentEvent;
use crate::receipt::{Call, ModelCallRecorder, Outcome, Receipt, ToolCallReceipt};
use crate::session::context::TurnContext;
use crate::tools::ToolOutput;
use std::time::Instant;

/// A model call being recorded: its receipt is emitted by `finish`, or
/// when it is dropped (a leg that returns mid-call), whichever comes first.
pub(crate) struct ModelCallReceipt<'a, S: TurnContext> {
    session: &'a S,
    recorder: Option<ModelCallRecorder>,
}

impl<'a, S: TurnContext> ModelCallReceipt<'a, S> {
    pub(crate) fn new(session: &'a S, recorder: ModelCallRecorder) -> Self {
        ModelCallReceipt {
            session,
            recorder: Some(recorder),
        }
    }

    /// The recorder, while the call is under way.
    pub(crate) fn at(&mut self) -> &mut ModelCallRecorder {
        // Always there: only `finish`, which consumes self, takes it.
        self.recorder
            .get_or_insert_with(|| ModelCallRecorder::new(None, "", "", "", &[]))
    }

    /// Emits the receipt now.
    pub(crate) fn finish(mut self) {
        self.emit();
    }

    fn emit(&mut self) {
        let Some(recorder) = self.recorder.take() else {
            return;
        };
        // Stored against the session's previous prompt and emitted under
        // one guard, so the ledger holds them in the order they were stored
        // against each other (emit only queues for the writer).
        let mut base = self
            .session
            .prompt_base()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(receipt) = recorder.finish(&mut base) {
            self.session.emit(AgentEvent::Receipt(Box::new(receipt)));
        }
    }
}

impl<S: TurnContext> Drop for ModelCallReceipt<'_, S> {
    fn drop(&mut self) {
        self.emit();
    }
}

/// A tool call's receipt, to emit after its tool_result: from `started`
/// (its tool_call) to now.
pub(crate) fn tool_call(
    request_id: &str,
    started: (String, Instant),
    call_id: &str,
    tool: &str,
    result: &ToolOutput,
    cancelled: bool,
) -> AgentEvent {
    let outcome = match (result.ok, cancelled) {
        (true, _) => Outcome::Ok,
        (false, true) => Outcome::Cancelled,
        (false, false) => Outcome::Failed,
    };
    AgentEvent::Receipt(Box::new(Receipt {
        request_id: request_id.to_string(),
        started_at: started.0,
        call: Call::ToolCall(ToolCallReceipt {
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            duration_ms: started.1.elapsed().as_millis() as u64,
            exit_code: result.exit_code,
            output_bytes: result.output.len() as u64,
            outcome,
        }),
    }))
}
