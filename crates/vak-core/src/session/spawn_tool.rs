//! The `spawn_worker` tool: starts a child session through the runtime's spawner, waits for its answer or hands its id back, within the session's `--max-workers` slots.

use crate::session::context::TurnContext;
use crate::tools::{ToolOutput, MAX_OUTPUT, MAX_WORKER_PROMPT, SPAWN_WORKER};
use crate::worker::{Settled, Spawn, WorkerKind, WorkerState};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// spawn_worker's input, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Args {
    pub prompt: String,
    pub isolated: bool,
    pub wait: bool,
}

/// Checks spawn_worker's input: a prompt that is not blank and at most
/// `MAX_WORKER_PROMPT` bytes; `isolated` and `wait` booleans, true when absent.
pub(crate) fn args(input: &Value) -> Result<Args, String> {
    let prompt = match input.get("prompt") {
        Some(Value::String(p)) if p.trim().is_empty() => {
            return Err(format!("{SPAWN_WORKER} needs a prompt that is not empty"))
        }
        Some(Value::String(p)) if p.len() > MAX_WORKER_PROMPT => {
            return Err(format!(
                "the prompt is {} bytes; {SPAWN_WORKER} accepts at most {MAX_WORKER_PROMPT}: shorten it",
                p.len()
            ))
        }
        Some(Value::String(p)) => p.clone(),
        _ => return Err(format!("{SPAWN_WORKER} needs a string `prompt`")),
    };
    let flag = |k: &str| match input.get(k) {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{SPAWN_WORKER}'s `{k}` must be true or false")),
    };
    Ok(Args {
        prompt,
        isolated: flag("isolated")?,
        wait: flag("wait")?,
    })
}

fn err(output: impl Into<String>) -> ToolOutput {
    ToolOutput {
        ok: false,
        output: output.into(),
        exit_code: None,
    }
}

/// Runs one spawn_worker call for `session` (already permitted). With
/// `wait` it holds one of the session's worker slots (waiting for one if
/// all are taken) until the child settles, and answers the child's final
/// answer; `cancel` stops the child. Without, it takes a free slot or is
/// refused, answers the child's id at once, and the slot is held until the
/// child settles (its answer reaches the parent as a background result,
/// delivered by the spawner).
pub(crate) async fn run(session: &impl TurnContext, input: &Value, cancel: &CancellationToken) -> ToolOutput {
    let args = match args(input) {
        Ok(a) => a,
        Err(why) => return err(why),
    };
    let rt = session.runtime();
    let Some(spawner) = rt.spawner() else {
        return err("this server cannot start workers (no spawner is set up)");
    };
    let slots = session.worker_slots().clone();
    let max = rt.cfg.max_workers.max(1);
    let permit = if args.wait {
        tokio::select! {
            p = slots.acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return err("the session is closing: no worker can start"),
            },
            _ = cancel.cancelled() => return err("cancelled"),
        }
    } else {
        match slots.try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                return err(format!(
                    "refused: this session already has {} running (the --max-workers limit); \
                     wait for one to finish, or call {SPAWN_WORKER} with wait=true to queue for a slot",
                    crate::text::count(max, "worker")
                ))
            }
        }
    };
    let req = Spawn {
        parent: session.id().to_string(),
        kind: WorkerKind::Worker,
        prompt: args.prompt,
        isolated: args.isolated,
        bestofn_id: String::new(),
        wait: args.wait,
    };
    let child = match spawner.spawn(req).await {
        Ok(info) => info,
        Err(e) => return err(format!("the worker could not start: {}", e.message)),
    };
    if !args.wait {
        let id = child.id.clone();
        tokio::spawn(async move {
            // The slot is the child's until it settles; nobody cancels it
            // from here (StopWorker and the parent's end do).
            let _permit = permit;
            if let Err(e) = spawner.wait(&id, CancellationToken::new()).await {
                tracing::debug!(worker = %id, "waiting for a background worker: {}", e.message);
            }
        });
        return ToolOutput {
            ok: true,
            output: json!({
                "id": child.id,
                "state": child.state.as_str(),
                "branch": child.branch,
                "worktree": child.worktree,
            })
            .to_string(),
            exit_code: None,
        };
    }
    let settled = spawner.wait(&child.id, cancel.clone()).await;
    drop(permit);
    match settled {
        Ok(settled) => answer(&settled),
        Err(e) => err(format!(
            "waiting for the worker {} failed: {}",
            child.id, e.message
        )),
    }
}

/// A waited child's settled info as spawn_worker's result: its final answer
/// (bounded like any tool output, the cut said), and where its changes are.
pub(crate) fn answer(settled: &Settled) -> ToolOutput {
    let info = &settled.info;
    let summary = cut(&info.summary, MAX_OUTPUT);
    match info.state {
        WorkerState::Finished => {
            let whole = if settled.answer.is_empty() {
                &info.summary
            } else {
                &settled.answer
            };
            let mut output = cut(whole, MAX_OUTPUT).to_string();
            if output.len() < whole.len() {
                output.push_str(&format!(
                    "\n[the answer is cut at {MAX_OUTPUT} bytes of {}; the worker's transcript has it whole]",
                    whole.len()
                ));
            }
            if !info.branch.is_empty() {
                let stat = info.diff_stat.map_or(String::new(), |d| {
                    format!(
                        ", {} (+{} -{})",
                        crate::text::count(d.files as usize, "file"),
                        d.insertions,
                        d.deletions
                    )
                });
                output.push_str(&format!(
                    "\n\n[worker {} finished on branch {} in {}{stat}]",
                    info.id, info.branch, info.worktree
                ));
            }
            ToolOutput {
                ok: true,
                output,
                exit_code: None,
            }
        }
        WorkerState::Failed => err(format!("the worker {} failed: {summary}", info.id)),
        WorkerState::Cancelled => err(format!("the worker {} was cancelled", info.id)),
        other => err(format!(
            "the worker {} is {} rather than settled",
            info.id,
            other.as_str()
        )),
    }
}

/// At most `max` bytes of `s`, never splitting a character.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

#[cfg(test)]
mod tests;
