//! Several real `vak serve --bus` replicas on a real 3-node NATS cluster (issue 14): a lease per session in VAK_OWNERS, admissions and approvals forwarded to the lease holder, streams served by any replica, failover after a SIGKILL, and fencing of an owner that was stopped past its lease.

use crate::support;
use crate::support::fake_provider::{fixture, FakeProvider, Reply};
use crate::support::nats::{Cluster, Replica};
use crate::support::{
    agent_kind, assert_numbered, finished, sessions_query, text_of, Frame, Serve, Sse, DEADLINE,
};
use futures_util::StreamExt;
use serde_json::{json, Value};
use vak::core::cluster::jetstream::JetStreamLog;
use vak::core::cluster::owners::{Owner, BUCKET};
use vak::core::log::ledger::Record;

/// The lease age the tests' bucket is made with: a failover waits about this long.
const TTL_MS: &str = "1500";

/// A replica on every node of `nats`, with the tests' lease age: `vak serve --bus URL
/// --bus-replicas 3 --bus-replica NAME --bus-lease-ttl-ms TTL --listen 127.0.0.1:0 --home HOME
/// --workspace WS` (`support::nats::Replica`), as docs/protocol.md's replicas are started.
async fn start(nats: &Cluster, name: &str) -> Replica {
    start_on(&nats.url(), name, TTL_MS).await
}

/// A replica given only `bus` (it learns the other nodes from the
/// server), making the lease bucket with `ttl_ms` if it is first.
async fn start_on(bus: &str, name: &str, ttl_ms: &str) -> Replica {
    start_with(bus, name, ttl_ms, &[]).await
}

/// `start_on` with more `vak serve` flags.
async fn start_with(bus: &str, name: &str, ttl_ms: &str, more: &[&str]) -> Replica {
    Replica::start(bus, name, "3", |s| {
        s.args(["--bus-lease-ttl-ms", ttl_ms]).args(more)
    })
    .await
}

/// `start_with` in the workspace `workspace` (replicas that share one
/// share its always-allow rules).
async fn start_in(
    bus: &str,
    name: &str,
    ttl_ms: &str,
    more: &[&str],
    workspace: &std::path::Path,
) -> Replica {
    Replica::start(bus, name, "3", |s| {
        s.args(["--bus-lease-ttl-ms", ttl_ms])
            .args(more)
            .workspace(workspace)
    })
    .await
}

/// `start_in` with the home `home` (what it already holds is the replica's).
async fn start_home(
    bus: &str,
    name: &str,
    ttl_ms: &str,
    more: &[&str],
    workspace: &std::path::Path,
    home: &std::path::Path,
) -> Replica {
    Replica::start(bus, name, "3", |s| {
        s.args(["--bus-lease-ttl-ms", ttl_ms])
            .args(more)
            .workspace(workspace)
            .home(home)
    })
    .await
}

/// A client of every node, so it outlives any one of them.
async fn nats_client(nats: &Cluster) -> async_nats::Client {
    let nodes: Vec<async_nats::ServerAddr> = nats.url().split(',').map(|u| u.parse().unwrap()).collect();
    tokio::time::timeout(DEADLINE, async_nats::connect(nodes))
        .await
        .unwrap()
        .unwrap()
}

async fn leases(nats: &Cluster) -> async_nats::jetstream::kv::Store {
    let js = async_nats::jetstream::new(nats_client(nats).await);
    js.get_key_value(BUCKET).await.unwrap()
}

async fn lease_of(kv: &async_nats::jetstream::kv::Store, sid: &str) -> Option<Owner> {
    kv.get(sid)
        .await
        .unwrap()
        .map(|v| serde_json::from_slice(&v).unwrap())
}

/// Reads `sse` until it has shown `n` text deltas; the frames read.
async fn deltas(sse: &mut Sse, n: usize) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    while out.iter().filter(|f| f.event == "text_delta").count() < n {
        out.push(sse.next().await.expect("the run goes on"));
    }
    out
}

/// The numbers `i` of the `/pace` deltas (`p{i}@{micros} `) in `frames`, in
/// order: a reader may see deltas merged (a lagging queue, a replay catching
/// up), so exactness is checked on the text, not frame by frame.
fn paced(frames: &[Frame]) -> Vec<u64> {
    text_of(frames)
        .split_whitespace()
        .map(|w| {
            w.trim_start_matches('p')
                .split('@')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// The frames that are not deltas, as a client sees them.
fn not_deltas(frames: &[Frame]) -> Vec<(Option<String>, String, Value)> {
    frames
        .iter()
        .filter(|f| f.event != "text_delta")
        .map(|f| (f.id.clone(), f.event.clone(), f.data.clone()))
        .collect()
}

/// The event seqs stored on the session's subject, read straight from the stream.
async fn stored_seqs(nats: &Cluster, sid: &str) -> Vec<u64> {
    let log = JetStreamLog::open(nats_client(nats).await, sid).await.unwrap();
    log.records()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Event { seq, .. } => Some(seq),
            _ => None,
        })
        .collect()
}

/// A 3-node NATS cluster, replicas `ra` and `rb`, a session created on
/// `ra` (so `ra` holds its lease) and a stream of it open on `ra`.
async fn two_replicas() -> (Cluster, Replica, Replica, String, Sse) {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra").await;
    let b = start(&nats, "rb").await;
    let sid = a.api.create_session().await;
    let sse = a.api.events(&sid, None).await;
    (nats, a, b, sid, sse)
}

/// Starts a long paced run on `owner` and reads `sse` until it has shown 40
/// deltas: the frames read (the last one's seq is a client's cursor when
/// the owner goes away).
async fn paced_run(owner: &Replica, sid: &str, sse: &mut Sse) -> Vec<Frame> {
    let (code, _) = owner.api.run(sid, "/pace 100000 400").await;
    assert_eq!(code, 202);
    deltas(sse, 40).await
}

/// A session is written by the replica holding its lease (created with it,
/// renewed at a third of its age); another replica names that holder for
/// what it cannot forward, and takes the session at once when the holder
/// stops cleanly and gives the lease back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_leases_each_session_it_writes_renews_it_and_gives_it_back_when_it_stops() {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra").await;
    let b = start(&nats, "rb").await;
    let kv = leases(&nats).await;
    let sid = a.api.create_session().await;
    let held = kv.entry(&sid).await.unwrap().expect("a lease");
    assert_eq!(
        serde_json::from_slice::<Owner>(&held.value).unwrap(),
        Owner {
            replica: "ra".into(),
            url: a.api.url.clone()
        }
    );
    // Renewed: the same holder written again under a later revision.
    let mut watch = kv.watch(&sid).await.unwrap();
    let renewed = tokio::time::timeout(DEADLINE, async {
        loop {
            let e = watch.next().await.unwrap().unwrap();
            if e.revision > held.revision {
                return e;
            }
        }
    })
    .await
    .expect("the lease is renewed within the deadline");
    assert_eq!(renewed.operation, async_nats::jetstream::kv::Operation::Put);
    assert_eq!(renewed.value, held.value);

    // B serves reads of a session A holds, and changes it only through A.
    let (code, body) = b.api.post(&format!("/sessions/{sid}/clear"), json!({})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(lease_of(&kv, &sid).await.unwrap().replica, "ra", "B took nothing");

    // A clean stop gives the lease back, so B takes the session without waiting it out.
    let (code, _) = a.api.run(&sid, "before the stop").await;
    assert_eq!(code, 202);
    let mut sse = a.api.events(&sid, Some(0)).await;
    sse.until("run_finished").await;
    assert!(a.vak.terminate().await.success());
    assert_eq!(lease_of(&kv, &sid).await, None, "released on shutdown");
    let (code, body) = b.api.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(lease_of(&kv, &sid).await.unwrap().replica, "rb");
    let (code, adm) = b.api.run(&sid, "after").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")));
}

/// Run, steering and cancel sent to a replica that does not hold the
/// session are answered by the holder: one request id is admitted once
/// across replicas, and the holder's refusals reach the client unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_id_on_two_replicas_is_started_once_and_duplicate_once() {
    let (_nats, a, b, sid, mut sse) = two_replicas().await;
    let path = format!("/sessions/{sid}/run");
    let body = json!({"prompt": "hello there", "request_id": "same-1"});
    let (on_a, on_b) = tokio::join!(a.api.post(&path, body.clone()), b.api.post(&path, body.clone()));
    assert_eq!((on_a.0, on_b.0), (202, 202), "{on_a:?} {on_b:?}");
    let mut states = [
        on_a.1["state"].as_str().unwrap(),
        on_b.1["state"].as_str().unwrap(),
    ];
    states.sort();
    assert_eq!(states, ["duplicate", "started"]);
    assert_eq!(on_a.1["request_id"], on_b.1["request_id"]);
    let run = sse.until("run_finished").await;
    assert_numbered(&run);
    assert_eq!(finished(&run)["outcome"], "completed");
    assert_eq!(text_of(&run), "echo: hello there");
    // Sent again later, to either replica: still a duplicate.
    let (code, again) = b.api.post(&path, body).await;
    assert_eq!((code, again["state"].as_str()), (202, Some("duplicate")));

    // Steering and cancel through B act on A's live run.
    let (code, adm) = b.api.run(&sid, "/sleep 600000").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let (code, steer) = b
        .api
        .post(&format!("/sessions/{sid}/steering"), json!({"text": "later"}))
        .await;
    assert_eq!((code, steer["state"].as_str()), (202, Some("queued")), "{steer}");
    let (code, cancel) = b.api.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!(code, 200, "{cancel}");
    assert_eq!(cancel, json!({"cancelled": true, "discarded": 1}));
    let run = sse.until("run_finished").await;
    assert_eq!(finished(&run)["outcome"], "cancelled");

    // A refusal made on A travels back as it is: an unknown approval is 404.
    let (code, body) = b
        .api
        .post(
            &format!("/sessions/{sid}/approvals/ap_nope"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["message"], "no approval request ap_nope");
    // A prompt larger than NATS carries (1 MiB by default) is refused on B with both sizes.
    let big = "x".repeat(2 << 20);
    let (code, body) = b.api.post(&path, json!({"prompt": big})).await;
    assert_eq!(code, 413, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("NATS carries at most"),
        "{body}"
    );
}

/// The title `GET /sessions` on `r` lists for session `sid`.
async fn title_on(r: &Replica, sid: &str) -> Value {
    let (code, list) = r.api.get("/sessions").await;
    assert_eq!(code, 200, "{list}");
    let listed = list["sessions"].as_array().unwrap().iter();
    let mut listed = listed.filter(|s| s["session_id"] == sid);
    listed
        .next()
        .unwrap_or_else(|| panic!("{sid} not listed: {list}"))["title"]
        .clone()
}

/// `GET /sessions` on any replica lists the sessions created on every
/// replica (the shared index, `VAK_SESSIONS`), with the title a rename
/// made through any of them, also after their creator stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_created_or_renamed_on_any_replica_are_listed_on_every_replica() {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra").await;
    let b = start(&nats, "rb").await;
    let c = start(&nats, "rc").await;
    let sid = a.api.create_session().await;
    for r in [&a, &b, &c] {
        assert_eq!(title_on(r, &sid).await, "", "listed, untitled");
    }
    let (code, r) = b
        .api
        .send(
            reqwest::Method::PATCH,
            &format!("/sessions/{sid}"),
            Some(json!({"title": "named on B"})),
        )
        .await;
    assert_eq!(code, 200, "{r}");
    for r in [&a, &b, &c] {
        assert_eq!(title_on(r, &sid).await, "named on B");
    }
    // A session C created is listed on A, newest first, also once C is gone.
    let other = c.api.create_session().await;
    let (code, list) = a.api.get("/sessions").await;
    assert_eq!(code, 200);
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(
        ids.contains(&sid.as_str()) && ids.contains(&other.as_str()),
        "{list}"
    );
    assert!(c.vak.terminate().await.success());
    assert_eq!(title_on(&a, &other).await, "");
    assert_eq!(title_on(&b, &other).await, "");
}

/// Every other change to a session sent to a replica that does not hold
/// it is made by the holder (forwarded as Run is), so it reaches every
/// replica's streams and reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_changes_sent_to_a_replica_that_does_not_hold_the_session_are_made_by_the_holder() {
    let (nats, a, b, sid, mut sse) = two_replicas().await;
    let kv = leases(&nats).await;
    for prompt in ["first alpha", "second beta"] {
        let (code, _) = b.api.run(&sid, prompt).await;
        assert_eq!(code, 202);
        sse.until("run_finished").await;
    }
    let latest = a.api.latest_seq(&sid).await;

    // Rename through B: the holder's title, read on A.
    let path = format!("/sessions/{sid}");
    let (code, r) = b
        .api
        .send(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"title": "named on B"})),
        )
        .await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["title"], "named on B");
    assert_eq!(title_on(&a, &sid).await, "named on B");
    // The holder's refusal travels back as it is.
    let (code, e) = b
        .api
        .send(reqwest::Method::PATCH, &path, Some(json!({"title": ""})))
        .await;
    assert_eq!(code, 400, "{e}");

    // A side chat asked on B runs on A: its frames reach A's stream, its
    // log reads the same on B (a mirror folds them).
    let (code, adm) = b
        .api
        .post(&format!("/sessions/{sid}/side"), json!({"question": "what now"}))
        .await;
    assert_eq!(code, 202, "{adm}");
    let side_id = adm["side_id"].as_str().unwrap().to_string();
    let side = sse.until("side").await;
    assert_eq!(side.last().unwrap().body()["side_id"], side_id.as_str());
    let answered = tokio::time::timeout(DEADLINE, async {
        loop {
            let (_, h) = b.api.get(&format!("/sessions/{sid}/side")).await;
            if h["runs"][0]["outcome"] == "SIDE_OUTCOME_COMPLETED" {
                return h;
            }
            sse.next().await.expect("the stream goes on");
        }
    })
    .await
    .expect("the side run finishes within the deadline");
    assert_eq!(answered["runs"][0]["answer"], "echo: what now", "{answered}");
    let (code, c) = b
        .api
        .post(&format!("/sessions/{sid}/side/cancel"), json!({}))
        .await;
    assert_eq!((code, &c["cancelled"]), (200, &json!(false)), "{c}");

    // Undo, compact and clear through B act on A's session.
    let latest_now = a.api.latest_seq(&sid).await;
    assert!(latest_now > latest);
    let (code, u) = b.api.post(&format!("/sessions/{sid}/undo"), json!({})).await;
    assert_eq!(code, 200, "{u}");
    assert_eq!(u["upto_seq"], latest_now, "{u}");
    let (code, c) = b.api.post(&format!("/sessions/{sid}/compact"), json!({})).await;
    assert_eq!(code, 200, "{c}");
    let (code, c) = b.api.post(&format!("/sessions/{sid}/clear"), json!({})).await;
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["session_id"], sid.as_str());
    // Nothing is left: A's refusal reaches B's client unchanged.
    let (code, e) = b.api.post(&format!("/sessions/{sid}/undo"), json!({})).await;
    assert_eq!(
        (code, e["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );

    let (code, _) = b.api.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200);
    assert_eq!(lease_of(&kv, &sid).await.unwrap().replica, "ra", "B took nothing");
}

/// `DELETE /sessions/:id` sent to a replica that does not hold the session
/// is made by the holder: the session's subject is purged from the stream,
/// its summary leaves the shared index, its lease is given back, and every
/// replica's live streams of it end with `session_closed {reason:
/// "deleted"}`; from then on it is unknown everywhere (404), listed nowhere,
/// and a live run makes the delete 409 on any replica first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_through_any_replica_is_gone_from_the_stream_and_every_replica() {
    let (nats, a, b, sid, mut on_a) = two_replicas().await;
    let c = start(&nats, "rc").await;
    let (code, _) = b.api.run(&sid, "hello there").await;
    assert_eq!(code, 202);
    on_a.until("run_finished").await;
    let mut on_b = b.api.events(&sid, Some(0)).await;
    let mut on_c = c.api.events(&sid, Some(0)).await;
    for sse in [&mut on_b, &mut on_c] {
        sse.until("run_finished").await;
    }
    assert!(!stored_seqs(&nats, &sid).await.is_empty());
    let path = format!("/sessions/{sid}");

    // A live run makes the delete a conflict, on the holder and through C.
    let (code, _) = a.api.run(&sid, "/sleep 600000").await;
    assert_eq!(code, 202);
    let (code, e) = c.api.delete(&path).await;
    assert_eq!(code, 409, "{e}");
    let (code, _) = c.api.post(&format!("{path}/cancel"), json!({})).await;
    assert_eq!(code, 200);
    on_a.until("run_finished").await;

    let (code, v) = c.api.delete(&path).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, json!({"session_id": sid, "deleted": true}));
    for sse in [&mut on_a, &mut on_b, &mut on_c] {
        let tail = sse.until("session_closed").await;
        let closed = tail.last().unwrap().body();
        assert_eq!(closed["reason"], "deleted", "{closed}");
    }
    assert_eq!(
        stored_seqs(&nats, &sid).await,
        Vec::<u64>::new(),
        "the subject is purged"
    );
    assert_eq!(
        lease_of(&leases(&nats).await, &sid).await,
        None,
        "the lease is given back"
    );
    for r in [&a, &b, &c] {
        let (code, list) = r.api.get("/sessions").await;
        assert_eq!(code, 200);
        assert!(
            list["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["session_id"] != sid),
            "{list}"
        );
        let (code, e) = r.api.get(&format!("{path}/transcript")).await;
        assert_eq!(code, 404, "{e}");
    }
    let (code, e) = b.api.delete(&path).await;
    assert_eq!(code, 404, "{e}");
}

/// An approval answered on B and on A at once, for a tool call parked on
/// A: one answer wins, the other is 409, the call runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_answered_on_another_replica_resolves_the_parked_call_exactly_once() {
    let (_nats, a, b, sid, mut sse) = two_replicas().await;
    let (code, _) = b.api.run(&sid, "/write notes.md hello there").await;
    assert_eq!(code, 202);
    let ask = sse.next_ask().await;
    let rid = ask["request_id"].as_str().unwrap();
    let path = format!("/sessions/{sid}/approvals/{rid}");
    let yes = json!({"approve": true});
    let (on_b, on_a) = tokio::join!(b.api.post(&path, yes.clone()), a.api.post(&path, yes.clone()));
    let mut codes = [on_a.0, on_b.0];
    codes.sort();
    assert_eq!(codes, [200, 409], "{on_a:?} {on_b:?}");
    let run = sse.until("run_finished").await;
    assert_eq!(finished(&run)["outcome"], "completed");
    let resolved: Vec<&Value> = run
        .iter()
        .filter(|f| f.event == "approval_resolved")
        .map(|f| f.body())
        .collect();
    assert_eq!(resolved.len(), 1, "{run:?}");
    assert_eq!(resolved[0]["outcome"], "approved");
    let results: Vec<&Value> = run
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| f.body())
        .collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["ok"], true);
    let written = std::fs::read_to_string(a.workspace().join("notes.md")).unwrap();
    assert_eq!(written, "hello there");
    // Answered again on B later: 409, as on the owner.
    let (code, body) = b.api.post(&path, yes).await;
    assert_eq!(code, 409, "{body}");
}

/// The owner is SIGKILLed mid-run: a client that reconnects to another
/// replica with its Last-Event-ID waits out the lease, and that replica
/// takes the session, settles the interrupted run and goes on; no seq is
/// lost or reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_session_moves_to_another_replica_which_settles_the_run_and_goes_on() {
    let (nats, a, b, sid, mut sse) = two_replicas().await;
    let c = start(&nats, "rc").await;
    let kv = leases(&nats).await;
    let mut seen = paced_run(&a, &sid, &mut sse).await;
    let cursor = seen.last().unwrap().seq();
    a.vak.kill().await;
    drop(sse);

    let mut sse = b.api.events(&sid, Some(cursor)).await;
    let rest = sse.until("run_finished").await;
    seen.extend(rest.iter().cloned());
    assert_numbered(&seen);
    let n = paced(&seen).len() as u64;
    assert_eq!(paced(&seen), (0..n).collect::<Vec<_>>(), "every delta once");
    let fin = finished(&rest);
    assert_eq!(fin["outcome"], "failed");
    assert_eq!(fin["message"], "interrupted: the server stopped during this run");
    assert_eq!(lease_of(&kv, &sid).await.unwrap().replica, "rb");

    // The session goes on at B, with a run sent to C.
    let (code, adm) = c.api.run(&sid, "again").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let more = sse.until("run_finished").await;
    assert_eq!(more[0].seq(), rest.last().unwrap().seq() + 1);
    assert_eq!(text_of(&more), "echo: again");
    let stored = stored_seqs(&nats, &sid).await;
    let last = more.last().unwrap().seq();
    assert_eq!(stored, (1..=last).collect::<Vec<_>>(), "every seq stored once");
}

/// The owner is SIGSTOPped past its lease; another replica takes over and
/// settles the run. SIGCONT: the old owner's next append is refused (the
/// CAS chain fences it) or its renewal finds the lease gone, either way its
/// streams end with the reason, and it stores and shows nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_stopped_past_its_lease_is_fenced_when_it_wakes_and_publishes_nothing_more() {
    let (nats, a, b, sid, mut on_a) = two_replicas().await;
    let seen = paced_run(&a, &sid, &mut on_a).await;
    let cursor = seen.last().unwrap().seq();
    a.vak.signal("STOP");

    let mut on_b = b.api.events(&sid, Some(cursor)).await;
    let rest = on_b.until("run_finished").await;
    let all: Vec<Frame> = seen.iter().chain(&rest).cloned().collect();
    assert_numbered(&all);
    let n = paced(&all).len() as u64;
    assert_eq!(paced(&all), (0..n).collect::<Vec<_>>(), "every delta once");
    assert_eq!(finished(&rest)["outcome"], "failed");

    a.vak.signal("CONT");
    let tail = on_a.until("session_closed").await;
    let reason = tail.last().unwrap().body()["reason"]
        .as_str()
        .unwrap()
        .to_string();
    eprintln!("the old owner's streams ended with: {reason}");
    assert!(
        reason.contains("another writer appended to this session") || reason.starts_with("lease_lost"),
        "{reason}\n{}",
        a.vak.log()
    );
    // Whatever A showed after the cursor is what the stream holds there.
    assert!(
        text_of(&rest).starts_with(&text_of(&tail)),
        "A showed text after seq {cursor} that B does not replay"
    );
    // And it stored nothing after B took over: B numbers on from its own last.
    let (code, adm) = b.api.run(&sid, "on b").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let more = on_b.until("run_finished").await;
    assert_eq!(more[0].seq(), rest.last().unwrap().seq() + 1);
    let last = more.last().unwrap().seq();
    assert_eq!(stored_seqs(&nats, &sid).await, (1..=last).collect::<Vec<_>>());
}

/// A run started on A, streamed live from B, resumed on C with the
/// Last-Event-ID B saw last: together exactly what A shows, no gap, no
/// duplicate; B and C only follow (A keeps the lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_one_replica_streams_from_a_second_and_resumes_exactly_on_a_third() {
    let (nats, a, b, sid, mut on_a) = two_replicas().await;
    let c = start(&nats, "rc").await;
    let kv = leases(&nats).await;
    let mut on_b = b.api.events(&sid, None).await;
    let (code, adm) = a.api.run(&sid, "/pace 3000 1500").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let after = adm["after_seq"].as_u64().unwrap();
    let mut seen = deltas(&mut on_b, 300).await;
    assert_eq!(seen[0].seq(), after + 1, "B shows the run from its first frame");
    assert_eq!(seen[0].event, "status");
    drop(on_b);
    let cursor = seen.last().unwrap().seq();
    let mut on_c = c.api.events(&sid, Some(cursor)).await;
    seen.extend(on_c.until("run_finished").await);
    assert_numbered(&seen);
    let on_owner = on_a.until("run_finished").await;
    assert_eq!(finished(&seen)["outcome"], "completed");
    assert_eq!(paced(&seen), (0..3000).collect::<Vec<_>>(), "every delta once");
    assert_eq!(text_of(&seen), text_of(&on_owner));
    assert_eq!(not_deltas(&seen), not_deltas(&on_owner));
    assert_eq!(seen.last().unwrap().seq(), on_owner.last().unwrap().seq());
    assert_eq!(lease_of(&kv, &sid).await.unwrap().replica, "ra");
    // A reader of the mirror sees the next run too, and the transcript there is A's.
    let mut on_c = c.api.events(&sid, Some(cursor)).await;
    let (code, _) = c.api.run(&sid, "next").await;
    assert_eq!(code, 202);
    let next = loop {
        let frames = on_c.until("run_finished").await;
        if text_of(&frames).contains("echo: next") {
            break frames;
        }
    };
    assert_eq!(finished(&next)["outcome"], "completed");
    let (_, on_c_transcript) = c.api.get(&format!("/sessions/{sid}/transcript")).await;
    let (_, on_a_transcript) = a.api.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(on_c_transcript, on_a_transcript);
}

/// The NATS node a following replica is connected to is SIGKILLed mid-run:
/// it reconnects to another node, and what the stream stored while its
/// live path was down is read back from the stream, never skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_nats_node_dies_fills_the_gap_from_the_stream() {
    let mut nats = Cluster::three().await;
    // A lease longer than NATS takes to elect new leaders: with 1.5 s it
    // may expire meanwhile, and B would (safely) take the session over.
    let a = start_on(&nats.node_url(0), "ra", "10000").await;
    let b = start_on(&nats.node_url(1), "rb", "10000").await;
    let sid = a.api.create_session().await;
    let mut on_a = a.api.events(&sid, None).await;
    let mut on_b = b.api.events(&sid, None).await;
    let (code, _) = a.api.run(&sid, "/pace 2000 400").await;
    assert_eq!(code, 202);
    // A's own reader keeps up, so what it shows is the writer's live view.
    let on_owner = tokio::spawn(async move { on_a.until("run_finished").await });
    let mut seen = deltas(&mut on_b, 100).await;
    nats.kill(1);
    seen.extend(on_b.until("run_finished").await);
    assert_numbered(&seen);
    assert_eq!(paced(&seen), (0..2000).collect::<Vec<_>>(), "every delta once");
    let on_owner = on_owner.await.unwrap();
    // Whether messages were published while B reconnected depends on the
    // stream's leader (appends stall too when it was on the killed node).
    eprintln!(
        "gap filled by B: {}",
        b.vak.log().contains("the live path missed messages")
    );
    assert_eq!(text_of(&seen), text_of(&on_owner));
    assert_eq!(not_deltas(&seen), not_deltas(&on_owner));
}

/// The NATS node that leads the stream is SIGKILLed mid-run: the
/// writer's appends stall while the other two elect a leader, then resume
/// with the same ids; the run completes, a reader on another replica and
/// the stream itself hold every seq once, none lost, repeated or reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_leaders_nats_node_killed_mid_run_stalls_appends_which_resume_with_no_seq_lost_or_reused()
{
    let mut nats = Cluster::three().await;
    // A lease longer than NATS takes to elect new leaders (as above).
    let a = start_on(&nats.url(), "ra", "10000").await;
    let b = start_on(&nats.url(), "rb", "10000").await;
    let sid = a.api.create_session().await;
    let client = nats_client(&nats).await;
    let leader = support::nats::stream_leader(&client, vak::core::cluster::jetstream::STREAM).await;
    let victim = nats.index_of(&leader).expect("the leader is one of ours");
    let mut on_a = a.api.events(&sid, None).await;
    let mut on_b = b.api.events(&sid, None).await;
    let (code, _) = b.api.run(&sid, "/pace 2000 400").await;
    assert_eq!(code, 202);
    let on_owner = tokio::spawn(async move { on_a.until("run_finished").await });
    let mut seen = deltas(&mut on_b, 100).await;
    nats.kill(victim);
    seen.extend(on_b.until("run_finished").await);
    assert_numbered(&seen);
    assert_eq!(paced(&seen), (0..2000).collect::<Vec<_>>(), "every delta once");
    assert_eq!(finished(&seen)["outcome"], "completed", "{}", nats.logs());
    let on_owner = on_owner.await.unwrap();
    assert_eq!(text_of(&seen), text_of(&on_owner));
    assert_eq!(not_deltas(&seen), not_deltas(&on_owner));
    let last = seen.last().unwrap().seq();
    assert_eq!(stored_seqs(&nats, &sid).await, (1..=last).collect::<Vec<_>>());
    // And it numbers on from there.
    let (code, _) = a.api.run(&sid, "after the election").await;
    assert_eq!(code, 202);
    let more = on_b.until("run_finished").await;
    assert_eq!(more[0].seq(), last + 1);
    assert_numbered(&more);
    let leader_now = support::nats::stream_leader(&client, vak::core::cluster::jetstream::STREAM).await;
    assert_ne!(leader_now, leader, "a new leader was elected");
}

/// A stream that keeps 40 messages per session (`max_msgs_per_subject`)
/// and a ring of 8: a cursor into history the stream dropped gets
/// `resync {reason: "history_unavailable"}` on the holder and on another
/// replica; a session left idle keeps its head seq, and a replica that
/// loads it from what is retained numbers on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_older_than_the_retained_history_resyncs_and_keeps_its_head_seq() {
    let nats = Cluster::three().await;
    let js = async_nats::jetstream::new(nats_client(&nats).await);
    let opts = vak::core::cluster::jetstream::StreamOptions {
        replicas: 3,
        history: 40,
        ..Default::default()
    };
    js.create_stream(vak::core::cluster::jetstream::stream_config(&opts))
        .await
        .unwrap();
    let ring = ["--ring", "8"];
    let a = start_with(&nats.url(), "ra", TTL_MS, &ring).await;
    let b = start_with(&nats.url(), "rb", TTL_MS, &ring).await;
    let sid = a.api.create_session().await;
    let mut sse = a.api.events(&sid, None).await;
    // Paced so that most batches are one delta: far more than 40 messages
    // (a batch's deltas go as one message, a pack, and history counts messages).
    let (code, _) = a.api.run(&sid, "/pace 300 500").await;
    assert_eq!(code, 202);
    let run = sse.until("run_finished").await;
    let head = run.last().unwrap().seq();
    assert!(head > 300, "{head}");
    let stored = stored_seqs(&nats, &sid).await;
    assert!(
        stored.first() > Some(&1) && stored.last() == Some(&head),
        "the stream dropped the oldest: {stored:?}"
    );

    for r in [&a, &b] {
        let mut old = r.api.events(&sid, Some(1)).await;
        let first = old.next().await.expect("a frame");
        assert_eq!(first.event, "resync", "{:?}", first);
        assert_eq!(first.body()["reason"], "history_unavailable", "{:?}", first);
        assert_eq!(first.body()["latest_seq"], head);
    }
    // A stops: the session is idle, its lease free. B loads it from what
    // the stream kept: the same head, and the next run numbers on.
    assert!(a.vak.terminate().await.success());
    let mut on_b = b.api.events(&sid, Some(head)).await;
    assert_eq!(on_b.opened.as_ref().unwrap().body()["latest_seq"], head);
    let (code, adm) = b.api.run(&sid, "after a while").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    let more = on_b.until("run_finished").await;
    assert_eq!(more[0].seq(), head + 1);
    assert_numbered(&more);
    assert_eq!(finished(&more)["outcome"], "completed");
}

/// A replica name that is not one subject token, and a lease age under
/// the floor, stop `vak serve --bus` at startup with one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_replica_name_or_lease_age_stops_startup_with_one_line() {
    let nats = Cluster::single().await;
    let home = tempfile::tempdir().unwrap();
    for (flag, value, says) in [
        ("--bus-replica", "r.1", "replica name \"r.1\""),
        ("--bus-lease-ttl-ms", "100", "--bus-lease-ttl-ms"),
    ] {
        let out = Serve::new()
            .no_token()
            .no_workspace()
            .home(home.path())
            .args(["--bus", &nats.url(), flag, value])
            .output()
            .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: {stderr}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
    }
}

/// One `/stream` over two sessions written by two replicas, read on a
/// third, then resumed on the first with the cursor vector of the last
/// frame read: every event of both sessions once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_vector_over_sessions_of_two_writers_resumes_exactly_on_another_replica() {
    let (nats, a, b, s1, _on_a) = two_replicas().await;
    let c = start(&nats, "rc").await;
    let s2 = b.api.create_session().await;
    let query = sessions_query(&[&s1, &s2]);
    let mut on_c = c.api.open_stream(&c.api.url, &query, None).await;
    for (r, s) in [(&a, &s1), (&b, &s2)] {
        let (code, adm) = r.api.run(s, "/pace 400 400").await;
        assert_eq!((code, adm["state"].as_str()), (202, Some("started")), "{adm}");
    }
    let mut frames = Vec::new();
    while frames.iter().filter(|f: &&Frame| f.event == "agent").count() < 150 {
        frames.push(on_c.next().await.expect("the stream goes on"));
    }
    let vector = frames
        .iter()
        .rev()
        .find_map(|f| f.id.clone())
        .expect("a frame with a cursor");
    drop(on_c);
    let mut on_a = a.api.open_stream(&a.api.url, &query, Some(&vector)).await;
    let finished = |frames: &[Frame]| {
        frames
            .iter()
            .filter(|f| f.event == "agent" && agent_kind(&f.data) == "run_finished")
            .count()
    };
    while finished(&frames) < 2 {
        frames.push(on_a.next().await.expect("the stream goes on"));
    }
    for sid in [&s1, &s2] {
        let mine: Vec<Frame> = frames
            .iter()
            .filter(|f| f.event == "agent" && f.data["session_id"] == sid.as_str())
            .map(|f| Frame {
                id: Some(f.data["seq"].to_string()),
                event: agent_kind(&f.data),
                data: f.data.clone(),
            })
            .collect();
        assert_numbered(&mine);
        assert_eq!(
            paced(&mine),
            (0..400).collect::<Vec<_>>(),
            "{sid}: every delta once"
        );
        assert_eq!(mine.last().unwrap().event, "run_finished");
    }
}

/// A reader following a session on a replica that is not its writer, when
/// the writer is SIGKILLed: that replica waits out the lease by itself,
/// takes the session over and settles the run, and the reader sees it
/// with every delta once, without sending another request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_a_mirror_sees_the_run_of_a_killed_writer_settled_there() {
    let (nats, a, b, sid, mut on_a) = two_replicas().await;
    let kv = leases(&nats).await;
    let mut on_b = b.api.events(&sid, None).await;
    let seen_on_a = paced_run(&a, &sid, &mut on_a).await;
    let mut seen = deltas(&mut on_b, 40).await;
    a.vak.kill().await;
    seen.extend(on_b.until("run_finished").await);
    assert_numbered(&seen);
    let n = paced(&seen).len() as u64;
    assert!(n >= paced(&seen_on_a).len() as u64);
    assert_eq!(paced(&seen), (0..n).collect::<Vec<_>>(), "every delta once");
    let fin = finished(&seen);
    assert_eq!(fin["outcome"], "failed");
    assert_eq!(fin["message"], "interrupted: the server stopped during this run");
    assert_eq!(lease_of(&kv, &sid).await.unwrap().replica, "rb");
}

/// The next `config` frame of a `/stream?config=1`.
async fn next_config(sse: &mut Sse) -> Value {
    loop {
        let f = sse.next().await.expect("the stream goes on");
        if f.event == "config" {
            return f.data;
        }
    }
}

async fn patch_config(r: &Replica, body: Value) -> (u16, Value) {
    r.api.send(reqwest::Method::PATCH, "/config", Some(body)).await
}

/// `PATCH /config` on one replica changes the route of every replica (the
/// bucket VAK_CONFIG, which each watches): config frames on every replica
/// carry it with one revision, a change based on an older revision is
/// refused on another replica, of two changes based on one revision made
/// on two replicas at once exactly one is made, and a replica started
/// later takes the bucket's route over its own flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_patched_on_one_replica_is_every_replicas_and_a_stale_revision_is_refused_on_another() {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra").await;
    let b = start(&nats, "rb").await;
    let mut on_a = a.api.open_stream(&a.api.url, "config=1", None).await;
    let mut on_b = b.api.open_stream(&b.api.url, "config=1", None).await;
    let first = next_config(&mut on_a).await;
    assert_eq!(next_config(&mut on_b).await, first, "one route, one revision");
    let rev0 = first["revision"].as_str().unwrap().to_string();
    assert!(rev0.starts_with("bus-"), "{first}");

    let (code, v) = patch_config(
        &a,
        json!({"provider": "openai", "model": "gpt-shared", "base_url": "http://127.0.0.1:9/v1", "revision": rev0}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    // Nothing listens there: applied, with a warning only the PATCH's answer carries.
    assert_eq!(
        v["warnings"],
        json!(["http://127.0.0.1:9/v1 not reachable: connection refused"])
    );
    let mut v = v;
    v["warnings"] = json!([]);
    let rev1 = v["revision"].as_str().unwrap().to_string();
    assert_ne!(rev1, rev0);
    assert_eq!(v["route"]["model"], "gpt-shared");
    for sse in [&mut on_a, &mut on_b] {
        assert_eq!(next_config(sse).await, v, "the config frame of every replica");
    }
    assert_eq!(b.api.get("/config").await, (200, v.clone()));

    // A change based on the revision before it is refused on the other replica.
    let (code, e) = patch_config(&b, json!({"model": "gpt-late", "revision": rev0})).await;
    assert_eq!(code, 409, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("stale revision") && msg.contains(&rev1), "{e}");

    // Two changes based on one revision, on two replicas at once: one is made.
    let (x, y) = tokio::join!(
        patch_config(&a, json!({"model": "gpt-x", "revision": rev1})),
        patch_config(&b, json!({"model": "gpt-y", "revision": rev1})),
    );
    let mut codes = [x.0, y.0];
    codes.sort();
    assert_eq!(codes, [200, 409], "{x:?} {y:?}");
    let won = if x.0 == 200 { x.1 } else { y.1 };
    for sse in [&mut on_a, &mut on_b] {
        assert_eq!(next_config(sse).await, won);
    }
    for r in [&a, &b] {
        assert_eq!(r.api.get("/config").await, (200, won.clone()));
    }
    // Without a revision, both are made, one after the other.
    let (x, y) = tokio::join!(
        patch_config(&a, json!({"model": "gpt-p"})),
        patch_config(&b, json!({"model": "gpt-q"})),
    );
    assert_eq!((x.0, y.0), (200, 200), "{x:?} {y:?}");
    let number = |v: &Value| -> u64 { v["revision"].as_str().unwrap()["bus-".len()..].parse().unwrap() };
    assert_ne!(number(&x.1), number(&y.1));
    let won = if number(&x.1) > number(&y.1) { x.1 } else { y.1 };

    // A replica started now takes the bucket's route over its flags.
    let c = start_with(&nats.url(), "rc", TTL_MS, &["--model", "from-flag"]).await;
    let (code, on_c) = c.api.get("/config").await;
    assert_eq!(code, 200);
    assert_eq!(
        (&on_c["route"], &on_c["revision"]),
        (&won["route"], &won["revision"])
    );
}

/// max_turns, theme and hooks are each replica's own (docs/protocol.md,
/// section 28): a change through one replica is checked against the shared
/// revision, leaves that revision and the other replica as they are, and
/// a stale revision is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_theme_and_hooks_stay_with_the_replica_that_changed_them() {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra").await;
    let b = start(&nats, "rb").await;
    let (_, before) = a.api.get("/config").await;
    let rev = before["revision"].as_str().unwrap().to_string();
    let (code, v) = patch_config(
        &a,
        json!({"max_turns": 4, "theme": "dark", "hooks": {"stop": [{"command": "true"}]}, "revision": rev}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (&v["max_turns"], &v["theme"], &v["revision"]),
        (&json!(4), &json!("dark"), &json!(rev))
    );
    assert_eq!(v["hooks"]["stop"][0]["command"], "true");
    let (_, on_b) = b.api.get("/config").await;
    assert_eq!(
        (&on_b["max_turns"], &on_b["theme"], &on_b["revision"]),
        (&json!(50), &json!("system"), &json!(rev))
    );
    // A route change moves the shared revision; the old one is stale for every setting.
    let (code, v) = patch_config(&b, json!({"model": "offline", "revision": rev})).await;
    assert_eq!(code, 200, "{v}");
    let (code, e) = patch_config(&a, json!({"max_turns": 5, "revision": rev})).await;
    assert_eq!(code, 409, "{e}");
}

/// Rules ListRules answers, minus nothing: the whole body.
async fn rules_on(r: &Replica) -> Value {
    let (code, v) = r.api.get("/permissions/rules").await;
    assert_eq!(code, 200, "{v}");
    v
}

/// An always-allow rule stored by an approval (answered through another
/// replica, made on the holder) is listed identically on every replica
/// sharing the workspace, lets a matching call run without asking on a
/// session another replica holds, and a delete on a replica that did not
/// store it removes it everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_rule_stored_on_the_holder_is_listed_and_applied_on_every_replica_and_deleted_from_any() {
    let nats = Cluster::three().await;
    let ws = tempfile::tempdir().unwrap();
    let start = |name: &'static str| {
        let url = nats.url();
        let ws = ws.path().to_path_buf();
        async move { start_in(&url, name, TTL_MS, &[], &ws).await }
    };
    let a = start("ra").await;
    let b = start("rb").await;
    let sid = a.api.create_session().await;
    let mut sse = a.api.events(&sid, None).await;
    let (code, _) = b.api.run(&sid, "/write notes.md one").await;
    assert_eq!(code, 202);
    let ask = sse.next_ask().await;
    let rid = ask["request_id"].as_str().unwrap();
    let (code, v) = b
        .api
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true, "always": true}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["persisted"], true, "{v}");
    let rule = v["rule"].clone();
    assert_eq!(
        (&rule["kind"], &rule["pattern"]),
        (&json!("path"), &json!("notes.md"))
    );
    assert_eq!(finished(&sse.until("run_finished").await)["outcome"], "completed");
    let listed = rules_on(&a).await;
    assert_eq!(listed["rules"], json!([rule]));
    assert_eq!(rules_on(&b).await, listed, "listed identically");

    // B, which did not store it, applies it to a session it holds.
    let sid_b = b.api.create_session().await;
    let mut sse_b = b.api.events(&sid_b, None).await;
    let (code, _) = b.api.run(&sid_b, "/write notes.md two").await;
    assert_eq!(code, 202);
    let run = sse_b.until("run_finished").await;
    assert!(
        run.iter().all(|f| f.event != "approval_requested"),
        "no ask: {run:?}"
    );
    assert_eq!(finished(&run)["outcome"], "completed");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.md")).unwrap(),
        "two"
    );

    // Deleted on B: gone on every replica, and A asks again.
    let id = rule["id"].as_str().unwrap();
    let (code, d) = b.api.delete(&format!("/permissions/rules/{id}")).await;
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["rule"], rule);
    for r in [&a, &b] {
        assert_eq!(rules_on(r).await["rules"], json!([]));
    }
    let (code, d) = a.api.delete(&format!("/permissions/rules/{id}")).await;
    assert_eq!(code, 404, "{d}");
    let (code, _) = a.api.run(&sid, "/write notes.md three").await;
    assert_eq!(code, 202);
    let ask = sse.next_ask().await;
    assert_eq!(ask["tool"], "write_file", "{ask}");
}

/// The openai entry of `GET /providers` on `r`.
async fn openai_on(r: &Replica) -> Value {
    let (code, v) = r.api.get("/providers").await;
    assert_eq!(code, 200, "{v}");
    let all = v["providers"].as_array().unwrap();
    all.iter().find(|p| p["name"] == "openai").unwrap().clone()
}

/// A key stored with `PUT /config/key` on one replica is sealed with the
/// cluster secret into VAK_CONFIG (never a plaintext key in NATS), shown
/// with the same fingerprint and used on every replica given the secret,
/// and revoked everywhere by a `DELETE` on any; a replica without the
/// secret refuses to store or delete one (403 `no_bus_secret`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_stored_on_one_replica_is_used_on_every_replica_revoked_from_any_and_never_in_nats_in_plaintext(
) {
    const KEY: &str = "sk-cluster-7c1d9e2f4a6b8c0d1e3f5a7b9c2d4e6f";
    let nats = Cluster::three().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("bus-secret");
    std::fs::write(
        &secret,
        "4f1e9a0c7b2d5e8f3a6c9b0d2e4f6a8c1b3d5e7f9a0c2e4b6d8f0a1c3e5b7d9f\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let flags = ["--bus-secret-file", secret.to_str().unwrap()];
    let a = start_with(&nats.url(), "ra", TTL_MS, &flags).await;
    let b = start_with(&nats.url(), "rb", TTL_MS, &flags).await;
    let c = start(&nats, "rc").await;
    let fake = FakeProvider::start().await;
    let mut on_b = b.api.open_stream(&b.api.url, "config=1", None).await;
    next_config(&mut on_b).await;
    let base = format!("{}/v1", fake.url);
    let (code, v) = patch_config(
        &a,
        json!({"provider": "openai", "model": "gpt-4.1", "base_url": base}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(next_config(&mut on_b).await["route"]["base_url"], base);

    let (code, v) = a
        .api
        .send(
            reqwest::Method::PUT,
            "/config/key",
            Some(json!({"provider": "openai", "key": KEY})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let fp = v["fingerprint"].clone();
    for r in [&a, &b] {
        let openai = openai_on(r).await;
        assert_eq!(
            (&openai["fingerprints"], &openai["key_sources"]),
            (&json!([fp]), &json!(["store"])),
            "{openai}"
        );
    }
    // B asks the service with the key A stored.
    fake.script([Reply::status(200, &fixture("openai/models.json"))]);
    let (code, v) = b.api.get("/providers/openai/models").await;
    assert_eq!(code, 200, "{v}");
    let asked = fake.requests();
    assert_eq!(
        asked.last().unwrap().header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );

    // NATS holds it sealed: no value of the bucket has the key's bytes.
    let js = async_nats::jetstream::new(nats_client(&nats).await);
    let kv = js.get_key_value("VAK_CONFIG").await.unwrap();
    let sealed = kv.get("key.openai").await.unwrap().expect("the sealed key");
    assert!(sealed.starts_with(b"VAKBK1"), "sealed");
    let mut values = kv.watch_with_history(">").await.unwrap();
    let mut seen = 0;
    while let Some(entry) = tokio::time::timeout(DEADLINE, values.next()).await.unwrap() {
        let entry = entry.unwrap();
        seen += 1;
        assert!(
            !entry.value.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "{} holds the key in plaintext",
            entry.key
        );
        if entry.delta == 0 {
            break;
        }
    }
    assert!(seen >= 2, "the route and the key");

    // A replica without the secret neither has it nor stores or deletes one.
    assert_eq!(openai_on(&c).await["fingerprints"], json!([]));
    for (method, body) in [
        (reqwest::Method::PUT, json!({"provider": "openai", "key": KEY})),
        (reqwest::Method::DELETE, json!({"provider": "openai"})),
    ] {
        let (code, e) = c.api.send(method, "/config/key", Some(body)).await;
        assert_eq!(code, 403, "{e}");
        assert_eq!(e["error"]["reason"], "no_bus_secret", "{e}");
    }

    // Revoked on B: gone on every replica, and the service is asked without it.
    let (code, v) = b
        .api
        .send(
            reqwest::Method::DELETE,
            "/config/key",
            Some(json!({"provider": "openai"})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v,
        json!({"provider": "openai", "deleted": true, "shadowed_by_env": false})
    );
    for r in [&a, &b] {
        assert_eq!(openai_on(r).await["fingerprints"], json!([]));
    }
    fake.script([Reply::status(200, &fixture("openai/models.json"))]);
    let (code, v) = a.api.get("/providers/openai/models").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(fake.requests().last().unwrap().header("authorization"), None);
}

/// A fork made on a replica that does not hold the parent is a new subject
/// holding the parent's events up to `at_seq`, seq for seq, written by the
/// replica that made it; it goes on with its own seqs through any replica,
/// and the parent is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_made_on_any_replica_is_a_new_subject_with_the_parents_events_up_to_at_seq() {
    let (nats, a, b, sid, mut on_a) = two_replicas().await;
    let mut parent = Vec::new();
    for prompt in ["first alpha", "second beta"] {
        let (code, _) = b.api.run(&sid, prompt).await;
        assert_eq!(code, 202);
        parent.push(on_a.until("run_finished").await);
    }
    let cut = parent[0].last().unwrap().seq();
    let latest = parent[1].last().unwrap().seq();
    let path = format!("/sessions/{sid}/fork");
    let (code, f) = b.api.post(&path, json!({"at_seq": cut})).await;
    assert_eq!(code, 201, "{f}");
    assert_eq!((&f["parent_id"], &f["at_seq"]), (&json!(sid), &json!(cut)));
    let child = f["session"]["session_id"].as_str().unwrap().to_string();
    assert_ne!(child, sid);
    assert_eq!(stored_seqs(&nats, &child).await, (1..=cut).collect::<Vec<_>>());

    // Read on A (which follows it): the parent's first run, seq for seq.
    let mut on_child = a.api.events(&child, Some(0)).await;
    let copied = on_child.until("run_finished").await;
    let view = |frames: &[Frame]| {
        frames
            .iter()
            .map(|f| (f.seq(), f.event.clone(), f.body().clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(view(&copied), view(&parent[0]));
    // It goes on with its own seqs, written by B (the run sent to A is forwarded).
    let (code, _) = a.api.run(&child, "third gamma").await;
    assert_eq!(code, 202);
    let more = on_child.until("run_finished").await;
    assert_eq!(more[0].seq(), cut + 1);
    assert_numbered(&more);
    assert_eq!(text_of(&more), "echo: third gamma");
    assert_eq!(
        lease_of(&leases(&nats).await, &child).await.unwrap().replica,
        "rb"
    );
    // The parent is untouched; a fork without at_seq takes its latest seq.
    assert_eq!(stored_seqs(&nats, &sid).await, (1..=latest).collect::<Vec<_>>());
    let (code, f) = a.api.post(&path, json!({})).await;
    assert_eq!(code, 201, "{f}");
    assert_eq!(f["at_seq"], latest);
}

/// `POST /config/mode` on one replica is every replica's: each takes it up
/// as the answering one does (a pending approval there is denied, its run
/// cancelled, a config frame sent), and a replica started later starts in
/// it over its own `--permission-mode`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_mode_set_on_one_replica_is_every_replicas() {
    let nats = Cluster::three().await;
    let a = start(&nats, "ra").await;
    let b = start(&nats, "rb").await;
    let sid = b.api.create_session().await;
    let mut on_b = b.api.events(&sid, None).await;
    let (code, _) = b.api.run(&sid, "/write notes.md hello").await;
    assert_eq!(code, 202);
    on_b.next_ask().await;
    let mut config_b = b.api.open_stream(&b.api.url, "config=1", None).await;
    assert_eq!(next_config(&mut config_b).await["permission_mode"], "default");

    let (code, v) = a.api.post("/config/mode", json!({"mode": "plan"})).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["changed"], true);
    assert_eq!(next_config(&mut config_b).await["permission_mode"], "plan");
    let run = on_b.until("run_finished").await;
    let resolved = run
        .iter()
        .find(|f| f.event == "approval_resolved")
        .expect("resolved");
    assert_eq!(resolved.body()["outcome"], "denied", "{run:?}");
    assert_eq!(finished(&run)["outcome"], "cancelled");
    assert_eq!(b.api.get("/config").await.1["permission_mode"], "plan");

    let c = start_with(&nats.url(), "rc", TTL_MS, &["--permission-mode", "accept-edits"]).await;
    assert_eq!(c.api.get("/config").await.1["permission_mode"], "plan");
}

/// `GET /memory` on `r`.
async fn memory_on(r: &Replica) -> Value {
    let (code, v) = r.api.get("/memory").await;
    assert_eq!(code, 200, "{v}");
    v
}

/// Memory notes live in the bucket VAK_MEMORY: a note added on one replica
/// is listed identically on every replica sharing the workspace and reaches
/// the system prompt of a run another replica holds, a patch on one is seen
/// on another, a delete on a third removes it everywhere (a patch or delete
/// of it sent afterwards to any replica is 404, as in one process), adds
/// made at once on several replicas are all kept, and the 200-note bound
/// holds across replicas: of three adds racing for the last place, one is
/// made and two are 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_notes_changed_on_any_replica_are_every_replicas_and_reach_the_prompt_of_a_run_held_by_another(
) {
    let nats = Cluster::three().await;
    let fake = FakeProvider::start().await;
    let base = format!("{}/v1", fake.url);
    let ws = tempfile::tempdir().unwrap();
    let flags = ["--provider", "openai", "--model", "gpt-4.1", "--base-url", &base];
    let start = |name: &'static str| {
        let url = nats.url();
        let ws = ws.path().to_path_buf();
        async move { start_in(&url, name, TTL_MS, &flags, &ws).await }
    };
    let a = start("ra").await;
    let b = start("rb").await;
    let c = start("rc").await;

    // Added on A: listed identically on B and C.
    let (code, note) = a
        .api
        .post(
            "/memory",
            json!({"text": "CLUSTER-NOTE: run make test", "kind": "rule"}),
        )
        .await;
    assert_eq!(code, 201, "{note}");
    let (code, user) = a
        .api
        .post(
            "/memory",
            json!({"text": "USER-NOTE: call me Sam", "scope": "user"}),
        )
        .await;
    assert_eq!(code, 201, "{user}");
    let listed = memory_on(&a).await;
    assert_eq!(listed["notes"], json!([note, user]), "{listed}");
    for r in [&b, &c] {
        assert_eq!(memory_on(r).await, listed, "listed identically");
    }

    // A run held by C has both in its system prompt.
    let sid = c.api.create_session().await;
    let mut sse = c.api.events(&sid, None).await;
    fake.script([Reply::fixture("openai/text.sse")]);
    let (code, _) = c.api.run(&sid, "hello").await;
    assert_eq!(code, 202);
    assert_eq!(finished(&sse.until("run_finished").await)["outcome"], "completed");
    let system = fake.requests()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("- CLUSTER-NOTE: run make test") && system.contains("- USER-NOTE: call me Sam"),
        "{system}"
    );

    // Patched on B: C lists the new text, with the note's provenance kept.
    let id = note["id"].as_str().unwrap();
    let path = format!("/memory/{id}");
    let (code, patched) = b
        .api
        .send(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"text": "CLUSTER-NOTE: run make lint too"})),
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(
        (&patched["created_at"], &patched["kind"]),
        (&note["created_at"], &note["kind"])
    );
    assert_eq!(memory_on(&c).await["notes"], json!([patched, user]));

    // Deleted on C: gone everywhere; a patch or delete of it made after,
    // on any replica, finds nothing.
    let (code, gone) = c.api.delete(&path).await;
    assert_eq!(code, 200, "{gone}");
    assert_eq!(gone["note"], patched);
    for r in [&a, &b, &c] {
        assert_eq!(memory_on(r).await["notes"], json!([user]));
    }
    let (code, e) = a
        .api
        .send(reqwest::Method::PATCH, &path, Some(json!({"text": "too late"})))
        .await;
    assert_eq!(
        (code, e["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{e}"
    );
    let (code, e) = b.api.delete(&path).await;
    assert_eq!(code, 404, "{e}");

    // Adds made at once through every replica are all kept.
    let adds = [&a, &b, &c].map(|r| async move {
        let mut made = Vec::new();
        for i in 0..5 {
            let (code, n) = r
                .api
                .post("/memory", json!({"text": format!("racing {i}"), "scope": "user"}))
                .await;
            assert_eq!(code, 201, "{n}");
            made.push(n["id"].as_str().unwrap().to_string());
        }
        made
    });
    let made: Vec<String> = futures_util::future::join_all(adds).await.concat();
    let listed = memory_on(&b).await;
    let ids: Vec<&str> = listed["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 1 + made.len(), "{listed}");
    assert!(made.iter().all(|m| ids.contains(&m.as_str())), "{listed}");

    // The bound holds across replicas: filled to one short of 200, three
    // adds race for the last place; one is made, two are refused.
    let max = listed["max_notes"].as_u64().unwrap() as usize;
    let replicas = [&a, &b, &c];
    for i in ids.len()..max - 1 {
        let (code, n) = replicas[i % 3]
            .api
            .post("/memory", json!({"text": format!("fact {i}"), "scope": "user"}))
            .await;
        assert_eq!(code, 201, "{n}");
    }
    let last = replicas.map(|r| async move {
        r.api
            .post("/memory", json!({"text": "the last place", "scope": "user"}))
            .await
    });
    let answers = futures_util::future::join_all(last).await;
    let made: Vec<_> = answers.iter().filter(|(code, _)| *code == 201).collect();
    assert_eq!(made.len(), 1, "{answers:?}");
    for (code, e) in answers.iter().filter(|(code, _)| *code != 201) {
        assert_eq!(*code, 429, "{e}");
        assert_eq!(e["error"]["code"], "resource_exhausted", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains("200 notes"),
            "{e}"
        );
    }
    for r in [&a, &b, &c] {
        assert_eq!(memory_on(r).await["notes"].as_array().unwrap().len(), max);
    }
}

/// Notes already in a replica's home go into VAK_MEMORY once, when a
/// replica first reads a tier the bucket never held: a file too large for
/// the bucket stays out (that replica lists nothing rather than failing),
/// the next replica's file is imported, preamble and notes, and from then
/// on every replica lists the bucket's tier whatever its own file says,
/// and no file is rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notes_in_a_home_are_imported_once_by_the_first_replica_that_reads_them() {
    let nats = Cluster::three().await;
    let ws = tempfile::tempdir().unwrap();
    let note = |id: &str, text: &str| {
        format!("<!-- vak:note id={id} created_at=2026-12-01T00:00:00Z updated_at=2026-12-01T00:00:00Z -->\n{text}\n")
    };
    let homes = [
        "# too big\n".to_string() + &"x".repeat(1_030_000) + "\n" + &note("mem_00000000000a", "BIG-NOTE"),
        format!(
            "# Sam's profile\nI like tabs.\n\n{}",
            note("mem_00000000000b", "B-NOTE: call me Sam")
        ),
        note("mem_00000000000c", "C-NOTE: never imported"),
    ];
    // Dropped after the replicas that use them.
    let mut homes_kept = Vec::new();
    let mut replicas = Vec::new();
    let mut files = Vec::new();
    for (name, text) in ["ra", "rb", "rc"].into_iter().zip(homes) {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("USER.md"), &text).unwrap();
        files.push((home.path().join("USER.md"), text));
        let r = start_home(&nats.url(), name, TTL_MS, &[], ws.path(), home.path()).await;
        homes_kept.push(home);
        replicas.push(r);
    }
    let [a, b, c] = [&replicas[0], &replicas[1], &replicas[2]];
    // A's file is past what the bucket holds: not imported, nothing listed.
    assert_eq!(memory_on(a).await["notes"], json!([]));
    // B's is imported; C and A list it, not their own.
    let listed = memory_on(b).await;
    let notes = listed["notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1, "{listed}");
    assert_eq!(
        (&notes[0]["id"], &notes[0]["text"], &notes[0]["scope"]),
        (
            &json!("mem_00000000000b"),
            &json!("B-NOTE: call me Sam"),
            &json!("user")
        )
    );
    for r in [c, a] {
        assert_eq!(memory_on(r).await, listed);
    }
    // The preamble came along: a change through C keeps it.
    let (code, added) = c
        .api
        .post("/memory", json!({"text": "C-ADDED", "scope": "user"}))
        .await;
    assert_eq!(code, 201, "{added}");
    let js = async_nats::jetstream::new(nats_client(&nats).await);
    let kv = js.get_key_value("VAK_MEMORY").await.unwrap();
    let tier = String::from_utf8(kv.get("user").await.unwrap().unwrap().to_vec()).unwrap();
    assert!(
        tier.starts_with("# Sam's profile\nI like tabs.\n")
            && tier.contains("B-NOTE")
            && tier.contains("C-ADDED"),
        "{tier}"
    );
    assert!(!tier.contains("C-NOTE") && !tier.contains("BIG-NOTE"), "{tier}");
    // No home's file was touched.
    for (path, text) in files {
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "{}",
            path.display()
        );
    }
}
