//! The `vak` command line: `vak serve` parses its flags into a `ServeConfig`, binds, announces itself and runs until SIGINT or SIGTERM; `vak term` is the client in `term/`.

use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use vak_core::error::{Error, Result};
use vak_core::home;
use vak_core::host::config::{self, Environment, FileConfig, RouteLayer};
use vak_core::provider::ProviderKind;
use vak_core::tools::sandbox::{SandboxConfig, SandboxMode};
use vak_core::{CoreConfig, Durability, PermissionMode};
use vak_server::server::{ServeConfig, Server};
use vak_server::tls;

#[derive(Parser, Debug)]
#[command(name = "vak", version, about = "A server for AI coding agents")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at startup: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the agent over gRPC, gRPC-web and REST/SSE on one port.
    Serve(ServeArgs),
    /// A terminal client of a running server: an interactive prompt, or one run with -p.
    Term(vak_term::TermArgs),
    /// Print the bearer token: the running server's (its server.json), else the one kept in the home.
    Token(crate::open::TokenArgs),
    /// Open /app in the browser, logged in through a one-time link (it works once, within 60 s).
    Open(crate::open::OpenArgs),
    /// Check the running server's health (GET /doctor); exits 1 when a check fails.
    Doctor(crate::doctor::DoctorArgs),
    /// Copy a stopped home out to a directory (export) or back in (import).
    Backup(crate::backup::BackupArgs),
}

/// `--permission-mode`; `ask`, `allow` and `deny`, its values before modes
/// existed, are aliases of `default`, `bypass` and `plan`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PermissionArg {
    #[value(alias = "ask")]
    Default,
    AcceptEdits,
    #[value(alias = "deny")]
    Plan,
    #[value(alias = "allow")]
    Bypass,
}

/// `--sandbox`: how much of the machine the agent's commands may touch
/// (docs/security.md, "The command sandbox").
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SandboxArg {
    WorkspaceWrite,
    ReadOnly,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DurabilityArg {
    Process,
    Fsync,
}

#[derive(Parser, Debug)]
pub struct ServeArgs {
    /// Address to listen on (IP:PORT or localhost:PORT); loopback unless
    /// --allow-remote. Port 0 picks a free port.
    #[arg(long, env = "VAK_LISTEN", default_value = "127.0.0.1:8901", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Allow a non-loopback --listen address (use TLS with it).
    #[arg(long)]
    pub allow_remote: bool,
    /// A host name the Host header may carry besides loopback (repeatable;
    /// also `[server] trusted_hosts` in the home's config.toml).
    #[arg(long = "trusted-host", value_name = "HOST")]
    pub trusted_hosts: Vec<String>,
    /// An origin allowed to call the server from a browser, e.g. an IDE
    /// webview (repeatable; also `[server] allow_origins` in config.toml).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// PEM certificate chain for TLS (with --tls-key).
    #[arg(long, requires = "tls_key", conflicts_with = "tls_self_signed")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (with --tls-cert).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve TLS with a development certificate made once in the home.
    #[arg(long)]
    pub tls_self_signed: bool,
    /// Streams (SSE or gRPC) open at once, in total.
    #[arg(long, default_value_t = 16384)]
    pub max_streams: usize,
    /// Streams open at once from one client address.
    #[arg(long, default_value_t = 256)]
    pub max_streams_per_client: usize,
    /// Connections open at once; more are closed as soon as they are
    /// accepted. Default: three quarters of the open-files limit (raised to
    /// its hard limit at startup), at most 65536.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// Also serve `GET /metrics` (Prometheus) without a token on this
    /// loopback address (IP:PORT or localhost:PORT); on the main port it
    /// always needs the token.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub metrics_listen: Option<SocketAddr>,
    /// How long a new connection may take to send its first request head
    /// (any protocol), and an HTTP/1.1 client any request's headers.
    #[arg(long, default_value = "10s", value_parser = parse_timeout)]
    pub header_read_timeout: std::time::Duration,
    /// How long a connection may stay open with no request in flight
    /// (HTTP/1.1 keep-alive, HTTP/2 with no open stream).
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    pub idle_timeout: std::time::Duration,
    /// How long a request body may take to arrive after its headers.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    pub body_read_timeout: std::time::Duration,
    /// The data home (ledgers, server.json).
    #[arg(long, env = "VAK_HOME")]
    pub home: Option<PathBuf>,
    /// The bearer token. Default: the one kept in the home's `token` file
    /// (made at random on first start, mode 0600), so restarts keep clients'
    /// credentials valid.
    #[arg(long, env = "VAK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Replace the home's kept token with a new random one before serving.
    #[arg(long, conflicts_with = "token")]
    pub rotate_token: bool,
    /// Where tools act. Defaults to the current directory.
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Work in `<home>/workspace` (made on first use) instead of the
    /// current directory: `make serve` does, so the agent never writes into
    /// the vak checkout.
    #[arg(long, conflicts_with = "workspace")]
    pub home_workspace: bool,
    /// Print the token and a one-time login link for /app at startup (the
    /// link works once, within 60 s).
    #[arg(long)]
    pub print_token: bool,
    /// Frames each session keeps for replay.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub ring: u64,
    /// The most memory all sessions' replay rings together may hold (MiB);
    /// past it a session's ring keeps fewer frames (at least 64), and older
    /// cursors replay from the ledger on disk.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_ring_mib: u64,
    /// Inputs (runs, steering) a busy session queues as its next legs; past
    /// it, admission answers 429 / RESOURCE_EXHAUSTED (`queue_full`).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_queued_inputs: u64,
    /// The most candidates one best-of-N may run (`POST /sessions/:id/bestofn`'s `n`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=16))]
    pub max_bestofn: u32,
    /// How long a freshly started run waits for a first subscriber when
    /// nobody is watching its session (0: start at once; a client can then
    /// subscribe with `after` = the admission's `after_seq`).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub first_subscriber_wait_ms: u64,
    /// What a published event has survived when a client sees it: `process`
    /// (its ledger batch reached the kernel: survives a crash of vak) or
    /// `fsync` (fdatasync per batch: survives a power loss, slower).
    #[arg(long, value_enum, default_value = "process")]
    pub durability: DurabilityArg,
    /// Keep sessions' logs in NATS JetStream at this URL (`nats://host:port`,
    /// several comma-separated) instead of JSONL ledgers in the home: a
    /// session is then loaded from the stream by any server pointed at it
    /// (docs/scale-out.md; one replica at a time for now).
    /// Credentials may be in the URL (`nats://user:password@host:4222`, a
    /// token as `nats://token@host:4222`) or in the --bus-* flags below; vak
    /// shows the URL with the password or token as `***`.
    #[arg(long, value_name = "URL")]
    pub bus: Option<String>,
    /// The NATS user of --bus (with --bus-password).
    #[arg(long, env = "VAK_BUS_USER", value_name = "USER")]
    pub bus_user: Option<String>,
    /// The NATS password of --bus-user; better given as VAK_BUS_PASSWORD than
    /// on the command line, where other local users can read it (`ps`).
    #[arg(
        long,
        env = "VAK_BUS_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub bus_password: Option<String>,
    /// A NATS token for --bus; better given as VAK_BUS_TOKEN.
    #[arg(long, env = "VAK_BUS_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub bus_token: Option<String>,
    /// A NATS credentials file (`.creds`: a user JWT and its NKey seed,
    /// as `nsc` writes it), owner-only.
    #[arg(long, requires = "bus", value_name = "PATH")]
    pub bus_creds: Option<std::path::PathBuf>,
    /// A file (owner-only) holding a NATS user NKey seed (`SU…`).
    #[arg(long, requires = "bus", value_name = "PATH")]
    pub bus_nkey: Option<std::path::PathBuf>,
    /// The CA certificate(s) (PEM) that sign the NATS servers' certificates;
    /// given (or with --bus-tls-cert), every connection to --bus is TLS (a
    /// `tls://` URL asks for it too, trusting the system's CAs).
    #[arg(long, requires = "bus", value_name = "PATH")]
    pub bus_tls_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for NATS servers that verify clients (with --bus-tls-key).
    #[arg(long, requires = "bus", value_name = "PATH")]
    pub bus_tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --bus-tls-cert.
    #[arg(long, requires = "bus", value_name = "PATH")]
    pub bus_tls_key: Option<std::path::PathBuf>,
    /// Replicas of the JetStream stream when --bus creates it (3 on a cluster).
    #[arg(long, default_value_t = 1, requires = "bus", value_parser = clap::value_parser!(u64).range(1..=5))]
    pub bus_replicas: u64,
    /// How long a replica's lease on a session lasts unless renewed (it is
    /// renewed every third of it), when --bus creates the bucket VAK_OWNERS;
    /// a crashed replica's sessions move to another after at most this long.
    #[arg(long, default_value_t = 10_000, requires = "bus", value_parser = clap::value_parser!(u64).range(300..=600_000))]
    pub bus_lease_ttl_ms: u64,
    /// This replica's name among those sharing --bus (default: `r_` and 12
    /// random hex digits, new at each start).
    #[arg(long, requires = "bus")]
    pub bus_replica: Option<String>,
    /// A file (owner-only) holding the cluster secret, at least 32 bytes,
    /// the same on every replica sharing --bus: provider keys stored with
    /// PUT /config/key are sealed with it in the bucket VAK_CONFIG and
    /// usable on every replica. Without it, keys are not shared (PUT and
    /// DELETE /config/key answer 403 no_bus_secret).
    #[arg(long, requires = "bus", value_name = "PATH")]
    pub bus_secret_file: Option<std::path::PathBuf>,
    /// Seconds after which a session with no run, no stream and no request
    /// is unloaded from memory (its ledger keeps everything; the next use
    /// loads it again).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub unload_idle_after: u64,
    /// The most memory all stream subscribers together may hold (MiB):
    /// queued frames and encoded frames not yet written to their
    /// connections; a subscriber past it resumes from its cursor instead of growing.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_queued_mib: u64,
    /// A session with at least 32 subscribers wakes them at most once per
    /// this many milliseconds, so each wake-up carries every frame of the
    /// window (the first frame after a quiet window goes out at once); 0
    /// wakes them at every frame.
    #[arg(long, default_value_t = vak_core::stream::bus_config::DEFAULT_FLUSH_WINDOW.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub flush_window_ms: u64,
    /// The permission mode the server starts in: default (edits and
    /// commands ask), accept-edits (commands ask), plan (read-only tools
    /// only) or bypass (nothing asks; needs --allow-bypass). Clients change it
    /// with POST /config/mode.
    #[arg(long, value_enum, default_value = "default")]
    pub permission_mode: PermissionArg,
    /// The sandbox every command the agent runs goes into: workspace-write
    /// (writes only the session's workspace and a private temporary
    /// directory; the default), read-only (writes nothing) or off (the
    /// server user's full rights). Both sandboxes hide vak's home and turn
    /// the network off unless `[sandbox] network = true`. Also VAK_SANDBOX
    /// and `[sandbox] mode` in config.toml.
    #[arg(long, value_enum, env = "VAK_SANDBOX")]
    pub sandbox: Option<SandboxArg>,
    /// Allow the bypass mode, at startup and through the API: the model then
    /// runs any command without asking.
    #[arg(long)]
    pub allow_bypass: bool,
    /// The model provider: offline (the embedded echo model), openai (also
    /// any OpenAI-compatible server by --base-url) or anthropic. Also
    /// VAK_PROVIDER and `[model] provider` in config.toml.
    #[arg(long, value_parser = parse_provider_flag)]
    pub provider: Option<ProviderKind>,
    /// The model name the provider is asked for (needed for openai and
    /// anthropic). Also VAK_MODEL and `[model] model`.
    #[arg(long)]
    pub model: Option<String>,
    /// The provider's endpoint, e.g. http://127.0.0.1:11434/v1 for a local
    /// server (which needs no key). Also VAK_BASE_URL and `[model] base_url`.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Model turns one run leg may take before it ends with `max_turns`
    /// (default 50). Also `[agent] max_turns` and `PATCH /config`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_turns: Option<u32>,
    /// Workers (spawn_worker children) one session may have running at
    /// once: waited calls beyond it queue for a slot, background ones are
    /// refused.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_workers: u32,
    /// How long an approval waits for an answer before it expires: the
    /// tool call is denied (the model is told) and the run goes on. `0`:
    /// never.
    #[arg(long, default_value = "30m", value_parser = parse_wait)]
    pub approval_timeout: std::time::Duration,
    /// The most tokens one model turn may produce (the request's
    /// max_tokens). Also VAK_MAX_OUTPUT_TOKENS.
    #[arg(long, env = "VAK_MAX_OUTPUT_TOKENS", default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_output_tokens: u32,
    /// Log lines on stderr: `text` for people, `json` (one object per line)
    /// for machines. RUST_LOG filters them (default `vak=info,opentelemetry_sdk=warn`).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Export traces (spans of requests, runs, model calls, tool calls and
    /// ledger commits) over OTLP/gRPC to this collector, e.g.
    /// `http://127.0.0.1:4317`. Also OTEL_EXPORTER_OTLP_ENDPOINT. Neither
    /// set: no exporter.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `IP:PORT`, `[IPv6]:PORT` or `localhost:PORT` (which means 127.0.0.1:PORT:
/// resolving it could pick ::1 on one machine and 127.0.0.1 on another).
fn parse_listen(s: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    match s.rsplit_once(':') {
        Some((host, port)) if host.eq_ignore_ascii_case("localhost") => port
            .parse::<u16>()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .map_err(|_| format!("{port:?} is not a port number")),
        _ => Err("expected IP:PORT or localhost:PORT, e.g. 127.0.0.1:8901".into()),
    }
}

/// clap names the flag itself (`invalid value 'x' for '--provider …'`): the
/// message says only what is wrong with the value.
fn parse_provider_flag(s: &str) -> std::result::Result<ProviderKind, String> {
    config::parse_provider(s, "").map_err(|e| e.message.trim_start_matches(": ").to_string())
}

/// A timeout such as `10s`, `500ms` or `2m`; zero is refused.
fn parse_timeout(s: &str) -> std::result::Result<std::time::Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("a timeout must be longer than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{e}: expected a duration such as 10s, 500ms or 2m")),
    }
}

/// A wait such as `30m`, `90s` or `0` (zero: no limit).
fn parse_wait(s: &str) -> std::result::Result<std::time::Duration, String> {
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}: expected a duration such as 30m or 90s, or 0 for never"))
}

impl ServeArgs {
    /// The configuration for a home this process has locked (the kept token
    /// may be rotated, so only the home's owner may call this).
    pub fn config(&self, home: PathBuf) -> Result<ServeConfig> {
        self.config_and_file(home).map(|(cfg, _)| cfg)
    }

    /// The credential and TLS flags of `--bus`, as given.
    fn bus_flags(&self) -> vak_core::cluster::nats_connect::BusFlags {
        use vak_core::provider::Secret;
        vak_core::cluster::nats_connect::BusFlags {
            user: self.bus_user.clone(),
            password: self.bus_password.clone().map(Secret::new),
            token: self.bus_token.clone().map(Secret::new),
            creds: self.bus_creds.clone(),
            nkey: self.bus_nkey.clone(),
            tls_ca: self.bus_tls_ca.clone(),
            tls_cert: self.bus_tls_cert.clone(),
            tls_key: self.bus_tls_key.clone(),
        }
    }

    /// The configuration and what config.toml said (its ignored sections are
    /// reported once the server is up).
    fn config_and_file(&self, home: PathBuf) -> Result<(ServeConfig, FileConfig)> {
        let workspace = match &self.workspace {
            Some(w) => w.clone(),
            None if self.home_workspace => {
                let w = home.join("workspace");
                home::create_private_dir(&w).map_err(|e| {
                    Error::internal(format!("cannot create the workspace {}: {e}", w.display()))
                })?;
                w
            }
            None => std::env::current_dir()?,
        };
        if !workspace.is_dir() {
            return Err(Error::invalid(format!(
                "the workspace {} is not a directory",
                workspace.display()
            )));
        }
        let mut core = CoreConfig::new(home, workspace);
        core.bus.ring = self.ring as usize;
        core.bus.max_total_retained_bytes = (self.max_ring_mib as usize) << 20;
        core.max_queued_inputs = self.max_queued_inputs as usize;
        core.max_bestofn = self.max_bestofn;
        core.first_subscriber_wait = std::time::Duration::from_millis(self.first_subscriber_wait_ms);
        core.durability = match self.durability {
            DurabilityArg::Process => Durability::Process,
            DurabilityArg::Fsync => Durability::Fsync,
        };
        core.unload_idle_after = std::time::Duration::from_secs(self.unload_idle_after);
        core.bus.max_total_queued_bytes = (self.max_queued_mib as usize) << 20;
        core.bus.flush_window = std::time::Duration::from_millis(self.flush_window_ms);
        core.permission = match self.permission_mode {
            PermissionArg::Default => PermissionMode::Default,
            PermissionArg::AcceptEdits => PermissionMode::AcceptEdits,
            PermissionArg::Plan => PermissionMode::Plan,
            PermissionArg::Bypass => PermissionMode::Bypass,
        };
        core.permission.check(self.allow_bypass).map_err(|e| {
            Error::invalid(format!(
                "--permission-mode {}: {}",
                core.permission.as_str(),
                e.message
            ))
        })?;
        core.allow_bypass = self.allow_bypass;
        core.max_workers = self.max_workers as usize;
        core.approval_timeout = Some(self.approval_timeout).filter(|d| !d.is_zero());
        if let Some(n) = self.max_turns {
            core.max_turns = n;
            core.max_turns_from_flag = true;
        }
        core.max_output_tokens = self.max_output_tokens;
        if let Some(m) = &self.model {
            config::validate_model(m, "--model")?;
        }
        if let Some(u) = &self.base_url {
            config::validate_base_url(u, "--base-url")?;
        }
        core.route_flags = RouteLayer {
            provider: self.provider,
            model: self.model.clone(),
            base_url: self.base_url.clone(),
        };
        core.env = Environment::from_process()?;
        let mut file = FileConfig::load(&core.home)?;
        let token = match &self.token {
            Some(t) if t.trim().is_empty() => return Err(Error::invalid("the token is empty")),
            Some(t) => t.clone(),
            None => home::stable_token(&core.home, self.rotate_token)?,
        };
        let server = std::mem::take(&mut file.server);
        for root in &server.workspace_roots {
            if !root.is_absolute() {
                return Err(Error::invalid(format!(
                    "[server] workspace_roots: {} is not an absolute path",
                    root.display()
                )));
            }
        }
        if let Some(shell) = &server.web.terminal_shell {
            if !shell.is_absolute() || !shell.is_file() {
                return Err(Error::invalid(format!(
                    "[server.web] terminal_shell: {} is not an absolute path to a file",
                    shell.display()
                )));
            }
        }
        core.workspace_roots = server.workspace_roots;
        let sandbox = std::mem::take(&mut file.sandbox);
        core.sandbox = SandboxConfig {
            mode: match self.sandbox {
                Some(SandboxArg::WorkspaceWrite) => SandboxMode::WorkspaceWrite,
                Some(SandboxArg::ReadOnly) => SandboxMode::ReadOnly,
                Some(SandboxArg::Off) => SandboxMode::Off,
                None => sandbox.mode.unwrap_or(SandboxMode::WorkspaceWrite),
            },
            network: sandbox.network,
            writable_roots: sandbox.writable_roots,
            scrub_env: sandbox.scrub_env,
        };
        let mut cfg = ServeConfig::new(core, token);
        cfg.trusted_hosts = [server.trusted_hosts, self.trusted_hosts.clone()].concat();
        cfg.allow_origins = [server.allow_origins, self.allow_origins.clone()].concat();
        for o in &cfg.allow_origins {
            if o == "*" || o == "null" || !o.contains("://") {
                return Err(Error::invalid(format!(
                    "--allow-origin {o:?}: give an exact origin such as http://localhost:5173 (no wildcards)"
                )));
            }
        }
        cfg.max_streams = self.max_streams;
        cfg.max_streams_per_client = self.max_streams_per_client;
        if let Some(n) = self.max_connections {
            cfg.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        cfg.header_read_timeout = self.header_read_timeout;
        cfg.idle_timeout = self.idle_timeout;
        cfg.body_read_timeout = self.body_read_timeout;
        cfg.allow_remote = self.allow_remote;
        cfg.web = server.web;
        Ok((cfg, file))
    }
}

/// Set by a SIGINT or SIGTERM that arrived before the runtime's handlers.
static EARLY_STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Catches SIGINT and SIGTERM from the first moments of `vak serve`, before
/// the runtime or anything else starts: one that arrives during startup
/// then stops the server cleanly (`shutdown_signal` sees it) instead of
/// killing it with the default action. Call once, first thing in `main`.
pub fn early_signals() {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, flag.clone()) {
            eprintln!("vak: warning: cannot catch signal {sig} early: {e}");
        }
    }
    let _ = EARLY_STOP.set(flag);
}

/// SIGINT or SIGTERM. The handlers are installed when this is called, not
/// when the future is first polled, so a signal that arrives right after the
/// `listening on` line stops the server gracefully instead of killing it.
/// One that came before (`early_signals`) resolves it at once.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let install =
        |kind| signal(kind).map_err(|e| Error::internal(format!("cannot install a signal handler: {e}")));
    let mut term = install(SignalKind::terminate())?;
    let mut int = install(SignalKind::interrupt())?;
    Ok(async move {
        // Read after the handlers above exist, so no signal falls between.
        if EARLY_STOP.get().is_some_and(|f| f.load(Ordering::SeqCst)) {
            return;
        }
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

/// A startup warning: `vak: warning: …` on stderr for people, a log record
/// with `--log-format json`, so machines get nothing but JSON lines.
fn warn(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("vak: warning: {message}"),
        LogFormat::Json => tracing::warn!("{message}"),
    }
}

/// `vak serve`: any startup failure is one clear line and a non-zero exit.
pub async fn serve(args: ServeArgs) -> Result<()> {
    let print_token = args.print_token;
    // Installed first: a SIGINT or SIGTERM during startup (a slow bus, a
    // large home) stops it cleanly; `early_signals` covered the moments
    // before the runtime existed.
    let mut stop = Box::pin(shutdown_signal()?);
    let started = tokio::select! {
        biased;
        () = &mut stop => {
            tracing::info!("stopped by a signal before the server started");
            return Ok(());
        }
        started = start(args) => started?,
    };
    let Started {
        _lock,
        home,
        url,
        token,
        workspace,
        tickets,
        server,
        listener,
        metrics,
    } = started;
    home::write_server_json(&home, &url, &token)?;
    println!("vak: listening on {url}");
    println!("vak: workspace {}", workspace.display());
    println!("vak: app {url}/app/ (log in with the token `vak token` prints, or run `vak open`)");
    if print_token {
        println!("vak: token {token}");
        match tickets.issue() {
            Ok(ticket) => println!(
                "vak: login link {url}{} (works once, within 60 s)",
                vak_server::tickets::link_path(&ticket)
            ),
            Err(_) => println!("vak: no login link: too many are waiting"),
        }
    }
    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(l) = metrics {
        if let Ok(at) = l.local_addr() {
            println!("vak: metrics http://{at}/metrics (no token, loopback only)");
        }
        tokio::spawn(async move {
            let stop = async move {
                let _ = metrics_stopped.await;
            };
            vak_server::server::serve_metrics(l, stop).await;
        });
    }
    let _ = std::io::stdout().flush();
    let result = server.run(listener, stop).await;
    let _ = metrics_stop.send(());
    home::remove_server_json(&home);
    result
}

/// What startup hands the serving part: the home's lock (held for the
/// process's life), where the server is and the bound listener.
struct Started {
    _lock: home::HomeLock,
    home: std::path::PathBuf,
    url: String,
    token: String,
    /// Where tools act, for the startup lines.
    workspace: PathBuf,
    /// The server's one-time login links (`--print-token` makes one).
    tickets: vak_server::tickets::Tickets,
    server: Server,
    listener: tokio::net::TcpListener,
    /// `--metrics-listen`'s listener, bound.
    metrics: Option<tokio::net::TcpListener>,
}

/// Everything before the server takes requests: the home and its lock,
/// the configuration, the bus, the core, the listener.
async fn start(args: ServeArgs) -> Result<Started> {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return Err(Error::invalid(format!(
            "refusing to listen on {}: vak serves loopback only unless --allow-remote is given",
            args.listen
        )));
    }
    if let Some(addr) = args.metrics_listen.filter(|a| !a.ip().is_loopback()) {
        return Err(Error::invalid(format!(
            "refusing to serve metrics on {addr}: --metrics-listen serves without a token, so only on a loopback address"
        )));
    }
    let home = home::resolve(args.home.clone())?;
    // Before anything reads or writes the home: one server per home.
    let _lock = match home::HomeLock::acquire(&home) {
        Ok(lock) => lock,
        Err(home::LockError::Io(e)) => return Err(e),
        Err(home::LockError::Owned { pid, url }) => {
            let pid = pid.map_or("pid unknown".to_string(), |p| format!("pid {p}"));
            let url = url.map_or(String::new(), |u| format!(", {u}"));
            return Err(Error::conflict(format!(
                "another vak server ({pid}{url}) owns the home {}; stop it, or pass another --home",
                home.display()
            )));
        }
    };
    // Before the default connection cap is derived from it.
    let nofile = vak_server::fdlimit::raise_nofile();
    let (mut cfg, file) = args.config_and_file(home.clone())?;
    if let Some(url) = &args.bus {
        let opts = vak_core::cluster::jetstream::StreamOptions {
            replicas: args.bus_replicas as usize,
            ..Default::default()
        };
        let target = vak_core::cluster::nats_connect::BusTarget::new(url, &args.bus_flags())?;
        let client = vak_core::cluster::jetstream::connect_to(&target, &opts).await?;
        let replica = args
            .bus_replica
            .clone()
            .unwrap_or_else(vak_core::cluster::owners::new_replica_name);
        let owners = vak_core::cluster::owners::Owners::open(
            client.clone(),
            replica,
            std::time::Duration::from_millis(args.bus_lease_ttl_ms),
            opts.replicas,
        )
        .await?;
        println!(
            "vak: sessions in NATS JetStream at {} ({}{}), stream {}; replica {}, leases in {} ({} ms)",
            target.shown(),
            target.credentials().describe(),
            if target.tls() { ", TLS" } else { "" },
            vak_core::cluster::jetstream::STREAM,
            owners.replica(),
            vak_core::cluster::owners::BUCKET,
            owners.ttl().as_millis()
        );
        let shared_index = vak_core::cluster::shared_index::SharedIndex::open(
            client.clone(),
            opts.replicas,
            cfg.core.workspace.display().to_string(),
        )
        .await?;
        let cipher = match &args.bus_secret_file {
            Some(path) => Some(vak_core::cluster::shared_config::Cipher::from_file(path)?),
            None => None,
        };
        let shares_keys = cipher.is_some();
        let shared_config = vak_core::cluster::shared_config::SharedConfig::open(
            client.clone(),
            opts.replicas,
            owners.replica().to_string(),
            cipher,
        )
        .await?;
        let spec = config::resolve_spec(&cfg.core.route_flags, &cfg.core.env.route, &file.model)?;
        shared_config.seed_route(&spec).await?;
        println!(
            "vak: route, rules and keys shared in {}{}",
            vak_core::cluster::shared_config::BUCKET,
            if shares_keys {
                " (keys sealed with the cluster secret)"
            } else {
                " (keys not shared: no --bus-secret-file)"
            }
        );
        let shared_memory =
            vak_core::cluster::shared_memory::SharedMemory::open(client.clone(), opts.replicas).await?;
        let client_for_claims = client.clone();
        cfg.core.nats = Some(client);
        cfg.core.owners = Some(owners);
        cfg.core.shared_index = Some(shared_index);
        cfg.core.shared_config = Some(shared_config);
        cfg.core.shared_memory = Some(shared_memory);
        cfg.core.task_claims =
            Some(vak_core::cluster::shared_tasks::open_claims(&client_for_claims, opts.replicas).await?);
    }
    let max_connections = cfg.max_connections;
    let tls = if args.tls_self_signed {
        Some(tls::self_signed(&home)?)
    } else if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        Some(tls::load(cert, key)?)
    } else {
        None
    };
    if let Some(t) = &tls {
        println!(
            "vak: TLS certificate {} sha256 fingerprint {}",
            t.cert_path.display(),
            t.fingerprint
        );
    }
    cfg.tls = tls.map(|t| t.config);
    if args.allow_remote && cfg.tls.is_none() && !args.listen.ip().is_loopback() {
        warn(
            args.log_format,
            "remote access without TLS: the token and every byte cross the network unencrypted",
        );
    }
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let token = cfg.token.clone();
    let workspace = cfg.core.workspace.clone();
    let tickets = cfg.tickets.clone();
    let server = Server::new(cfg)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Error::internal(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr()?;
    let metrics = match args.metrics_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| Error::internal(format!("cannot serve metrics on {at}: {e}")))?,
        ),
        None => None,
    };
    // Once startup can no longer fail, so a failure stays one line.
    match nofile {
        Ok((before, now)) if before < now => tracing::info!(
            "open-files limit {now} (raised from {before}); at most {max_connections} connections at once"
        ),
        Ok((_, now)) => {
            tracing::info!("open-files limit {now}; at most {max_connections} connections at once")
        }
        Err(e) => tracing::warn!("{e}; at most {max_connections} connections at once"),
    }
    // Warnings once startup can no longer fail, so a failed start stays one line.
    if let Some(weak) = args.token.as_deref().and_then(vak_server::auth::weak_token) {
        warn(args.log_format, &weak);
    }
    if !file.ignored.is_empty() {
        warn(
            args.log_format,
            &format!(
                "{} has sections this version does not implement, ignored: {}",
                config::config_path(&home).display(),
                file.ignored
                    .iter()
                    .map(|n| format!("[{n}]"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    let route = server.hub().control().config_info().route;
    tracing::info!(
        provider = route.provider.as_str(),
        model = %route.model,
        source = route.source.as_str(),
        "model route"
    );
    if let Some(mode) = home::readable_by_others(&home) {
        warn(
            args.log_format,
            &format!(
                "other users can read the home {} (mode {mode:o}), which holds every prompt and tool output; `chmod 700` it",
                home.display()
            ),
        );
    }
    let url = home::local_url(scheme, addr);
    if let Some(owners) = &server.hub().control().config().owners {
        owners.set_url(&url);
    }
    if addr.ip().is_unspecified() {
        println!("vak: bound to {addr} (every interface)");
    }
    Ok(Started {
        _lock,
        home,
        url,
        token,
        workspace,
        tickets,
        server,
        listener,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_timeout_takes_a_duration_or_zero_for_never() {
        let args = |extra: &[&str]| {
            let mut argv = vec!["vak", "serve"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Serve(a) => a.approval_timeout,
                _ => unreachable!("serve"),
            }
        };
        assert_eq!(args(&[]), std::time::Duration::from_secs(1800));
        assert_eq!(
            args(&["--approval-timeout", "1s"]),
            std::time::Duration::from_secs(1)
        );
        assert!(args(&["--approval-timeout", "0"]).is_zero());
        assert!(Cli::try_parse_from(["vak", "serve", "--approval-timeout", "soon"]).is_err());
    }

    #[test]
    fn an_unknown_provider_names_the_flag_once() {
        let e = Cli::try_parse_from(["vak", "serve", "--provider", "gemini"])
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches("--provider").count(), 1, "{e}");
        assert!(
            e.contains("unknown provider \"gemini\": expected one of offline, openai, anthropic"),
            "{e}"
        );
    }
}
