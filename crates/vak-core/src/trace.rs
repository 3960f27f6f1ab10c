//! The spans the core's work is traced by (`run`, `model_call`, `tool_call`, `ledger_commit`; the edge adds `request`): one target, listened to only by the OTLP exporter's layer, so without `--otlp-endpoint` each costs a disabled callsite's check.

/// The `tracing` target of every span meant for the OTLP exporter; the log
/// lines' filter turns it off, so spans never change what the log shows.
pub const TARGET: &str = "vak::trace";

/// A count as a span attribute: OpenTelemetry's integers are i64, and the
/// bridge would record a u64 as text.
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How a tool call ended, as its `tool_call` span's `outcome` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ToolOutcome {
    /// The tool ran and succeeded.
    Ok,
    /// The tool ran and failed.
    Error,
    /// It never ran: the permission mode, a denial, an expired approval or the workspace check.
    Refused,
    /// A `pre_tool_use` hook blocked it.
    Blocked,
}

impl ToolOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::Refused => "refused",
            ToolOutcome::Blocked => "blocked",
        }
    }
}

/// One model call's `model_call` span (provider, model, attempts, tokens):
/// made before its first attempt and ended when it settles or the leg ends
/// without it (failed, cancelled), its attempts recorded either way.
pub(crate) struct ModelCall {
    span: tracing::Span,
    attempts: u32,
    usage: Option<crate::provider::TokenUsage>,
}

impl ModelCall {
    /// Under the current span (the run's).
    pub(crate) fn start(provider: &str, model: &str) -> ModelCall {
        ModelCall {
            span: tracing::info_span!(
                target: TARGET,
                "model_call",
                provider,
                model,
                attempts = tracing::field::Empty,
                input_tokens = tracing::field::Empty,
                output_tokens = tracing::field::Empty,
            ),
            attempts: 0,
            usage: None,
        }
    }

    /// Another attempt is being made.
    pub(crate) fn attempt(&mut self) {
        self.attempts += 1;
    }

    /// The call answered with `usage`; the span ends here.
    pub(crate) fn settled(mut self, usage: crate::provider::TokenUsage) {
        self.usage = Some(usage);
    }
}

impl Drop for ModelCall {
    fn drop(&mut self) {
        self.span.record("attempts", i64::from(self.attempts));
        if let Some(u) = self.usage {
            self.span.record("input_tokens", int(u.input_tokens));
            self.span.record("output_tokens", int(u.output_tokens));
        }
    }
}
