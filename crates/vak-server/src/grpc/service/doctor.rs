//! GetDoctor: the core's checks, plus the one only the edge can make (open files against its caps), converted to the wire.

use super::AgentApi;
use crate::errors::to_status;
use tonic::Status;
use vak_core::host::doctor::{self, Check, CheckStatus};
use vak_proto::v1 as pb;

/// Open files past this share of the limit are a warning, past `FAIL_SHARE` a failure.
const WARN_SHARE: f64 = 0.8;
const FAIL_SHARE: f64 = 0.95;

impl AgentApi {
    pub(super) async fn doctor(&self, req: pb::GetDoctorRequest) -> Result<pb::DoctorReport, Status> {
        let report = doctor::run(self.hub(), req.session.as_deref())
            .await
            .map_err(to_status)?;
        let limit = crate::fdlimit::nofile().map_or(0, |(soft, _)| soft);
        let open = tokio::task::spawn_blocking(open_files)
            .await
            .unwrap_or(None)
            .unwrap_or(0);
        let (max_streams, _) = self.limits.caps();
        let max_connections = self.host().max_connections as u64;
        let mut checks = report.checks;
        checks.push(open_files_check(open, limit, max_connections));
        let f = report.facts;
        Ok(pb::DoctorReport {
            checks: checks.into_iter().map(check).collect(),
            facts: Some(pb::DoctorFacts {
                version: env!("CARGO_PKG_VERSION").to_string(),
                home: f.home,
                workspace: f.workspace,
                home_free_bytes: f.home_free_bytes,
                provider: f.provider,
                model: f.model,
                open_files_limit: limit,
                open_files: open,
                max_connections,
                max_streams: max_streams as u64,
                ledger_seq: f.ledger_seq,
                ledger_snapshot_seq: f.ledger_snapshot_seq,
            }),
        })
    }
}

/// The descriptors this process has open now (Linux: /proc/self/fd).
fn open_files() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// Open files against the limit, and the connection cap against what the limit leaves.
fn open_files_check(open: u64, limit: u64, max_connections: u64) -> Check {
    if limit == 0 {
        return Check::new("open_files", CheckStatus::Warn, "the open-files limit is unknown");
    }
    let share = open as f64 / limit as f64;
    let said = format!("{open} of {limit} files open; at most {max_connections} connections");
    if share >= FAIL_SHARE {
        Check::new(
            "open_files",
            CheckStatus::Fail,
            format!("{said}: new connections and ledgers will fail to open"),
        )
    } else if share >= WARN_SHARE || max_connections > limit {
        Check::new(
            "open_files",
            CheckStatus::Warn,
            format!("{said}: little headroom (raise `ulimit -n` or lower --max-connections)"),
        )
    } else {
        Check::new("open_files", CheckStatus::Ok, said)
    }
}

fn check(c: Check) -> pb::DoctorCheck {
    pb::DoctorCheck {
        name: c.name,
        status: match c.status {
            CheckStatus::Ok => pb::CheckStatus::Ok,
            CheckStatus::Warn => pb::CheckStatus::Warn,
            CheckStatus::Fail => pb::CheckStatus::Fail,
        } as i32,
        detail: c.detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_files_near_the_limit_warn_then_fail() {
        assert_eq!(open_files_check(10, 1024, 768).status, CheckStatus::Ok);
        assert_eq!(open_files_check(900, 1024, 768).status, CheckStatus::Warn);
        assert_eq!(
            open_files_check(10, 1024, 4096).status,
            CheckStatus::Warn,
            "a cap past the limit"
        );
        assert_eq!(open_files_check(1000, 1024, 768).status, CheckStatus::Fail);
    }

    #[test]
    fn every_status_maps_to_the_proto_value_of_its_json_name() {
        for s in [CheckStatus::Ok, CheckStatus::Warn, CheckStatus::Fail] {
            let wire = pb::CheckStatus::try_from(check(Check::new("x", s, "")).status).unwrap();
            assert_eq!(wire.json_name(), s.as_str());
        }
    }
}
