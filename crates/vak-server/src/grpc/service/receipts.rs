//! ListReceipts: a session's model-call and tool-call receipts from its ledger.

use super::AgentApi;
use crate::errors::to_status;
use tonic::Status;
use vak_core::log::receipts::Listed;
use vak_core::receipt::{Attempt, Call, ModelCall, Outcome, ToolCallReceipt};
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn receipts(
        &self,
        r: pb::ListReceiptsRequest,
    ) -> Result<pb::ListReceiptsResponse, Status> {
        let listed = vak_core::host::receipts::list(self.hub(), &r.session_id, r.include.as_deref())
            .await
            .map_err(to_status)?;
        Ok(pb::ListReceiptsResponse {
            receipts: listed.into_iter().map(receipt).collect(),
        })
    }
}

fn receipt(l: Listed) -> pb::Receipt {
    use pb::receipt::Kind;
    pb::Receipt {
        seq: l.seq,
        request_id: l.receipt.request_id,
        started_at: l.receipt.started_at,
        kind: Some(match l.receipt.call {
            Call::ModelCall(c) => Kind::ModelCall(model_call(c)),
            Call::ToolCall(t) => Kind::ToolCall(tool_call(t)),
        }),
    }
}

fn outcome(o: Outcome) -> i32 {
    match o {
        Outcome::Ok => pb::ReceiptOutcome::Ok,
        Outcome::Failed => pb::ReceiptOutcome::Failed,
        Outcome::Cancelled => pb::ReceiptOutcome::Cancelled,
    }
    .into()
}

fn model_call(c: ModelCall) -> pb::ModelCallReceipt {
    pb::ModelCallReceipt {
        provider: c.provider,
        model: c.model,
        route_revision: c.route_revision,
        usage: Some(pb::Usage {
            input_tokens: c.usage.input_tokens,
            output_tokens: c.usage.output_tokens,
            cache_read_tokens: c.usage.cache_read_tokens,
            cache_write_tokens: c.usage.cache_write_tokens,
        }),
        tools_offered: c.tools_offered,
        attempts: c.attempts.into_iter().map(attempt).collect(),
        outcome: outcome(c.outcome),
        prompt: c.prompt.map(|p| p.as_str().to_string()),
    }
}

fn attempt(a: Attempt) -> pb::ReceiptAttempt {
    pb::ReceiptAttempt {
        number: a.number,
        outcome: outcome(a.outcome),
        http_status: a.http_status.map(u32::from),
        latency_ms: a.latency_ms,
        failure: a.failure,
        retry_reason: a.retry_reason,
    }
}

fn tool_call(t: ToolCallReceipt) -> pb::ToolCallReceipt {
    pb::ToolCallReceipt {
        call_id: t.call_id,
        tool: t.tool,
        duration_ms: t.duration_ms,
        exit_code: t.exit_code,
        output_bytes: t.output_bytes,
        outcome: outcome(t.outcome),
    }
}
