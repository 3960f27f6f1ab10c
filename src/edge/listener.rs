//! The accept loop: plain TCP or TLS on one port, hyper serving HTTP/1.1 and HTTP/2 (h2c or ALPN) to one router, with each request tagged by its peer address, a header-read timeout, a write timeout that reaps stalled clients, and a bounded graceful drain.

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
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
    /// How long a client may take to send a request's headers (slowloris).
    pub header_read_timeout: Duration,
    /// How long one write may stay blocked before the connection is dropped:
    /// a client that stops reading is reaped and its memory released.
    pub write_timeout: Duration,
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// How long open connections get to finish after shutdown.
    pub drain: Duration,
}

/// What a plain-HTTP client hears on a TLS port.
const PLAIN_ON_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 46\r\n\r\nThis port speaks TLS: connect with https://.\r\n";

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
    builder.http2().timer(TokioTimer::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let cfg = cfg.clone();
        tokio::spawn(async move {
            let secure = acceptor.is_some();
            let tag = move |req: http::Request<hyper::body::Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut().insert(PeerAddr(peer));
                req.extensions_mut().insert(Secure(secure));
                req
            };
            let service = TowerToHyperService::new(app.map_request(tag));
            match acceptor {
                None => {
                    let io = TokioIo::new(WriteTimeout::new(tcp, cfg.write_timeout));
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    let _ = watcher.watch(conn.into_owned()).await;
                }
                Some(acceptor) => {
                    let Some(tls) = handshake(tcp, &acceptor, cfg.handshake_timeout).await else {
                        return;
                    };
                    let io = TokioIo::new(WriteTimeout::new(tls, cfg.write_timeout));
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    let _ = watcher.watch(conn.into_owned()).await;
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(cfg.drain, graceful.shutdown()).await;
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
