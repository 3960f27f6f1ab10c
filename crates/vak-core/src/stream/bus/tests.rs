//! The bus's unit tests: ordering and replay, merging full queues, byte budgets, resumes and the flush window.

use super::*;
use crate::event::ClientEvent;
use crate::log::ledger::{Batch, Ledger};
use crate::stream::delivery::Delivery;
use crate::stream::sub_queue::MAX_MERGED;
use crate::stream::subscription::KEEP_SLOTS;
use crate::Durability;

/// What the session's writer does once an event is durable.
fn publish(b: &Bus, event: ClientEvent) -> u64 {
    let seq = b.latest_seq() + 1;
    b.commit(vec![Arc::new(Frame::new(seq, b.session_id().clone(), event))]);
    seq
}

fn bus(ring: usize, queue: usize) -> Bus {
    let cfg = BusConfig {
        ring,
        queue,
        max_queued_bytes: 1 << 20,
        ..BusConfig::default()
    };
    Bus::new("s".into(), cfg, None, 0, Vec::new())
}

fn text(t: &str) -> ClientEvent {
    ClientEvent::TextDelta { text: t.into() }
}

/// What `sub` delivers up to seq `upto` (the bus's latest when called),
/// with any resync on the way; stops early at the end. A deadline, not a
/// quiet gap, bounds a wait that would never finish.
async fn drain(sub: &mut Subscription, upto: u64) -> Vec<Delivery> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut out: Vec<Delivery> = Vec::new();
    let reached = |out: &[Delivery]| {
        upto == 0
            || out.iter().any(|d| match d {
                Delivery::Frame(f) => f.seq >= upto,
                Delivery::Resync { .. } => false,
                Delivery::End(_) => true,
            })
    };
    while !reached(&out) {
        let batch = tokio::time::timeout_at(deadline, sub.recv_many(64))
            .await
            .unwrap_or_else(|_| panic!("seq {upto} never came: {out:?}"));
        if batch.is_empty() {
            break;
        }
        out.extend(batch);
    }
    out
}

fn seqs(ds: &[Delivery]) -> Vec<u64> {
    ds.iter()
        .filter_map(|d| match d {
            Delivery::Frame(f) => Some(f.seq),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn seqs_are_gap_free_and_replay_follows_the_cursor() {
    let b = bus(8, 16);
    for i in 0..5 {
        assert_eq!(publish(&b, text(&i.to_string())), i + 1);
    }
    let mut sub = b.subscribe(Some(2));
    assert_eq!(sub.latest_seq(), 5);
    publish(&b, text("live"));
    assert_eq!(seqs(&drain(&mut sub, b.latest_seq()).await), vec![3, 4, 5, 6]);
    let mut live = b.subscribe(None);
    publish(&b, text("x"));
    assert_eq!(seqs(&drain(&mut live, b.latest_seq()).await), vec![7]);
}

#[tokio::test]
async fn a_cursor_older_than_the_ring_or_ahead_resyncs_then_replays_the_ring() {
    let b = bus(4, 16);
    for _ in 0..10 {
        publish(&b, text("x"));
    }
    for (after, reason) in [(2, "cursor_too_old"), (11, "cursor_ahead")] {
        let mut sub = b.subscribe(Some(after));
        let got = drain(&mut sub, b.latest_seq()).await;
        match &got[0] {
            Delivery::Resync {
                reason: r,
                latest_seq,
                lost: None,
            } => {
                assert_eq!((r.as_str(), *latest_seq), (reason, 10));
            }
            other => panic!("expected resync, got {other:?}"),
        }
        assert_eq!(seqs(&got), vec![7, 8, 9, 10]);
    }
    // The oldest cursor the ring can still serve exactly: 6 (next is 7).
    let mut sub = b.subscribe(Some(6));
    let got = drain(&mut sub, b.latest_seq()).await;
    assert!(matches!(got[0], Delivery::Frame(_)));
    assert_eq!(seqs(&got), vec![7, 8, 9, 10]);
}

#[tokio::test]
async fn a_full_queue_merges_deltas_losslessly() {
    let b = bus(4, 4);
    let mut sub = b.subscribe(Some(0));
    publish(&b, ClientEvent::status(true));
    let mut expected = String::new();
    for i in 0..1000 {
        let t = format!("t{i} ");
        expected.push_str(&t);
        publish(&b, text(&t));
    }
    publish(&b, ClientEvent::status(false));
    let got = drain(&mut sub, b.latest_seq()).await;
    assert!(got.len() <= 4, "queue stayed bounded: {}", got.len());
    let mut all = String::new();
    for d in &got {
        if let Delivery::Frame(f) = d {
            if let ClientEvent::TextDelta { text } = &f.event {
                all.push_str(text);
            }
        }
    }
    assert_eq!(all, expected);
    assert_eq!(
        *seqs(&got).last().unwrap(),
        1002,
        "the last frame carries the last seq"
    );
}

#[tokio::test]
async fn a_reader_whose_queue_filled_gets_the_deltas_it_takes_together_merged_and_a_replay_or_frame_by_frame_gets_every_frame(
) {
    // A queue of 8 frames: full, its reader is behind.
    let b = bus(64, 8);
    let mut live = b.subscribe(None);
    let mut exact = b.subscribe(None).frame_by_frame();
    // A queue that is not full hands every frame over as published.
    for t in ["x ", "y "] {
        publish(&b, text(t));
    }
    assert_eq!(seqs(&live.recv_many(16).await), vec![1, 2]);
    assert_eq!(seqs(&exact.recv_many(16).await), vec![1, 2]);
    for t in ["a ", "b ", "c "] {
        publish(&b, text(t));
    }
    publish(&b, ClientEvent::status(false));
    publish(&b, text("d "));
    publish(&b, ClientEvent::ThinkingDelta { text: "e ".into() });
    publish(&b, text("f "));
    publish(&b, text("g "));
    let got = live.recv_many(16).await;
    let shown: Vec<(u64, String)> = got
        .iter()
        .map(|d| match d {
            Delivery::Frame(f) => (f.seq, format!("{:?}", f.event)),
            other => panic!("{other:?}"),
        })
        .collect();
    let want = [
        (5, text("a b c ")),
        (6, ClientEvent::status(false)),
        (7, text("d ")),
        (8, ClientEvent::ThinkingDelta { text: "e ".into() }),
        (10, text("f g ")),
    ]
    .map(|(seq, e)| (seq, format!("{e:?}")));
    assert_eq!(
        shown, want,
        "one frame per run of same-kind deltas, carrying its last seq"
    );
    // The ring keeps every frame: a replay a client asks for is exact.
    let mut replay = b.subscribe(Some(0));
    assert_eq!(seqs(&replay.recv_many(16).await), (1..=10).collect::<Vec<_>>());
    // So does a subscription that asked for every frame (`/stream`'s).
    assert_eq!(seqs(&exact.recv_many(16).await), (3..=10).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_full_queue_merges_tool_output_per_call_and_stream_in_order() {
    use crate::event::OutputStream::{Stderr, Stdout};
    let b = bus(4, 4);
    let mut sub = b.subscribe(Some(0));
    let out = |call: &str, stream, text: String| ClientEvent::ToolOutput {
        call_id: call.into(),
        stream,
        text,
    };
    let runs = [
        ("c", Stdout, 400),
        ("c", Stderr, 300),
        ("c", Stdout, 200),
        ("d", Stdout, 100),
    ];
    let mut expected = Vec::new();
    for (call, stream, n) in runs {
        let mut all = String::new();
        for i in 0..n {
            let t = format!("{call}{i} ");
            all.push_str(&t);
            publish(&b, out(call, stream, t));
        }
        expected.push((call.to_string(), stream, all));
    }
    let got = drain(&mut sub, b.latest_seq()).await;
    assert!(got.len() <= 4, "queue stayed bounded: {}", got.len());
    let frames: Vec<_> = got
        .iter()
        .map(|d| match d {
            Delivery::Frame(f) => match &f.event {
                ClientEvent::ToolOutput {
                    call_id,
                    stream,
                    text,
                } => (call_id.clone(), *stream, text.clone()),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        frames, expected,
        "every byte, in order, never mixing calls or streams"
    );
    assert_eq!(*seqs(&got).last().unwrap(), 1000);
}

#[tokio::test]
async fn a_merged_delta_never_grows_past_its_cap_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ledger) = logged_bus(dir.path(), 8, 4);
    let mut sub = b.subscribe(None);
    let chunk = "y".repeat(10_000);
    for _ in 0..500 {
        write(&b, &ledger, text(&chunk));
    }
    let got = drain(&mut sub, b.latest_seq()).await;
    let mut all = 0;
    for d in &got {
        if let Delivery::Frame(f) = d {
            let len = f.event.delta_len().unwrap();
            assert!(len <= MAX_MERGED, "a merged frame of {len} bytes");
            all += len;
        }
    }
    assert_eq!(all, 500 * 10_000, "every byte arrives");
    assert_eq!(*seqs(&got).last().unwrap(), 500);
}

#[tokio::test]
async fn a_subscriber_too_far_behind_resumes_from_its_cursor_in_the_same_subscription() {
    let b = bus(64, 4);
    let mut sub = b.subscribe(None);
    for i in 0..10 {
        publish(&b, ClientEvent::status(i % 2 == 0));
    }
    assert_eq!(b.subscriber_count(), 0, "the lagging queue was dropped");
    let got = drain(&mut sub, b.latest_seq()).await;
    assert_eq!(
        seqs(&got),
        (1..=10).collect::<Vec<_>>(),
        "no gap, no end: {got:?}"
    );
    assert!(got.iter().all(|d| matches!(d, Delivery::Frame(_))));
    assert_eq!(b.subscriber_count(), 1, "attached again");
    publish(&b, ClientEvent::status(true));
    assert_eq!(seqs(&drain(&mut sub, b.latest_seq()).await), vec![11]);
}

#[tokio::test]
async fn a_commit_of_many_frames_reaches_each_subscriber_in_order_and_one_that_fills_mid_commit_resumes_from_its_cursor(
) {
    // Queues of 4 frames that cannot merge (status frames), one commit of 10.
    let b = bus(64, 4);
    let mut fast = b.subscribe(None);
    let mut slow = b.subscribe(None);
    let first: Vec<Arc<Frame>> = (1..=3)
        .map(|seq| Arc::new(Frame::new(seq, b.session_id().clone(), ClientEvent::status(true))))
        .collect();
    b.commit(first);
    // `fast` reads those three; `slow` keeps them queued, so the next
    // commit fills its queue part-way through.
    assert_eq!(seqs(&drain(&mut fast, 3).await), vec![1, 2, 3]);
    let many: Vec<Arc<Frame>> = (4..=13)
        .map(|seq| {
            Arc::new(Frame::new(
                seq,
                b.session_id().clone(),
                ClientEvent::status(seq % 2 == 0),
            ))
        })
        .collect();
    b.commit(many);
    assert_eq!(b.latest_seq(), 13);
    assert_eq!(
        b.subscriber_count(),
        0,
        "both queues filled within the commit and were dropped"
    );
    for sub in [&mut fast, &mut slow] {
        let got = drain(sub, 13).await;
        assert!(
            got.iter().all(|d| matches!(d, Delivery::Frame(_))),
            "no resync, no end: {got:?}"
        );
        let from = seqs(&got)[0];
        assert_eq!(seqs(&got), (from..=13).collect::<Vec<_>>(), "in order, no gap");
    }
    assert_eq!(b.subscriber_count(), 2, "both attached again");
    b.commit(Vec::new());
    assert_eq!(b.latest_seq(), 13, "an empty commit changes nothing");
}

fn logged_bus(dir: &std::path::Path, ring: usize, queue: usize) -> (Bus, Arc<Ledger>) {
    let ledger = Arc::new(Ledger::create(&dir.join("s.jsonl"), "s", "t", Durability::Process).unwrap());
    let cfg = BusConfig {
        ring,
        queue,
        max_queued_bytes: 1 << 20,
        ..BusConfig::default()
    };
    let log: Arc<dyn Log> = ledger.clone();
    (Bus::new("s".into(), cfg, Some(log), 0, Vec::new()), ledger)
}

/// Appends then commits, as the writer does.
fn write(b: &Bus, ledger: &Ledger, event: ClientEvent) {
    let frame = Arc::new(Frame::new(b.latest_seq() + 1, b.session_id().clone(), event));
    let mut batch = Batch::default();
    batch.push_frame(&frame);
    ledger.append(&batch).unwrap();
    b.commit(vec![frame]);
}

#[tokio::test]
async fn a_cursor_older_than_the_ring_is_replayed_from_the_log_then_joins_live() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ledger) = logged_bus(dir.path(), 16, 64);
    for i in 0..3000 {
        write(&b, &ledger, text(&format!("{i} ")));
    }
    let mut sub = b.subscribe(Some(500));
    write(&b, &ledger, text("live"));
    let got = drain(&mut sub, b.latest_seq()).await;
    assert!(got.iter().all(|d| matches!(d, Delivery::Frame(_))), "no resync");
    assert_eq!(seqs(&got), (501..=3001).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_stalled_subscriber_past_the_ring_resumes_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ledger) = logged_bus(dir.path(), 8, 4);
    let mut sub = b.subscribe(None);
    for i in 0..2000 {
        // Status frames never merge: the queue overflows at once.
        write(&b, &ledger, ClientEvent::status(i % 2 == 0));
    }
    let got = drain(&mut sub, b.latest_seq()).await;
    assert!(
        got.iter().all(|d| matches!(d, Delivery::Frame(_))),
        "no resync, no end"
    );
    assert_eq!(seqs(&got), (1..=2000).collect::<Vec<_>>());
}

#[tokio::test]
async fn replay_across_missing_history_says_resync_instead_of_skipping() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ledger) = logged_bus(dir.path(), 4, 64);
    for i in 0..10 {
        write(&b, &ledger, text(&i.to_string()));
    }
    // A ledger that lost seqs 3..=5 (a corrupt middle line left out).
    let frames: Vec<Arc<Frame>> = [1u64, 2, 6, 7, 8, 9, 10]
        .iter()
        .map(|&s| Arc::new(Frame::new(s, "s".into(), text("x"))))
        .collect();
    let gappy = Bus::new("s".into(), BusConfig::default(), None, 10, frames);
    let got = drain(&mut gappy.subscribe(Some(0)), gappy.latest_seq()).await;
    assert_eq!(seqs(&got[..2]), vec![1, 2]);
    assert!(matches!(&got[2], Delivery::Resync { reason, .. } if reason.as_str() == "history_unavailable"));
    assert_eq!(seqs(&got[3..]), vec![6, 7, 8, 9, 10]);
    drop(ledger);
}

#[tokio::test]
async fn a_stalled_subscriber_holds_at_most_its_byte_budget() {
    let budget = 64 * 1024;
    let cfg = BusConfig {
        ring: 8,
        queue: 16,
        max_queued_bytes: budget,
        ..BusConfig::default()
    };
    let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
    let sub = b.subscribe(None);
    let chunk = "x".repeat(1000);
    let mut most = 0;
    for _ in 0..1000 {
        publish(&b, text(&chunk));
        most = most.max(cfg_total(&b));
    }
    assert_eq!(b.subscriber_count(), 0, "over budget: dropped, not grown");
    assert!(most <= budget, "held {most} bytes");
    assert!(
        most > budget / 2,
        "the budget is used before the queue is dropped ({most})"
    );
    drop(sub);
    assert_eq!(cfg_total(&b), 0, "the bytes are returned when the reader goes");
}

fn cfg_total(b: &Bus) -> usize {
    b.shared.cfg.total.get()
}

/// What a queued frame may really hold, counted independently of
/// `Frame::queued_cost`: a delta's text at its capacity, and for one as
/// published (the tests' 1000-byte deltas; merged ones are longer) the
/// encoding a reader may have cached on it.
fn real_size(f: &Frame) -> usize {
    match &f.event {
        ClientEvent::TextDelta { text } if text.len() == 1000 => {
            64 + text.capacity() + text.len() + f.session_id.len() + 96
        }
        ClientEvent::TextDelta { text } => 64 + text.capacity(),
        other => other.approx_size(),
    }
}

/// (counted, really held) bytes of a subscription's queue.
fn queue_bytes(sub: &Subscription) -> (usize, usize) {
    let st = sub.queue.lock();
    (st.bytes, st.frames.iter().map(|f| real_size(f)).sum())
}

#[tokio::test]
async fn a_full_queue_counts_merged_text_at_its_capacity_and_never_holds_more_than_its_budget() {
    let budget = 64 * 1024;
    let cfg = BusConfig {
        ring: 8,
        queue: 4,
        max_queued_bytes: budget,
        ..BusConfig::default()
    };
    let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
    let sub = b.subscribe(None);
    let chunk = "x".repeat(1000);
    let mut most = 0;
    for _ in 0..1000 {
        publish(&b, text(&chunk));
        let (counted, real) = queue_bytes(&sub);
        assert_eq!(counted, real, "the count is what the queued frames hold");
        assert_eq!(cfg_total(&b), counted, "and what the total says");
        most = most.max(real);
    }
    assert_eq!(b.subscriber_count(), 0, "over budget: dropped, not grown");
    assert!(most <= budget, "held {most} bytes, budget {budget}");
    assert!(
        most > budget / 2,
        "the budget is used before the queue is dropped ({most})"
    );
    drop(sub);
    assert_eq!(cfg_total(&b), 0);
}

#[tokio::test]
async fn what_a_reader_holds_outside_its_queue_counts_in_its_budget_until_dropped() {
    let budget = 64 * 1024;
    let cfg = BusConfig {
        ring: 1024,
        queue: 1 << 20,
        max_queued_bytes: budget,
        ..BusConfig::default()
    };
    let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
    let mut sub = b.subscribe(None);
    let chunk = "x".repeat(1000);
    for _ in 0..10 {
        publish(&b, text(&chunk));
    }
    assert_eq!(seqs(&sub.recv_many(64).await), (1..=10).collect::<Vec<_>>());
    assert_eq!(cfg_total(&b), 0, "taken: no longer queued");
    // The edge encoded them and cannot write them yet.
    let charge = sub.charge(40_000);
    assert_eq!(cfg_total(&b), 40_000);
    for _ in 0..30 {
        publish(&b, text(&chunk));
    }
    assert_eq!(
        b.subscriber_count(),
        0,
        "what the reader holds left room for fewer frames: dropped"
    );
    let (queued, _) = queue_bytes(&sub);
    assert!(queued + 40_000 <= budget, "queued {queued} + held 40000");
    assert!(
        queued + 40_000 > budget - 2200,
        "the rest of the budget was used ({queued})"
    );
    assert_eq!(cfg_total(&b), queued + 40_000);
    drop(charge);
    assert_eq!(cfg_total(&b), queued, "given back when the edge drops it");
    // Nothing is lost: the reader resumes from its cursor.
    let rest = drain(&mut sub, b.latest_seq()).await;
    assert!(rest.iter().all(|d| matches!(d, Delivery::Frame(_))), "no resync");
    let mut text_len = 0;
    for d in &rest {
        if let Delivery::Frame(f) = d {
            text_len += f.event.delta_len().unwrap();
        }
    }
    assert_eq!(text_len, 30 * 1000, "every byte after what it was handed");
    assert_eq!(*seqs(&rest).last().unwrap(), 40);
    drop(sub);
    assert_eq!(cfg_total(&b), 0);
}

#[tokio::test]
async fn deliveries_taken_ahead_by_recv_stay_counted_until_it_takes_more() {
    let b = bus(64, 64);
    let mut sub = b.subscribe(None);
    for _ in 0..5 {
        publish(&b, text("abc"));
    }
    let size = Frame::new(1, "s".into(), text("abc")).size;
    assert!(matches!(sub.recv().await, Some(Delivery::Frame(f)) if f.seq == 1));
    assert_eq!(cfg_total(&b), 5 * size, "taken ahead: counted as the reader's");
    for seq in 2..=5 {
        assert!(matches!(sub.recv().await, Some(Delivery::Frame(f)) if f.seq == seq));
    }
    assert_eq!(
        cfg_total(&b),
        5 * size,
        "the last ones may still be on their way out"
    );
    publish(&b, text("abc"));
    assert!(matches!(sub.recv().await, Some(Delivery::Frame(f)) if f.seq == 6));
    assert_eq!(cfg_total(&b), size, "taking more gives the earlier ones back");
    drop(sub);
    assert_eq!(cfg_total(&b), 0);
}

#[tokio::test]
async fn a_drained_queue_and_a_finished_replay_give_back_what_a_burst_grew() {
    let b = bus(64, 1 << 20);
    let mut sub = b.subscribe(None);
    for i in 0..1000 {
        publish(&b, ClientEvent::status(i % 2 == 0));
    }
    assert!(sub.queue.lock().frames.capacity() >= 1000);
    assert_eq!(drain(&mut sub, 1000).await.len(), 1000);
    assert!(
        sub.queue.lock().frames.capacity() <= KEEP_SLOTS,
        "a drained queue keeps {} slots",
        sub.queue.lock().frames.capacity()
    );

    let dir = tempfile::tempdir().unwrap();
    let (b, ledger) = logged_bus(dir.path(), 16, 64);
    for i in 0..3000 {
        write(&b, &ledger, text(&format!("{i} ")));
    }
    let mut replay = b.subscribe(Some(0));
    let first = replay.recv_many(64).await;
    assert_eq!(seqs(&first), (1..=64).collect::<Vec<_>>());
    assert!(
        b.shared.replay.cached_chunks() > 0,
        "read from disk, cached for other readers"
    );
    let rest = drain(&mut replay, 3000).await;
    assert_eq!(*seqs(&rest).last().unwrap(), 3000);
    assert_eq!(
        b.shared.replay.cached_chunks(),
        0,
        "caught up: the cached chunks are gone"
    );
    assert!(replay.from_log.capacity() == 0);
}

#[tokio::test]
async fn all_subscribers_together_hold_at_most_the_total_budget() {
    let cfg = BusConfig {
        ring: 8,
        queue: 1 << 20,
        max_queued_bytes: 1 << 20,
        max_total_queued_bytes: 100 * 1024,
        ..BusConfig::default()
    };
    let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
    let subs: Vec<Subscription> = (0..10).map(|_| b.subscribe(None)).collect();
    let chunk = "x".repeat(1000);
    for _ in 0..1000 {
        publish(&b, ClientEvent::status(true));
        publish(&b, text(&chunk));
    }
    assert!(cfg_total(&b) <= 100 * 1024, "total {}", cfg_total(&b));
    drop(subs);
    assert_eq!(cfg_total(&b), 0);
}

#[tokio::test]
async fn close_ends_every_subscription() {
    let b = bus(8, 8);
    let mut sub = b.subscribe(None);
    publish(&b, text("a"));
    b.close(CloseReason::ShuttingDown);
    // Up to the end, which comes after the last seq.
    let got = drain(&mut sub, u64::MAX).await;
    assert_eq!(seqs(&got), vec![1]);
    assert!(
        matches!(got.last(), Some(Delivery::End(End::Closed(r))) if r.as_str() == "server shutting down")
    );
    let mut late = b.subscribe(None);
    assert!(matches!(late.recv().await, Some(Delivery::End(End::Closed(_)))));
    assert!(late.recv().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn waiting_for_a_subscriber_returns_when_one_arrives_or_times_out() {
    let b = Arc::new(bus(8, 8));
    let start = tokio::time::Instant::now();
    b.wait_for_subscriber(Duration::from_secs(2)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(2));

    let b2 = b.clone();
    let waiter = tokio::spawn(async move { b2.wait_for_subscriber(Duration::from_secs(2)).await });
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    let _sub = b.subscribe(None);
    waiter.await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));

    let start = tokio::time::Instant::now();
    b.wait_for_subscriber(Duration::from_secs(2)).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait when someone watches");
}

fn flushing_bus(window_ms: u64, from: usize) -> Bus {
    let cfg = BusConfig {
        flush_window: Duration::from_millis(window_ms),
        flush_from: from,
        ..BusConfig::default()
    };
    Bus::new("s".into(), cfg, None, 0, Vec::new())
}

/// What `sub` has ready right now (without waiting), as seqs.
fn ready(sub: &mut Subscription) -> Option<Vec<u64>> {
    use futures_util::FutureExt;
    sub.recv_many(64).now_or_never().map(|d| seqs(&d))
}

#[tokio::test(start_paused = true)]
async fn a_busy_session_with_many_subscribers_wakes_them_once_per_flush_window() {
    let b = flushing_bus(10, 3);
    let mut subs: Vec<Subscription> = (0..3).map(|_| b.subscribe(None)).collect();
    // The first commit after a quiet window goes out at once.
    publish(&b, text("a"));
    for s in &mut subs {
        assert_eq!(ready(s), Some(vec![1]));
    }
    // Readers waiting for more: commits inside the window wait for its
    // end, then come together in one wake-up.
    let start = tokio::time::Instant::now();
    let waiting: Vec<_> = subs
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let got = seqs(&s.recv_many(64).await);
                (got, start.elapsed(), s)
            })
        })
        .collect();
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(1)).await;
    publish(&b, text("b"));
    tokio::time::advance(Duration::from_millis(1)).await;
    publish(&b, text("c"));
    let mut subs = Vec::new();
    for w in waiting {
        let (got, woken, s) = w.await.unwrap();
        assert_eq!(got, vec![2, 3], "one wake-up carries both frames");
        assert_eq!(woken, Duration::from_millis(10), "woken at the window's end");
        subs.push(s);
    }
    // After a quiet window, again at once.
    tokio::time::advance(Duration::from_millis(10)).await;
    publish(&b, text("d"));
    for s in &mut subs {
        assert_eq!(ready(s), Some(vec![4]));
    }
}

#[tokio::test(start_paused = true)]
async fn below_flush_from_or_with_no_window_every_commit_wakes_at_once() {
    for b in [flushing_bus(10, 3), flushing_bus(0, 1)] {
        let mut subs: Vec<Subscription> = (0..2).map(|_| b.subscribe(None)).collect();
        for n in 1..=3 {
            publish(&b, text("x"));
            for s in &mut subs {
                assert_eq!(ready(s), Some(vec![n]));
            }
            tokio::time::advance(Duration::from_millis(1)).await;
        }
    }
}

/// Every ring together holds at most `max_total_retained_bytes`: a session
/// that commits past it gives up its own oldest frames (keeping
/// `MIN_RING`), a cursor older than what it kept replays from the log
/// without a gap, and an unloaded session's ring leaves the total.
#[tokio::test]
async fn rings_share_one_byte_budget_and_older_cursors_replay_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let one = Frame::new(1, "s".into(), text("0123456789"));
    let cost = crate::stream::bus_config::retained_cost(&one);
    let cfg = BusConfig {
        ring: 1024,
        queue: 4096,
        max_queued_bytes: 1 << 20,
        // Room for 300 frames in all.
        max_total_retained_bytes: 300 * cost,
        ..BusConfig::default()
    };
    let open = |name: &str| {
        let ledger = Arc::new(
            Ledger::create(
                &dir.path().join(format!("{name}.jsonl")),
                name,
                "t",
                Durability::Process,
            )
            .unwrap(),
        );
        let log: Arc<dyn Log> = ledger.clone();
        (
            Bus::new(name.into(), cfg.clone(), Some(log), 0, Vec::new()),
            ledger,
        )
    };
    let (a, la) = open("a");
    for _ in 0..200 {
        write(&a, &la, text("0123456789"));
    }
    assert_eq!(
        cfg.retained.get(),
        200 * cost,
        "under the budget: a keeps all 200"
    );
    let (b, lb) = open("b");
    for _ in 0..500 {
        write(&b, &lb, text("0123456789"));
    }
    // a's 200 stay; b trims itself to what is left, never below MIN_RING.
    assert_eq!(cfg.retained.get(), 300 * cost);
    assert_eq!(a.shared.lock().ring.len(), 200);
    assert_eq!(b.shared.lock().ring.len(), 100);
    // A cursor older than b's ring comes back from the log, whole.
    let mut sub = b.subscribe(Some(10));
    let got = drain(&mut sub, b.latest_seq()).await;
    assert!(got.iter().all(|d| matches!(d, Delivery::Frame(_))), "no resync");
    assert_eq!(seqs(&got), (11..=500).collect::<Vec<_>>());
    drop(sub);
    // Over the budget a ring keeps MIN_RING however much the others hold.
    let (c, lc) = open("c");
    for _ in 0..100 {
        write(&c, &lc, text("0123456789"));
    }
    assert_eq!(c.shared.lock().ring.len(), crate::stream::bus_config::MIN_RING);
    // An unloaded session gives its share back.
    drop(a);
    assert_eq!(
        cfg.retained.get(),
        (100 + crate::stream::bus_config::MIN_RING) * cost
    );
}

/// Every idle reader keeps one pending receive (inside its SSE body or its
/// gRPC stream): a read from disk inside it, boxed, must not size it
/// (440 bytes before it was boxed).
#[test]
fn a_pending_receive_stays_small() {
    let b = bus(8, 16);
    let mut sub = b.subscribe(None);
    assert!(std::mem::size_of_val(&sub.recv()) <= 256);
    assert!(std::mem::size_of_val(&sub.recv_many(4)) <= 256);
}
