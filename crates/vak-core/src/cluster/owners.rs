//! Which replica writes each session when several share NATS (`--bus`): a lease per session in the KV bucket `VAK_OWNERS`, created or updated by revision, renewed at a third of its age, released by revision.
//!
//! **Lease.** The key is the session id; the value names the replica and
//! the URL it serves on (`Owner`). A replica takes a free lease with a KV
//! create (it fails if the key holds a value), renews it every third of the
//! bucket's `max_age` with an update that expects the revision it wrote
//! last, and releases it on unload or clean shutdown with a delete that
//! expects that revision. The bucket's `max_age` is the lease's time to
//! live: a lease nobody renews is dropped by the server, and the next
//! create wins it. The age is the server's clock, never a replica's.
//!
//! **Liveness, not safety.** A replica opens a session for writing only
//! while it holds the lease; safety still comes from the log's CAS chain
//! (`jetstream.rs`): a stale owner's next append is fenced. A renewal that
//! finds the revision moved and the value naming another replica (it took
//! the lease after it expired) or none loses the lease: whoever watches it
//! (`Claim::Mine`) hears why and stops writing at once. A renewal that
//! fails because NATS is unavailable is tried again: nobody can take the
//! lease meanwhile either. One whose ack was lost moved the revision
//! itself: the value still names this replica, and its revision is adopted.
//!
//! **Ping.** Every replica answers `vak.rpc.<replica>.ping`; a lease whose
//! owner does not answer is waited out (up to its age) and then taken:
//! that is failover after a crash or a stop. A ping whose payload is a
//! session id is also asked whether the replica holds that session
//! (`Holding`): core NATS answers it while JetStream elects a leader.
//!
//! **An election longer than the lease.** A holder whose renewals stall
//! (the bucket's leader died) may see its lease expire although it is
//! alive. A replica about to take a free lease therefore first asks the
//! replica that last wrote the session (`Vak-Replica` on the subject's
//! last message, `takeover.rs`) and leaves the session to it while it
//! says it holds it; and the holder, when NATS is back and its renewal
//! finds the key gone (expired, nobody took it), takes it again at once.

use crate::cluster::takeover::last_writer;
use crate::error::{Error, ErrorKind, Result};
use crate::stopped::Stopped;
use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The KV bucket of leases.
pub const BUCKET: &str = "VAK_OWNERS";
/// A replica answers requests on `vak.rpc.<replica>.<method>`.
pub const RPC_PREFIX: &str = "vak.rpc.";
/// The default lease age (`--bus-lease-ttl-ms`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
pub use crate::stopped::LEASE_LOST;
/// How long a ping waits for the owner's answer.
const PING_TIMEOUT: Duration = Duration::from_millis(500);

/// How many pings a silent last writer gets before its session is taken
/// (each waits up to the ping timeout): a replica whose NATS node died
/// answers again once its client has moved to another node.
const ASKS: usize = 3;

/// A replica's answer to a ping naming a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holding {
    /// Whether it holds (and renews) that session's lease, expired or not.
    pub holds: bool,
    /// Where it serves clients.
    pub url: String,
}

/// Who holds a lease: a lease's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub replica: String,
    /// Where that replica serves clients (for a person, and for redirects).
    pub url: String,
}

/// What claiming a session's lease found.
pub enum Claim {
    /// This replica holds it. The watch turns `Some(reason)` when the lease
    /// is lost, and ends (the sender dropped) when it is released.
    Mine(watch::Receiver<Option<Stopped>>),
    /// A live replica holds it.
    Theirs(Owner),
}

struct Held {
    revision: u64,
    lost: watch::Sender<Option<Stopped>>,
}

/// This replica's leases.
pub struct Owners {
    client: async_nats::Client,
    kv: kv::Store,
    replica: String,
    url: Mutex<String>,
    ttl: Duration,
    held: Mutex<HashMap<String, Held>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owners")
            .field("replica", &self.replica)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn nats_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{what}: {e}"))
}

/// A replica name: one subject token, `r_` and 12 hex digits by default.
pub fn new_replica_name() -> String {
    format!("r_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

impl Owners {
    /// Opens the bucket (creating it with `ttl` as its age, `replicas`
    /// copies, if it is missing: an existing bucket keeps its own age),
    /// answers pings as `replica`, and renews leases until `release_all`.
    pub async fn open(
        client: async_nats::Client,
        replica: String,
        ttl: Duration,
        replicas: usize,
    ) -> Result<Arc<Owners>> {
        if !crate::cluster::jetstream::subject_safe(&replica) {
            return Err(Error::invalid(format!(
                "replica name {replica:?}: 1 to 128 of A-Z a-z 0-9 _ -"
            )));
        }
        if ttl < Duration::from_millis(300) {
            return Err(Error::invalid("the lease age is at least 300 ms"));
        }
        let kv = crate::cluster::jetstream::key_value(
            &client,
            kv::Config {
                bucket: BUCKET.into(),
                description: "vak: which replica writes each session".into(),
                history: 1,
                max_age: ttl,
                storage: async_nats::jetstream::stream::StorageType::File,
                num_replicas: replicas.max(1),
                ..Default::default()
            },
        )
        .await?;
        let mut stream = kv.stream.clone();
        let age = stream
            .info()
            .await
            .map_err(|e| nats_error("cannot read the lease bucket", e))?
            .config
            .max_age;
        if age.is_zero() {
            return Err(Error::invalid(
                "the bucket VAK_OWNERS has no max_age: leases would never expire",
            ));
        }
        let owners = Arc::new(Owners {
            client: client.clone(),
            kv,
            replica,
            url: Mutex::new(String::new()),
            ttl: age,
            held: Mutex::new(HashMap::new()),
            stop: CancellationToken::new(),
        });
        let mut pings = client
            .subscribe(format!("{RPC_PREFIX}{}.ping", owners.replica))
            .await
            .map_err(|e| nats_error("cannot answer pings", e))?;
        let stop = owners.stop.clone();
        let me = Arc::downgrade(&owners);
        tokio::spawn(async move {
            use futures_util::StreamExt;
            loop {
                let msg = tokio::select! {
                    m = pings.next() => m,
                    _ = stop.cancelled() => None,
                };
                let Some(msg) = msg else { return };
                let Some(reply) = msg.reply else { continue };
                // An empty ping asks only whether this replica is alive.
                let answer = match (msg.payload.is_empty(), me.upgrade()) {
                    (true, _) | (false, None) => bytes::Bytes::new(),
                    (false, Some(owners)) => {
                        let session = String::from_utf8_lossy(&msg.payload);
                        let holding = Holding {
                            holds: owners.holds(&session),
                            url: lock(&owners.url).clone(),
                        };
                        serde_json::to_vec(&holding).unwrap_or_default().into()
                    }
                };
                let _ = client.publish(reply, answer).await;
            }
        });
        tokio::spawn(owners.clone().renew());
        Ok(owners)
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The lease age (the bucket's `max_age`).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Where this replica serves, written into the leases it takes from now on.
    pub fn set_url(&self, url: &str) {
        *lock(&self.url) = url.to_string();
    }

    fn me(&self) -> bytes::Bytes {
        let me = Owner {
            replica: self.replica.clone(),
            url: lock(&self.url).clone(),
        };
        serde_json::to_vec(&me).unwrap_or_default().into()
    }

    fn hold(&self, session: &str, revision: u64) -> watch::Receiver<Option<Stopped>> {
        let (tx, rx) = watch::channel(None);
        lock(&self.held).insert(session.to_string(), Held { revision, lost: tx });
        rx
    }

    /// Whether this replica holds `session`'s lease now.
    pub fn holds(&self, session: &str) -> bool {
        lock(&self.held).contains_key(session)
    }

    /// The KV revision of `session`'s lease this replica wrote last.
    pub fn revision(&self, session: &str) -> Option<u64> {
        lock(&self.held).get(session).map(|h| h.revision)
    }

    /// Asks `replica` whether it holds `session` (over core NATS, which
    /// answers while JetStream elects leaders): None when it does not
    /// answer in time; no subscriber at all (it is gone) is `holds: false`.
    pub(crate) async fn ask_holder(&self, replica: &str, session: &str) -> Option<Holding> {
        let ask = self.client.request(
            format!("{RPC_PREFIX}{replica}.ping"),
            bytes::Bytes::copy_from_slice(session.as_bytes()),
        );
        match tokio::time::timeout(PING_TIMEOUT, ask).await {
            Ok(Ok(msg)) => serde_json::from_slice(&msg.payload).ok(),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => Some(Holding {
                holds: false,
                url: String::new(),
            }),
            _ => None,
        }
    }

    /// Takes `session`'s lease if it is free (or this replica's), else names
    /// its holder. For a session nobody wrote before (a new id).
    pub async fn claim(&self, session: &str) -> Result<Claim> {
        self.claim_as(session, false).await
    }

    /// `claim` for a session that may have a history: a free lease is taken
    /// only once the replica that wrote the session last (if another) says
    /// it does not hold it, or does not answer (`held_without_lease`): its lease
    /// may have expired while a NATS election stalled its renewals.
    pub async fn claim_checked(&self, session: &str) -> Result<Claim> {
        self.claim_as(session, true).await
    }

    async fn claim_as(&self, session: &str, check: bool) -> Result<Claim> {
        if let Some(h) = lock(&self.held).get(session) {
            return Ok(Claim::Mine(h.lost.subscribe()));
        }
        // The key may expire or be released between a failed create and the read.
        for _ in 0..5 {
            if check {
                if let Some(owner) = held_without_lease(self, &self.kv, session).await? {
                    return Ok(Claim::Theirs(owner));
                }
            }
            match self.kv.create(session, self.me()).await {
                Ok(revision) => return Ok(Claim::Mine(self.hold(session, revision))),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(e) => return Err(nats_error(&format!("cannot take the lease of {session}"), e)),
            }
            let entry = self
                .kv
                .entry(session)
                .await
                .map_err(|e| nats_error(&format!("cannot read the lease of {session}"), e))?;
            let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
                continue;
            };
            let owner: Owner = serde_json::from_slice(&entry.value)
                .map_err(|e| Error::internal(format!("an unreadable lease for {session}: {e}")))?;
            if owner.replica != self.replica {
                return Ok(Claim::Theirs(owner));
            }
            // Ours from before a release that has not landed yet: renewed in place.
            match self.kv.update(session, self.me(), entry.revision).await {
                Ok(revision) => return Ok(Claim::Mine(self.hold(session, revision))),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(nats_error(&format!("cannot take the lease of {session}"), e)),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("the lease of session {session} keeps changing hands; try again"),
        ))
    }

    /// Whether `owner` answers a ping.
    pub async fn alive(&self, owner: &Owner) -> bool {
        let ping = self
            .client
            .request(format!("{RPC_PREFIX}{}.ping", owner.replica), bytes::Bytes::new());
        matches!(tokio::time::timeout(PING_TIMEOUT, ping).await, Ok(Ok(_)))
    }

    /// `claim`, but a lease whose holder does not answer a ping is waited
    /// out until it expires and then taken: how a replica takes over the
    /// sessions of one that crashed or stopped. Bounded by three ages.
    pub async fn claim_or_wait(&self, session: &str) -> Result<Claim> {
        let deadline = Instant::now() + self.ttl * 3 + PING_TIMEOUT;
        loop {
            let owner = match self.claim_checked(session).await? {
                Claim::Mine(lost) => return Ok(Claim::Mine(lost)),
                Claim::Theirs(owner) => owner,
            };
            if self.alive(&owner).await {
                return Ok(Claim::Theirs(owner));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "session {session} is held by replica {}, which does not answer, and its lease has not expired after {:?}",
                        owner.replica,
                        self.ttl * 3
                    ),
                ));
            }
            tracing::debug!(session, owner = %owner.replica, "the lease's holder does not answer: waiting for the lease to expire");
            // The server drops the lease at its age: look again a few times per age.
            tokio::time::sleep((self.ttl / 10).clamp(Duration::from_millis(20), Duration::from_millis(500)))
                .await;
        }
    }

    fn lose(&self, session: &str, why: String) {
        if let Some(h) = lock(&self.held).remove(session) {
            tracing::warn!(session, "{LEASE_LOST}: {why}; this replica stops writing it");
            let _ = h.lost.send(Some(Stopped::LeaseLost { why }));
        }
    }

    /// Renews every held lease each third of the age, until `release_all`.
    async fn renew(self: Arc<Self>) {
        let every = self.ttl / 3;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.stop.cancelled() => return,
            }
            let held: Vec<(String, u64)> = lock(&self.held)
                .iter()
                .map(|(s, h)| (s.clone(), h.revision))
                .collect();
            let kv = &self.kv;
            let renewals = held.into_iter().map(|(session, revision)| {
                let me = self.me();
                async move {
                    let got = tokio::time::timeout(every, kv.update(&session, me, revision)).await;
                    (session, revision, got)
                }
            });
            for (session, revision, got) in futures_util::future::join_all(renewals).await {
                match got {
                    Ok(Ok(new)) => {
                        if let Some(h) = lock(&self.held).get_mut(&session) {
                            if h.revision == revision {
                                h.revision = new;
                            }
                        }
                    }
                    Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        self.moved(&session, revision).await;
                    }
                    // NATS unavailable (a node died, a leader is being
                    // elected): nobody can take the lease meanwhile either,
                    // and the log's CAS chain still fences a stale writer.
                    Ok(Err(e)) => {
                        tracing::warn!(session, "renewing the lease failed, trying again: {e}")
                    }
                    Err(_) => tracing::warn!(session, "renewing the lease timed out, trying again"),
                }
            }
        }
    }

    /// A renewal found the revision moved: either our own earlier renewal
    /// was stored but its ack lost (the value still names this replica:
    /// adopted), or another replica took the lease after it expired (lost).
    async fn moved(&self, session: &str, revision: u64) {
        let entry = match self.kv.entry(session).await {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(
                    session,
                    "reading the lease after a failed renewal, trying again: {e}"
                );
                return;
            }
        };
        let ours = entry.as_ref().filter(|e| {
            e.operation == kv::Operation::Put
                && serde_json::from_slice::<Owner>(&e.value).is_ok_and(|o| o.replica == self.replica)
        });
        let ours = ours.map(|e| e.revision);
        {
            let mut held = lock(&self.held);
            let Some(h) = held.get_mut(session).filter(|h| h.revision == revision) else {
                return;
            };
            if let Some(ours) = ours {
                h.revision = ours;
                return;
            }
        }
        if entry.is_some() {
            self.lose(session, "another replica took the lease after it expired".into());
            return;
        }
        // Expired and nobody took it (the bucket's leader was being elected
        // past the lease's age): taken again at once. A replica that
        // meanwhile asked us was told we hold it (`held_without_lease`).
        match self.kv.create(session, self.me()).await {
            Ok(new) => {
                tracing::info!(
                    session,
                    "the lease expired while NATS could not renew it; taken again"
                );
                if let Some(h) = lock(&self.held)
                    .get_mut(session)
                    .filter(|h| h.revision == revision)
                {
                    h.revision = new;
                }
            }
            // Taken meanwhile (the next renewal reads by whom), or NATS still away.
            Err(e) => tracing::warn!(session, "taking the expired lease again, trying later: {e}"),
        }
    }

    /// Gives `session`'s lease back (a delete expecting the revision this replica wrote).
    pub async fn release(&self, session: &str) {
        let Some(h) = lock(&self.held).remove(session) else {
            return;
        };
        if let Err(e) = self.kv.delete_expect_revision(session, Some(h.revision)).await {
            tracing::debug!(session, "releasing the lease: {e}");
        }
    }

    /// Stops renewing and gives every lease back (clean shutdown).
    pub async fn release_all(&self) {
        self.stop.cancel();
        let sessions: Vec<String> = lock(&self.held).keys().cloned().collect();
        for s in sessions {
            self.release(&s).await;
        }
    }
}

/// The replica that holds `session` although its lease is gone (expired
/// during an election), if the lease is free and the session's last writer
/// says it holds it; None when the lease may be taken (or is held: the
/// caller's create then names the holder). While the last writer answers
/// that it holds the session, the lease is left to it (it takes the key
/// again when its renewal finds it gone); a replica that is gone (no
/// responders), answers that it does not hold it, or stays silent through
/// `ASKS` pings is taken over. Core NATS answers while JetStream elects a
/// leader, so this works through the election that expired the lease.
async fn held_without_lease(owners: &Owners, kv: &kv::Store, session: &str) -> Result<Option<Owner>> {
    let entry = kv.entry(session).await.map_err(|e| {
        Error::new(
            ErrorKind::Unavailable,
            format!("cannot read the lease of {session}: {e}"),
        )
    })?;
    if entry.is_some_and(|e| e.operation == kv::Operation::Put) {
        return Ok(None);
    }
    let Some(last) = last_writer(owners.client(), session).await else {
        return Ok(None);
    };
    if last == owners.replica() {
        return Ok(None);
    }
    for _ in 0..ASKS {
        match owners.ask_holder(&last, session).await {
            Some(h) if h.holds => {
                tracing::info!(session, holder = %last, "the lease is free but its last writer still holds the session (its renewal stalled): left to it");
                return Ok(Some(Owner {
                    replica: last,
                    url: h.url,
                }));
            }
            Some(_) => return Ok(None),
            None => {}
        }
    }
    tracing::info!(session, writer = %last, "the session's last writer does not answer: its free lease is taken");
    Ok(None)
}
