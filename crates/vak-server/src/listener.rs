//! The accept loop: plain TCP or TLS on one port, hyper serving HTTP/1.1 and HTTP/2 (h2c or ALPN) to one router, with each request tagged by its peer address; a cap on concurrent connections (the excess closed at once); accept errors backed off; deadlines for the first bytes and request head, the request body, and a connection with no request in flight (`reaper.rs`); a write timeout that reaps clients that stop reading; and a bounded graceful drain; an HTTP/1.1 event stream leaves hyper for a small writer once its head is out (`handoff.rs`).

use super::errors::json_error;
use super::handoff::{self, LongLived, Park, Parkable, SharedIo, Writer};
use super::protocol::is_grpc;
use super::reaper::{ConnState, DeadlineBody, Tally, Tracked};
use axum::Router;
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt;

/// The peer of the connection a request arrived on (a request extension).
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub SocketAddr);

/// Whether the request arrived over TLS (a request extension).
#[derive(Clone, Copy, Debug)]
pub struct Secure(pub bool);

#[derive(Clone)]
pub struct ListenConfig {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// How long a new connection may take to complete its first request
    /// head (the first bytes, the HTTP/2 preface, a HEADERS block), and an
    /// HTTP/1.1 client to send any request's headers (slowloris).
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight
    /// (HTTP/1.1 keep-alive, HTTP/2 with no open stream).
    pub idle_timeout: Duration,
    /// How long a request body may take to arrive after its head.
    pub body_read_timeout: Duration,
    /// How long one write may stay blocked before the connection is dropped:
    /// a client that stops reading is reaped and its memory released.
    pub write_timeout: Duration,
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// How long open connections get to finish after shutdown.
    pub drain: Duration,
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

/// What a plain-HTTP client hears on a TLS port.
const PLAIN_ON_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 46\r\n\r\nThis port speaks TLS: connect with https://.\r\n";

/// How long a connection being closed for idleness gets to say goodbye
/// (an HTTP/2 GOAWAY) before it is dropped.
const GOODBYE: Duration = Duration::from_secs(1);

/// The accept loop's back-off after an error such as EMFILE, doubled up to the max.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    cfg: ListenConfig,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        // A peer that vanished under a quiet stream is noticed.
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    let (stop_tx, stop_rx) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(
        cfg.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let acceptor = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let cfg = Arc::new(cfg);
    let mut refused = Tally::default();
    let mut failed = Tally::default();
    let mut last_error = String::new();
    let mut backoff = BACKOFF_MIN;
    tokio::pin!(shutdown);
    loop {
        let flush_at = [refused.due(), failed.due()].into_iter().flatten().min();
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => {
                    backoff = BACKOFF_MIN;
                    c
                }
                Err(e) if is_per_connection(&e) => {
                    tracing::debug!("accept: {e}");
                    continue;
                }
                Err(e) => {
                    // Out of descriptors and the like: back off instead of
                    // spinning; idle connections are reaped meanwhile.
                    last_error = e.to_string();
                    if let Some(n) = failed.hit() {
                        log_accept_errors(n, &last_error, backoff);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut shutdown => break,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            },
            _ = sleep_until_opt(flush_at) => {
                if let Some(n) = refused.flush() {
                    log_refused(n, cfg.max_connections);
                }
                if let Some(n) = failed.flush() {
                    log_accept_errors(n, &last_error, backoff);
                }
                continue;
            }
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the cap: closed at once, before it costs anything more.
            drop(tcp);
            crate::metrics::reject(crate::metrics::Rejection::ConnectionCap);
            if let Some(n) = refused.hit() {
                log_refused(n, cfg.max_connections);
            }
            continue;
        };
        let slot = Slot::new(slot);
        let _ = tcp.set_nodelay(true);
        let conn = Connection {
            app: app.clone(),
            builder: builder.clone(),
            cfg: cfg.clone(),
            peer,
            stop: stop_rx.clone(),
        };
        // The task of a plain connection is `Run` itself, small for as long
        // as it lives; a TLS one is boxed whole (rustls' state is over a
        // kilobyte, and would otherwise be room in every task).
        match acceptor.clone() {
            None => drop(tokio::spawn(conn.run(tcp, false, slot))),
            Some(acceptor) => drop(tokio::spawn(Box::pin(tls_connection(conn, tcp, acceptor, slot)))),
        }
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(true);
    // Resolves when every connection task has ended (each holds a receiver).
    let _ = tokio::time::timeout(cfg.drain, stop_tx.closed()).await;
}

/// A connection's place under `--max-connections`, counted in
/// `vak_connections_open` while the connection lives.
struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit) -> Slot {
        let c = crate::metrics::connections();
        c.accepted.increment(1);
        c.open.increment(1.0);
        Slot { _permit: permit }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        crate::metrics::connections().open.decrement(1.0);
    }
}

fn log_refused(n: u64, max: usize) {
    tracing::warn!(
        "refused {n} connection{}: {max} open already, the limit (--max-connections)",
        if n == 1 { "" } else { "s" }
    );
}

fn log_accept_errors(n: u64, error: &str, backoff: Duration) {
    tracing::warn!(
        "accept failed {n} time{} ({error}); retrying after {}",
        if n == 1 { "" } else { "s" },
        humantime::format_duration(backoff)
    );
}

/// Errors that concern one connection (it went away before it was
/// accepted), not the listener: no reason to pause.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
    )
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A TLS connection's task: the handshake, then as a plain one.
async fn tls_connection(conn: Connection, tcp: TcpStream, acceptor: tokio_rustls::TlsAcceptor, slot: Slot) {
    let limit = conn.cfg.handshake_timeout;
    if let Some(tls) = Box::pin(handshake(tcp, &acceptor, limit)).await {
        drop(acceptor);
        conn.run(tls, true, slot).await;
    }
}

/// One accepted connection and what serving it needs.
struct Connection {
    app: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    cfg: Arc<ListenConfig>,
    peer: SocketAddr,
    stop: watch::Receiver<bool>,
}

impl Connection {
    /// Serves the connection through hyper; an HTTP/1.1 event stream then
    /// goes on in a `Writer` holding only its socket and body, once hyper's
    /// state (the boxed future of `serve`) is freed.
    fn run<T>(self, io: T, secure: bool, slot: Slot) -> Run<T>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Run {
            // Held until the stream ends: the drain waits for it as for any
            // connection.
            _stop: self.stop.clone(),
            _slot: slot,
            stage: Stage::Serving(Box::pin(self.serve(io, secure))),
        }
    }

    /// Serves the connection until it ends (None) or an event stream has
    /// left hyper (its IO and body).
    async fn serve<T>(mut self, io: T, secure: bool) -> Option<(WriteTimeout<T>, axum::body::Body)>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let state = ConnState::new();
        let (app, peer, limit) = (self.app.clone(), self.peer, self.cfg.body_read_timeout);
        let requests = state.clone();
        let park = Park::default();
        let parking = park.clone();
        let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let guard = requests.begin();
            let timed_out = Arc::new(AtomicBool::new(false));
            let http1 = req.version() < http::Version::HTTP_2;
            // Only a GET over HTTP/1.1 gets a chunked body hyper writes as
            // `Writer` continues it (HTTP/1.0 is close-delimited, HEAD has none).
            let may_leave = req.version() == http::Version::HTTP_11 && req.method() == http::Method::GET;
            let grpc = is_grpc(req.headers());
            let mut req = req.map(|b| axum::body::Body::new(DeadlineBody::new(b, limit, timed_out.clone())));
            req.extensions_mut().insert(PeerAddr(peer));
            req.extensions_mut().insert(Secure(secure));
            let app = app.clone();
            let parking = parking.clone();
            // Boxed: over HTTP/2 hyper runs each stream as a task of its own
            // whose size is that of this future's largest state (the whole
            // router's), kept for as long as the stream is open; boxed, the
            // state goes once the response is made.
            Box::pin(async move {
                let resp = match app.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                let resp = if timed_out.load(Ordering::SeqCst) && !grpc {
                    body_timeout(limit, http1)
                } else {
                    resp
                };
                let leaves = may_leave
                    && resp.status() == StatusCode::OK
                    && resp.extensions().get::<LongLived>().is_some()
                    && !resp.headers().contains_key(http::header::CONTENT_LENGTH);
                let resp = resp.map(|b| axum::body::Body::new(Tracked::new(b, guard)));
                Ok::<_, Infallible>(if leaves {
                    resp.map(|b| axum::body::Body::new(Parkable::new(b, parking)))
                } else {
                    resp
                })
            })
        });
        let (io, mine) = SharedIo::new(WriteTimeout::new(io, self.cfg.write_timeout), park.clone());
        // Boxed, so the connection's task keeps none of hyper's state once
        // an event stream has left it.
        let mut conn = Box::pin(
            self.builder
                .serve_connection_with_upgrades(TokioIo::new(io), service),
        );
        let mut idle = Box::pin(state.idle_for(self.cfg.header_read_timeout, self.cfg.idle_timeout));
        let mut stopping = false;
        loop {
            tokio::select! {
                biased;
                _ = conn.as_mut() => return None,
                // Polled right after hyper: the body parks itself inside
                // hyper's poll, and hyper flushes in the same poll.
                _ = std::future::poll_fn(|_| if park.ready() { Poll::Ready(()) } else { Poll::Pending }) => break,
                _ = stopped(&mut self.stop), if !stopping => {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = idle.as_mut(), if !stopping => {
                    // HTTP/2 gets a GOAWAY; whatever has not finished soon is dropped.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(GOODBYE, conn.as_mut()).await;
                    return None;
                }
            }
        }
        // The stream is in flight (its body holds the request guard), so the
        // idle deadline no longer applies; a shutdown lets it run on as
        // hyper's graceful shutdown would, until it ends or the drain is over.
        drop(idle);
        drop(conn);
        Some((handoff::reclaim(mine)?, park.take()?))
    }
}

/// What hyper hands back when an event stream leaves it: the IO and the body.
type Parked<T> = Option<(WriteTimeout<T>, axum::body::Body)>;

/// A connection's future, written out by hand so it holds nothing but the
/// stage it is in: an `async fn` keeps its arguments and every await's
/// operands in its layout, and this future is allocated (as its task) for
/// as long as the connection lives.
struct Run<T> {
    stage: Stage<T>,
    _stop: watch::Receiver<bool>,
    _slot: Slot,
}

enum Stage<T> {
    Serving(Pin<Box<dyn Future<Output = Parked<T>> + Send>>),
    Writing(Writer<WriteTimeout<T>>),
}

impl<T: AsyncRead + AsyncWrite + Unpin> Future for Run<T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match &mut this.stage {
                Stage::Serving(serving) => match std::task::ready!(serving.as_mut().poll(cx)) {
                    // hyper's state is freed here, as the stage is replaced.
                    Some((io, body)) => this.stage = Stage::Writing(Writer::new(io, body)),
                    None => return Poll::Ready(()),
                },
                Stage::Writing(writer) => return Pin::new(writer).poll(cx),
            }
        }
    }
}

/// Resolves once shutdown has begun (or the accept loop is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// The answer to a request whose body did not arrive in time.
fn body_timeout(limit: Duration, http1: bool) -> axum::response::Response {
    let mut resp = json_error(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        &format!(
            "the request body did not arrive within {} (--body-read-timeout)",
            humantime::format_duration(limit)
        ),
    );
    if http1 {
        resp.headers_mut()
            .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    resp
}

/// Completes a TLS handshake, answering plain HTTP with a clear 400 instead.
async fn handshake(
    mut tcp: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
    limit: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(limit, tcp.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return None,
    }
    // Every TLS connection opens with a handshake record (0x16); plain HTTP
    // (and h2c's preface) opens with an ASCII method name.
    if first[0] != 0x16 {
        if first[0].is_ascii_alphabetic() {
            let _ = tokio::time::timeout(limit, tcp.write_all(PLAIN_ON_TLS)).await;
            let _ = tcp.shutdown().await;
        }
        return None;
    }
    match tokio::time::timeout(limit, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake failed: {e}");
            None
        }
        Err(_) => None,
    }
}

/// An IO whose writes fail once one has been blocked longer than `limit`.
struct WriteTimeout<T> {
    inner: T,
    limit: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteTimeout<T> {
    fn new(inner: T, limit: Duration) -> Self {
        WriteTimeout {
            inner,
            limit,
            deadline: None,
        }
    }

    fn guard<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(r) => {
                self.deadline = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let deadline = self
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain connection's task is allocated for as long as the
    /// connection lives: its future holds only the stage it is in (hyper's
    /// boxed state, or the writer), not the room an `async fn` would keep
    /// for its arguments or a TLS stream (1.9 KB before).
    #[tokio::test]
    async fn a_plain_connections_task_stays_small() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (tcp, peer) = listener.accept().await.unwrap();
        let (_stop_tx, stop) = watch::channel(false);
        let d = Duration::from_secs(1);
        let conn = Connection {
            app: Router::new(),
            builder: Arc::new(auto::Builder::new(TokioExecutor::new())),
            cfg: Arc::new(ListenConfig {
                tls: None,
                header_read_timeout: d,
                idle_timeout: d,
                body_read_timeout: d,
                write_timeout: d,
                handshake_timeout: d,
                drain: d,
                max_connections: 1,
            }),
            peer,
            stop,
        };
        let slot = Slot::new(Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap());
        let task = conn.run(tcp, false, slot);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 256, "a connection's task future is {size} bytes");
    }
}
