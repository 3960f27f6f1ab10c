//! `/doctor`: the server's health as a list of checks a person can act on (the home, a session's ledger, the model service, MCP servers, the clock, the bus), each ok, warn or fail with what it saw.
//!
//! Every check is bounded: file reads stream, the model service gets one
//! cheap call (its models listing) with a short timeout, and nothing runs
//! under a lock. The edge adds what only it knows (open files against its
//! caps).

use crate::error::{Error, Result};
use crate::host::hub::Hub;
use crate::log::verify::{verify, LedgerCheck};
use crate::mcp::McpState;
use crate::provider::ProviderKind;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the model service may take to list its models.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(5);
/// Free space below this on the home's file system is a warning, and below
/// `FAIL_FREE_BYTES` a failure (ledgers stop being written when it runs out).
const WARN_FREE_BYTES: u64 = 1 << 30;
const FAIL_FREE_BYTES: u64 = 64 << 20;

/// How a check went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Ok => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
}

impl Check {
    pub fn new(name: impl Into<String>, status: CheckStatus, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }
}

/// What the core's checks measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub home: String,
    pub workspace: String,
    pub home_free_bytes: u64,
    pub provider: String,
    pub model: String,
    pub ledger_seq: Option<u64>,
    pub ledger_snapshot_seq: Option<u64>,
}

/// The core's report; the edge appends its own checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub checks: Vec<Check>,
    pub facts: Facts,
}

/// Runs every check (the ledger one only for `session`). An unknown session
/// is not found, a malformed id invalid; a failed check is a row.
pub async fn run(hub: &Hub, session: Option<&str>) -> Result<Report> {
    let cfg = hub.control().config().clone();
    let mut report = Report::default();
    report.facts.home = cfg.home.display().to_string();
    report.facts.workspace = cfg.workspace.display().to_string();
    if let Some(id) = session {
        crate::ids::validate_session_id(id)?;
        let path = cfg.sessions_dir().join(format!("{id}.jsonl"));
        if path.is_file() {
            let check = tokio::task::spawn_blocking(move || verify(&path))
                .await
                .map_err(|e| Error::internal(format!("the ledger check stopped: {e}")))?;
            let check = check.map_err(|e| Error::internal(format!("cannot read the ledger of {id}: {e}")))?;
            report.facts.ledger_seq = Some(check.last_seq);
            report.facts.ledger_snapshot_seq = Some(check.snapshot_seq);
            report.checks.push(ledger(id, &check));
        } else if hub.sessions().known(id) {
            report.checks.push(Check::new(
                "ledger",
                CheckStatus::Ok,
                format!("session {id} is kept in NATS JetStream (the bus check covers it)"),
            ));
        } else {
            return Err(Error::not_found(format!("no session {id}")));
        }
    }
    let home = cfg.home.clone();
    let (home_check, free) = tokio::task::spawn_blocking(move || home_writable(&home))
        .await
        .map_err(|e| Error::internal(format!("the home check stopped: {e}")))?;
    report.facts.home_free_bytes = free;
    report.checks.insert(0, home_check);
    let route = hub.control().workspace_runtime(None).await?.route();
    report.facts.provider = route.provider.name().to_string();
    report.facts.model = route.model.clone();
    report.checks.push(provider(&route).await);
    for server in hub.control().mcp().status() {
        let (status, detail) = match server.state {
            McpState::Ready => (CheckStatus::Ok, format!("ready, {} tools", server.tools.len())),
            McpState::Starting => (CheckStatus::Warn, "starting".to_string()),
            McpState::Disabled => (CheckStatus::Ok, "disabled".to_string()),
            McpState::Failed => (
                CheckStatus::Fail,
                format!(
                    "failed{}",
                    server.last_error.map(|e| format!(": {e}")).unwrap_or_default()
                ),
            ),
        };
        report
            .checks
            .push(Check::new(format!("mcp:{}", server.name), status, detail));
    }
    report.checks.push(clock(SystemTime::now()));
    if let Some(owners) = &cfg.owners {
        report.checks.push(bus(cfg.nats.as_ref(), owners.replica()));
    }
    Ok(report)
}

fn ledger(id: &str, c: &LedgerCheck) -> Check {
    let lines = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    if c.damaged() {
        let mut why = Vec::new();
        if c.no_header {
            why.push("no header on its first line".to_string());
        }
        if c.bad_count > 0 {
            why.push(format!(
                "{} lines that are not ledger records (line {})",
                c.bad_count,
                lines(&c.bad_lines)
            ));
        }
        for (expected, found) in &c.gaps {
            why.push(format!("seq {found} where {expected} was next"));
        }
        return Check::new(
            "ledger",
            CheckStatus::Fail,
            format!("session {id}'s ledger is damaged: {}", why.join("; ")),
        );
    }
    let snapshot = match c.snapshot_seq {
        0 => "no snapshot".to_string(),
        s => format!("last snapshot at seq {s}"),
    };
    if c.torn_tail {
        return Check::new(
            "ledger",
            CheckStatus::Warn,
            format!(
                "session {id}: {} lines read to seq {}, {snapshot}; its last line is incomplete (a write in progress, or cut by a crash: the next load repairs it)",
                c.lines, c.last_seq
            ),
        );
    }
    Check::new(
        "ledger",
        CheckStatus::Ok,
        format!(
            "session {id}: {} lines read to seq {} without a gap, {snapshot}",
            c.lines, c.last_seq
        ),
    )
}

/// Creates and removes a file in the home; returns the check and the free bytes.
fn home_writable(home: &Path) -> (Check, u64) {
    let probe = home.join(format!(".doctor-{}", std::process::id()));
    let written = std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe));
    let free = free_bytes(home).unwrap_or(0);
    let shown = human_bytes(free);
    let check = match written {
        Err(e) => Check::new(
            "home",
            CheckStatus::Fail,
            format!("cannot write in {}: {e}", home.display()),
        ),
        Ok(()) if free < FAIL_FREE_BYTES => Check::new(
            "home",
            CheckStatus::Fail,
            format!("{} is writable but only {shown} are free", home.display()),
        ),
        Ok(()) if free < WARN_FREE_BYTES => Check::new(
            "home",
            CheckStatus::Warn,
            format!("{} is writable; {shown} free", home.display()),
        ),
        Ok(()) => Check::new(
            "home",
            CheckStatus::Ok,
            format!("{} is writable; {shown} free", home.display()),
        ),
    };
    (check, free)
}

/// `12.3 GiB`, `512.0 MiB`, `900 bytes`.
fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.1} {unit}", n as f64 / size as f64);
        }
    }
    crate::text::count(n as usize, "byte")
}

fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statvfs the call fills in.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// One models listing through the live route (its key and base URL).
async fn provider(route: &crate::route::Route) -> Check {
    let name = route.provider.name();
    if name == ProviderKind::Offline.as_str() {
        return Check::new(
            "provider",
            CheckStatus::Ok,
            "the offline model (embedded: no service to reach)",
        );
    }
    // The host the provider's client calls (HOST:PORT, never a path or key).
    let at = route
        .provider
        .host()
        .map(|h| format!(" at {h}"))
        .unwrap_or_default();
    match tokio::time::timeout(PROVIDER_TIMEOUT, route.provider.list_models()).await {
        Ok(Ok(models)) => Check::new(
            "provider",
            CheckStatus::Ok,
            format!("{name}{at} answered with {} models", models.len()),
        ),
        Ok(Err(f)) => {
            tracing::warn!(kind = ?f.kind, error = %f.detail, "doctor: the model service failed");
            Check::new(
                "provider",
                CheckStatus::Fail,
                format!("{name}{at}: {}", f.kind.message()),
            )
        }
        Err(_) => Check::new(
            "provider",
            CheckStatus::Fail,
            format!("{name}{at} did not answer within {}s", PROVIDER_TIMEOUT.as_secs()),
        ),
    }
}

/// The wall clock is after this build was written and before 2100.
fn clock(now: SystemTime) -> Check {
    // 2026-12-01T00:00:00Z: no clock that says earlier is right.
    const EARLIEST: u64 = 1_796_083_200;
    const LATEST: u64 = 4_102_444_800;
    match now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()) {
        Ok(s) if (EARLIEST..LATEST).contains(&s) => {
            Check::new("clock", CheckStatus::Ok, format!("unix time {s}"))
        }
        Ok(s) => Check::new(
            "clock",
            CheckStatus::Fail,
            format!("the clock says unix time {s}: timestamps, leases and schedules will be wrong"),
        ),
        Err(_) => Check::new("clock", CheckStatus::Fail, "the clock is before 1970"),
    }
}

fn bus(nats: Option<&async_nats::Client>, replica: &str) -> Check {
    match nats.map(async_nats::Client::connection_state) {
        Some(async_nats::connection::State::Connected) => Check::new(
            "bus",
            CheckStatus::Ok,
            format!("connected to NATS; replica {replica}"),
        ),
        Some(state) => Check::new(
            "bus",
            CheckStatus::Fail,
            format!("NATS is {state:?}: sessions this replica leases cannot be written; replica {replica}"),
        ),
        None => Check::new("bus", CheckStatus::Fail, "no NATS connection"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_before_this_build_or_far_ahead_fails() {
        let at = |s| UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(clock(at(1_800_000_000)).status, CheckStatus::Ok);
        assert_eq!(clock(at(1_000_000_000)).status, CheckStatus::Fail);
        assert_eq!(clock(at(5_000_000_000)).status, CheckStatus::Fail);
    }

    #[test]
    fn a_damaged_ledger_names_what_is_wrong() {
        let c = LedgerCheck {
            lines: 9,
            bad_count: 1,
            bad_lines: vec![4],
            gaps: vec![(3, 7)],
            ..LedgerCheck::default()
        };
        let check = ledger("s1", &c);
        assert_eq!(check.status, CheckStatus::Fail);
        assert!(
            check.detail.contains("line 4") && check.detail.contains("seq 7 where 3 was next"),
            "{}",
            check.detail
        );
    }
}
