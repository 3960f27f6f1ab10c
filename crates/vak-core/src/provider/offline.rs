//! The embedded offline model: deterministic, streaming, and able to drive every tool through prompt directives.
//!
//! Each non-blank prompt line runs in order. Lines starting with a directive
//! (`/think`, `/read`, `/write`, `/edit`, `/ls`, `/glob`, `/grep`, `/bash`,
//! `/bash-timeout`, `/plan`, `/plan-items`, `/worker`, `/call`, `/sleep`, `/burst`, `/fail`) act;
//! `/NAME [ARGUMENTS]` calls an offered promoted skill `skill__NAME`;
//! any other line L is answered `echo: L`, one text_delta per word. A tool
//! directive ends the turn with that tool call (consecutive `/worker` lines
//! end it with one spawn_worker call each, which run in parallel); the next
//! turn resumes after it (the number of tool results since the prompt says where), so the
//! model keeps no state of its own.

use super::{
    ChatMessage, Failure, FailureKind, ModelInfo, ModelsFuture, Provider, ProviderError, ProviderEvent, Sink,
    StopReason, ToolCall, ToolDef, TurnFuture, TurnOutput, TurnRequest, SKILL_TOOL_PREFIX,
};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How soon a `/fail` asks to be retried.
pub(crate) const FAIL_RETRY_AFTER: Duration = Duration::from_millis(50);

/// The largest `/burst` the model accepts.
pub(crate) const MAX_BURST: u64 = 10_000_000;

/// The largest delta `/burst N SIZE` pads to (1 MiB, the size the bus merges
/// queued deltas up to, so one padded delta is never larger than a merged frame).
pub(crate) const MAX_DELTA_SIZE: u64 = 1 << 20;

#[derive(Default)]
pub(crate) struct OfflineModel;

#[derive(Clone, Debug, PartialEq)]
enum Directive<'a> {
    Echo(&'a str),
    Think(&'a str),
    Tool(&'a str, Value),
    Sleep(u64),
    /// N deltas as fast as possible, each padded to `size` bytes (0: unpadded).
    Burst {
        n: u64,
        size: u64,
    },
    /// N deltas at a fixed rate, each stamped with its send time (benchmarks).
    Pace {
        n: u64,
        per_sec: u64,
    },
    Fail(&'a str),
    /// A directive with a malformed argument: answered with this explanation.
    Invalid(String),
}

fn parse(line: &str) -> Directive<'_> {
    let word = |name: &str| -> Option<&str> {
        let rest = line.strip_prefix(name)?;
        if rest.is_empty() {
            Some("")
        } else if rest.starts_with(char::is_whitespace) {
            Some(rest.trim_start())
        } else {
            None
        }
    };
    let number = |name: &str, arg: &str, max: u64| -> Result<u64, String> {
        match arg.trim().parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(format!(
                "{name} expects a whole number up to {max}, got {:?}",
                arg.trim()
            )),
        }
    };
    if let Some(t) = word("/think") {
        return Directive::Think(t);
    }
    // `/NAME {...}` gives a tool its whole input as a JSON object.
    let object = |name: &str, tool: &'static str, arg: &str| -> Option<Directive<'static>> {
        if !arg.starts_with('{') {
            return None;
        }
        Some(match serde_json::from_str::<Value>(arg) {
            Ok(v) if v.is_object() => Directive::Tool(tool, v),
            Ok(_) => Directive::Invalid(format!("{name} expects a JSON object")),
            Err(e) => Directive::Invalid(format!("{name}: bad JSON argument: {e}")),
        })
    };
    if let Some(p) = word("/read") {
        return object("/read", "read_file", p)
            .unwrap_or_else(|| Directive::Tool("read_file", json!({ "path": p.trim() })));
    }
    if let Some(rest) = word("/edit") {
        if let Some(d) = object("/edit", "edit_file", rest) {
            return d;
        }
        let (path, change) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        return match change.split_once(" => ") {
            Some((old, new)) => Directive::Tool(
                "edit_file",
                json!({ "path": path, "old_string": old, "new_string": new }),
            ),
            None => Directive::Invalid("/edit expects PATH OLD => NEW or a JSON object".into()),
        };
    }
    if let Some(p) = word("/ls") {
        return object("/ls", "list_dir", p).unwrap_or_else(|| match p {
            "" => Directive::Tool("list_dir", json!({})),
            p => Directive::Tool("list_dir", json!({ "path": p })),
        });
    }
    if let Some(rest) = word("/glob") {
        return object("/glob", "glob", rest).unwrap_or_else(|| {
            let mut it = rest.split_whitespace();
            match (it.next(), it.next()) {
                (Some(pattern), None) => Directive::Tool("glob", json!({ "pattern": pattern })),
                (Some(pattern), Some(path)) => {
                    Directive::Tool("glob", json!({ "pattern": pattern, "path": path }))
                }
                (None, _) => Directive::Invalid("/glob expects PATTERN [PATH] or a JSON object".into()),
            }
        });
    }
    if let Some(pattern) = word("/grep") {
        return object("/grep", "grep", pattern).unwrap_or_else(|| match pattern {
            "" => Directive::Invalid("/grep expects PATTERN or a JSON object".into()),
            p => Directive::Tool("grep", json!({ "pattern": p })),
        });
    }
    if let Some(rest) = word("/write") {
        // The JSON form carries content of several lines.
        if let Some(d) = object("/write", "write_file", rest) {
            return d;
        }
        let (path, content) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        return Directive::Tool("write_file", json!({ "path": path, "content": content }));
    }
    if let Some(cmd) = word("/bash") {
        return Directive::Tool("bash", json!({ "command": cmd }));
    }
    if let Some(rest) = word("/worker") {
        // `/worker {...}` gives spawn_worker its whole input (wait, isolated).
        if let Some(d) = object("/worker", "spawn_worker", rest) {
            return d;
        }
        if rest.trim().is_empty() {
            return Directive::Invalid("/worker expects PROMPT (the worker's task) or a JSON object".into());
        }
        return Directive::Tool(
            "spawn_worker",
            json!({ "prompt": rest, "isolated": true, "wait": true }),
        );
    }
    if let Some(rest) = word("/plan-items") {
        // A JSON array of items, or update_plan's whole input.
        return match serde_json::from_str::<Value>(rest) {
            Ok(Value::Array(items)) => Directive::Tool("update_plan", json!({ "items": items })),
            Ok(v @ Value::Object(_)) => Directive::Tool("update_plan", v),
            Ok(_) => Directive::Invalid("/plan-items expects a JSON array of items or an object".into()),
            Err(e) => Directive::Invalid(format!("/plan-items: bad JSON: {e}")),
        };
    }
    if let Some(plan) = word("/plan") {
        return Directive::Tool("exit_plan_mode", json!({ "plan": plan }));
    }
    if let Some(rest) = word("/bash-timeout") {
        // SECS goes to the tool as given (a number when it is one), so the
        // tool's own check of it is reachable.
        let (secs, cmd) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let secs = secs.parse::<u64>().map_or_else(|_| json!(secs), |n| json!(n));
        return Directive::Tool("bash", json!({ "command": cmd.trim_start(), "timeout": secs }));
    }
    if let Some(rest) = word("/call") {
        // Any tool by name (MCP tools included), with its input as a JSON object.
        let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let args = args.trim();
        if name.is_empty() {
            return Directive::Invalid("/call expects TOOL-NAME [JSON-OBJECT]".into());
        }
        if args.is_empty() {
            return Directive::Tool(name, json!({}));
        }
        return match serde_json::from_str::<Value>(args) {
            Ok(v) if v.is_object() => Directive::Tool(name, v),
            Ok(_) => Directive::Invalid("/call expects a JSON object as the tool's input".into()),
            Err(e) => Directive::Invalid(format!("/call: bad JSON argument: {e}")),
        };
    }
    if let Some(ms) = word("/sleep") {
        return number("/sleep", ms, 3_600_000).map_or_else(Directive::Invalid, Directive::Sleep);
    }
    if let Some(args) = word("/burst") {
        // `/burst N [SIZE]`: SIZE sizes each delta for the growth benchmarks.
        let mut it = args.split_whitespace();
        let n = number("/burst", it.next().unwrap_or(""), MAX_BURST);
        let size = it.next().map_or(Ok(0), |s| number("/burst", s, MAX_DELTA_SIZE));
        return match (n, size, it.next()) {
            (Ok(n), Ok(size), None) => Directive::Burst { n, size },
            (Err(e), _, _) | (_, Err(e), _) => Directive::Invalid(e),
            (_, _, Some(_)) => Directive::Invalid("/burst expects N [SIZE]".into()),
        };
    }
    if let Some(args) = word("/pace") {
        let mut it = args.split_whitespace();
        let n = number("/pace", it.next().unwrap_or(""), MAX_BURST);
        let rate = number("/pace", it.next().unwrap_or(""), 10_000_000);
        return match (n, rate) {
            (Ok(n), Ok(per_sec)) if per_sec > 0 => Directive::Pace { n, per_sec },
            (Err(e), _) | (_, Err(e)) => Directive::Invalid(e),
            _ => Directive::Invalid("/pace needs a rate above 0".into()),
        };
    }
    if let Some(msg) = word("/fail") {
        return Directive::Fail(msg);
    }
    Directive::Echo(line)
}

/// A line the turn's tools give a meaning the fixed directives do not: `/NAME
/// [ARGUMENTS]` where the turn offers a promoted skill's tool `skill__NAME`
/// (section 41's slash command) calls it, `{"arguments": ARGUMENTS}` (`{}`
/// without). The fixed directives come first: a skill named `bash` is
/// reached with `/call skill__bash`.
fn parse_in<'a>(line: &'a str, tools: &'a [ToolDef]) -> Directive<'a> {
    match parse(line) {
        Directive::Echo(l) => skill_line(l, tools).unwrap_or(Directive::Echo(l)),
        d => d,
    }
}

fn skill_line<'a>(line: &'a str, tools: &'a [ToolDef]) -> Option<Directive<'a>> {
    let rest = line.strip_prefix('/')?;
    let (name, arguments) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let tool = tools
        .iter()
        .find(|t| t.name.strip_prefix(SKILL_TOOL_PREFIX) == Some(name) && !name.is_empty())?;
    let arguments = arguments.trim();
    let input = match arguments.is_empty() {
        true => json!({}),
        false => json!({ "arguments": arguments }),
    };
    Some(Directive::Tool(tool.name.as_str(), input))
}

/// `/plan-items`' evidence `$last` stands for the id of the last tool call
/// in the history (the one the line before made): the prompt's writer
/// cannot know a call's id in advance.
fn cite_last_call(input: &mut Value, history: &[ChatMessage]) {
    let last = history.iter().rev().find_map(|m| match m {
        ChatMessage::Assistant { tool_calls, .. } => tool_calls.last().map(|c| c.id.clone()),
        _ => None,
    });
    let Some(items) = input.get_mut("items").and_then(Value::as_array_mut) else {
        return;
    };
    for cited in items
        .iter_mut()
        .filter_map(|i| i.get_mut("evidence").and_then(Value::as_array_mut))
        .flatten()
    {
        if cited.as_str() == Some("$last") {
            if let Some(id) = &last {
                *cited = Value::String(id.clone());
            }
        }
    }
}

/// Whether a prompt line is a `/worker` (a spawn_worker call).
fn is_worker(d: &Directive<'_>) -> bool {
    matches!(d, Directive::Tool("spawn_worker", _))
}

/// `/burst`'s token `i`, "t{i} ", in a buffer sized once: `format!` grows
/// its buffer as it writes, and a burst is millions of these.
fn token(i: u64) -> String {
    use std::fmt::Write;
    let mut t = String::with_capacity(22);
    let _ = write!(t, "t{i} ");
    t
}

/// `/burst N SIZE`'s delta `i`: `t{i}`, then `_` up to SIZE bytes with the
/// trailing space (never shorter than the unpadded token): one token per
/// delta still, so a reader counts deltas by spaces however they merge.
fn sized_token(i: u64, size: u64) -> String {
    let mut t = token(i);
    let want = size as usize;
    if t.len() < want {
        t.pop();
        t.reserve_exact(want - t.len());
        t.extend(std::iter::repeat_n('_', want - 1 - t.len()));
        t.push(' ');
    }
    t
}

/// Splits `text` into words that keep their trailing space, so they concatenate back to `text`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive(' ')
}

/// Words a line streams one delta each; past them, deltas of `ECHO_CHUNK` bytes.
const ECHO_WORDS: usize = 256;
const ECHO_CHUNK: usize = 8 * 1024;

/// What a line streams as: a delta per word, like a model's tokens, for the
/// first `ECHO_WORDS` words, then chunks, so echoing a 4 MiB prompt of two
/// million words is hundreds of events rather than millions (merged at the
/// source; `/burst N` keeps its N deltas).
fn deltas(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut chunk = String::new();
    for (i, w) in words(text).enumerate() {
        if i < ECHO_WORDS {
            out.push(w.to_string());
            continue;
        }
        chunk.push_str(w);
        if chunk.len() >= ECHO_CHUNK {
            out.push(std::mem::take(&mut chunk));
        }
    }
    if !chunk.is_empty() {
        out.push(chunk);
    }
    out
}

impl OfflineModel {
    async fn answer(
        &self,
        request: &TurnRequest,
        sink: &dyn Sink,
        cancel: &CancellationToken,
    ) -> Result<TurnOutput, ProviderError> {
        let history = &request.messages;
        let last_user = history
            .iter()
            .rposition(|m| matches!(m, ChatMessage::User { .. }));
        let (prompt, results) = match last_user {
            Some(i) => (
                match &history[i] {
                    ChatMessage::User { text, .. } => text.as_str(),
                    _ => "",
                },
                history[i + 1..]
                    .iter()
                    .filter_map(|m| match m {
                        ChatMessage::ToolResult {
                            content, is_error, ..
                        } => Some((content.as_str(), *is_error)),
                        _ => None,
                    })
                    .collect(),
            ),
            None => ("", Vec::new()),
        };
        let done_tools = results.len();
        let mut out = TurnOutput::default();
        out.usage.input_tokens = prompt.split_whitespace().count() as u64;
        let mut skip_tools = done_tools;
        let mut wrote_text = false;
        // Images are acknowledged, once, as the input's first text line.
        let mut ack = match last_user.map(|i| &history[i]) {
            Some(ChatMessage::User { images, .. }) if done_tools == 0 && !images.is_empty() => {
                let types: Vec<&str> = images.iter().map(|i| i.media_type.as_str()).collect();
                Some(format!(
                    "seen {}: {}",
                    crate::text::count(images.len(), "image"),
                    types.join(", ")
                ))
            }
            _ => None,
        };
        let lines: Vec<&str> = prompt
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.trim().is_empty())
            .collect();
        let mut lines = lines.into_iter().peekable();
        // The request's output limit (0: none), counted a token per word like
        // the usage: text past it is cut and the turn stops with MaxTokens.
        let limit = u64::from(request.max_tokens);
        let mut cut = false;
        // The results of the `/worker` lines just before (one turn's batch).
        let mut workers: Vec<usize> = Vec::new();
        while let Some(line) = lines.next() {
            let directive = parse_in(line, &request.tools);
            if skip_tools > 0 {
                let worker = is_worker(&directive);
                if !worker {
                    workers.clear();
                }
                if matches!(directive, Directive::Tool(..)) {
                    let at = done_tools - skip_tools;
                    skip_tools -= 1;
                    if worker {
                        workers.push(at);
                    }
                    // A `/call` (or a skill's slash line) echoes the result it
                    // got, first thing in the next turn; a batch of `/worker`s
                    // each of theirs.
                    let says_result = line.starts_with("/call") || skill_line(line, &request.tools).is_some();
                    if skip_tools == 0 && says_result {
                        if let Some((content, is_error)) = results.last() {
                            let kind = if *is_error { "error" } else { "result" };
                            ack = Some(format!("{kind}: {content}"));
                        }
                    } else if skip_tools == 0 && worker {
                        let said: Vec<String> = workers
                            .iter()
                            .filter_map(|&i| results.get(i))
                            .map(|(content, is_error)| {
                                let kind = if *is_error { "worker error" } else { "worker" };
                                format!("{kind}: {content}")
                            })
                            .collect();
                        ack = Some(said.join("\n"));
                    }
                }
                continue;
            }
            if cancel.is_cancelled() {
                return Err(ProviderError::Cancelled);
            }
            let mut say = |text: String| {
                let mut first = true;
                for w in deltas(&text) {
                    let w = if first && wrote_text { format!("\n{w}") } else { w };
                    first = false;
                    // A token per word, however the words were grouped into deltas.
                    let tokens = w.split_whitespace().count().max(1) as u64;
                    if limit > 0 && out.usage.output_tokens + tokens > limit {
                        let room = (limit - out.usage.output_tokens) as usize;
                        let kept: String = w.split_inclusive(' ').take(room).collect();
                        if !kept.is_empty() {
                            out.usage.output_tokens += room as u64;
                            sink.send(ProviderEvent::Text(kept));
                        }
                        cut = true;
                        break;
                    }
                    out.usage.output_tokens += tokens;
                    sink.send(ProviderEvent::Text(w));
                }
                wrote_text = true;
            };
            if let Some(a) = ack.take() {
                say(a);
            }
            match directive {
                Directive::Echo(l) => say(format!("echo: {l}")),
                Directive::Invalid(why) => say(format!("error: {why}")),
                Directive::Think(t) => {
                    for w in words(t) {
                        sink.send(ProviderEvent::Thinking(w.to_string()));
                        out.usage.output_tokens += 1;
                    }
                }
                Directive::Tool(name, mut input) => {
                    if name == "update_plan" {
                        cite_last_call(&mut input, history);
                    }
                    let batch = name == "spawn_worker";
                    let call = |name: &str, input| ToolCall {
                        id: format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
                        name: name.into(),
                        input,
                    };
                    out.tool_calls.push(call(name, input));
                    out.usage.output_tokens += 1;
                    // `/worker` lines in a row are one turn's calls: they run together.
                    if batch {
                        while let Some(Directive::Tool("spawn_worker", input)) =
                            lines.peek().map(|l| parse(l))
                        {
                            lines.next();
                            out.tool_calls.push(call("spawn_worker", input));
                            out.usage.output_tokens += 1;
                        }
                    }
                    out.stop = StopReason::ToolUse;
                    return Ok(out);
                }
                Directive::Sleep(ms) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                        _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                    }
                }
                Directive::Burst { n, size } => {
                    // Hands the runtime back after each chunk: chunks start
                    // small, so the writer has the first deltas on their way
                    // before the model has made a thousand more.
                    let mut chunk = 64;
                    let mut next_yield = chunk;
                    for i in 0..n {
                        if i == next_yield {
                            chunk = (chunk * 2).min(1024);
                            next_yield += chunk;
                            if cancel.is_cancelled() {
                                return Err(ProviderError::Cancelled);
                            }
                            sink.ready().await;
                            tokio::task::yield_now().await;
                        }
                        let delta = if size == 0 { token(i) } else { sized_token(i, size) };
                        sink.send(ProviderEvent::Text(delta));
                    }
                    out.usage.output_tokens += n;
                    wrote_text = true;
                }
                Directive::Pace { n, per_sec } => {
                    // Deltas are sent on a fixed schedule from the start, so a
                    // slow tick is caught up rather than stretching the stream.
                    let start = tokio::time::Instant::now();
                    let period = Duration::from_nanos(1_000_000_000 / per_sec);
                    for i in 0..n {
                        let due = start + period * (i as u32);
                        tokio::select! {
                            _ = tokio::time::sleep_until(due) => {}
                            _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                        }
                        let micros = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_micros());
                        sink.send(ProviderEvent::Text(format!("p{i}@{micros} ")));
                    }
                    out.usage.output_tokens += n;
                    wrote_text = true;
                }
                Directive::Fail(msg) => {
                    // Retryable, and soon: tests of the retry path stay fast.
                    let mut f = Failure::new(FailureKind::Directive(msg.to_string()), msg, true);
                    f.retry_after = Some(FAIL_RETRY_AFTER);
                    return Err(ProviderError::Failed(f));
                }
            }
            if cut {
                out.stop = StopReason::MaxTokens;
                return Ok(out);
            }
        }
        // A `/call` on the prompt's last line: its result is all this turn says.
        if let Some(a) = ack.take() {
            for (i, w) in deltas(&a).into_iter().enumerate() {
                let w = if i == 0 && wrote_text { format!("\n{w}") } else { w };
                out.usage.output_tokens += w.split_whitespace().count().max(1) as u64;
                sink.send(ProviderEvent::Text(w));
            }
        }
        Ok(out)
    }
}

impl Provider for OfflineModel {
    fn name(&self) -> &str {
        "offline"
    }

    fn turn<'a>(
        &'a self,
        request: &'a TurnRequest,
        sink: &'a dyn Sink,
        cancel: &'a CancellationToken,
    ) -> TurnFuture<'a> {
        Box::pin(self.answer(request, sink, cancel))
    }

    fn list_models(&self) -> ModelsFuture<'_> {
        Box::pin(std::future::ready(Ok(vec![ModelInfo {
            id: "offline".into(),
            display_name: "the offline echo model".into(),
        }])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;
    use crate::log::transcript::Transcript;
    use std::sync::Mutex;

    fn user(t: &mut Transcript, text: &str) {
        t.apply(
            1,
            &ClientEvent::UserMessage {
                text: text.into(),
                request_id: "r".into(),
                attachments: Vec::new(),
            },
        );
    }

    async fn turn(t: &Transcript) -> (Result<TurnOutput, ProviderError>, Vec<ProviderEvent>) {
        let got = Mutex::new(Vec::new());
        let sink = |e: ProviderEvent| got.lock().unwrap().push(e);
        let req = TurnRequest {
            messages: t.chat(),
            ..TurnRequest::default()
        };
        let r = OfflineModel.turn(&req, &sink, &CancellationToken::new()).await;
        (r, got.into_inner().unwrap())
    }

    fn text(evs: &[ProviderEvent]) -> String {
        evs.iter()
            .filter_map(|e| match e {
                ProviderEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_plain_line_is_echoed_one_delta_per_word() {
        let mut t = Transcript::default();
        user(&mut t, "hello big world");
        let (r, evs) = turn(&t).await;
        assert!(r.unwrap().tool_calls.is_empty());
        assert_eq!(
            evs,
            ["echo: ", "hello ", "big ", "world"].map(|w| ProviderEvent::Text(w.into()))
        );
    }

    #[tokio::test]
    async fn text_past_the_output_limit_is_cut_and_the_turn_stops_with_max_tokens() {
        let mut t = Transcript::default();
        user(&mut t, "hello big world again\n/read a");
        let got = Mutex::new(Vec::new());
        let sink = |e: ProviderEvent| got.lock().unwrap().push(e);
        let req = TurnRequest {
            messages: t.chat(),
            max_tokens: 3,
            ..TurnRequest::default()
        };
        let out = OfflineModel
            .turn(&req, &sink, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(text(&got.into_inner().unwrap()), "echo: hello big ");
        assert_eq!((out.stop, out.usage.output_tokens), (StopReason::MaxTokens, 3));
        assert!(out.tool_calls.is_empty(), "a cut turn calls no tool");
        // Within the limit nothing changes.
        let (r, evs) = turn(&t).await;
        assert_eq!(r.unwrap().stop, StopReason::ToolUse);
        assert_eq!(text(&evs), "echo: hello big world again");
    }

    #[test]
    fn a_long_line_streams_word_deltas_then_chunks_with_the_same_text() {
        let line = "w ".repeat(100_000);
        let d = deltas(&line);
        assert!(d[..ECHO_WORDS].iter().all(|w| w == "w "), "word by word first");
        assert!(d.len() < ECHO_WORDS + 30, "{} deltas", d.len());
        assert_eq!(d.concat(), line, "nothing lost or reordered");
        assert_eq!(deltas("a b"), ["a ", "b"]);
    }

    #[test]
    fn plan_proposes_the_rest_of_its_line_with_exit_plan_mode() {
        assert_eq!(
            parse("/plan 1. read  2. edit"),
            Directive::Tool("exit_plan_mode", json!({"plan": "1. read  2. edit"}))
        );
        assert_eq!(parse("/planet"), Directive::Echo("/planet"));
    }

    #[test]
    fn a_slash_line_naming_an_offered_skill_calls_its_tool_and_directives_come_first() {
        let tool = |name: &str| ToolDef {
            name: name.into(),
            description: String::new(),
            input_schema: json!({}),
        };
        let tools = [tool("skill__fmt-check"), tool("skill__bash"), tool("read_file")];
        assert_eq!(
            parse_in("/fmt-check", &tools),
            Directive::Tool("skill__fmt-check", json!({}))
        );
        assert_eq!(
            parse_in("/fmt-check  only src/ ", &tools),
            Directive::Tool("skill__fmt-check", json!({"arguments": "only src/"}))
        );
        // Not offered, a prefix of a name, or a built-in tool's name: echoed.
        for line in ["/fmt", "/fmt-checker", "/read_file", "/", "fmt-check"] {
            assert_eq!(parse_in(line, &tools), Directive::Echo(line), "{line}");
        }
        assert_eq!(
            parse_in("/bash ls", &tools),
            Directive::Tool("bash", json!({"command": "ls"}))
        );
    }

    #[tokio::test]
    async fn directives_run_in_order_and_resume_after_each_tool() {
        let mut t = Transcript::default();
        user(
            &mut t,
            "/think why not\nfirst\n/read a.txt\nsecond\n/bash ls -la\n/burst 3",
        );
        let (r, evs) = turn(&t).await;
        let out = r.unwrap();
        assert_eq!(evs[0], ProviderEvent::Thinking("why ".into()));
        assert_eq!(text(&evs), "echo: first");
        assert_eq!(out.tool_calls[0].name, "read_file");
        assert_eq!(out.tool_calls[0].input, json!({"path": "a.txt"}));
        t.apply(
            2,
            &ClientEvent::ToolCall {
                call_id: "c".into(),
                tool: "read_file".into(),
                input: json!({}),
            },
        );
        let (r, evs) = turn(&t).await;
        assert_eq!(text(&evs), "echo: second");
        assert_eq!(r.unwrap().tool_calls[0].input, json!({"command": "ls -la"}));
        t.apply(
            3,
            &ClientEvent::ToolCall {
                call_id: "d".into(),
                tool: "bash".into(),
                input: json!({}),
            },
        );
        let (r, evs) = turn(&t).await;
        assert!(r.unwrap().tool_calls.is_empty());
        assert_eq!(text(&evs), "t0 t1 t2 ");
    }

    #[tokio::test]
    async fn call_names_any_tool_and_echoes_its_result_next_turn() {
        assert_eq!(
            parse(r#"/call mcp__git__log {"n": 2}"#),
            Directive::Tool("mcp__git__log", json!({"n": 2}))
        );
        assert_eq!(
            parse("/call mcp__t__pid"),
            Directive::Tool("mcp__t__pid", json!({}))
        );
        assert!(matches!(parse("/call"), Directive::Invalid(_)));
        assert!(matches!(parse("/call x [1]"), Directive::Invalid(_)));
        assert!(matches!(parse("/call x {oops"), Directive::Invalid(_)));
        let mut t = Transcript::default();
        user(&mut t, "/call mcp__t__add {\"a\": 1}\nafter");
        let out = turn(&t).await.0.unwrap();
        assert_eq!(out.tool_calls[0].name, "mcp__t__add");
        let call = |n: u64, ok: bool, output: &str| {
            [
                ClientEvent::ToolCall {
                    call_id: format!("c{n}"),
                    tool: "mcp__t__add".into(),
                    input: json!({}),
                },
                ClientEvent::ToolResult {
                    call_id: format!("c{n}"),
                    ok,
                    output: output.into(),
                },
            ]
        };
        for (i, e) in call(1, true, "3").iter().enumerate() {
            t.apply(2 + i as u64, e);
        }
        let (r, evs) = turn(&t).await;
        assert!(r.unwrap().tool_calls.is_empty());
        assert_eq!(text(&evs), "result: 3\necho: after");
        // On the last line, the result is the whole answer; a failure says so.
        user(&mut t, "/call mcp__t__add {}");
        turn(&t).await.0.unwrap();
        for (i, e) in call(2, false, "boom").iter().enumerate() {
            t.apply(10 + i as u64, e);
        }
        assert_eq!(text(&turn(&t).await.1), "error: boom");
    }

    #[tokio::test]
    async fn plan_items_call_update_plan_and_last_cites_the_call_before() {
        assert_eq!(
            parse(r#"/plan-items [{"text": "a", "status": "pending"}]"#),
            Directive::Tool(
                "update_plan",
                json!({"items": [{"text": "a", "status": "pending"}]})
            )
        );
        assert!(matches!(parse("/plan-items [oops"), Directive::Invalid(_)));
        assert!(matches!(parse("/plan-items 3"), Directive::Invalid(_)));
        let mut t = Transcript::default();
        user(&mut t, "/bash true\n/plan-items [{\"id\": \"t\", \"status\": \"done\", \"evidence\": [\"$last\", \"x\"]}]");
        let first = turn(&t).await.0.unwrap();
        let bash = first.tool_calls[0].id.clone();
        t.apply(
            2,
            &ClientEvent::ToolCall {
                call_id: bash.clone(),
                tool: "bash".into(),
                input: json!({"command": "true"}),
            },
        );
        t.apply(
            3,
            &ClientEvent::ToolResult {
                call_id: bash.clone(),
                ok: true,
                output: String::new(),
            },
        );
        let second = turn(&t).await.0.unwrap();
        assert_eq!(second.tool_calls[0].name, "update_plan");
        assert_eq!(
            second.tool_calls[0].input["items"][0]["evidence"],
            json!([bash, "x"])
        );
    }

    #[test]
    fn worker_spawns_its_prompt_and_needs_one() {
        assert_eq!(
            parse("/worker add a README"),
            Directive::Tool(
                "spawn_worker",
                json!({"prompt": "add a README", "isolated": true, "wait": true})
            )
        );
        assert_eq!(
            parse(r#"/worker {"prompt": "p", "wait": false}"#),
            Directive::Tool("spawn_worker", json!({"prompt": "p", "wait": false}))
        );
        match parse("/worker") {
            Directive::Invalid(why) => assert!(why.starts_with("/worker expects PROMPT"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse("/worker   "), Directive::Invalid(_)));
        assert_eq!(parse("/workers"), Directive::Echo("/workers"));
    }

    #[tokio::test]
    async fn workers_in_a_row_are_one_turn_and_each_answer_is_echoed_next_turn() {
        let mut t = Transcript::default();
        user(&mut t, "/worker a\n/worker b\n/read x\n/worker c\ndone");
        let out = turn(&t).await.0.unwrap();
        let prompts: Vec<_> = out.tool_calls.iter().map(|c| c.input["prompt"].clone()).collect();
        assert_eq!(prompts, [json!("a"), json!("b")]);
        assert!(out.tool_calls.iter().all(|c| c.name == "spawn_worker"));
        let mut seq = 2;
        let mut apply = |t: &mut Transcript, id: &str, tool: &str, ok: bool, output: &str| {
            t.apply(
                seq,
                &ClientEvent::ToolCall {
                    call_id: id.into(),
                    tool: tool.into(),
                    input: json!({}),
                },
            );
            t.apply(
                seq + 1,
                &ClientEvent::ToolResult {
                    call_id: id.into(),
                    ok,
                    output: output.into(),
                },
            );
            seq += 2;
        };
        apply(&mut t, "c1", "spawn_worker", true, "A done");
        apply(&mut t, "c2", "spawn_worker", false, "B failed");
        let (r, evs) = turn(&t).await;
        let out = r.unwrap();
        assert_eq!(text(&evs), "worker: A done\nworker error: B failed");
        assert_eq!(out.tool_calls[0].name, "read_file");
        apply(&mut t, "c3", "read_file", true, "x");
        let out = turn(&t).await.0.unwrap();
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.tool_calls[0].input["prompt"], "c");
        apply(&mut t, "c4", "spawn_worker", true, "C done");
        assert_eq!(text(&turn(&t).await.1), "worker: C done\necho: done");
    }

    #[tokio::test]
    async fn fail_and_bad_arguments() {
        let mut t = Transcript::default();
        user(&mut t, "/fail boom");
        match turn(&t).await.0 {
            Err(ProviderError::Failed(f)) => assert_eq!(f.kind.message(), "the model failed: boom"),
            other => panic!("{other:?}"),
        }
        user(&mut t, "/sleep soon\n/writer x");
        let (_, evs) = turn(&t).await;
        assert_eq!(
            text(&evs),
            "error: /sleep expects a whole number up to 3600000, got \"soon\"\necho: /writer x"
        );
        user(&mut t, "/write notes/a.md two words");
        let out = turn(&t).await.0.unwrap();
        assert_eq!(
            out.tool_calls[0].input,
            json!({"path": "notes/a.md", "content": "two words"})
        );
        user(&mut t, r#"/write {"path": "b.md", "content": "one\ntwo\n"}"#);
        let out = turn(&t).await.0.unwrap();
        assert_eq!(
            out.tool_calls[0].input,
            json!({"path": "b.md", "content": "one\ntwo\n"})
        );
        for (line, input) in [
            (
                "/bash-timeout 5 sleep 1; echo hi",
                json!({"command": "sleep 1; echo hi", "timeout": 5}),
            ),
            (
                "/bash-timeout soon ls",
                json!({"command": "ls", "timeout": "soon"}),
            ),
            ("/bash-timeout 9999", json!({"command": "", "timeout": 9999})),
        ] {
            user(&mut t, line);
            let out = turn(&t).await.0.unwrap();
            assert_eq!(out.tool_calls[0].name, "bash");
            assert_eq!(out.tool_calls[0].input, input, "{line}");
        }
    }

    #[test]
    fn file_tool_directives_take_words_or_a_json_object() {
        fn tool(line: &str) -> (&str, Value) {
            match parse(line) {
                Directive::Tool(name, input) => (name, input),
                other => panic!("{line}: {other:?}"),
            }
        }
        assert_eq!(
            tool("/edit src/a.rs let x = 1; => let x = 2;"),
            (
                "edit_file",
                json!({"path": "src/a.rs", "old_string": "let x = 1;", "new_string": "let x = 2;"})
            )
        );
        assert_eq!(
            tool(r#"/edit {"path": "a", "edits": [{"old_string": "x", "new_string": "y"}]}"#).1["edits"][0]
                ["new_string"],
            "y"
        );
        assert_eq!(
            tool(r#"/read {"path": "a", "offset": 3}"#),
            ("read_file", json!({"path": "a", "offset": 3}))
        );
        assert_eq!(tool("/ls"), ("list_dir", json!({})));
        assert_eq!(tool("/ls src"), ("list_dir", json!({"path": "src"})));
        assert_eq!(
            tool("/glob **/*.rs src"),
            ("glob", json!({"pattern": "**/*.rs", "path": "src"}))
        );
        assert_eq!(
            tool("/grep fn [a-z]+ \\("),
            ("grep", json!({"pattern": "fn [a-z]+ \\("}))
        );
        let invalid = |line: &str| match parse(line) {
            Directive::Invalid(why) => why,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(
            invalid("/edit a.rs no arrow"),
            "/edit expects PATH OLD => NEW or a JSON object"
        );
        assert!(invalid("/grep {nope").starts_with("/grep: bad JSON argument"));
        assert_eq!(invalid("/grep"), "/grep expects PATTERN or a JSON object");
        assert_eq!(invalid("/glob"), "/glob expects PATTERN [PATH] or a JSON object");
    }

    #[tokio::test]
    async fn a_sized_burst_pads_each_delta_to_its_size_and_keeps_one_token_each() {
        let mut t = Transcript::default();
        user(
            &mut t,
            "/burst 3 16
/burst 2 2
/burst 1",
        );
        let (r, evs) = turn(&t).await;
        assert_eq!(r.unwrap().usage.output_tokens, 6);
        let texts: Vec<&str> = evs
            .iter()
            .map(|e| match e {
                ProviderEvent::Text(t) => t.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            texts,
            [
                "t0_____________ ",
                "t1_____________ ",
                "t2_____________ ",
                // A size below the token's own length leaves it as it is.
                "t0 ",
                "t1 ",
                "t0 "
            ]
        );
        assert_eq!(sized_token(7, 64 * 1024).len(), 64 * 1024);
        assert_eq!(parse("/burst 5 1024"), Directive::Burst { n: 5, size: 1024 });
        assert_eq!(parse("/burst 5"), Directive::Burst { n: 5, size: 0 });
        let invalid = |line: &str| match parse(line) {
            Directive::Invalid(why) => why,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(
            invalid("/burst 5 1048577"),
            "/burst expects a whole number up to 1048576, got \"1048577\""
        );
        assert_eq!(
            invalid("/burst 5 big"),
            "/burst expects a whole number up to 1048576, got \"big\""
        );
        assert_eq!(invalid("/burst 5 16 more"), "/burst expects N [SIZE]");
        assert_eq!(
            invalid("/burst"),
            "/burst expects a whole number up to 10000000, got \"\""
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pace_sends_stamped_deltas_on_schedule() {
        let mut t = Transcript::default();
        user(&mut t, "/pace 5 1000");
        let start = tokio::time::Instant::now();
        let (r, evs) = turn(&t).await;
        assert!(r.is_ok());
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(4),
            "5 deltas at 1 ms spacing"
        );
        let texts: Vec<String> = evs
            .iter()
            .map(|e| match e {
                ProviderEvent::Text(t) => t.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        for (i, t) in texts.iter().enumerate() {
            let (tag, stamp) = t.trim_end().split_once('@').unwrap();
            assert_eq!(tag, format!("p{i}"));
            assert!(stamp.parse::<u128>().unwrap() > 0);
        }
        user(&mut t, "/pace 5 0");
        assert!(text(&turn(&t).await.1).starts_with("error: "));
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_is_cancellable() {
        let mut t = Transcript::default();
        user(&mut t, "/sleep 100000");
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            c2.cancel();
        });
        let sink = |_e: ProviderEvent| {};
        let req = TurnRequest {
            messages: t.chat(),
            ..TurnRequest::default()
        };
        let r = OfflineModel.turn(&req, &sink, &cancel).await;
        assert_eq!(r, Err(ProviderError::Cancelled));
    }
}
