//! The model seam: one streaming chat turn (system prompt, history, tool definitions in; text, thinking and assembled tool calls out). The agent loop talks to models only through `Provider`.

pub(crate) mod anthropic;
pub mod http;
pub(crate) mod offline;
pub(crate) mod openai;

pub use http::ClientOptions;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The name prefix of a promoted skill's tool, `skill__<name>` (the offline
/// model reads a skill's slash line by it).
pub(crate) const SKILL_TOOL_PREFIX: &str = "skill__";

/// A tool as the model sees it: its input is described by a JSON Schema.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// One block of the model's reasoning, with the provider's signature over it
/// (Anthropic refuses a history whose thinking lost its signature).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Thinking {
    pub text: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

/// A tool call as the model made it. `id` is the provider's own id (a
/// `toolu_…` or `call_…`); the tool result sent back must carry it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Value,
}

/// One message of the history a turn answers.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatMessage {
    /// What the user sent: text, and the images attached to it.
    User { text: String, images: Vec<Image> },
    /// What the model said in one turn: its reasoning, then its text, then
    /// the tools it called.
    Assistant {
        thinking: Vec<Thinking>,
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call (consecutive results belong together:
    /// Anthropic sends them as one user message).
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
    },
}

/// An image of a user message: `data` is its bytes as base64, filled in
/// from the home (`attachments::load`) just before a request is sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    pub sha256: String,
    pub media_type: String,
    pub data: String,
}

/// Everything one turn needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnRequest {
    pub model: String,
    pub system: String,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolDef>,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
}

/// Streamed output of one provider turn.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderEvent {
    Text(String),
    Thinking(String),
    /// The signature that closes the current thinking block.
    ThinkingSignature(String),
}

/// Tokens one turn consumed, as the provider reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl TokenUsage {
    pub fn add(&mut self, other: TokenUsage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    /// It answered (also: an empty or unknown finish reason).
    #[default]
    EndTurn,
    /// It called tools and waits for their results.
    ToolUse,
    /// It hit the output token limit.
    MaxTokens,
    /// It refused.
    Refusal,
    /// The provider's content filter stopped it.
    ContentFilter,
}

/// What a turn ends with: the tool calls to run (none: the answer is complete), usage and why it stopped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnOutput {
    pub tool_calls: Vec<ToolCall>,
    pub usage: TokenUsage,
    pub stop: StopReason,
    /// The HTTP status the service answered with (None: not over HTTP).
    pub status: Option<u16>,
}

/// What kind of failure a provider hit: each has one fixed human message,
/// what `run_finished` says when retries run out (the raw error goes to the
/// log only: it can carry request ids, account names, even echoed input).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The key was refused (401, 403).
    Auth,
    /// Too many requests (429).
    RateLimit,
    /// The service is overloaded (529, overloaded_error, 503).
    Overloaded,
    /// The conversation does not fit the model's context window.
    ContextTooLong,
    /// Could not connect, the connection broke, or the service went silent.
    Network,
    /// The service answered something that is not a valid response (a 4xx
    /// other than the above, a 5xx, malformed JSON or SSE).
    BadResponse,
    /// No model is configured for this provider or no key is reachable.
    NotConfigured,
    /// The service answered a redirect (this 3xx status). vak follows none:
    /// the key travels in a header, and a redirect to another origin would
    /// carry it there (see `http::client`).
    Redirect(u16),
    /// The offline model's `/fail MSG` directive: its message is the user's own text.
    Directive(String),
}

impl FailureKind {
    /// The kind's snake_case name: an error's `reason`, a receipt's `failure`,
    /// a bounded metric label (`vak_provider_retries_total`).
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureKind::NotConfigured => "not_configured",
            FailureKind::Auth => "auth",
            FailureKind::RateLimit => "rate_limit",
            FailureKind::Overloaded => "overloaded",
            FailureKind::ContextTooLong => "context_too_long",
            FailureKind::Network => "network",
            FailureKind::BadResponse => "bad_response",
            FailureKind::Redirect(_) => "redirect",
            FailureKind::Directive(_) => "directive",
        }
    }

    pub fn message(&self) -> String {
        match self {
            FailureKind::Auth => "the model service refused the API key".into(),
            FailureKind::RateLimit => "the model service is rate limiting requests; try again later".into(),
            FailureKind::Overloaded => "the model service is overloaded; try again later".into(),
            FailureKind::ContextTooLong => {
                "the conversation is too long for the model's context window".into()
            }
            FailureKind::Network => "could not reach the model service".into(),
            FailureKind::BadResponse => "the model service sent an invalid response".into(),
            FailureKind::NotConfigured => "no model service is configured (no API key)".into(),
            FailureKind::Redirect(status) => format!(
                "the model service answered with a redirect (HTTP {status}); vak follows no redirects from a model service: set the base URL to the address the service answers at"
            ),
            FailureKind::Directive(msg) => format!("the model failed: {msg}"),
        }
    }
}

/// Why a model service could not be reached, as far as the transport
/// says (from the error's kind, never its text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetCause {
    /// Nothing listens at the address.
    Refused,
    /// The connection was reset or closed before the answer was complete.
    Closed,
    /// Connecting, or waiting for the answer, took too long.
    TimedOut,
    /// The answer's stream went silent.
    Stalled,
    /// Some other failure to connect (a name that does not resolve, TLS).
    NoConnection,
}

impl NetCause {
    /// Words for a person, e.g. after "could not reach … (".
    pub fn words(self) -> &'static str {
        match self {
            NetCause::Refused => "connection refused",
            NetCause::Closed => "the connection was closed",
            NetCause::TimedOut => "timed out",
            NetCause::Stalled => "the answer stalled",
            NetCause::NoConnection => "could not connect",
        }
    }
}

/// One failed attempt at a turn.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub kind: FailureKind,
    /// The raw error, for the log only.
    pub detail: String,
    /// Whether trying the same request again may succeed.
    pub retryable: bool,
    /// How long the service asked us to wait before trying again.
    pub retry_after: Option<Duration>,
    /// For a `Network` failure: why, when the transport says.
    pub cause: Option<NetCause>,
    /// The HTTP status the service answered with, when it answered (an
    /// error status, or the 2xx of a stream that broke afterwards).
    pub status: Option<u16>,
}

impl Failure {
    pub fn new(kind: FailureKind, detail: impl Into<String>, retryable: bool) -> Self {
        Failure {
            kind,
            detail: detail.into(),
            retryable,
            retry_after: None,
            cause: None,
            status: None,
        }
    }

    /// The same failure, answered with HTTP `status` (kept if already set).
    pub fn with_status(mut self, status: u16) -> Self {
        self.status.get_or_insert(status);
        self
    }

    /// The same failure, knowing why the service was not reached.
    pub fn with_cause(mut self, cause: Option<NetCause>) -> Self {
        self.cause = cause;
        self
    }

    /// What `run_finished` says when retries run out: the kind's message,
    /// naming the service's `host` (`HOST:PORT`, never a path or key) when
    /// it could not be reached.
    pub fn message_at(&self, host: Option<&str>) -> String {
        match (&self.kind, host) {
            (FailureKind::Network, Some(h)) => format!("could not reach the model service at {h}"),
            _ => self.kind.message(),
        }
    }

    /// What a `status.retrying.reason` says before the next attempt: what
    /// failed, naming the service's `host` and, when unreachable, why.
    pub fn retry_reason(&self, host: Option<&str>) -> String {
        let service = match host {
            Some(h) => format!("the model service at {h}"),
            None => "the model service".to_string(),
        };
        match self.kind {
            FailureKind::Network => match self.cause {
                Some(c) => format!("could not reach {service} ({})", c.words()),
                None => format!("could not reach {service}"),
            },
            FailureKind::RateLimit => format!("{service} is rate limiting requests"),
            FailureKind::Overloaded => format!("{service} is overloaded"),
            FailureKind::BadResponse => format!("{service} sent an invalid response"),
            _ => self.kind.message(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ProviderError {
    /// The turn was cancelled.
    Cancelled,
    /// The attempt failed; the agent loop decides whether to retry.
    Failed(Failure),
}

/// A turn's result once the service answered with HTTP `status`: the
/// output, or the failure that came after the answer began, says so.
pub(crate) fn answered(
    result: Result<TurnOutput, ProviderError>,
    status: u16,
) -> Result<TurnOutput, ProviderError> {
    match result {
        Ok(mut out) => {
            out.status = Some(status);
            Ok(out)
        }
        Err(ProviderError::Failed(f)) => Err(ProviderError::Failed(f.with_status(status))),
        Err(other) => Err(other),
    }
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

/// A model listed by a provider.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub id: String,
    pub display_name: String,
}

pub type ModelsFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<ModelInfo>, Failure>> + Send + 'a>>;

/// A model service. `turn` is one attempt: it answers `request` once,
/// streaming through `sink` as it goes; retrying is the agent loop's job.
pub trait Provider: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn turn<'a>(
        &'a self,
        request: &'a TurnRequest,
        sink: &'a dyn Sink,
        cancel: &'a CancellationToken,
    ) -> TurnFuture<'a>;
    /// The models this provider's key can reach, asked live.
    fn list_models(&self) -> ModelsFuture<'_>;
    /// Where the service is, as `HOST:PORT` (no scheme, path or key), for
    /// messages a person reads; None for a model with no address.
    fn host(&self) -> Option<String> {
        None
    }
    /// Whether the service answers at all within `timeout`: its models
    /// listing asked once, any HTTP status counting as an answer. A
    /// model with no address always answers.
    fn probe(&self, timeout: Duration) -> ProbeFuture<'_> {
        let _ = timeout;
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What `Provider::probe` found: Err when nothing answered (a `Network` failure).
pub type ProbeFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send + 'a>>;

/// The provider families vak speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// The embedded offline echo model (no key, no network).
    Offline,
    /// OpenAI Chat Completions and every server that speaks it by base URL
    /// (vLLM, llama.cpp's server, Ollama, LM Studio).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] = [
        ProviderKind::Offline,
        ProviderKind::OpenAi,
        ProviderKind::Anthropic,
    ];

    /// The name in flags, config and URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Offline => "offline",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    pub fn parse(name: &str) -> Option<ProviderKind> {
        ProviderKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The name everyday screens show.
    pub fn label(self) -> &'static str {
        match self {
            ProviderKind::Offline => "Offline echo model",
            ProviderKind::OpenAi => "OpenAI-compatible",
            ProviderKind::Anthropic => "Anthropic",
        }
    }

    /// The context window vak assumes for this family's models, in tokens:
    /// every current Claude model has 200k. OpenAI-compatible servers range
    /// from 2k (a local llama.cpp) to 1M, so none is assumed: their
    /// context-length error triggers the compaction instead.
    pub fn context_window(self) -> Option<u64> {
        match self {
            ProviderKind::Anthropic => Some(200_000),
            ProviderKind::Offline | ProviderKind::OpenAi => None,
        }
    }

    /// The environment variable a key may come from.
    pub fn key_env(self) -> Option<&'static str> {
        match self {
            ProviderKind::Offline => None,
            ProviderKind::OpenAi => Some("OPENAI_API_KEY"),
            ProviderKind::Anthropic => Some("ANTHROPIC_API_KEY"),
        }
    }
}

/// How to reach one provider: its kind, an optional base URL (None: the
/// service's own) and its key (None: keyless, e.g. a local llama.cpp).
#[derive(Clone)]
pub struct Endpoint {
    pub kind: ProviderKind,
    pub base_url: Option<String>,
    pub key: Option<Secret>,
}

/// An API key. Its Debug never shows it; only the provider clients read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(key: String) -> Secret {
        Secret(key)
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// A provider client for `endpoint`, with the default timeouts and bounds.
pub fn connect(endpoint: &Endpoint) -> Result<std::sync::Arc<dyn Provider>, Failure> {
    connect_with(endpoint, &http::ClientOptions::default())
}

/// A provider client for `endpoint` with its own timeouts and bounds (each
/// HTTP provider holds one connection pool).
pub fn connect_with(
    endpoint: &Endpoint,
    options: &http::ClientOptions,
) -> Result<std::sync::Arc<dyn Provider>, Failure> {
    let base = endpoint.base_url.as_deref().filter(|b| !b.trim().is_empty());
    match endpoint.kind {
        ProviderKind::Offline => Ok(std::sync::Arc::new(offline::OfflineModel)),
        ProviderKind::OpenAi => Ok(std::sync::Arc::new(openai::OpenAi::new(
            base,
            endpoint.key.clone(),
            options.clone(),
        )?)),
        ProviderKind::Anthropic => Ok(std::sync::Arc::new(anthropic::Anthropic::new(
            base,
            endpoint.key.clone(),
            options.clone(),
        )?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_failure_names_the_host_and_a_retry_says_why() {
        let refused = Failure::new(
            FailureKind::Network,
            "connect error: tcp connect error: os error 111",
            true,
        )
        .with_cause(Some(NetCause::Refused));
        let host = Some("127.0.0.1:9");
        assert_eq!(
            refused.message_at(host),
            "could not reach the model service at 127.0.0.1:9"
        );
        assert_eq!(
            refused.retry_reason(host),
            "could not reach the model service at 127.0.0.1:9 (connection refused)"
        );
        // No address (the offline model, a test's provider): as before.
        assert_eq!(refused.message_at(None), "could not reach the model service");
        assert_eq!(
            refused.retry_reason(None),
            "could not reach the model service (connection refused)"
        );
        // A cause the transport did not name: no parenthesis.
        let cut = Failure::new(FailureKind::Network, "connection closed", true);
        assert_eq!(
            cut.retry_reason(host),
            "could not reach the model service at 127.0.0.1:9"
        );
        // A retry is under way: no "try again later" in its reason.
        let busy = Failure::new(FailureKind::RateLimit, "HTTP 429", true);
        assert_eq!(
            busy.retry_reason(Some("api.openai.com:443")),
            "the model service at api.openai.com:443 is rate limiting requests"
        );
        assert_eq!(
            busy.message_at(Some("api.openai.com:443")),
            FailureKind::RateLimit.message(),
            "only an unreachable service's final message names the host"
        );
        let fail = Failure::new(FailureKind::Directive("boom".into()), "boom", true);
        assert_eq!(fail.retry_reason(host), "the model failed: boom");
        // Never the raw detail.
        assert!(!refused.retry_reason(host).contains("os error"));
    }
}
