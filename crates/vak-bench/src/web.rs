//! Idle SSE streams over TLS (HTTP/1.1) or HTTP/2 (h2c), through reqwest:
//! the idle scenario's rows for the transports the raw client does not speak.

use crate::clients::{Shared, SubResult, Target};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A reqwest client for one idle stream: over TLS (HTTP/1.1, the server's
/// self-signed certificate accepted) or over h2c; its own connection either way.
fn web_client(tls: bool) -> Result<reqwest::Client, String> {
    let b = reqwest::Client::builder().pool_max_idle_per_host(1);
    let b = if tls {
        b.http1_only().danger_accept_invalid_certs(true)
    } else {
        b.http2_prior_knowledge()
    };
    b.build().map_err(|e| format!("client: {e}"))
}

fn web_url(target: &Target, tls: bool, path: &str) -> String {
    format!("{}://{}{path}", if tls { "https" } else { "http" }, target.addr)
}

/// `POST /sessions` over the same kind of connection the idle streams use.
pub(crate) async fn web_create_session(target: &Target, tls: bool) -> Result<String, String> {
    let r = web_client(tls)?
        .post(web_url(target, tls, "/sessions"))
        .bearer_auth(&target.token)
        .json(&serde_json::json!({}))
        .send()
        .await
        .map_err(|e| format!("POST /sessions: {e}"))?;
    let v: serde_json::Value = r.json().await.map_err(|e| format!("POST /sessions: {e}"))?;
    v["session_id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("POST /sessions answered {v}"))
}

/// An idle SSE subscriber over TLS or HTTP/2: reads until stream_opened,
/// then holds the stream (reading keepalives) until cancelled.
pub(crate) async fn web_idle_subscriber(
    target: Target,
    session: String,
    tls: bool,
    shared: Arc<Shared>,
) -> SubResult {
    let mut res = SubResult::default();
    let run = async {
        let resp = {
            let _permit = shared.connecting.acquire().await.map_err(|e| e.to_string())?;
            web_client(tls)?
                .get(web_url(&target, tls, &format!("/sessions/{session}/events")))
                .bearer_auth(&target.token)
                .header("accept", "text/event-stream")
                .send()
                .await
                .map_err(|e| format!("GET events: {e}"))?
        };
        if resp.status() != 200 {
            return Err(format!("GET events: {}", resp.status()));
        }
        let mut resp = resp;
        let mut seen = Vec::new();
        let mut opened = false;
        loop {
            let chunk = tokio::select! {
                c = resp.chunk() => c.map_err(|e| format!("read: {e}"))?,
                _ = shared.cancel.cancelled() => return Ok(()),
            };
            let Some(chunk) = chunk else {
                return Err("the server ended the SSE stream".to_string());
            };
            if !opened {
                seen.extend_from_slice(&chunk);
                if memchr::memmem::find(&seen, b"event: stream_opened").is_some() {
                    opened = true;
                    seen = Vec::new();
                    shared.opened.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    };
    if let Err(e) = run.await {
        res.error = Some(e);
    }
    res
}
