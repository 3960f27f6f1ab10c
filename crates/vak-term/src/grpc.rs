//! The gRPC transport: the tonic client generated from proto/, with the bearer token on every call.

use super::transport::{check_id, Events, FailKind, Failure, Fut, Target, Transport, CONNECT_TIMEOUT};
use futures_util::StreamExt;
use pb::agent_service_client::AgentServiceClient;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use vak_proto::v1 as pb;

#[derive(Clone)]
struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

type Client = AgentServiceClient<InterceptedService<Channel, Bearer>>;

pub(crate) struct Grpc {
    client: Client,
}

impl Grpc {
    pub(crate) fn new(target: &Target) -> Result<Grpc, Failure> {
        let bearer = format!("Bearer {}", target.token)
            .parse()
            .map_err(|_| Failure::fatal("the token cannot travel in a header"))?;
        // Lazy: the channel (re)connects on each call that finds it down, which
        // is what resuming after a cut or a server restart needs. HTTP/2 pings
        // notice a dead peer that never closed the connection.
        let mut endpoint = Endpoint::from_shared(target.url.clone())
            .map_err(|e| Failure::fatal(format!("bad server URL {}: {e}", target.url)))?;
        if target.url.starts_with("https://") {
            // The same rule as the REST transport: only the roots named.
            let pem = target.ca_pem.as_deref().ok_or_else(|| {
                Failure::fatal(format!(
                    "{} is https: pass --ca-cert with the PEM of its certificate (or of the CA that signed it)",
                    target.url
                ))
            })?;
            let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Failure::fatal(format!("TLS setup for {}: {e}", target.url)))?;
        }
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(Duration::from_secs(15))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .connect_lazy();
        Ok(Grpc {
            client: AgentServiceClient::with_interceptor(channel, Bearer(bearer))
                .max_decoding_message_size(64 * 1024 * 1024),
        })
    }

    fn client(&self) -> Client {
        self.client.clone()
    }
}

/// A status, classified the way the REST transport classifies HTTP statuses.
fn failure(s: tonic::Status) -> Failure {
    use tonic::Code::*;
    let kind = match s.code() {
        NotFound => FailKind::NotFound,
        Unauthenticated => FailKind::Unauthenticated,
        FailedPrecondition | AlreadyExists | Aborted => FailKind::Conflict,
        // Connection loss surfaces as Unavailable, Unknown or Internal (an h2
        // stream reset), Cancelled or DeadlineExceeded; a lagged subscriber as
        // Unavailable. All of them resume.
        Unavailable | Unknown | Internal | Cancelled | DeadlineExceeded | ResourceExhausted => {
            FailKind::Transient
        }
        _ => FailKind::Fatal,
    };
    let mut msg = s.message().to_string();
    if msg.is_empty() {
        msg = format!("gRPC status {:?}", s.code());
    }
    // A transport failure's innermost cause ("Connection refused") says the most.
    let mut cause = None;
    let mut src = std::error::Error::source(&s);
    while let Some(e) = src {
        cause = Some(e.to_string());
        src = e.source();
    }
    if let Some(c) = cause.filter(|c| !msg.contains(c.as_str())) {
        msg = format!("{msg}: {c}");
    }
    Failure::new(kind, msg)
}

impl Transport for Grpc {
    fn name(&self) -> &'static str {
        "grpc"
    }

    fn create_session(&self) -> Fut<'_, String> {
        Box::pin(async move {
            let r = self
                .client()
                .create_session(pb::CreateSessionRequest::default())
                .await
                .map_err(failure)?;
            Ok(r.into_inner().session_id)
        })
    }

    fn list_sessions(&self) -> Fut<'_, Vec<pb::SessionSummary>> {
        Box::pin(async move {
            let r = self
                .client()
                .list_sessions(pb::ListSessionsRequest {})
                .await
                .map_err(failure)?;
            Ok(r.into_inner().sessions)
        })
    }

    fn attach(&self, session_id: &str) -> Fut<'_, pb::SessionSummary> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r = self
                .client()
                .attach_session(pb::AttachSessionRequest { session_id: sid })
                .await
                .map_err(failure)?;
            r.into_inner()
                .session
                .ok_or_else(|| Failure::fatal("the attach answer carries no session"))
        })
    }

    fn run(&self, req: pb::RunRequest) -> Fut<'_, pb::Admission> {
        Box::pin(async move {
            check_id("session id", &req.session_id)?;
            Ok(self.client().run(req).await.map_err(failure)?.into_inner())
        })
    }

    fn steer(&self, req: pb::SteerRequest) -> Fut<'_, pb::Admission> {
        Box::pin(async move {
            check_id("session id", &req.session_id)?;
            Ok(self.client().steer(req).await.map_err(failure)?.into_inner())
        })
    }

    fn approve(&self, req: pb::ApproveRequest) -> Fut<'_, pb::ApproveResponse> {
        Box::pin(async move {
            check_id("session id", &req.session_id)?;
            Ok(self.client().approve(req).await.map_err(failure)?.into_inner())
        })
    }

    fn cancel(&self, session_id: &str) -> Fut<'_, pb::CancelResponse> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r = self
                .client()
                .cancel(pb::CancelRequest { session_id: sid })
                .await
                .map_err(failure)?;
            Ok(r.into_inner())
        })
    }

    fn transcript(&self, session_id: &str) -> Fut<'_, pb::Transcript> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r = self
                .client()
                .get_transcript(pb::GetTranscriptRequest { session_id: sid })
                .await
                .map_err(failure)?;
            Ok(r.into_inner())
        })
    }

    fn list_skills(&self, session_id: Option<&str>) -> Fut<'_, Vec<pb::Skill>> {
        let session_id = session_id.map(str::to_string);
        Box::pin(async move {
            if let Some(sid) = &session_id {
                check_id("session id", sid)?;
            }
            let r = self
                .client()
                .list_skills(pb::ListSkillsRequest { session_id })
                .await
                .map_err(failure)?;
            Ok(r.into_inner().skills)
        })
    }

    fn list_workers(&self, session_id: &str) -> Fut<'_, Vec<pb::Worker>> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r = self
                .client()
                .list_workers(pb::ListWorkersRequest { session_id: sid })
                .await
                .map_err(failure)?;
            Ok(r.into_inner().workers)
        })
    }

    fn presentation(&self, session_id: &str) -> Fut<'_, pb::OutputTimeline> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let r = self
                .client()
                .get_presentation(pb::GetPresentationRequest { session_id: sid })
                .await
                .map_err(failure)?;
            Ok(r.into_inner())
        })
    }

    fn subscribe(&self, session_id: &str, after: Option<u64>) -> Fut<'_, Events> {
        let sid = session_id.to_string();
        Box::pin(async move {
            check_id("session id", &sid)?;
            let stream = self
                .client()
                .subscribe(pb::SubscribeRequest {
                    session_id: sid,
                    after,
                })
                .await
                .map_err(failure)?
                .into_inner();
            Ok(Box::pin(stream.map(|r| r.map_err(failure))) as Events)
        })
    }
}
