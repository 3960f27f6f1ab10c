//! The control plane of a scenario: the unary gRPC calls that create
//! sessions, start runs and look at them (not what is measured).

use crate::clients::{grpc_connections, Target};
use tonic::transport::Channel;
use vak_proto::v1 as pb;

/// The unary calls a scenario needs (over gRPC for every transport: the
/// control plane is not what is measured).
#[derive(Clone)]
pub(crate) struct Control {
    channel: Channel,
    token: String,
}

impl Control {
    pub(crate) async fn connect(target: &Target) -> Result<Control, String> {
        let channel = grpc_connections(target, 1).await?.remove(0);
        Ok(Control {
            channel,
            token: target.token.clone(),
        })
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Ok(v) = format!("Bearer {}", self.token).parse() {
            req.metadata_mut().insert("authorization", v);
        }
        req
    }

    pub(crate) async fn create_session(&self) -> Result<String, String> {
        let mut c = pb::agent_service_client::AgentServiceClient::new(self.channel.clone());
        c.create_session(self.request(pb::CreateSessionRequest::default()))
            .await
            .map(|r| r.into_inner().session_id)
            .map_err(|s| format!("CreateSession: {s}"))
    }

    /// Every session's (id, latest seq, busy), as `ListSessions` reports them.
    pub(crate) async fn list_sessions(&self) -> Result<Vec<(String, u64, bool)>, String> {
        let mut c = pb::agent_service_client::AgentServiceClient::new(self.channel.clone());
        c.list_sessions(self.request(pb::ListSessionsRequest {}))
            .await
            .map(|r| {
                r.into_inner()
                    .sessions
                    .into_iter()
                    .map(|s| (s.session_id, s.latest_seq, s.busy))
                    .collect()
            })
            .map_err(|s| format!("ListSessions: {s}"))
    }

    /// Every session's summary, as `ListSessions` reports it (loaded, busy, latest seq).
    pub(crate) async fn sessions(&self) -> Result<Vec<pb::SessionSummary>, String> {
        let mut c = pb::agent_service_client::AgentServiceClient::new(self.channel.clone());
        c.list_sessions(self.request(pb::ListSessionsRequest {}))
            .await
            .map(|r| r.into_inner().sessions)
            .map_err(|s| format!("ListSessions: {s}"))
    }

    /// Runs `prompt` and answers once the run settled (`Run` with `wait`).
    pub(crate) async fn run_settled(&self, session: &str, prompt: &str) -> Result<(), String> {
        let mut c = pb::agent_service_client::AgentServiceClient::new(self.channel.clone());
        let a = c
            .run(self.request(pb::RunRequest {
                session_id: session.to_string(),
                prompt: prompt.to_string(),
                wait: true,
                ..Default::default()
            }))
            .await
            .map_err(|s| format!("Run: {s}"))?
            .into_inner();
        match a.result {
            Some(r) if r.outcome() == pb::RunOutcome::Completed => Ok(()),
            Some(r) => Err(format!("the run ended {:?}", r.outcome().json_name())),
            None => Err("the run did not settle in time".into()),
        }
    }

    /// `Search` in this workspace's sessions: the hits' session ids, best first.
    pub(crate) async fn search(&self, q: &str, limit: u32) -> Result<Vec<String>, String> {
        let mut c = pb::agent_service_client::AgentServiceClient::new(self.channel.clone());
        c.search(self.request(pb::SearchRequest {
            q: q.to_string(),
            limit: Some(limit),
            all: false,
        }))
        .await
        .map(|r| r.into_inner().hits.into_iter().map(|h| h.session_id).collect())
        .map_err(|s| format!("Search: {s}"))
    }

    pub(crate) async fn run(&self, session: &str, prompt: &str) -> Result<(), String> {
        let mut c = pb::agent_service_client::AgentServiceClient::new(self.channel.clone());
        let a = c
            .run(self.request(pb::RunRequest {
                session_id: session.to_string(),
                prompt: prompt.to_string(),
                ..Default::default()
            }))
            .await
            .map_err(|s| format!("Run: {s}"))?
            .into_inner();
        if a.state() != pb::AdmissionState::Started {
            return Err(format!("Run was {:?}, not started", a.state().json_name()));
        }
        Ok(())
    }
}
