//! Changes on a replica that does not hold the session's lease (`--bus`): Run, Steer, Approve, Cancel, rename, clear, undo, compact and side chat go as their protobuf request over a NATS request to `vak.rpc.<owner>.<Method>`, and the owner answers with the same `AgentApi` method a local client would reach.
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

use crate::core::owners::{Owner, Owners, RPC_PREFIX};
use crate::edge::errors::{to_status, KIND_HEADER, REASON_HEADER};
use crate::edge::grpc::service::AgentApi;
use crate::error::Error;
use crate::proto::v1 as pb;
use futures_util::StreamExt;
use pb::agent_service_server::AgentService;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status};

/// The RPCs a replica forwards to a session's owner: every change to a
/// session that the owner's memory or its single writer must make.
pub const METHODS: [&str; 11] = [
    "Run",
    "Steer",
    "Approve",
    "Cancel",
    "RenameSession",
    "DeleteSession",
    "ClearSession",
    "UndoSession",
    "CompactSession",
    "SideRun",
    "SideCancel",
];
/// How long a forwarded request (that does not wait for its run) may take.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a forwarded compaction may take: the holder asks the model for
/// a summary, bounded by the provider's own timeouts.
pub const SLOW_FORWARD_TIMEOUT: Duration = Duration::from_secs(300);
/// Forwarded requests this replica answers at once; more wait in the
/// subscription (NATS bounds what it holds for a slow subscriber).
pub const MAX_ANSWERING: usize = 1024;

const H_CODE: &str = "Vak-Code";
const H_KIND: &str = "Vak-Error-Kind";
const H_REASON: &str = "Vak-Error-Reason";

/// Marks a request that arrived forwarded: it is served here or refused, never forwarded again.
#[derive(Clone, Copy, Debug)]
pub struct Forwarded;

/// Sends `req` to `owner`'s `method` and decodes its answer.
pub async fn call<Req: Message, Resp: Message + Default>(
    owners: &Owners,
    owner: &Owner,
    method: &str,
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
    let subject = format!("{RPC_PREFIX}{}.{method}", owner.replica);
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
            "replica {} answered {method} with an unreadable response: {e}",
            owner.replica
        ))
    })
}

/// Answers the forwarded requests addressed to this replica until `stop`.
pub async fn serve(api: AgentApi, owners: Arc<Owners>, stop: CancellationToken) {
    let client = owners.client().clone();
    let mut subs = Vec::new();
    for m in METHODS {
        match client
            .subscribe(format!("{RPC_PREFIX}{}.{m}", owners.replica()))
            .await
        {
            Ok(sub) => subs.push(sub),
            Err(e) => {
                tracing::error!("cannot answer forwarded {m} requests: {e}");
                return;
            }
        }
    }
    let mut all = futures_util::stream::select_all(subs);
    let answering = Arc::new(tokio::sync::Semaphore::new(MAX_ANSWERING));
    loop {
        let msg = tokio::select! {
            m = all.next() => m,
            _ = stop.cancelled() => None,
        };
        let Some(msg) = msg else { return };
        let Ok(permit) = answering.clone().acquire_owned().await else {
            return;
        };
        let (api, client) = (api.clone(), client.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let Some(reply) = msg.reply.clone() else { return };
            let method = msg.subject.rsplit('.').next().unwrap_or_default().to_string();
            let answer = answer(&api, &method, msg.payload).await;
            let sent = match answer {
                Ok(body) => client.publish(reply, body.into()).await,
                Err(status) => {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert(H_CODE, (status.code() as i32).to_string().as_str());
                    for (from, to) in [(KIND_HEADER, H_KIND), (REASON_HEADER, H_REASON)] {
                        if let Some(v) = status.metadata().get(from).and_then(|v| v.to_str().ok()) {
                            h.insert(to, v);
                        }
                    }
                    let message = bytes::Bytes::copy_from_slice(status.message().as_bytes());
                    client.publish_with_headers(reply, h, message).await
                }
            };
            if let Err(e) = sent {
                tracing::warn!(method, "cannot answer a forwarded request: {e}");
            }
        });
    }
}

/// Decodes `body` as `Req`, calls the method marked as forwarded, encodes its response.
async fn dispatch<Req, Resp, F, Fut>(body: bytes::Bytes, method: F) -> Result<Vec<u8>, Status>
where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let req = Req::decode(body)
        .map_err(|e| Status::invalid_argument(format!("an unreadable forwarded request: {e}")))?;
    let mut req = Request::new(req);
    req.extensions_mut().insert(Forwarded);
    Ok(method(req).await?.into_inner().encode_to_vec())
}

async fn answer(api: &AgentApi, method: &str, body: bytes::Bytes) -> Result<Vec<u8>, Status> {
    match method {
        "Run" => dispatch(body, |r: Request<pb::RunRequest>| api.run(r)).await,
        "Steer" => dispatch(body, |r: Request<pb::SteerRequest>| api.steer(r)).await,
        "Approve" => dispatch(body, |r: Request<pb::ApproveRequest>| api.approve(r)).await,
        "Cancel" => dispatch(body, |r: Request<pb::CancelRequest>| api.cancel(r)).await,
        "RenameSession" => dispatch(body, |r: Request<pb::RenameSessionRequest>| api.rename_session(r)).await,
        "DeleteSession" => dispatch(body, |r: Request<pb::DeleteSessionRequest>| api.delete_session(r)).await,
        "ClearSession" => dispatch(body, |r: Request<pb::ClearSessionRequest>| api.clear_session(r)).await,
        "UndoSession" => dispatch(body, |r: Request<pb::UndoSessionRequest>| api.undo_session(r)).await,
        "CompactSession" => {
            dispatch(body, |r: Request<pb::CompactSessionRequest>| {
                api.compact_session(r)
            })
            .await
        }
        "SideRun" => dispatch(body, |r: Request<pb::SideRunRequest>| api.side_run(r)).await,
        "SideCancel" => dispatch(body, |r: Request<pb::SideCancelRequest>| api.side_cancel(r)).await,
        other => Err(Status::unimplemented(format!("no forwarded method {other}"))),
    }
}
