//! What the HTTP model providers share: the client and its timeouts, failure classification, and a bounded, idle-timed SSE event stream.

use super::{Failure, FailureKind, NetCause, ProviderError, Secret};
use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::HeaderMap;
use std::pin::Pin;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// The most of a raw error body or status a `Failure::detail` keeps (it goes to the log).
pub const MAX_DETAIL: usize = 4 * 1024;

/// Timeouts and bounds of one provider client. `Default` is what `connect` uses.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientOptions {
    /// Establishing the TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// From sending the request to the response's status and headers; a
    /// model that must read a long prompt first may take a while.
    pub response_timeout: Duration,
    /// The longest silence between two chunks of a streamed response (a
    /// stalled stream fails as Network, retryable). Both services send
    /// keep-alives (Anthropic `ping`, OpenAI-compatible servers comments)
    /// well within it, but a reasoning model may think silently for long.
    pub idle_timeout: Duration,
    /// The largest single SSE event (and line) accepted.
    pub max_event_bytes: usize,
    /// The largest assembled argument JSON of one tool call.
    pub max_tool_args_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(10),
            // Ollama loads a model before it answers, which can take minutes.
            response_timeout: Duration::from_secs(300),
            // OpenAI's reasoning models may be silent while they think (the
            // SDKs allow a 10-minute request; Codex's stream idle limit is 5).
            idle_timeout: Duration::from_secs(300),
            max_event_bytes: 4 * 1024 * 1024,
            max_tool_args_bytes: 4 * 1024 * 1024,
        }
    }
}

/// One reqwest client per provider instance: it pools connections. No
/// overall timeout, since a streamed turn may legitimately last minutes;
/// `send` and `SseStream` time each phase instead.
///
/// It follows no redirect: the key is a header vak adds to each request,
/// and reqwest's default policy re-sends every header but `Authorization`
/// and cookies to wherever a redirect points, so Anthropic's `x-api-key`
/// went to any origin a 307 named. A same-origin-only policy would be safe
/// too, but no model API redirects its own endpoints, and a base URL that
/// redirects (http to https, a moved host) is a configuration to fix, which
/// the 3xx failure says (`FailureKind::Redirect`), rather than something to
/// follow on every request.
pub fn client(opts: &ClientOptions) -> Result<reqwest::Client, Failure> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(opts.connect_timeout)
        .tcp_keepalive(Duration::from_secs(30))
        .user_agent(concat!("vak/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| {
            Failure::new(
                FailureKind::NotConfigured,
                format!("cannot build the HTTP client: {e}"),
                false,
            )
        })
}

/// A header value carrying a key: marked sensitive (never shown in Debug
/// output); a key that cannot be a header value is refused up front rather
/// than failing every request.
pub fn key_header(value: &str) -> Result<reqwest::header::HeaderValue, Failure> {
    let mut v = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
        Failure::new(
            FailureKind::NotConfigured,
            "the API key contains characters an HTTP header cannot carry",
            false,
        )
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// `s` cut to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}

/// A failure's detail with the key taken out: error bodies may echo it back
/// (a mistyped key is quoted by some servers), and the detail is logged.
pub fn scrub(mut failure: Failure, key: Option<&Secret>) -> Failure {
    if let Some(k) = key {
        if !k.expose().is_empty() && failure.detail.contains(k.expose()) {
            failure.detail = failure.detail.replace(k.expose(), "[redacted]");
        }
    }
    failure
}

/// A transport error (no HTTP status): connect failures, resets, timeouts.
/// All retryable: the next attempt may find the network back.
pub fn network(what: &str, e: &reqwest::Error) -> Failure {
    // reqwest's Display names the URL (never the key, which is a header).
    let mut detail = format!("{what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail.push_str(&format!(": {s}"));
        source = s.source();
    }
    Failure::new(FailureKind::Network, truncate(&detail, MAX_DETAIL), true).with_cause(net_cause(e))
}

/// Why a transport error happened, from the kinds of the errors it wraps
/// (the OS's `ECONNREFUSED`, a reset, a timeout), never from their text.
pub fn net_cause(e: &reqwest::Error) -> Option<NetCause> {
    use std::io::ErrorKind;
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::ConnectionRefused => return Some(NetCause::Refused),
                ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof => return Some(NetCause::Closed),
                ErrorKind::TimedOut => return Some(NetCause::TimedOut),
                _ => {}
            }
        }
        source = s.source();
    }
    if e.is_timeout() {
        Some(NetCause::TimedOut)
    } else if e.is_connect() {
        Some(NetCause::NoConnection)
    } else {
        None
    }
}

/// `HOST:PORT` of a base URL (the scheme's port when none is given), for
/// messages a person reads: no scheme, user, path or query, which may
/// carry secrets. None when it is not a URL.
pub fn host_of(base: &str) -> Option<String> {
    let url = reqwest::Url::parse(base.trim()).ok()?;
    Some(format!("{}:{}", url.host_str()?, url.port_or_known_default()?))
}

/// Asks `url` once (GET, with whatever `request` carries) and reads only
/// the status: any HTTP answer, even 401 or 404, means something listens.
/// Err (a `Network` failure with its cause) when nothing answered within
/// `timeout`. The provider's own client, so its redirect rule holds: a
/// redirect is an answer, and is not followed.
pub async fn probe(request: reqwest::RequestBuilder, timeout: Duration) -> Result<(), Failure> {
    match tokio::time::timeout(timeout, request.send()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(network("probe failed", &e)),
        Err(_) => Err(Failure::new(
            FailureKind::Network,
            format!("no answer within {timeout:?}"),
            true,
        )
        .with_cause(Some(NetCause::TimedOut))),
    }
}

/// Whether an error text says the prompt does not fit the context window.
/// Both services answer 400 with their own wording (and vLLM, llama.cpp and
/// Ollama with theirs), so this looks for the phrases they use.
pub fn says_context_too_long(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "context window",
        "prompt is too long",
        "too many tokens",
        "exceeds the context",
        "maximum context",
        "input is too long",
        "request too large",
    ]
    .iter()
    .any(|p| t.contains(p))
}

/// How long the service asked us to wait: `retry-after-ms`, else
/// `retry-after` as seconds or an HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        // Clamped: from_secs_f64 panics past u64 seconds (the agent caps the wait anyway).
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms.min(86_400_000.0) / 1000.0));
        }
    }
    let v = text("retry-after")?;
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// Classifies a non-2xx answer. `body` is the (bounded) error body.
pub fn classify_status(status: u16, headers: &HeaderMap, body: &str) -> Failure {
    if (300..400).contains(&status) {
        // Not followed (see `client`); where it pointed goes to the log.
        let location = headers
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let detail = truncate(
            &format!("HTTP {status} redirect to {location:?}, not followed: {body}"),
            MAX_DETAIL,
        );
        return Failure::new(FailureKind::Redirect(status), detail, false);
    }
    let (kind, retryable) = match status {
        401 | 403 => (FailureKind::Auth, false),
        408 => (FailureKind::Network, true),
        409 => (FailureKind::BadResponse, true),
        429 => (FailureKind::RateLimit, true),
        503 | 529 => (FailureKind::Overloaded, true),
        400 | 413 if says_context_too_long(body) => (FailureKind::ContextTooLong, false),
        500..=599 => (FailureKind::BadResponse, true),
        _ => (FailureKind::BadResponse, false),
    };
    let detail = truncate(&format!("HTTP {status}: {body}"), MAX_DETAIL);
    let mut f = Failure::new(kind, detail, retryable);
    // The service knows best (Anthropic and OpenAI both send this).
    match headers.get("x-should-retry").and_then(|v| v.to_str().ok()) {
        Some("true") => f.retryable = true,
        Some("false") => f.retryable = false,
        _ => {}
    }
    f.retry_after = retry_after(headers);
    f
}

/// Classifies an error the service reported by its type name, as the JSON
/// error objects carry it (`{"error": {"type": …, "message": …}}`): in a
/// stream, or in a 200 body. `raw` is the whole error, for the detail.
pub fn classify_error_type(kind: &str, raw: &str) -> Failure {
    let (kind, retryable) = match kind {
        "overloaded_error" => (FailureKind::Overloaded, true),
        "rate_limit_error" | "rate_limit_exceeded" => (FailureKind::RateLimit, true),
        // Out of credit: waiting will not help.
        "insufficient_quota" => (FailureKind::RateLimit, false),
        "authentication_error" | "permission_error" | "invalid_api_key" => (FailureKind::Auth, false),
        "invalid_request_error" | "context_length_exceeded" if says_context_too_long(raw) => {
            (FailureKind::ContextTooLong, false)
        }
        "invalid_request_error" | "not_found_error" | "request_too_large" => {
            (FailureKind::BadResponse, false)
        }
        // api_error, server_error, timeouts and what we do not know: an
        // error in the middle of a stream is mostly the service's own
        // trouble, which the next attempt may not meet.
        _ => (FailureKind::BadResponse, true),
    };
    Failure::new(
        kind,
        truncate(&format!("stream error: {raw}"), MAX_DETAIL),
        retryable,
    )
}

/// Reads at most `max` bytes of a response body (an error body can be anything).
pub async fn bounded_text(resp: reqwest::Response, max: usize) -> String {
    let mut buf: Vec<u8> = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = max.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= max {
            break;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sends `request` and waits for its headers, racing the response timeout
/// and `cancel`. A non-2xx status is read (bounded) and classified.
pub async fn send(
    request: reqwest::RequestBuilder,
    opts: &ClientOptions,
    key: Option<&Secret>,
    cancel: &CancellationToken,
) -> Result<reqwest::Response, ProviderError> {
    let resp = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
        r = tokio::time::timeout(opts.response_timeout, request.send()) => match r {
            Err(_) => {
                return Err(ProviderError::Failed(Failure::new(
                    FailureKind::Network,
                    format!("no response headers within {:?}", opts.response_timeout),
                    true,
                ).with_cause(Some(NetCause::TimedOut))))
            }
            Ok(Err(e)) => return Err(ProviderError::Failed(scrub(network("request failed", &e), key))),
            Ok(Ok(resp)) => resp,
        },
    };
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
        b = tokio::time::timeout(opts.idle_timeout, bounded_text(resp, MAX_DETAIL)) => b.unwrap_or_default(),
    };
    Err(ProviderError::Failed(scrub(
        classify_status(status, &headers, &body).with_status(status),
        key,
    )))
}

/// The 2xx response as an event stream. A JSON body instead (a server that
/// ignored `stream: true`, or a proxy answering an error with 200) is read
/// and reported: as the error it carries, else as a bad response.
pub async fn event_stream(
    resp: reqwest::Response,
    opts: &ClientOptions,
    key: Option<&Secret>,
    cancel: &CancellationToken,
) -> Result<SseStream, ProviderError> {
    let json = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json") && !ct.contains("event-stream"));
    if !json {
        return Ok(SseStream::new(resp, opts));
    }
    let body = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
        b = tokio::time::timeout(opts.idle_timeout, bounded_text(resp, MAX_DETAIL)) => b.unwrap_or_default(),
    };
    let error = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error").cloned());
    let failure = match error {
        Some(e) => {
            let kind = e
                .get("type")
                .and_then(|t| t.as_str())
                .filter(|t| !t.is_empty())
                .or_else(|| e.get("code").and_then(|c| c.as_str()))
                .unwrap_or("");
            classify_error_type(kind, &body)
        }
        None => Failure::new(
            FailureKind::BadResponse,
            truncate(&format!("expected an event stream, got JSON: {body}"), MAX_DETAIL),
            false,
        ),
    };
    Err(ProviderError::Failed(scrub(failure, key)))
}

/// Why the byte stream under the SSE parser stopped.
#[derive(Debug)]
pub enum StreamError {
    Transport(reqwest::Error),
    /// One event or line went past `ClientOptions::max_event_bytes`.
    TooLarge(usize),
    /// No bytes for this long.
    Idle(Duration),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Transport(e) => write!(f, "{e}"),
            StreamError::TooLarge(max) => write!(f, "an SSE event is larger than {max} bytes"),
            StreamError::Idle(idle) => write!(f, "nothing for {idle:?}"),
        }
    }
}

/// Counts the bytes of the SSE event being received (since the last blank
/// line), so one endless line or event fails instead of filling memory:
/// the parser buffers an event until it is complete.
#[derive(Debug, Default)]
pub struct EventBound {
    max: usize,
    /// Bytes of the current event so far (its complete lines and the partial one).
    event: usize,
    /// Bytes of the current line so far, without its line ending.
    line: usize,
}

impl EventBound {
    pub fn new(max: usize) -> Self {
        EventBound {
            max,
            ..Default::default()
        }
    }

    /// Accounts for `chunk`; false when an event went over the bound.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        for &b in chunk {
            match b {
                b'\n' => {
                    // A blank line ends the event.
                    if self.line == 0 {
                        self.event = 0;
                    }
                    self.line = 0;
                }
                b'\r' => {}
                _ => {
                    self.line += 1;
                    self.event += 1;
                }
            }
            if self.event > self.max {
                return false;
            }
        }
        true
    }
}

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<StreamError>>> + Send>>;

/// A response body as SSE events, with the idle timeout, the size bound and cancellation.
pub struct SseStream {
    events: Events,
}

impl SseStream {
    pub fn new(resp: reqwest::Response, opts: &ClientOptions) -> Self {
        Self::from_bytes(
            resp.bytes_stream().map(|r| r.map_err(StreamError::Transport)),
            opts,
        )
    }

    /// From any byte stream (unit tests feed recorded chunks).
    ///
    /// The idle timeout runs between chunks of bytes, not between events:
    /// a comment (`: PROCESSING`, a keep-alive) is a sign of life although
    /// the parser drops it.
    pub fn from_bytes(
        bytes: impl Stream<Item = Result<Bytes, StreamError>> + Send + 'static,
        opts: &ClientOptions,
    ) -> Self {
        let idle = opts.idle_timeout;
        let bound = EventBound::new(opts.max_event_bytes);
        // State: the byte stream, the bound, and whether it already failed
        // (after an error nothing more is read).
        let checked = futures_util::stream::unfold(
            (Box::pin(bytes), bound, false),
            move |(mut bytes, mut bound, failed)| async move {
                if failed {
                    return None;
                }
                let item = match tokio::time::timeout(idle, bytes.next()).await {
                    Err(_) => Err(StreamError::Idle(idle)),
                    Ok(None) => return None,
                    Ok(Some(Ok(chunk))) if !bound.feed(&chunk) => Err(StreamError::TooLarge(bound.max)),
                    Ok(Some(other)) => other,
                };
                let failed = item.is_err();
                Some((item, (bytes, bound, failed)))
            },
        );
        SseStream {
            events: Box::pin(checked.eventsource()),
        }
    }

    /// The next event; None at the end of the body.
    /// Reads what follows the provider's last event, normally only the end
    /// of the body, briefly and boundedly: the server then sees its response
    /// read whole instead of cut (llama.cpp logged no end for a stream vak
    /// dropped right after `message_stop`), and the connection can go back
    /// to the pool for the next turn.
    pub async fn read_to_end(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            for _ in 0..16 {
                if !matches!(self.events.next().await, Some(Ok(_))) {
                    break;
                }
            }
        })
        .await;
    }

    pub async fn next(&mut self, cancel: &CancellationToken) -> Result<Option<Event>, ProviderError> {
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
            n = self.events.next() => n,
        };
        match next {
            None => Ok(None),
            Some(Ok(event)) => Ok(Some(event)),
            Some(Err(EventStreamError::Transport(StreamError::Idle(idle)))) => Err(ProviderError::Failed(
                Failure::new(
                    FailureKind::Network,
                    format!("the stream stalled: nothing for {idle:?}"),
                    true,
                )
                .with_cause(Some(NetCause::Stalled)),
            )),
            Some(Err(EventStreamError::Transport(StreamError::TooLarge(max)))) => {
                Err(ProviderError::Failed(Failure::new(
                    FailureKind::BadResponse,
                    format!("an SSE event is larger than {max} bytes"),
                    false,
                )))
            }
            Some(Err(EventStreamError::Transport(StreamError::Transport(e)))) => {
                Err(ProviderError::Failed(network("the stream broke", &e)))
            }
            Some(Err(e)) => Err(ProviderError::Failed(Failure::new(
                FailureKind::BadResponse,
                truncate(&format!("malformed SSE: {e}"), MAX_DETAIL),
                false,
            ))),
        }
    }
}

/// The stream ended before the service said it was complete: the
/// connection was cut, which another attempt may not meet.
pub fn ended_early() -> ProviderError {
    ProviderError::Failed(
        Failure::new(
            FailureKind::Network,
            "the stream ended before the response was complete",
            true,
        )
        .with_cause(Some(NetCause::Closed)),
    )
}

/// A data payload that is not the JSON it should be.
pub fn bad_json(what: &str, e: &serde_json::Error, data: &str) -> Failure {
    Failure::new(
        FailureKind::BadResponse,
        truncate(&format!("{what} is not valid JSON ({e}): {data}"), MAX_DETAIL),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn statuses_map_to_kinds_and_retryability() {
        let none = HeaderMap::new();
        let c = |s, body: &str| {
            let f = classify_status(s, &none, body);
            (f.kind, f.retryable)
        };
        assert_eq!(c(401, "{}"), (FailureKind::Auth, false));
        assert_eq!(c(403, "{}"), (FailureKind::Auth, false));
        assert_eq!(c(408, ""), (FailureKind::Network, true));
        assert_eq!(c(409, ""), (FailureKind::BadResponse, true));
        assert_eq!(c(429, ""), (FailureKind::RateLimit, true));
        assert_eq!(c(500, ""), (FailureKind::BadResponse, true));
        assert_eq!(c(503, ""), (FailureKind::Overloaded, true));
        assert_eq!(c(529, ""), (FailureKind::Overloaded, true));
        assert_eq!(c(404, ""), (FailureKind::BadResponse, false));
        // Never followed (`client`): a redirect is a configuration to fix.
        assert_eq!(c(301, ""), (FailureKind::Redirect(301), false));
        assert_eq!(c(307, ""), (FailureKind::Redirect(307), false));
        assert_eq!(c(308, ""), (FailureKind::Redirect(308), false));
        assert_eq!(
            c(
                400,
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","code":"context_length_exceeded"}}"#
            ),
            (FailureKind::ContextTooLong, false)
        );
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#
            ),
            (FailureKind::ContextTooLong, false)
        );
        assert_eq!(
            c(400, r#"{"error":{"message":"bad"}}"#),
            (FailureKind::BadResponse, false)
        );
    }

    #[test]
    fn retry_headers_are_honoured() {
        let f = classify_status(429, &headers(&[("retry-after", "7")]), "");
        assert_eq!(f.retry_after, Some(Duration::from_secs(7)));
        let f = classify_status(
            429,
            &headers(&[("retry-after", "7"), ("retry-after-ms", "1500")]),
            "",
        );
        assert_eq!(f.retry_after, Some(Duration::from_millis(1500)));
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let f = classify_status(503, &headers(&[("retry-after", &soon)]), "");
        let after = f.retry_after.unwrap();
        assert!(
            after > Duration::from_secs(25) && after <= Duration::from_secs(30),
            "{after:?}"
        );
        assert_eq!(
            classify_status(429, &headers(&[("retry-after", "soon")]), "").retry_after,
            None
        );
        let huge = classify_status(
            429,
            &headers(&[("retry-after-ms", "1e300"), ("retry-after", "1e300")]),
            "",
        );
        assert_eq!(huge.retry_after, Some(Duration::from_secs(86_400)));
        let negative = classify_status(429, &headers(&[("retry-after", "-5")]), "");
        assert_eq!(negative.retry_after, None);
        assert!(!classify_status(500, &headers(&[("x-should-retry", "false")]), "").retryable);
        assert!(classify_status(400, &headers(&[("x-should-retry", "true")]), "").retryable);
    }

    #[test]
    fn details_are_truncated_and_scrubbed() {
        let body = "x".repeat(100_000);
        let f = classify_status(500, &HeaderMap::new(), &body);
        assert!(f.detail.len() < MAX_DETAIL + 100);
        let f = classify_status(
            401,
            &HeaderMap::new(),
            "Incorrect API key provided: sk-secret-123",
        );
        let f = scrub(f, Some(&Secret::new("sk-secret-123".into())));
        assert!(!f.detail.contains("sk-secret-123"), "{}", f.detail);
        assert_eq!(truncate("héllo", 2), "h… (6 bytes in all)");
    }

    #[test]
    fn a_host_is_host_and_port_without_user_path_or_query() {
        assert_eq!(
            host_of("http://127.0.0.1:11434/v1").as_deref(),
            Some("127.0.0.1:11434")
        );
        assert_eq!(
            host_of("https://api.openai.com/v1").as_deref(),
            Some("api.openai.com:443")
        );
        assert_eq!(
            host_of("http://user:secret@[::1]:8080/v1?key=sk-1").as_deref(),
            Some("[::1]:8080")
        );
        assert_eq!(host_of("not a url"), None);
    }

    #[tokio::test]
    async fn a_refused_connection_is_named_by_its_kind() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let c = client(&ClientOptions::default()).unwrap();
        let f = probe(c.get(format!("http://{addr}/v1/models")), Duration::from_secs(3))
            .await
            .unwrap_err();
        assert_eq!((f.kind, f.cause), (FailureKind::Network, Some(NetCause::Refused)));
        assert!(f.retryable);
    }

    #[test]
    fn key_headers_are_sensitive_and_bad_keys_refused() {
        assert!(key_header("sk-abc").unwrap().is_sensitive());
        let f = key_header("sk-abc\nX-Evil: 1").unwrap_err();
        assert_eq!(f.kind, FailureKind::NotConfigured);
        assert!(!f.detail.contains("sk-abc"));
    }

    #[test]
    fn error_types_classify() {
        let k = |t: &str, raw: &str| {
            let f = classify_error_type(t, raw);
            (f.kind, f.retryable)
        };
        assert_eq!(k("overloaded_error", ""), (FailureKind::Overloaded, true));
        assert_eq!(k("rate_limit_error", ""), (FailureKind::RateLimit, true));
        assert_eq!(k("api_error", ""), (FailureKind::BadResponse, true));
        assert_eq!(k("server_error", ""), (FailureKind::BadResponse, true));
        assert_eq!(k("insufficient_quota", ""), (FailureKind::RateLimit, false));
        assert_eq!(k("authentication_error", ""), (FailureKind::Auth, false));
        assert_eq!(
            k("invalid_request_error", "prompt is too long"),
            (FailureKind::ContextTooLong, false)
        );
        assert_eq!(
            k("invalid_request_error", "nope"),
            (FailureKind::BadResponse, false)
        );
    }

    #[test]
    fn the_event_bound_counts_one_event_at_a_time() {
        let mut b = EventBound::new(10);
        assert!(b.feed(b"data: 1234\n\n"));
        assert!(b.feed(b"data: 1234\r\n\r\ndata: 12"));
        assert!(b.feed(b"34\n\n"));
        assert!(!b.feed(b"data: 12345"));
        let mut b = EventBound::new(10);
        assert!(b.feed(b"data: 1\n"));
        assert!(!b.feed(b"data: 2\n"), "two lines of one event add up");
    }

    #[tokio::test]
    async fn sse_stream_skips_comments_bounds_events_and_times_out() {
        let opts = ClientOptions {
            max_event_bytes: 64,
            idle_timeout: Duration::from_millis(50),
            ..Default::default()
        };
        let cancel = CancellationToken::new();
        let chunks: Vec<Result<Bytes, StreamError>> = vec![
            Ok(Bytes::from_static(b": PROCESSING\n\ndata: {\"a\"")),
            Ok(Bytes::from_static(b":1}\n\n")),
        ];
        let mut s = SseStream::from_bytes(futures_util::stream::iter(chunks), &opts);
        assert_eq!(s.next(&cancel).await.unwrap().unwrap().data, "{\"a\":1}");
        assert!(s.next(&cancel).await.unwrap().is_none());

        let big = format!("data: {}\n\n", "x".repeat(100));
        let chunks: Vec<Result<Bytes, StreamError>> = vec![Ok(Bytes::from(big))];
        let mut s = SseStream::from_bytes(futures_util::stream::iter(chunks), &opts);
        match s.next(&cancel).await {
            Err(ProviderError::Failed(f)) => assert_eq!(f.kind, FailureKind::BadResponse),
            other => panic!("{other:?}"),
        }

        let mut s = SseStream::from_bytes(futures_util::stream::pending(), &opts);
        match s.next(&cancel).await {
            Err(ProviderError::Failed(f)) => assert_eq!((f.kind, f.retryable), (FailureKind::Network, true)),
            other => panic!("{other:?}"),
        }
        cancel.cancel();
        assert_eq!(s.next(&cancel).await.unwrap_err(), ProviderError::Cancelled);
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_comments_keep_a_slow_stream_alive() {
        let opts = ClientOptions {
            idle_timeout: Duration::from_millis(50),
            ..Default::default()
        };
        let cancel = CancellationToken::new();
        // Ten comments 30 ms apart (300 ms in all, past the idle timeout), then an event.
        let chunks = futures_util::stream::unfold(0, |i| async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            match i {
                0..10 => Some((Ok(Bytes::from_static(b": keep-alive\n\n")), i + 1)),
                10 => Some((Ok(Bytes::from_static(b"data: {}\n\n")), i + 1)),
                _ => None,
            }
        });
        let mut s = SseStream::from_bytes(chunks, &opts);
        assert_eq!(s.next(&cancel).await.unwrap().unwrap().data, "{}");
        assert!(s.next(&cancel).await.unwrap().is_none());
    }
}
