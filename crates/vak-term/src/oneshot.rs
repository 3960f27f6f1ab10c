//! `vak term -p PROMPT`: one run, its answer on stdout (or every frame as a JSON line), and an exit code that says how it ended.
//! The driver: the stream, the run call, stdin and Ctrl-C feed the renderer (`oneshot_state.rs`), which says what to print and do.

use super::conn::{answer_always_or_once, cancel_call, retry, run_call, FailKind, Failure, Transport};
use super::follow::{follow, Follower, Update};
use super::oneshot_state::{Effect, Out, Renderer, Step};
use super::render::always_line;
use super::Policy;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use vak_proto::v1 as pb;

/// A one-shot run stops trying to reach a server that has been away this long.
const GIVE_UP: Duration = Duration::from_secs(60);

pub(crate) struct OneShot {
    pub prompt: String,
    pub json: bool,
    pub policy: Policy,
}

/// Progress and outcome notes go to stderr, so stdout holds only the answer (or the JSON lines).
fn note(msg: &str) {
    eprintln!("vak: {msg}");
}

/// The process's stdout and stderr.
struct Std;

impl Out for Std {
    fn stdout(&mut self, s: &[u8]) {
        let mut out = std::io::stdout().lock();
        // A closed stdout (`| head`) is the reader's choice, not an error of the run.
        let _ = out.write_all(s).and_then(|_| out.flush());
    }

    fn note(&mut self, line: &str) {
        note(line);
    }
}

/// Reads answers to approval questions from stdin, one line each, on a thread
/// of its own (stdin has no async reader that can be abandoned mid-read).
fn stdin_lines() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        loop {
            let mut line = String::new();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    if tx.send(Some(line.trim().to_string())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// The next update the renderer is to see; the end of the stream and a fatal failure end the run.
async fn next(follower: &mut Follower) -> vak_proto::Result<Update> {
    match follower.updates.recv().await {
        None => Err(vak_proto::Error::internal("the event stream stopped")),
        Some(Update::Fatal(f)) => Err(f.into()),
        Some(u) => Ok(u),
    }
}

pub(crate) async fn run(
    conn: Arc<dyn Transport>,
    sid: String,
    after: u64,
    o: OneShot,
) -> vak_proto::Result<i32> {
    let clean = std::io::stdout().is_terminal();
    let mut r = Renderer::new(Std, sid.clone(), o.prompt.clone(), o.json, o.policy, clean);

    // Ctrl-C cancels the run instead of killing the process; registered
    // before the run exists, so no interrupt can fall in between.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;

    // Open the stream first and wait until it is open, so the run is seen from
    // its first frame; `after` also replays anything published since the
    // caller looked at the session.
    let mut follower = follow(conn.clone(), sid.clone(), Some(after), Some(GIVE_UP));
    while r.update(next(&mut follower).await?) != Step::Opened {}

    let request_id = format!("term_{}", uuid::Uuid::new_v4().simple());
    let admission = retry(run_call(
        &conn,
        pb::RunRequest {
            session_id: sid.clone(),
            prompt: o.prompt.clone(),
            request_id: request_id.clone(),
            ..Default::default()
        },
    ))
    .await?;
    r.admitted(request_id, &admission);

    let mut answers: Option<mpsc::UnboundedReceiver<Option<String>>> = None;
    loop {
        r.ask_next();
        apply(r.effects(), &conn, &sid, &mut answers);
        let step = tokio::select! {
            u = next(&mut follower) => r.update(u?),
            line = async { answers.as_mut().unwrap().recv().await }, if r.asking() => r.answered(line.flatten()),
            _ = sigint.recv() => r.interrupt(),
        };
        apply(r.effects(), &conn, &sid, &mut answers);
        if let Step::Exit(code) = step {
            return Ok(code);
        }
    }
}

/// Does what the renderer asked: answers and the cancel are sent on tasks of
/// their own (the stream is not held up), stdin is read once a question is asked.
fn apply(
    effects: Vec<Effect>,
    conn: &Arc<dyn Transport>,
    sid: &str,
    answers: &mut Option<mpsc::UnboundedReceiver<Option<String>>>,
) {
    for e in effects {
        match e {
            Effect::Answer(req) => spawn_answer(conn, req),
            Effect::Cancel => {
                let (c, s) = (conn.clone(), sid.to_string());
                tokio::spawn(async move {
                    if let Err(f) = retry(cancel_call(&c, &s)).await {
                        note(&format!("cannot cancel: {f}"));
                    }
                });
            }
            Effect::ReadStdin => {
                answers.get_or_insert_with(stdin_lines);
            }
        }
    }
}

/// Sends an approval answer without holding up the stream; a failure is
/// reported, not fatal. A rule an `always` answer stored is said on stderr
/// (one that could not be stored is explained by the server's notice).
fn spawn_answer(conn: &Arc<dyn Transport>, req: pb::ApproveRequest) {
    let (conn, rid) = (conn.clone(), req.request_id.clone());
    tokio::spawn(async move {
        match answer_always_or_once(&conn, req).await {
            Ok((r, refused)) => {
                if let Some(rule) = r.rule {
                    note(&always_line(&rule));
                }
                if let Some(f) = refused {
                    note(&format!("no always-allow rule: {f}; approved once"));
                }
            }
            // Someone else answered first, or the run ended: the stream says which.
            Err(Failure {
                kind: FailKind::Conflict | FailKind::NotFound,
                ..
            }) => {}
            Err(f) => eprintln!("vak: cannot answer approval {rid}: {f}"),
        }
    });
}
