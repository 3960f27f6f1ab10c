//! Running the lifecycle hooks of a session's events: each matching hook in order, `sh -c` in the session's workspace and sandbox with its JSON document on stdin (`tools/piped.rs`), killed with its process group at its timeout or when the run is cancelled. Only a `pre_tool_use` hook's exit code 2 has an effect (it blocks the call); any other failure is logged.

use crate::event::RunOutcome;
use crate::host::hooks::{Hook, HookEvent};
use crate::session::runtime::Runtime;
use crate::tools::piped::{self, Ended};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The most of a hook's stdout and of its stderr kept (bash's cap).
const OUTPUT_CAP: usize = 1 << 20;
/// The most of a blocking hook's stderr the model sees, in bytes.
pub(crate) const MAX_REASON: usize = 4096;
/// The exit code by which a `pre_tool_use` hook blocks its call.
const BLOCK: i32 = 2;

/// What the `pre_tool_use` hooks decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The call goes on to its permission check.
    Proceed,
    /// A hook exited 2: the call is not run; the error the model sees.
    Blocked(String),
    /// The run was cancelled while a hook ran.
    Cancelled,
}

/// A tool call as its hooks see it.
pub(crate) struct Call<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) tool: &'a str,
    pub(crate) input: &'a Value,
    pub(crate) call_id: &'a str,
}

impl Call<'_> {
    fn document(&self, rt: &Runtime, event: HookEvent) -> Value {
        json!({
            "event": event.as_str(),
            "session_id": self.session_id,
            "workspace": rt.cfg.workspace.display().to_string(),
            "tool": self.tool,
            "input": self.input,
            "call_id": self.call_id,
        })
    }
}

/// Runs the `pre_tool_use` hooks matching the call, in order, until one blocks it.
pub(crate) async fn pre_tool_use(rt: &Runtime, call: &Call<'_>, cancel: &CancellationToken) -> Verdict {
    let hooks = rt.hooks().matching(HookEvent::PreToolUse, Some(call.tool));
    if hooks.is_empty() {
        return Verdict::Proceed;
    }
    let doc = call.document(rt, HookEvent::PreToolUse);
    for (i, hook) in hooks.iter().enumerate() {
        let ran = run_one(
            rt,
            HookEvent::PreToolUse,
            (i, hook),
            &doc,
            call.session_id,
            cancel,
        )
        .await;
        match ran.ended {
            Ended::Exited(BLOCK) => return Verdict::Blocked(reason(&ran.stderr)),
            Ended::Cancelled => return Verdict::Cancelled,
            _ => {}
        }
    }
    Verdict::Proceed
}

/// Runs the `post_tool_use` hooks matching the call, with its result.
pub(crate) async fn post_tool_use(
    rt: &Runtime,
    call: &Call<'_>,
    ok: bool,
    output: &str,
    cancel: &CancellationToken,
) {
    let hooks = rt.hooks().matching(HookEvent::PostToolUse, Some(call.tool));
    if hooks.is_empty() {
        return;
    }
    let mut doc = call.document(rt, HookEvent::PostToolUse);
    doc["ok"] = json!(ok);
    doc["output"] = json!(output);
    for (i, hook) in hooks.iter().enumerate() {
        if run_one(
            rt,
            HookEvent::PostToolUse,
            (i, hook),
            &doc,
            call.session_id,
            cancel,
        )
        .await
        .ended
            == Ended::Cancelled
        {
            return;
        }
    }
}

/// Starts the `session_start` hooks of a new session, in the background.
pub(crate) fn session_start(rt: &Arc<Runtime>, session_id: &str) {
    spawn(rt, HookEvent::SessionStart, session_id, json!({}));
}

/// Starts the `stop` hooks of a settled run, in the background (the run is
/// over: nothing cancels them but their timeout).
pub(crate) fn stop(rt: &Arc<Runtime>, session_id: &str, outcome: RunOutcome) {
    spawn(
        rt,
        HookEvent::Stop,
        session_id,
        json!({"outcome": outcome.as_str()}),
    );
}

fn spawn(rt: &Arc<Runtime>, event: HookEvent, session_id: &str, extra: Value) {
    let hooks = rt.hooks().matching(event, None);
    if hooks.is_empty() {
        return;
    }
    let mut doc = json!({
        "event": event.as_str(),
        "session_id": session_id,
        "workspace": rt.cfg.workspace.display().to_string(),
    });
    if let (Some(d), Value::Object(more)) = (doc.as_object_mut(), extra) {
        d.extend(more);
    }
    let (rt, session_id) = (rt.clone(), session_id.to_string());
    tokio::spawn(async move {
        let never = CancellationToken::new();
        for (i, hook) in hooks.iter().enumerate() {
            run_one(&rt, event, (i, hook), &doc, &session_id, &never).await;
        }
    });
}

/// Runs one hook (`i`: its place among those that matched); a failure (but
/// a `pre_tool_use` hook's exit 2) is logged, naming the hook by event and
/// place, not by its command, which may hold a secret.
async fn run_one(
    rt: &Runtime,
    event: HookEvent,
    (i, hook): (usize, &Hook),
    doc: &Value,
    session_id: &str,
    cancel: &CancellationToken,
) -> piped::Piped {
    let input = serde_json::to_vec(doc).unwrap_or_default();
    let ran = piped::run(
        &rt.cfg.workspace,
        rt.sandbox(),
        &hook.command,
        input,
        hook.timeout(),
        cancel,
        OUTPUT_CAP,
    )
    .await;
    let failed = match &ran.ended {
        Ended::Exited(0) | Ended::Cancelled => None,
        Ended::Exited(BLOCK) if event == HookEvent::PreToolUse => None,
        Ended::Exited(code) => Some(format!("exited with code {code}")),
        Ended::Signalled(how) => Some(how.clone()),
        Ended::TimedOut => Some(format!(
            "timed out after {} ms; it and its process group were killed",
            hook.timeout().as_millis()
        )),
        Ended::NotStarted(why) => Some(format!("did not start: {why}")),
    };
    match failed {
        Some(why) => tracing::warn!(
            session = %session_id,
            event = event.as_str(),
            hook = i,
            stderr = bounded(&ran.stderr),
            "hook failed ({why}); going on"
        ),
        None => tracing::debug!(
            session = %session_id,
            event = event.as_str(),
            hook = i,
            ended = ?ran.ended,
            stdout = bounded(&ran.stdout),
            "hook ran"
        ),
    }
    ran
}

/// A blocking hook's stderr as the tool error the model sees: trimmed,
/// at most `MAX_REASON` bytes (cut on a character boundary).
fn reason(stderr: &str) -> String {
    match bounded(stderr) {
        "" => "blocked by a pre_tool_use hook".into(),
        t => t.to_string(),
    }
}

/// `s` trimmed and cut to at most `MAX_REASON` bytes on a character boundary.
fn bounded(s: &str) -> &str {
    let t = s.trim();
    let mut end = t.len().min(MAX_REASON);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    &t[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_trimmed_and_bounded_on_a_character() {
        assert_eq!(reason("  no rm here\n"), "no rm here");
        assert_eq!(reason("\n"), "blocked by a pre_tool_use hook");
        let long = format!("a{}", "é".repeat(MAX_REASON));
        let r = reason(&long);
        assert!(r.len() <= MAX_REASON && r.len() >= MAX_REASON - 1, "{}", r.len());
    }
}
