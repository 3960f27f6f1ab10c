//! The `vak` command line: `vak serve` parses its flags into a `ServeConfig`, binds, announces itself and runs until SIGINT or SIGTERM.

use crate::core::{CoreConfig, PermissionMode};
use crate::edge::server::{ServeConfig, Server};
use crate::error::{Error, Result};
use crate::home;
use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "vak", version, about = "A server for AI coding agents")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the agent over gRPC, gRPC-web and REST/SSE on one port.
    Serve(ServeArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PermissionArg {
    Ask,
    Allow,
    Deny,
}

#[derive(Parser, Debug)]
pub struct ServeArgs {
    /// Address to listen on; must be loopback. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8901")]
    pub listen: SocketAddr,
    /// The data home (ledgers, server.json).
    #[arg(long, env = "VAK_HOME")]
    pub home: Option<PathBuf>,
    /// The bearer token; generated at random when absent.
    #[arg(long, env = "VAK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Where tools act. Defaults to the current directory.
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Frames each session keeps for replay.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub ring: u64,
    /// What tools that need permission (write_file, bash) do.
    #[arg(long, value_enum, default_value = "ask")]
    pub permission_mode: PermissionArg,
}

pub fn generate_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl ServeArgs {
    pub fn config(&self) -> Result<ServeConfig> {
        let home = home::resolve(self.home.clone())?;
        let workspace = match &self.workspace {
            Some(w) => w.clone(),
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
        core.permission = match self.permission_mode {
            PermissionArg::Ask => PermissionMode::Ask,
            PermissionArg::Allow => PermissionMode::Allow,
            PermissionArg::Deny => PermissionMode::Deny,
        };
        let token = match &self.token {
            Some(t) if t.trim().is_empty() => return Err(Error::invalid("the token is empty")),
            Some(t) => t.clone(),
            None => generate_token(),
        };
        Ok(ServeConfig::new(core, token))
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `vak serve`: any startup failure is one clear line and a non-zero exit.
pub async fn serve(args: ServeArgs) -> Result<()> {
    if !args.listen.ip().is_loopback() {
        return Err(Error::invalid(format!(
            "refusing to listen on {}: vak serves loopback only",
            args.listen
        )));
    }
    let cfg = args.config()?;
    let home = cfg.core.home.clone();
    let token = cfg.token.clone();
    let server = Server::new(cfg)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Error::internal(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}");
    home::write_server_json(&home, &url, &token)?;
    println!("vak: listening on {url}");
    let _ = std::io::stdout().flush();
    let result = server.run(listener, shutdown_signal()).await;
    home::remove_server_json(&home);
    result
}
