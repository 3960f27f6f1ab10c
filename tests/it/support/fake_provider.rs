//! A fake model service on 127.0.0.1:0: it answers each request with the next scripted reply (a recorded SSE stream from tests/fixtures/providers, an HTTP error, a stall) and records every request it receives.

#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How long a wait on the fake may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A 200 `text/event-stream` body: each event is sent as its own
    /// chunks (split mid-event, as a network would), and with `stall` the
    /// connection then stays open with nothing more.
    Sse { events: Vec<String>, stall: bool },
    /// Any status with headers and a body (errors, model lists).
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
}

impl Reply {
    /// A recorded stream from `tests/fixtures/providers/<name>`.
    pub fn fixture(name: &str) -> Reply {
        Reply::Sse {
            events: split_events(&fixture(name)),
            stall: false,
        }
    }

    /// A recorded stream with `from` replaced by `to` (another stop reason).
    pub fn fixture_with(name: &str, from: &str, to: &str) -> Reply {
        let text = fixture(name);
        assert!(text.contains(from), "{name} has {from}");
        Reply::Sse {
            events: split_events(&text.replace(from, to)),
            stall: false,
        }
    }

    /// A recorded stream that stops short after its events and stays open.
    pub fn stalling(name: &str) -> Reply {
        Reply::Sse {
            events: split_events(&fixture(name)),
            stall: true,
        }
    }

    pub fn status(status: u16, body: &str) -> Reply {
        Reply::Status {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Status { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }
}

pub fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/providers")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// The events of a recorded stream, each with its blank line.
fn split_events(text: &str) -> Vec<String> {
    text.split_inclusive("\n\n").map(str::to_string).collect()
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    /// The JSON body (Null when empty or not JSON).
    pub body: Value,
    pub raw: String,
    pub at: Instant,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct State {
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    changed: Notify,
}

pub struct FakeProvider {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl FakeProvider {
    pub async fn start() -> FakeProvider {
        let state = Arc::new(State::default());
        let app = axum::Router::new().fallback({
            let state = state.clone();
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = state.clone();
                async move { answer(&state, method, uri, headers, body) }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider {
            addr,
            url: format!("http://{addr}"),
            state,
            task,
        }
    }

    /// A route to this fake model service, as an OpenAI-compatible provider.
    pub fn openai_route(&self) -> vak::core::session::live::Route {
        use vak::core::provider::ProviderKind;
        self.route(ProviderKind::OpenAi, format!("{}/v1/", self.url), "gpt-4.1")
    }

    /// A route to this fake model service, as the Anthropic Messages API.
    pub fn anthropic_route(&self) -> vak::core::session::live::Route {
        use vak::core::provider::ProviderKind;
        self.route(ProviderKind::Anthropic, self.url.clone(), "claude-sonnet-4-5")
    }

    fn route(
        &self,
        kind: vak::core::provider::ProviderKind,
        base: String,
        model: &str,
    ) -> vak::core::session::live::Route {
        use vak::core::provider::{connect_with, http::ClientOptions, Endpoint, Secret};
        let endpoint = Endpoint {
            kind,
            base_url: Some(base),
            key: Some(Secret::new("sk-test".into())),
        };
        vak::core::session::live::Route {
            provider: connect_with(&endpoint, &ClientOptions::default()).unwrap(),
            model: model.into(),
            context_window: None,
        }
    }

    /// Queues replies for the next requests, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests arrived and returns them all.
    pub async fn wait_requests(&self, n: usize) -> Vec<Recorded> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                let seen = self.state.changed.notified();
                let reqs = self.requests();
                if reqs.len() >= n {
                    return reqs;
                }
                seen.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} requests within the deadline, saw {:?}", self.requests()))
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(state: &State, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let raw = String::from_utf8_lossy(&body).into_owned();
    state.requests.lock().unwrap().push(Recorded {
        method: method.to_string(),
        path: uri.path().to_string(),
        headers,
        body: serde_json::from_str(&raw).unwrap_or(Value::Null),
        raw,
        at: Instant::now(),
    });
    state.changed.notify_waiters();
    let reply = state.script.lock().unwrap().pop_front();
    match reply {
        None => Response::builder()
            .status(500)
            .body(Body::from("the fake provider's script is exhausted"))
            .unwrap(),
        Some(Reply::Status {
            status,
            headers,
            body,
        }) => {
            let mut b = Response::builder().status(StatusCode::from_u16(status).unwrap());
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.body(Body::from(body)).unwrap()
        }
        Some(Reply::Sse { events, stall }) => {
            // Each event in two chunks, cut mid-line, so the client's parser
            // must carry partial events across reads.
            let mut chunks: Vec<Result<Bytes, Infallible>> = Vec::new();
            for e in events {
                let mut cut = e.len() / 2;
                while !e.is_char_boundary(cut) {
                    cut -= 1;
                }
                chunks.push(Ok(Bytes::from(e[..cut].to_string())));
                chunks.push(Ok(Bytes::from(e[cut..].to_string())));
            }
            let body = futures_util::stream::iter(chunks).then(|c| async move {
                tokio::task::yield_now().await;
                c
            });
            let body: futures_util::stream::BoxStream<'static, Result<Bytes, Infallible>> = if stall {
                Box::pin(body.chain(futures_util::stream::pending()))
            } else {
                Box::pin(body)
            };
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream; charset=utf-8")
                .header("cache-control", "no-cache")
                .body(Body::from_stream(body))
                .unwrap()
        }
    }
}
