//! The tonic `AgentService`: validates requests, calls the core, maps results. REST handlers call these same methods.

use super::{convert, enums};
use crate::errors::to_status;
use crate::forward::{Method, FORWARD_TIMEOUT, SLOW_FORWARD_TIMEOUT};
use crate::limits::StreamLimits;
use crate::metrics::StreamSurface;
use crate::recent_errors::RecentErrors;
use futures_util::stream::{self, Stream, StreamExt};
use pb::agent_service_server::AgentService;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use vak_core::host::config::{self, RoutePatch};
use vak_core::host::control::ControlPlane;
use vak_core::host::hub::Hub;
use vak_core::host::registry::{Located, Registry};
use vak_core::log::presentation::PresentationEvent;
use vak_core::session::admission::AdmissionState;
use vak_core::session::approvals::Answer;
use vak_core::stream::cursor::CursorVector;
use vak_core::stream::delivery::{Delivery, End};
use vak_core::stream::mux::{self, Control, Mux};
use vak_core::{host::diff, host::files, host::memory, host::search, session::wait};
use vak_proto::v1 as pb;

/// How long PutMcpConfig waits for the servers it started to be ready or
/// failed before it answers (they go on starting after that).
const MCP_SETTLE: Duration = Duration::from_secs(30);

mod access;
use access::{blocking, limit_in};
mod admin;
mod backup;
mod commitments;
mod digest;
mod doctor;
mod forwarding;
mod host_info;
mod launch;
mod memory_writes;
mod opened;
mod pr;
mod receipts;
mod skills;
mod tasks;
mod workers;

use forwarding::{is_forwarded, Served};
pub(crate) use opened::Opened;

pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;
pub(crate) type MuxStream = Pin<Box<dyn Stream<Item = Result<pb::StreamMessage, Status>> + Send>>;
pub(crate) type PresentationStream =
    Pin<Box<dyn Stream<Item = Result<pb::PresentationEvent, Status>> + Send>>;

/// Which surface a stream request came from, for coworking frames. The REST
/// adapter marks its requests `Surface::Sse`; without a mark a request is gRPC.
pub(crate) use vak_core::reasons::Surface;

fn surface<T>(req: &Request<T>) -> Surface {
    req.extensions()
        .get::<Surface>()
        .copied()
        .unwrap_or(Surface::Grpc)
}

fn client_id() -> String {
    format!("c_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

#[derive(Clone)]
pub struct AgentApi {
    hub: Arc<Hub>,
    limits: Arc<StreamLimits>,
    /// What the access log saw fail lately, for the console.
    errors: Arc<RecentErrors>,
    /// What `GetHost` says about the edge (terminal, auth, TLS).
    host: Arc<HostFacts>,
}

/// The edge's settings `GetHost` reports and `GET /pty` obeys.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    pub web: vak_core::host::config::FileWeb,
    /// `--allow-remote`.
    pub allow_remote: bool,
    pub tls: bool,
    /// `--max-connections`, for /doctor's open-files check.
    pub max_connections: usize,
}

impl AgentApi {
    pub fn new(hub: Arc<Hub>, limits: Arc<StreamLimits>, errors: Arc<RecentErrors>, host: HostFacts) -> Self {
        AgentApi {
            hub,
            limits,
            errors,
            host: Arc::new(host),
        }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The hub's sessions: create, load, list, delete, rename, fork.
    fn sessions(&self) -> &Registry {
        self.hub.sessions()
    }

    /// The hub's route, keys, mode, rules, memory, search and workspaces.
    fn control(&self) -> &Arc<ControlPlane> {
        self.hub.control()
    }

    pub fn host(&self) -> &HostFacts {
        &self.host
    }

    async fn session(&self, id: &str) -> Result<Arc<vak_core::session::live::Session>, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        self.sessions().get(id).await.map_err(to_status)
    }
}

fn ok<T>(v: T) -> Result<Response<T>, Status> {
    Ok(Response::new(v))
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let asked = req.into_inner().workspace;
        let workspace = if asked.is_empty() {
            None
        } else {
            let ws = self.control().workspaces().clone();
            let found = blocking(move || ws.find(&asked)).await?;
            Some(found.ok_or_else(|| {
                to_status(
                    vak_core::Error::not_found(
                        "no open workspace there: open it first (POST /workspaces/open)",
                    )
                    .with_reason("workspace_not_open"),
                )
            })?)
        };
        let s = self.sessions().create_in(workspace).await.map_err(to_status)?;
        ok(pb::CreateSessionResponse {
            session_id: s.id().to_string(),
            workspace: s.workspace().to_string(),
        })
    }

    async fn list_sessions(
        &self,
        _req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let sessions = self.sessions().list().await.map_err(to_status)?;
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
        let s = self.sessions().attach(&id).await.map_err(to_status)?;
        ok(pb::AttachSessionResponse {
            session: Some(convert::summary(s.info())),
        })
    }

    async fn run(&self, req: Request<pb::RunRequest>) -> Result<Response<pb::Admission>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        if r.prompt.trim().is_empty() {
            return Err(Status::invalid_argument("prompt is required"));
        }
        let limit = match r.wait_seconds {
            None => wait::DEFAULT_WAIT,
            Some(n) if n >= 1 && u64::from(n) <= wait::MAX_WAIT.as_secs() => Duration::from_secs(n.into()),
            Some(n) => {
                return Err(Status::invalid_argument(format!(
                    "wait_seconds {n}: give 1 to {}",
                    wait::MAX_WAIT.as_secs()
                )))
            }
        };
        let s = match self.locate(forwarded, &r.session_id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => {
                let timeout = if r.wait {
                    limit + FORWARD_TIMEOUT
                } else {
                    FORWARD_TIMEOUT
                };
                return self.forward(&owner, Method::Run, &r, timeout).await;
            }
        };
        let images = self.attachments(&s, r.attachments).await?;
        let a = s
            .admit_with(r.prompt, Some(r.request_id), images)
            .await
            .map_err(to_status)?;
        let mut admission = convert::admission(a.clone());
        // A duplicate's run may be long over: it is answered as admitted.
        if r.wait && a.state != AdmissionState::Duplicate {
            admission.result = wait::settled(&s, a.after_seq, limit)
                .await
                .map(convert::run_result);
        }
        ok(admission)
    }

    async fn steer(&self, req: Request<pb::SteerRequest>) -> Result<Response<pb::Admission>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        if r.text.trim().is_empty() {
            return Err(Status::invalid_argument("text is required"));
        }
        let s = match self.locate(forwarded, &r.session_id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => return self.forward(&owner, Method::Steer, &r, FORWARD_TIMEOUT).await,
        };
        let images = self.attachments(&s, r.attachments).await?;
        let a = s
            .admit_with(r.text, Some(r.request_id), images)
            .await
            .map_err(to_status)?;
        ok(convert::admission(a))
    }

    async fn approve(
        &self,
        req: Request<pb::ApproveRequest>,
    ) -> Result<Response<pb::ApproveResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let Some(approve) = r.approve else {
            return Err(Status::invalid_argument("approve (true or false) is required"));
        };
        if r.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is required"));
        }
        let mode = match r.mode {
            Some(m) => Some(enums::plan_exit_mode_in(m).map_err(to_status)?),
            None => None,
        };
        let s = match self.locate(forwarded, &r.session_id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => {
                return self.forward(&owner, Method::Approve, &r, FORWARD_TIMEOUT).await
            }
        };
        let always = r.always.unwrap_or(false);
        let answered = s
            .answer(
                &r.request_id,
                Answer {
                    approve,
                    reason: r.reason,
                    mode,
                    always,
                },
            )
            .await
            .map_err(to_status)?;
        ok(pb::ApproveResponse {
            request_id: r.request_id,
            outcome: enums::approval_outcome(answered.outcome) as i32,
            persisted: answered.rule.is_some(),
            rule: answered.rule.map(convert::rule),
        })
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let s = match self.locate(forwarded, &r.session_id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => return self.forward(&owner, Method::Cancel, &r, FORWARD_TIMEOUT).await,
        };
        ok(convert::cancel(s.cancel()))
    }

    type SubscribeStream = EventStream;

    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Result<Response<EventStream>, Status> {
        let Opened {
            session_id: sid,
            latest_seq,
            after,
            subscription: sub,
            hold,
        } = self.open_subscription(req).await?;
        let last = after.unwrap_or(latest_seq);
        // Subscribed before announcing: nothing published after stream_opened can be missed.
        // The id travels in the state: cloned per item it was an allocation per event.
        // What `recv` takes ahead stays counted in the reader's byte budget
        // until it takes more: tonic encodes a message and h2 holds it until
        // the stream's window lets it out. stream_opened is made by the
        // first step, not kept in a stream of its own beside this one: the
        // boxed stream lives as long as the subscriber, idle or not.
        let events = stream::unfold(Some((sub, last, sid, true)), move |state| {
            let _attached = &hold;
            async move {
                let (mut sub, last, sid, first) = state?;
                if first {
                    let opened = convert::stream_opened(&sid, latest_seq);
                    return Some((Ok(opened), Some((sub, last, sid, false))));
                }
                match sub.recv().await? {
                    Delivery::Frame(f) => {
                        let seq = f.seq;
                        Some((Ok(convert::frame(&f)), Some((sub, seq, sid, false))))
                    }
                    Delivery::Resync {
                        reason,
                        latest_seq,
                        lost,
                    } => Some((
                        Ok(convert::resync(&sid, reason, latest_seq, lost)),
                        Some((sub, last, sid, false)),
                    )),
                    Delivery::End(End::Closed(reason)) => {
                        Some((Ok(convert::session_closed(&sid, reason)), None))
                    }
                }
            }
        });
        ok(Box::pin(events) as EventStream)
    }

    async fn get_transcript(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::Transcript>, Status> {
        let s = self.session(&req.into_inner().session_id).await?;
        ok(convert::transcript(s.id(), s.transcript()))
    }

    async fn get_transcript_markdown(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::TranscriptMarkdown>, Status> {
        let s = self.session(&req.into_inner().session_id).await?;
        ok(pb::TranscriptMarkdown {
            markdown: s.transcript().markdown(s.id()),
        })
    }

    type StreamStream = MuxStream;

    async fn stream(&self, req: Request<pb::StreamRequest>) -> Result<Response<MuxStream>, Status> {
        use pb::stream_message::Frame as F;
        let permit = self.permit(&req, StreamSurface::Stream)?;
        let r = req.into_inner();
        let cursor = CursorVector::parse(&r.cursor).map_err(to_status)?;
        let mux = Mux::open(self.sessions(), self.hub.streams(), &r.sessions, &cursor)
            .await
            .map_err(to_status)?;
        let mut first = vec![convert::mux_opened(mux.stream_id(), mux.cursor())];
        if r.host {
            first.push(convert::mux_extra(F::Host(self.host_info())));
        }
        if r.config {
            first.push(convert::mux_extra(F::Config(convert::config(
                self.control().config_info(),
            ))));
        }
        // Config frames: one now (above), then one on every route change
        // and every permission mode change.
        let changes = r
            .config
            .then(|| (self.control().settings().changes(), self.control().watch_mode()));
        let control = self.control().clone();
        let rest = stream::unfold(
            (mux, permit, changes, control),
            |(mut mux, permit, mut changes, control)| async move {
                let msg = loop {
                    let Some((route, mode)) = changes.as_mut() else {
                        break convert::mux_item(mux.next().await?);
                    };
                    tokio::select! {
                        biased;
                        changed = route.changed() => match changed {
                            Ok(()) => break convert::mux_extra(F::Config(convert::config(control.config_info()))),
                            Err(_) => changes = None,
                        },
                        changed = mode.changed() => match changed {
                            Ok(()) => break convert::mux_extra(F::Config(convert::config(control.config_info()))),
                            Err(_) => changes = None,
                        },
                        item = mux.next() => break convert::mux_item(item?),
                    }
                };
                Some((Ok(msg), (mux, permit, changes, control)))
            },
        );
        ok(Box::pin(stream::iter(first.into_iter().map(Ok)).chain(rest)) as MuxStream)
    }

    async fn follow(&self, req: Request<pb::FollowRequest>) -> Result<Response<pb::FollowResponse>, Status> {
        let r = req.into_inner();
        let session = self.session(&r.session_id).await?;
        let after = r.after;
        let sessions = mux::control(self.hub.streams(), &r.stream_id, |reply| Control::Follow {
            session,
            after,
            reply,
        })
        .await
        .map_err(to_status)?;
        ok(pb::FollowResponse {
            stream_id: r.stream_id,
            sessions,
        })
    }

    async fn unfollow(
        &self,
        req: Request<pb::UnfollowRequest>,
    ) -> Result<Response<pb::FollowResponse>, Status> {
        let r = req.into_inner();
        // Unknown or malformed sessions are refused like Follow's; a known
        // session that is not followed is a no-op (retries are safe).
        let session_id = self.session(&r.session_id).await?.id().to_string();
        let sessions = mux::control(self.hub.streams(), &r.stream_id, |reply| Control::Unfollow {
            session_id,
            reply,
        })
        .await
        .map_err(to_status)?;
        ok(pb::FollowResponse {
            stream_id: r.stream_id,
            sessions,
        })
    }

    async fn get_presentation(
        &self,
        req: Request<pb::GetPresentationRequest>,
    ) -> Result<Response<pb::OutputTimeline>, Status> {
        let s = self.session(&req.into_inner().session_id).await?;
        ok(convert::timeline(&s.timeline()))
    }

    async fn get_config(
        &self,
        _req: Request<pb::GetConfigRequest>,
    ) -> Result<Response<pb::ConfigInfo>, Status> {
        ok(convert::config(self.control().config_info()))
    }

    async fn update_config(
        &self,
        req: Request<pb::UpdateConfigRequest>,
    ) -> Result<Response<pb::ConfigInfo>, Status> {
        let r = req.into_inner();
        let provider = match r.provider.as_deref() {
            Some(p) => Some(config::parse_provider(p, "provider").map_err(to_status)?),
            None => None,
        };
        if let Some(rev) = &r.revision {
            if rev.len() > 128 {
                return Err(Status::invalid_argument("revision is longer than 128 characters"));
            }
        }
        let settings = convert::settings_patch(r.max_turns, r.theme, r.hooks).map_err(to_status)?;
        let patch = RoutePatch {
            provider,
            model: r.model,
            base_url: r.base_url,
            revision: r.revision,
            settings,
        };
        let info = self.control().update_route(patch).await.map_err(to_status)?;
        ok(convert::config(info))
    }

    async fn set_mode(
        &self,
        req: Request<pb::SetModeRequest>,
    ) -> Result<Response<pb::SetModeResponse>, Status> {
        let mode = enums::permission_mode_in(req.into_inner().mode).map_err(to_status)?;
        let change = self.control().set_mode(mode).await.map_err(to_status)?;
        ok(convert::mode_change(change))
    }

    async fn list_rules(
        &self,
        req: Request<pb::ListRulesRequest>,
    ) -> Result<Response<pb::ListRulesResponse>, Status> {
        let asked = req.into_inner().workspace;
        let rt = self
            .control()
            .workspace_runtime(asked.as_deref())
            .await
            .map_err(to_status)?;
        let rules = rt.rules();
        let list = rules.list_now().await.map_err(to_status)?;
        ok(pb::ListRulesResponse {
            workspace: rules.workspace().to_string(),
            rules: list.iter().cloned().map(convert::rule).collect(),
            max_rules: vak_core::host::rules::MAX_RULES as u32,
        })
    }

    async fn delete_rule(
        &self,
        req: Request<pb::DeleteRuleRequest>,
    ) -> Result<Response<pb::DeleteRuleResponse>, Status> {
        let r = req.into_inner();
        if r.id.is_empty() {
            return Err(Status::invalid_argument("id is required"));
        }
        let rt = self
            .control()
            .workspace_runtime(r.workspace.as_deref())
            .await
            .map_err(to_status)?;
        let rule = rt.rules().delete(&r.id).await.map_err(to_status)?;
        ok(pb::DeleteRuleResponse {
            rule: Some(convert::rule(rule)),
        })
    }

    async fn get_mcp_config(
        &self,
        _req: Request<pb::GetMcpConfigRequest>,
    ) -> Result<Response<pb::McpConfig>, Status> {
        ok(convert::mcp_config(self.control().mcp().status()))
    }

    async fn put_mcp_config(
        &self,
        req: Request<pb::PutMcpConfigRequest>,
    ) -> Result<Response<pb::McpConfig>, Status> {
        let defs = convert::mcp_defs(req.into_inner().servers);
        let status = self
            .control()
            .put_mcp(defs, MCP_SETTLE)
            .await
            .map_err(to_status)?;
        ok(convert::mcp_config(status))
    }

    async fn set_key(&self, req: Request<pb::SetKeyRequest>) -> Result<Response<pb::SetKeyResponse>, Status> {
        let r = req.into_inner();
        let kind = config::parse_provider(&r.provider, "provider").map_err(to_status)?;
        let fingerprint = self.control().set_key(kind, &r.key).await.map_err(to_status)?;
        ok(pb::SetKeyResponse {
            provider: kind.as_str().to_string(),
            stored: true,
            fingerprint,
        })
    }

    async fn delete_key(
        &self,
        req: Request<pb::DeleteKeyRequest>,
    ) -> Result<Response<pb::DeleteKeyResponse>, Status> {
        let r = req.into_inner();
        let kind = config::parse_provider(&r.provider, "provider").map_err(to_status)?;
        let (deleted, shadowed_by_env) = self.control().delete_key(kind).await.map_err(to_status)?;
        ok(pb::DeleteKeyResponse {
            provider: kind.as_str().to_string(),
            deleted,
            shadowed_by_env,
        })
    }

    async fn list_providers(
        &self,
        _req: Request<pb::ListProvidersRequest>,
    ) -> Result<Response<pb::ListProvidersResponse>, Status> {
        self.control()
            .settings()
            .refresh_keys()
            .await
            .map_err(to_status)?;
        ok(pb::ListProvidersResponse {
            providers: self
                .control()
                .settings()
                .providers()
                .into_iter()
                .map(convert::provider_info)
                .collect(),
        })
    }

    async fn list_models(
        &self,
        req: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let r = req.into_inner();
        // The provider is the resource the path names: one that does not
        // exist is not found (a malformed body field elsewhere is a 400).
        let kind = config::parse_provider(&r.provider, "provider")
            .map_err(|e| to_status(vak_core::error::Error::not_found(e.message)))?;
        self.control()
            .settings()
            .refresh_keys()
            .await
            .map_err(to_status)?;
        let models = self
            .control()
            .settings()
            .list_models(kind)
            .await
            .map_err(to_status)?;
        ok(pb::ListModelsResponse {
            provider: kind.as_str().to_string(),
            models: models.into_iter().map(convert::model_entry).collect(),
        })
    }

    // ---- Workspace files, diff and session lifecycle (issue 15) ----

    async fn read_file(
        &self,
        req: Request<pb::ReadFileRequest>,
    ) -> Result<Response<pb::FileContent>, Status> {
        let r = req.into_inner();
        let ws = self.files_root(r.session_id.as_deref()).await?;
        let path = r.path;
        let read = blocking(move || files::read(&ws, &path)).await?;
        ok(convert::file_content(read))
    }

    async fn write_file(
        &self,
        req: Request<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let r = req.into_inner();
        let bytes = convert::file_bytes(r.content, r.encoding).map_err(to_status)?;
        let ws = self.files_root(r.session_id.as_deref()).await?;
        let written = blocking(move || files::write(&ws, &r.path, &bytes, r.expected_sha.as_deref())).await?;
        ok(convert::file_written(written))
    }

    async fn list_tree(&self, req: Request<pb::ListTreeRequest>) -> Result<Response<pb::FileTree>, Status> {
        let r = req.into_inner();
        let limit = limit_in(r.limit, files::DEFAULT_TREE_LIMIT, files::MAX_TREE_LIMIT)?;
        let ws = self.files_root(r.session_id.as_deref()).await?;
        let (files, truncated) = blocking(move || files::tree(&ws, limit)).await?;
        ok(pb::FileTree { files, truncated })
    }

    async fn list_dirs(&self, req: Request<pb::ListDirsRequest>) -> Result<Response<pb::DirListing>, Status> {
        let path = req.into_inner().path;
        let roots = self.control().config().dir_roots();
        let listing = blocking(move || files::dirs(&roots, &path)).await?;
        ok(convert::dir_listing(listing))
    }

    async fn get_diff(
        &self,
        req: Request<pb::GetDiffRequest>,
    ) -> Result<Response<pb::WorkspaceDiff>, Status> {
        let s = self.session(&req.into_inner().session_id).await?;
        let cfg = self.control().config();
        s.runtime().check_workspace().await.map_err(to_status)?;
        // The session's own workspace, which may not be the server's.
        let d = diff::diff(s.workspace_dir(), &cfg.git).await.map_err(to_status)?;
        ok(convert::workspace_diff(s.id(), d))
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        if r.session_id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        // With --bus the holder deletes (it purges the session's subject).
        if let Served::There(answer) = self
            .here_or_forward(
                forwarded,
                &r.session_id,
                Method::DeleteSession,
                &r,
                FORWARD_TIMEOUT,
            )
            .await?
        {
            return Ok(answer);
        }
        let id = r.session_id;
        self.sessions().delete(&id).await.map_err(to_status)?;
        ok(pb::DeleteSessionResponse {
            session_id: id,
            deleted: true,
        })
    }

    async fn rename_session(
        &self,
        req: Request<pb::RenameSessionRequest>,
    ) -> Result<Response<pb::SessionSummary>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let method = Method::RenameSession;
        if let Served::There(answer) = self
            .here_or_forward(forwarded, &r.session_id, method, &r, FORWARD_TIMEOUT)
            .await?
        {
            return Ok(answer);
        }
        let info = self
            .sessions()
            .rename(&r.session_id, &r.title)
            .await
            .map_err(to_status)?;
        ok(convert::summary(info))
    }

    async fn fork_session(
        &self,
        req: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::ForkSessionResponse>, Status> {
        let r = req.into_inner();
        if r.session_id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        let (child, at_seq) = self
            .sessions()
            .fork(&r.session_id, r.at_seq)
            .await
            .map_err(to_status)?;
        ok(pb::ForkSessionResponse {
            session: Some(convert::summary(child.info())),
            parent_id: r.session_id,
            at_seq,
        })
    }

    async fn clear_session(
        &self,
        req: Request<pb::ClearSessionRequest>,
    ) -> Result<Response<pb::ClearSessionResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let s = match self
            .here_or_forward(
                forwarded,
                &r.session_id,
                Method::ClearSession,
                &r,
                FORWARD_TIMEOUT,
            )
            .await?
        {
            Served::Here(s) => s,
            Served::There(answer) => return Ok(answer),
        };
        let upto_seq = s.clear_history().await.map_err(to_status)?;
        ok(pb::ClearSessionResponse {
            session_id: s.id().to_string(),
            upto_seq,
        })
    }

    async fn undo_session(
        &self,
        req: Request<pb::UndoSessionRequest>,
    ) -> Result<Response<pb::UndoSessionResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let s = match self
            .here_or_forward(forwarded, &r.session_id, Method::UndoSession, &r, FORWARD_TIMEOUT)
            .await?
        {
            Served::Here(s) => s,
            Served::There(answer) => return Ok(answer),
        };
        let u = s.undo_last().await.map_err(to_status)?;
        ok(pb::UndoSessionResponse {
            session_id: s.id().to_string(),
            after_seq: u.after_seq,
            upto_seq: u.upto_seq,
        })
    }

    async fn side_run(
        &self,
        req: Request<pb::SideRunRequest>,
    ) -> Result<Response<pb::SideAdmission>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let s = match self
            .here_or_forward(forwarded, &r.session_id, Method::SideRun, &r, FORWARD_TIMEOUT)
            .await?
        {
            Served::Here(s) => s,
            Served::There(answer) => return Ok(answer),
        };
        let (side_id, after_seq) = s.side_run(r.question).map_err(to_status)?;
        ok(pb::SideAdmission { side_id, after_seq })
    }

    async fn side_cancel(
        &self,
        req: Request<pb::SideCancelRequest>,
    ) -> Result<Response<pb::SideCancelResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let s = match self
            .here_or_forward(forwarded, &r.session_id, Method::SideCancel, &r, FORWARD_TIMEOUT)
            .await?
        {
            Served::Here(s) => s,
            Served::There(answer) => return Ok(answer),
        };
        let side_id = s.side_cancel();
        ok(pb::SideCancelResponse {
            cancelled: side_id.is_some(),
            side_id: side_id.unwrap_or_default(),
        })
    }

    async fn list_tasks(
        &self,
        r: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        self.tasks_list(r.into_inner()).await.map(Response::new)
    }
    async fn create_task(
        &self,
        r: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        self.tasks_create(r.into_inner()).await.map(Response::new)
    }
    async fn get_task(&self, r: Request<pb::GetTaskRequest>) -> Result<Response<pb::TaskResponse>, Status> {
        self.tasks_get(r.into_inner()).await.map(Response::new)
    }
    async fn update_task(
        &self,
        r: Request<pb::UpdateTaskRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        self.tasks_update(r.into_inner()).await.map(Response::new)
    }
    async fn delete_task(
        &self,
        r: Request<pb::DeleteTaskRequest>,
    ) -> Result<Response<pb::DeleteTaskResponse>, Status> {
        self.tasks_delete(r.into_inner()).await.map(Response::new)
    }
    async fn run_task_now(
        &self,
        r: Request<pb::RunTaskNowRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        self.tasks_run_now(r.into_inner()).await.map(Response::new)
    }
    async fn get_digest(&self, r: Request<pb::GetDigestRequest>) -> Result<Response<pb::Digest>, Status> {
        self.digest(r.into_inner()).await.map(Response::new)
    }
    async fn get_doctor(
        &self,
        r: Request<pb::GetDoctorRequest>,
    ) -> Result<Response<pb::DoctorReport>, Status> {
        self.doctor(r.into_inner()).await.map(Response::new)
    }
    async fn list_receipts(
        &self,
        r: Request<pb::ListReceiptsRequest>,
    ) -> Result<Response<pb::ListReceiptsResponse>, Status> {
        self.receipts(r.into_inner()).await.map(Response::new)
    }
    async fn export_backup(
        &self,
        r: Request<pb::ExportBackupRequest>,
    ) -> Result<Response<pb::ExportBackupResponse>, Status> {
        self.backup_export(r.into_inner()).await.map(Response::new)
    }
    async fn import_backup(
        &self,
        r: Request<pb::ImportBackupRequest>,
    ) -> Result<Response<pb::ImportBackupResponse>, Status> {
        self.backup_import(r.into_inner()).await.map(Response::new)
    }
    async fn list_workers(
        &self,
        r: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        self.workers_list(r.into_inner()).await.map(Response::new)
    }
    async fn steer_worker(&self, r: Request<pb::SteerWorkerRequest>) -> Result<Response<pb::Worker>, Status> {
        self.workers_steer(r.into_inner()).await.map(Response::new)
    }
    async fn stop_worker(&self, r: Request<pb::StopWorkerRequest>) -> Result<Response<pb::Worker>, Status> {
        self.workers_stop(r.into_inner()).await.map(Response::new)
    }
    async fn start_best_of_n(
        &self,
        r: Request<pb::StartBestOfNRequest>,
    ) -> Result<Response<pb::StartBestOfNResponse>, Status> {
        self.bestofn_start(r.into_inner()).await.map(Response::new)
    }
    async fn keep_candidate(
        &self,
        r: Request<pb::KeepCandidateRequest>,
    ) -> Result<Response<pb::KeepCandidateResponse>, Status> {
        self.bestofn_keep(r.into_inner()).await.map(Response::new)
    }
    async fn discard_candidate(
        &self,
        r: Request<pb::DiscardCandidateRequest>,
    ) -> Result<Response<pb::DraftDiscarded>, Status> {
        self.bestofn_discard(r.into_inner()).await.map(Response::new)
    }
    async fn list_launch(
        &self,
        r: Request<pb::ListLaunchRequest>,
    ) -> Result<Response<pb::ListLaunchResponse>, Status> {
        self.launch_list(r.into_inner()).await.map(Response::new)
    }
    async fn start_launch(
        &self,
        r: Request<pb::StartLaunchRequest>,
    ) -> Result<Response<pb::LaunchStarted>, Status> {
        self.launch_start(r.into_inner()).await.map(Response::new)
    }
    async fn stop_launch(
        &self,
        r: Request<pb::StopLaunchRequest>,
    ) -> Result<Response<pb::LaunchStopped>, Status> {
        self.launch_stop(r.into_inner()).await.map(Response::new)
    }
    async fn get_launch_logs(
        &self,
        r: Request<pb::GetLaunchLogsRequest>,
    ) -> Result<Response<pb::LaunchLogs>, Status> {
        self.launch_logs(r.into_inner()).await.map(Response::new)
    }
    async fn get_pr(&self, r: Request<pb::GetPrRequest>) -> Result<Response<pb::PrView>, Status> {
        self.pr_view(r.into_inner()).await.map(Response::new)
    }
    async fn merge_pr(
        &self,
        r: Request<pb::MergePrRequest>,
    ) -> Result<Response<pb::MergePrResponse>, Status> {
        self.pr_merge(r.into_inner()).await.map(Response::new)
    }

    async fn list_skill_proposals(
        &self,
        _: Request<pb::ListSkillProposalsRequest>,
    ) -> Result<Response<pb::SkillProposals>, Status> {
        ok(self.skill_proposals())
    }
    async fn create_skill_proposal(
        &self,
        r: Request<pb::CreateSkillProposalRequest>,
    ) -> Result<Response<pb::SkillProposal>, Status> {
        self.skill_propose(r.into_inner()).await.map(Response::new)
    }
    async fn promote_skill_proposal(
        &self,
        r: Request<pb::PromoteSkillProposalRequest>,
    ) -> Result<Response<pb::Skill>, Status> {
        self.skill_promote(r.into_inner()).await.map(Response::new)
    }
    async fn reject_skill_proposal(
        &self,
        r: Request<pb::RejectSkillProposalRequest>,
    ) -> Result<Response<pb::SkillProposal>, Status> {
        self.skill_reject(r.into_inner()).map(Response::new)
    }
    async fn list_skills(
        &self,
        r: Request<pb::ListSkillsRequest>,
    ) -> Result<Response<pb::SkillList>, Status> {
        self.skills_listed(r.into_inner()).await.map(Response::new)
    }
    async fn explain_intent(
        &self,
        r: Request<pb::ExplainIntentRequest>,
    ) -> Result<Response<pb::IntentExplanation>, Status> {
        self.intent_explained(r.into_inner()).map(Response::new)
    }
    async fn get_intent_policy(
        &self,
        _: Request<pb::GetIntentPolicyRequest>,
    ) -> Result<Response<pb::IntentPolicy>, Status> {
        ok(self.intent_policy())
    }
    async fn list_commitments(
        &self,
        r: Request<pb::ListCommitmentsRequest>,
    ) -> Result<Response<pb::CommitmentList>, Status> {
        ok(self.commitments_listed(r.into_inner()).await)
    }
    async fn get_commitment(
        &self,
        r: Request<pb::GetCommitmentRequest>,
    ) -> Result<Response<pb::CommitmentDetail>, Status> {
        self.commitment_detail(r.into_inner()).await.map(Response::new)
    }
    async fn close_commitment(
        &self,
        r: Request<pb::CloseCommitmentRequest>,
    ) -> Result<Response<pb::Commitment>, Status> {
        self.commitment_close(is_forwarded(&r), r.into_inner()).await
    }

    async fn list_side(
        &self,
        req: Request<pb::ListSideRequest>,
    ) -> Result<Response<pb::SideHistory>, Status> {
        let s = self.session(&req.into_inner().session_id).await?;
        ok(pb::SideHistory {
            session_id: s.id().to_string(),
            runs: s.side_history().into_iter().map(convert::side_entry).collect(),
        })
    }

    async fn compact_session(
        &self,
        req: Request<pb::CompactSessionRequest>,
    ) -> Result<Response<pb::CompactSessionResponse>, Status> {
        let forwarded = is_forwarded(&req);
        let r = req.into_inner();
        let s = match self
            .here_or_forward(
                forwarded,
                &r.session_id,
                Method::CompactSession,
                &r,
                SLOW_FORWARD_TIMEOUT,
            )
            .await?
        {
            Served::Here(s) => s,
            Served::There(answer) => return Ok(answer),
        };
        let upto_seq = s.compact_history().await.map_err(to_status)?;
        ok(pb::CompactSessionResponse {
            session_id: s.id().to_string(),
            upto_seq,
        })
    }

    async fn get_host(&self, _req: Request<pb::GetHostRequest>) -> Result<Response<pb::HostInfo>, Status> {
        ok(self.host_info())
    }

    async fn list_workspaces(
        &self,
        _req: Request<pb::ListWorkspacesRequest>,
    ) -> Result<Response<pb::WorkspaceList>, Status> {
        ok(pb::WorkspaceList {
            workspaces: self
                .control()
                .workspaces()
                .list()
                .into_iter()
                .map(convert::workspace)
                .collect(),
            max_workspaces: vak_core::host::workspaces::MAX_OPEN as u32,
        })
    }

    async fn open_workspace(
        &self,
        req: Request<pb::OpenWorkspaceRequest>,
    ) -> Result<Response<pb::OpenWorkspaceResponse>, Status> {
        let req = req.into_inner();
        let ws = self.control().workspaces().clone();
        let (w, opened) = blocking(move || ws.open(&req.path, req.trust)).await?;
        ok(pb::OpenWorkspaceResponse {
            workspace: Some(convert::workspace(w)),
            opened,
        })
    }

    async fn get_admin_status(
        &self,
        _req: Request<pb::GetAdminStatusRequest>,
    ) -> Result<Response<pb::AdminStatus>, Status> {
        ok(self.admin_status().await)
    }

    // ---- Memory and search (issue 15) ----

    async fn list_memory(
        &self,
        _req: Request<pb::ListMemoryRequest>,
    ) -> Result<Response<pb::ListMemoryResponse>, Status> {
        let memory = self.control().memory();
        let notes = memory.list().await.map_err(to_status)?;
        ok(pb::ListMemoryResponse {
            notes: notes.into_iter().map(convert::memory_note).collect(),
            workspace: memory.workspace().to_string(),
            max_notes: memory::MAX_NOTES as u32,
            max_note_bytes: memory::MAX_NOTE as u32,
        })
    }

    async fn add_memory(&self, r: Request<pb::AddMemoryRequest>) -> Result<Response<pb::MemoryNote>, Status> {
        self.memory_add(r.into_inner()).await.map(Response::new)
    }

    async fn update_memory(
        &self,
        r: Request<pb::UpdateMemoryRequest>,
    ) -> Result<Response<pb::MemoryNote>, Status> {
        self.memory_update(r.into_inner()).await.map(Response::new)
    }

    async fn delete_memory(
        &self,
        r: Request<pb::DeleteMemoryRequest>,
    ) -> Result<Response<pb::DeleteMemoryResponse>, Status> {
        self.memory_delete(r.into_inner()).await.map(Response::new)
    }

    async fn search(&self, req: Request<pb::SearchRequest>) -> Result<Response<pb::SearchResponse>, Status> {
        let r = req.into_inner();
        let limit = limit_in(r.limit, search::DEFAULT_LIMIT, search::MAX_LIMIT)?;
        let hits = self
            .control()
            .search(&r.q, limit, r.all)
            .await
            .map_err(to_status)?;
        ok(pb::SearchResponse {
            hits: hits
                .into_iter()
                .map(|(h, title)| convert::search_hit(h, title))
                .collect(),
            workspace: self.control().workspace().to_string(),
        })
    }

    type PresentationEventsStream = PresentationStream;

    async fn presentation_events(
        &self,
        req: Request<pb::GetPresentationRequest>,
    ) -> Result<Response<PresentationStream>, Status> {
        let surface = surface(&req);
        let permit = self.permit(&req, StreamSurface::Presentation)?;
        let s = self.session(&req.into_inner().session_id).await?;
        let presence = (s.join(&client_id(), surface), permit);
        let presented = s.subscribe_presented(None);
        let sid = s.id().to_string();
        let snapshot = PresentationEvent::Snapshot(presented.presenter.timeline().clone());
        let first = convert::presentation(&sid, &snapshot);
        let state = (presented.subscription, presented.presenter, presence, sid);
        let rest = stream::unfold(Some(state), move |state| async move {
            let (mut sub, mut presenter, presence, sid) = state?;
            loop {
                match sub.recv().await? {
                    Delivery::Frame(f) => {
                        let events = presenter.apply(f.seq, &f.event);
                        if events.is_empty() {
                            continue;
                        }
                        let batch: Vec<_> = events
                            .iter()
                            .map(|e| Ok(convert::presentation(&sid, e)))
                            .collect();
                        return Some((stream::iter(batch), Some((sub, presenter, presence, sid))));
                    }
                    Delivery::Resync { .. } => continue,
                    Delivery::End(End::Closed(_)) => return None,
                }
            }
        })
        .flatten();
        ok(Box::pin(stream::once(async move { Ok(first) }).chain(rest)) as PresentationStream)
    }
}
