//! The model seam: a streaming chat turn that yields text, thinking and tool calls. The agent loop talks to models only through `Provider`.

pub mod offline;

use super::transcript::Message;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use tokio_util::sync::CancellationToken;

/// Streamed output of one provider turn.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderEvent {
    Text(String),
    Thinking(String),
}

/// A tool the model asks the runtime to run.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tool: String,
    pub input: Value,
}

/// What a turn ends with: the tool calls to run (none: the answer is complete) and its token usage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnOutput {
    pub tool_calls: Vec<ToolRequest>,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ProviderError {
    /// The turn was cancelled.
    Cancelled,
    /// The provider failed; the runtime may retry.
    Failed(String),
}

/// Where a turn streams to. `ready` is the consumer's backpressure: a
/// provider that produces fast awaits it between chunks of output.
pub trait Sink: Send + Sync {
    fn send(&self, event: ProviderEvent);
    fn ready(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// A plain closure is a sink that is always ready (tests, collectors).
impl<F: Fn(ProviderEvent) + Send + Sync> Sink for F {
    fn send(&self, event: ProviderEvent) {
        self(event)
    }
    fn ready(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}

pub type TurnFuture<'a> = Pin<Box<dyn Future<Output = Result<TurnOutput, ProviderError>> + Send + 'a>>;

/// A model. `turn` answers the conversation so far (the last user message
/// and what followed it), streaming through `sink` as it goes.
pub trait Provider: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn turn<'a>(
        &'a self,
        history: &'a [Message],
        sink: &'a dyn Sink,
        cancel: &'a CancellationToken,
    ) -> TurnFuture<'a>;
}
