//! Receipts: what each model call and tool call of a session cost and how it went, as the ledger keeps them (internal records, never on a client stream).

use crate::provider::{ChatMessage, ProviderError, TokenUsage, ToolDef, TurnOutput, TurnRequest};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};

/// The most a receipt's prompt holds: past it the oldest messages are left
/// out (and counted), so the prompt stays valid JSON.
pub const PROMPT_CAP: usize = 256 * 1024;

/// How a call, or one attempt at it, ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Failed,
    Cancelled,
}

/// One receipt: a model call or a tool call, under the run that made it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// The run's request id; empty outside a run (a compaction asked for).
    #[serde(default)]
    pub request_id: String,
    /// RFC 3339, when the call started.
    pub started_at: String,
    pub call: Call,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    ModelCall(ModelCall),
    ToolCall(ToolCallReceipt),
}

/// One model call: what was sent, each attempt, and how it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    pub provider: String,
    pub model: String,
    /// The config revision the leg's route came from.
    pub route_revision: String,
    /// Tokens of the attempt that succeeded (zero when none did).
    pub usage: TokenUsage,
    pub tools_offered: Vec<String>,
    pub attempts: Vec<Attempt>,
    pub outcome: Outcome,
    /// The request of the last attempt (`prompt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Prompt>,
}

/// One try at a model call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1-based.
    pub number: u32,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    pub latency_ms: u64,
    /// The failure's kind (`FailureKind::as_str`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Why the next attempt was made, as `status.retrying.reason` said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_reason: Option<String>,
}

/// One tool call, from its tool_call event to its tool_result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallReceipt {
    pub call_id: String,
    pub tool: String,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub output_bytes: u64,
    pub outcome: Outcome,
}

/// A request as JSON, kept as its text (never parsed again until shown).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Prompt(pub Box<RawValue>);

impl PartialEq for Prompt {
    fn eq(&self, other: &Prompt) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Prompt {
    /// `request` as JSON: model, system, tools and messages (images by
    /// reference, thinking without its signature), within `cap` bytes:
    /// the oldest messages are left out first (`omitted_messages` counts
    /// them); when even none fit, only the model and the size.
    pub fn of(request: &TurnRequest, cap: usize) -> Prompt {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        let head = json!({"model": request.model, "system": request.system, "tools": tools}).to_string();
        let messages: Vec<String> = request.messages.iter().map(|m| message(m).to_string()).collect();
        let full = head.len() + messages.iter().map(|m| m.len() + 1).sum::<usize>() + 16;
        let mut size = full + 32;
        let mut skip = 0;
        while size > cap && skip < messages.len() {
            size -= messages[skip].len() + 1;
            skip += 1;
        }
        let text = if size > cap {
            json!({"model": request.model, "cut": true, "bytes": full}).to_string()
        } else {
            let mut s = String::with_capacity(size);
            s.push_str(&head[..head.len() - 1]);
            if skip > 0 {
                s.push_str(&format!(",\"omitted_messages\":{skip}"));
            }
            s.push_str(",\"messages\":[");
            s.push_str(&messages[skip..].join(","));
            s.push_str("]}");
            s
        };
        // Built from serde_json's own output: valid JSON.
        Prompt(RawValue::from_string(text).unwrap_or_default())
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

fn message(m: &ChatMessage) -> Value {
    match m {
        ChatMessage::User { text, images } => json!({
            "role": "user",
            "text": text,
            "images": images.iter().map(|i| json!({"sha256": i.sha256, "media_type": i.media_type})).collect::<Vec<_>>(),
        }),
        ChatMessage::Assistant {
            thinking,
            text,
            tool_calls,
        } => json!({
            "role": "assistant",
            "thinking": thinking.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
            "text": text,
            "tool_calls": tool_calls.iter().map(|c| json!({"id": c.id, "name": c.name, "input": c.input})).collect::<Vec<_>>(),
        }),
        ChatMessage::ToolResult {
            call_id,
            content,
            is_error,
        } => json!({"role": "tool", "call_id": call_id, "content": content, "is_error": is_error}),
    }
}

/// RFC 3339 with milliseconds, now.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// A model call's receipt as it is made: one attempt after another.
#[derive(Debug)]
pub struct ModelCallRecorder {
    request_id: String,
    started_at: String,
    call: ModelCall,
    cancelled: bool,
    /// When the attempt under way was sent.
    sent: Option<Instant>,
}

impl ModelCallRecorder {
    pub fn new(
        request_id: Option<&str>,
        provider: &str,
        model: &str,
        route_revision: &str,
        tools: &[ToolDef],
    ) -> ModelCallRecorder {
        ModelCallRecorder {
            request_id: request_id.unwrap_or_default().to_string(),
            started_at: now(),
            call: ModelCall {
                provider: provider.to_string(),
                model: model.to_string(),
                route_revision: route_revision.to_string(),
                usage: TokenUsage::default(),
                tools_offered: tools.iter().map(|t| t.name.clone()).collect(),
                attempts: Vec::new(),
                outcome: Outcome::Failed,
                prompt: None,
            },
            cancelled: false,
            sent: None,
        }
    }

    /// An attempt is about to send `request`.
    pub fn sending(&mut self, request: &TurnRequest) {
        self.call.prompt = Some(Prompt::of(request, PROMPT_CAP));
        self.sent = Some(Instant::now());
    }

    /// The attempt under way ended with `result`.
    pub fn ended(&mut self, result: &Result<TurnOutput, ProviderError>) {
        let latency_ms = self.sent.take().map_or(0, |t| t.elapsed().as_millis() as u64);
        let (outcome, http_status, failure) = match result {
            Ok(out) => {
                self.call.usage = out.usage;
                (Outcome::Ok, out.status, None)
            }
            Err(ProviderError::Cancelled) => {
                self.cancelled = true;
                (Outcome::Cancelled, None, None)
            }
            Err(ProviderError::Failed(f)) => (Outcome::Failed, f.status, Some(f.kind.as_str().to_string())),
        };
        self.call.attempts.push(Attempt {
            number: self.call.attempts.len() as u32 + 1,
            outcome,
            http_status,
            latency_ms,
            failure,
            retry_reason: None,
        });
    }

    /// The last attempt is followed by another, for `reason`.
    pub fn retrying(&mut self, reason: &str) {
        if let Some(last) = self.call.attempts.last_mut() {
            last.retry_reason = Some(reason.to_string());
        }
    }

    /// The call was cancelled between attempts.
    pub fn cancelled(&mut self) {
        self.cancelled = true;
    }

    /// The receipt, or None when no attempt was made. Its outcome is the
    /// last attempt's, or cancelled when the call was.
    pub fn finish(mut self) -> Option<Receipt> {
        let last = self.call.attempts.last()?.outcome;
        self.call.outcome = if self.cancelled { Outcome::Cancelled } else { last };
        Some(Receipt {
            request_id: self.request_id,
            started_at: self.started_at,
            call: Call::ModelCall(self.call),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Failure, FailureKind};

    fn request(n: usize, each: usize) -> TurnRequest {
        TurnRequest {
            model: "m".into(),
            system: "sys".into(),
            messages: (0..n)
                .map(|i| ChatMessage::User {
                    text: format!("{i}:{}", "x".repeat(each)),
                    images: Vec::new(),
                })
                .collect(),
            ..TurnRequest::default()
        }
    }

    #[test]
    fn a_prompt_past_the_cap_leaves_out_the_oldest_messages_and_stays_json() {
        let small = Prompt::of(&request(3, 10), PROMPT_CAP);
        let v: Value = serde_json::from_str(small.as_str()).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 3);
        assert!(v.get("omitted_messages").is_none());
        assert_eq!(v["system"], "sys");

        let big = Prompt::of(&request(100, 1000), 20_000);
        assert!(big.as_str().len() <= 20_000, "{}", big.as_str().len());
        let v: Value = serde_json::from_str(big.as_str()).unwrap();
        let kept = v["messages"].as_array().unwrap();
        let omitted = v["omitted_messages"].as_u64().unwrap() as usize;
        assert_eq!(kept.len() + omitted, 100);
        assert!(kept.len() >= 15, "as many as fit: {}", kept.len());
        assert!(
            kept.last().unwrap()["text"].as_str().unwrap().starts_with("99:"),
            "the newest stay"
        );

        // One message larger than the cap: left out, the rest kept.
        let one = Prompt::of(&request(1, 5000), 1000);
        let v: Value = serde_json::from_str(one.as_str()).unwrap();
        assert_eq!((&v["omitted_messages"], &v["messages"]), (&json!(1), &json!([])));
        assert_eq!(v["system"], "sys");
        // A system prompt larger than the cap: only the model and the size.
        let mut huge = request(1, 10);
        huge.system = "s".repeat(5000);
        let v: Value = serde_json::from_str(Prompt::of(&huge, 1000).as_str()).unwrap();
        assert_eq!(v, json!({"model": "m", "cut": true, "bytes": v["bytes"]}));
        assert!(v["bytes"].as_u64().unwrap() > 5000);
    }

    #[test]
    fn attempts_are_numbered_and_the_outcome_is_the_last_ones_or_cancelled() {
        let mut r = ModelCallRecorder::new(Some("r1"), "openai", "m", "rev", &[]);
        assert!(
            ModelCallRecorder::new(None, "p", "m", "rev", &[])
                .finish()
                .is_none(),
            "no attempt, no receipt"
        );
        r.sending(&request(1, 1));
        r.ended(&Err(ProviderError::Failed(
            Failure::new(FailureKind::RateLimit, "429", true).with_status(429),
        )));
        r.retrying("the model service is rate limiting requests");
        r.sending(&request(1, 1));
        let usage = TokenUsage {
            input_tokens: 7,
            output_tokens: 3,
            ..TokenUsage::default()
        };
        r.ended(&Ok(TurnOutput {
            usage,
            status: Some(200),
            ..TurnOutput::default()
        }));
        let receipt = r.finish().unwrap();
        let Call::ModelCall(c) = &receipt.call else {
            panic!()
        };
        assert_eq!(c.outcome, Outcome::Ok);
        assert_eq!(c.usage, usage);
        assert_eq!(c.attempts.len(), 2);
        assert_eq!((c.attempts[0].number, c.attempts[0].http_status), (1, Some(429)));
        assert_eq!(c.attempts[0].failure.as_deref(), Some("rate_limit"));
        assert!(c.attempts[0].retry_reason.is_some());
        assert_eq!((c.attempts[1].number, c.attempts[1].outcome), (2, Outcome::Ok));
        assert_eq!(c.attempts[1].retry_reason, None);
        // A ledger line round-trips.
        let line = serde_json::to_string(&receipt).unwrap();
        assert_eq!(serde_json::from_str::<Receipt>(&line).unwrap(), receipt);

        let mut r = ModelCallRecorder::new(None, "p", "m", "rev", &[]);
        r.sending(&request(1, 1));
        r.ended(&Err(ProviderError::Failed(Failure::new(
            FailureKind::Network,
            "x",
            true,
        ))));
        r.cancelled();
        let Call::ModelCall(c) = r.finish().unwrap().call else {
            panic!()
        };
        assert_eq!(c.outcome, Outcome::Cancelled, "cancelled while waiting to retry");
        assert_eq!(c.attempts[0].http_status, None, "never answered");
    }
}
