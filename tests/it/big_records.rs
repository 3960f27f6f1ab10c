//! Records larger than a NATS message over `--bus` (issue 26): a long burst (whose snapshot outgrows the server's `max_payload`) and a 5 MB tool output finish and read the same on another replica, on one nats-server and on a 3-node cluster; a record that cannot be stored at all fails the session at once, never retried.

use crate::support::nats::{Cluster, Replica};
use crate::support::{Frame, Sse, DEADLINE};
use serde_json::Value;
use std::time::{Duration, Instant};
use vak::core::cluster::jetstream::JetStreamLog;
use vak::core::log::ledger::Record;

/// A `/bash` whose output is 5 000 000 bytes of `a`.
const BASH_5MB: &str = "/bash head -c 5000000 /dev/zero | tr '\\0' a";
/// What a writer logs each time it retries an append (`jetstream.rs::store`).
const RETRY_LOG: &str = "appending again";

/// A replica on `bus` (of `nodes` nodes) with its own home and workspace, whose
/// tools run without asking.
async fn start(bus: &str, name: &str, nodes: &str) -> Replica {
    Replica::start(bus, name, nodes, |s| {
        s.args(["--permission-mode", "bypass", "--allow-bypass"])
    })
    .await
}

/// What a client makes of a run's frames: the text of its deltas, the
/// live output of its tool call, and every other numbered frame as it is
/// (deltas may reach two clients merged differently; nothing else may differ).
#[derive(Debug, PartialEq)]
struct Seen {
    text: String,
    tool_output: String,
    others: Vec<(Option<String>, String, Value)>,
}

fn seen(frames: &[Frame]) -> Seen {
    let concat = |kind: &str, field: &str| -> String {
        frames
            .iter()
            .filter(|f| f.event == kind)
            .map(|f| f.body()[field].as_str().unwrap().to_string())
            .collect()
    };
    Seen {
        text: concat("text_delta", "text"),
        tool_output: concat("tool_output", "text"),
        others: frames
            .iter()
            .filter(|f| f.id.is_some() && f.event != "text_delta" && f.event != "tool_output")
            .map(|f| (f.id.clone(), f.event.clone(), f.data.clone()))
            .collect(),
    }
}

/// Frames up to run_finished, failing with the replica's log if the session closes first.
async fn until_finished(sse: &mut Sse, r: &Replica) -> Vec<Frame> {
    let mut out = Vec::new();
    loop {
        let f = match tokio::time::timeout(Duration::from_secs(20), sse.next()).await {
            Ok(f) => f.expect("the stream goes on"),
            Err(_) => panic!("no frame in 20 s after {}\n{}", last_of(&out), tail(&r.vak.log())),
        };
        let (closed, done) = (f.event == "session_closed", f.event == "run_finished");
        out.push(f);
        assert!(
            !closed,
            "the session closed: {}\n{}",
            last_of(&out),
            tail(&r.vak.log())
        );
        if done {
            return out;
        }
    }
}

/// The last frame's id, kind and (for a failure message) no more of its data than fits a line.
fn last_of(frames: &[Frame]) -> String {
    frames.last().map_or("nothing".into(), |f| {
        let data = f.data.to_string();
        format!("{:?} {} {}", f.id, f.event, &data[..data.len().min(300)])
    })
}

fn tail(log: &str) -> &str {
    &log[log.len().saturating_sub(4000)..]
}

/// A session run on replica A (`/burst n` then a 5 MB `/bash`) is shown
/// exactly the same by replica B: its transcript and presentation timeline
/// (which B loads from the stream's last snapshot and what follows it), and
/// with `streams`, its events followed live and replayed from 0. The stream
/// holds a snapshot larger than the server's `max_payload`, and no append
/// was retried.
async fn the_same_on_another_replica(nats: &Cluster, nodes: &str, n: u64, streams: bool) {
    let a = start(&nats.url(), "ra", nodes).await;
    let b = start(&nats.url(), "rb", nodes).await;
    let sid = a.api.create_session().await;
    let mut on_a = a.api.events(&sid, None).await;
    let mut live_b = match streams {
        true => Some(b.api.events(&sid, None).await),
        false => None,
    };

    let (code, _) = a.api.run(&sid, &format!("/burst {n}\n{BASH_5MB}")).await;
    assert_eq!(code, 202);
    let frames_a = until_finished(&mut on_a, &a).await;
    assert_eq!(frames_a.last().unwrap().body()["outcome"], "completed");
    let on_a = seen(&frames_a);
    let burst: String = (0..n).map(|i| format!("t{i} ")).collect();
    assert!(on_a.text.starts_with(&burst), "the burst's {n} deltas, in order");
    assert_eq!(on_a.tool_output.len(), 5_000_000);
    assert!(on_a.tool_output.bytes().all(|c| c == b'a'));
    let result = on_a
        .others
        .iter()
        .find(|(_, kind, _)| kind == "tool_result")
        .expect("a tool_result");
    let output = result.2["tool_result"]["output"].as_str().unwrap();
    assert!(
        output.starts_with(&"a".repeat(1 << 20)),
        "the result keeps the first MiB"
    );

    // What a client reads of the session on B is what A shows.
    for path in ["transcript", "presentation"] {
        let path = format!("/sessions/{sid}/{path}");
        let (code, on_a) = a.api.get(&path).await;
        assert_eq!(code, 200);
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (code, on_b) = b.api.get(&path).await;
            if code == 200 && on_b == on_a {
                break;
            }
            // B may still be applying the end of the run.
            assert!(
                Instant::now() < deadline,
                "{path} on B differs from A's\n{}",
                tail(&b.vak.log())
            );
            tokio::task::yield_now().await;
        }
    }
    if let Some(live_b) = &mut live_b {
        let followed = until_finished(live_b, &b).await;
        assert!(seen(&followed) == on_a, "replica B followed live the same run");
        let mut replay_b = b.api.events(&sid, Some(0)).await;
        let replayed = until_finished(&mut replay_b, &b).await;
        assert!(seen(&replayed) == on_a, "replica B replays the same run from 0");
    }

    // The records over the server's limit are in the stream, read back whole.
    let client = async_nats::connect(nats.node_url(0)).await.unwrap();
    let limit = client.max_payload();
    let records = JetStreamLog::open(client, &sid)
        .await
        .unwrap()
        .records()
        .await
        .unwrap();
    let largest_snapshot = records
        .iter()
        .filter(|r| matches!(r, Record::Snapshot(_)))
        .map(|r| serde_json::to_vec(r).unwrap().len())
        .max()
        .expect("a snapshot was written");
    assert!(
        largest_snapshot > limit,
        "snapshot {largest_snapshot} > max_payload {limit}"
    );
    for r in [&a, &b] {
        assert!(!r.vak.log().contains(RETRY_LOG), "{}", tail(&r.vak.log()));
    }
}

/// The run on one nats-server with its default `max_payload` (1
/// MiB): a 300 000-delta burst (its snapshot is about 1.7 MB) and a 5 MB
/// tool output (its 1 MiB result with a note is over 1 MiB as a record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300000_delta_burst_and_a_5_mb_tool_output_read_the_same_on_another_replica() {
    // Two replicas, 300 000 deltas and 5 MB keep both cores busy: not beside the
    // 3-node run below (which holds `heavy` through its cluster) or another heavy test.
    let _heavy = crate::support::heavy().await;
    let nats = Cluster::single().await;
    the_same_on_another_replica(&nats, "1", 300_000, false).await;
}

/// A 3-node cluster whose servers allow 64 KiB messages (read from the
/// server, never assumed): the tool output's live pieces, its result and
/// the snapshot all go in parts, replicated R3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_with_a_64_kib_max_payload_large_records_read_the_same_on_another_replica() {
    let nats = Cluster::three_with_config("max_payload: 65536\n").await;
    the_same_on_another_replica(&nats, "3", 60_000, true).await;
}

/// With 2 KiB messages, a 1 MiB tool result would take more parts than an
/// atomic batch holds (1000): the session stops at once with a reason
/// naming the sizes, and the append is never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_cannot_be_stored_fails_the_session_at_once_and_is_never_retried() {
    let nats = Cluster::single_with_config("max_payload: 2048\n", async_nats::ConnectOptions::new).await;
    let a = start(&nats.url(), "ra", "1").await;
    let sid = a.api.create_session().await;
    let mut sse = a.api.events(&sid, None).await;
    let started = Instant::now();
    let (code, _) = a
        .api
        .run(&sid, "/bash head -c 1100000 /dev/zero | tr '\\0' a")
        .await;
    assert_eq!(code, 202);
    let closed = loop {
        let f = sse.next().await.expect("the stream goes on");
        if f.event == "session_closed" {
            break f;
        }
    };
    let took = started.elapsed();
    let reason = closed.body()["reason"].as_str().unwrap().to_string();
    assert!(
        reason.starts_with("storage_failed: ") && reason.contains("bytes") && reason.contains("max_payload"),
        "{reason}"
    );
    assert!(took < Duration::from_secs(10), "failed after {took:?}: {reason}");
    assert!(!a.vak.log().contains(RETRY_LOG), "{}", tail(&a.vak.log()));
}

/// A set of parts whose concatenation does not match its `Vak-Digest`
/// (written straight to the stream, as a damaged or forged subject would
/// hold it) is an error on every read path, never a partial or altered
/// record, and a replay fails at once rather than asking again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_that_do_not_match_their_digest_are_an_error_never_a_record() {
    use vak::core::cluster::jetstream::{self, StreamOptions};
    use vak::core::event::ClientEvent;
    use vak::core::log::ledger::Log;
    let nats = Cluster::single().await;
    let client = jetstream::connect(&nats.url(), &StreamOptions::default())
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let event = |seq: u64, text: &str| {
        serde_json::to_vec(&Record::Event {
            seq,
            event: ClientEvent::TextDelta { text: text.into() },
        })
        .unwrap()
    };
    let publish = |headers: Vec<(&'static str, String)>, payload: Vec<u8>| {
        let js = js.clone();
        async move {
            let mut h = async_nats::HeaderMap::new();
            for (k, v) in headers {
                h.insert(k, v.as_str());
            }
            js.publish_with_headers("vak.ev.broken", h, payload.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    publish(vec![("Vak-Seq", "1".into())], event(1, "whole")).await;
    let line = event(2, &"x".repeat(100));
    let other = "0".repeat(64);
    let (first, second) = line.split_at(60);
    for (i, piece) in [(1, first), (2, second)] {
        let headers = vec![
            ("Vak-Seq", "2".to_string()),
            ("Vak-Part", format!("{i}/2")),
            ("Vak-Digest", other.clone()),
        ];
        publish(headers, piece.to_vec()).await;
    }

    let log = std::sync::Arc::new(JetStreamLog::open(client, "broken").await.unwrap());
    let err = log.records().await.unwrap_err().to_string();
    assert!(err.contains("do not match their Vak-Digest"), "{err}");
    let started = Instant::now();
    let reader = log.clone();
    let read = tokio::task::spawn_blocking(move || reader.read_events(0, 10))
        .await
        .unwrap();
    let err = read.unwrap_err().to_string();
    assert!(err.contains("do not match their Vak-Digest"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
