//! One MCP server's owner task: connects (spawns the stdio process or opens the HTTP session), lists its tools (again on `notifications/tools/list_changed`), and restarts it with capped exponential backoff when it exits or its session fails; what it knows is published as a snapshot for calls and `/config/mcp`.

use super::config::{ServerDef, TransportKind};
use super::names;
use rmcp::model::{ClientCapabilities, Implementation, InitializeRequestParams};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::ClientHandler;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

/// The first wait before a restart; it doubles up to `BACKOFF_CAP`.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(500);
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// How long starting (spawn or connect, `initialize`, `tools/list`) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most tools one server offers the model; the rest are left out with a log line.
pub(crate) const MAX_TOOLS: usize = 128;
/// The most of a stdio server's stderr kept for its last error.
const STDERR_TAIL: usize = 2048;
/// The longest description handed to the model.
const MAX_DESCRIPTION: usize = 4096;

/// Where a server is, as `/config/mcp` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McpState {
    Starting,
    Ready,
    Failed,
    Disabled,
}

impl McpState {
    pub fn as_str(self) -> &'static str {
        match self {
            McpState::Starting => "starting",
            McpState::Ready => "ready",
            McpState::Failed => "failed",
            McpState::Disabled => "disabled",
        }
    }
}

/// One tool of a server, as the model sees it and as the server names it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct McpTool {
    /// `mcp__<server>__<tool>`.
    pub(crate) name: String,
    /// The server's own name for it.
    pub(crate) remote: String,
    pub(crate) description: String,
    pub(crate) schema: Value,
}

/// What a server's task last published.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub(crate) state: McpState,
    /// The last tools listed: kept while the server restarts, so a call
    /// meanwhile is answered `mcp_unavailable` rather than "unknown tool".
    pub(crate) tools: Arc<Vec<McpTool>>,
    /// Set while ready.
    pub(crate) peer: Option<Peer<RoleClient>>,
    pub(crate) pid: Option<u32>,
    pub(crate) restarts: u32,
    pub(crate) last_error: Option<String>,
}

/// A running (or disabled) server: its definition, snapshot and task.
pub(crate) struct Server {
    pub(crate) def: ServerDef,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Server {
    /// Starts `def`'s task (a disabled server has none).
    pub(crate) fn start(name: &str, def: ServerDef, workspace: PathBuf) -> Server {
        let initial = Snapshot {
            state: if def.enabled {
                McpState::Starting
            } else {
                McpState::Disabled
            },
            tools: Arc::default(),
            peer: None,
            pid: None,
            restarts: 0,
            last_error: None,
        };
        let (tx, rx) = watch::channel(Arc::new(initial));
        let stop = CancellationToken::new();
        let task = def.enabled.then(|| {
            let owner = Owner {
                name: name.to_string(),
                def: def.clone(),
                workspace,
                tx,
                stop: stop.clone(),
            };
            tokio::spawn(owner.run())
        });
        Server {
            def,
            snapshot: rx,
            stop,
            task: Mutex::new(task),
        }
    }

    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    /// A receiver of every change (tests wait on it).
    pub(crate) fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }

    /// Stops the task: the session is closed and a stdio process group killed.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Wakes the owner on `notifications/tools/list_changed`.
struct Handler {
    changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> InitializeRequestParams {
        InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("vak", env!("CARGO_PKG_VERSION")),
        )
    }

    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + rmcp::service::MaybeSendFuture + '_ {
        self.changed.notify_one();
        std::future::ready(())
    }
}

/// A live session with a server, and its process when it runs over stdio.
struct Conn {
    running: RunningService<RoleClient, Handler>,
    child: Option<Child>,
}

/// A stdio server's process (its own process group) and its stderr's tail.
struct Child {
    process: tokio::process::Child,
    pgid: Option<i32>,
    stderr: Arc<Mutex<String>>,
}

impl Child {
    fn kill(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            // SAFETY: killpg only sends a signal; the group's leader is our
            // child, so the id is not another group's while it lives.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
    }

    fn tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        t.trim().lines().last().unwrap_or_default().to_string()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The task's side: the definition and where to publish.
struct Owner {
    name: String,
    def: ServerDef,
    workspace: PathBuf,
    tx: watch::Sender<Arc<Snapshot>>,
    stop: CancellationToken,
}

impl Owner {
    fn publish(&self, f: impl FnOnce(&mut Snapshot)) {
        self.tx.send_modify(|s| {
            let mut next = (**s).clone();
            f(&mut next);
            *s = Arc::new(next);
        });
    }

    /// Publishes `failed` with `why` as the last error.
    fn failed(&self, what: &str, why: String) {
        tracing::warn!(server = %self.name, "MCP server {what}: {why}");
        self.publish(|s| {
            s.state = McpState::Failed;
            s.peer = None;
            s.pid = None;
            s.last_error = Some(why);
        });
    }

    async fn run(self) {
        let mut backoff = BACKOFF_BASE;
        loop {
            self.publish(|s| {
                s.state = McpState::Starting;
                s.peer = None;
                s.pid = None;
            });
            let changed = Arc::new(Notify::new());
            let started = tokio::select! {
                r = tokio::time::timeout(CONNECT_TIMEOUT, self.connect(changed.clone())) => {
                    r.unwrap_or_else(|_| Err(format!("did not start within {}s", CONNECT_TIMEOUT.as_secs())))
                }
                _ = self.stop.cancelled() => return,
            };
            match started {
                Ok((conn, tools)) => {
                    backoff = BACKOFF_BASE;
                    let pid = conn.child.as_ref().and_then(|c| c.process.id());
                    let peer = conn.running.peer().clone();
                    tracing::info!(server = %self.name, tools = tools.len(), "MCP server ready");
                    self.publish(|s| {
                        s.state = McpState::Ready;
                        s.tools = Arc::new(tools);
                        s.peer = Some(peer);
                        s.pid = pid;
                        s.last_error = None;
                    });
                    match self.serve(conn, &changed).await {
                        Some(why) => self.failed("failed", why),
                        None => return,
                    }
                }
                Err(why) => self.failed("did not start", why),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_CAP);
            self.publish(|s| s.restarts += 1);
        }
    }

    /// Serves a live connection until it fails (why) or the server is
    /// stopped (None): re-lists the tools when they change.
    async fn serve(&self, conn: Conn, changed: &Notify) -> Option<String> {
        let Conn { running, mut child } = conn;
        let peer = running.peer().clone();
        let cancel = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        loop {
            let exited = async {
                match child.as_mut() {
                    Some(c) => c.process.wait().await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.stop.cancelled() => {
                    cancel.cancel();
                    let _ = tokio::time::timeout(Duration::from_secs(5), &mut waiting).await;
                    drop(child);
                    return None;
                }
                _ = changed.notified() => {
                    match tokio::time::timeout(CONNECT_TIMEOUT, list_tools(&self.name, &peer)).await {
                        Ok(Ok(tools)) => {
                            tracing::info!(server = %self.name, tools = tools.len(), "MCP tools changed");
                            self.publish(|s| s.tools = Arc::new(tools));
                        }
                        Ok(Err(e)) => tracing::warn!(server = %self.name, "MCP tools/list failed: {e}"),
                        Err(_) => tracing::warn!(server = %self.name, "MCP tools/list timed out"),
                    }
                }
                status = exited => {
                    let tail = child.as_ref().map(Child::tail).unwrap_or_default();
                    let status = status.map_or_else(|| "exited".to_string(), |s| format!("exited ({s})"));
                    return Some(if tail.is_empty() { status } else { format!("{status}: {tail}") });
                }
                _ = &mut waiting => {
                    return Some("the connection closed".into());
                }
            }
        }
    }

    /// Starts the server and lists its tools.
    async fn connect(&self, changed: Arc<Notify>) -> Result<(Conn, Vec<McpTool>), String> {
        let handler = Handler { changed };
        let conn = match self.def.transport() {
            TransportKind::Stdio => self.connect_stdio(handler).await?,
            TransportKind::Http => self.connect_http(handler).await?,
        };
        let tools = list_tools(&self.name, conn.running.peer())
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        Ok((conn, tools))
    }

    async fn connect_stdio(&self, handler: Handler) -> Result<Conn, String> {
        let def = &self.def;
        let program = def.command.clone().unwrap_or_default();
        let cwd = def
            .cwd
            .as_ref()
            .map_or_else(|| self.workspace.clone(), PathBuf::from);
        let mut cmd = tokio::process::Command::new(&program);
        // The providers' keys, the token and the bus's secrets stay vak's,
        // as for the agent's commands (a definition's `env` may still set one).
        for k in crate::tools::sandbox::WITHHELD_ENV {
            cmd.env_remove(k);
        }
        cmd.args(&def.args)
            .envs(&def.env)
            .current_dir(&cwd)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let mut process = cmd.spawn().map_err(|e| format!("cannot start {program}: {e}"))?;
        let pgid = process.id().map(|p| p as i32);
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(err) = process.stderr.take() {
            tokio::spawn(keep_tail(self.name.clone(), err, stderr.clone()));
        }
        let (Some(stdout), Some(stdin)) = (process.stdout.take(), process.stdin.take()) else {
            return Err("the process has no stdio".into());
        };
        let mut child = Child {
            process,
            pgid,
            stderr,
        };
        match rmcp::serve_client(handler, (stdout, stdin)).await {
            Ok(running) => Ok(Conn {
                running,
                child: Some(child),
            }),
            Err(e) => {
                // The process's own last words say more than the protocol's.
                let status = tokio::time::timeout(Duration::from_millis(500), child.process.wait()).await;
                let tail = child.tail();
                child.kill();
                let mut why = format!("initialize failed: {e}");
                if let Ok(Ok(s)) = status {
                    why = format!("exited ({s}) during initialize");
                }
                if !tail.is_empty() {
                    why = format!("{why}: {tail}");
                }
                Err(why)
            }
        }
    }

    async fn connect_http(&self, handler: Handler) -> Result<Conn, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        let url = self.def.url.clone().unwrap_or_default();
        let mut headers = std::collections::HashMap::new();
        for (k, v) in &self.def.headers {
            let v = super::env::expand(v).map_err(|why| format!("header {k}: {why}"))?;
            let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header {k}: {e}"))?;
            let value = http::HeaderValue::from_str(&v)
                .map_err(|_| format!("header {k}: its value is not a valid header value"))?;
            headers.insert(name, value);
        }
        // reqwest 0.13 under rmcp is built without a crypto provider: the
        // process's is ring, as everywhere else in vak.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        let transport = StreamableHttpClientTransport::from_config(config);
        match rmcp::serve_client(handler, transport).await {
            Ok(running) => Ok(Conn { running, child: None }),
            Err(e) if e.is_authorization_required() => {
                Err("the server refused vak's credentials (HTTP 401/403): check this server's headers".into())
            }
            Err(e) => Err(format!("initialize failed: {e}")),
        }
    }
}

/// Keeps the last `STDERR_TAIL` bytes a stdio server wrote to stderr, reading it to its end
/// whatever it holds. Bytes that are not UTF-8 or a line without an end must not stop the
/// reading: the server would block once its stderr pipe filled, and hang every call.
async fn keep_tail(name: String, mut err: impl tokio::io::AsyncRead + Unpin, tail: Arc<Mutex<String>>) {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 4096];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match err.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for piece in chunk[..n].split_inclusive(|b| *b == b'\n') {
            line.extend_from_slice(piece);
            // A line longer than the tail is kept in pieces, so one line never pins more.
            if line.ends_with(b"\n") || line.len() >= STDERR_TAIL {
                take_line(&name, &mut line, &tail);
            }
        }
    }
    if !line.is_empty() {
        take_line(&name, &mut line, &tail);
    }
}

/// Moves one line (or a piece of one) of a stdio server's stderr into its tail.
fn take_line(name: &str, line: &mut Vec<u8>, tail: &Mutex<String>) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\n', '\r']);
    tracing::debug!(server = %name, "MCP stderr: {text}");
    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
    t.push_str(text);
    t.push('\n');
    if t.len() > STDERR_TAIL {
        let mut cut = t.len() - STDERR_TAIL;
        while !t.is_char_boundary(cut) {
            cut += 1;
        }
        t.drain(..cut);
    }
    drop(t);
    line.clear();
}

/// Every tool of the server, named for the model; a name that collides
/// with another once sanitised is left out with a log line.
async fn list_tools(server: &str, peer: &Peer<RoleClient>) -> Result<Vec<McpTool>, String> {
    let listed = peer.list_all_tools().await.map_err(|e| e.to_string())?;
    let mut tools: Vec<McpTool> = Vec::new();
    for t in listed {
        let name = names::tool_name(server, &t.name);
        if tools.len() >= MAX_TOOLS {
            tracing::warn!(server, tool = %t.name, "MCP tool left out: a server offers at most {MAX_TOOLS} tools");
            continue;
        }
        if let Some(first) = tools.iter().find(|o| o.name == name) {
            tracing::warn!(
                server,
                tool = %t.name,
                "MCP tool refused: its name {name} collides with tool {:?}'s",
                first.remote
            );
            continue;
        }
        let mut description = t.description.as_deref().unwrap_or_default().to_string();
        if description.len() > MAX_DESCRIPTION {
            let mut cut = MAX_DESCRIPTION;
            while !description.is_char_boundary(cut) {
                cut -= 1;
            }
            description.truncate(cut);
        }
        tools.push(McpTool {
            name,
            remote: t.name.to_string(),
            description,
            schema: Value::Object((*t.input_schema).clone()),
        });
    }
    Ok(tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stderr_is_read_to_its_end_past_bytes_that_are_not_utf8_and_an_endless_line() {
        let mut err = b"first\n\xff\xfe not utf-8\nafter it\n".to_vec();
        err.extend(std::iter::repeat_n(b'x', 10 * STDERR_TAIL));
        err.extend(b"\nthe last line\n");
        let tail = Arc::new(Mutex::new(String::new()));
        keep_tail("t".into(), err.as_slice(), tail.clone()).await;
        let t = tail.lock().unwrap().clone();
        assert!(t.len() <= STDERR_TAIL, "{}", t.len());
        assert!(t.ends_with("x\nthe last line\n"), "{t:?}");

        let tail = Arc::new(Mutex::new(String::new()));
        keep_tail(
            "t".into(),
            &b"first\n\xff\xfe not utf-8\nafter it"[..],
            tail.clone(),
        )
        .await;
        assert_eq!(
            *tail.lock().unwrap(),
            "first\n\u{FFFD}\u{FFFD} not utf-8\nafter it\n"
        );
    }
}
