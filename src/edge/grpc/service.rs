//! The tonic `AgentService`: validates requests, calls the core, maps results. REST handlers call these same methods.

use super::convert;
use crate::core::approvals::Answer;
use crate::core::bus::{Delivery, End};
use crate::core::hub::Hub;
use crate::edge::errors::to_status;
use crate::proto::v1 as pb;
use futures_util::stream::{self, Stream, StreamExt};
use pb::agent_service_server::AgentService;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[derive(Clone)]
pub struct AgentApi {
    hub: Arc<Hub>,
}

impl AgentApi {
    pub fn new(hub: Arc<Hub>) -> Self {
        AgentApi { hub }
    }

    fn session(&self, id: &str) -> Result<Arc<crate::core::session::Session>, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        self.hub.get(id).map_err(to_status)
    }
}

fn ok<T>(v: T) -> Result<Response<T>, Status> {
    Ok(Response::new(v))
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn create_session(
        &self,
        _req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let s = self.hub.create().map_err(to_status)?;
        ok(pb::CreateSessionResponse {
            session_id: s.id().to_string(),
        })
    }

    async fn list_sessions(
        &self,
        _req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let sessions = self.hub.list().map_err(to_status)?;
        ok(pb::ListSessionsResponse {
            sessions: sessions.into_iter().map(convert::summary).collect(),
        })
    }

    async fn attach_session(
        &self,
        req: Request<pb::AttachSessionRequest>,
    ) -> Result<Response<pb::AttachSessionResponse>, Status> {
        let id = req.into_inner().session_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        let s = self.hub.attach(&id).map_err(to_status)?;
        ok(pb::AttachSessionResponse {
            session: Some(convert::summary(s.info())),
        })
    }

    async fn run(&self, req: Request<pb::RunRequest>) -> Result<Response<pb::Admission>, Status> {
        let r = req.into_inner();
        if r.prompt.trim().is_empty() {
            return Err(Status::invalid_argument("prompt is required"));
        }
        let s = self.session(&r.session_id)?;
        let a = s.admit(r.prompt, Some(r.request_id)).map_err(to_status)?;
        ok(convert::admission(a))
    }

    async fn steer(&self, req: Request<pb::SteerRequest>) -> Result<Response<pb::Admission>, Status> {
        let r = req.into_inner();
        if r.text.trim().is_empty() {
            return Err(Status::invalid_argument("text is required"));
        }
        let s = self.session(&r.session_id)?;
        let a = s.admit(r.text, Some(r.request_id)).map_err(to_status)?;
        ok(convert::admission(a))
    }

    async fn approve(
        &self,
        req: Request<pb::ApproveRequest>,
    ) -> Result<Response<pb::ApproveResponse>, Status> {
        let r = req.into_inner();
        let Some(approve) = r.approve else {
            return Err(Status::invalid_argument("approve (true or false) is required"));
        };
        if r.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is required"));
        }
        let s = self.session(&r.session_id)?;
        let outcome = s
            .answer(
                &r.request_id,
                Answer {
                    approve,
                    reason: r.reason,
                },
            )
            .map_err(to_status)?;
        ok(pb::ApproveResponse {
            request_id: r.request_id,
            outcome: outcome.as_str().into(),
        })
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        let s = self.session(&req.into_inner().session_id)?;
        ok(convert::cancel(s.cancel()))
    }

    type SubscribeStream = EventStream;

    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Result<Response<EventStream>, Status> {
        let r = req.into_inner();
        let s = self.session(&r.session_id)?;
        let sub = s.subscribe(r.after);
        let sid = s.id().to_string();
        let opened = convert::stream_opened(&sid, sub.latest_seq());
        let last = r.after.unwrap_or(sub.latest_seq());
        // Subscribed before announcing: nothing published after stream_opened can be missed.
        let rest = stream::unfold(Some((sub, last)), move |state| {
            let sid = sid.clone();
            async move {
                let (mut sub, last) = state?;
                match sub.recv().await? {
                    Delivery::Frame(f) => {
                        let seq = f.seq;
                        Some((Ok(convert::frame(&f)), Some((sub, seq))))
                    }
                    Delivery::Resync { reason, latest_seq } => {
                        Some((Ok(convert::resync(&sid, reason, latest_seq)), Some((sub, last))))
                    }
                    Delivery::End(End::Closed(reason)) => {
                        Some((Ok(convert::session_closed(&sid, reason)), None))
                    }
                    Delivery::End(End::Lagged) => Some((
                        Err(Status::unavailable(format!(
                            "this subscriber fell too far behind; subscribe again with after={last}"
                        ))),
                        None,
                    )),
                }
            }
        });
        ok(Box::pin(stream::once(async move { Ok(opened) }).chain(rest)) as EventStream)
    }

    async fn get_transcript(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::Transcript>, Status> {
        let s = self.session(&req.into_inner().session_id)?;
        ok(convert::transcript(s.id(), s.transcript()))
    }

    async fn get_transcript_markdown(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::TranscriptMarkdown>, Status> {
        let s = self.session(&req.into_inner().session_id)?;
        ok(pb::TranscriptMarkdown {
            markdown: s.transcript().markdown(s.id()),
        })
    }
}
