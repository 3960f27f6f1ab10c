//! The agent loop: one leg of a turn chain. It asks the provider for a turn, runs the tools it calls (through approvals when needed), and repeats until the model answers without tools or the max-turns cap.

use super::deltas::{Deltas, FREE};
use super::event::{AgentEvent, ClientEvent, RunOutcome};
use super::provider::{Failure, ProviderError, ProviderEvent, Sink, ToolCall, TurnRequest};
use super::session::{Input, Session};
use super::{prompt, tools, PermissionMode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const CANCELLED: &str = "cancelled by a client";

/// The longest wait a provider's `retry-after` may ask for; a longer one is
/// capped (the run would look hung).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The cap on the exponential backoff between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// A provider turn's output on its way to the session: deltas bounded by
/// `Deltas`, and the writer's backpressure as the provider's `ready`.
struct TurnSink<'a> {
    session: &'a Session,
    streamed: AtomicBool,
    deltas: Mutex<Deltas>,
}

impl Sink for TurnSink<'_> {
    fn send(&self, e: ProviderEvent) {
        if let ProviderEvent::ThinkingSignature(sig) = e {
            // After the thinking it signs: flush what the merge holds first.
            let held = self.deltas.lock().unwrap_or_else(|p| p.into_inner()).flush();
            if let Some(event) = held {
                self.session.publish(event);
            }
            self.session.emit(AgentEvent::ThinkingSignature(sig));
            return;
        }
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

/// How long to wait before retry number `attempt` (1-based): what the
/// provider asked for (capped), else `base` doubling per attempt up to
/// `MAX_BACKOFF`, less up to a quarter at random so clients that failed
/// together do not retry together.
pub fn retry_delay(base: Duration, attempt: u32, failure: &Failure, random: f64) -> Duration {
    if let Some(after) = failure.retry_after {
        return after.min(MAX_RETRY_AFTER);
    }
    let exp = base
        .saturating_mul(1u32 << (attempt.saturating_sub(1)).min(16))
        .min(MAX_BACKOFF);
    exp.mul_f64(1.0 - 0.25 * random.clamp(0.0, 1.0))
}

fn random_unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() & 0xffff_ffff) as f64 / u32::MAX as f64
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
    // The route is fixed for the whole leg: a config change applies to the next one.
    let route = rt.route();
    let system = prompt::system(&rt.cfg.workspace).await;
    let tool_defs = tools::definitions();
    let mut turns = 0;
    loop {
        if cancel.is_cancelled() {
            return (RunOutcome::Cancelled, CANCELLED.into());
        }
        if turns == rt.cfg.max_turns {
            return (
                RunOutcome::MaxTurns,
                format!(
                    "stopped after {} model turns (the max-turns limit)",
                    rt.cfg.max_turns
                ),
            );
        }
        turns += 1;
        let mut attempt = 0;
        let output = loop {
            // The history is the transcript, which folds what is durable: wait
            // until everything this leg published so far is.
            if let Err(e) = session.flush().await {
                return (RunOutcome::Failed, e.message);
            }
            let request = TurnRequest {
                model: route.model.clone(),
                system: system.clone(),
                messages: session.transcript().chat(),
                tools: tool_defs.clone(),
                max_tokens: rt.cfg.max_output_tokens,
                temperature: rt.cfg.temperature,
            };
            let sink = TurnSink {
                session,
                streamed: AtomicBool::new(false),
                deltas: Mutex::new(Deltas::new(FREE)),
            };
            let result = route.provider.turn(&request, &sink, cancel).await;
            let held = sink.deltas.lock().unwrap_or_else(|p| p.into_inner()).flush();
            if let Some(event) = held {
                session.publish(event);
            }
            let streamed = sink.streamed.load(Ordering::Relaxed);
            let failure = match result {
                Ok(o) => break o,
                Err(ProviderError::Cancelled) => return (RunOutcome::Cancelled, CANCELLED.into()),
                Err(ProviderError::Failed(f)) => f,
            };
            tracing::warn!(
                session = %session.id(),
                provider = route.provider.name(),
                attempt,
                kind = ?failure.kind,
                error = %failure.detail,
                "model turn failed"
            );
            session.emit(AgentEvent::RawError(failure.detail.clone()));
            if !failure.retryable || attempt >= rt.cfg.provider_retries {
                return (RunOutcome::Failed, failure.kind.message());
            }
            attempt += 1;
            session.emit(AgentEvent::Retry {
                attempt,
                error: failure.detail.clone(),
            });
            let wait = retry_delay(rt.cfg.retry_backoff, attempt, &failure, random_unit());
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return (RunOutcome::Cancelled, CANCELLED.into()),
            }
            if streamed {
                // The broken attempt's text stays where clients saw it; a
                // second turn_started marks it interrupted and the retry
                // streams as a fresh message (the model never sees the
                // partial one).
                session.publish(ClientEvent::TurnStarted {
                    request_id: input.request_id.clone(),
                });
            }
        };
        session.emit(AgentEvent::Usage(output.usage));
        if output.tool_calls.is_empty() {
            return (RunOutcome::Completed, "completed".into());
        }
        for call in output.tool_calls {
            call_tool(session, call, cancel).await;
            if cancel.is_cancelled() {
                return (RunOutcome::Cancelled, CANCELLED.into());
            }
        }
    }
}

/// Publishes tool_call, settles permission, runs the tool and publishes its
/// tool_result: every call gets exactly one result, also when refused or cancelled.
async fn call_tool(session: &Session, call: ToolCall, cancel: &CancellationToken) {
    // The provider's own id goes back to it with the result; a provider
    // that sends none (or an unusable one) gets one of ours.
    let call_id = if call.id.is_empty() || call.id.len() > 128 {
        format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
    } else {
        call.id
    };
    let ToolCall {
        name: tool, input, ..
    } = call;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::provider::FailureKind;

    #[test]
    fn backoff_doubles_from_the_base_is_capped_and_honours_retry_after() {
        let f = Failure::new(FailureKind::Overloaded, "529", true);
        let base = Duration::from_millis(500);
        let no_jitter: Vec<_> = (1..=6).map(|a| retry_delay(base, a, &f, 0.0)).collect();
        assert_eq!(
            no_jitter,
            [500, 1000, 2000, 4000, 8000, 8000].map(Duration::from_millis)
        );
        // Jitter takes off at most a quarter.
        assert_eq!(retry_delay(base, 2, &f, 1.0), Duration::from_millis(750));
        let mut asked = f.clone();
        asked.retry_after = Some(Duration::from_secs(3));
        assert_eq!(retry_delay(base, 1, &asked, 0.5), Duration::from_secs(3));
        asked.retry_after = Some(Duration::from_secs(3600));
        assert_eq!(retry_delay(base, 1, &asked, 0.5), MAX_RETRY_AFTER);
    }
}
