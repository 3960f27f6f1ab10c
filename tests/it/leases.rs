//! Leases that survive a NATS election, and sessions that settle their run when their writer stops (issue 26, items 4 and 2): real `vak serve --bus` replicas on a real 3-node NATS cluster.

use crate::support;
use crate::support::nats::{Cluster, Replica};
use crate::support::{assert_numbered, finished, text_of, Frame, Sse, DEADLINE};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use vak::core::cluster::jetstream::{JetStreamLog, STREAM};
use vak::core::cluster::owners::{Owner, BUCKET};
use vak::core::log::ledger::{Batch, Log, Record};

/// A replica on every node of `nats`, making the lease bucket with
/// `ttl_ms` as its age if it is the first.
async fn start(nats: &Cluster, name: &str, ttl_ms: &str) -> Replica {
    Replica::start(&nats.url(), name, "3", |s| s.args(["--bus-lease-ttl-ms", ttl_ms])).await
}

/// A client of every node, so it outlives any one of them.
async fn nats_client(nats: &Cluster) -> async_nats::Client {
    let nodes: Vec<async_nats::ServerAddr> = nats.url().split(',').map(|u| u.parse().unwrap()).collect();
    tokio::time::timeout(DEADLINE, async_nats::connect(nodes))
        .await
        .unwrap()
        .unwrap()
}

/// The lease bucket.
async fn leases(client: &async_nats::Client) -> async_nats::jetstream::kv::Store {
    let js = async_nats::jetstream::new(client.clone());
    js.get_key_value(BUCKET).await.unwrap()
}

/// Who holds `sid`'s lease now (Err: NATS did not answer).
async fn lease_of(kv: &async_nats::jetstream::kv::Store, sid: &str) -> Result<Option<String>, String> {
    let value = kv.get(sid).await.map_err(|e| e.to_string())?;
    Ok(value.map(|v| serde_json::from_slice::<Owner>(&v).unwrap().replica))
}

/// Reads `sse` until it has shown `n` text deltas; the frames read.
async fn deltas(sse: &mut Sse, n: usize) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    while out.iter().filter(|f| f.event == "text_delta").count() < n {
        out.push(sse.next().await.expect("the run goes on"));
    }
    out
}

/// Frames up to the first run_finished, or Err with what ended the stream first.
async fn until_finished(sse: &mut Sse) -> Result<Vec<Frame>, String> {
    let mut out = Vec::new();
    loop {
        match sse.next().await {
            Some(f) if f.event == "run_finished" => {
                out.push(f);
                return Ok(out);
            }
            Some(f) if f.event == "session_closed" => {
                return Err(format!("the stream ended with session_closed {}", f.data))
            }
            Some(f) => out.push(f),
            None => return Err("the stream ended before run_finished".into()),
        }
    }
}

/// Moves `stream`'s leader to node `to`: a stepdown preferring it, asked
/// again until it leads (under the deadline).
async fn move_leader(client: &async_nats::Client, stream: &str, to: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let leader = support::nats::stream_leader(client, stream).await;
        if leader == to {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{stream} is still led by {leader}, not {to}"
        );
        let body = json!({ "placement": { "preferred": to } }).to_string();
        let _ = client
            .request(format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"), body.into())
            .await;
        // Until the stepdown took effect (another leader is named).
        let until = Instant::now() + Duration::from_secs(5);
        while support::nats::stream_leader(client, stream).await == leader && Instant::now() < until {
            crate::support::poll::pause().await;
        }
    }
}

/// One trial: a paced run on A, followed on B, with the `VAK_EV` stream
/// leader SIGKILLed mid-run; what went wrong, if anything. The lease
/// bucket is led from the same node, so the holder's renewals stall
/// through the election too (the case that moved sessions).
async fn leader_killed_mid_run(trial: usize) -> Option<String> {
    let mut nats = Cluster::three().await;
    let a = start(&nats, "ra", "3000").await;
    let b = start(&nats, "rb", "3000").await;
    let client = nats_client(&nats).await;
    let kv = leases(&client).await;
    let sid = a.api.create_session().await;
    // A reader on B: B mirrors the session, and its orphan check (once a
    // lease age) is what would take the session over.
    let mut on_b = b.api.events(&sid, None).await;
    let (code, adm) = a.api.run(&sid, "/pace 1500 300").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let leader = support::nats::stream_leader(&client, STREAM).await;
    move_leader(&client, &format!("KV_{BUCKET}"), &leader).await;
    let mut seen = deltas(&mut on_b, 100).await;
    eprintln!("trial {trial}: killing {leader}, the leader of {STREAM} and of the lease bucket");
    nats.kill(nats.index_of(&leader).expect("the leader is one of ours"));
    let rest = match until_finished(&mut on_b).await {
        Ok(rest) => rest,
        Err(e) => return Some(format!("trial {trial}: {e}")),
    };
    seen.extend(rest);
    assert_numbered(&seen);
    let fin = finished(&seen);
    if fin["outcome"] != "completed" {
        return Some(format!(
            "trial {trial}: the run finished {fin}; ra's log:\n{}",
            a.vak.log()
        ));
    }
    // The lease may be between its expiry and ra taking it again (its
    // next renewal finds the key gone); it never names another replica.
    let deadline = Instant::now() + DEADLINE;
    loop {
        match lease_of(&kv, &sid).await {
            Ok(Some(ra)) if ra == "ra" => break,
            Ok(Some(other)) => return Some(format!("trial {trial}: the lease moved from ra to {other}")),
            _ if Instant::now() < deadline => crate::support::poll::pause().await,
            got => {
                return Some(format!(
                    "trial {trial}: ra did not take its expired lease again: {got:?}"
                ))
            }
        }
    }
    // Whether the lease expired during the election (it depends on how
    // long the election took): ra took it again, and rb, asking, left it.
    eprintln!(
        "trial {trial}: ra took its expired lease again: {}; rb left a free lease to ra: {}",
        a.vak.log().contains("taken again"),
        b.vak.log().contains("left to it")
    );
    // The session still has its writer: a run sent anywhere completes.
    let (code, adm) = b.api.run(&sid, "after the election").await;
    if code != 202 {
        return Some(format!("trial {trial}: a follow-up run answered {code} {adm}"));
    }
    let next = match until_finished(&mut on_b).await {
        Ok(next) => next,
        Err(e) => return Some(format!("trial {trial}: the follow-up run: {e}")),
    };
    assert_eq!(next[0].seq(), seen.last().unwrap().seq() + 1);
    assert_eq!(finished(&next)["outcome"], "completed");
    assert_eq!(text_of(&next), "echo: after the election");
    None
}

/// With a 3 s lease (shorter than NATS may take to elect a new stream
/// leader), killing the `VAK_EV` leader's node mid-run stalls the
/// holder's appends and renewals, yet no other replica takes the session
/// over while the holder answers on core NATS: five trials, every run
/// completes, the lease stays with its holder, and a follow-up run
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_leader_killed_under_a_3s_lease_moves_no_session_and_every_run_completes() {
    let mut failed = Vec::new();
    for trial in 1..=5 {
        if let Some(why) = leader_killed_mid_run(trial).await {
            eprintln!("{why}");
            failed.push(why);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 5 trials failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Appends a note to `sid`'s subject as a writer of its own, as a stale
/// holder's retried append lands: the holder's next append is fenced.
async fn rogue_append(client: &async_nats::Client, sid: &str) {
    for _ in 0..500 {
        let log = JetStreamLog::open(client.clone(), sid).await.unwrap();
        let appended = tokio::task::spawn_blocking(move || {
            let mut batch = Batch::default();
            batch.push(&Record::Admitted {
                request_id: "rogue".into(),
            });
            log.append(&batch)
        })
        .await
        .unwrap();
        // The holder appended between the read and the append: again.
        if appended.is_ok() {
            return;
        }
    }
    panic!("the rogue writer never got an append in");
}

/// The holder's writer is fenced mid-run (another writer appended to the
/// session, as a stale holder's retried append does): the holder, which
/// still holds the lease, reloads the session by itself and settles the
/// interrupted run, so a reader on another replica sees its run_finished
/// without anyone sending a request, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_fenced_mid_run_settles_its_run_without_a_request() {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra", "1500").await;
    let b = start(&nats, "rb", "1500").await;
    let client = nats_client(&nats).await;
    let sid = a.api.create_session().await;
    let mut on_b = b.api.events(&sid, None).await;
    let (code, _) = a.api.run(&sid, "/pace 100000 400").await;
    assert_eq!(code, 202);
    let mut seen = deltas(&mut on_b, 40).await;
    rogue_append(&client, &sid).await;
    // No request from here on: only the stopped writer's replica acts.
    let rest = until_finished(&mut on_b)
        .await
        .unwrap_or_else(|e| panic!("{e}\nra:\n{}", a.vak.log()));
    seen.extend(rest);
    assert_numbered(&seen);
    let fin: &Value = finished(&seen);
    assert_eq!(fin["outcome"], "failed", "{fin}");
    assert_eq!(fin["message"], "interrupted: the server stopped during this run");
    assert_eq!(seen.iter().filter(|f| f.event == "run_finished").count(), 1);
    assert_eq!(
        lease_of(&leases(&client).await, &sid).await,
        Ok(Some("ra".into()))
    );
    // And the session has a writer: a run sent to B completes.
    let (code, adm) = b.api.run(&sid, "after the fence").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let next = until_finished(&mut on_b).await.unwrap();
    assert_eq!(next[0].seq(), seen.last().unwrap().seq() + 1);
    assert_eq!(text_of(&next), "echo: after the fence");
}
