//! The raw tonic baseline: vak's own generated `AgentService` server with a
//! minimal implementation behind it. `Subscribe` is a `tokio::sync::broadcast`
//! receiver wrapped in `BroadcastStream`; `Run("/burst N")` sends N text_delta
//! Events into the channel as fast as it can, exactly the shape vak streams.
//! No ledger, no ring, no per-subscriber queue, no merging, no auth: what a
//! hand-written tonic fan-out costs. It runs in its own process (the bench
//! re-executes itself with the hidden `baseline-server` subcommand), so it is
//! measured the same way as `vak serve`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};
use vak_proto::v1 as pb;
use vak_proto::v1::agent_service_server::{AgentService, AgentServiceServer};

struct Channel {
    tx: broadcast::Sender<pb::Event>,
    seq: u64,
}

pub(crate) struct Baseline {
    capacity: usize,
    sessions: Mutex<HashMap<String, Arc<Mutex<Channel>>>>,
}

impl Baseline {
    fn session(&self, id: &str) -> Result<Arc<Mutex<Channel>>, Status> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no session {id}")))
    }
}

fn event(seq: u64, session_id: &str, kind: pb::event::Kind) -> pb::Event {
    pb::Event {
        seq,
        session_id: session_id.to_string(),
        kind: Some(kind),
    }
}

/// Sends the burst: text_delta `t{i} ` for i in 0..n, then run_finished,
/// yielding every 1024 sends like vak's offline model does.
async fn burst(session_id: String, chan: Arc<Mutex<Channel>>, n: u64) {
    let send = |kind: pb::event::Kind| {
        let mut c = chan.lock().unwrap_or_else(|p| p.into_inner());
        c.seq += 1;
        let _ = c.tx.send(event(c.seq, &session_id, kind));
    };
    for i in 0..n {
        if i % 1024 == 1023 {
            tokio::task::yield_now().await;
        }
        send(pb::event::Kind::TextDelta(pb::TextDelta {
            text: format!("t{i} "),
        }));
    }
    send(pb::event::Kind::RunFinished(pb::RunFinished {
        outcome: pb::RunOutcome::Completed as i32,
        message: "completed".into(),
        stop_reason: None,
    }));
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented(
        "the baseline serves CreateSession, Run and Subscribe only",
    ))
}

type Never<T> = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for Baseline {
    async fn create_session(
        &self,
        _req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (tx, _) = broadcast::channel(self.capacity);
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.insert(id.clone(), Arc::new(Mutex::new(Channel { tx, seq: 0 })));
        Ok(Response::new(pb::CreateSessionResponse {
            session_id: id,
            workspace: String::new(),
        }))
    }

    async fn run(&self, req: Request<pb::RunRequest>) -> Result<Response<pb::Admission>, Status> {
        let r = req.into_inner();
        let chan = self.session(&r.session_id)?;
        let n = r
            .prompt
            .strip_prefix("/burst ")
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| Status::invalid_argument("the baseline runs `/burst N` only"))?;
        tokio::spawn(burst(r.session_id, chan, n));
        Ok(Response::new(pb::Admission {
            request_id: r.request_id,
            state: pb::AdmissionState::Started as i32,
            ..Default::default()
        }))
    }

    type SubscribeStream = Never<pb::Event>;

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let sid = req.into_inner().session_id;
        let chan = self.session(&sid)?;
        let (rx, latest) = {
            let c = chan.lock().unwrap_or_else(|p| p.into_inner());
            (c.tx.subscribe(), c.seq)
        };
        let opened = event(
            0,
            &sid,
            pb::event::Kind::StreamOpened(pb::StreamOpened {
                session_id: sid.clone(),
                latest_seq: latest,
                stream_id: String::new(),
                cursor: String::new(),
            }),
        );
        let live = BroadcastStream::new(rx).map(|r| r.map_err(|e| Status::data_loss(e.to_string())));
        Ok(Response::new(Box::pin(
            tokio_stream::once(Ok(opened)).chain(live),
        )))
    }

    async fn list_sessions(
        &self,
        _: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        unimplemented()
    }
    async fn attach_session(
        &self,
        _: Request<pb::AttachSessionRequest>,
    ) -> Result<Response<pb::AttachSessionResponse>, Status> {
        unimplemented()
    }
    async fn steer(&self, _: Request<pb::SteerRequest>) -> Result<Response<pb::Admission>, Status> {
        unimplemented()
    }
    async fn approve(&self, _: Request<pb::ApproveRequest>) -> Result<Response<pb::ApproveResponse>, Status> {
        unimplemented()
    }
    async fn cancel(&self, _: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        unimplemented()
    }
    async fn get_transcript(
        &self,
        _: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::Transcript>, Status> {
        unimplemented()
    }
    async fn get_transcript_markdown(
        &self,
        _: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::TranscriptMarkdown>, Status> {
        unimplemented()
    }
    type StreamStream = Never<pb::StreamMessage>;
    async fn stream(&self, _: Request<pb::StreamRequest>) -> Result<Response<Self::StreamStream>, Status> {
        unimplemented()
    }
    async fn follow(&self, _: Request<pb::FollowRequest>) -> Result<Response<pb::FollowResponse>, Status> {
        unimplemented()
    }
    async fn unfollow(
        &self,
        _: Request<pb::UnfollowRequest>,
    ) -> Result<Response<pb::FollowResponse>, Status> {
        unimplemented()
    }
    async fn get_presentation(
        &self,
        _: Request<pb::GetPresentationRequest>,
    ) -> Result<Response<pb::OutputTimeline>, Status> {
        unimplemented()
    }
    type PresentationEventsStream = Never<pb::PresentationEvent>;
    async fn presentation_events(
        &self,
        _: Request<pb::GetPresentationRequest>,
    ) -> Result<Response<Self::PresentationEventsStream>, Status> {
        unimplemented()
    }
    async fn get_config(&self, _: Request<pb::GetConfigRequest>) -> Result<Response<pb::ConfigInfo>, Status> {
        unimplemented()
    }
    async fn update_config(
        &self,
        _: Request<pb::UpdateConfigRequest>,
    ) -> Result<Response<pb::ConfigInfo>, Status> {
        unimplemented()
    }
    async fn set_mode(
        &self,
        _: Request<pb::SetModeRequest>,
    ) -> Result<Response<pb::SetModeResponse>, Status> {
        unimplemented()
    }
    async fn list_rules(
        &self,
        _: Request<pb::ListRulesRequest>,
    ) -> Result<Response<pb::ListRulesResponse>, Status> {
        unimplemented()
    }
    async fn delete_rule(
        &self,
        _: Request<pb::DeleteRuleRequest>,
    ) -> Result<Response<pb::DeleteRuleResponse>, Status> {
        unimplemented()
    }
    async fn get_mcp_config(
        &self,
        _: Request<pb::GetMcpConfigRequest>,
    ) -> Result<Response<pb::McpConfig>, Status> {
        unimplemented()
    }
    async fn put_mcp_config(
        &self,
        _: Request<pb::PutMcpConfigRequest>,
    ) -> Result<Response<pb::McpConfig>, Status> {
        unimplemented()
    }
    async fn set_key(&self, _: Request<pb::SetKeyRequest>) -> Result<Response<pb::SetKeyResponse>, Status> {
        unimplemented()
    }
    async fn delete_key(
        &self,
        _: Request<pb::DeleteKeyRequest>,
    ) -> Result<Response<pb::DeleteKeyResponse>, Status> {
        unimplemented()
    }
    async fn list_providers(
        &self,
        _: Request<pb::ListProvidersRequest>,
    ) -> Result<Response<pb::ListProvidersResponse>, Status> {
        unimplemented()
    }
    async fn list_models(
        &self,
        _: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        unimplemented()
    }
    // ---- Workspace files, diff and session lifecycle (issue 15) ----
    async fn read_file(&self, _: Request<pb::ReadFileRequest>) -> Result<Response<pb::FileContent>, Status> {
        unimplemented()
    }
    async fn write_file(
        &self,
        _: Request<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        unimplemented()
    }
    async fn list_tree(&self, _: Request<pb::ListTreeRequest>) -> Result<Response<pb::FileTree>, Status> {
        unimplemented()
    }
    async fn list_dirs(&self, _: Request<pb::ListDirsRequest>) -> Result<Response<pb::DirListing>, Status> {
        unimplemented()
    }
    async fn get_diff(&self, _: Request<pb::GetDiffRequest>) -> Result<Response<pb::WorkspaceDiff>, Status> {
        unimplemented()
    }
    async fn delete_session(
        &self,
        _: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        unimplemented()
    }
    async fn rename_session(
        &self,
        _: Request<pb::RenameSessionRequest>,
    ) -> Result<Response<pb::SessionSummary>, Status> {
        unimplemented()
    }
    async fn fork_session(
        &self,
        _: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::ForkSessionResponse>, Status> {
        unimplemented()
    }
    async fn clear_session(
        &self,
        _: Request<pb::ClearSessionRequest>,
    ) -> Result<Response<pb::ClearSessionResponse>, Status> {
        unimplemented()
    }
    async fn undo_session(
        &self,
        _: Request<pb::UndoSessionRequest>,
    ) -> Result<Response<pb::UndoSessionResponse>, Status> {
        unimplemented()
    }
    async fn compact_session(
        &self,
        _: Request<pb::CompactSessionRequest>,
    ) -> Result<Response<pb::CompactSessionResponse>, Status> {
        unimplemented()
    }

    async fn get_admin_status(
        &self,
        _: Request<pb::GetAdminStatusRequest>,
    ) -> Result<Response<pb::AdminStatus>, Status> {
        unimplemented()
    }
    async fn get_host(&self, _: Request<pb::GetHostRequest>) -> Result<Response<pb::HostInfo>, Status> {
        unimplemented()
    }
    async fn list_workspaces(
        &self,
        _: Request<pb::ListWorkspacesRequest>,
    ) -> Result<Response<pb::WorkspaceList>, Status> {
        unimplemented()
    }
    async fn open_workspace(
        &self,
        _: Request<pb::OpenWorkspaceRequest>,
    ) -> Result<Response<pb::OpenWorkspaceResponse>, Status> {
        unimplemented()
    }
    async fn list_memory(
        &self,
        _: Request<pb::ListMemoryRequest>,
    ) -> Result<Response<pb::ListMemoryResponse>, Status> {
        unimplemented()
    }
    async fn add_memory(&self, _: Request<pb::AddMemoryRequest>) -> Result<Response<pb::MemoryNote>, Status> {
        unimplemented()
    }
    async fn update_memory(
        &self,
        _: Request<pb::UpdateMemoryRequest>,
    ) -> Result<Response<pb::MemoryNote>, Status> {
        unimplemented()
    }
    async fn delete_memory(
        &self,
        _: Request<pb::DeleteMemoryRequest>,
    ) -> Result<Response<pb::DeleteMemoryResponse>, Status> {
        unimplemented()
    }
    async fn search(&self, _: Request<pb::SearchRequest>) -> Result<Response<pb::SearchResponse>, Status> {
        unimplemented()
    }
    async fn side_run(&self, _: Request<pb::SideRunRequest>) -> Result<Response<pb::SideAdmission>, Status> {
        unimplemented()
    }
    async fn side_cancel(
        &self,
        _: Request<pb::SideCancelRequest>,
    ) -> Result<Response<pb::SideCancelResponse>, Status> {
        unimplemented()
    }
    async fn list_side(&self, _: Request<pb::ListSideRequest>) -> Result<Response<pb::SideHistory>, Status> {
        unimplemented()
    }
    async fn list_tasks(
        &self,
        _: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        unimplemented()
    }
    async fn create_task(
        &self,
        _: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        unimplemented()
    }
    async fn get_task(&self, _: Request<pb::GetTaskRequest>) -> Result<Response<pb::TaskResponse>, Status> {
        unimplemented()
    }
    async fn update_task(
        &self,
        _: Request<pb::UpdateTaskRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        unimplemented()
    }
    async fn delete_task(
        &self,
        _: Request<pb::DeleteTaskRequest>,
    ) -> Result<Response<pb::DeleteTaskResponse>, Status> {
        unimplemented()
    }
    async fn run_task_now(
        &self,
        _: Request<pb::RunTaskNowRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        unimplemented()
    }
    async fn get_digest(&self, _: Request<pb::GetDigestRequest>) -> Result<Response<pb::Digest>, Status> {
        unimplemented()
    }
    async fn list_workers(
        &self,
        _: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        unimplemented()
    }
    async fn steer_worker(&self, _: Request<pb::SteerWorkerRequest>) -> Result<Response<pb::Worker>, Status> {
        unimplemented()
    }
    async fn stop_worker(&self, _: Request<pb::StopWorkerRequest>) -> Result<Response<pb::Worker>, Status> {
        unimplemented()
    }
    async fn start_best_of_n(
        &self,
        _: Request<pb::StartBestOfNRequest>,
    ) -> Result<Response<pb::StartBestOfNResponse>, Status> {
        unimplemented()
    }
    async fn keep_candidate(
        &self,
        _: Request<pb::KeepCandidateRequest>,
    ) -> Result<Response<pb::KeepCandidateResponse>, Status> {
        unimplemented()
    }
    async fn discard_candidate(
        &self,
        _: Request<pb::DiscardCandidateRequest>,
    ) -> Result<Response<pb::DraftDiscarded>, Status> {
        unimplemented()
    }
    async fn list_skill_proposals(
        &self,
        _: Request<pb::ListSkillProposalsRequest>,
    ) -> Result<Response<pb::SkillProposals>, Status> {
        unimplemented()
    }
    async fn create_skill_proposal(
        &self,
        _: Request<pb::CreateSkillProposalRequest>,
    ) -> Result<Response<pb::SkillProposal>, Status> {
        unimplemented()
    }
    async fn promote_skill_proposal(
        &self,
        _: Request<pb::PromoteSkillProposalRequest>,
    ) -> Result<Response<pb::Skill>, Status> {
        unimplemented()
    }
    async fn reject_skill_proposal(
        &self,
        _: Request<pb::RejectSkillProposalRequest>,
    ) -> Result<Response<pb::SkillProposal>, Status> {
        unimplemented()
    }
    async fn list_skills(
        &self,
        _: Request<pb::ListSkillsRequest>,
    ) -> Result<Response<pb::SkillList>, Status> {
        unimplemented()
    }
    async fn explain_intent(
        &self,
        _: Request<pb::ExplainIntentRequest>,
    ) -> Result<Response<pb::IntentExplanation>, Status> {
        unimplemented()
    }
    async fn get_intent_policy(
        &self,
        _: Request<pb::GetIntentPolicyRequest>,
    ) -> Result<Response<pb::IntentPolicy>, Status> {
        unimplemented()
    }
    async fn list_commitments(
        &self,
        _: Request<pb::ListCommitmentsRequest>,
    ) -> Result<Response<pb::CommitmentList>, Status> {
        unimplemented()
    }
    async fn get_commitment(
        &self,
        _: Request<pb::GetCommitmentRequest>,
    ) -> Result<Response<pb::CommitmentDetail>, Status> {
        unimplemented()
    }
    async fn close_commitment(
        &self,
        _: Request<pb::CloseCommitmentRequest>,
    ) -> Result<Response<pb::Commitment>, Status> {
        unimplemented()
    }
    async fn list_launch(
        &self,
        _: Request<pb::ListLaunchRequest>,
    ) -> Result<Response<pb::ListLaunchResponse>, Status> {
        unimplemented()
    }
    async fn start_launch(
        &self,
        _: Request<pb::StartLaunchRequest>,
    ) -> Result<Response<pb::LaunchStarted>, Status> {
        unimplemented()
    }
    async fn stop_launch(
        &self,
        _: Request<pb::StopLaunchRequest>,
    ) -> Result<Response<pb::LaunchStopped>, Status> {
        unimplemented()
    }
    async fn get_launch_logs(
        &self,
        _: Request<pb::GetLaunchLogsRequest>,
    ) -> Result<Response<pb::LaunchLogs>, Status> {
        unimplemented()
    }
    async fn get_pr(&self, _: Request<pb::GetPrRequest>) -> Result<Response<pb::PrView>, Status> {
        unimplemented()
    }
    async fn merge_pr(
        &self,
        _: Request<pb::MergePrRequest>,
    ) -> Result<Response<pb::MergePrResponse>, Status> {
        unimplemented()
    }
    async fn get_doctor(
        &self,
        _: Request<pb::GetDoctorRequest>,
    ) -> Result<Response<pb::DoctorReport>, Status> {
        unimplemented()
    }
    async fn list_receipts(
        &self,
        _: Request<pb::ListReceiptsRequest>,
    ) -> Result<Response<pb::ListReceiptsResponse>, Status> {
        unimplemented()
    }
    async fn export_backup(
        &self,
        _: Request<pb::ExportBackupRequest>,
    ) -> Result<Response<pb::ExportBackupResponse>, Status> {
        unimplemented()
    }
    async fn import_backup(
        &self,
        _: Request<pb::ImportBackupRequest>,
    ) -> Result<Response<pb::ImportBackupResponse>, Status> {
        unimplemented()
    }
}

/// `vak-bench baseline-server`: serves until killed, announcing its address
/// on stdout as one line, `baseline: listening on http://ADDR`.
pub(crate) fn serve(listen: SocketAddr, capacity: usize) -> std::io::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let svc = Baseline {
            capacity: capacity.max(16),
            sessions: Mutex::new(HashMap::new()),
        };
        println!("baseline: listening on http://{addr}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(svc).max_encoding_message_size(usize::MAX))
            .serve_with_incoming(incoming)
            .await
            .map_err(std::io::Error::other)
    })
}
