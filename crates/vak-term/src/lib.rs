//! `vak term`: the terminal client. It finds a running server, creates or attaches a session, and either runs one prompt (`-p`) or opens an interactive prompt.
//!
//! It is a client like any other: everything goes through the public API, over
//! REST/SSE or gRPC (`--transport`), with identical behaviour on both.
//!
//! - `conn.rs`: finding the server; the `Transport` trait, implemented by
//!   `rest.rs` (reqwest, with the SSE parser in `sse.rs`) and `grpc.rs` (tonic).
//! - `follow.rs`: the event stream, resumed from the last seq after any cut.
//! - `render.rs`: how each frame is shown.
//! - `oneshot.rs`: `-p PROMPT`, driving the renderer state machine of
//!   `oneshot_state.rs`; `interactive.rs` with `screen.rs` and `editor.rs`: the prompt.

#![warn(unreachable_pub)]

mod conn;
mod editor;
mod follow;
mod grpc;
mod interactive;
mod oneshot;
mod oneshot_state;
mod render;
mod rest;
mod screen;
mod sse;
mod transport;

use clap::{Parser, ValueEnum};
use conn::{check_id, open, Source, Transport, TransportKind};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use vak_proto::json::to_json;
use vak_proto::v1 as pb;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TransportArg {
    /// REST calls and the SSE event stream.
    Sse,
    /// gRPC (HTTP/2 cleartext).
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    /// The answer's text (one-shot) or a table of sessions (--list).
    Text,
    /// One JSON object per line: every frame, in the schema of the SSE data.
    Json,
}

/// What to do with approval requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Ask: `[y]es / [n]o / [a]lways` (one-shot: read from stdin).
    Ask,
    /// Deny every request.
    Deny,
    /// Approve every request.
    Allow,
}

#[derive(Parser, Debug)]
#[command(
    after_help = "Exit status of a one-shot run (-p): 0 completed, 1 failed (or vak term could not do its job), 130 cancelled."
)]
pub struct TermArgs {
    /// The server's URL. Default: the one in server.json in the home.
    #[arg(long, env = "VAK_URL")]
    pub url: Option<String>,
    /// The bearer token. Default: the one in server.json in the home.
    #[arg(long, env = "VAK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The data home whose server.json names the server.
    #[arg(long, env = "VAK_HOME")]
    pub home: Option<PathBuf>,
    /// PEM certificate(s) to trust for an https server. Default: the home's
    /// development certificate (`vak serve --tls-self-signed`), if any.
    #[arg(long, value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
    /// How to talk to the server.
    #[arg(long, value_enum, default_value = "sse")]
    pub transport: TransportArg,
    /// Attach to this session instead of creating one.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// List the server's sessions and exit.
    #[arg(long, conflicts_with_all = ["prompt", "session"])]
    pub list: bool,
    /// Run one prompt, print the answer and exit ("-" reads it from stdin).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// What a one-shot run (or --list) prints on stdout.
    #[arg(long, value_enum, default_value = "text")]
    pub output: OutputArg,
    /// What to do with approval requests. Default: ask when stdin is a
    /// terminal, else deny.
    #[arg(long, value_enum)]
    pub approve: Option<Policy>,
}

/// Runs `vak term`; the result is the process's exit code.
pub async fn run(args: TermArgs) -> vak_proto::Result<i32> {
    let source = Source {
        url: args.url.clone(),
        token: args.token.clone(),
        home: args.home.clone(),
        ca_cert: args.ca_cert.clone(),
    };
    let kind = match args.transport {
        TransportArg::Sse => TransportKind::Sse,
        TransportArg::Grpc => TransportKind::Grpc,
    };
    let (target, conn) = open(&source, kind)?;
    let json = args.output == OutputArg::Json;

    if args.list {
        return list(conn, json).await;
    }
    let prompt = prompt(&args, json)?;

    // The session, and the seq to follow it from. The interactive prompt
    // creates its session with the first prompt: quitting before that leaves none behind.
    let attached = match &args.session {
        Some(id) => {
            check_id("session id", id)?;
            Some(conn.attach(id).await?)
        }
        None => None,
    };

    match prompt {
        Some(prompt) => one_shot(&args, conn, attached, prompt, json).await,
        None => prompt_loop(&args, &target, conn, attached).await,
    }
}

/// `--list`: the server's sessions.
async fn list(conn: Arc<dyn Transport>, json: bool) -> vak_proto::Result<i32> {
    let sessions = conn::retry({
        let c = conn.clone();
        move || {
            let c = c.clone();
            Box::pin(async move { c.list_sessions().await })
        }
    })
    .await?;
    print_sessions(sessions, json);
    Ok(0)
}

/// The one-shot prompt (`-p`, read from stdin for `-`), or None for the
/// interactive prompt, which needs a terminal and text output.
fn prompt(args: &TermArgs, json: bool) -> vak_proto::Result<Option<String>> {
    if args.prompt.is_none() {
        if json {
            return Err(vak_proto::Error::invalid(
                "--output json needs -p PROMPT or --list",
            ));
        }
        if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
            return Err(vak_proto::Error::invalid(
                "the interactive mode needs a terminal; pass -p PROMPT to run one prompt",
            ));
        }
    }
    let prompt = match args.prompt.as_deref() {
        Some("-") => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            Some(s)
        }
        other => other.map(str::to_string),
    };
    if prompt.as_ref().is_some_and(|p| p.trim().is_empty()) {
        return Err(vak_proto::Error::invalid("the prompt is empty"));
    }
    Ok(prompt)
}

/// `-p`: one run in the attached session (or a new one); its exit code.
async fn one_shot(
    args: &TermArgs,
    conn: Arc<dyn Transport>,
    attached: Option<pb::SessionSummary>,
    prompt: String,
    json: bool,
) -> vak_proto::Result<i32> {
    let summary = match attached {
        Some(s) => s,
        None => {
            let id = conn.create_session().await?;
            conn.attach(&id).await?
        }
    };
    let sid = summary.session_id.clone();
    // Reading answers from a pipe by default would consume input meant for no one.
    let policy = args.approve.unwrap_or(
        if std::io::stdin().is_terminal() && args.prompt.as_deref() != Some("-") {
            Policy::Ask
        } else {
            Policy::Deny
        },
    );
    let after = summary.latest_seq;
    let code = oneshot::run(conn, sid, after, oneshot::OneShot { prompt, json, policy }).await?;
    let _ = std::io::stdout().flush();
    Ok(code)
}

/// The interactive prompt, in the attached session (or one its first prompt creates).
async fn prompt_loop(
    args: &TermArgs,
    target: &conn::Target,
    conn: Arc<dyn Transport>,
    summary: Option<pb::SessionSummary>,
) -> vak_proto::Result<i32> {
    let which = match &summary {
        Some(s) => format!("session {}", s.session_id),
        None => "new session".to_string(),
    };
    let header = vec![
        format!("vak term · {which} · {} over {}", target.url, conn.name()),
        "Enter sends (steers while a run is going) · Ctrl-C cancels · Ctrl-D exits · /help".to_string(),
    ];
    interactive::run(
        conn,
        summary.map(|s| (s.session_id.clone(), s)),
        interactive::Options {
            policy: args.approve.unwrap_or(Policy::Ask),
            header,
        },
    )
    .await
}

fn print_sessions(sessions: Vec<pb::SessionSummary>, json: bool) {
    let mut out = std::io::stdout().lock();
    if json {
        let mut line = to_json(&pb::ListSessionsResponse { sessions });
        line.push(b'\n');
        let _ = out.write_all(&line);
    } else {
        for s in sessions {
            let _ = writeln!(out, "{}", session_row(&s));
        }
    }
    let _ = out.flush();
}

/// One `--list` row: id, creation time, events, state, title.
fn session_row(s: &pb::SessionSummary) -> String {
    let state = if s.busy {
        "busy"
    } else if s.loaded {
        "idle"
    } else {
        "on disk"
    };
    let title = render::clean(&s.title).replace('\n', " ");
    let events = render::noun_for(s.latest_seq as usize, "event");
    format!(
        "{}  {}  {:>6} {events:<6}  {state:<7}  {title}",
        s.session_id, s.created_at, s.latest_seq
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_rows_count_events_in_the_singular_for_one() {
        let row = |latest_seq| {
            session_row(&pb::SessionSummary {
                session_id: "s1".into(),
                created_at: "2025-01-01T00:00:00Z".into(),
                latest_seq,
                loaded: true,
                title: "a\ntitle".into(),
                ..Default::default()
            })
        };
        assert_eq!(
            row(1),
            "s1  2025-01-01T00:00:00Z       1 event   idle     a title"
        );
        assert_eq!(
            row(12),
            "s1  2025-01-01T00:00:00Z      12 events  idle     a title"
        );
    }
}
