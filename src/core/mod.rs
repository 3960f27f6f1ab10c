//! The agent core: sessions, their event buses, the agent loop, the ledger. It knows nothing of HTTP, gRPC or JSON-over-HTTP.

pub mod agent;
pub mod approvals;
pub mod bus;
pub mod cursor;
pub mod deltas;
pub mod event;
pub mod hub;
pub mod index;
pub mod ledger;
pub mod mux;
pub mod presentation;
pub mod provider;
pub mod session;
pub mod tools;
pub mod transcript;
pub mod workspace;

use std::path::PathBuf;
use std::time::Duration;

/// What a tool call that needs permission does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PermissionMode {
    /// Ask the clients (approval_requested) and wait for an answer.
    Ask,
    /// Run it without asking.
    Allow,
    /// Refuse it without asking.
    Deny,
}

/// Everything the core needs to know, fixed at startup.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// The data home: ledgers live in `home/sessions/<id>.jsonl`.
    pub home: PathBuf,
    /// Where tools act; nothing outside it is read or written.
    pub workspace: PathBuf,
    pub bus: bus::BusConfig,
    pub permission: PermissionMode,
    /// How long a freshly admitted chain waits for a first subscriber.
    pub first_subscriber_wait: Duration,
    /// Internal provider retries before a run fails.
    pub provider_retries: u32,
    pub retry_backoff: Duration,
    /// Inputs a busy session queues as its next legs; past it, admission is refused.
    pub max_queued_inputs: usize,
}

impl CoreConfig {
    pub fn new(home: PathBuf, workspace: PathBuf) -> Self {
        CoreConfig {
            home,
            workspace,
            bus: bus::BusConfig::default(),
            permission: PermissionMode::Ask,
            first_subscriber_wait: Duration::from_secs(2),
            provider_retries: 2,
            retry_backoff: Duration::from_millis(50),
            max_queued_inputs: 64,
        }
    }

    pub fn sessions_dir(&self) -> PathBuf {
        self.home.join("sessions")
    }
}
