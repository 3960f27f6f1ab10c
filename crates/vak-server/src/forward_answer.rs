//! The owner's side of forwarding (`forward.rs` is the asking side): answers the
//! requests other replicas forward to this one with the same `AgentApi` methods a
//! local client reaches, marked `Forwarded` so they are never forwarded again.

use crate::errors::{KIND_HEADER, REASON_HEADER};
use crate::forward::{Forwarded, Method, H_CODE, H_KIND, H_REASON, MAX_ANSWERING};
use crate::grpc::service::AgentApi;
use futures_util::StreamExt;
use pb::agent_service_server::AgentService;
use prost::Message;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};
use vak_core::cluster::owners::{Owners, RPC_PREFIX};
use vak_proto::v1 as pb;

/// Answers the forwarded requests addressed to this replica until `stop`.
pub(crate) async fn serve(api: AgentApi, owners: Arc<Owners>, stop: CancellationToken) {
    let client = owners.client().clone();
    let mut subs = Vec::new();
    for m in Method::ALL {
        match client
            .subscribe(format!("{RPC_PREFIX}{}.{}", owners.replica(), m.as_str()))
            .await
        {
            Ok(sub) => subs.push(sub),
            Err(e) => {
                tracing::error!("cannot answer forwarded {} requests: {e}", m.as_str());
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
            let name = msg.subject.rsplit('.').next().unwrap_or_default().to_string();
            let answer = match Method::from_name(&name) {
                Some(m) => answer(&api, m, msg.payload).await,
                None => Err(Status::unimplemented(format!("no forwarded method {name}"))),
            };
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
                tracing::warn!(method = %name, "cannot answer a forwarded request: {e}");
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

async fn answer(api: &AgentApi, method: Method, body: bytes::Bytes) -> Result<Vec<u8>, Status> {
    match method {
        Method::Run => dispatch(body, |r: Request<pb::RunRequest>| api.run(r)).await,
        Method::Steer => dispatch(body, |r: Request<pb::SteerRequest>| api.steer(r)).await,
        Method::Approve => dispatch(body, |r: Request<pb::ApproveRequest>| api.approve(r)).await,
        Method::Cancel => dispatch(body, |r: Request<pb::CancelRequest>| api.cancel(r)).await,
        Method::RenameSession => {
            dispatch(body, |r: Request<pb::RenameSessionRequest>| api.rename_session(r)).await
        }
        Method::DeleteSession => {
            dispatch(body, |r: Request<pb::DeleteSessionRequest>| api.delete_session(r)).await
        }
        Method::ClearSession => {
            dispatch(body, |r: Request<pb::ClearSessionRequest>| api.clear_session(r)).await
        }
        Method::UndoSession => dispatch(body, |r: Request<pb::UndoSessionRequest>| api.undo_session(r)).await,
        Method::CompactSession => {
            dispatch(body, |r: Request<pb::CompactSessionRequest>| {
                api.compact_session(r)
            })
            .await
        }
        Method::SideRun => dispatch(body, |r: Request<pb::SideRunRequest>| api.side_run(r)).await,
        Method::SideCancel => dispatch(body, |r: Request<pb::SideCancelRequest>| api.side_cancel(r)).await,
        Method::CloseCommitment => {
            dispatch(body, |r: Request<pb::CloseCommitmentRequest>| {
                api.close_commitment(r)
            })
            .await
        }
    }
}
