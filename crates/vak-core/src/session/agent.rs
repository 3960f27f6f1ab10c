//! The agent loop: one leg of a turn chain. It asks the provider for a turn, runs the tools it calls (through approvals when needed), and repeats until the model answers without tools or the max-turns cap.

use crate::event::{AgentEvent, ClientEvent, Compaction, Retrying, RunOutcome, StopReason};
use crate::host::hooks::HookEvent;
use crate::log::deltas::{Deltas, FREE};
use crate::metrics_names as metric;
use crate::permissions::{self, Decision};
use crate::provider::{
    ChatMessage, Failure, FailureKind, ProviderError, ProviderEvent, Sink, TokenUsage, ToolCall, ToolDef,
    TurnRequest,
};
use crate::route::Route;
use crate::session::admission::Input;
use crate::session::approvals::Answer;
use crate::session::context::TurnContext;
use crate::session::hooks;
use crate::session::receipts::{self, ModelCallReceipt};
use crate::tools::ToolClass;
use crate::trace::ToolOutcome;
use crate::{session::prompt, tools, PermissionMode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(crate) const CANCELLED: &str = "cancelled by a client";

/// Live tool output pieces in flight between a tool and the session.
const LIVE_QUEUE: usize = 16;

/// The longest wait a provider's `retry-after` may ask for; a longer one is
/// capped (the run would look hung).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The cap on the exponential backoff between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// A provider turn's output on its way to the session: deltas bounded by
/// `Deltas`, and the writer's backpressure as the provider's `ready`.
struct TurnSink<'a, S> {
    session: &'a S,
    streamed: AtomicBool,
    deltas: Mutex<Deltas>,
}

impl<S: TurnContext> Sink for TurnSink<'_, S> {
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
pub(crate) fn retry_delay(base: Duration, attempt: u32, failure: &Failure, random: f64) -> Duration {
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

/// The share of the context window past which the history is compacted
/// before the next turn, in percent.
pub(crate) const COMPACT_AT_PERCENT: u64 = 80;

/// What the model is asked when the history is compacted.
const COMPACT_PROMPT: &str = "The conversation is about to exceed your context window. \
Write a summary of it that lets you continue the work without it: the user's requests and constraints, \
what you did and found (files, commands, results, decisions), what is in progress, and what remains. \
Be specific and complete; do not call tools.";

fn near_full(context_tokens: u64, window: Option<u64>) -> bool {
    window.is_some_and(|w| context_tokens.saturating_mul(100) >= w.saturating_mul(COMPACT_AT_PERCENT))
}

/// What every model call of one leg shares.
struct Leg<'a, S> {
    session: &'a S,
    route: Route,
    /// The config revision the route came from.
    revision: String,
    system: String,
    tools: Vec<ToolDef>,
    /// The promoted skills, read when the leg starts (their tools are in `tools`).
    skills: Vec<crate::host::skills::Skill>,
}

impl<'a, S: TurnContext> Leg<'a, S> {
    /// `model`: a model to use instead of the route's (a task's pin).
    async fn new(session: &'a S, model: Option<&str>) -> Leg<'a, S> {
        let rt = session.runtime();
        let (mut route, revision) = rt.route_and_revision();
        if let Some(m) = model {
            route.model = m.to_string();
        }
        let skills = crate::session::skill_tool::load(rt).await;
        Leg {
            session,
            // Fixed for the whole leg: a config change applies to the next one.
            route,
            revision,
            system: prompt::system(
                &rt.cfg.workspace,
                // AGENTS.md is read only from a folder that passes the check.
                rt.check_workspace().await.is_ok(),
                &rt.memory().prompt().await,
            )
            .await
                + crate::session::skill_tool::system_note(&skills),
            // The MCP servers' tools and the skills' next to the built-in ones.
            tools: tools::definitions()
                .into_iter()
                .chain(rt.mcp().tool_defs())
                .chain(crate::session::skill_tool::defs(&skills))
                .collect(),
            skills,
        }
    }

    fn request(&self, messages: Vec<ChatMessage>) -> TurnRequest {
        let cfg = &self.session.runtime().cfg;
        TurnRequest {
            model: self.route.model.clone(),
            system: self.system.clone(),
            messages,
            // Also when compacting: histories with tool calls need the
            // tools defined (Anthropic).
            tools: self.tools.clone(),
            max_tokens: cfg.max_output_tokens,
            temperature: cfg.temperature,
        }
    }

    /// A model call's receipt, recorded as it goes and emitted when it ends.
    fn receipt(&self, request_id: Option<&str>) -> ModelCallReceipt<'a, S> {
        ModelCallReceipt::new(
            self.session,
            crate::receipt::ModelCallRecorder::new(
                request_id,
                self.route.provider.name(),
                &self.route.model,
                &self.revision,
                &self.tools,
            ),
        )
    }

    /// Records one model call's usage: in the session's ledger, and priced
    /// in the cost ledger under the run that made it (`request_id`; None
    /// outside a run) and the model this leg's route really asked.
    async fn spent(&self, request_id: Option<&str>, usage: TokenUsage) {
        self.session.emit(AgentEvent::Usage(usage));
        count_tokens(&self.route, usage);
        let rt = self.session.runtime();
        rt.finops()
            .record_usage(self.session.id(), request_id, &self.route, usage)
            .await;
    }

    /// Asks the model to summarise the history so far and records the
    /// summary (a ledger note, internal to clients): from then on the model
    /// sees the summary in place of the messages it covers.
    async fn compact(
        &self,
        request_id: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<(), ProviderError> {
        let transcript = self.session.transcript();
        let mut messages = with_images(self.session, transcript.chat())
            .await
            .map_err(|m| ProviderError::Failed(Failure::new(FailureKind::BadResponse, m, false)))?;
        messages.push(ChatMessage::User {
            text: COMPACT_PROMPT.into(),
            images: Vec::new(),
        });
        let request = self.request(messages);
        let summary = Mutex::new(String::new());
        let sink = |e: ProviderEvent| {
            if let ProviderEvent::Text(t) = e {
                summary.lock().unwrap_or_else(|p| p.into_inner()).push_str(&t);
            }
        };
        let mut receipt = self.receipt(request_id);
        receipt.at().sending(&request);
        let out = self.route.provider.turn(&request, &sink, cancel).await;
        receipt.at().ended(&out);
        receipt.finish();
        let out = out?;
        self.spent(request_id, out.usage).await;
        let summary = summary.into_inner().unwrap_or_else(|p| p.into_inner());
        if summary.trim().is_empty() {
            return Err(ProviderError::Failed(Failure::new(
                FailureKind::BadResponse,
                "the compaction answer was empty",
                false,
            )));
        }
        tracing::info!(session = %self.session.id(), upto_seq = transcript.seq, "history compacted");
        self.session.emit(AgentEvent::Compaction(Compaction {
            summary,
            upto_seq: transcript.seq,
        }));
        Ok(())
    }
}

/// The history with its images' bytes read from the home. A missing file
/// is logged and answered with a fixed message (no path reaches a client).
pub(crate) async fn with_images(
    session: &impl TurnContext,
    mut history: Vec<ChatMessage>,
) -> Result<Vec<ChatMessage>, String> {
    match crate::session::attachments::load(&session.runtime().cfg.home, &mut history).await {
        Ok(()) => Ok(history),
        Err(e) => {
            tracing::error!(session = %session.id(), "{}", e.message);
            Err("an image of this conversation cannot be read from the server's home (the server log has the details)".into())
        }
    }
}

/// The route and request of one model turn outside a leg (a side run):
/// the same route, system prompt and tool definitions a leg starting now
/// would use, for `messages`.
pub(crate) async fn one_turn_request(
    session: &impl TurnContext,
    messages: Vec<ChatMessage>,
) -> (Route, TurnRequest) {
    let leg = Leg::new(session, None).await;
    let request = leg.request(messages);
    (leg.route, request)
}

/// Compacts the session's history now, outside a run (`POST
/// /sessions/:id/compact`): the same summary turn and ledger note as when
/// the context window fills. The caller keeps runs from starting meanwhile.
pub(crate) async fn compact_now(
    session: &impl TurnContext,
    cancel: &CancellationToken,
) -> crate::error::Result<()> {
    let leg = Leg::new(session, None).await;
    match leg.compact(None, cancel).await {
        Ok(()) => Ok(()),
        Err(ProviderError::Cancelled) => Err(crate::error::Error::new(
            crate::error::ErrorKind::Unavailable,
            "the compaction was cancelled",
        )),
        Err(ProviderError::Failed(f)) => {
            tracing::warn!(session = %session.id(), kind = ?f.kind, error = %f.detail, "compaction failed");
            Err(crate::host::config::upstream_error(&f))
        }
    }
}

/// How a leg ended: what its run_finished says.
pub(crate) struct LegEnd {
    pub(crate) outcome: RunOutcome,
    /// The human message.
    pub(crate) message: String,
    /// Why the last reply stopped, when not on its own.
    pub(crate) stop_reason: Option<StopReason>,
}

impl LegEnd {
    fn new(outcome: RunOutcome, message: String) -> Self {
        LegEnd {
            outcome,
            message,
            stop_reason: None,
        }
    }
}

/// Runs one leg for `input`; returns how it ended, the human message for
/// run_finished, and the tokens its model turns used.
pub(crate) async fn run_leg(
    session: &impl TurnContext,
    input: &Input,
    cancel: &CancellationToken,
) -> (LegEnd, TokenUsage) {
    let mut used = TokenUsage::default();
    let end = leg_turns(session, input, cancel, &mut used).await;
    (end, used)
}

async fn leg_turns(
    session: &impl TurnContext,
    input: &Input,
    cancel: &CancellationToken,
    used: &mut TokenUsage,
) -> LegEnd {
    session.publish(ClientEvent::UserMessage {
        text: input.text.clone(),
        request_id: input.request_id.clone(),
        attachments: input.attachments.clone(),
    });
    session.publish(ClientEvent::TurnStarted {
        request_id: input.request_id.clone(),
    });
    let rt = session.runtime();
    let leg = Leg::new(session, input.model.as_deref()).await;
    // Fixed for the whole leg, like the route.
    let max_turns = rt.max_turns();
    let mut turns = 0;
    loop {
        if cancel.is_cancelled() {
            return LegEnd::new(RunOutcome::Cancelled, CANCELLED.into());
        }
        if turns == max_turns {
            return LegEnd::new(
                RunOutcome::MaxTurns,
                format!("stopped after {max_turns} model turns (the max-turns limit)"),
            );
        }
        turns += 1;
        let mut traced = crate::trace::ModelCall::start(leg.route.provider.name(), &leg.route.model);
        let mut attempt = 0;
        let mut compacted = false;
        let mut receipt = leg.receipt(Some(&input.request_id));
        let output = loop {
            // The history is the transcript, which folds what is durable: wait
            // until everything this leg published so far is.
            if let Err(e) = session.flush().await {
                return LegEnd::new(RunOutcome::Failed, e.message);
            }
            if !compacted && near_full(session.transcript().context_tokens, leg.route.context_window) {
                compacted = true;
                match leg.compact(Some(&input.request_id), cancel).await {
                    Ok(()) => continue,
                    Err(ProviderError::Cancelled) => {
                        return LegEnd::new(RunOutcome::Cancelled, CANCELLED.into())
                    }
                    // The turn itself may still fit; if not, it fails on its own.
                    Err(ProviderError::Failed(f)) => {
                        tracing::warn!(session = %session.id(), kind = ?f.kind, error = %f.detail, "compaction failed")
                    }
                }
            }
            let history = match with_images(session, session.transcript().chat()).await {
                Ok(h) => h,
                Err(message) => return LegEnd::new(RunOutcome::Failed, message),
            };
            let request = leg.request(history);
            let sink = TurnSink {
                session,
                streamed: AtomicBool::new(false),
                deltas: Mutex::new(Deltas::new(FREE)),
            };
            traced.attempt();
            receipt.at().sending(&request);
            let asked = std::time::Instant::now();
            let result = leg.route.provider.turn(&request, &sink, cancel).await;
            receipt.at().ended(&result);
            let outcome = match &result {
                Ok(_) => "ok",
                Err(ProviderError::Cancelled) => "cancelled",
                Err(ProviderError::Failed(_)) => "error",
            };
            metrics::histogram!(
                metric::PROVIDER_REQUEST_SECONDS,
                "provider" => provider_label(&leg.route),
                "outcome" => outcome
            )
            .record(asked.elapsed().as_secs_f64());
            let held = sink.deltas.lock().unwrap_or_else(|p| p.into_inner()).flush();
            if let Some(event) = held {
                session.publish(event);
            }
            let streamed = sink.streamed.load(Ordering::Relaxed);
            let failure = match result {
                Ok(o) => break o,
                Err(ProviderError::Cancelled) => return LegEnd::new(RunOutcome::Cancelled, CANCELLED.into()),
                Err(ProviderError::Failed(f)) => f,
            };
            tracing::warn!(
                session = %session.id(),
                provider = leg.route.provider.name(),
                attempt,
                kind = ?failure.kind,
                error = %failure.detail,
                "model turn failed"
            );
            session.emit(AgentEvent::RawError(failure.detail.clone()));
            if failure.kind == FailureKind::ContextTooLong && !compacted {
                // The window is smaller than we knew: compact now, once.
                compacted = true;
                match leg.compact(Some(&input.request_id), cancel).await {
                    Ok(()) => continue,
                    Err(ProviderError::Cancelled) => {
                        return LegEnd::new(RunOutcome::Cancelled, CANCELLED.into())
                    }
                    Err(ProviderError::Failed(_)) => {
                        return LegEnd::new(RunOutcome::Failed, failure.kind.message())
                    }
                }
            }
            // Where the service is, for the person reading (never its path or key).
            let host = leg.route.provider.host();
            if !failure.retryable || attempt >= rt.cfg.provider_retries {
                return LegEnd::new(RunOutcome::Failed, failure.message_at(host.as_deref()));
            }
            attempt += 1;
            metrics::counter!(
                metric::PROVIDER_RETRIES,
                "provider" => provider_label(&leg.route),
                "reason" => failure.kind.as_str()
            )
            .increment(1);
            session.emit(AgentEvent::Retry {
                attempt,
                error: failure.detail.clone(),
            });
            // Clients see the wait (a status line, not a conversation item):
            // it stands until the run's next event.
            let reason = failure.retry_reason(host.as_deref());
            receipt.at().retrying(&reason);
            session.publish(ClientEvent::Status {
                busy: true,
                retrying: Some(Retrying {
                    attempt,
                    of: rt.cfg.provider_retries,
                    reason,
                }),
            });
            let wait = retry_delay(rt.cfg.retry_backoff, attempt, &failure, random_unit());
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => {
                    receipt.at().cancelled();
                    return LegEnd::new(RunOutcome::Cancelled, CANCELLED.into());
                }
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
        traced.settled(output.usage);
        receipt.finish();
        used.add(output.usage);
        leg.spent(Some(&input.request_id), output.usage).await;
        if output.tool_calls.is_empty() {
            return match StopReason::of(output.stop) {
                Some(why) => LegEnd {
                    outcome: RunOutcome::Completed,
                    message: why.message().into(),
                    stop_reason: Some(why),
                },
                None => LegEnd::new(RunOutcome::Completed, "completed".into()),
            };
        }
        let mut calls = output.tool_calls.into_iter().peekable();
        while let Some(call) = calls.next() {
            if call.name == tools::SPAWN_WORKER {
                // Workers the turn asks for together run together (each
                // still gets its own tool_call and tool_result).
                let mut batch = vec![call];
                while let Some(next) = calls.next_if(|c| c.name == tools::SPAWN_WORKER) {
                    batch.push(next);
                }
                futures_util::future::join_all(
                    batch
                        .into_iter()
                        .map(|c| call_tool(session, (&leg.tools, &leg.skills), c, &input.request_id, cancel)),
                )
                .await;
            } else {
                call_tool(
                    session,
                    (&leg.tools, &leg.skills),
                    call,
                    &input.request_id,
                    cancel,
                )
                .await;
            }
            if cancel.is_cancelled() {
                return LegEnd::new(RunOutcome::Cancelled, CANCELLED.into());
            }
        }
    }
}

/// The most a plan may hold.
pub(crate) const MAX_PLAN_BYTES: usize = 64 * 1024;

/// Checks exit_plan_mode's input: a plan that is not blank and at most `MAX_PLAN_BYTES`.
fn plan_of(input: &serde_json::Value) -> Result<(), String> {
    match input.get("plan").and_then(serde_json::Value::as_str) {
        None => Err("exit_plan_mode needs a string `plan`".into()),
        Some(p) if p.trim().is_empty() => Err("exit_plan_mode needs a plan that is not empty".into()),
        Some(p) if p.len() > MAX_PLAN_BYTES => Err(format!(
            "the plan is {} bytes; at most {MAX_PLAN_BYTES} are accepted: shorten it",
            p.len()
        )),
        Some(_) => Ok(()),
    }
}

/// Publishes tool_call, settles permission, runs the tool and publishes its
/// tool_result: every call gets exactly one result, also when refused or cancelled.
async fn call_tool(
    session: &impl TurnContext,
    (defs, skills): (&[ToolDef], &[crate::host::skills::Skill]),
    call: ToolCall,
    request_id: &str,
    cancel: &CancellationToken,
) {
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
    let span = tracing::info_span!(
        target: crate::trace::TARGET,
        "tool_call",
        tool = %tool,
        call_id = %call_id,
        outcome = tracing::field::Empty,
    );
    session.publish(ClientEvent::ToolCall {
        call_id: call_id.clone(),
        tool: tool.clone(),
        input: input.clone(),
    });
    let started = (crate::receipt::now(), std::time::Instant::now());
    let rt = session.runtime();
    // Before the permission question: a blocked call never asks the user.
    if let Some(why) = pre_tool_hooks(session, &tool, &input, &call_id, cancel).await {
        span.record("outcome", ToolOutcome::Blocked.as_str());
        let result = tools::ToolOutput {
            ok: false,
            output: why,
            exit_code: None,
        };
        let receipt = receipts::tool_call(
            request_id,
            started,
            &call_id,
            &tool,
            &result,
            cancel.is_cancelled(),
        );
        count_tool(&tool, false);
        session.publish(ClientEvent::ToolResult {
            call_id,
            ok: false,
            output: result.output,
        });
        session.emit(receipt);
        return;
    }
    let class = crate::session::skill_tool::class(&tool, skills).unwrap_or_else(|| tools::class(&tool));
    let decision = if defs.iter().any(|d| d.name == tool) {
        permissions::decide(rt.mode(), class)
    } else {
        // Nothing to approve: it cannot run.
        Decision::Refuse(format!("unknown tool {tool}"))
    };
    let decision = match (decision, class) {
        // A plan must be there before anyone is asked to approve it.
        (Decision::Ask, ToolClass::Plan) => match plan_of(&input) {
            Ok(()) => Decision::Ask,
            Err(why) => Decision::Refuse(why),
        },
        // Only an ask is ever turned into a run by a rule: what the mode
        // refuses (plan mode's edits and commands) stays refused.
        (Decision::Ask, _) => match rt.rules().allowing(&tool, &input) {
            Some(rule) => {
                tracing::debug!(session = %session.id(), rule = %rule.id, tool = %tool, "allowed by an always-allow rule");
                Decision::Run
            }
            None => Decision::Ask,
        },
        (d, _) => d,
    };
    let permitted: Result<Option<Answer>, String> = match decision {
        Decision::Run => Ok(None),
        Decision::Refuse(why) => Err(why),
        Decision::Ask => {
            let request_id = format!("ap_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
            let rule = crate::host::rules::candidate(&tool, &input);
            let answer = session.approvals().register(&request_id, &tool, rule);
            session.publish(ClientEvent::ApprovalRequested {
                request_id: request_id.clone(),
                tool: tool.clone(),
                reason: tools::approval_reason(&tool, &input),
                input: input.clone(),
                call_id: call_id.clone(),
            });
            let denied = |a: &Answer| {
                let mut why = String::from("denied by the user");
                if !a.reason.is_empty() {
                    why = format!("{why}: {}", a.reason);
                }
                if class == ToolClass::Plan {
                    why.push_str(" (the session stays in plan mode)");
                }
                why
            };
            // Nobody answering is an answer too, after the timeout: the
            // call is denied and the run goes on (a run never waits forever).
            let timeout = rt.cfg.approval_timeout;
            let expired = async {
                match timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            let settle = |a: Result<Answer, _>| match a {
                Ok(a) if a.approve => Ok(Some(a)),
                Ok(a) => Err(denied(&a)),
                Err(_) => Err("the approval expired".to_string()),
            };
            let mut answer = std::pin::pin!(answer);
            tokio::select! {
                a = &mut answer => settle(a),
                _ = expired => {
                    let t = humantime::format_duration(timeout.unwrap_or_default());
                    let why = format!("nobody answered within {t} (--approval-timeout)");
                    if session.approvals().expire(&request_id, &why, |e| session.publish(e)) {
                        Err(format!("the approval expired: {why}; the call did not run"))
                    } else {
                        // Answered at the last moment: that answer stands.
                        settle(answer.await)
                    }
                }
                _ = cancel.cancelled() => {
                    session.approvals().expire_all("the run was cancelled", |e| session.publish(e));
                    Err(CANCELLED.into())
                }
            }
        }
    };
    // An opened workspace's folder is re-checked right before a tool
    // touches it: one replaced by a symlink (or another folder) since it
    // was opened is refused, so the tool never reaches outside.
    let permitted = match permitted {
        // update_plan touches only the session's ledger.
        Ok(a) if !matches!(class, ToolClass::Plan | ToolClass::Track) => {
            rt.check_workspace().await.map(|()| a).map_err(|e| e.message)
        }
        other => other,
    };
    let ran = permitted.is_ok();
    let result = match permitted {
        // The approval itself was the work: the session left plan mode
        // when it was answered.
        Ok(approved) if class == ToolClass::Plan => tools::ToolOutput {
            ok: true,
            output: format!(
                "the user approved the plan; the permission mode is now {}: carry out the plan",
                approved
                    .and_then(|a| a.mode)
                    .unwrap_or(PermissionMode::Default)
                    .as_str()
            ),
            exit_code: None,
        },
        Ok(_) => {
            // Live output is published as it comes, every piece before the
            // result; the channel's bound holds the tool up (and with it the
            // command) while the writer is behind.
            let (live, mut pieces) = tokio::sync::mpsc::channel::<tools::Chunk>(LIVE_QUEUE);
            let publish = async {
                while let Some(c) = pieces.recv().await {
                    session.pace().await;
                    session.publish(ClientEvent::ToolOutput {
                        call_id: call_id.clone(),
                        stream: c.stream,
                        text: c.text,
                    });
                }
            };
            let run = async {
                // Moved in, so the publishing loop ends with the tool.
                let live = live;
                if class == ToolClass::Delegate {
                    return crate::session::spawn_tool::run(session, &input, cancel).await;
                }
                if class == ToolClass::Track {
                    let (ok, output) = match session.update_plan(&input).await {
                        Ok(plan) => (true, plan),
                        Err(why) => (false, why),
                    };
                    return tools::ToolOutput {
                        ok,
                        output,
                        exit_code: None,
                    };
                }
                if crate::mcp::names::server_of(&tool).is_some() {
                    return rt.mcp().call(&tool, &input, cancel).await;
                }
                if let Some(out) =
                    crate::session::skill_tool::run(rt, &tool, skills, &input, cancel, Some(&live)).await
                {
                    return out;
                }
                tools::run_live(
                    &rt.cfg.workspace,
                    rt.sandbox(),
                    &tool,
                    &input,
                    cancel,
                    Some(&live),
                )
                .await
            };
            tokio::join!(run, publish).0
        }
        Err(why) => tools::ToolOutput {
            ok: false,
            output: why,
            exit_code: None,
        },
    };
    let seen = hooks::Call {
        session_id: session.id(),
        tool: &tool,
        input: &input,
        call_id: &call_id,
    };
    let outcome = match (ran, result.ok) {
        (false, _) => ToolOutcome::Refused,
        (true, true) => ToolOutcome::Ok,
        (true, false) => ToolOutcome::Error,
    };
    span.record("outcome", outcome.as_str());
    let post = (!rt.hooks().of(HookEvent::PostToolUse).is_empty()).then(|| result.output.clone());
    let receipt = receipts::tool_call(
        request_id,
        started,
        &call_id,
        &tool,
        &result,
        cancel.is_cancelled(),
    );
    count_tool(&tool, result.ok);
    session.publish(ClientEvent::ToolResult {
        call_id: call_id.clone(),
        ok: result.ok,
        output: result.output,
    });
    session.emit(receipt);
    if let Some(output) = post {
        hooks::post_tool_use(rt, &seen, result.ok, &output, cancel).await;
    }
}

/// The `provider` label of a route: its family's name (a bounded set).
fn provider_label(route: &Route) -> &'static str {
    crate::provider::ProviderKind::parse(route.provider.name()).map_or("other", |k| k.as_str())
}

/// Counts a model call's tokens by provider, model (bounded) and direction.
fn count_tokens(route: &Route, usage: TokenUsage) {
    let provider = provider_label(route);
    let model = metric::model_label(provider, &route.model);
    for (direction, n) in [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_tokens),
        ("cache_write", usage.cache_write_tokens),
    ] {
        if n > 0 {
            metrics::counter!(
                metric::TOKENS,
                "provider" => provider,
                "model" => model.clone(),
                "direction" => direction
            )
            .increment(n);
        }
    }
}

/// The `tool` label of a call: a built-in tool's name, `mcp` for any MCP
/// server's tool, `unknown` for a name no tool has (the model's invention).
fn tool_label(tool: &str) -> &'static str {
    if crate::mcp::names::server_of(tool).is_some() {
        return "mcp";
    }
    // The built-in tools' names, made `'static` once (a fixed, small set).
    static BUILTIN: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let names = BUILTIN.get_or_init(|| {
        tools::definitions()
            .into_iter()
            .map(|d| &*Box::leak(d.name.into_boxed_str()))
            .chain([tools::SPAWN_WORKER])
            .collect()
    });
    names.iter().find(|n| **n == tool).copied().unwrap_or("unknown")
}

/// Counts one settled tool call by tool and outcome.
fn count_tool(tool: &str, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!(metric::TOOL_CALLS, "tool" => tool_label(tool), "outcome" => outcome).increment(1);
}

/// The `pre_tool_use` hooks' say: None to go on, else the tool error
/// (a hook's reason, or the cancellation).
async fn pre_tool_hooks(
    session: &impl TurnContext,
    tool: &str,
    input: &serde_json::Value,
    call_id: &str,
    cancel: &CancellationToken,
) -> Option<String> {
    let call = hooks::Call {
        session_id: session.id(),
        tool,
        input,
        call_id,
    };
    match hooks::pre_tool_use(session.runtime(), &call, cancel).await {
        hooks::Verdict::Proceed => None,
        hooks::Verdict::Blocked(why) => Some(why),
        hooks::Verdict::Cancelled => Some(CANCELLED.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::FailureKind;

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

    use crate::host::hub::Hub;
    use crate::provider::{
        ModelInfo, ModelsFuture, Provider, StopReason, TokenUsage, TurnFuture, TurnOutput,
    };
    use crate::session::live::Session;
    use crate::CoreConfig;
    use std::sync::Arc;

    /// A model that calls one tool while reporting a nearly full context,
    /// answers a compaction request with a summary, then answers in text;
    /// it keeps every request it got.
    #[derive(Default)]
    struct Filling {
        requests: Mutex<Vec<TurnRequest>>,
    }

    impl Provider for Filling {
        fn name(&self) -> &str {
            "filling"
        }
        fn turn<'a>(
            &'a self,
            request: &'a TurnRequest,
            sink: &'a dyn Sink,
            _: &'a CancellationToken,
        ) -> TurnFuture<'a> {
            let n = {
                let mut r = self.requests.lock().unwrap();
                r.push(request.clone());
                r.len()
            };
            let compacting = matches!(request.messages.last(), Some(ChatMessage::User { text, .. }) if text == COMPACT_PROMPT);
            let usage = |input_tokens| TokenUsage {
                input_tokens,
                output_tokens: 10,
                ..TokenUsage::default()
            };
            let out = if compacting {
                sink.send(ProviderEvent::Text(
                    "SUMMARY: the user said go; README.md was read".into(),
                ));
                TurnOutput {
                    usage: usage(850),
                    ..TurnOutput::default()
                }
            } else if n == 1 {
                TurnOutput {
                    tool_calls: vec![ToolCall {
                        id: "toolu_01".into(),
                        name: "read_file".into(),
                        input: serde_json::json!({"path": "README.md"}),
                    }],
                    usage: usage(850),
                    stop: StopReason::ToolUse,
                    status: None,
                }
            } else {
                sink.send(ProviderEvent::Text("done".into()));
                TurnOutput {
                    usage: usage(120),
                    ..TurnOutput::default()
                }
            };
            Box::pin(std::future::ready(Ok(out)))
        }
        fn list_models(&self) -> ModelsFuture<'_> {
            Box::pin(std::future::ready(Ok(vec![ModelInfo {
                id: "filling".into(),
                display_name: "filling".into(),
            }])))
        }
    }

    async fn run_to_end(s: &Arc<Session>, prompt: &str) -> Vec<ClientEvent> {
        let admitted = s.admit(prompt.into(), None).await.unwrap();
        let mut sub = s.subscribe(Some(admitted.after_seq));
        let mut seen = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), sub.recv()).await {
                Ok(Some(crate::stream::delivery::Delivery::Frame(f))) => {
                    seen.push(f.event.clone());
                    if matches!(f.event, ClientEvent::RunFinished { .. }) {
                        return seen;
                    }
                }
                Ok(Some(_)) => {}
                other => panic!("the stream ended or stalled: {:?}", other.is_ok()),
            }
        }
    }

    #[tokio::test]
    async fn a_history_near_the_context_window_is_compacted_and_the_model_continues_from_the_summary() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("README.md"), "hello").unwrap();
        let model = Arc::new(Filling::default());
        let route = Route {
            provider: model.clone(),
            model: "m".into(),
            context_window: Some(1000),
        };
        let hub = Hub::new(CoreConfig::new(home.path().into(), home.path().into()), route).unwrap();
        let s = hub.sessions().create().await.unwrap();
        let seen = run_to_end(&s, "go").await;
        assert!(
            matches!(
                seen.last(),
                Some(ClientEvent::RunFinished {
                    outcome: RunOutcome::Completed,
                    ..
                })
            ),
            "{seen:?}"
        );
        // Clients saw the conversation, never the summary.
        assert!(!seen.iter().any(|e| format!("{e:?}").contains("SUMMARY")));
        let requests = model.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 3, "turn, compaction, turn");
        assert!(
            matches!(requests[1].messages.last(), Some(ChatMessage::User { text, .. }) if text == COMPACT_PROMPT)
        );
        // After it, the model sees the summary instead of what it covers.
        match &requests[2].messages[..] {
            [ChatMessage::User { text, .. }] => {
                assert!(text.starts_with(crate::log::transcript::COMPACTED), "{text}");
                assert!(text.contains("SUMMARY: the user said go"));
            }
            other => panic!("{other:?}"),
        }
        // The compaction is in the ledger: a reloaded session sends the same history.
        let id = s.id().to_string();
        let live = s.transcript();
        hub.shutdown(Duration::from_secs(5)).await;
        drop(s);
        let hub = Hub::new(
            CoreConfig::new(home.path().into(), home.path().into()),
            Route::offline(),
        )
        .unwrap();
        let reloaded = hub.sessions().get(&id).await.unwrap().transcript();
        assert_eq!(reloaded.chat(), live.chat());
        assert_eq!(reloaded.usage.input_tokens, 850 + 850 + 120);
        // Clients still see every message.
        assert_eq!(reloaded.messages.len(), live.messages.len());
        assert!(reloaded.messages.iter().any(|m| m.text == "done"));
    }

    #[tokio::test]
    async fn a_stalled_subscriber_gets_every_byte_of_live_output_in_order_up_to_the_cap() {
        use crate::event::OutputStream;
        let home = tempfile::tempdir().unwrap();
        let mut cfg = CoreConfig::new(home.path().into(), home.path().into());
        cfg.permission = PermissionMode::Allow;
        cfg.bus.queue = 8;
        let hub = Hub::new(cfg, Route::offline()).unwrap();
        let s = hub.sessions().create().await.unwrap();
        // Subscribed before the run and not read until it is over.
        let mut stalled = s.subscribe(Some(0));
        let command = "/bash for i in $(seq 1 3000); do echo \"line $i\"; echo \"err $i\" >&2; done; \
                       head -c 20000000 /dev/zero | tr '\\0' z";
        let seen = run_to_end(&s, command).await;
        let live = |evs: &[ClientEvent], which| -> (String, usize) {
            let mut text = String::new();
            let mut n = 0;
            for e in evs {
                if let ClientEvent::ToolOutput { stream, text: t, .. } = e {
                    if *stream == which {
                        text.push_str(t);
                        n += 1;
                    }
                }
            }
            (text, n)
        };
        let mut late = Vec::new();
        while let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(30), stalled.recv()).await {
            if let crate::stream::delivery::Delivery::Frame(f) = d {
                let done = matches!(f.event, ClientEvent::RunFinished { .. });
                late.push(f.event.clone());
                if done {
                    break;
                }
            }
        }
        let (out, _) = live(&seen, OutputStream::Stdout);
        let (err, _) = live(&seen, OutputStream::Stderr);
        let lines: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
        assert!(out.starts_with(&lines), "stdout in order");
        assert_eq!(err, (1..=3000).map(|i| format!("err {i}\n")).collect::<String>());
        assert_eq!(
            out.len() + err.len(),
            crate::tools::LIVE_CAP + crate::tools::LIVE_STOPPED.len()
        );
        assert!(out.ends_with(crate::tools::LIVE_STOPPED) || err.ends_with(crate::tools::LIVE_STOPPED));
        // The stalled subscriber: the same bytes in the same order.
        let (late_out, late_out_frames) = live(&late, OutputStream::Stdout);
        assert_eq!(late_out, out);
        assert_eq!(live(&late, OutputStream::Stderr).0, err);
        // Merged in its queue or on replay: pieces far larger than the source sends.
        let biggest = late.iter().filter_map(ClientEvent::delta_len).max().unwrap_or(0);
        assert!(
            biggest > 256 * 1024,
            "{late_out_frames} frames, the biggest {biggest} bytes"
        );
        assert!(matches!(late.last(), Some(ClientEvent::RunFinished { .. })));
    }

    #[tokio::test]
    async fn a_leg_that_keeps_calling_tools_stops_at_max_turns() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("a"), "A").unwrap();
        let mut cfg = CoreConfig::new(home.path().into(), home.path().into());
        cfg.max_turns = 2;
        let hub = Hub::new(cfg, Route::offline()).unwrap();
        let s = hub.sessions().create().await.unwrap();
        let seen = run_to_end(&s, "/read a\n/read a\n/read a").await;
        let calls = seen
            .iter()
            .filter(|e| matches!(e, ClientEvent::ToolCall { .. }))
            .count();
        assert_eq!(calls, 2);
        match seen.last() {
            Some(ClientEvent::RunFinished { outcome, message, .. }) => {
                assert_eq!(*outcome, RunOutcome::MaxTurns);
                assert_eq!(message, "stopped after 2 model turns (the max-turns limit)");
            }
            other => panic!("{other:?}"),
        }
    }
}
