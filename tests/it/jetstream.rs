//! The JetStream log (`crates/vak-core/src/cluster/jetstream.rs`) against a real 3-node nats-server cluster on loopback: exact reads, one writer per session, reopening, a killed stream leader, idempotent retries.

use crate::support;
use crate::support::nats::{stream_leader, Cluster};
use crate::support::{assert_numbered, text_of, TestServer, DEADLINE};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vak::core::cluster::jetstream::{self, JetStreamLog, StreamOptions, ANOTHER_WRITER};
use vak::core::event::{ClientEvent, Frame};
use vak::core::log::ledger::{Batch, Log, Record};
use vak::edge::server::ServeConfig;

fn event(seq: u64) -> ClientEvent {
    ClientEvent::TextDelta {
        text: format!("t{seq} "),
    }
}

/// A batch of the events `seqs`, with a note after each tenth.
fn batch(seqs: std::ops::RangeInclusive<u64>) -> Batch {
    let mut b = Batch::default();
    for seq in seqs {
        b.push_frame(&Frame::new(seq, "s".into(), event(seq)));
        if seq % 10 == 0 {
            b.push(&Record::Admitted {
                request_id: format!("r{seq}"),
            });
        }
    }
    b
}

/// Appends on a blocking thread, as the session's writer does.
async fn append(log: &Arc<JetStreamLog>, seqs: std::ops::RangeInclusive<u64>) -> std::io::Result<()> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || log.append(&batch(seqs)))
        .await
        .unwrap()
}

/// Appends a batch of one note (an admitted request id).
async fn append_note(log: &Arc<JetStreamLog>, request_id: &str) -> std::io::Result<()> {
    let (log, request_id) = (log.clone(), request_id.to_string());
    tokio::task::spawn_blocking(move || {
        let mut b = Batch::default();
        b.push(&Record::Admitted { request_id });
        log.append(&b)
    })
    .await
    .unwrap()
}

async fn read(log: &Arc<JetStreamLog>, after: u64, max: usize) -> Vec<(u64, ClientEvent)> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || log.read_events(after, max))
        .await
        .unwrap()
        .unwrap()
}

/// Every event after 0, read in chunks as replay does.
async fn read_all(log: &Arc<JetStreamLog>) -> Vec<(u64, ClientEvent)> {
    let mut out = Vec::new();
    loop {
        let chunk = read(log, out.last().map_or(0, |e: &(u64, ClientEvent)| e.0), 512).await;
        if chunk.is_empty() {
            return out;
        }
        out.extend(chunk);
    }
}

/// A log of `session` opened afresh (as another process would) holds exactly events 1..=n.
async fn assert_reopened_holds(client: &async_nats::Client, session: &str, n: u64) {
    let reader = open(client, session).await;
    assert_eq!(reader.durable_seq(), n);
    assert_eq!(read_all(&reader).await, expected(1..=n));
}

fn expected(seqs: std::ops::RangeInclusive<u64>) -> Vec<(u64, ClientEvent)> {
    seqs.map(|s| (s, event(s))).collect()
}

async fn connect(url: &str) -> async_nats::Client {
    let servers: Vec<async_nats::ServerAddr> = url.split(',').map(|u| u.parse().unwrap()).collect();
    tokio::time::timeout(DEADLINE, async_nats::connect(servers))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// The cluster, a client of all its nodes, and the R3 stream.
async fn cluster() -> (Cluster, async_nats::Client) {
    let cluster = Cluster::three().await;
    let client = connect(&cluster.url()).await;
    let opts = StreamOptions {
        replicas: 3,
        ..Default::default()
    };
    jetstream::ensure_stream(&client, &opts).await.unwrap();
    (cluster, client)
}

async fn open(client: &async_nats::Client, session: &str) -> Arc<JetStreamLog> {
    Arc::new(
        tokio::time::timeout(DEADLINE, JetStreamLog::open(client.clone(), session))
            .await
            .expect("open in time")
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appended_events_read_back_exactly_with_their_seqs() {
    let (_cluster, client) = cluster().await;
    let log = open(&client, "a1").await;
    assert_eq!(log.durable_seq(), 0);
    append(&log, 1..=1).await.unwrap();
    append(&log, 2..=40).await.unwrap();
    append(&log, 41..=1300).await.unwrap();
    assert_eq!(log.durable_seq(), 1300);
    assert_eq!(read_all(&log).await, expected(1..=1300));
    // Each append went as one message, a pack of its records (docs/scale-out.md,
    // "Messages"), and every record reads back at a position of its own.
    assert_eq!(log.head().await.unwrap(), 3);
    let stored = log.stored_after(0).await.unwrap();
    assert_eq!(stored.len(), 1300 + 130, "every event and note");
    assert!(stored
        .windows(2)
        .all(|w| w[0].position.followed_by(w[1].position)));
    for after in [0, 1, 9, 10, 39, 40, 41, 700, 1299] {
        assert_eq!(
            read(&log, after, 25).await,
            expected(after + 1..=(after + 25).min(1300)),
            "after {after}"
        );
    }
    // Ranges from anywhere, bounded.
    assert_eq!(read(&log, 511, 3).await, expected(512..=514));
    assert_eq!(read(&log, 1299, 10).await, expected(1300..=1300));
    assert!(read(&log, 1300, 10).await.is_empty());
    // Another session's events are not in this one's log.
    let other = open(&client, "a2").await;
    append(&other, 1..=5).await.unwrap();
    assert_eq!(read_all(&other).await, expected(1..=5));
    assert_eq!(read(&log, 1295, 100).await, expected(1296..=1300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_fences_the_first_and_nothing_it_tried_is_readable() {
    let (_cluster, client) = cluster().await;
    let first = open(&client, "w1").await;
    append(&first, 1..=3).await.unwrap();

    // A new owner (another replica) opens the same session and appends.
    let other = connect(&_cluster.url()).await;
    let second = open(&other, "w1").await;
    assert_eq!(second.durable_seq(), 3);
    append(&second, 4..=6).await.unwrap();

    // The old owner's next append is refused: the same seqs (so the same
    // Nats-Msg-Ids, a duplicate in the window) and then new ones.
    let err = append(&first, 4..=5).await.unwrap_err();
    assert!(err.to_string().contains(ANOTHER_WRITER), "{err}");
    assert!(first.fenced());
    let err = append(&first, 7..=7).await.unwrap_err();
    assert!(
        err.to_string().contains(ANOTHER_WRITER),
        "every later append fails: {err}"
    );

    // A one-message append (no atomic batch) is fenced the same way.
    let third = open(&other, "w1").await;
    append(&third, 7..=7).await.unwrap();
    let err = append(&second, 7..=7).await.unwrap_err();
    assert!(err.to_string().contains(ANOTHER_WRITER), "{err}");

    // Only the winners' events are there.
    assert_reopened_holds(&client, "w1", 7).await;
}

/// A replica takes a session over while the old holder's append is still
/// being retried (a NATS election): the retry lands after the new holder
/// opened the log. The new holder's first append (its lease note,
/// `take_over`) goes after it instead of being fenced, and from then on the
/// old holder is fenced and the new one goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_holders_append_retried_across_a_takeover_never_fences_the_new_holder() {
    let (cluster, client) = cluster().await;
    let old = open(&client, "t1").await;
    append(&old, 1..=3).await.unwrap();
    let other = connect(&cluster.url()).await;
    let new = open(&other, "t1").await;
    assert_eq!(new.durable_seq(), 3);
    // The old holder's retried append lands after the takeover began.
    append(&old, 4..=5).await.unwrap();
    let taken = new.clone();
    tokio::task::spawn_blocking(move || {
        let mut note = Batch::default();
        note.push(&Record::Lease {
            replica: "rb".into(),
            revision: 7,
        });
        taken.take_over(&note)
    })
    .await
    .unwrap()
    .expect("the new holder is not fenced by the old one's late append");
    assert!(!new.fenced());
    assert_eq!(new.durable_seq(), 5, "it numbers on after what landed");
    append(&new, 6..=7).await.unwrap();
    let err = append(&old, 6..=6).await.unwrap_err();
    assert!(err.to_string().contains(ANOTHER_WRITER), "{err}");
    assert_reopened_holds(&client, "t1", 7).await;
}

/// A log whose replica lost the session's lease (`stop`) gives up an
/// append it is retrying through an unavailable NATS at once, instead of
/// after `RETRY_FOR`: nothing of an old holder lands later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_log_gives_up_an_append_retrying_through_an_outage_at_once() {
    let mut server = Cluster::single().await;
    let client = connect(&server.url()).await;
    jetstream::ensure_stream(&client, &StreamOptions::default())
        .await
        .unwrap();
    let log = open(&client, "s1").await;
    append(&log, 1..=1).await.unwrap();
    server.kill(0);
    let retrying = log.clone();
    let started = Instant::now();
    let stalled = tokio::spawn(async move { append(&retrying, 2..=2).await });
    log.stop();
    let err = tokio::time::timeout(Duration::from_secs(5), stalled)
        .await
        .expect("the append gives up well before RETRY_FOR")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains(jetstream::LEASE_STOPPED), "{err}");
    assert!(started.elapsed() < jetstream::RETRY_FOR);
    let err = append(&log, 2..=2).await.unwrap_err();
    assert!(err.to_string().contains(jetstream::LEASE_STOPPED), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_log_finds_its_durable_seq_and_history_and_goes_on() {
    let (cluster, client) = cluster().await;
    let log = open(&client, "r1").await;
    append(&log, 1..=30).await.unwrap();
    // Notes after the last event: the reopened log goes on counting them.
    append_note(&log, "late").await.unwrap();
    drop(log);
    drop(client);

    // A new process: a new connection, a new log.
    let client = connect(&cluster.node_url(2)).await;
    let log = open(&client, "r1").await;
    assert_eq!(log.durable_seq(), 30);
    assert_eq!(read_all(&log).await, expected(1..=30));
    append_note(&log, "later")
        .await
        .expect("a note after the reopen has an id of its own (r1:30.2), not a duplicate");
    append(&log, 31..=35).await.unwrap();
    assert_eq!(read_all(&log).await, expected(1..=35));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_append_whose_ack_was_lost_is_stored_once() {
    let (_cluster, client) = cluster().await;
    let log = open(&client, "d1").await;
    append(&log, 1..=5).await.unwrap();
    // One record, a pack of records, then an atomic batch (a record in
    // parts between two packs): each retried as if its ack was lost.
    append(&log, 6..=6).await.unwrap();
    log.forget_last_ack();
    append(&log, 6..=6)
        .await
        .expect("the retry finds its own message");
    append(&log, 7..=20).await.unwrap();
    log.forget_last_ack();
    append(&log, 7..=20).await.expect("the retry finds its own pack");
    let with_parts = || {
        let log = log.clone();
        tokio::task::spawn_blocking(move || {
            let mut b = batch(21..=25);
            b.push(&Record::Admitted {
                request_id: "x".repeat(2_500_000),
            });
            b.push_frame(&Frame::new(26, "s".into(), event(26)));
            log.append(&b)
        })
    };
    with_parts().await.unwrap().unwrap();
    log.forget_last_ack();
    with_parts()
        .await
        .unwrap()
        .expect("the retry finds its own atomic batch");
    assert!(!log.fenced());
    append(&log, 27..=28).await.unwrap();
    assert_eq!(read_all(&log).await, expected(1..=28));
    let stored = open(&client, "d1").await.stored_after(0).await.unwrap();
    let big = stored
        .iter()
        .filter(|s| matches!(&s.record, Record::Admitted { request_id } if request_id.len() == 2_500_000))
        .count();
    assert_eq!(big, 1, "the large record once, whole");
    assert!(stored
        .windows(2)
        .all(|w| w[0].position.followed_by(w[1].position)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_stall_while_the_stream_leader_is_killed_then_resume_with_no_seq_lost_or_repeated() {
    let (mut cluster, client) = cluster().await;
    let log = open(&client, "k1").await;
    append(&log, 1..=50).await.unwrap();
    let leader = stream_leader(&client, jetstream::STREAM).await;
    let victim = cluster.index_of(&leader).expect("the leader is one of ours");

    // A burst of appends on the writer's thread; the leader dies in the middle.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let writer = {
        let log = log.clone();
        tokio::task::spawn_blocking(move || {
            let mut slowest = Duration::ZERO;
            for i in 0..200u64 {
                let from = 51 + i * 5;
                let t = Instant::now();
                log.append(&batch(from..=from + 4))?;
                slowest = slowest.max(t.elapsed());
                let _ = tx.send(i);
            }
            Ok::<_, std::io::Error>(slowest)
        })
    };
    while let Some(i) = rx.recv().await {
        if i == 40 {
            cluster.kill(victim);
            break;
        }
    }
    let slowest = tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("the burst finishes once a new leader is elected")
        .unwrap()
        .unwrap_or_else(|e| panic!("an append failed: {e}\n{}", cluster.logs()));
    eprintln!("slowest append across the failover: {slowest:?} (leader {leader} killed)");
    assert_eq!(log.durable_seq(), 1050);
    assert_ne!(stream_leader(&client, jetstream::STREAM).await, leader);
    assert_eq!(read_all(&log).await, expected(1..=1050));
    // A reader on a surviving node sees the same.
    let survivor = (0..3).find(|&i| i != victim).unwrap();
    assert_reopened_holds(&connect(&cluster.node_url(survivor)).await, "k1", 1050).await;
}

/// What an append costs on the R3 cluster: one event per append, and 50
/// events per append (one message, a pack, one CAS). Printed for docs/scale-out.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_one_round_trip() {
    let (_cluster, client) = cluster().await;
    let log = open(&client, "m1").await;
    let log2 = log.clone();
    let (single, batched) = tokio::task::spawn_blocking(move || {
        let n = 300u64;
        let t = Instant::now();
        for seq in 1..=n {
            log2.append(&batch(seq..=seq)).unwrap();
        }
        let single = t.elapsed();
        let t = Instant::now();
        for i in 0..n {
            let from = n + 1 + i * 50;
            log2.append(&batch(from..=from + 49)).unwrap();
        }
        (single, t.elapsed())
    })
    .await
    .unwrap();
    let per_single = single / 300;
    let per_batch = batched / 300;
    eprintln!(
        "R3 append: 1 event/append {per_single:?} per append ({:.0} events/s); \
         50 events/append {per_batch:?} per append ({:.0} events/s)",
        300.0 / single.as_secs_f64(),
        15000.0 / batched.as_secs_f64()
    );
    // One round trip per batch: a 50-event batch costs far less than 50 single appends.
    assert!(
        per_batch < per_single * 25,
        "a batch of 50 costs {per_batch:?}, a single append {per_single:?}"
    );
    assert_eq!(log.durable_seq(), 300 + 300 * 50);
}

/// Every frame of `sid` from seq 0 to the latest the stream announces.
async fn replay_from_zero(s: &TestServer, sid: &str) -> Vec<support::Frame> {
    let mut sse = s.events(sid, Some(0)).await;
    let latest = sse.opened.as_ref().unwrap().body()["latest_seq"]
        .as_u64()
        .unwrap();
    let mut out = Vec::new();
    while out.last().map_or(0, support::Frame::seq) < latest {
        out.push(sse.next().await.expect("a retained frame"));
    }
    out
}

/// `vak serve --bus`: sessions live in JetStream, so a server restarted on
/// an EMPTY home (another machine, say) with the same NATS serves the same
/// session, replays it from seq 0 (past its ring: from the stream) exactly,
/// and goes on numbering after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_on_an_empty_home_replays_the_session_from_the_bus() {
    let nats = Cluster::single().await;
    let bus = |client: async_nats::Client| {
        move |c: &mut ServeConfig| {
            c.core.nats = Some(client);
            c.core.bus.ring = 64;
        }
    };
    let client = jetstream::connect(&nats.url(), &StreamOptions::default())
        .await
        .unwrap();
    let s = TestServer::start_with(bus(client)).await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/burst 1500").await;
    let live = sse.until("run_finished").await;
    assert_numbered(&live);
    drop(sse);
    let before = replay_from_zero(&s, &sid).await;
    assert_eq!(before.last().unwrap().seq(), live.last().unwrap().seq());
    let home = s.home.clone();
    drop(s.stop().await);
    assert!(!home.exists(), "the first server's home is gone");

    let client = jetstream::connect(&nats.url(), &StreamOptions::default())
        .await
        .unwrap();
    let s = TestServer::start_with(bus(client)).await;
    let after = replay_from_zero(&s, &sid).await;
    let view = |frames: &[support::Frame]| {
        frames
            .iter()
            .map(|f| (f.id.clone(), f.event.clone(), f.data.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(view(&after), view(&before));
    // The session goes on from where it was.
    let mut sse = s.events(&sid, None).await;
    let (code, adm) = s.run(&sid, "again").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")));
    let more = sse.until("run_finished").await;
    assert_eq!(more[0].seq(), before.last().unwrap().seq() + 1);
    assert_numbered(&more);
    assert_eq!(text_of(&more), "echo: again");
    // A fork is a new subject with the same history.
    let (code, body) = s
        .post(&format!("/sessions/{sid}/fork"), serde_json::json!({}))
        .await;
    assert_eq!(code, 201, "{body}");
    let child = body["session"]["session_id"].as_str().unwrap();
    let copied = replay_from_zero(&s, child).await;
    assert_eq!(copied.last().unwrap().seq(), more.last().unwrap().seq());
    let all = replay_from_zero(&s, &sid).await;
    assert_eq!(all.last().unwrap().seq(), more.last().unwrap().seq());
    // A delete purges its subject: the session is gone from the stream.
    let (code, body) = s.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 404, "{body}");
}
