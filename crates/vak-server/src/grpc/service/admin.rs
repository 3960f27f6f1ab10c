//! What GetAdminStatus answers: streams and their clients, sessions and who is in them, recent errors, the scheduler and the day's spend.

use super::AgentApi;
use crate::grpc::convert;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn admin_status(&self) -> pb::AdminStatus {
        let tasks = self.hub.tasks();
        let scheduler = tasks
            .next_fires(50)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| {
                Some(pb::ScheduledFire {
                    next_fire: super::tasks::zoned(&v.next_fire?),
                    task_id: v.def.id,
                    name: v.def.name,
                })
            })
            .collect();
        let (max_streams, max_per_client) = self.limits.caps();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        pb::AdminStatus {
            open_streams: count(self.limits.open_streams()),
            max_streams: count(max_streams),
            max_streams_per_client: count(max_per_client),
            clients: self
                .limits
                .by_client()
                .into_iter()
                .map(|(client, n)| pb::ClientStreams {
                    client,
                    open_streams: count(n),
                })
                .collect(),
            sessions: self
                .sessions()
                .presence()
                .into_iter()
                .map(|(info, clients)| convert::presence(info, &clients))
                .collect(),
            streams: self.hub.streams().ids(),
            recent_errors: self
                .errors
                .list()
                .into_iter()
                .map(convert::recent_error)
                .collect(),
            scheduler,
            timezone: vak_core::zone::name(&tasks.timezone().await),
            today_usd: self.control().finops().today_usd(),
            max_day_usd: self.control().finops().max_day_usd(),
        }
    }
}
