//! `GET /pty`: the browser terminal, a WebSocket onto a shell on a pty in an open, trusted workspace; off unless `[server.web] terminal = true`, from this machine only unless `terminal_requires_loopback = false`.
//!
//! Not an RPC: a terminal is one bidirectional byte stream, which
//! browsers can reach only through a WebSocket (gRPC-web carries no client
//! streams), and a proto message around each keystroke would buy nothing.
//! The wire is: binary frames are bytes (typed input in, shell output
//! out); text frames are JSON control messages (`{"type":"resize","cols",
//! "rows"}` in; `{"type":"started","pid","shell","workspace"}` and
//! `{"type":"exit","code"}` out). docs/protocol.md section 26 has the contract.

use super::state::AppState;
use crate::errors::{status_response, to_status};
use crate::listener::PeerAddr;
use crate::metrics::{OpenStream, StreamSurface, Transport};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use bytes::Bytes;
use std::collections::HashMap;
use vak_core::error::Error;
use vak_core::host::terminal::{self, Terminal};

/// The largest message a client may send (a paste), and frame.
const MAX_MESSAGE: usize = 64 << 10;

/// How long output still arriving after the shell exited is forwarded.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The query `GET /pty` reads.
pub(crate) const PARAMS: &[&str] = &["workspace", "cols", "rows"];

/// A control message from the client.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    Resize { cols: u16, rows: u16 },
}

fn refuse(e: Error) -> Response {
    status_response(&to_status(e))
}

pub(crate) async fn pty(
    State(st): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    peer: Option<Extension<PeerAddr>>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let web = st.api.host().web.clone();
    if !web.terminal {
        return refuse(
            Error::forbidden(
                "the terminal is off: set [server.web] terminal = true in config.toml and restart",
            )
            .with_reason("terminal_off"),
        );
    }
    // Behind a proxy the peer is the proxy: only a direct loopback peer counts.
    let loopback = peer.is_some_and(|p| p.0 .0.ip().is_loopback()) && !crate::auth::proxied(&headers);
    if web.terminal_requires_loopback && !loopback {
        return refuse(
            Error::forbidden(
                "the terminal is served to this machine only ([server.web] terminal_requires_loopback)",
            )
            .with_reason("terminal_loopback_only"),
        );
    }
    let num = |k: &str, default: u16| -> Result<u16, Error> {
        q.get(k).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| Error::invalid(format!("{k}={v:?}: give a number of cells")))
        })
    };
    let size = match (num("cols", 80), num("rows", 24)) {
        (Ok(c), Ok(r)) => match terminal::size(c, r) {
            Ok(s) => s,
            Err(e) => return refuse(e),
        },
        (Err(e), _) | (_, Err(e)) => return refuse(e),
    };
    let workspaces = st.api.hub().control().workspaces().clone();
    let asked = q.get("workspace").cloned().unwrap_or_default();
    let found = tokio::task::spawn_blocking(move || {
        if asked.is_empty() {
            Ok(Some(workspaces.primary()))
        } else {
            workspaces.find(&asked)
        }
    })
    .await
    .unwrap_or_else(|e| Err(Error::internal(e.to_string())));
    let found = match found {
        Ok(found) => found,
        Err(e) => return refuse(e),
    };
    let Some(ws_dir) = found else {
        return refuse(
            Error::not_found("no open workspace there: open it first (POST /workspaces/open)")
                .with_reason("workspace_not_open"),
        );
    };
    if !ws_dir.trusted {
        return refuse(
            Error::forbidden(
                "the workspace is not trusted: vak runs no program in it (open it again with \"trust\": true)",
            )
            .with_reason("untrusted_workspace"),
        );
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(_) => {
            return refuse(Error::invalid(
                "GET /pty is a WebSocket: send Connection: Upgrade, Upgrade: websocket and Sec-WebSocket-Key/Version",
            ))
        }
    };
    let permit = match st.terminals.permit() {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    let dir = ws_dir.path.clone();
    let shell = vak_core::host::terminal::shell(web.terminal_shell.as_deref());
    let term = match tokio::task::spawn_blocking(move || Terminal::spawn(shell, &dir, size, permit)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return refuse(e),
        Err(e) => return refuse(Error::internal(e.to_string())),
    };
    let hub = st.api.hub().clone();
    let workspace = ws_dir.path.display().to_string();
    ws.max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| async move {
            let _open = OpenStream::new(Transport::WebSocket, StreamSurface::Terminal);
            serve(socket, term, workspace, hub.closed()).await;
        })
}

/// Pumps bytes both ways until the shell exits, the client goes, or the
/// server stops; the terminal is dropped (hung up) on every way out.
async fn serve(
    mut socket: WebSocket,
    mut term: Terminal,
    workspace: String,
    stopping: impl std::future::Future<Output = ()>,
) {
    let started = serde_json::json!({
        "type": "started",
        "pid": term.pid(),
        "shell": term.shell.display().to_string(),
        "workspace": workspace,
    });
    if socket.send(Message::text(started.to_string())).await.is_err() {
        return;
    }
    let exited = term.exited();
    tokio::pin!(exited, stopping);
    // Input waiting for room in the shell's queue: meanwhile output keeps
    // flowing (a shell blocked on output would never drain its input).
    let mut pending: Option<Bytes> = None;
    let close = loop {
        tokio::select! {
            msg = socket.recv(), if pending.is_none() => match msg {
                Some(Ok(Message::Binary(b))) => pending = Some(b),
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<Control>(t.as_str()) {
                    Ok(Control::Resize { cols, rows }) => {
                        if let Err(e) = terminal::size(cols, rows).and_then(|s| term.resize(s)) {
                            break Some((1008, e.message));
                        }
                    }
                    Err(e) => break Some((1008, format!("unknown control message: {e}"))),
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
                Some(Ok(_)) => {} // ping/pong: the library answers pings.
            },
            permit = term.input.reserve(), if pending.is_some() => match permit {
                Ok(p) => p.send(pending.take().unwrap_or_default()),
                Err(_) => pending = None, // the shell is gone: its exit follows
            },
            out = term.output.recv() => match out {
                Some(bytes) => {
                    if socket.send(Message::Binary(bytes)).await.is_err() {
                        break None;
                    }
                }
                // The pty is closed: the shell has exited or is about to (one
                // that closed its terminal and lives on is hung up on below).
                None => {
                    let code = tokio::time::timeout(DRAIN, exited.as_mut()).await.ok().flatten();
                    break Some((1000, exit_message(code)));
                }
            },
            code = exited.as_mut() => {
                // Its last output is what the reader still holds: drained
                // while the pty closes (whatever the shell left running
                // there gets the hangup when the terminal drops).
                // A job it left holding the terminal keeps the pty open:
                // the drain is bounded.
                let drain = async {
                    while let Some(bytes) = term.output.recv().await {
                        if socket.send(Message::Binary(bytes)).await.is_err() {
                            break;
                        }
                    }
                };
                let _ = tokio::time::timeout(DRAIN, drain).await;
                break Some((1000, exit_message(code)));
            }
            _ = stopping.as_mut() => break Some((1001, "the server is stopping".to_string())),
        }
    };
    drop(term);
    if let Some((code, reason)) = close {
        if code == 1000 {
            let _ = socket.send(Message::text(reason.clone())).await;
        }
        let reason = if code == 1000 {
            "exited".to_string()
        } else {
            reason
        };
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: truncate(&reason, 120).into(),
            })))
            .await;
    }
}

/// `{"type":"exit","code":N}` (code null when it is unknown).
fn exit_message(code: Option<u32>) -> String {
    serde_json::json!({"type": "exit", "code": code}).to_string()
}

/// At most `max` bytes of `s` on a char boundary (a close reason is at most 123 bytes).
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
