//! Background results: what work done without a person watching hands to a session, delivered when the session is idle.

use serde::{Deserialize, Serialize};

/// Where a background result came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundSource {
    Task,
    Script,
    Budget,
    Worker,
}

impl BackgroundSource {
    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundSource::Task => "task",
            BackgroundSource::Script => "script",
            BackgroundSource::Budget => "budget",
            BackgroundSource::Worker => "worker",
        }
    }
}

/// Why a background result is an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundReason {
    ScriptFailed,
    ScriptTimeout,
    #[serde(rename = "budget_80")]
    Budget80,
    #[serde(rename = "budget_100")]
    Budget100,
}

impl BackgroundReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundReason::ScriptFailed => "script_failed",
            BackgroundReason::ScriptTimeout => "script_timeout",
            BackgroundReason::Budget80 => "budget_80",
            BackgroundReason::Budget100 => "budget_100",
        }
    }
}

/// One result on its way to a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackgroundResult {
    /// Its own id, "bg_" and 12 hex digits: what exactly-once delivery keys on.
    pub result_id: String,
    pub source: BackgroundSource,
    /// What it came from: a task id, or "budget:<date>:<level>".
    pub id: String,
    pub text: String,
    /// Why it is an alert; None when it is not one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BackgroundReason>,
    /// RFC 3339, UTC.
    pub arrived_at: String,
}

impl BackgroundResult {
    /// A new result with a fresh id, arriving now.
    pub fn new(source: BackgroundSource, id: String, text: String, reason: Option<BackgroundReason>) -> Self {
        BackgroundResult {
            result_id: format!("bg_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            source,
            id,
            text,
            reason,
            arrived_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        }
    }

    pub fn alert(&self) -> bool {
        self.reason.is_some()
    }
}

/// Where background results go: the host's sessions (`Hub`), or a test's
/// recorder. `deliver` returns once the result is durable in the session's
/// ledger (it is shown later, when the session is idle).
pub trait BackgroundSink: Send + Sync + 'static {
    fn deliver(
        &self,
        session_id: &str,
        result: BackgroundResult,
    ) -> futures_util::future::BoxFuture<'_, crate::Result<()>>;
}
