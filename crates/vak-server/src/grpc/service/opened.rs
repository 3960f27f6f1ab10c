//! A session subscription opened for one client: what Subscribe streams as
//! messages and SSE as pre-encoded frames, with what holds its slot.

use super::{client_id, surface, AgentApi};
use crate::limits::StreamPermit;
use tonic::{Request, Status};
use vak_core::session::live::PresenceGuard;
use vak_core::stream::subscription::Subscription;
use vak_proto::v1 as pb;

/// A subscription opened for one client, with what holds its stream slot and
/// its place in the session's coworking list for as long as it lives.
pub struct Opened {
    pub session_id: String,
    pub latest_seq: u64,
    /// The cursor the client resumed from (None: live only).
    pub after: Option<u64>,
    pub subscription: Subscription,
    pub hold: (PresenceGuard, StreamPermit),
}

impl AgentApi {
    /// Opens a session subscription: what Subscribe streams as messages and
    /// SSE streams as pre-encoded frames.
    pub async fn open_subscription(&self, req: Request<pb::SubscribeRequest>) -> Result<Opened, Status> {
        let surface = surface(&req);
        let permit = self.permit(&req, crate::metrics::StreamSurface::Session)?;
        let r = req.into_inner();
        let s = self.session(&r.session_id).await?;
        let presence = s.join(&client_id(), surface);
        let subscription = s.subscribe(r.after);
        Ok(Opened {
            session_id: s.id().to_string(),
            latest_seq: subscription.latest_seq(),
            after: r.after,
            subscription,
            hold: (presence, permit),
        })
    }
}
