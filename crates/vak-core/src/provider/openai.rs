//! OpenAI-compatible Chat Completions, streamed: OpenAI itself and every server that speaks it by base URL (vLLM, llama.cpp, Ollama, LM Studio).

use super::http::{self, ClientOptions};
use super::{
    ChatMessage, Failure, FailureKind, ModelInfo, ModelsFuture, Provider, ProviderError, ProviderEvent,
    Secret, Sink, StopReason, TokenUsage, ToolCall, TurnFuture, TurnOutput, TurnRequest,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

/// The SDKs' default: the base includes `/v1`, paths are relative to it.
pub(crate) const DEFAULT_BASE: &str = "https://api.openai.com/v1";

pub(crate) struct OpenAi {
    http: reqwest::Client,
    base: String,
    key: Option<Secret>,
    /// `Bearer KEY`, marked sensitive.
    authorization: Option<reqwest::header::HeaderValue>,
    opts: ClientOptions,
    limit_field: LimitField,
}

/// Which body field carries the output token limit.
///
/// OpenAI deprecated `max_tokens` for `max_completion_tokens`, and its
/// reasoning models (o1, o3, gpt-5…) reject `max_tokens` outright; but
/// llama.cpp's server, Ollama and older vLLM and LM Studio builds know only
/// `max_tokens` and silently ignore the other (the limit would be lost). So
/// the official service (and Azure's) gets `max_completion_tokens`, every
/// other base URL `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LimitField {
    MaxCompletionTokens,
    MaxTokens,
}

impl LimitField {
    pub(crate) fn for_base(base: &str) -> LimitField {
        let host = base
            .split("://")
            .nth(1)
            .unwrap_or(base)
            .split(['/', ':'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        if host == "api.openai.com" || host.ends_with(".openai.azure.com") {
            LimitField::MaxCompletionTokens
        } else {
            LimitField::MaxTokens
        }
    }

    fn name(self) -> &'static str {
        match self {
            LimitField::MaxCompletionTokens => "max_completion_tokens",
            LimitField::MaxTokens => "max_tokens",
        }
    }
}

impl OpenAi {
    /// `base`: None is OpenAI's own; a given one is used as is, less a
    /// trailing `/` (SDK convention: `http://localhost:11434/v1`).
    pub(crate) fn new(
        base: Option<&str>,
        key: Option<Secret>,
        opts: ClientOptions,
    ) -> Result<OpenAi, Failure> {
        let base = base
            .unwrap_or(DEFAULT_BASE)
            .trim()
            .trim_end_matches('/')
            .to_string();
        let key = key.filter(|k| !k.expose().is_empty());
        let authorization = match &key {
            Some(k) => Some(http::key_header(&format!("Bearer {}", k.expose()))?),
            None => None,
        };
        Ok(OpenAi {
            http: http::client(&opts)?,
            limit_field: LimitField::for_base(&base),
            base,
            key,
            authorization,
            opts,
        })
    }

    fn authorized(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.authorization {
            Some(v) => rb.header(reqwest::header::AUTHORIZATION, v.clone()),
            None => rb,
        }
    }

    async fn run_turn(
        &self,
        request: &TurnRequest,
        sink: &dyn Sink,
        cancel: &CancellationToken,
    ) -> Result<TurnOutput, ProviderError> {
        let body = request_body(request, self.limit_field);
        let rb = self
            .authorized(self.http.post(format!("{}/chat/completions", self.base)))
            .header("accept", "text/event-stream")
            .json(&body);
        let key = self.key.as_ref();
        let resp = http::send(rb, &self.opts, key, cancel).await?;
        let status = resp.status().as_u16();
        let streamed = async {
            let mut events = http::event_stream(resp, &self.opts, key, cancel).await?;
            let mut asm = Assembler::new(self.opts.max_tool_args_bytes);
            loop {
                let Some(event) = events.next(cancel).await.map_err(|e| scrub(e, key))? else {
                    return asm.finish(false).map_err(|e| scrub(e, key));
                };
                let step = asm
                    .on_data(&event.data)
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
                    return asm.finish(true).map_err(|e| scrub(e, key));
                }
            }
        };
        super::answered(streamed.await, status)
    }

    async fn models(&self) -> Result<Vec<ModelInfo>, Failure> {
        let never = CancellationToken::new();
        let rb = self.authorized(self.http.get(format!("{}/models", self.base)));
        let resp = http::send(rb, &self.opts, self.key.as_ref(), &never)
            .await
            .map_err(failure)?;
        let text = tokio::time::timeout(
            self.opts.idle_timeout,
            http::bounded_text(resp, self.opts.max_event_bytes),
        )
        .await
        .map_err(|_| Failure::new(FailureKind::Network, "the model list stalled", true))?;
        parse_models(&text)
    }
}

fn scrub(e: ProviderError, key: Option<&Secret>) -> ProviderError {
    match e {
        ProviderError::Failed(f) => ProviderError::Failed(http::scrub(f, key)),
        other => other,
    }
}

/// A list call has no cancellation of its own: `Cancelled` cannot happen.
fn failure(e: ProviderError) -> Failure {
    match e {
        ProviderError::Failed(f) => f,
        ProviderError::Cancelled => Failure::new(FailureKind::Network, "cancelled", true),
    }
}

/// `GET /models`: `{"data": [{"id": …}, …]}`.
pub(crate) fn parse_models(text: &str) -> Result<Vec<ModelInfo>, Failure> {
    #[derive(Deserialize)]
    struct List {
        data: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        id: String,
    }
    let list: List = serde_json::from_str(text).map_err(|e| http::bad_json("the model list", &e, text))?;
    Ok(list
        .data
        .into_iter()
        .map(|m| ModelInfo {
            display_name: m.id.clone(),
            id: m.id,
        })
        .collect())
}

impl Provider for OpenAi {
    fn name(&self) -> &str {
        "openai"
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
            self.authorized(self.http.get(format!("{}/models", self.base))),
            timeout,
        ))
    }
}

/// The Chat Completions body for `req`.
pub(crate) fn request_body(req: &TurnRequest, limit: LimitField) -> Value {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if !req.system.is_empty() {
        messages.push(json!({"role": "system", "content": req.system}));
    }
    for m in &req.messages {
        match m {
            ChatMessage::User { text, images } if images.is_empty() => {
                messages.push(json!({"role": "user", "content": text}))
            }
            // Images as content parts with data URLs, after the text.
            ChatMessage::User { text, images } => {
                let mut parts = vec![json!({"type": "text", "text": text})];
                for i in images {
                    parts.push(json!({
                        "type": "image_url",
                        "image_url": {"url": format!("data:{};base64,{}", i.media_type, i.data)},
                    }));
                }
                messages.push(json!({"role": "user", "content": parts}));
            }
            // Thinking is not sent back: Chat Completions has no field for
            // it, and some servers (DeepSeek's) reject `reasoning_content`
            // in input.
            // A turn that only thought has nothing to send back (and an
            // empty assistant message is refused by some servers).
            ChatMessage::Assistant { text, tool_calls, .. } if text.is_empty() && tool_calls.is_empty() => {}
            ChatMessage::Assistant { text, tool_calls, .. } => {
                let mut msg = Map::new();
                msg.insert("role".into(), json!("assistant"));
                // A message with tool calls and no text has content null.
                msg.insert(
                    "content".into(),
                    if text.is_empty() && !tool_calls.is_empty() {
                        Value::Null
                    } else {
                        json!(text)
                    },
                );
                if !tool_calls.is_empty() {
                    let calls: Vec<Value> = tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.input.to_string()},
                            })
                        })
                        .collect();
                    msg.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(msg));
            }
            // Chat Completions has no error flag on a tool result: the
            // content says what went wrong.
            ChatMessage::ToolResult { call_id, content, .. } => {
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}))
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if req.max_tokens > 0 {
        body.insert(limit.name().into(), json!(req.max_tokens));
    }
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    Value::Object(body)
}

// ---- the streamed chunks ---------------------------------------------------------

#[derive(Deserialize, Default)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// vLLM, DeepSeek, llama.cpp.
    #[serde(default)]
    reasoning_content: Option<String>,
    /// OpenRouter, Ollama, LM Studio.
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
    /// OpenAI's refusal text (structured outputs): shown like text.
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A JSON text fragment; some servers send a whole object instead.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Default, Debug)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// What one data payload produced.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Step {
    pub events: Vec<ProviderEvent>,
    /// `[DONE]`: the response is complete.
    pub done: bool,
}

/// Folds the stream's chunks into streamed events and the turn's output:
/// tool calls by `index` (id and name once, argument fragments appended),
/// the finish reason and the final usage chunk.
pub(crate) struct Assembler {
    calls: BTreeMap<usize, PartialCall>,
    args_bytes: usize,
    max_args: usize,
    finish: Option<String>,
    usage: TokenUsage,
    refused: bool,
}

impl Assembler {
    pub(crate) fn new(max_args: usize) -> Self {
        Assembler {
            calls: BTreeMap::new(),
            args_bytes: 0,
            max_args,
            finish: None,
            usage: TokenUsage::default(),
            refused: false,
        }
    }

    /// One SSE `data:` payload.
    pub(crate) fn on_data(&mut self, data: &str) -> Result<Step, Failure> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(Step {
                events: Vec::new(),
                done: true,
            });
        }
        if data.is_empty() {
            return Ok(Step::default());
        }
        let chunk: Chunk =
            serde_json::from_str(data).map_err(|e| http::bad_json("a stream chunk", &e, data))?;
        if let Some(err) = chunk.error {
            return Err(stream_error(&err));
        }
        if let Some(u) = chunk.usage {
            self.usage = TokenUsage {
                input_tokens: u.prompt_tokens.unwrap_or(0),
                output_tokens: u.completion_tokens.unwrap_or(0),
                cache_read_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0),
                cache_write_tokens: 0,
            };
        }
        let mut events = Vec::new();
        // Only the first choice: vak never asks for n > 1.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(delta) = choice.delta {
                // Servers that send both carry the same text in each.
                let thought = delta
                    .reasoning_content
                    .filter(|t| !t.is_empty())
                    .or(delta.reasoning.filter(|t| !t.is_empty()));
                if let Some(t) = thought {
                    events.push(ProviderEvent::Thinking(t));
                }
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    events.push(ProviderEvent::Text(text));
                }
                if let Some(text) = delta.refusal.filter(|t| !t.is_empty()) {
                    self.refused = true;
                    events.push(ProviderEvent::Text(text));
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.on_call(call)?;
                }
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish = Some(reason);
            }
        }
        Ok(Step { events, done: false })
    }

    fn on_call(&mut self, call: ToolCallDelta) -> Result<(), Failure> {
        // Without an index (some servers send whole calls): a known id
        // continues its call and a new one starts one; with no id either, a
        // name starts a new call once the last has its own, and a bare
        // fragment continues the last.
        let id = call.id.as_deref().filter(|s| !s.is_empty());
        let named = call
            .function
            .as_ref()
            .and_then(|f| f.name.as_deref())
            .is_some_and(|n| !n.is_empty());
        let last = self.calls.keys().next_back().copied();
        let slot = match (call.index, id) {
            (Some(i), _) => i,
            (None, Some(id)) => match self.calls.iter().find(|(_, c)| c.id == id) {
                Some((k, _)) => *k,
                None => last.map_or(0, |k| k + 1),
            },
            (None, None) => match last {
                Some(k) if named && self.calls.get(&k).is_some_and(|c| !c.name.is_empty()) => k + 1,
                Some(k) => k,
                None => 0,
            },
        };
        if slot > 1024 {
            return Err(Failure::new(
                FailureKind::BadResponse,
                format!("tool call index {slot} is out of range"),
                false,
            ));
        }
        let entry = self.calls.entry(slot).or_default();
        if let Some(id) = call.id.filter(|s| !s.is_empty()) {
            if entry.id.is_empty() {
                entry.id = id;
            }
        }
        if let Some(f) = call.function {
            if let Some(name) = f.name.filter(|s| !s.is_empty()) {
                if entry.name.is_empty() {
                    entry.name = name;
                } else if entry.name != name {
                    // Some servers repeat the name with each fragment.
                    entry.name.push_str(&name);
                }
            }
            let fragment = match f.arguments {
                Some(Value::String(s)) => s,
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            self.args_bytes += fragment.len();
            if self.args_bytes > self.max_args {
                return Err(Failure::new(
                    FailureKind::BadResponse,
                    format!("tool call arguments are larger than {} bytes", self.max_args),
                    false,
                ));
            }
            entry.arguments.push_str(&fragment);
        }
        Ok(())
    }

    /// The turn's output. `done`: `[DONE]` arrived; without it, a stream
    /// that gave a finish reason is complete too (some servers end there),
    /// one that gave neither was cut.
    pub(crate) fn finish(self, done: bool) -> Result<TurnOutput, ProviderError> {
        if !done && self.finish.is_none() {
            return Err(http::ended_early());
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (_, c) in self.calls {
            let args = c.arguments.trim();
            let input = if args.is_empty() {
                Value::Object(Map::new())
            } else {
                serde_json::from_str::<Value>(args).map_err(|e| {
                    ProviderError::Failed(http::bad_json(
                        &format!("the arguments of tool call {} ({})", c.id, c.name),
                        &e,
                        args,
                    ))
                })?
            };
            if c.name.is_empty() {
                return Err(ProviderError::Failed(Failure::new(
                    FailureKind::BadResponse,
                    format!("tool call {} has no name", c.id),
                    false,
                )));
            }
            tool_calls.push(ToolCall {
                id: c.id,
                name: c.name,
                input,
            });
        }
        let mut stop = match self.finish.as_deref() {
            Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
            Some("length") => StopReason::MaxTokens,
            Some("content_filter") => StopReason::ContentFilter,
            _ => StopReason::EndTurn,
        };
        // Ollama and some llama.cpp builds say "stop" after tool calls.
        if stop == StopReason::EndTurn && !tool_calls.is_empty() {
            stop = StopReason::ToolUse;
        }
        if stop == StopReason::EndTurn && self.refused {
            stop = StopReason::Refusal;
        }
        Ok(TurnOutput {
            tool_calls,
            usage: self.usage,
            stop,
            status: None,
        })
    }
}

/// `{"error": {"message", "type", "code"}}` in the stream (or a bare string).
fn stream_error(err: &Value) -> Failure {
    let kind = err
        .get("type")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| err.get("code").and_then(Value::as_str))
        .unwrap_or("");
    http::classify_error_type(kind, &err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Thinking, ToolDef};

    fn feed(asm: &mut Assembler, lines: &[&str]) -> (Vec<ProviderEvent>, bool) {
        let mut events = Vec::new();
        let mut done = false;
        for l in lines {
            let s = asm.on_data(l).unwrap();
            events.extend(s.events);
            done |= s.done;
        }
        (events, done)
    }

    #[test]
    fn text_usage_and_done() {
        let mut asm = Assembler::new(1 << 20);
        let (events, done) = feed(
            &mut asm,
            &[
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                r#"{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}}"#,
                "[DONE]",
            ],
        );
        assert_eq!(
            events,
            vec![
                ProviderEvent::Text("Hel".into()),
                ProviderEvent::Text("lo".into())
            ]
        );
        assert!(done);
        let out = asm.finish(true).unwrap();
        assert_eq!(out.stop, StopReason::EndTurn);
        assert_eq!(
            out.usage,
            TokenUsage {
                input_tokens: 12,
                output_tokens: 3,
                cache_read_tokens: 8,
                cache_write_tokens: 0
            }
        );
    }

    #[test]
    fn fragments_of_parallel_calls_interleave_by_index() {
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read_file","arguments":""}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"bash","arguments":""}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"command\":"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\":\"a.txt\"}"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"ls\"}"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                "[DONE]",
            ],
        );
        let out = asm.finish(true).unwrap();
        assert_eq!(out.stop, StopReason::ToolUse);
        assert_eq!(
            out.tool_calls,
            vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "read_file".into(),
                    input: json!({"path": "a.txt"})
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "bash".into(),
                    input: json!({"command": "ls"})
                },
            ]
        );
    }

    #[test]
    fn a_whole_call_in_one_chunk_and_a_stop_finish_reason_is_tool_use() {
        // Ollama: one chunk with the whole call, finish_reason "stop".
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                r#"{"id":"chatcmpl-42","object":"chat.completion.chunk","model":"qwen3","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_x1","index":0,"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b.txt\"}"}}]},"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-42","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
        );
        let out = asm.finish(true).unwrap();
        assert_eq!(out.stop, StopReason::ToolUse);
        assert_eq!(out.tool_calls[0].input, json!({"path": "b.txt"}));
        // Without index, whole calls with distinct ids are distinct calls.
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                r#"{"choices":[{"delta":{"tool_calls":[{"id":"call_1","function":{"name":"a","arguments":{"x":1}}},{"id":"call_2","function":{"name":"b","arguments":"{}"}}]}}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            ],
        );
        let out = asm.finish(false).unwrap();
        assert_eq!(out.tool_calls.len(), 2);
        assert_eq!(out.tool_calls[0].input, json!({"x": 1}));
        assert_eq!(out.tool_calls[1].name, "b");
        // Neither index nor id: names start calls, bare fragments continue them.
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                r#"{"choices":[{"delta":{"tool_calls":[{"id":"","function":{"name":"a","arguments":"{\"x\""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"id":"","function":{"arguments":":1}"}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"b","arguments":"{}"}}]}}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            ],
        );
        let out = asm.finish(false).unwrap();
        let got: Vec<(&str, &Value)> = out
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), &c.input))
            .collect();
        assert_eq!(got, vec![("a", &json!({"x": 1})), ("b", &json!({}))]);
    }

    #[test]
    fn finish_reasons_map_and_empty_or_unknown_ones_end_the_turn() {
        for (reason, stop) in [
            ("\"stop\"", StopReason::EndTurn),
            ("\"length\"", StopReason::MaxTokens),
            ("\"content_filter\"", StopReason::ContentFilter),
            ("\"\"", StopReason::EndTurn),
            ("null", StopReason::EndTurn),
            ("\"eos\"", StopReason::EndTurn),
        ] {
            let mut asm = Assembler::new(1 << 20);
            let chunk = format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"x"}},"finish_reason":{reason}}}]}}"#
            );
            feed(&mut asm, &[&chunk, "[DONE]"]);
            assert_eq!(asm.finish(true).unwrap().stop, stop, "{reason}");
        }
    }

    #[test]
    fn reasoning_fields_stream_as_thinking_and_empty_choices_pass() {
        let mut asm = Assembler::new(1 << 20);
        let (events, _) = feed(
            &mut asm,
            &[
                r#"{"choices":[]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning":"ok"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"ok","reasoning":"ok"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#,
            ],
        );
        assert_eq!(
            events,
            vec![
                ProviderEvent::Thinking("hmm".into()),
                ProviderEvent::Thinking("ok".into()),
                ProviderEvent::Thinking("ok".into()),
                ProviderEvent::Text("hi".into())
            ]
        );
    }

    #[test]
    fn a_refusal_streams_as_text_and_stops_as_refusal() {
        let mut asm = Assembler::new(1 << 20);
        let (events, _) = feed(
            &mut asm,
            &[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":""}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"refusal":"I can't help with that."}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            ],
        );
        assert_eq!(
            events,
            vec![ProviderEvent::Text("I can't help with that.".into())]
        );
        assert_eq!(asm.finish(false).unwrap().stop, StopReason::Refusal);
    }

    #[test]
    fn a_stream_cut_before_any_end_fails_as_network() {
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#],
        );
        match asm.finish(false) {
            Err(ProviderError::Failed(f)) => assert_eq!((f.kind, f.retryable), (FailureKind::Network, true)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_arguments_oversize_and_in_stream_errors_fail_cleanly() {
        let mut asm = Assembler::new(1 << 20);
        feed(
            &mut asm,
            &[
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_q","function":{"name":"bash","arguments":"{\"command\": \"ls"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                "[DONE]",
            ],
        );
        match asm.finish(true) {
            Err(ProviderError::Failed(f)) => {
                assert_eq!(f.kind, FailureKind::BadResponse);
                assert!(f.detail.contains("call_q"), "{}", f.detail);
            }
            other => panic!("{other:?}"),
        }

        let mut asm = Assembler::new(16);
        let chunk = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"x","arguments":"0123456789"}}]}}]}"#;
        asm.on_data(chunk).unwrap();
        let f = asm.on_data(chunk).unwrap_err();
        assert_eq!((f.kind, f.retryable), (FailureKind::BadResponse, false));

        let mut asm = Assembler::new(16);
        let f = asm
            .on_data(r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#)
            .unwrap_err();
        assert_eq!((f.kind, f.retryable), (FailureKind::BadResponse, true));
        let f = asm.on_data("{not json").unwrap_err();
        assert_eq!(f.kind, FailureKind::BadResponse);
    }

    #[test]
    fn the_body_carries_history_tools_and_the_right_limit_field() {
        let req = TurnRequest {
            model: "gpt-4.1".into(),
            system: "be brief".into(),
            messages: vec![
                ChatMessage::User {
                    text: "hi".into(),
                    images: Vec::new(),
                },
                ChatMessage::Assistant {
                    thinking: vec![Thinking {
                        text: "t".into(),
                        signature: String::new(),
                    }],
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "read_file".into(),
                        input: json!({"path": "a"}),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "call_1".into(),
                    content: "A".into(),
                    is_error: false,
                },
            ],
            tools: vec![ToolDef {
                name: "read_file".into(),
                description: "reads".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 100,
            temperature: None,
        };
        let b = request_body(&req, LimitField::for_base(DEFAULT_BASE));
        assert_eq!(b["max_completion_tokens"], 100);
        assert!(b.get("max_tokens").is_none() && b.get("temperature").is_none());
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(
            b["messages"][2],
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}
            ]})
        );
        assert_eq!(
            b["messages"][3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "A"})
        );
        assert_eq!(b["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        let b = request_body(
            &TurnRequest { tools: vec![], ..req },
            LimitField::for_base("http://localhost:11434/v1"),
        );
        assert_eq!(b["max_tokens"], 100);
        assert!(b.get("tools").is_none());
        assert_eq!(
            LimitField::for_base("https://x.openai.azure.com/openai"),
            LimitField::MaxCompletionTokens
        );
    }
}
