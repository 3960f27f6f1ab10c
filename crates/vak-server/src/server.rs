//! The one listener: gRPC (h2c), gRPC-web (HTTP/1.1), Connect, reflection, health, REST and SSE on one port, behind the auth guard, with graceful shutdown.

use super::auth::{self, guard, Auth, AuthConfig};
use super::errors::json_error;
use super::grpc::AgentApi;
use super::http::routes::{self, AppState};
use super::limits::StreamLimits;
use super::listener::{self, ListenConfig};
use super::protocol::Protocol;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tower::{Layer, ServiceExt};
use vak_core::error::{Error, Result};
use vak_core::host::hub::Hub;
use vak_core::session::live::Route;
use vak_core::CoreConfig;
use vak_proto::v1::agent_service_server::AgentServiceServer;
use vak_proto::FILE_DESCRIPTOR_SET;

/// Everything `vak serve` decides at startup.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub core: CoreConfig,
    /// The bearer token every request but liveness must present.
    pub token: String,
    /// Host names accepted besides loopback (behind a proxy, or with --allow-remote).
    pub trusted_hosts: Vec<String>,
    /// Cross origins allowed to call the server from a browser.
    pub allow_origins: Vec<String>,
    /// `--allow-remote`: exposed beyond this machine, so `?token=` is never accepted.
    pub allow_remote: bool,
    /// The largest request body (REST) or message (gRPC) accepted.
    pub max_body: usize,
    /// How long shutdown waits for runs to settle and connections to end.
    pub shutdown_grace: Duration,
    /// TLS for the one port; None serves plain HTTP (h2c for gRPC).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// Streams (any surface) open at once, in total and per client address.
    pub max_streams: usize,
    pub max_streams_per_client: usize,
    /// How long one write may stay blocked before a stalled client is dropped.
    pub write_timeout: Duration,
    /// How long a connection may stay open with no request in flight
    /// (HTTP/1.1 keep-alive, HTTP/2 with no open stream).
    pub idle_timeout: Duration,
    /// How long a request body may take to arrive after its head.
    pub body_read_timeout: Duration,
    /// Connections open at once; the excess is closed as soon as accepted.
    /// Default: three quarters of the open-files limit, at most 65 536.
    pub max_connections: usize,
    /// The browser app served at /app and /admin; None: the bundle embedded at build time.
    pub app: Option<Arc<super::http::assets::Bundle>>,
    /// `[server.web]`: the browser terminal.
    pub web: vak_core::host::config::FileWeb,
    /// One-time login links waiting to be used (clones share them).
    pub tickets: super::tickets::Tickets,
}

impl ServeConfig {
    pub fn new(core: CoreConfig, token: String) -> Self {
        ServeConfig {
            core,
            token,
            trusted_hosts: Vec::new(),
            allow_origins: Vec::new(),
            allow_remote: false,
            max_body: 4 << 20,
            shutdown_grace: Duration::from_secs(5),
            tls: None,
            header_read_timeout: Duration::from_secs(10),
            max_streams: 16384,
            max_streams_per_client: 256,
            write_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            max_connections: super::fdlimit::default_max_connections(),
            app: None,
            web: Default::default(),
            tickets: Default::default(),
        }
    }
}

pub struct Server {
    hub: Arc<Hub>,
    cfg: ServeConfig,
}

impl Server {
    /// Prepares the home and the core on the model route the configuration
    /// resolves to (flags, environment, config.toml; else the offline model).
    pub fn new(cfg: ServeConfig) -> Result<Server> {
        // Before the core exists: what it records from its first event on is kept.
        super::metrics::install();
        let hub = Arc::new(Hub::resolved(cfg.core.clone())?);
        Ok(Server { hub, cfg })
    }

    pub fn with_route(cfg: ServeConfig, route: Route) -> Result<Server> {
        super::metrics::install();
        let hub = Arc::new(Hub::new(cfg.core.clone(), route)?);
        Ok(Server { hub, cfg })
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Serves on `listener` until `shutdown` resolves, then stops gracefully:
    /// runs are cancelled and settle, streams get session_closed, ledgers are
    /// synced, and open connections get a bounded time to finish.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let app = app(self.hub.clone(), &self.cfg).await?;
        tokio::spawn(self.hub.clone().housekeep());
        tokio::spawn(self.hub.control().clone().follow_shared_mode());
        let hub = self.hub.clone();
        let grace = self.cfg.shutdown_grace;
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down");
            hub.shutdown(grace).await;
        };
        let cfg = ListenConfig {
            tls: self.cfg.tls.clone(),
            header_read_timeout: self.cfg.header_read_timeout,
            write_timeout: self.cfg.write_timeout,
            idle_timeout: self.cfg.idle_timeout,
            body_read_timeout: self.cfg.body_read_timeout,
            max_connections: self.cfg.max_connections,
            handshake_timeout: Duration::from_secs(10),
            drain: grace,
        };
        listener::serve(listener, app, cfg, signal).await;
        Ok(())
    }
}

async fn unknown_rpc() -> Response {
    tonic::Status::unimplemented("no such RPC").into_http()
}

/// The whole HTTP surface as one router.
pub async fn app(hub: Arc<Hub>, cfg: &ServeConfig) -> Result<Router> {
    let limits = StreamLimits::new(cfg.max_streams, cfg.max_streams_per_client);
    let errors = Arc::new(super::recent_errors::RecentErrors::default());
    let host = super::grpc::service::HostFacts {
        web: cfg.web.clone(),
        allow_remote: cfg.allow_remote,
        tls: cfg.tls.is_some(),
        max_connections: cfg.max_connections,
    };
    let api = AgentApi::new(hub.clone(), limits.clone(), errors.clone(), host);
    // Several replicas on one NATS: admissions for the sessions this one
    // holds arrive forwarded from the others, until the hub shuts down.
    if let Some(owners) = hub.control().config().owners.clone() {
        let stop = tokio_util::sync::CancellationToken::new();
        let hub = hub.clone();
        let done = stop.clone();
        tokio::spawn(async move {
            hub.closed().await;
            done.cancel();
        });
        tokio::spawn(super::forward_answer::serve(api.clone(), owners, stop));
    }
    // Clients that gzip their requests (grpcio, connect-python's gRPC mode)
    // are served; answers are never compressed, which would cost a
    // compression per message of every stream.
    let agent = AgentServiceServer::new(api.clone())
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .max_decoding_message_size(cfg.max_body)
        .max_encoding_message_size(usize::MAX);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<AgentServiceServer<AgentApi>>().await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let v1 = reflection()
        .build_v1()
        .map_err(|e| Error::internal(format!("reflection: {e}")))?;
    let v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| Error::internal(format!("reflection: {e}")))?;

    // The streams anyone may open hold a stream permit like AgentService's own.
    let capped = axum::middleware::from_fn_with_state(limits, super::stream_caps::cap);
    let services = Router::new()
        .route_service(&grpc_path_of(&agent), agent)
        .route_service(&grpc_path_of(&health), capped.clone().layer(health))
        .route_service(&grpc_path_of(&v1), capped.clone().layer(v1))
        .route_service(&grpc_path_of(&v1alpha), capped.layer(v1alpha))
        .fallback(unknown_rpc);
    // gRPC-web (binary and text) is translated to gRPC in front of the services.
    let grpc = tonic_web::GrpcWebLayer::new().layer(services.clone());
    // Marked before the translation, so its streams count as gRPC-web.
    let grpc = tower::util::MapRequestLayer::new(|mut req: Request| {
        let web = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/grpc-web"));
        if web {
            req.extensions_mut().insert(super::metrics::Transport::GrpcWeb);
        }
        req
    })
    .layer(grpc);
    // What no REST route matched: gRPC and gRPC-web by content type, Connect
    // (src/connect/) by content type and path, else a JSON 404.
    let max_body = cfg.max_body;
    let dispatch = move |req: Request| {
        let grpc = grpc.clone();
        let services = services.clone();
        async move {
            match Protocol::of(req.method(), req.uri(), req.headers()) {
                Protocol::Grpc { .. } => match grpc.oneshot(req).await {
                    Ok(resp) => resp.into_response(),
                    Err(never) => match never {},
                },
                Protocol::Connect(call) => super::connect::serve(services, call, req, max_body).await,
                Protocol::Rest => json_error(StatusCode::NOT_FOUND, "not_found", "no such route"),
            }
        }
    };

    let state = AppState {
        api,
        max_body: cfg.max_body,
        app: super::http::assets::bundle_or_embedded(cfg.app.clone()),
        terminals: Default::default(),
        keepalive: super::http::sse_encode::Keepalive::start(),
    };
    let auth = Auth::new(AuthConfig {
        token: cfg.token.clone(),
        trusted_hosts: cfg.trusted_hosts.clone(),
        allow_origins: cfg.allow_origins.clone(),
        login_ttl: Duration::from_secs(12 * 3600),
        cookie_name: auth::cookie_name(&cfg.core.home),
        login_store: Some(cfg.core.home.join(super::logins::FILE)),
        allow_remote: cfg.allow_remote,
        tickets: cfg.tickets.clone(),
    });
    let login = Router::new()
        .route("/auth/login", axum::routing::post(auth::login))
        .route("/auth/logout", axum::routing::post(auth::logout))
        .route("/auth/ticket", axum::routing::post(auth::ticket))
        .route("/auth/session", axum::routing::get(auth::session))
        .with_state(auth.clone());
    Ok(routes::router(state)
        // Not an RPC: the Prometheus exposition (docs/protocol.md), behind the guard like every route.
        .route("/metrics", axum::routing::get(super::metrics::scrape))
        .merge(login)
        .route_layer(axum::middleware::from_fn(super::http::query::refuse_unknown))
        .fallback(dispatch)
        .layer(axum::middleware::from_fn_with_state(auth, guard))
        .layer(axum::middleware::from_fn(super::trace::request_span))
        .layer(axum::middleware::from_fn_with_state(
            errors,
            super::access_log::access_log,
        )))
}

/// The route a tonic service answers on: `/<package.Service>/<Method>`.
fn grpc_path_of<S: NamedService>(_: &S) -> String {
    format!("/{}/{{*rest}}", S::NAME)
}

/// Connections the `--metrics-listen` listener keeps open at once (a scraper needs one).
const METRICS_MAX_CONNECTIONS: usize = 16;

/// Serves `--metrics-listen` on `listener` (already checked to be loopback)
/// until `stop` resolves: `/metrics` without a token, through the main
/// port's accept loop with its timeouts and a small connection cap.
pub async fn serve_metrics(listener: TcpListener, stop: impl Future<Output = ()>) {
    super::metrics::install();
    let cfg = ListenConfig {
        tls: None,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        body_read_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(30),
        handshake_timeout: Duration::from_secs(10),
        drain: Duration::from_secs(1),
        max_connections: METRICS_MAX_CONNECTIONS,
    };
    listener::serve(listener, super::metrics::plain_router(), cfg, stop).await;
}
