//! The one `Transport` trait that the REST/SSE and gRPC clients both implement, where
//! the server is (`Target`), how a call fails (`Failure`) and how an approval was
//! settled (`ApprovalOutcome`), below both clients and the code that picks one (`conn.rs`).

use futures_util::Stream;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use vak_proto::v1 as pb;

/// Where the server is and how to authenticate to it.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub url: String,
    pub token: String,
    /// PEM roots to trust for an https server (`--ca-cert`, or the development
    /// certificate `vak serve --tls-self-signed` keeps in the home).
    pub ca_pem: Option<Vec<u8>>,
}

/// What a failed call means to the client: retry it, or tell the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailKind {
    /// The connection failed or the server is briefly unavailable: retrying may succeed.
    Transient,
    /// The session (or approval) does not exist.
    NotFound,
    /// The request conflicts with the state (an approval already settled).
    Conflict,
    /// The server refused the token (HTTP 401, gRPC UNAUTHENTICATED).
    Unauthenticated,
    /// Retrying cannot help (bad token, bad request, a server error).
    Fatal,
}

#[derive(Clone, Debug)]
pub struct Failure {
    pub kind: FailKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
    pub fn fatal(message: impl Into<String>) -> Failure {
        Self::new(FailKind::Fatal, message)
    }
    pub fn transient(message: impl Into<String>) -> Failure {
        Self::new(FailKind::Transient, message)
    }
    pub fn is_transient(&self) -> bool {
        self.kind == FailKind::Transient
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Failure> for vak_proto::Error {
    fn from(f: Failure) -> vak_proto::Error {
        match f.kind {
            FailKind::NotFound => vak_proto::Error::not_found(f.message),
            FailKind::Conflict => vak_proto::Error::conflict(f.message),
            FailKind::Transient => vak_proto::Error::new(vak_proto::ErrorKind::Unavailable, f.message),
            FailKind::Fatal | FailKind::Unauthenticated => vak_proto::Error::invalid(f.message),
        }
    }
}

pub(crate) type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, Failure>> + Send + 'a>>;
/// A session's events: `Ok` frames, then the end (`None`) or one `Err`.
pub(crate) type Events = Pin<Box<dyn Stream<Item = Result<pb::Event, Failure>> + Send>>;

/// The calls `vak term` makes. The two implementations (REST/SSE in `rest.rs`,
/// gRPC in `grpc.rs`) must be indistinguishable to the code above them, which
/// is what `--transport` promises.
pub(crate) trait Transport: Send + Sync {
    /// "sse" or "grpc", for messages.
    fn name(&self) -> &'static str;
    fn create_session(&self) -> Fut<'_, String>;
    fn list_sessions(&self) -> Fut<'_, Vec<pb::SessionSummary>>;
    fn attach(&self, session_id: &str) -> Fut<'_, pb::SessionSummary>;
    fn run(&self, req: pb::RunRequest) -> Fut<'_, pb::Admission>;
    fn steer(&self, req: pb::SteerRequest) -> Fut<'_, pb::Admission>;
    fn approve(&self, req: pb::ApproveRequest) -> Fut<'_, pb::ApproveResponse>;
    fn cancel(&self, session_id: &str) -> Fut<'_, pb::CancelResponse>;
    fn transcript(&self, session_id: &str) -> Fut<'_, pb::Transcript>;
    /// The presentation timeline (its pending approval items are what a resync asks again).
    fn presentation(&self, session_id: &str) -> Fut<'_, pb::OutputTimeline>;
    /// The session's children (workers and best-of-N candidates), oldest first.
    fn list_workers(&self, session_id: &str) -> Fut<'_, Vec<pb::Worker>>;
    /// The skills a session's legs offer (its workspace's and the home's; None: the
    /// server's workspace's), each a slash command.
    fn list_skills(&self, session_id: Option<&str>) -> Fut<'_, Vec<pb::Skill>>;
    /// Opens the session's event stream; the server sends stream_opened first.
    fn subscribe(&self, session_id: &str, after: Option<u64>) -> Fut<'_, Events>;
}

/// How an approval was settled: the closed set the server sends as
/// `outcome` (`ApproveResponse`, `approval_resolved`) and as an approval
/// item's `status` in the presentation timeline (docs/protocol.md, section 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ApprovalOutcome {
    Approved,
    Denied,
    Expired,
}

impl ApprovalOutcome {
    /// The outcome a settled approval item of the timeline has; None for
    /// any other status (`pending`, one a newer server added).
    pub(crate) fn from_status(s: pb::ItemStatus) -> Option<ApprovalOutcome> {
        match s {
            pb::ItemStatus::Approved => Some(ApprovalOutcome::Approved),
            pb::ItemStatus::Denied => Some(ApprovalOutcome::Denied),
            pb::ItemStatus::Expired => Some(ApprovalOutcome::Expired),
            _ => None,
        }
    }

    /// The outcome an `approval_resolved` frame names; None for UNSPECIFIED.
    pub(crate) fn from_pb(o: pb::ApprovalOutcome) -> Option<ApprovalOutcome> {
        match o {
            pb::ApprovalOutcome::Approved => Some(ApprovalOutcome::Approved),
            pb::ApprovalOutcome::Denied => Some(ApprovalOutcome::Denied),
            pb::ApprovalOutcome::Expired => Some(ApprovalOutcome::Expired),
            pb::ApprovalOutcome::Unspecified => None,
        }
    }

    pub(crate) fn to_pb(self) -> pb::ApprovalOutcome {
        match self {
            ApprovalOutcome::Approved => pb::ApprovalOutcome::Approved,
            ApprovalOutcome::Denied => pb::ApprovalOutcome::Denied,
            ApprovalOutcome::Expired => pb::ApprovalOutcome::Expired,
        }
    }
}

/// How long to wait for a TCP connection before calling the server unreachable.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Session and approval ids travel in URL paths: the server's own rule and
/// its message (vak-proto's `ids`), checked before any request.
pub(crate) fn check_id(what: &str, id: &str) -> Result<(), Failure> {
    vak_proto::ids::validate_plain_id(what, id).map_err(|e| Failure::fatal(e.message))
}
