//! The agent loop: one leg of a turn chain. It asks the provider for a turn, runs the tools it calls (through approvals when needed), and repeats until the model answers without tools.

use super::deltas::{Deltas, FREE};
use super::event::{AgentEvent, ClientEvent, RunOutcome};
use super::provider::{ProviderError, ProviderEvent, Sink, ToolRequest};
use super::session::{Input, Session};
use super::{tools, PermissionMode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

const CANCELLED: &str = "cancelled by a client";

/// A provider turn's output on its way to the session: deltas bounded by
/// `Deltas`, and the writer's backpressure as the provider's `ready`.
struct TurnSink<'a> {
    session: &'a Session,
    streamed: AtomicBool,
    deltas: Mutex<Deltas>,
}

impl Sink for TurnSink<'_> {
    fn send(&self, e: ProviderEvent) {
        self.streamed.store(true, Ordering::Relaxed);
        // Only this turn uses the lock; the provider calls `send` in order.
        let ready = self.deltas.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        for event in ready {
            self.session.publish(event);
        }
    }

    fn ready(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.session.pace())
    }
}

/// Runs one leg for `input`; returns how it ended and the human message for run_finished.
pub async fn run_leg(session: &Session, input: &Input, cancel: &CancellationToken) -> (RunOutcome, String) {
    session.publish(ClientEvent::UserMessage {
        text: input.text.clone(),
        request_id: input.request_id.clone(),
    });
    session.publish(ClientEvent::TurnStarted {
        request_id: input.request_id.clone(),
    });
    let rt = session.runtime();
    loop {
        if cancel.is_cancelled() {
            return (RunOutcome::Cancelled, CANCELLED.into());
        }
        // The history is the transcript, which folds what is durable: wait
        // until everything this leg published so far is.
        if let Err(e) = session.flush().await {
            return (RunOutcome::Failed, e.message);
        }
        let history = session.transcript().messages;
        let mut attempt = 0;
        let output = loop {
            let sink = TurnSink {
                session,
                streamed: AtomicBool::new(false),
                deltas: Mutex::new(Deltas::new(FREE)),
            };
            let result = rt.provider.turn(&history, &sink, cancel).await;
            let held = sink.deltas.lock().unwrap_or_else(|p| p.into_inner()).flush();
            if let Some(event) = held {
                session.publish(event);
            }
            let streamed = sink.streamed;
            match result {
                Ok(o) => break o,
                Err(ProviderError::Cancelled) => return (RunOutcome::Cancelled, CANCELLED.into()),
                Err(ProviderError::Failed(msg)) => {
                    session.emit(AgentEvent::RawError(msg.clone()));
                    // A turn that already streamed cannot be replayed without
                    // showing clients the same text twice: retry only clean failures.
                    if attempt < rt.cfg.provider_retries && !streamed.load(Ordering::Relaxed) {
                        attempt += 1;
                        session.emit(AgentEvent::Retry { attempt, error: msg });
                        tokio::select! {
                            _ = tokio::time::sleep(rt.cfg.retry_backoff * attempt) => continue,
                            _ = cancel.cancelled() => return (RunOutcome::Cancelled, CANCELLED.into()),
                        }
                    }
                    return (RunOutcome::Failed, format!("the model failed: {msg}"));
                }
            }
        };
        session.emit(AgentEvent::Usage {
            input_tokens: output.input_tokens,
            output_tokens: output.output_tokens,
        });
        if output.tool_calls.is_empty() {
            return (RunOutcome::Completed, "completed".into());
        }
        for request in output.tool_calls {
            call_tool(session, request, cancel).await;
            if cancel.is_cancelled() {
                return (RunOutcome::Cancelled, CANCELLED.into());
            }
        }
    }
}

/// Publishes tool_call, settles permission, runs the tool and publishes its
/// tool_result: every call gets exactly one result, also when refused or cancelled.
async fn call_tool(session: &Session, request: ToolRequest, cancel: &CancellationToken) {
    let call_id = format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let ToolRequest { tool, input } = request;
    session.publish(ClientEvent::ToolCall {
        call_id: call_id.clone(),
        tool: tool.clone(),
        input: input.clone(),
    });
    let rt = session.runtime();
    let permitted: Result<(), String> = if !tools::needs_approval(&tool) {
        Ok(())
    } else {
        match rt.cfg.permission {
            PermissionMode::Allow => Ok(()),
            PermissionMode::Deny => Err("denied: the server's permission mode refuses this tool".into()),
            PermissionMode::Ask => {
                let request_id = format!("ap_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
                let answer = session.approvals().register(&request_id);
                session.publish(ClientEvent::ApprovalRequested {
                    request_id: request_id.clone(),
                    tool: tool.clone(),
                    reason: tools::approval_reason(&tool, &input),
                    input: input.clone(),
                    call_id: call_id.clone(),
                });
                tokio::select! {
                    a = answer => match a {
                        Ok(a) if a.approve => Ok(()),
                        Ok(a) if a.reason.is_empty() => Err("denied by the user".into()),
                        Ok(a) => Err(format!("denied by the user: {}", a.reason)),
                        Err(_) => Err("the approval expired".into()),
                    },
                    _ = cancel.cancelled() => {
                        session.approvals().expire_all("the run was cancelled", |e| session.publish(e));
                        Err(CANCELLED.into())
                    }
                }
            }
        }
    };
    let result = match permitted {
        Ok(()) => tools::run(&rt.cfg.workspace, &tool, &input, cancel).await,
        Err(why) => tools::ToolOutput {
            ok: false,
            output: why,
        },
    };
    session.publish(ClientEvent::ToolResult {
        call_id,
        ok: result.ok,
        output: result.output,
    });
}
