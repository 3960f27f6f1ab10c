//! What a task's fire does on this host: a prompt admitted into its session (or a new one), a script run like bash with its output delivered when the session is idle; and what a task may name.

use crate::automation::scheduler::{Fire, Firer};
use crate::automation::task::{LastFire, TaskBody, TaskCheck, TaskDef, TaskOutcome};
use crate::background::{BackgroundReason, BackgroundResult, BackgroundSink, BackgroundSource};
use crate::error::{Error, Result};
use crate::host::registry::Registry;
use crate::host::workspaces::Workspaces;
use crate::session::admission::AdmissionState;
use crate::session::live::Session;
use crate::tools::piped::{self, Ended};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The most of a script's stdout and stderr kept (each).
const SCRIPT_OUTPUT_CAP: usize = 64 * 1024;

/// How much of a failed script's stderr its alert quotes (the tail).
const STDERR_TAIL: usize = 2048;

/// Whether new task fires are refused (`[finops] stop_at_limit` past the
/// day's budget): the budget's answer, asked before every fire.
pub trait FireGate: Send + Sync + 'static {
    /// Why fires are refused now, or None.
    fn refuse(&self) -> Option<String>;
    /// A fire happened (for the digest's count and the budget check after it).
    fn fired(&self, task_id: &str, outcome: TaskOutcome);
}

/// No budget: every fire goes ahead.
pub struct Open;

impl FireGate for Open {
    fn refuse(&self) -> Option<String> {
        None
    }
    fn fired(&self, _: &str, _: TaskOutcome) {}
}

/// The budget (`[finops]`): fires refused at 100% of `max_day_usd` with
/// `stop_at_limit`; each fire recorded in the cost ledger (the digest's
/// `tasks_fired`) and followed by a budget check.
impl FireGate for crate::finops::Finops {
    fn refuse(&self) -> Option<String> {
        self.refusal()
    }

    fn fired(&self, task_id: &str, outcome: TaskOutcome) {
        match outcome {
            // Nothing ran: the budget refused it, or the slot's run was admitted before.
            TaskOutcome::BudgetExceeded | TaskOutcome::Duplicate => {}
            _ => self.record_fire_nowait(task_id, outcome.as_str()),
        }
    }
}

/// Fires tasks into this host's sessions.
#[derive(Clone)]
pub struct HostFirer {
    pub sessions: Arc<Registry>,
    pub workspaces: Arc<Workspaces>,
    pub gate: Arc<dyn FireGate>,
    pub script_timeout: Duration,
}

impl Firer for HostFirer {
    fn fire(&self, task: TaskDef, fire: Fire) -> BoxFuture<'static, LastFire> {
        let this = self.clone();
        Box::pin(async move {
            let last = this.run(&task, &fire).await;
            this.gate.fired(&task.id, last.outcome);
            if !matches!(
                last.outcome,
                TaskOutcome::Started | TaskOutcome::Queued | TaskOutcome::Duplicate
            ) {
                tracing::info!(task = %task.id, slot = %fire.slot, outcome = last.outcome.as_str(), "task fired");
            }
            last
        })
    }
}

impl HostFirer {
    async fn run(&self, task: &TaskDef, fire: &Fire) -> LastFire {
        let at = jiff::Timestamp::now();
        let done = |outcome: TaskOutcome, session_id: Option<String>, message: String| LastFire {
            at,
            outcome,
            slot: fire.slot.clone(),
            session_id,
            message,
        };
        if let Some(why) = self.gate.refuse() {
            // Refused, and said where someone will read it.
            if let Some(sid) = &task.session_id {
                let text = format!("task {} ({}) did not fire: {why}", task.name, task.id);
                let r = BackgroundResult::new(BackgroundSource::Task, task.id.clone(), text, None);
                let _ = self.sessions.deliver(sid, r).await;
            }
            return done(TaskOutcome::BudgetExceeded, task.session_id.clone(), why);
        }
        match &task.body {
            TaskBody::Prompt(prompt) => {
                let session = match self.session_for(task).await {
                    Ok(s) => s,
                    Err(e) => return done(TaskOutcome::Failed, task.session_id.clone(), e.message),
                };
                let sid = Some(session.id().to_string());
                let request_id = format!("task:{}:{}", task.id, fire.slot);
                // A pin is "model" or "provider/model" of the route's provider.
                let model = task
                    .model_pin
                    .as_deref()
                    .map(|p| p.split_once('/').map_or(p, |(_, m)| m).to_string());
                match session.admit_pinned(prompt.clone(), request_id, model).await {
                    Ok(a) => {
                        let outcome = match a.state {
                            AdmissionState::Started => TaskOutcome::Started,
                            // A task's prompt is never read as steering
                            // (`admit_pinned`): it is not `Applied`.
                            AdmissionState::Queued | AdmissionState::Applied => TaskOutcome::Queued,
                            AdmissionState::Duplicate => TaskOutcome::Duplicate,
                        };
                        done(outcome, sid, String::new())
                    }
                    Err(e) => done(TaskOutcome::Failed, sid, e.message),
                }
            }
            TaskBody::Script(command) => {
                let Some(sid) = task.session_id.clone() else {
                    return done(TaskOutcome::Failed, None, "a script task needs a session".into());
                };
                let session = match self.sessions.get(&sid).await {
                    Ok(s) => s,
                    Err(e) => return done(TaskOutcome::Failed, Some(sid), e.message),
                };
                let (outcome, result, message) = self.script(task, &session, command).await;
                if let Some(r) = result {
                    if let Err(e) = session.deliver_background(r).await {
                        return done(
                            TaskOutcome::Failed,
                            Some(sid),
                            format!(
                                "the script ran, but its result could not be delivered: {}",
                                e.message
                            ),
                        );
                    }
                }
                done(outcome, Some(sid), message)
            }
        }
    }

    /// The task's session, or a new one in its workspace (a prompt task
    /// without a session gets one per fire).
    async fn session_for(&self, task: &TaskDef) -> Result<Arc<Session>> {
        match &task.session_id {
            Some(id) => self.sessions.get(id).await,
            None => {
                let path = task.workspace.display().to_string();
                let ws = self.workspaces.clone();
                let found = tokio::task::spawn_blocking(move || ws.find(&path))
                    .await
                    .map_err(|e| Error::internal(e.to_string()))??;
                let Some(ws) = found else {
                    return Err(Error::not_found(format!(
                        "the task's workspace {} is not open",
                        task.workspace.display()
                    )));
                };
                self.sessions.create_in(Some(ws)).await
            }
        }
    }

    /// Runs a script task: its outcome, the result to deliver (none for a
    /// silent tick), and words for `last_fire`.
    async fn script(
        &self,
        task: &TaskDef,
        session: &Session,
        command: &str,
    ) -> (TaskOutcome, Option<BackgroundResult>, String) {
        let ran = piped::run(
            session.workspace_dir(),
            session.runtime().sandbox(),
            command,
            Vec::new(),
            self.script_timeout,
            &CancellationToken::new(),
            SCRIPT_OUTPUT_CAP,
        )
        .await;
        let alert = |reason: BackgroundReason, text: String| {
            Some(BackgroundResult::new(
                BackgroundSource::Script,
                task.id.clone(),
                text,
                Some(reason),
            ))
        };
        let tail = stderr_tail(&ran.stderr);
        match ran.ended {
            Ended::Exited(0) => {
                let out = ran.stdout.trim();
                if out.is_empty() {
                    (TaskOutcome::Silent, None, String::new())
                } else {
                    let r = BackgroundResult::new(
                        BackgroundSource::Script,
                        task.id.clone(),
                        out.to_string(),
                        None,
                    );
                    (TaskOutcome::Delivered, Some(r), String::new())
                }
            }
            Ended::TimedOut => {
                let msg = format!(
                    "script_timeout: task {} ran past {} ms; it and its process group were killed",
                    task.name,
                    self.script_timeout.as_millis()
                );
                (
                    TaskOutcome::ScriptTimeout,
                    alert(BackgroundReason::ScriptTimeout, msg.clone()),
                    msg,
                )
            }
            Ended::Exited(code) => self.failed(task, format!("exited with code {code}"), &tail),
            Ended::Signalled(s) => self.failed(task, format!("was ended by {s}"), &tail),
            Ended::NotStarted(why) => self.failed(task, format!("did not start: {why}"), &tail),
            Ended::Cancelled => self.failed(task, "was cancelled".to_string(), &tail),
        }
    }

    /// A failed script's alert: how it ended, then its stderr's tail.
    fn failed(
        &self,
        task: &TaskDef,
        how: String,
        tail: &str,
    ) -> (TaskOutcome, Option<BackgroundResult>, String) {
        let mut msg = format!("script_failed: task {} {how}", task.name);
        if !tail.is_empty() {
            msg.push_str("\nstderr:\n");
            msg.push_str(tail);
        }
        let r = BackgroundResult::new(
            BackgroundSource::Script,
            task.id.clone(),
            msg.clone(),
            Some(BackgroundReason::ScriptFailed),
        );
        (TaskOutcome::ScriptFailed, Some(r), msg)
    }
}

/// The last `STDERR_TAIL` bytes of stderr, trimmed, cut on a character boundary.
fn stderr_tail(stderr: &str) -> String {
    let s = stderr.trim_end();
    let mut start = s.len().saturating_sub(STDERR_TAIL);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// What a task may name: a session this host knows, and any well-formed
/// model pin (the edge checks a pin against the provider's list, which
/// needs the network, before it reaches the scheduler).
pub struct HostCheck {
    pub sessions: Arc<Registry>,
}

impl TaskCheck for HostCheck {
    fn session_exists(&self, id: &str) -> bool {
        self.sessions.known(id)
    }

    fn model_known(&self, pin: &str) -> bool {
        crate::host::config::validate_model(pin, "model_pin").is_ok()
    }
}

impl BackgroundSink for Registry {
    fn deliver(&self, session_id: &str, result: BackgroundResult) -> BoxFuture<'_, Result<()>> {
        let id = session_id.to_string();
        Box::pin(async move { self.get(&id).await?.deliver_background(result).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stderr_tail_keeps_the_end_and_never_splits_a_character() {
        let long = format!("{}é{}", "a".repeat(STDERR_TAIL), "z".repeat(10));
        let t = stderr_tail(&long);
        assert!(t.ends_with("zzzzzzzzzz"));
        assert!(t.len() <= STDERR_TAIL);
        assert_eq!(stderr_tail("  oops \n"), "  oops");
    }
}
