//! GetDigest: the usage digest from the cost ledger, and its conversion to the wire.

use super::AgentApi;
use crate::errors::to_status;
use std::collections::{BTreeMap, HashMap};
use tonic::Status;
use vak_core::finops::{DayView, DigestView, UsageSum};
use vak_proto::v1 as pb;

/// The window when a request names none.
const DEFAULT_DAYS: u32 = 7;

impl AgentApi {
    pub(super) async fn digest(&self, req: pb::GetDigestRequest) -> Result<pb::Digest, Status> {
        let days = req.days.unwrap_or(DEFAULT_DAYS);
        let view = self.control().digest(days).await.map_err(to_status)?;
        Ok(digest(view))
    }
}

fn digest(v: DigestView) -> pb::Digest {
    pb::Digest {
        days: v.days.into_iter().map(day).collect(),
        total: Some(usage(v.total)),
        memory_notes_added: v.memory_notes_added,
        tasks_fired: v.tasks_fired,
        unpriced: v.unpriced,
        max_day_usd: v.max_day_usd,
        today_usd: v.today_usd,
        timezone: v.timezone,
    }
}

fn day(d: DayView) -> pb::DigestDay {
    pb::DigestDay {
        date: d.date,
        usd: d.usage.usd,
        input_tokens: d.usage.input_tokens,
        output_tokens: d.usage.output_tokens,
        runs: d.runs,
        by_model: map(d.by_model),
        by_session: map(d.by_session),
    }
}

fn map(m: BTreeMap<String, UsageSum>) -> HashMap<String, pb::DigestUsage> {
    m.into_iter().map(|(k, u)| (k, usage(u))).collect()
}

fn usage(u: UsageSum) -> pb::DigestUsage {
    pb::DigestUsage {
        usd: u.usd,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        calls: u.calls,
    }
}
