//! The agent core: sessions, their event buses, the agent loop, the ledger. It knows nothing of HTTP, gRPC or JSON-over-HTTP.

// What another crate may use is `pub`; everything else is `pub(crate)`, and the
// compiler checks it (a `pub` item no other crate can reach is a warning).
#![warn(unreachable_pub)]

pub mod home;
// The leaf types the core shares with the wire crates (no generated code: vak-proto without `wire`).
pub use vak_proto::{error, ids, text};
pub use vak_proto::{Error, ErrorKind, Result};
pub mod automation;
pub mod background;
pub mod cluster;
pub mod commitment;
pub mod event;
pub mod file_owner;
pub mod finops;
pub mod goal;
pub mod host;
pub mod intent;
#[cfg(test)]
mod lock_scan;
pub mod log;
pub mod mcp;
pub mod metrics_names;
pub mod permissions;
pub mod provider;
pub mod reasons;
pub mod receipt;
pub mod route;
pub mod rule;
pub mod session;
pub(crate) mod stopped;
pub mod stream;
pub mod tools;
pub mod trace;
pub mod worker;
pub(crate) mod workspace;
pub mod zone;

use std::path::PathBuf;
use std::time::Duration;

pub use permissions::PermissionMode;

/// What a published event has survived by the time a client can see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Its batch was written to the kernel: survives a crash of the process.
    Process,
    /// Its batch was also fdatasync'ed: survives a power loss.
    Fsync,
}

/// Everything the core needs to know, fixed at startup.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// The data home: ledgers live in `home/sessions/<id>.jsonl`.
    pub home: PathBuf,
    /// Where tools act; nothing outside it is read or written.
    pub workspace: PathBuf,
    pub bus: stream::bus_config::BusConfig,
    /// The permission mode the server starts in (the live one is the
    /// runtime's: `Runtime::mode`).
    pub permission: PermissionMode,
    /// Whether `bypass` may be chosen (`--allow-bypass`). A server started
    /// in `bypass` allows it too: the command line refuses that start
    /// without the flag.
    pub allow_bypass: bool,
    /// How long a freshly admitted chain waits for a first subscriber.
    pub first_subscriber_wait: Duration,
    /// Internal provider retries before a run fails.
    pub provider_retries: u32,
    /// Transcript search's per-query deadline and concurrent-query cap.
    pub search: host::search::Limits,
    pub retry_backoff: Duration,
    /// Timeouts and bounds of the model service clients the routes use
    /// (connect, response headers, silence between chunks, event sizes).
    pub provider_client: provider::ClientOptions,
    /// Inputs a busy session queues as its next legs; past it, admission is refused.
    pub max_queued_inputs: usize,
    /// The most candidates one best-of-N may run (`--max-bestofn`).
    pub max_bestofn: u32,
    pub durability: Durability,
    /// A loaded session with no run, no subscriber and no other user for
    /// this long is unloaded (its ledger keeps everything).
    pub unload_idle_after: Duration,
    /// Ledger bytes between snapshots of a session's state, at least (they
    /// also grow with the state: see `writer::SnapshotPolicy`).
    pub snapshot_min_bytes: u64,
    /// Model turns one leg may take before it ends with `max_turns` (at
    /// startup: config.toml's `[agent] max_turns` wins unless this came
    /// from `--max-turns`; then it is live state, `Runtime::max_turns`).
    pub max_turns: u32,
    /// Whether `max_turns` came from `--max-turns`.
    pub max_turns_from_flag: bool,
    /// Children a session's `spawn_worker` calls may have running at once
    /// (`--max-workers`).
    pub max_workers: usize,
    /// How long an approval waits for an answer before it expires (the
    /// tool call is then denied and the run goes on); None: forever
    /// (`--approval-timeout`, default 30 min, 0 for never).
    pub approval_timeout: Option<std::time::Duration>,
    /// The output token limit of one model turn.
    pub max_output_tokens: u32,
    /// Sampling temperature; None leaves it to the provider.
    pub temperature: Option<f32>,
    /// The route the flags name (`--provider`, `--model`, `--base-url`).
    pub route_flags: host::config::RouteLayer,
    /// The environment's route variables and API keys, captured at startup.
    pub env: host::config::Environment,
    /// Sessions' logs in NATS JetStream (`--bus`, whose stream exists:
    /// `jetstream::ensure_stream`); None: JSONL ledgers in the home.
    pub nats: Option<async_nats::Client>,
    /// With `nats`: this replica's session leases (`owners.rs`), so several
    /// replicas can share the stream. None: one replica, no leases.
    pub owners: Option<std::sync::Arc<cluster::owners::Owners>>,
    /// With `nats`: the session index every replica shares (`shared_index.rs`).
    pub shared_index: Option<std::sync::Arc<cluster::shared_index::SharedIndex>>,
    /// With `nats`: the route, rules and keys every replica shares (`shared_config.rs`).
    pub shared_config: Option<std::sync::Arc<cluster::shared_config::SharedConfig>>,
    /// With `nats`: the bucket where a replica claims a task's slot before
    /// it fires it (`shared_tasks.rs`).
    pub task_claims: Option<async_nats::jetstream::kv::Store>,
    /// With `nats`: the memory notes every replica shares (`shared_memory.rs`).
    pub shared_memory: Option<std::sync::Arc<cluster::shared_memory::SharedMemory>>,
    /// `[server] workspace_roots`: the folders `GET /fs/dirs` may list
    /// (absolute). Empty: the workspace alone.
    pub workspace_roots: Vec<PathBuf>,
    /// The git program `GET /sessions/:id/diff` runs (found on PATH by default).
    pub git: PathBuf,
    /// The GitHub CLI `GET /sessions/:id/pr` and its merge run: a bare name
    /// is looked up on the server's PATH (`gh` by default).
    pub gh: PathBuf,
    /// The sandbox the agent's commands run in (`--sandbox`, `[sandbox]`).
    pub sandbox: tools::sandbox::SandboxConfig,
}

impl CoreConfig {
    pub fn new(home: PathBuf, workspace: PathBuf) -> Self {
        CoreConfig {
            home,
            workspace,
            bus: stream::bus_config::BusConfig::default(),
            permission: PermissionMode::Default,
            allow_bypass: false,
            first_subscriber_wait: Duration::from_secs(2),
            provider_retries: 4,
            search: host::search::Limits::default(),
            retry_backoff: Duration::from_millis(500),
            provider_client: provider::ClientOptions::default(),
            max_queued_inputs: 64,
            max_bestofn: 4,
            durability: Durability::Process,
            unload_idle_after: Duration::from_secs(300),
            snapshot_min_bytes: 8 << 20,
            max_turns: 50,
            max_turns_from_flag: false,
            max_workers: 4,
            approval_timeout: Some(std::time::Duration::from_secs(30 * 60)),
            max_output_tokens: 8192,
            temperature: None,
            route_flags: host::config::RouteLayer::default(),
            env: host::config::Environment::default(),
            nats: None,
            owners: None,
            shared_index: None,
            shared_config: None,
            task_claims: None,
            shared_memory: None,
            workspace_roots: Vec::new(),
            git: PathBuf::from("git"),
            gh: PathBuf::from("gh"),
            sandbox: tools::sandbox::SandboxConfig::default(),
        }
    }

    /// The folders `GET /fs/dirs` may list: the configured roots, else the workspace.
    pub fn dir_roots(&self) -> Vec<PathBuf> {
        if self.workspace_roots.is_empty() {
            vec![self.workspace.clone()]
        } else {
            self.workspace_roots.clone()
        }
    }

    pub fn sessions_dir(&self) -> PathBuf {
        self.home.join("sessions")
    }
}
