//! The event stream over SSE: replay by cursor, resync, live-only without a cursor, and lossless delivery to a subscriber that stops reading.

use crate::support::*;

async fn finished_session(s: &TestServer, prompt: &str) -> (String, Vec<Frame>) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, prompt).await;
    let frames = sse.until("run_finished").await;
    (sid, frames)
}

#[tokio::test]
async fn a_cursor_replays_exactly_the_frames_after_it_then_goes_live() {
    let s = TestServer::start().await;
    let (sid, frames) = finished_session(&s, "one two three").await;
    let latest = frames.last().unwrap().seq();

    let mut sse = s.events(&sid, Some(3)).await;
    assert_eq!(sse.opened.as_ref().unwrap().body()["latest_seq"], latest);
    let mut replay = Vec::new();
    for _ in 4..=latest {
        replay.push(sse.next().await.unwrap());
    }
    assert_eq!(
        replay.iter().map(Frame::seq).collect::<Vec<_>>(),
        (4..=latest).collect::<Vec<_>>()
    );
    assert_eq!(text_of(&replay), text_of(&frames));
    s.run(&sid, "more").await;
    let live = sse.until("run_finished").await;
    assert_eq!(
        live[0].seq(),
        latest + 1,
        "live frames follow the replay without a gap"
    );
    assert_numbered(&live);

    // ?after= works the same; Last-Event-ID wins when both are present.
    let r = s
        .http()
        .get(format!("{}/sessions/{sid}/events?after=1", s.url))
        .header("last-event-id", latest.to_string())
        .send()
        .await
        .unwrap();
    let mut both = Sse::new(r);
    assert_eq!(both.next().await.unwrap().event, "stream_opened");
    assert_eq!(both.next().await.unwrap().seq(), latest + 1);
    let r = s
        .http()
        .get(format!("{}/sessions/{sid}/events?after=1", s.url))
        .send()
        .await
        .unwrap();
    let mut query = Sse::new(r);
    assert_eq!(query.next().await.unwrap().event, "stream_opened");
    assert_eq!(query.next().await.unwrap().seq(), 2);
}

#[tokio::test]
async fn without_a_cursor_a_stream_carries_new_frames_only() {
    let s = TestServer::start().await;
    let (sid, frames) = finished_session(&s, "before").await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "after").await;
    let live = sse.until("run_finished").await;
    assert_eq!(live[0].seq(), frames.last().unwrap().seq() + 1);
    assert_eq!(text_of(&live), "echo: after");
}

#[tokio::test]
async fn a_cursor_older_than_the_ring_replays_from_disk_and_one_ahead_resyncs() {
    let s = TestServer::start_with(|c| c.core.bus.ring = 8).await;
    let (sid, frames) = finished_session(&s, "/burst 40").await;
    let latest = frames.last().unwrap().seq();
    // Older than the ring: the ledger serves it, exactly, with no resync.
    let mut sse = s.events(&sid, Some(2)).await;
    let mut replayed = Vec::new();
    while replayed.len() < (latest - 2) as usize {
        replayed.push(sse.next().await.unwrap());
    }
    assert_eq!(
        replayed.iter().map(|f| f.data.clone()).collect::<Vec<_>>(),
        frames[2..].iter().map(|f| f.data.clone()).collect::<Vec<_>>()
    );
    for (cursor, reason) in [(latest + 5, "cursor_ahead")] {
        let mut sse = s.events(&sid, Some(cursor)).await;
        let resync = sse.next().await.unwrap();
        assert_eq!(resync.event, "resync");
        assert_eq!(resync.id, None, "resync never moves the cursor");
        assert_eq!(resync.body()["reason"], reason);
        assert_eq!(resync.body()["latest_seq"], latest);
        let retained: Vec<u64> = {
            let mut v = Vec::new();
            for _ in 0..8 {
                v.push(sse.next().await.unwrap().seq());
            }
            v
        };
        assert_eq!(
            retained,
            (latest - 7..=latest).collect::<Vec<_>>(),
            "then every retained frame"
        );
    }
    // The oldest cursor the ring still serves replays without a resync.
    let mut sse = s.events(&sid, Some(latest - 8)).await;
    let first = sse.next().await.unwrap();
    assert_ne!(first.event, "resync");
    assert_eq!(first.seq(), latest - 7);
}

#[tokio::test]
async fn a_cursor_10_000_events_back_resumes_exactly_over_sse() {
    let s = TestServer::start().await;
    let (sid, _) = finished_session(&s, "/burst 12000").await;
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let latest = t["seq"].as_u64().unwrap();
    let after = latest - 10_000;
    let mut sse = s.events(&sid, Some(after)).await;
    let mut got = Vec::new();
    while got.len() < 10_000 {
        let f = sse.next().await.unwrap();
        assert_ne!(f.event, "resync", "the ledger serves what the ring of 1024 lost");
        got.push(f);
    }
    assert_eq!(
        got.iter().map(Frame::seq).collect::<Vec<_>>(),
        (after + 1..=latest).collect::<Vec<_>>()
    );
    assert_eq!(got.last().unwrap().event, "run_finished");
    // The deltas continue each other: t{k} t{k+1} ... t11999.
    let words: Vec<String> = text_of(&got).split_whitespace().map(str::to_string).collect();
    let first: usize = words[0][1..].parse().unwrap();
    let want: Vec<String> = (first..12_000).map(|i| format!("t{i}")).collect();
    assert_eq!(words, want);
}

/// Reads a session's stream like a resuming client: on a cut it reconnects
/// with its last id. Returns the frames (each seq once) up to run_finished.
async fn read_resuming(s: &TestServer, sid: &str, mut sse: Sse) -> (Vec<Frame>, usize) {
    let mut frames: Vec<Frame> = Vec::new();
    let mut reconnects = 0;
    loop {
        match sse.next().await {
            Some(f) => {
                assert_ne!(f.event, "resync", "a lossless stream never needs a resync");
                let done = f.event == "run_finished";
                frames.push(f);
                if done {
                    return (frames, reconnects);
                }
            }
            None => {
                reconnects += 1;
                assert!(reconnects < 100, "too many reconnects");
                let last = frames.last().map(Frame::seq).unwrap_or(0);
                sse = s.events(sid, Some(last)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_subscriber_that_stops_reading_still_gets_the_whole_burst() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let stalled = s.events(&sid, None).await; // opened, then not read until the end
    let reader = s.events(&sid, None).await;
    s.run(&sid, "/burst 100000").await;
    let expected: String = (0..100_000).map(|i| format!("t{i} ")).collect();

    let (live, _) = read_resuming(&s, &sid, reader).await;
    assert_eq!(
        text_of(&live),
        expected,
        "the reading subscriber is not slowed or starved"
    );
    assert_numbered(&live);

    let (late, _) = read_resuming(&s, &sid, stalled).await;
    assert_eq!(
        text_of(&late),
        expected,
        "the stalled subscriber's text arrives whole"
    );
    assert_numbered(&late);
    assert_eq!(late.last().unwrap().seq(), live.last().unwrap().seq());
}

/// Large deltas (from 4 KiB their JSON goes out as a chunk of its own,
/// shared by every reader) arrive whole, numbered and in order, between the
/// run's small frames, to a reader that keeps up and to one that reads only
/// once the run is over.
#[tokio::test]
async fn large_deltas_arrive_whole_and_in_order_beside_small_frames() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let late = s.events(&sid, None).await;
    let reader = s.events(&sid, None).await;
    s.run(&sid, "/burst 40 20000").await;
    let token = |i: usize| {
        let t = format!("t{i}");
        format!("{t}{} ", "_".repeat(20000 - 1 - t.len()))
    };
    let expected: String = (0..40).map(token).collect();
    for sse in [reader, late] {
        let (frames, _) = read_resuming(&s, &sid, sse).await;
        assert_numbered(&frames);
        assert!(
            frames.iter().any(|f| f.event == "user_message"),
            "small frames too"
        );
        let text = text_of(&frames);
        assert_eq!(text.len(), expected.len());
        assert!(text == expected, "the deltas' text, whole and in order");
    }
}
