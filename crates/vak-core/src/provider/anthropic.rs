//! Anthropic Messages, streamed: thinking with signatures, tool_use blocks and cumulative usage.

use super::http::{self, ClientOptions};
use super::{
    ChatMessage, Failure, FailureKind, ModelInfo, ModelsFuture, Provider, ProviderError, ProviderEvent,
    Secret, Sink, StopReason, TokenUsage, ToolCall, TurnFuture, TurnOutput, TurnRequest,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

/// The SDKs' default: the base has no `/v1`, paths add it.
pub(crate) const DEFAULT_BASE: &str = "https://api.anthropic.com";
pub(crate) const API_VERSION: &str = "2023-06-01";
/// The Messages API requires `max_tokens`; this is sent when the request has none.
pub(crate) const FALLBACK_MAX_TOKENS: u32 = 8192;

pub(crate) struct Anthropic {
    http: reqwest::Client,
    base: String,
    key: Option<Secret>,
    /// The `x-api-key` value, marked sensitive.
    key_header: Option<reqwest::header::HeaderValue>,
    opts: ClientOptions,
}

/// `base` less a trailing `/` and a trailing `/v1` (an OpenAI-style base
/// pasted here), so paths can add `/v1/…` themselves.
pub(crate) fn normalize_base(base: Option<&str>) -> String {
    let b = base.unwrap_or(DEFAULT_BASE).trim().trim_end_matches('/');
    b.strip_suffix("/v1").unwrap_or(b).to_string()
}

impl Anthropic {
    pub(crate) fn new(
        base: Option<&str>,
        key: Option<Secret>,
        opts: ClientOptions,
    ) -> Result<Anthropic, Failure> {
        let key = key.filter(|k| !k.expose().is_empty());
        let key_header = match &key {
            Some(k) => Some(http::key_header(k.expose())?),
            None => None,
        };
        Ok(Anthropic {
            http: http::client(&opts)?,
            base: normalize_base(base),
            key,
            key_header,
            opts,
        })
    }

    fn headers(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let rb = rb.header("anthropic-version", API_VERSION);
        match &self.key_header {
            Some(v) => rb.header("x-api-key", v.clone()),
            None => rb,
        }
    }

    async fn run_turn(
        &self,
        request: &TurnRequest,
        sink: &dyn Sink,
        cancel: &CancellationToken,
    ) -> Result<TurnOutput, ProviderError> {
        let key = self.key.as_ref();
        let scrub = |e: ProviderError| match e {
            ProviderError::Failed(f) => ProviderError::Failed(http::scrub(f, key)),
            other => other,
        };
        let rb = self
            .headers(self.http.post(format!("{}/v1/messages", self.base)))
            .header("accept", "text/event-stream")
            .json(&request_body(request));
        let resp = http::send(rb, &self.opts, key, cancel).await?;
        let status = resp.status().as_u16();
        let streamed = async {
            let mut events = http::event_stream(resp, &self.opts, key, cancel).await?;
            let mut asm = Assembler::new(self.opts.max_tool_args_bytes);
            loop {
                let Some(event) = events.next(cancel).await.map_err(scrub)? else {
                    return asm.finish().map_err(scrub);
                };
                let step = asm
                    .on_event(&event.data)
                    .map_err(|f| ProviderError::Failed(http::scrub(f, key)))?;
                for e in step.events {
                    sink.send(e);
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                        _ = sink.ready() => {}
                    }
                }
                if step.done {
                    events.read_to_end().await;
                    return asm.finish().map_err(scrub);
                }
            }
        };
        super::answered(streamed.await, status)
    }

    async fn models(&self) -> Result<Vec<ModelInfo>, Failure> {
        let never = CancellationToken::new();
        let rb = self.headers(self.http.get(format!("{}/v1/models?limit=1000", self.base)));
        let resp = http::send(rb, &self.opts, self.key.as_ref(), &never)
            .await
            .map_err(|e| match e {
                ProviderError::Failed(f) => f,
                ProviderError::Cancelled => Failure::new(FailureKind::Network, "cancelled", true),
            })?;
        let text = tokio::time::timeout(
            self.opts.idle_timeout,
            http::bounded_text(resp, self.opts.max_event_bytes),
        )
        .await
        .map_err(|_| Failure::new(FailureKind::Network, "the model list stalled", true))?;
        parse_models(&text)
    }
}

/// `GET /v1/models`: `{"data": [{"id", "display_name", …}], "has_more", …}`.
pub(crate) fn parse_models(text: &str) -> Result<Vec<ModelInfo>, Failure> {
    #[derive(Deserialize)]
    struct List {
        data: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        id: String,
        #[serde(default)]
        display_name: Option<String>,
    }
    let list: List = serde_json::from_str(text).map_err(|e| http::bad_json("the model list", &e, text))?;
    Ok(list
        .data
        .into_iter()
        .map(|m| ModelInfo {
            display_name: m
                .display_name
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| m.id.clone()),
            id: m.id,
        })
        .collect())
}

impl Provider for Anthropic {
    fn name(&self) -> &str {
        "anthropic"
    }

    fn turn<'a>(
        &'a self,
        request: &'a TurnRequest,
        sink: &'a dyn Sink,
        cancel: &'a CancellationToken,
    ) -> TurnFuture<'a> {
        Box::pin(self.run_turn(request, sink, cancel))
    }

    fn list_models(&self) -> ModelsFuture<'_> {
        Box::pin(self.models())
    }

    fn host(&self) -> Option<String> {
        http::host_of(&self.base)
    }

    fn probe(&self, timeout: std::time::Duration) -> super::ProbeFuture<'_> {
        Box::pin(http::probe(
            self.headers(self.http.get(format!("{}/v1/models", self.base))),
            timeout,
        ))
    }
}

/// The Messages body for `req`.
pub(crate) fn request_body(req: &TurnRequest) -> Value {
    let mut messages: Vec<Value> = Vec::with_capacity(req.messages.len());
    // Consecutive tool results go back as one user message.
    let mut results: Vec<Value> = Vec::new();
    let flush = |results: &mut Vec<Value>, messages: &mut Vec<Value>| {
        if !results.is_empty() {
            messages.push(json!({"role": "user", "content": std::mem::take(results)}));
        }
    };
    for m in &req.messages {
        match m {
            ChatMessage::ToolResult {
                call_id,
                content,
                is_error,
            } => results.push(json!({
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": content,
                "is_error": is_error,
            })),
            ChatMessage::User { text, images } => {
                flush(&mut results, &mut messages);
                if images.is_empty() {
                    messages.push(json!({"role": "user", "content": text}));
                } else {
                    // Images first, then the text about them (Anthropic's advice).
                    let mut content: Vec<Value> = images
                        .iter()
                        .map(|i| {
                            json!({
                                "type": "image",
                                "source": {"type": "base64", "media_type": i.media_type, "data": i.data},
                            })
                        })
                        .collect();
                    content.push(json!({"type": "text", "text": text}));
                    messages.push(json!({"role": "user", "content": content}));
                }
            }
            ChatMessage::Assistant {
                thinking,
                text,
                tool_calls,
            } => {
                flush(&mut results, &mut messages);
                let mut content = Vec::new();
                // Thinking first, with its signature; an unsigned block is
                // refused by the API, so it is left out.
                for t in thinking.iter().filter(|t| !t.signature.is_empty()) {
                    content.push(json!({"type": "thinking", "thinking": t.text, "signature": t.signature}));
                }
                // The API rejects empty (and whitespace-only) text blocks.
                if !text.trim().is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
                for c in tool_calls {
                    let input = if c.input.is_object() {
                        c.input.clone()
                    } else {
                        json!({})
                    };
                    content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
                }
                // An assistant message with nothing left is refused too.
                if !content.is_empty() {
                    messages.push(json!({"role": "assistant", "content": content}));
                }
            }
        }
    }
    flush(&mut results, &mut messages);
    mark_cache_breakpoint(&mut messages);
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    let max = if req.max_tokens == 0 {
        FALLBACK_MAX_TOKENS
    } else {
        req.max_tokens
    };
    body.insert("max_tokens".into(), json!(max));
    if !req.system.is_empty() {
        // A cache breakpoint after the system prompt caches tools and
        // system, which every turn of every session repeats.
        body.insert(
            "system".into(),
            json!([{"type": "text", "text": req.system, "cache_control": EPHEMERAL.clone()}]),
        );
    }
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("stream".into(), json!(true));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), json!(t));
    }
    Value::Object(body)
}

static EPHEMERAL: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({"type": "ephemeral"}));

/// Marks the last block of the last user message as a prompt-cache
/// breakpoint: the next turn of the agent loop re-sends the same history
/// plus a little, so it reads the whole conversation from the cache (the
/// usage's cache_read tokens) instead of paying for it again. Anthropic
/// allows four breakpoints; vak uses two (system, last message).
fn mark_cache_breakpoint(messages: &mut [Value]) {
    let Some(last) = messages.last_mut() else { return };
    if last["role"] != "user" {
        return;
    }
    if let Some(text) = last["content"].as_str() {
        if text.is_empty() {
            return;
        }
        last["content"] = json!([{"type": "text", "text": text}]);
    }
    if let Some(block) = last["content"].as_array_mut().and_then(|b| b.last_mut()) {
        if let Some(obj) = block.as_object_mut() {
            obj.insert("cache_control".into(), EPHEMERAL.clone());
        }
    }
}

// ---- the streamed events -----------------------------------------------------

/// The events by their `type` (the same as the SSE event name).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: Value,
    },
    ContentBlockDelta {
        index: usize,
        delta: Value,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        #[serde(default)]
        delta: Value,
        #[serde(default)]
        usage: Option<Usage>,
    },
    MessageStop,
    Ping,
    Error {
        error: Value,
    },
    /// Events added after this was written are ignored.
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<Usage>,
}

/// Every field is the running total so far (message_delta repeats them),
/// so the last value seen wins.
#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

enum Block {
    Text,
    Thinking {
        /// The signature so far (one `signature_delta` in practice; more
        /// would be fragments), emitted when the block stops.
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// The `input_json_delta` fragments so far.
        json: String,
        /// The input the start event carried (used when no fragment comes).
        start_input: Value,
    },
    /// redacted_thinking, server tools and whatever comes later.
    Other,
}

/// What one event produced.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Step {
    pub events: Vec<ProviderEvent>,
    /// `message_stop`: the response is complete.
    pub done: bool,
}

/// Folds the events into streamed output and the turn's output.
pub(crate) struct Assembler {
    blocks: BTreeMap<usize, Block>,
    args_bytes: usize,
    max_args: usize,
    stop: Option<String>,
    usage: TokenUsage,
    stopped: bool,
}

impl Assembler {
    pub(crate) fn new(max_args: usize) -> Self {
        Assembler {
            blocks: BTreeMap::new(),
            args_bytes: 0,
            max_args,
            stop: None,
            usage: TokenUsage::default(),
            stopped: false,
        }
    }

    fn take_usage(&mut self, u: Usage) {
        let set = |slot: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut self.usage.input_tokens, u.input_tokens);
        set(&mut self.usage.output_tokens, u.output_tokens);
        set(&mut self.usage.cache_write_tokens, u.cache_creation_input_tokens);
        set(&mut self.usage.cache_read_tokens, u.cache_read_input_tokens);
    }

    /// One SSE `data:` payload.
    pub(crate) fn on_event(&mut self, data: &str) -> Result<Step, Failure> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Step::default());
        }
        let event: Event =
            serde_json::from_str(data).map_err(|e| http::bad_json("a stream event", &e, data))?;
        let mut events = Vec::new();
        let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        match event {
            Event::MessageStart { message } => {
                if let Some(u) = message.usage {
                    self.take_usage(u);
                }
            }
            Event::ContentBlockStart { index, content_block } => {
                let block = match content_block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let t = str_of(&content_block, "text");
                        if !t.is_empty() {
                            events.push(ProviderEvent::Text(t));
                        }
                        Block::Text
                    }
                    Some("thinking") => {
                        let t = str_of(&content_block, "thinking");
                        if !t.is_empty() {
                            events.push(ProviderEvent::Thinking(t));
                        }
                        Block::Thinking {
                            signature: str_of(&content_block, "signature"),
                        }
                    }
                    Some("tool_use") => Block::ToolUse {
                        id: str_of(&content_block, "id"),
                        name: str_of(&content_block, "name"),
                        json: String::new(),
                        start_input: content_block.get("input").cloned().unwrap_or(Value::Null),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            Event::ContentBlockDelta { index, delta } => {
                let Some(block) = self.blocks.get_mut(&index) else {
                    return Err(Failure::new(
                        FailureKind::BadResponse,
                        format!("a delta for block {index}, which never started"),
                        false,
                    ));
                };
                match (delta.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), _) => {
                        let t = str_of(&delta, "text");
                        if !t.is_empty() {
                            events.push(ProviderEvent::Text(t));
                        }
                    }
                    (Some("thinking_delta"), _) => {
                        let t = str_of(&delta, "thinking");
                        if !t.is_empty() {
                            events.push(ProviderEvent::Thinking(t));
                        }
                    }
                    (Some("signature_delta"), Block::Thinking { signature }) => {
                        let part = str_of(&delta, "signature");
                        if signature.len() + part.len() > self.max_args {
                            return Err(Failure::new(
                                FailureKind::BadResponse,
                                format!("a thinking signature is larger than {} bytes", self.max_args),
                                false,
                            ));
                        }
                        signature.push_str(&part);
                    }
                    (Some("input_json_delta"), Block::ToolUse { json, .. }) => {
                        let part = str_of(&delta, "partial_json");
                        self.args_bytes += part.len();
                        if self.args_bytes > self.max_args {
                            return Err(Failure::new(
                                FailureKind::BadResponse,
                                format!("tool call arguments are larger than {} bytes", self.max_args),
                                false,
                            ));
                        }
                        json.push_str(&part);
                    }
                    // citations_delta and what comes later.
                    _ => {}
                }
            }
            Event::ContentBlockStop { index } => {
                // The signature closes its thinking block, before whatever comes next.
                if let Some(Block::Thinking { signature }) = self.blocks.get_mut(&index) {
                    if !signature.is_empty() {
                        events.push(ProviderEvent::ThinkingSignature(std::mem::take(signature)));
                    }
                }
            }
            Event::MessageDelta { delta, usage } => {
                if let Some(r) = delta.get("stop_reason").and_then(Value::as_str) {
                    self.stop = Some(r.to_string());
                }
                if let Some(u) = usage {
                    self.take_usage(u);
                }
            }
            Event::MessageStop => {
                self.stopped = true;
                // A thinking block that never got its stop still has its signature sent.
                for block in self.blocks.values_mut() {
                    if let Block::Thinking { signature } = block {
                        if !signature.is_empty() {
                            events.push(ProviderEvent::ThinkingSignature(std::mem::take(signature)));
                        }
                    }
                }
                return Ok(Step { events, done: true });
            }
            Event::Ping | Event::Unknown => {}
            Event::Error { error } => {
                let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
                return Err(http::classify_error_type(kind, &error.to_string()));
            }
        }
        Ok(Step { events, done: false })
    }

    /// The turn's output; a stream without `message_stop` was cut.
    pub(crate) fn finish(self) -> Result<TurnOutput, ProviderError> {
        if !self.stopped {
            return Err(http::ended_early());
        }
        let mut tool_calls = Vec::new();
        for block in self.blocks.into_values() {
            let Block::ToolUse {
                id,
                name,
                json,
                start_input,
            } = block
            else {
                continue;
            };
            let input = if json.trim().is_empty() {
                if start_input.is_object() {
                    start_input
                } else {
                    json!({})
                }
            } else {
                serde_json::from_str::<Value>(&json).map_err(|e| {
                    ProviderError::Failed(http::bad_json(
                        &format!("the input of tool call {id} ({name})"),
                        &e,
                        &json,
                    ))
                })?
            };
            tool_calls.push(ToolCall { id, name, input });
        }
        let stop = match self.stop.as_deref() {
            Some("tool_use") => StopReason::ToolUse,
            Some("max_tokens") | Some("model_context_window_exceeded") => StopReason::MaxTokens,
            Some("refusal") => StopReason::Refusal,
            _ if !tool_calls.is_empty() => StopReason::ToolUse,
            _ => StopReason::EndTurn,
        };
        Ok(TurnOutput {
            tool_calls,
            usage: self.usage,
            stop,
            status: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Thinking, ToolDef};

    fn feed(asm: &mut Assembler, lines: &[&str]) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        for l in lines {
            out.extend(asm.on_event(l).unwrap().events);
        }
        out
    }

    const START: &str = r#"{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}"#;

    #[test]
    fn thinking_signature_text_and_cumulative_usage() {
        let mut asm = Assembler::new(1 << 20);
        let events = feed(
            &mut asm,
            &[
                START,
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
                r#"{"type":"ping"}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCkYIBRgCIkB"}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
                r#"{"type":"content_block_stop","index":1}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":10}}"#,
                r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":15}}"#,
                r#"{"type":"some_future_event","x":1}"#,
            ],
        );
        assert!(asm.on_event(r#"{"type":"message_stop"}"#).unwrap().done);
        assert_eq!(
            events,
            vec![
                ProviderEvent::Thinking("Let me".into()),
                ProviderEvent::ThinkingSignature("EqQBCkYIBRgCIkB".into()),
                ProviderEvent::Text("Hi".into()),
            ]
        );
        let out = asm.finish().unwrap();
        assert_eq!(out.stop, StopReason::EndTurn);
        assert_eq!(
            out.usage,
            TokenUsage {
                input_tokens: 472,
                output_tokens: 15,
                cache_read_tokens: 2000,
                cache_write_tokens: 100
            }
        );
    }

    #[test]
    fn a_signature_in_fragments_is_emitted_whole_when_its_block_stops() {
        let mut asm = Assembler::new(1 << 20);
        let events = feed(
            &mut asm,
            &[
                START,
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"a"}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"Eq"}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"AB"}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy"}}"#,
                r#"{"type":"content_block_stop","index":1}"#,
                r#"{"type":"message_stop"}"#,
            ],
        );
        assert_eq!(
            events,
            vec![
                ProviderEvent::Thinking("a".into()),
                ProviderEvent::ThinkingSignature("EqAB".into())
            ]
        );
    }

    #[test]
    fn tool_use_blocks_assemble_per_index() {
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                START,
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_a","name":"read_file","input":{}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"a"}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":".txt\"}"}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_b","name":"bash","input":{}}}"#,
                r#"{"type":"content_block_stop","index":1}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}"#,
                r#"{"type":"message_stop"}"#,
            ],
        );
        let out = asm.finish().unwrap();
        assert_eq!(out.stop, StopReason::ToolUse);
        assert_eq!(out.tool_calls.len(), 2);
        assert_eq!(out.tool_calls[0].id, "toolu_a");
        assert_eq!(out.tool_calls[0].input, json!({"path": "a.txt"}));
        assert_eq!(
            out.tool_calls[1].input,
            json!({}),
            "no fragments: the start's input"
        );
    }

    #[test]
    fn errors_bad_json_oversize_and_cut_streams() {
        let mut asm = Assembler::new(1 << 20);
        let f = asm
            .on_event(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
            .unwrap_err();
        assert_eq!((f.kind, f.retryable), (FailureKind::Overloaded, true));

        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                START,
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_z","name":"bash","input":{}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"comm"}}"#,
                r#"{"type":"message_stop"}"#,
            ],
        );
        match asm.finish() {
            Err(ProviderError::Failed(f)) => {
                assert_eq!(f.kind, FailureKind::BadResponse);
                assert!(f.detail.contains("toolu_z"));
            }
            other => panic!("{other:?}"),
        }

        let mut asm = Assembler::new(8);
        feed(
            &mut asm,
            &[
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"x","input":{}}}"#,
            ],
        );
        let f = asm
            .on_event(r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"0123456789"}}"#)
            .unwrap_err();
        assert_eq!(f.kind, FailureKind::BadResponse);

        let mut asm = Assembler::new(8);
        feed(&mut asm, &[START]);
        match asm.finish() {
            Err(ProviderError::Failed(f)) => assert_eq!((f.kind, f.retryable), (FailureKind::Network, true)),
            other => panic!("{other:?}"),
        }
        let mut asm = Assembler::new(8);
        assert!(asm.on_event("{\"type\":").is_err());
        assert!(asm
            .on_event(r#"{"type":"content_block_delta","index":5,"delta":{"type":"text_delta","text":"x"}}"#)
            .is_err());
    }

    #[test]
    fn the_body_orders_blocks_groups_results_and_skips_empty_text() {
        let req = TurnRequest {
            model: "claude-sonnet-4-5".into(),
            system: "sys".into(),
            messages: vec![
                ChatMessage::User {
                    text: "go".into(),
                    images: Vec::new(),
                },
                ChatMessage::Assistant {
                    thinking: vec![
                        Thinking {
                            text: "hm".into(),
                            signature: "sig".into(),
                        },
                        Thinking {
                            text: "unsigned".into(),
                            signature: String::new(),
                        },
                    ],
                    text: " ".into(),
                    tool_calls: vec![
                        ToolCall {
                            id: "toolu_1".into(),
                            name: "read_file".into(),
                            input: json!({"path": "a"}),
                        },
                        ToolCall {
                            id: "toolu_2".into(),
                            name: "bash".into(),
                            input: json!({"command": "ls"}),
                        },
                    ],
                },
                ChatMessage::ToolResult {
                    call_id: "toolu_1".into(),
                    content: "A".into(),
                    is_error: false,
                },
                ChatMessage::ToolResult {
                    call_id: "toolu_2".into(),
                    content: "no".into(),
                    is_error: true,
                },
                ChatMessage::Assistant {
                    thinking: vec![],
                    text: "done".into(),
                    tool_calls: vec![],
                },
            ],
            tools: vec![ToolDef {
                name: "bash".into(),
                description: "runs".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 0,
            temperature: Some(0.5),
        };
        let b = request_body(&req);
        assert_eq!(b["max_tokens"], FALLBACK_MAX_TOKENS);
        assert_eq!(
            b["system"],
            json!([{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(b["temperature"], 0.5);
        assert_eq!(b["tools"][0]["input_schema"], json!({"type": "object"}));
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 4);
        assert_eq!(
            msgs[1]["content"],
            json!([
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "ls"}},
            ])
        );
        assert_eq!(
            msgs[2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "A", "is_error": false},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no", "is_error": true},
            ]})
        );
        assert_eq!(msgs[3]["content"], json!([{"type": "text", "text": "done"}]));
    }

    #[test]
    fn the_last_user_message_is_a_cache_breakpoint() {
        let mut req = TurnRequest {
            model: "m".into(),
            messages: vec![ChatMessage::User {
                text: "hi".into(),
                images: Vec::new(),
            }],
            ..Default::default()
        };
        let b = request_body(&req);
        assert!(b.get("system").is_none());
        assert_eq!(
            b["messages"],
            json!([{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}])
        );
        req.messages.push(ChatMessage::Assistant {
            thinking: vec![],
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "toolu_1".into(),
                name: "bash".into(),
                input: json!({}),
            }],
        });
        req.messages.push(ChatMessage::ToolResult {
            call_id: "toolu_1".into(),
            content: "ok".into(),
            is_error: false,
        });
        let b = request_body(&req);
        assert_eq!(
            b["messages"][0]["content"], "hi",
            "only the last message is marked"
        );
        assert_eq!(
            b["messages"][2]["content"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
    }

    #[test]
    fn bases_tolerate_v1_and_slashes() {
        assert_eq!(normalize_base(None), "https://api.anthropic.com");
        assert_eq!(normalize_base(Some("https://x.test/v1/")), "https://x.test");
        assert_eq!(
            normalize_base(Some("http://127.0.0.1:9/proxy")),
            "http://127.0.0.1:9/proxy"
        );
    }

    #[test]
    fn models_parse() {
        let m = parse_models(r#"{"data":[{"type":"model","id":"claude-sonnet-4-5","display_name":"Claude Sonnet 4.5","created_at":"2025-09-29T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-5","last_id":"claude-sonnet-4-5"}"#).unwrap();
        assert_eq!(m[0].display_name, "Claude Sonnet 4.5");
        assert!(parse_models("<html>").is_err());
    }
}
