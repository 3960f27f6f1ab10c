//! The REST/SSE transport: JSON bodies over reqwest and the session's event stream as SSE, in the proto3 JSON mapping the server speaks.

use super::sse::SseParser;
use super::transport::{check_id, Events, FailKind, Failure, Fut, Target, Transport, CONNECT_TIMEOUT};
use futures_util::StreamExt;
use prost::{Message, Name};
use std::time::Duration;
use vak_proto::json::{from_json, to_json};
use vak_proto::v1 as pb;

/// The server sends `: keepalive` every 15 s, so a stream silent for three of
/// those is dead (a cut that no FIN announced) and is reopened from the cursor.
const READ_TIMEOUT: Duration = Duration::from_secs(45);

pub(crate) struct Rest {
    http: reqwest::Client,
    url: String,
    auth: String,
}

impl Rest {
    pub(crate) fn new(target: &Target) -> Result<Rest, Failure> {
        let mut builder = reqwest::Client::builder()
            // The model providers enable reqwest's web PKI roots; a vak
            // server is trusted only through the PEM named below.
            .tls_built_in_root_certs(false)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .tcp_keepalive(Duration::from_secs(15));
        if target.url.starts_with("https://") {
            // No built-in roots: a vak server's certificate is one the user
            // made or `--tls-self-signed` made, so its PEM is named explicitly.
            let pem = target.ca_pem.as_deref().ok_or_else(|| {
                Failure::fatal(format!(
                    "{} is https: pass --ca-cert with the PEM of its certificate (or of the CA that signed it)",
                    target.url
                ))
            })?;
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Failure::fatal(format!("--ca-cert is not PEM: {e}")))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| Failure::fatal(format!("cannot build the HTTP client: {e}")))?;
        Ok(Rest {
            http,
            url: target.url.clone(),
            auth: format!("Bearer {}", target.token),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .header(reqwest::header::AUTHORIZATION, &self.auth)
    }

    async fn call<Req, Resp>(
        &self,
        method: reqwest::Method,
        path: String,
        body: Option<&Req>,
    ) -> Result<Resp, Failure>
    where
        Req: Message + Name,
        Resp: Message + Name + Default,
    {
        let mut req = self.request(method, &path);
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(to_json(b));
        }
        let resp = req.send().await.map_err(|e| http_failure(&self.url, e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| http_failure(&self.url, e))?;
        if !status.is_success() {
            return Err(status_failure(status.as_u16(), &bytes));
        }
        from_json::<Resp>(&bytes).map_err(|e| Failure::fatal(format!("the server's answer to {path}: {e}")))
    }
}

/// A connection-level error: nothing (or not all) reached the server.
fn http_failure(url: &str, e: reqwest::Error) -> Failure {
    // The innermost cause ("Connection refused (os error 111)") says the most;
    // reqwest's own wrapping repeats the URL.
    let mut cause = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        cause = s.to_string();
        src = s.source();
    }
    let msg = format!("{url}: {cause}");
    if e.is_builder() {
        Failure::fatal(msg)
    } else {
        Failure::transient(msg)
    }
}

/// An HTTP error answer, from its `{"error": {"code", "message"}}` body.
fn status_failure(status: u16, body: &[u8]) -> Failure {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("HTTP {status}: {}", String::from_utf8_lossy(body).trim()));
    let kind = match status {
        404 => FailKind::NotFound,
        401 => FailKind::Unauthenticated,
        409 => FailKind::Conflict,
        429 | 502 | 503 | 504 => FailKind::Transient,
        _ => FailKind::Fatal,
    };
    Failure::new(kind, message)
}

use reqwest::Method;

impl Transport for Rest {
    fn name(&self) -> &'static str {
        "sse"
    }

    fn create_session(&self) -> Fut<'_, String> {
        Box::pin(async move {
            let r: pb::CreateSessionResponse = self
                .call(
                    Method::POST,
                    "/sessions".into(),
                    Some(&pb::CreateSessionRequest::default()),
                )
                .await?;
            Ok(r.session_id)
        })
    }

    fn list_sessions(&self) -> Fut<'_, Vec<pb::SessionSummary>> {
        Box::pin(async move {
            let r: pb::ListSessionsResponse = self
                .call::<pb::ListSessionsRequest, _>(Method::GET, "/sessions".into(), None)
                .await?;
            Ok(r.sessions)
        })
    }

    fn attach(&self, session_id: &str) -> Fut<'_, pb::SessionSummary> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r: pb::AttachSessionResponse = self
                .call(
                    Method::POST,
                    format!("/sessions/{sid}/attach"),
                    Some(&pb::AttachSessionRequest {
                        session_id: sid.clone(),
                    }),
                )
                .await?;
            r.session
                .ok_or_else(|| Failure::fatal("the attach answer carries no session"))
        })
    }

    fn run(&self, req: pb::RunRequest) -> Fut<'_, pb::Admission> {
        Box::pin(async move {
            check_id("session id", &req.session_id)?;
            let path = format!("/sessions/{}/run", req.session_id);
            self.call(Method::POST, path, Some(&req)).await
        })
    }

    fn steer(&self, req: pb::SteerRequest) -> Fut<'_, pb::Admission> {
        Box::pin(async move {
            check_id("session id", &req.session_id)?;
            let path = format!("/sessions/{}/steering", req.session_id);
            self.call(Method::POST, path, Some(&req)).await
        })
    }

    fn approve(&self, req: pb::ApproveRequest) -> Fut<'_, pb::ApproveResponse> {
        Box::pin(async move {
            check_id("session id", &req.session_id)?;
            check_id("approval id", &req.request_id)?;
            let path = format!("/sessions/{}/approvals/{}", req.session_id, req.request_id);
            self.call(Method::POST, path, Some(&req)).await
        })
    }

    fn cancel(&self, session_id: &str) -> Fut<'_, pb::CancelResponse> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            self.call(
                Method::POST,
                format!("/sessions/{sid}/cancel"),
                Some(&pb::CancelRequest {
                    session_id: sid.clone(),
                }),
            )
            .await
        })
    }

    fn transcript(&self, session_id: &str) -> Fut<'_, pb::Transcript> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            self.call::<pb::GetTranscriptRequest, _>(Method::GET, format!("/sessions/{sid}/transcript"), None)
                .await
        })
    }

    fn presentation(&self, session_id: &str) -> Fut<'_, pb::OutputTimeline> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            self.call::<pb::GetPresentationRequest, _>(
                Method::GET,
                format!("/sessions/{sid}/presentation"),
                None,
            )
            .await
        })
    }

    fn list_skills(&self, session_id: Option<&str>) -> Fut<'_, Vec<pb::Skill>> {
        let session_id = session_id.map(str::to_string);
        Box::pin(async move {
            let path = match &session_id {
                Some(sid) => {
                    check_id("session id", sid)?;
                    format!("/skills?session_id={sid}")
                }
                None => "/skills".to_string(),
            };
            let r: pb::SkillList = self
                .call::<pb::ListSkillsRequest, _>(Method::GET, path, None)
                .await?;
            Ok(r.skills)
        })
    }

    fn list_workers(&self, session_id: &str) -> Fut<'_, Vec<pb::Worker>> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r: pb::ListWorkersResponse = self
                .call::<pb::ListWorkersRequest, _>(Method::GET, format!("/sessions/{sid}/workers"), None)
                .await?;
            Ok(r.workers)
        })
    }

    fn subscribe(&self, session_id: &str, after: Option<u64>) -> Fut<'_, Events> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let mut req = self
                .request(Method::GET, &format!("/sessions/{sid}/events"))
                .header(reqwest::header::ACCEPT, "text/event-stream");
            if let Some(after) = after {
                // The header EventSource itself resumes with.
                req = req.header("last-event-id", after.to_string());
            }
            let resp = req.send().await.map_err(|e| http_failure(&self.url, e))?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.bytes().await.unwrap_or_default();
                return Err(status_failure(status.as_u16(), &body));
            }
            let url = self.url.clone();
            let bytes = resp.bytes_stream();
            let events = futures_util::stream::unfold(
                (
                    bytes,
                    SseParser::default(),
                    std::collections::VecDeque::new(),
                    false,
                ),
                move |(mut bytes, mut parser, mut ready, done)| {
                    let url = url.clone();
                    async move {
                        loop {
                            if let Some(item) = ready.pop_front() {
                                return Some((item, (bytes, parser, ready, done)));
                            }
                            if done {
                                return None;
                            }
                            match bytes.next().await {
                                None => return None,
                                Some(Err(e)) => {
                                    return Some((Err(http_failure(&url, e)), (bytes, parser, ready, true)));
                                }
                                Some(Ok(chunk)) => match parser.feed(&chunk) {
                                    Err(e) => ready.push_back(Err(Failure::transient(e))),
                                    Ok(frames) => {
                                        for f in frames {
                                            ready.push_back(
                                                from_json::<pb::Event>(f.data.as_bytes()).map_err(|e| {
                                                    Failure::fatal(format!(
                                                        "an SSE frame the client cannot read: {e}"
                                                    ))
                                                }),
                                            );
                                        }
                                    }
                                },
                            }
                        }
                    }
                },
            );
            Ok(Box::pin(events) as Events)
        })
    }
}
