//! Receipts: what each model call and tool call of a session cost and how it went, as the ledger keeps them (internal records, never on a client stream).

use crate::provider::{ChatMessage, ProviderError, TokenUsage, ToolDef, TurnOutput, TurnRequest};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};

/// The most a listed prompt holds (past it the oldest messages are left
/// out, and counted, so the prompt stays valid JSON), and the most new
/// messages one receipt stores.
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
    /// A request `stored` for the ledger, shown as the request it was:
    /// model, system, tools and messages, within `cap` bytes: the oldest
    /// messages are left out first (`omitted_messages` counts them); when
    /// even none fit, only the model and the size.
    fn render(model: &str, system: &str, tools: &str, messages: &[&str], cap: usize) -> Prompt {
        let model = Value::from(model).to_string();
        let head = format!("{{\"model\":{model},\"system\":{system},\"tools\":{tools}");
        let full = head.len() + messages.iter().map(|m| m.len() + 1).sum::<usize>() + 16;
        let mut size = full + 32;
        let mut skip = 0;
        while size > cap && skip < messages.len() {
            size -= messages[skip].len() + 1;
            skip += 1;
        }
        let text = if size > cap {
            format!("{{\"model\":{model},\"cut\":true,\"bytes\":{full}}}")
        } else {
            let mut s = String::with_capacity(size);
            s.push_str(&head);
            if skip > 0 {
                s.push_str(&format!(",\"omitted_messages\":{skip}"));
            }
            s.push_str(",\"messages\":[");
            s.push_str(&messages[skip..].join(","));
            s.push_str("]}");
            s
        };
        // Made of serde_json's own output: valid JSON.
        Prompt(RawValue::from_string(text).unwrap_or_default())
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

/// The most of one message a stored prompt keeps: a longer one is stored
/// as `{"role", "cut": true, "bytes"}`.
pub const MESSAGE_CAP: usize = 64 * 1024;

/// A request's parts as JSON texts, each message within `MESSAGE_CAP`.
#[derive(Debug)]
pub struct PromptParts {
    model: String,
    system: String,
    tools: String,
    messages: Vec<String>,
}

/// A tool as a receipt stores it: its fields in the order a JSON object
/// map sorts its keys, so the text is what `json!` of the three would be.
#[derive(Serialize)]
struct ToolJson<'a> {
    description: &'a str,
    input_schema: &'a Value,
    name: &'a str,
}

impl<'a> ToolJson<'a> {
    fn of(t: &'a ToolDef) -> Self {
        ToolJson {
            description: &t.description,
            input_schema: &t.input_schema,
            name: &t.name,
        }
    }
}

/// Compact JSON of plain data (which cannot fail to serialize).
fn json_text<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl PromptParts {
    pub fn of(request: &TurnRequest) -> PromptParts {
        // Serialized from borrows: building a `Value` per tool deep-cloned
        // every input schema on every model call (a twentieth of the
        // server's CPU with thousands of short runs).
        let tools: Vec<ToolJson<'_>> = request.tools.iter().map(ToolJson::of).collect();
        PromptParts {
            model: request.model.clone(),
            system: json_text(&request.system),
            tools: json_text(&tools),
            messages: request.messages.iter().map(|m| capped(m, MESSAGE_CAP)).collect(),
        }
    }

    /// The text a receipt stores: only what changed since the session's
    /// previous stored prompt (`base`), which it then becomes. A request
    /// repeats the whole history, so storing each whole would grow the
    /// ledger with the square of the conversation; this grows it with the
    /// conversation. Stored as `{"model", "system"?, "tools"?, "base": K,
    /// "messages": [...]}`: the previous prompt's first K messages, then
    /// these; system and tools only when they changed. At most `cap` bytes
    /// of new messages: past it a message is stored as its stub (and sent
    /// again by the next prompt, whose prefix ends there).
    pub fn store(&self, base: &mut PromptBase, cap: usize) -> Prompt {
        let hashes: Vec<u64> = self.messages.iter().map(|m| hash(m)).collect();
        let k = base
            .messages
            .iter()
            .zip(&hashes)
            .take_while(|(a, b)| a == b)
            .count();
        let mut text = format!("{{\"model\":{}", Value::from(self.model.as_str()));
        for (name, value, kept) in [
            ("system", &self.system, &mut base.system),
            ("tools", &self.tools, &mut base.tools),
        ] {
            let h = hash(value);
            if *kept != Some(h) || k == 0 {
                text.push_str(&format!(",\"{name}\":{value}"));
                *kept = Some(h);
            }
        }
        text.push_str(&format!(",\"base\":{k},\"messages\":["));
        base.messages.truncate(k);
        let mut room = cap;
        for (i, m) in self.messages[k..].iter().enumerate() {
            let m = if m.len() <= room {
                room -= m.len();
                base.messages.push(hashes[k + i]);
                m.clone()
            } else {
                let stub = stub_of(m);
                base.messages.push(hash(&stub));
                stub
            };
            if i > 0 {
                text.push(',');
            }
            text.push_str(&m);
        }
        text.push_str("]}");
        // Made of serde_json's own output: valid JSON.
        Prompt(RawValue::from_string(text).unwrap_or_default())
    }
}

/// What a session's last stored prompt held, by hash: the base the next
/// one is stored against. Empty after a restart (the next prompt is stored whole).
#[derive(Debug, Default)]
pub struct PromptBase {
    system: Option<u64>,
    tools: Option<u64>,
    messages: Vec<u64>,
}

/// The request a stored prompt rebuilds, as the previous ones left it.
#[derive(Debug, Default)]
pub struct Expander {
    system: Option<Box<RawValue>>,
    tools: Option<Box<RawValue>>,
    messages: Vec<Box<RawValue>>,
    /// A prompt could not be rebuilt: the ones after it cannot either,
    /// until one is stored whole.
    broken: bool,
}

#[derive(Deserialize)]
struct Stored {
    model: String,
    system: Option<Box<RawValue>>,
    tools: Option<Box<RawValue>>,
    base: usize,
    messages: Vec<Box<RawValue>>,
}

impl Expander {
    /// The request `stored` was (within `cap`, as `Prompt::render` cuts
    /// it); `None` when it cannot be rebuilt (the history it builds on is
    /// not in this ledger).
    pub fn expand(&mut self, stored: &Prompt, cap: usize) -> Option<Prompt> {
        let s: Stored = match serde_json::from_str(stored.as_str()) {
            Ok(s) => s,
            Err(_) => {
                self.broken = true;
                return None;
            }
        };
        if s.base == 0 {
            self.broken = false;
        }
        if s.system.is_some() {
            self.system = s.system;
        }
        if s.tools.is_some() {
            self.tools = s.tools;
        }
        if s.base > self.messages.len() {
            self.broken = true;
        }
        self.messages.truncate(s.base);
        self.messages.extend(s.messages);
        let (Some(system), Some(tools), false) = (&self.system, &self.tools, self.broken) else {
            return None;
        };
        let messages: Vec<&str> = self.messages.iter().map(|m| m.get()).collect();
        Some(Prompt::render(
            &s.model,
            system.get(),
            tools.get(),
            &messages,
            cap,
        ))
    }
}

fn hash(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// A message as JSON, or its stub when longer than `cap`.
fn capped(m: &ChatMessage, cap: usize) -> String {
    let text = message(m).to_string();
    if text.len() <= cap {
        text
    } else {
        stub_of(&text)
    }
}

/// A message's stand-in: its role and size.
fn stub_of(text: &str) -> String {
    let role = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("role").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default();
    json!({"role": role, "cut": true, "bytes": text.len()}).to_string()
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
    /// The last attempt's request, stored by `finish`.
    parts: Option<PromptParts>,
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
            parts: None,
        }
    }

    /// An attempt is about to send `request`.
    pub fn sending(&mut self, request: &TurnRequest) {
        self.parts = Some(PromptParts::of(request));
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
    /// last attempt's, or cancelled when the call was; its prompt is stored
    /// against `base`, the session's previous one, which it becomes (emit
    /// the receipt before another is stored against the same base).
    pub fn finish(mut self, base: &mut PromptBase) -> Option<Receipt> {
        let last = self.call.attempts.last()?.outcome;
        self.call.prompt = self.parts.take().map(|p| p.store(base, PROMPT_CAP));
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
    #[test]
    fn prompt_parts_store_tools_and_system_as_json_of_their_values_would() {
        use super::*;
        let tools = vec![
            ToolDef {
                name: "bash".into(),
                description: "Runs \"a\" command".into(),
                input_schema: json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
            },
            ToolDef {
                name: "read".into(),
                description: String::new(),
                input_schema: json!({}),
            },
        ];
        let request = TurnRequest {
            model: "m".into(),
            system: "be\nbrief \u{1F600}".into(),
            tools: tools.clone(),
            ..TurnRequest::default()
        };
        let parts = PromptParts::of(&request);
        let values: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        assert_eq!(parts.tools, Value::from(values).to_string());
        assert_eq!(parts.system, Value::from(request.system.as_str()).to_string());
    }

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

    /// `request` stored on a fresh base and shown within `cap`.
    fn whole(request: &TurnRequest, cap: usize) -> Prompt {
        let stored = PromptParts::of(request).store(&mut PromptBase::default(), usize::MAX);
        Expander::default().expand(&stored, cap).unwrap()
    }

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User {
            text: text.into(),
            images: Vec::new(),
        }
    }

    #[test]
    fn each_prompt_stores_what_changed_and_the_reader_rebuilds_every_request() {
        let mut base = PromptBase::default();
        let mut reader = Expander::default();
        let mut req = TurnRequest {
            model: "m".into(),
            system: "s".repeat(1000),
            ..TurnRequest::default()
        };
        let mut stored_sizes = Vec::new();
        let mut stored = Vec::new();
        for i in 0..50 {
            req.messages.push(user(&format!("{i}:{}", "x".repeat(500))));
            let p = PromptParts::of(&req).store(&mut base, PROMPT_CAP);
            stored_sizes.push(p.as_str().len());
            assert_eq!(
                reader.expand(&p, usize::MAX).unwrap(),
                whole(&req, usize::MAX),
                "call {i} rebuilds its request"
            );
            stored.push(p);
        }
        // The first holds the system prompt; the others one message each.
        assert!(stored_sizes[0] > 1000);
        assert!(stored_sizes[1..].iter().all(|&n| n < 600), "{stored_sizes:?}");
        let v: Value = serde_json::from_str(stored[49].as_str()).unwrap();
        assert_eq!((&v["base"], v.get("system")), (&json!(49), None));

        // A history that changed at its start (a compaction): stored whole.
        req.messages = vec![user("summary"), user("next")];
        let p = PromptParts::of(&req).store(&mut base, PROMPT_CAP);
        let v: Value = serde_json::from_str(p.as_str()).unwrap();
        assert_eq!((&v["base"], &v["system"]), (&json!(0), &json!(req.system)));
        assert_eq!(reader.expand(&p, usize::MAX).unwrap(), whole(&req, usize::MAX));

        // A reader that starts past the first stored prompt cannot rebuild.
        let mut late = Expander::default();
        assert_eq!(late.expand(&stored[1], usize::MAX), None);
        assert_eq!(late.expand(&stored[2], usize::MAX), None);
        assert!(
            late.expand(&p, usize::MAX).is_some(),
            "a whole one starts it again"
        );
    }

    #[test]
    fn a_long_message_is_stored_as_its_stub_and_new_messages_past_the_cap_are_sent_again() {
        let mut base = PromptBase::default();
        let mut reader = Expander::default();
        let mut req = TurnRequest::default();
        req.messages.push(user(&"y".repeat(MESSAGE_CAP + 1)));
        let p = PromptParts::of(&req).store(&mut base, PROMPT_CAP);
        assert!(p.as_str().len() < 1000);
        let v: Value = serde_json::from_str(reader.expand(&p, usize::MAX).unwrap().as_str()).unwrap();
        assert_eq!(v["messages"][0]["role"], "user");
        assert_eq!(v["messages"][0]["cut"], true);

        // Three new messages where the cap holds two: the third is a stub now
        // and stored in full by the next prompt.
        for i in 0..3 {
            req.messages.push(user(&format!("{i}{}", "z".repeat(900))));
        }
        let p = PromptParts::of(&req).store(&mut base, 2000);
        let v: Value = serde_json::from_str(reader.expand(&p, usize::MAX).unwrap().as_str()).unwrap();
        assert_eq!(v["messages"][3]["cut"], true);
        assert!(v["messages"][2].get("cut").is_none());
        let p = PromptParts::of(&req).store(&mut base, 2000);
        let stored: Value = serde_json::from_str(p.as_str()).unwrap();
        assert_eq!(stored["base"], 3, "sent again from the stub on");
        assert_eq!(reader.expand(&p, usize::MAX).unwrap(), whole(&req, usize::MAX));
    }

    #[test]
    fn a_prompt_past_the_cap_leaves_out_the_oldest_messages_and_stays_json() {
        let small = whole(&request(3, 10), PROMPT_CAP);
        let v: Value = serde_json::from_str(small.as_str()).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 3);
        assert!(v.get("omitted_messages").is_none());
        assert_eq!(v["system"], "sys");

        let big = whole(&request(100, 1000), 20_000);
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
        let one = whole(&request(1, 5000), 1000);
        let v: Value = serde_json::from_str(one.as_str()).unwrap();
        assert_eq!((&v["omitted_messages"], &v["messages"]), (&json!(1), &json!([])));
        assert_eq!(v["system"], "sys");
        // A system prompt larger than the cap: only the model and the size.
        let mut huge = request(1, 10);
        huge.system = "s".repeat(5000);
        let v: Value = serde_json::from_str(whole(&huge, 1000).as_str()).unwrap();
        assert_eq!(v, json!({"model": "m", "cut": true, "bytes": v["bytes"]}));
        assert!(v["bytes"].as_u64().unwrap() > 5000);
    }

    #[test]
    fn attempts_are_numbered_and_the_outcome_is_the_last_ones_or_cancelled() {
        let mut r = ModelCallRecorder::new(Some("r1"), "openai", "m", "rev", &[]);
        assert!(
            ModelCallRecorder::new(None, "p", "m", "rev", &[])
                .finish(&mut PromptBase::default())
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
        let receipt = r.finish(&mut PromptBase::default()).unwrap();
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
        let Call::ModelCall(c) = r.finish(&mut PromptBase::default()).unwrap().call else {
            panic!()
        };
        assert_eq!(c.outcome, Outcome::Cancelled, "cancelled while waiting to retry");
        assert_eq!(c.attempts[0].http_status, None, "never answered");
    }
}
