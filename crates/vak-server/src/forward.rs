//! Changes on a replica that does not hold the session's lease (`--bus`): Run, Steer, Approve, Cancel, rename, clear, undo, compact and side chat go as their protobuf request over a NATS request to `vak.rpc.<owner>.<Method>`, and the owner answers with the same `AgentApi` method a local client would reach (`forward_answer.rs`).
//!
//! Why forward rather than move the lease: a session's run, its parked
//! approvals and its request ids live in the owner's memory; taking the
//! lease from a live owner would cancel its run. Forwarding keeps one
//! writer and one place where a request id is admitted, so the same
//! request_id sent to two replicas is `started` once and `duplicate` once,
//! and an approval answered anywhere resolves the call parked on the owner
//! exactly once. A forwarded request is never forwarded again (`Forwarded`):
//! an owner that lost the lease meanwhile answers UNAVAILABLE and the
//! client sends again (request ids make that safe).
//!
//! The reply is the RPC's protobuf response, or an error: headers
//! `Vak-Code` (the gRPC code), `Vak-Error-Kind` / `Vak-Error-Reason` (the
//! metadata `errors.rs` attaches) and the message as the payload.

use crate::errors::{to_status, KIND_HEADER, REASON_HEADER};
use prost::Message;
use std::time::Duration;
use tonic::{Code, Status};
use vak_core::cluster::owners::{Owner, Owners, RPC_PREFIX};
use vak_core::error::Error;

/// The RPCs a replica forwards to a session's owner: every change to a
/// session that the owner's memory or its single writer must make. Each is
/// the subject's last token (`vak.rpc.<owner>.<Method>`) under its proto name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Run,
    Steer,
    Approve,
    Cancel,
    RenameSession,
    DeleteSession,
    ClearSession,
    UndoSession,
    CompactSession,
    SideRun,
    SideCancel,
    CloseCommitment,
}

impl Method {
    pub(crate) const ALL: [Method; 12] = [
        Method::Run,
        Method::Steer,
        Method::Approve,
        Method::Cancel,
        Method::RenameSession,
        Method::DeleteSession,
        Method::ClearSession,
        Method::UndoSession,
        Method::CompactSession,
        Method::SideRun,
        Method::SideCancel,
        Method::CloseCommitment,
    ];

    /// The RPC's name in proto/ (and on the subject).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Method::Run => "Run",
            Method::Steer => "Steer",
            Method::Approve => "Approve",
            Method::Cancel => "Cancel",
            Method::RenameSession => "RenameSession",
            Method::DeleteSession => "DeleteSession",
            Method::ClearSession => "ClearSession",
            Method::UndoSession => "UndoSession",
            Method::CompactSession => "CompactSession",
            Method::SideRun => "SideRun",
            Method::SideCancel => "SideCancel",
            Method::CloseCommitment => "CloseCommitment",
        }
    }

    /// The method a subject's last token names, if it is one that is forwarded.
    pub(crate) fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

/// How long a forwarded request (that does not wait for its run) may take.
pub(crate) const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a forwarded compaction may take: the holder asks the model for
/// a summary, bounded by the provider's own timeouts.
pub(crate) const SLOW_FORWARD_TIMEOUT: Duration = Duration::from_secs(300);
/// Forwarded requests this replica answers at once; more wait in the
/// subscription (NATS bounds what it holds for a slow subscriber).
pub(crate) const MAX_ANSWERING: usize = 1024;

pub(crate) const H_CODE: &str = "Vak-Code";
pub(crate) const H_KIND: &str = "Vak-Error-Kind";
pub(crate) const H_REASON: &str = "Vak-Error-Reason";

/// Marks a request that arrived forwarded: it is served here or refused, never forwarded again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forwarded;

/// Sends `req` to `owner`'s `method` and decodes its answer.
pub(crate) async fn call<Req: Message, Resp: Message + Default>(
    owners: &Owners,
    owner: &Owner,
    method: Method,
    req: &Req,
    timeout: Duration,
) -> Result<Resp, Status> {
    let body = req.encode_to_vec();
    let max = owners.client().server_info().max_payload;
    if body.len() > max {
        return Err(to_status(Error::too_large(format!(
            "this request ({} bytes) is served by replica {}, and NATS carries at most {max} bytes to it",
            body.len(),
            owner.replica
        ))));
    }
    let subject = format!("{RPC_PREFIX}{}.{}", owner.replica, method.as_str());
    let asked = tokio::time::timeout(timeout, owners.client().request(subject, body.into())).await;
    let msg = match asked {
        Ok(Ok(msg)) => msg,
        Ok(Err(e)) => {
            return Err(Status::unavailable(format!(
                "replica {} serves this session and could not be asked ({e}); send the request again (the same request_id is safe)",
                owner.replica
            )))
        }
        Err(_) => {
            return Err(Status::unavailable(format!(
                "replica {} serves this session and did not answer in {timeout:?}; send the request again (the same request_id is safe)",
                owner.replica
            )))
        }
    };
    if let Some(code) = msg.headers.as_ref().and_then(|h| h.get(H_CODE)) {
        let code = Code::from_i32(code.as_str().parse().unwrap_or(Code::Unknown as i32));
        let message = String::from_utf8_lossy(&msg.payload).into_owned();
        let mut md = tonic::metadata::MetadataMap::new();
        let headers = msg.headers.as_ref().expect("checked above");
        for (from, to) in [(H_KIND, KIND_HEADER), (H_REASON, REASON_HEADER)] {
            if let Some(v) = headers.get(from).and_then(|v| v.as_str().parse().ok()) {
                md.insert(to, v);
            }
        }
        return Err(Status::with_metadata(code, message, md));
    }
    Resp::decode(msg.payload).map_err(|e| {
        Status::internal(format!(
            "replica {} answered {} with an unreadable response: {e}",
            owner.replica,
            method.as_str()
        ))
    })
}
