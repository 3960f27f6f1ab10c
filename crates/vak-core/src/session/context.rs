//! What a model turn needs from its live session (publish and pace, the history, approvals, the runtime), as a trait the live session implements: the agent loop and side chat take it instead of importing live.rs.

use crate::error::Result;
use crate::event::{AgentEvent, ClientEvent};
use crate::log::transcript::Transcript;
use crate::session::approvals::Approvals;
use crate::session::runtime::Runtime;
use std::future::Future;

/// A session as a leg of the agent loop or a side turn sees it.
pub(crate) trait TurnContext: Send + Sync {
    /// The session's id (for logs).
    fn id(&self) -> &str;

    fn runtime(&self) -> &Runtime;

    /// Routes an agent event to the session's writer; never waits.
    fn emit(&self, event: AgentEvent);

    fn publish(&self, event: ClientEvent) {
        self.emit(AgentEvent::Client(event));
    }

    /// Waits while the writer is far behind what was published.
    fn pace(&self) -> impl Future<Output = ()> + Send + '_;

    /// Resolves once everything published so far is durable and visible.
    fn flush(&self) -> impl Future<Output = Result<()>> + Send + '_;

    /// The history as folded so far.
    fn transcript(&self) -> Transcript;

    fn approvals(&self) -> &Approvals;

    /// The session's slots for running `spawn_worker` children
    /// (`--max-workers` of them).
    fn worker_slots(&self) -> &std::sync::Arc<tokio::sync::Semaphore>;

    /// Carries out update_plan (`session/plan.rs`): the plan in words once
    /// its commitment events are folded, or why the call was refused.
    fn update_plan<'a>(
        &'a self,
        input: &'a serde_json::Value,
    ) -> impl Future<Output = std::result::Result<String, String>> + Send + 'a;

    /// What the session's last model-call receipt stored of its request:
    /// the next stores only what changed.
    fn prompt_base(&self) -> &std::sync::Mutex<crate::receipt::PromptBase>;
}
