//! Every Prometheus metric vak records (`GET /metrics`): its name, help text and bounded labels in one place, and the handles the hot paths keep.
//!
//! The core records through the `metrics` facade only (transport-agnostic);
//! the edge installs the Prometheus recorder and renders the exposition.
//! Label values are closed sets (`as_str` of an enum, a built-in tool name,
//! `mcp`), never a session id or free text: a label that could grow without
//! bound would grow the exposition with it. The provider/model pair of the
//! token counter is the one label from configuration; it is capped at
//! `MAX_MODELS` pairs, later ones counted under `other`.

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit};
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

// Streams and the bus.
/// Gauge, labels `transport` (sse, grpc, grpc_web, websocket), `surface` (session, stream, presentation, other).
pub const STREAMS_OPEN: &str = "vak_streams_open";
/// Gauge: subscriptions attached to a session's bus.
pub const SUBSCRIBERS: &str = "vak_subscribers";
/// Counter: events made visible on a session's bus (once each, whatever the number of subscribers).
pub const EVENTS_PUBLISHED: &str = "vak_events_published_total";
/// Counter: frames handed to readers (counted per take, a merged frame once).
pub const EVENTS_DELIVERED: &str = "vak_events_delivered_total";
/// Counter: deltas merged into another frame in a full subscriber queue.
pub const MERGES: &str = "vak_merges_total";
/// Counter: subscriber queues dropped for lag (the reader resumes from its cursor).
pub const LAGS: &str = "vak_lags_total";
/// Counter, label `reason` (cursor_ahead, cursor_too_old, history_lost, history_unavailable).
pub const RESYNCS: &str = "vak_resyncs_total";
/// Counter: subscriptions that started replaying from the ledger on disk.
pub const REPLAYS_FROM_DISK: &str = "vak_replays_from_disk_total";

// The ledger.
/// Histogram: one group-commit append (encode and write; with fsync durability, the sync too).
pub const LEDGER_APPEND_SECONDS: &str = "vak_ledger_append_seconds";
/// Counter: bytes appended to session ledgers.
pub const LEDGER_APPEND_BYTES: &str = "vak_ledger_append_bytes_total";
/// Histogram: records in one group-commit batch.
pub const LEDGER_BATCH_RECORDS: &str = "vak_ledger_batch_records";
/// Histogram: one append to the JetStream session log (`--bus`).
pub const JETSTREAM_APPEND_SECONDS: &str = "vak_jetstream_append_seconds";

// Runs, tools and the model.
/// Counter, label `outcome` (completed, failed, cancelled, max_turns).
pub const RUNS: &str = "vak_runs_total";
/// Histogram, label `outcome`: from a run's start to its run_finished.
pub const RUN_DURATION_SECONDS: &str = "vak_run_duration_seconds";
/// Counter, labels `tool` (a built-in name, `mcp`, or `unknown`) and `outcome` (ok, error).
pub const TOOL_CALLS: &str = "vak_tool_calls_total";
/// Histogram, labels `provider` (offline, openai, anthropic) and `outcome` (ok, error, cancelled).
pub const PROVIDER_REQUEST_SECONDS: &str = "vak_provider_request_seconds";
/// Counter, labels `provider` and `reason` (a failure kind: rate_limit, overloaded, network, …).
pub const PROVIDER_RETRIES: &str = "vak_provider_retries_total";
/// Counter, labels `provider`, `model` and `direction` (input, output, cache_read, cache_write).
pub const TOKENS: &str = "vak_tokens_total";
/// Counter, label `outcome` (approved, denied, expired).
pub const APPROVALS: &str = "vak_approvals_total";

// Connections.
/// Counter: connections accepted by the listener.
pub const CONNECTIONS: &str = "vak_connections_total";
/// Gauge: connections open now.
pub const CONNECTIONS_OPEN: &str = "vak_connections_open";
/// Counter, label `cause` (connection_cap, stream_cap, auth, host, origin).
pub const REJECTIONS: &str = "vak_rejections_total";

/// Distinct provider/model pairs the token counter names; later ones are `other`.
pub const MAX_MODELS: usize = 32;

/// The buckets of the latency histograms (seconds): 100 µs to 2 min.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0,
];

/// The buckets of run durations (seconds): 10 ms to an hour.
pub const RUN_SECONDS_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// The buckets of the group-commit batch size (records).
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// Registers every metric's help text and unit with the installed recorder.
pub fn describe() {
    describe_gauge!(STREAMS_OPEN, "Streams open now, by transport and surface.");
    describe_gauge!(SUBSCRIBERS, "Subscriptions attached to session buses.");
    describe_counter!(EVENTS_PUBLISHED, "Events made visible on session buses.");
    describe_counter!(EVENTS_DELIVERED, "Frames handed to stream readers.");
    describe_counter!(
        MERGES,
        "Deltas merged into another frame in a full subscriber queue."
    );
    describe_counter!(
        LAGS,
        "Subscriber queues dropped for lag; their readers resume from their cursor."
    );
    describe_counter!(RESYNCS, "Resyncs handed to readers, by reason.");
    describe_counter!(
        REPLAYS_FROM_DISK,
        "Subscriptions that replayed from the ledger on disk."
    );
    describe_histogram!(
        LEDGER_APPEND_SECONDS,
        Unit::Seconds,
        "Duration of one ledger group-commit append."
    );
    describe_counter!(
        LEDGER_APPEND_BYTES,
        Unit::Bytes,
        "Bytes appended to session ledgers."
    );
    describe_histogram!(LEDGER_BATCH_RECORDS, "Records in one ledger group-commit batch.");
    describe_histogram!(
        JETSTREAM_APPEND_SECONDS,
        Unit::Seconds,
        "Duration of one JetStream session-log append."
    );
    describe_counter!(RUNS, "Runs finished, by outcome.");
    describe_histogram!(
        RUN_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of a run, by outcome."
    );
    describe_counter!(TOOL_CALLS, "Tool calls, by tool and outcome.");
    describe_histogram!(
        PROVIDER_REQUEST_SECONDS,
        Unit::Seconds,
        "Duration of one model-service request."
    );
    describe_counter!(
        PROVIDER_RETRIES,
        "Model-service requests retried, by provider and failure kind."
    );
    describe_counter!(TOKENS, "Model tokens, by provider, model and direction.");
    describe_counter!(APPROVALS, "Approval requests settled, by outcome.");
    describe_counter!(CONNECTIONS, "Connections accepted.");
    describe_gauge!(CONNECTIONS_OPEN, "Connections open now.");
    describe_counter!(REJECTIONS, "Connections and requests refused, by cause.");
}

/// The handles of the per-event paths: registered once (the first use after
/// the recorder is installed), then an atomic add each.
pub(crate) struct Hot {
    pub(crate) published: Counter,
    pub(crate) delivered: Counter,
    pub(crate) merges: Counter,
    pub(crate) lags: Counter,
    pub(crate) subscribers: Gauge,
    pub(crate) replays_from_disk: Counter,
    pub(crate) ledger_bytes: Counter,
    pub(crate) ledger_seconds: Histogram,
    pub(crate) batch_records: Histogram,
}

pub(crate) fn hot() -> &'static Hot {
    static HOT: OnceLock<Hot> = OnceLock::new();
    HOT.get_or_init(|| Hot {
        published: metrics::counter!(EVENTS_PUBLISHED),
        delivered: metrics::counter!(EVENTS_DELIVERED),
        merges: metrics::counter!(MERGES),
        lags: metrics::counter!(LAGS),
        subscribers: metrics::gauge!(SUBSCRIBERS),
        replays_from_disk: metrics::counter!(REPLAYS_FROM_DISK),
        ledger_bytes: metrics::counter!(LEDGER_APPEND_BYTES),
        ledger_seconds: metrics::histogram!(LEDGER_APPEND_SECONDS),
        batch_records: metrics::histogram!(LEDGER_BATCH_RECORDS),
    })
}

/// The `model` label for `provider`/`model`: the model itself for the first
/// `MAX_MODELS` pairs seen, `other` after them.
pub(crate) fn model_label(provider: &str, model: &str) -> String {
    static SEEN: OnceLock<Mutex<HashSet<(String, String)>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let key = (provider.to_string(), model.to_string());
    if seen.contains(&key) {
        return key.1;
    }
    if seen.len() < MAX_MODELS {
        seen.insert(key.clone());
        return key.1;
    }
    "other".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_label_is_bounded() {
        let mut labels = HashSet::new();
        for i in 0..(MAX_MODELS * 3) {
            labels.insert(model_label("bounded-test", &format!("m{i}")));
        }
        // Other tests may have taken some of the pairs first.
        assert!(labels.len() <= MAX_MODELS + 1, "{}", labels.len());
        assert!(labels.contains("other"));
    }

    #[test]
    fn every_name_follows_the_conventions() {
        for name in [
            STREAMS_OPEN,
            SUBSCRIBERS,
            EVENTS_PUBLISHED,
            EVENTS_DELIVERED,
            MERGES,
            LAGS,
            RESYNCS,
            REPLAYS_FROM_DISK,
            LEDGER_APPEND_SECONDS,
            LEDGER_APPEND_BYTES,
            LEDGER_BATCH_RECORDS,
            JETSTREAM_APPEND_SECONDS,
            RUNS,
            RUN_DURATION_SECONDS,
            TOOL_CALLS,
            PROVIDER_REQUEST_SECONDS,
            PROVIDER_RETRIES,
            TOKENS,
            APPROVALS,
            CONNECTIONS,
            CONNECTIONS_OPEN,
            REJECTIONS,
        ] {
            assert!(name.starts_with("vak_"), "{name}");
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}"
            );
        }
    }
}
