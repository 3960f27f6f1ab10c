//! The tools the agent can call (read_file, write_file, edit_file, list_dir,
//! glob, grep, bash), each confined to the workspace; exit_plan_mode,
//! spawn_worker and update_plan are defined here and carried out by the agent loop.

pub(crate) mod edit;
mod read;
pub mod sandbox;
pub(crate) mod search;

use super::provider::ToolDef;
use super::workspace;
use serde_json::{json, Value};
use std::path::Path;
use tokio_util::sync::CancellationToken;

mod bash;
pub(crate) mod piped;
pub use bash::{Chunk, Live, DEFAULT_TIMEOUT_SECS, LIVE_CAP, LIVE_STOPPED, MAX_TIMEOUT_SECS};

/// The most a tool returns as output; the rest is cut with a note.
pub(crate) const MAX_OUTPUT: usize = 1 << 20;

/// The tool that starts a child session (`session/spawn_tool.rs` runs it).
pub const SPAWN_WORKER: &str = "spawn_worker";

/// The longest prompt `spawn_worker` accepts.
pub const MAX_WORKER_PROMPT: usize = 32 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    pub ok: bool,
    pub output: String,
    /// The command's exit status, for a tool that ran one to its end.
    pub exit_code: Option<i32>,
}

impl ToolOutput {
    fn ok(output: impl Into<String>) -> Self {
        ToolOutput {
            ok: true,
            output: output.into(),
            exit_code: None,
        }
    }
    fn err(output: impl Into<String>) -> Self {
        ToolOutput {
            ok: false,
            output: output.into(),
            exit_code: None,
        }
    }
}

/// The tools as a model sees them: name, what they do, and the JSON Schema
/// of their input.
pub fn definitions() -> Vec<ToolDef> {
    let def = |name: &str, description: &str, input_schema: Value| ToolDef {
        name: name.into(),
        description: description.into(),
        input_schema,
    };
    vec![
        def(
            "read_file",
            "Read a text file in the workspace (binary files are refused). Without offset and limit the \
             whole file, cut at 1 MiB with a note; with them a window of lines, with a note saying \
             how to read on when the file continues.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root"},
                    "offset": {"type": "integer", "minimum": 1, "description": "The first line to read, from 1"},
                    "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read at most"}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        ),
        def(
            "write_file",
            "Create or overwrite a file in the workspace with the given content (parent folders are created).",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root"},
                    "content": {"type": "string", "description": "The whole new content of the file"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        ),
        def(
            "edit_file",
            "Replace exact text in a file of the workspace. Each old_string must match exactly once \
             (or set replace_all); give `edits` to make several replacements at once, applied in \
             order, all or none. A failing call leaves the file unchanged.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root"},
                    "old_string": {"type": "string", "description": "The exact text to replace (not empty)"},
                    "new_string": {"type": "string", "description": "The text to put in its place"},
                    "replace_all": {"type": "boolean", "description": "Replace every match instead of exactly one"},
                    "edits": {
                        "type": "array",
                        "maxItems": edit::MAX_EDITS,
                        "description": "Several replacements, instead of old_string/new_string",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_string": {"type": "string"},
                                "new_string": {"type": "string"},
                                "replace_all": {"type": "boolean"}
                            },
                            "required": ["old_string", "new_string"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        ),
        def(
            "list_dir",
            "List a folder of the workspace: entries sorted by name, folders with a trailing `/`, \
             symlinks as `name -> target`. At most 1000 entries, with a note.",
            json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Folder relative to the workspace root (default: the root)"}},
                "additionalProperties": false
            }),
        ),
        def(
            "glob",
            "Find files by glob pattern (`*` within a path segment, `**` across folders, `{a,b}`, `[ab]`), \
             matched against paths relative to `path`; .gitignore'd files are left out. Paths relative \
             to the workspace root, sorted, at most 1000, with a note.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "e.g. `**/*.rs` or `src/*.toml`"},
                    "path": {"type": "string", "description": "Folder to search (default: the workspace root)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        ),
        def(
            "grep",
            "Search text files for a regular expression (Rust regex syntax); .gitignore'd and binary \
             files are skipped. Lines as `path:line:text`, at most 1000 lines and 256 KiB, with a note.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "The regular expression"},
                    "path": {"type": "string", "description": "Folder or file to search (default: the workspace root)"},
                    "glob": {"type": "string", "description": "Only files matching this glob (a pattern without `/` matches file names)"},
                    "case_insensitive": {"type": "boolean"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        ),
        def(
            "bash",
            "Run a shell command (sh -c) with the workspace as working directory and no input. \
             Output is stdout and stderr interleaved as they arrive, cut at 1 MiB with a note; a non-zero exit status is appended. \
             The command and everything it started are killed after `timeout` seconds (default 120).",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line"},
                    "timeout": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_TIMEOUT_SECS,
                        "description": "Seconds before the command is killed (default 120, at most 600)"
                    }
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        ),
        def(
            "exit_plan_mode",
            "In plan mode, where only tools that read the workspace run: propose your plan to the user. \
             If they approve it, plan mode ends and you carry it out; if not, you get their reason and stay in plan mode. \
             Outside plan mode it does nothing.",
            json!({
                "type": "object",
                "properties": {"plan": {"type": "string", "description": "The plan, in Markdown: what you will change and how, step by step"}},
                "required": ["plan"],
                "additionalProperties": false
            }),
        ),
        def(
            SPAWN_WORKER,
            "Start a worker: a child agent session that carries out `prompt` on its own, with the same tools. \
             By default it works in a fresh git worktree on its own branch (isolated) and you wait for it: \
             the result is its final answer. With wait=false the result is the worker's id at once, and its \
             final answer reaches you later as a background result. Several spawn_worker calls in one turn \
             run in parallel (a few at a time). Give each worker a complete, self-contained task.",
            json!({
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "maxLength": MAX_WORKER_PROMPT, "description": "The worker's task, complete and self-contained"},
                    "isolated": {"type": "boolean", "description": "Work in a fresh git worktree and branch (default true); false: in this workspace"},
                    "wait": {"type": "boolean", "description": "Wait for the worker's final answer (default true); false: answer its id at once"}
                },
                "required": ["prompt"],
                "additionalProperties": false
            }),
        ),
        def(
            crate::commitment::UPDATE_PLAN,
            "Keep your plan: create or update its items, each a commitment the user can see and close. \
             An item with a new `id` (or none: numbered for you) is created and needs `text`; an item with an existing \
             `id` is updated (fields you leave out stay as they were; items you leave out are unchanged). Mark an item \
             done only with `evidence`: the ids of the tool calls that show it (a passing test run, the write of a file). \
             `requires` says what evidence closing it as fulfilled will need: {kind: tool_ok, tool?, pattern?} (a cited \
             call that ended successfully; pattern is a regex over a bash command or another tool's input), \
             {kind: file_changed, path}, {kind: approval}. The result is the whole plan.",
            json!({
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": crate::commitment::MAX_ITEMS,
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string", "description": "The item's id in this plan (1 to 64 of A-Z a-z 0-9 - _)"},
                                "text": {"type": "string", "maxLength": crate::commitment::MAX_TEXT, "description": "What you commit to do"},
                                "status": {"type": "string", "enum": ["pending", "in_progress", "done", "dropped"]},
                                "evidence": {"type": "array", "items": {"type": "string"}, "description": "Tool call ids that show it is done"},
                                "requires": {
                                    "type": "array",
                                    "maxItems": crate::commitment::MAX_REQUIRES,
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "kind": {"type": "string", "enum": ["tool_ok", "file_changed", "approval"]},
                                            "tool": {"type": "string"},
                                            "pattern": {"type": "string"},
                                            "path": {"type": "string"}
                                        },
                                        "required": ["kind"],
                                        "additionalProperties": false
                                    }
                                },
                                "stakes": {"type": "string", "enum": ["low", "medium", "high"]},
                                "due": {"type": "string", "description": "RFC 3339 time"},
                                "blocked_by": {"type": "array", "items": {"type": "string"}, "description": "Items of this plan to finish first"}
                            },
                            "required": ["status"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["items"],
                "additionalProperties": false
            }),
        ),
    ]
}

/// What a tool can do, which is what permission modes decide on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolClass {
    /// Reads the workspace only (read_file, list_dir, glob, grep).
    Read,
    /// Changes files in the workspace (write_file, edit_file).
    Edit,
    /// Runs programs (bash); also any tool this server does not know.
    Exec,
    /// Asks to leave plan mode with a plan (exit_plan_mode).
    Plan,
    /// Starts a child session (spawn_worker): not an edit itself (the
    /// child's tools go through the child's own permission path), but work
    /// that edits, so plan mode refuses it.
    Delegate,
    /// Keeps the session's own plan (update_plan): touches nothing outside
    /// the session's ledger, so it runs in every mode without asking.
    Track,
}

/// The class of `tool`; a name this server does not know is `Exec`, the
/// most guarded.
pub fn class(tool: &str) -> ToolClass {
    match tool {
        "read_file" | "list_dir" | "glob" | "grep" => ToolClass::Read,
        "write_file" | "edit_file" => ToolClass::Edit,
        "exit_plan_mode" => ToolClass::Plan,
        SPAWN_WORKER => ToolClass::Delegate,
        crate::commitment::UPDATE_PLAN => ToolClass::Track,
        _ => ToolClass::Exec,
    }
}

/// Whether `tool` asks the user before it runs (in the default permission mode).
pub fn needs_approval(tool: &str) -> bool {
    !matches!(
        class(tool),
        ToolClass::Read | ToolClass::Delegate | ToolClass::Track
    )
}

/// A one-line human reason shown with an approval request.
pub fn approval_reason(tool: &str, input: &Value) -> String {
    let arg = |k: &str| {
        input
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match tool {
        "write_file" => format!("write {} to {}", bytes(arg("content").len()), arg("path")),
        "bash" => format!("run `{}` in the workspace", arg("command")),
        "exit_plan_mode" => "leave plan mode and carry out this plan".into(),
        SPAWN_WORKER => format!(
            "start a worker: {}",
            arg("prompt").chars().take(80).collect::<String>()
        ),
        "edit_file" => {
            let n = input.get("edits").and_then(Value::as_array).map_or(1, Vec::len);
            format!("edit {} ({})", arg("path"), crate::text::count(n, "replacement"))
        }
        other => format!("run {other}"),
    }
}

/// Runs `tool` with `input` inside `workspace`. Failures are outputs with
/// ok=false, never errors: the model sees them like any other result. Every
/// tool ends when `cancel` fires: file tools stop waiting for their (bounded)
/// blocking work, bash kills its whole process group.
/// This entry runs bash unsandboxed (tests of the tools); the agent runs
/// them through `run_live` with its runtime's sandbox.
pub async fn run(workspace: &Path, tool: &str, input: &Value, cancel: &CancellationToken) -> ToolOutput {
    let off = std::sync::Arc::new(sandbox::Sandbox::off());
    run_live(workspace, &off, tool, input, cancel, None).await
}

/// `run`, with a tool's live output (bash's stdout and stderr as they
/// arrive) handed to `live` until the tool returns.
pub async fn run_live(
    workspace: &Path,
    sandbox: &std::sync::Arc<sandbox::Sandbox>,
    tool: &str,
    input: &Value,
    cancel: &CancellationToken,
    live: Option<&Live>,
) -> ToolOutput {
    let arg = |k: &str| input.get(k).and_then(Value::as_str);
    if cancel.is_cancelled() {
        return ToolOutput::err(CANCELLED);
    }
    match tool {
        "read_file" => {
            let Some(path) = arg("path") else {
                return ToolOutput::err("read_file needs a string `path`");
            };
            let window = match read::window_args(input) {
                Ok(w) => w,
                Err(e) => return ToolOutput::err(e),
            };
            if let Some((offset, limit)) = window {
                let (ws, p, c) = (workspace.to_path_buf(), path.to_string(), cancel.clone());
                let got = blocking(cancel, move || {
                    read::read_window(&ws, &p, offset, limit, MAX_OUTPUT, &c)
                })
                .await;
                return match got {
                    Some(Ok(text)) => ToolOutput::ok(text),
                    Some(Err(e)) => ToolOutput::err(e),
                    None => ToolOutput::err(CANCELLED),
                };
            }
            let (ws, p) = (workspace.to_path_buf(), path.to_string());
            match blocking(cancel, move || {
                let read = workspace::read(&ws, &p, MAX_OUTPUT)?;
                let more = read.truncated || read.bytes.len() > read::SNIFF;
                let head = &read.bytes[..read.bytes.len().min(read::SNIFF)];
                if let Some(why) = read::binary_reason(head, more) {
                    return Err(read::binary_message(&p, why));
                }
                Ok(read)
            })
            .await
            {
                Some(Ok(read)) => {
                    let kept = read.bytes.len();
                    let (mut text, shown) = shown(read.bytes, MAX_OUTPUT, read.truncated);
                    if read.truncated || shown < kept {
                        // The size is fstat's at open time; a file that grew while
                        // it was read is longer than that.
                        let size = if read.truncated && read.size <= MAX_OUTPUT as u64 {
                            "grew while it was read".to_string()
                        } else {
                            format!("is {}", bytes(read.size as usize))
                        };
                        text.push_str(&format!(
                            "\n[output truncated: {path} {size}; this is the first {}]",
                            bytes(shown)
                        ));
                    }
                    ToolOutput::ok(text)
                }
                Some(Err(e)) => ToolOutput::err(e),
                None => ToolOutput::err(CANCELLED),
            }
        }
        "write_file" => {
            let (Some(path), Some(content)) = (arg("path"), arg("content")) else {
                return ToolOutput::err("write_file needs string `path` and `content`");
            };
            let len = content.len();
            let (ws, p, c) = (workspace.to_path_buf(), path.to_string(), content.to_string());
            match blocking(cancel, move || workspace::write(&ws, &p, c.as_bytes())).await {
                Some(Ok(())) => ToolOutput::ok(format!("wrote {} to {path}", bytes(len))),
                Some(Err(e)) => ToolOutput::err(e),
                None => ToolOutput::err(CANCELLED),
            }
        }
        "edit_file" => {
            let Some(path) = arg("path") else {
                return ToolOutput::err("edit_file needs a string `path`");
            };
            let edits = match edit::parse(input) {
                Ok(e) => e,
                Err(e) => return ToolOutput::err(e),
            };
            let (ws, p) = (workspace.to_path_buf(), path.to_string());
            match blocking(cancel, move || edit::edit(&ws, &p, &edits)).await {
                Some(Ok(n)) => {
                    ToolOutput::ok(format!("edited {path}: {}", crate::text::count(n, "replacement")))
                }
                Some(Err(e)) => ToolOutput::err(e),
                None => ToolOutput::err(CANCELLED),
            }
        }
        "list_dir" | "glob" | "grep" => {
            let (ws, c, tool, input) = (
                workspace.to_path_buf(),
                cancel.clone(),
                tool.to_string(),
                input.clone(),
            );
            match blocking(cancel, move || search::run(&ws, &tool, &input, &c)).await {
                Some(Ok(text)) => ToolOutput::ok(text),
                Some(Err(e)) => ToolOutput::err(e),
                None => ToolOutput::err(CANCELLED),
            }
        }
        "bash" => {
            let Some(command) = arg("command") else {
                return ToolOutput::err("bash needs a string `command`");
            };
            let limit = match bash::timeout(input) {
                Ok(t) => t,
                Err(e) => return ToolOutput::err(e),
            };
            bash::run(workspace, sandbox, command, limit, cancel, live, MAX_OUTPUT).await
        }
        other => ToolOutput::err(format!("unknown tool {other}")),
    }
}

const CANCELLED: &str = "cancelled";

/// Runs `f` on the blocking pool; None when `cancel` fires first (the work
/// itself is bounded and finishes on its own).
async fn blocking<T: Send + 'static>(
    cancel: &CancellationToken,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Option<Result<T, String>> {
    tokio::select! {
        r = tokio::task::spawn_blocking(f) => {
            Some(r.unwrap_or_else(|e| Err(format!("the tool failed: {e}"))))
        }
        _ = cancel.cancelled() => None,
    }
}

/// `bytes` as text of at most `max` bytes: invalid UTF-8 is shown as U+FFFD,
/// a character is never split, and when `more_follows` (the bytes were cut
/// from something longer) a character left incomplete at the end is left out.
/// Returns the text and how many of `bytes` it shows (always a prefix).
fn shown(mut bytes: Vec<u8>, max: usize, more_follows: bool) -> (String, usize) {
    let mut end = bytes.len();
    if more_follows {
        end -= incomplete_tail(&bytes);
    }
    if end <= max && std::str::from_utf8(&bytes[..end]).is_ok() {
        bytes.truncate(end);
        let text = String::from_utf8(bytes).expect("checked just above");
        return (text, end);
    }
    let mut text = String::with_capacity(end.min(max));
    let mut used = 0;
    for chunk in bytes[..end].utf8_chunks() {
        let valid = chunk.valid();
        let room = max - text.len();
        if valid.len() > room {
            let mut at = room;
            while !valid.is_char_boundary(at) {
                at -= 1;
            }
            text.push_str(&valid[..at]);
            return (text, used + at);
        }
        text.push_str(valid);
        used += valid.len();
        let bad = chunk.invalid();
        if !bad.is_empty() {
            if max - text.len() < char::REPLACEMENT_CHARACTER.len_utf8() {
                return (text, used);
            }
            text.push(char::REPLACEMENT_CHARACTER);
            used += bad.len();
        }
    }
    (text, used)
}

/// How many bytes at the end of `b` begin a UTF-8 character they do not finish.
fn incomplete_tail(b: &[u8]) -> usize {
    let from = b.len().saturating_sub(3);
    match (from..b.len()).rev().find(|&i| b[i] & 0xC0 != 0x80) {
        Some(i) => match std::str::from_utf8(&b[i..]) {
            Err(e) if e.error_len().is_none() => b.len() - i,
            _ => 0,
        },
        None => 0,
    }
}

/// `1 byte`, `2 bytes`: what people read in approvals and results.
fn bytes(n: usize) -> String {
    crate::text::count(n, "byte")
}

fn bytes_u64(n: u64) -> String {
    match usize::try_from(n) {
        Ok(n) => bytes(n),
        Err(_) => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_byte_is_singular() {
        let ask = |content: &str| approval_reason("write_file", &json!({"path": "a", "content": content}));
        assert_eq!(ask("x"), "write 1 byte to a");
        assert_eq!(ask("xy"), "write 2 bytes to a");
        assert_eq!(ask(""), "write 0 bytes to a");
    }

    #[tokio::test]
    async fn paths_cannot_escape_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("s")).unwrap();
        let cancel = CancellationToken::new();
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "link/secret",
            "s",
            "link/new/file",
        ] {
            let r = run(ws.path(), "read_file", &json!({"path": bad}), &cancel).await;
            assert!(!r.ok, "{bad} must be refused: {}", r.output);
            let w = run(
                ws.path(),
                "write_file",
                &json!({"path": bad, "content": "x"}),
                &cancel,
            )
            .await;
            assert!(!w.ok, "{bad} must be refused: {}", w.output);
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "s"
        );
        assert!(!outside.path().join("new").exists());
        let ok = run(
            ws.path(),
            "write_file",
            &json!({"path": "./ok.txt", "content": "x"}),
            &cancel,
        )
        .await;
        assert!(ok.ok, "{}", ok.output);
    }

    #[test]
    fn shown_text_never_splits_a_character_and_shows_invalid_bytes_lossily() {
        let show = |b: &[u8], max: usize, more: bool| shown(b.to_vec(), max, more);
        let s = |t: &str, n: usize| (t.to_string(), n);
        assert_eq!(show("aé".as_bytes(), 3, false), s("aé", 3));
        assert_eq!(show("aé".as_bytes(), 2, false), s("a", 1), "é does not fit");
        // The rest of a character was cut off: it is left out, not shown as U+FFFD.
        assert_eq!(show(b"ab\xe2\x82", 10, true), s("ab", 2));
        assert_eq!(show("x😀".as_bytes().split_at(4).0, 10, true), s("x", 1));
        assert_eq!(show(b"a\xc3", 10, true), s("a", 1));
        // At the true end it is invalid, so it is shown lossily.
        assert_eq!(show(b"ab\xe2\x82", 10, false), s("ab\u{FFFD}", 4));
        assert_eq!(show(b"a\xffb", 10, false), s("a\u{FFFD}b", 3));
        assert_eq!(show(b"a\xff", 10, true), s("a\u{FFFD}", 2), "0xff starts nothing");
        // Each invalid byte grows to three; the text still fits `max`.
        assert_eq!(show(&[0xff; 10], 7, false), s("\u{FFFD}\u{FFFD}", 2));
        assert_eq!(show(b"ab\xffcd", 4, false), s("ab", 2), "U+FFFD does not fit");
        assert_eq!(show(b"", 4, true), s("", 0));
        assert_eq!(show(b"\x80\x80\x80", 10, true), s("\u{FFFD}\u{FFFD}\u{FFFD}", 3));
    }

    #[tokio::test]
    async fn tools_act_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let w = run(
            ws.path(),
            "write_file",
            &json!({"path": "d/f.txt", "content": "hello"}),
            &cancel,
        )
        .await;
        assert!(w.ok, "{}", w.output);
        let r = run(ws.path(), "read_file", &json!({"path": "d/f.txt"}), &cancel).await;
        assert_eq!(r, ToolOutput::ok("hello"));
        let b = run(
            ws.path(),
            "bash",
            &json!({"command": "cat d/f.txt; exit 3"}),
            &cancel,
        )
        .await;
        assert!(!b.ok);
        assert!(b.output.starts_with("hello"));
        let esc = run(ws.path(), "read_file", &json!({"path": "../etc/passwd"}), &cancel).await;
        assert!(!esc.ok);
    }
}
