//! Every MCP server of this vak server, shared by all its sessions (larik's model): started at boot, changed as a whole by `PUT /config/mcp` (added ones start, removed ones stop, changed ones restart, the rest stay connected), and the one place a session's call reaches a server.

use super::config::ServerDefs;
use super::names;
use super::server::{McpState, Server};
use crate::provider::ToolDef;
use crate::tools::ToolOutput;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One server as `GET /config/mcp` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerStatus {
    pub name: String,
    pub def: super::config::ServerDef,
    pub state: McpState,
    /// The model-facing names of its tools (the last listed while it restarts).
    pub tools: Vec<String>,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub last_error: Option<String>,
}

/// The servers by name; swapped whole, never held across I/O.
type Table = Arc<BTreeMap<String, Arc<Server>>>;

pub struct Mcp {
    servers: RwLock<Table>,
    /// Where a stdio server runs when its definition names no `cwd`.
    workspace: PathBuf,
    /// Where every change of the table runs, one at a time (config.toml is
    /// written from it, then the servers are started and stopped).
    pub(crate) changing: crate::file_owner::FileOwner<()>,
}

impl Default for Mcp {
    /// No servers.
    fn default() -> Mcp {
        Mcp::start(ServerDefs::new(), PathBuf::new())
    }
}

impl Mcp {
    /// Starts every enabled server of `defs` (needs a runtime when any is enabled).
    pub fn start(defs: ServerDefs, workspace: PathBuf) -> Mcp {
        let table = defs
            .into_iter()
            .map(|(name, def)| {
                let s = Arc::new(Server::start(&name, def, workspace.clone()));
                (name, s)
            })
            .collect();
        Mcp {
            servers: RwLock::new(Arc::new(table)),
            workspace,
            changing: crate::file_owner::FileOwner::new("the MCP servers", ()),
        }
    }

    fn current(&self) -> Table {
        self.servers.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The definitions in effect.
    pub fn defs(&self) -> ServerDefs {
        self.current()
            .iter()
            .map(|(n, s)| (n.clone(), s.def.clone()))
            .collect()
    }

    pub fn status(&self) -> Vec<ServerStatus> {
        self.current()
            .iter()
            .map(|(name, s)| {
                let snap = s.snapshot();
                ServerStatus {
                    name: name.clone(),
                    def: s.def.clone(),
                    state: snap.state,
                    tools: snap.tools.iter().map(|t| t.name.clone()).collect(),
                    pid: snap.pid,
                    restarts: snap.restarts,
                    last_error: snap.last_error.clone(),
                }
            })
            .collect()
    }

    /// The tools every server offers the model now (a failed server's last
    /// ones included: a call answers `mcp_unavailable`).
    pub(crate) fn tool_defs(&self) -> Vec<ToolDef> {
        let mut defs = Vec::new();
        for s in self.current().values() {
            let snap = s.snapshot();
            if snap.state == McpState::Disabled {
                continue;
            }
            defs.extend(snap.tools.iter().map(|t| ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.schema.clone(),
            }));
        }
        defs
    }

    /// Calls the tool the model knows as `name` with `input`, within the
    /// server's timeout; cancelled (`notifications/cancelled` to the server)
    /// when `cancel` fires or the timeout passes.
    pub(crate) async fn call(&self, name: &str, input: &Value, cancel: &CancellationToken) -> ToolOutput {
        let err = |output: String| ToolOutput {
            ok: false,
            output,
            exit_code: None,
        };
        let Some(server) = names::server_of(name).and_then(|s| self.current().get(s).cloned()) else {
            return err(format!("unknown tool {name}"));
        };
        let snap = server.snapshot();
        let Some(tool) = snap.tools.iter().find(|t| t.name == name) else {
            return err(format!("unknown tool {name}"));
        };
        let Some(peer) = snap.peer.clone().filter(|_| snap.state == McpState::Ready) else {
            let why = snap
                .last_error
                .as_deref()
                .map_or_else(String::new, |e| format!(": {e}"));
            return err(format!(
                "mcp_unavailable: the MCP server {} is {}{why}; it is restarted on its own, try again later",
                names::server_of(name).unwrap_or_default(),
                snap.state.as_str()
            ));
        };
        let arguments = match input {
            Value::Object(o) => Some(o.clone()),
            Value::Null => None,
            _ => return err(format!("{name} needs a JSON object as its input")),
        };
        let mut params = rmcp::model::CallToolRequestParams::new(tool.remote.clone());
        params.arguments = arguments;
        let limit = server.def.timeout();
        // Dropping the call (cancelled, timed out) sends notifications/cancelled.
        tokio::select! {
            r = tokio::time::timeout(limit, peer.call_tool(params)) => match r {
                Ok(Ok(result)) => {
                    let json = serde_json::to_value(&result).unwrap_or_default();
                    let (ok, output) = super::result::render(&json);
                    ToolOutput {
                        ok,
                        output,
                        exit_code: None,
                    }
                }
                Ok(Err(e)) => err(format!("mcp_error: {e}")),
                Err(_) => err(format!(
                    "mcp_timeout: {name} did not answer within {} (the call was cancelled)",
                    humantime::format_duration(limit)
                )),
            },
            _ = cancel.cancelled() => err("cancelled".into()),
        }
    }

    /// Makes `defs` the table: removed servers stop, added ones start,
    /// changed ones restart, unchanged ones stay connected. Waits (at most
    /// `settle`) for the started ones to be ready or failed.
    pub(crate) async fn apply(&self, defs: ServerDefs, settle: Duration) {
        let old = self.current();
        let mut next = BTreeMap::new();
        let mut stopping = Vec::new();
        let mut started = Vec::new();
        for (name, def) in defs {
            match old.get(&name) {
                Some(s) if s.def == def => {
                    next.insert(name, s.clone());
                }
                other => {
                    if let Some(s) = other {
                        stopping.push(s.clone());
                    }
                    let s = Arc::new(Server::start(&name, def, self.workspace.clone()));
                    started.push(s.clone());
                    next.insert(name, s);
                }
            }
        }
        stopping.extend(
            old.iter()
                .filter(|(n, _)| !next.contains_key(*n))
                .map(|(_, s)| s.clone()),
        );
        // Stopped before the new ones start talking to the same program.
        for s in &stopping {
            s.stop().await;
        }
        *self.servers.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        let _ = tokio::time::timeout(settle, async {
            for s in started {
                let mut rx = s.watch();
                let _ = rx.wait_for(|snap| snap.state != McpState::Starting).await;
            }
        })
        .await;
    }

    /// Stops every server (the hub's shutdown).
    pub(crate) async fn shutdown(&self) {
        let table = std::mem::take(&mut *self.servers.write().unwrap_or_else(|p| p.into_inner()));
        for s in table.values() {
            s.stop().await;
        }
    }
}
