//! A session's log in NATS JetStream (`Log` over the stream `VAK_EV`): the backend that lets several vak replicas share a session (issue 14, first slice: the log alone).
//!
//! **Stream.** One stream, `VAK_EV`, subjects `vak.ev.<session>` (a session
//! id is 1 to 128 of `[A-Za-z0-9_-]`, so it is one subject token), file
//! storage, R3 on a cluster (R1 on a single server), `max_msgs_per_subject`
//! as the history kept per session, `allow_direct` (reads are served by any
//! replica), a duplicate window, `allow_atomic` (atomic batch publish,
//! nats-server 2.12+), and `RePublish` from `vak.ev.>` to `vak.live.>`: the
//! live path of the replicas will read only what the stream stored.
//!
//! **Messages.** A message holds one ledger record, its payload the
//! record's JSON line (the same line the JSONL ledger writes, without the
//! newline), or a pack of a batch's consecutive records (`packs.rs`: their
//! lines joined by newlines, `Vak-First` the first one's position, the
//! other headers the last one's): JetStream's work is per message, so a
//! burst costs it one message per batch, not one per event.
//! An event has `Vak-Seq: n` and `Nats-Msg-Id: <session>:<n>`. A note (a
//! record with no seq: usage, signature, compaction, admitted request id,
//! snapshot) has `Vak-Note: <n>.<k>`, the k-th note (from 1) after event
//! `n` (0 before any event), and `Nats-Msg-Id: <session>:<n>.<k>`; k goes
//! on across batches and restarts from 1 after each event, so every
//! message of a session has its own id and the order key `(n, k)` only
//! grows. Every message also names its writer, `Vak-Writer: <uuid>` (one
//! per `JetStreamLog`), which is how a writer tells its own retried
//! message from a rival's with the same id. A record too large for one
//! message (its line over the server's `max_payload`, read from the
//! connection's server info at each append, less `chunks::HEADER_ROOM` for
//! the headers) goes as n parts (`chunks.rs`): consecutive messages with
//! the record's `Vak-Seq` or `Vak-Note`, `Vak-Part: i/n`, `Vak-Digest:
//! <sha256 hex of the whole line>` and `Nats-Msg-Id: <id>/<i>`, in one
//! atomic batch; every read puts them back together and checks the digest,
//! and a set that is incomplete or does not match is an error, never shown.
//!
//! **One writer per session.** Each append is a compare-and-set on the
//! subject: its first message carries `Nats-Expected-Last-Subject-Sequence`,
//! the stream sequence of the last message this writer saw on the subject
//! (read at open, then from each ack). JetStream error 10071 (wrong last
//! sequence) means someone else appended: unless the subject's last message
//! is this writer's own (a retry of a batch whose ack was lost), the log is
//! *fenced*: that append and every later one fail with `ANOTHER_WRITER`, so
//! the old owner stops at once and shows nothing of what it tried. A
//! duplicate ack (the id is in the duplicate window) is checked the same
//! way: the stored message must carry our `Vak-Writer`, else fenced (a
//! rival that wrote the same seq first has the same `Nats-Msg-Id`).
//!
//! **Takeover.** Every message also names its replica (`Vak-Replica`);
//! `takeover.rs` has why, and the lease note a new holder appends first.
//! `stop` (the lease was lost) makes a retrying append give up at once.
//!
//! **Atomic batches, measured.** A writer batch of several messages (a
//! record in parts, or more packs than one) goes as one atomic batch
//! (`Nats-Batch-Id`, `Nats-Batch-Sequence`, and
//! `Nats-Batch-Commit: 1` on the last message): the messages before the
//! commit are plain publishes with no reply, the commit is one request, so a
//! batch costs one round trip and one CAS and is stored whole or not at all.
//! The alternative, a CAS per message, needs each message's ack before the
//! next can name its predecessor's sequence: one round trip per record.
//! Measured on a loopback R3 cluster (2 cores, tests/it/jetstream.rs,
//! `batches_are_one_round_trip`), see docs/scale-out.md for the numbers.
//! The server caps an atomic batch at 1000 messages: a larger writer batch
//! goes as several, each atomic and each holding whole records (a record's
//! parts are never split between two); if one of them fails, the ones
//! before it are stored but none was shown (the writer fails the session),
//! and a reload continues after them, so no seq is ever reused.
//!
//! **Transient failures.** A publish that times out or finds no responders
//! (a stream leader being elected after a node died) is retried with the
//! same ids and the same expected sequence until `RETRY_FOR` has passed:
//! appends stall, then resume, and the duplicate window plus the writer
//! check make the retry idempotent. A message over `max_payload` (the
//! client's typed `MaxPayloadExceeded`, JetStream error 10054) or a record
//! needing more parts than an atomic batch holds is never retried: the
//! append fails at once with the sizes (`storage_failed`).
//!
//! **Reads.** `read_events` uses batched direct gets (`$JS.API.DIRECT.GET`,
//! `next_by_subj` with `batch`, nats-server 2.11+) from a stream sequence
//! known to be at or before the wanted event (a sparse map filled by
//! appends and reads; the subject's start when nothing is known), keeping
//! events with `Vak-Seq` > after. A direct get may be served by a follower
//! a moment behind: a read that comes back short of what this log knows is
//! durable is asked again until `RETRY_FOR`.
//!
//! **Who owns what.** The CAS chain (the last stream sequence, the position,
//! the fence) belongs to the log's writer task, started at open: `append`,
//! called on the session writer's blocking thread, hands it a copy of the
//! batch through a bounded queue (a full one waits) and waits for the
//! answer, so no lock is held across a publish or
//! its retries and nothing `block_on`s the runtime. `read_events` runs its
//! reads on the runtime the same way and waits on the blocking pool.

use crate::error::{Error, Result};
use crate::event::ClientEvent;
use crate::log::ledger::{Batch, Log, Record};
use crate::stopped::Stopped;
use async_nats::jetstream::kv;
use async_nats::jetstream::stream;
use async_nats::{HeaderMap, StatusCode};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

mod chunks;
mod live;
mod messages;
mod packs;
mod reads;
pub(crate) use live::{Live, LiveRecords};
pub(crate) use messages::{plan, position_of, Planned};
pub use messages::{Position, Stored};
use reads::{stored, ReadError};

/// The stream every session's log lives in.
pub const STREAM: &str = "VAK_EV";
/// A session's subject is this prefix and its id.
pub const SUBJECT_PREFIX: &str = "vak.ev.";
/// Where the stream republishes what it stored (the live path).
pub const LIVE_PREFIX: &str = "vak.live.";
/// JetStream's "wrong last sequence": another writer appended first.
pub const WRONG_LAST_SEQUENCE: u64 = 10071;
/// JetStream's "atomic publish batch contains duplicate message id".
pub const ATOMIC_DUPLICATE: u64 = 10201;
/// JetStream's "message size exceeds maximum allowed" (the stream's `max_msg_size`).
const MESSAGE_TOO_LARGE: u64 = 10054;
/// JetStream error: the expected last sequence could not be checked because
/// an earlier write to the subject is still being applied (nats-server
/// 2.12+ answers this under load instead of 10071): asked again, it is
/// decided.
pub const LAST_SEQUENCE_IN_FLIGHT: u64 = 10164;
/// The texts of the errors every append of a fenced log fails with, and an
/// append fails with once this replica lost the lease (`stop`); the errors
/// carry their `Stopped` cause, which is what code reads.
pub use crate::stopped::{ANOTHER_WRITER, LEASE_STOPPED};
/// The server's cap on the messages of one atomic batch.
pub const ATOMIC_MAX: usize = 1000;
/// How long a publish or read is retried through transient failures.
pub const RETRY_FOR: Duration = Duration::from_secs(30);
/// How long one request waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Messages a read asks for per direct-get batch.
const READ_BATCH: usize = 512;
/// The bytes a direct-get batch stops after (the server sends at least one message).
const READ_BYTES: usize = 4 << 20;
/// A read position is remembered at least every this many events.
const MARK_EVERY: u64 = 256;

pub const H_SEQ: &str = "Vak-Seq";
pub const H_NOTE: &str = "Vak-Note";
pub const H_WRITER: &str = "Vak-Writer";
/// The replica that wrote a message (`--bus-replica`): whom a replica
/// about to take a free lease asks first whether it still holds it.
pub const H_REPLICA: &str = "Vak-Replica";
const H_MSG_ID: &str = "Nats-Msg-Id";
const H_EXPECTED: &str = "Nats-Expected-Last-Subject-Sequence";
const H_BATCH_ID: &str = "Nats-Batch-Id";
const H_BATCH_SEQ: &str = "Nats-Batch-Sequence";
const H_BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// How the stream is set up.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// 3 on a cluster, 1 on a single server.
    pub replicas: usize,
    /// Messages kept per session (`max_msgs_per_subject`).
    pub history: i64,
    /// How long a `Nats-Msg-Id` is remembered.
    pub duplicate_window: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            replicas: 1,
            history: 1_000_000,
            duplicate_window: Duration::from_secs(120),
        }
    }
}

/// The stream's configuration.
pub fn stream_config(opts: &StreamOptions) -> stream::Config {
    stream::Config {
        name: STREAM.to_string(),
        subjects: vec![format!("{SUBJECT_PREFIX}>")],
        storage: stream::StorageType::File,
        num_replicas: opts.replicas,
        max_messages_per_subject: opts.history,
        discard: stream::DiscardPolicy::Old,
        allow_direct: true,
        duplicate_window: opts.duplicate_window,
        allow_atomic_publish: true,
        republish: Some(stream::Republish {
            source: format!("{SUBJECT_PREFIX}>"),
            destination: format!("{LIVE_PREFIX}>"),
            headers_only: false,
        }),
        ..Default::default()
    }
}

/// Creates the stream if it does not exist (an existing one is used as is).
pub async fn ensure_stream(client: &async_nats::Client, opts: &StreamOptions) -> Result<()> {
    let js = async_nats::jetstream::new(client.clone());
    js.get_or_create_stream(stream_config(opts))
        .await
        .map_err(|e| Error::internal(format!("cannot create the JetStream stream {STREAM}: {e}")))?;
    Ok(())
}

/// Removes every message of session `id` from the stream (deleting the
/// session with `--bus`): a mirror finds its subject empty and closes.
pub async fn purge_session(client: &async_nats::Client, id: &str) -> Result<()> {
    let js = async_nats::jetstream::new(client.clone());
    let unavailable = |e: &dyn std::fmt::Display| {
        Error::new(
            crate::error::ErrorKind::Unavailable,
            format!("cannot delete session {id} from the stream {STREAM}: {e}"),
        )
    };
    let stream = js.get_stream(STREAM).await.map_err(|e| unavailable(&e))?;
    stream
        .purge()
        .filter(format!("{SUBJECT_PREFIX}{id}"))
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(())
}

/// The configuration vak's KV buckets are made with: the last value of
/// each key only, on file, `replicas` copies (at least one).
pub fn bucket_config(bucket: &str, description: &str, max_value: usize, replicas: usize) -> kv::Config {
    kv::Config {
        bucket: bucket.into(),
        description: description.into(),
        history: 1,
        max_value_size: max_value as i32,
        storage: async_nats::jetstream::stream::StorageType::File,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// The KV bucket `config.bucket`, created with `config` if it is missing;
/// an existing one is used as it is. Replicas starting at once may race to
/// create it: the loser opens the winner's.
pub async fn key_value(client: &async_nats::Client, config: kv::Config) -> Result<kv::Store> {
    let js = async_nats::jetstream::new(client.clone());
    let bucket = config.bucket.clone();
    if let Ok(store) = js.get_key_value(&bucket).await {
        return Ok(store);
    }
    match js.create_key_value(config).await {
        Ok(store) => Ok(store),
        Err(e) => js.get_key_value(&bucket).await.map_err(|_| {
            Error::new(
                crate::error::ErrorKind::Unavailable,
                format!("cannot open the KV bucket {bucket}: {e}"),
            )
        }),
    }
}

/// Connects to the NATS servers `url` names (`nats://host:port`, several
/// comma-separated) and makes sure the stream exists.
pub async fn connect(url: &str, opts: &StreamOptions) -> Result<async_nats::Client> {
    let target = crate::cluster::nats_connect::BusTarget::new(url, &Default::default())?;
    connect_to(&target, opts).await
}

/// `connect` with the credentials and TLS of `vak serve`'s `--bus-*` flags.
pub async fn connect_to(
    target: &crate::cluster::nats_connect::BusTarget,
    opts: &StreamOptions,
) -> Result<async_nats::Client> {
    let client = target.connect().await?;
    ensure_stream(&client, opts).await?;
    Ok(client)
}

/// Whether `id` can be a subject token: 1 to 128 of `[A-Za-z0-9_-]`.
pub fn subject_safe(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What the writer task owns: nothing else reads or changes it, so no
/// lock is held across a publish or its retries.
struct Writer {
    /// The stream sequence of the last message on the subject (0: none).
    last: u64,
    pos: Position,
    fenced: bool,
    /// `last` and `pos` before the last append (`forget_last_ack`, a test hook).
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    before: (u64, Position),
}

/// What readers share.
struct Seen {
    durable_seq: u64,
    /// Event seq -> a stream sequence at or before it.
    marks: BTreeMap<u64, u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a log's handle and its writer task share: the connection, who
/// writes, what readers have seen, and the writer's state as last published.
struct Link {
    client: async_nats::Client,
    session: String,
    subject: String,
    writer_id: String,
    /// The replica writing through this log (`Vak-Replica`), when known.
    replica: OnceLock<String>,
    /// Cancelled when this replica lost the session's lease: no append is
    /// tried again from then on, one in flight gives up at once.
    stopped: CancellationToken,
    seen: Mutex<Seen>,
    /// The writer's `fenced` and `last`, published by its task before it
    /// answers (`fenced`, `subject_empty`).
    fenced: AtomicBool,
    last: AtomicU64,
}

/// One session's log in `VAK_EV`.
pub struct JetStreamLog {
    rt: Handle,
    link: Arc<Link>,
    /// The writer task's queue, `REQUESTS` long. Blocking callers (`append`,
    /// `reread_head`) wait while it is full; the test hook, sent from async
    /// code, fails loudly instead.
    writer: mpsc::Sender<Request>,
}

/// How many requests a log's writer task may have queued. One session's
/// writer appends one batch at a time and waits for it, so the queue holds
/// at most that append, a takeover's head re-read and a test hook: a full
/// queue means a caller outside that pattern, which waits its turn.
const REQUESTS: usize = 4;

/// What the writer task is asked to do, in order.
enum Request {
    /// Append the batch (a copy: the caller's is borrowed); answered when
    /// stored or failed.
    Append {
        batch: Batch,
        done: oneshot::Sender<std::io::Result<()>>,
    },
    /// Read the subject's head again and clear the fence (`reread_head`).
    RereadHead { done: oneshot::Sender<Result<()>> },
    /// Forget the last append's ack (`forget_last_ack`, a test hook).
    #[cfg(feature = "test-hooks")]
    ForgetLastAck,
}

/// Why one publish attempt failed.
enum PubError {
    /// Worth asking again (timeout, no responders, a connection problem).
    Transient(String),
    /// The CAS failed (10071), or an atomic batch held an id already stored (10201).
    WrongLast,
    /// A message over the server's `max_payload` or the stream's
    /// `max_msg_size`: asking again cannot help.
    TooLarge(String),
    /// Anything else JetStream refused.
    Refused(String),
}

/// A publish ack.
struct Ack {
    seq: u64,
    duplicate: bool,
}

impl JetStreamLog {
    /// Opens `session`'s log (the stream must exist: `ensure_stream`): reads
    /// the subject's last message for the durable seq and the CAS chain,
    /// then starts the log's writer task, which owns the chain from then on.
    pub async fn open(client: async_nats::Client, session: &str) -> Result<JetStreamLog> {
        if !subject_safe(session) {
            return Err(Error::invalid(format!(
                "session id {session:?} is not subject-safe (1 to 128 of A-Z a-z 0-9 _ -)"
            )));
        }
        let subject = format!("{SUBJECT_PREFIX}{session}");
        let link = Arc::new(Link {
            client,
            session: session.to_string(),
            subject,
            writer_id: uuid::Uuid::new_v4().simple().to_string(),
            replica: OnceLock::new(),
            stopped: CancellationToken::new(),
            seen: Mutex::new(Seen {
                durable_seq: 0,
                marks: BTreeMap::new(),
            }),
            fenced: AtomicBool::new(false),
            last: AtomicU64::new(0),
        });
        let (last, pos) = link.read_head().await?;
        let w = Writer {
            last,
            pos,
            fenced: false,
            before: (0, Position::default()),
        };
        w.publish(&link);
        let (writer, requests) = mpsc::channel(REQUESTS);
        tokio::spawn(write(link.clone(), w, requests));
        Ok(JetStreamLog {
            rt: Handle::current(),
            link,
            writer,
        })
    }

    /// Names `replica` in every message this log writes from now on (`Vak-Replica`).
    pub fn write_as(&self, replica: &str) {
        let _ = self.link.replica.set(replica.to_string());
    }

    /// This replica lost the session's lease: no append is tried again,
    /// and one retrying through a NATS election gives up now.
    pub fn stop(&self) {
        self.link.stopped.cancel();
    }

    /// Reads the subject's head again and clears the fence: where a
    /// replica taking the session over appends after a stale holder's
    /// append (`JetStreamLog::take_over`, in `takeover.rs`). Blocking
    /// (asks the writer task and waits for its answer).
    pub(crate) fn reread_head(&self) -> Result<()> {
        let (done, answer) = oneshot::channel();
        self.writer
            .blocking_send(Request::RereadHead { done })
            .map_err(|_| Error::internal(self.writer_gone()))?;
        answer
            .blocking_recv()
            .unwrap_or_else(|_| Err(Error::internal(self.writer_gone())))
    }

    /// Whether the subject held no message when last read (no session, or a deleted one).
    pub(crate) fn subject_empty(&self) -> bool {
        self.link.last.load(Ordering::Acquire) == 0
    }

    pub fn session(&self) -> &str {
        &self.link.session
    }

    /// Whether another writer has taken this session over.
    pub fn fenced(&self) -> bool {
        self.link.fenced.load(Ordering::Acquire)
    }

    /// Every record of the log in order (header, events, notes): what a
    /// session is rebuilt from when it loads. The whole history is read:
    /// starting from the last snapshot is left for later.
    pub async fn records(&self) -> Result<Vec<Record>> {
        self.link.records().await
    }

    /// The stream sequence of the subject's last message (0: none).
    pub async fn head(&self) -> Result<u64> {
        self.link.head().await
    }

    /// Whether the subject holds no message, asked of the stream's leader
    /// (a direct get may be served by a replica still catching up): how a
    /// mirror tells that its session was deleted (purged).
    pub async fn purged(&self) -> Result<bool> {
        self.link.purged().await
    }

    /// Every message of the subject after stream sequence `after`, in
    /// order, with its stream sequence and position.
    /// A record cut in parts counts at its last part's stream sequence; one
    /// whose parts are incomplete or altered is an error.
    pub async fn stored_after(&self, after: u64) -> Result<Vec<Stored>> {
        self.link.stored_after(after).await
    }

    /// Forgets the last append's ack, as if it had been lost: appending the
    /// same batch again is then the retry a lost ack leads to (tests/it/jetstream.rs;
    /// only with the `test-hooks` feature, which the integration tests turn on).
    /// Queued to the writer task, so the next append finds it done (a
    /// stopped task: the next append says so). Called between appends, it
    /// finds room; a full queue is a misuse and panics, never drops it.
    #[cfg(feature = "test-hooks")]
    pub fn forget_last_ack(&self) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.writer.try_send(Request::ForgetLastAck) {
            panic!(
                "forget_last_ack: the writer task of {} has a full queue",
                self.link.session
            );
        }
    }

    fn writer_gone(&self) -> String {
        format!("the JetStream writer of {} has stopped", self.link.session)
    }
}

/// The log's writer task: every append, in order, with the state it alone
/// holds; ends when the log is dropped.
async fn write(link: Arc<Link>, mut w: Writer, mut requests: mpsc::Receiver<Request>) {
    while let Some(r) = requests.recv().await {
        match r {
            Request::Append { batch, done } => {
                let started = Instant::now();
                let appended = w.append(&link, &batch).await;
                metrics::histogram!(crate::metrics_names::JETSTREAM_APPEND_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                w.publish(&link);
                let _ = done.send(appended);
            }
            Request::RereadHead { done } => {
                let read = link.read_head().await.map(|(last, pos)| {
                    w.last = last;
                    w.pos = pos;
                    w.fenced = false;
                });
                w.publish(&link);
                let _ = done.send(read);
            }
            #[cfg(feature = "test-hooks")]
            Request::ForgetLastAck => {
                (w.last, w.pos) = w.before;
                w.publish(&link);
            }
        }
    }
}

impl Writer {
    /// Shows `fenced` and `last` to the log's handle.
    fn publish(&self, link: &Link) {
        link.fenced.store(self.fenced, Ordering::Release);
        link.last.store(self.last, Ordering::Release);
    }

    /// Stores `batch` after the last message this writer saw (see the
    /// module doc: CAS, atomic groups, fencing).
    async fn append(&mut self, link: &Link, batch: &Batch) -> std::io::Result<()> {
        if self.fenced {
            return Err(Stopped::Fenced {
                session: link.session.clone(),
                again: true,
            }
            .into_io());
        }
        // The limit of the server this connection is on now (servers of a
        // cluster may differ, and a reconnect may land on another).
        let room = chunks::room(link.client.max_payload());
        let (msgs, end, sizes) = plan(&link.session, batch, self.pos, room)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        self.before = (self.last, self.pos);
        for group in chunks::atomic_groups(sizes, ATOMIC_MAX) {
            let chunk = &msgs[group];
            let before = self.last;
            match link.store(chunk, before).await {
                Ok(last) => {
                    self.last = last;
                    let mut seen = lock(&link.seen);
                    if let Some((first, _)) = chunk.iter().find_map(|m| m.events) {
                        // The chunk starts after `before` on the subject.
                        seen.marks.insert(first, before + 1);
                    }
                    if let Some((_, top)) = chunk.iter().rev().find_map(|m| m.events) {
                        seen.durable_seq = seen.durable_seq.max(top);
                    }
                }
                Err(e) => {
                    if matches!(Stopped::of_io(&e), Some(Stopped::Fenced { .. })) {
                        self.fenced = true;
                    }
                    return Err(e);
                }
            }
        }
        self.pos = end;
        Ok(())
    }
}

impl Link {
    /// Reads the subject's last message: where the CAS chain and the
    /// numbering go on from (asked again through transient failures).
    async fn read_head(&self) -> Result<(u64, Position)> {
        let session = &self.session;
        let deadline = Instant::now() + RETRY_FOR;
        let last = loop {
            match self.last_message().await {
                Ok(last) => break last,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(session, "reading the log's last message again: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(Error::internal(format!("cannot open the log of {session}: {e}"))),
            }
        };
        let (last, pos) = match last {
            Some((stream_seq, headers)) => {
                let pos = position_of(&headers).ok_or_else(|| {
                    Error::internal(format!(
                        "the last message of {} has neither {H_SEQ} nor {H_NOTE}",
                        self.subject
                    ))
                })?;
                (stream_seq, pos)
            }
            None => (0, Position::default()),
        };
        let mut seen = lock(&self.seen);
        seen.durable_seq = seen.durable_seq.max(pos.after);
        Ok((last, pos))
    }

    /// Every record of the log in order (header, events, notes): what a
    /// session is rebuilt from when it loads. The whole history is read:
    /// starting from the last snapshot is left for later.
    pub(crate) async fn records(&self) -> Result<Vec<Record>> {
        Ok(self
            .stored_after(0)
            .await?
            .into_iter()
            .map(|s| s.record)
            .collect())
    }

    /// The stream sequence of the subject's last message (0: none).
    pub(crate) async fn head(&self) -> Result<u64> {
        let last = self
            .last_message()
            .await
            .map_err(|e| Error::internal(format!("cannot read the log of {}: {e}", self.session)))?;
        Ok(last.map_or(0, |(seq, _)| seq))
    }

    /// Whether the subject holds no message, asked of the stream's leader
    /// (a direct get may be served by a replica still catching up): how a
    /// mirror tells that its session was deleted (purged).
    pub(crate) async fn purged(&self) -> Result<bool> {
        let js = async_nats::jetstream::new(self.client.clone());
        let unavailable = |e: &dyn std::fmt::Display| {
            Error::new(
                crate::error::ErrorKind::Unavailable,
                format!("cannot read the log of {}: {e}", self.session),
            )
        };
        let stream = js.get_stream(STREAM).await.map_err(|e| unavailable(&e))?;
        match stream.get_last_raw_message_by_subject(&self.subject).await {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
                Ok(true)
            }
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// The error a read that found a broken set of parts fails with.
    fn broken(&self, stream_seq: u64, broken: &chunks::Broken) -> Error {
        Error::internal(format!(
            "cannot read the log of {}: at stream sequence {stream_seq} of {STREAM}, {broken}",
            self.session
        ))
    }

    /// The subject's last message: its stream sequence and headers.
    async fn last_message(&self) -> std::result::Result<Option<(u64, HeaderMap)>, String> {
        let msg = self
            .request(
                format!("$JS.API.DIRECT.GET.{STREAM}.{}", self.subject),
                HeaderMap::new(),
                Bytes::new(),
            )
            .await?;
        stored(msg)
    }

    /// The message stored at stream sequence `seq`.
    async fn message_at(&self, seq: u64) -> std::result::Result<Option<(u64, HeaderMap)>, String> {
        let body = serde_json::json!({ "seq": seq }).to_string();
        let msg = self
            .request(
                format!("$JS.API.DIRECT.GET.{STREAM}"),
                HeaderMap::new(),
                body.into(),
            )
            .await?;
        stored(msg)
    }

    async fn request(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> std::result::Result<async_nats::Message, String> {
        let req = self.client.request_with_headers(subject, headers, payload);
        match tokio::time::timeout(REQUEST_TIMEOUT, req).await {
            Ok(Ok(msg)) => Ok(msg),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {REQUEST_TIMEOUT:?}")),
        }
    }

    fn headers(&self, m: &Planned) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(H_MSG_ID, m.msg_id.as_str());
        h.insert(H_WRITER, self.writer_id.as_str());
        if let Some(replica) = self.replica.get() {
            h.insert(H_REPLICA, replica.as_str());
        }
        if let Some(seq) = m.seq {
            h.insert(H_SEQ, seq.to_string().as_str());
        }
        if let Some((after, k)) = m.note {
            h.insert(H_NOTE, format!("{after}.{k}").as_str());
        }
        if let Some(first) = m.first {
            h.insert(packs::H_FIRST, first.header().as_str());
        }
        if let Some(part) = &m.part {
            h.insert(chunks::H_PART, part.header().as_str());
            h.insert(chunks::H_DIGEST, part.digest.as_str());
        }
        h
    }

    /// One attempt at storing `msgs` after stream sequence `last` on the subject.
    async fn publish_once(&self, msgs: &[Planned<'_>], last: u64) -> std::result::Result<Ack, PubError> {
        let n = msgs.len();
        let batch_id = (n > 1).then(|| uuid::Uuid::new_v4().simple().to_string());
        let mut answer = None;
        for (i, m) in msgs.iter().enumerate() {
            let mut h = self.headers(m);
            if i == 0 {
                h.insert(H_EXPECTED, last.to_string().as_str());
            }
            if let Some(id) = &batch_id {
                h.insert(H_BATCH_ID, id.as_str());
                h.insert(H_BATCH_SEQ, (i + 1).to_string().as_str());
                if i + 1 == n {
                    h.insert(H_BATCH_COMMIT, "1");
                }
            }
            let payload = Bytes::copy_from_slice(m.payload);
            let size = chunks::wire_len(&h) + payload.len();
            let too_large = || {
                PubError::TooLarge(format!(
                    "a message of {size} bytes (headers and payload) is over the NATS server's max_payload of {} bytes",
                    self.client.max_payload()
                ))
            };
            if i + 1 == n {
                let req = self.client.request_with_headers(self.subject.clone(), h, payload);
                answer = Some(match tokio::time::timeout(REQUEST_TIMEOUT, req).await {
                    Ok(Ok(msg)) => msg,
                    Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::MaxPayloadExceeded => {
                        return Err(too_large())
                    }
                    Ok(Err(e)) => return Err(PubError::Transient(e.to_string())),
                    Err(_) => return Err(PubError::Transient(format!("no answer in {REQUEST_TIMEOUT:?}"))),
                });
            } else {
                self.client
                    .publish_with_headers(self.subject.clone(), h, payload)
                    .await
                    .map_err(|e| match e.kind() {
                        async_nats::client::PublishErrorKind::MaxPayloadExceeded => too_large(),
                        _ => PubError::Transient(e.to_string()),
                    })?;
            }
        }
        let msg = answer.expect("a batch has at least one message");
        if msg.status == Some(StatusCode::NO_RESPONDERS) {
            return Err(PubError::Transient(
                "no responders (a stream leader is being elected)".into(),
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&msg.payload)
            .map_err(|e| PubError::Transient(format!("an unreadable publish ack: {e}")))?;
        if let Some(err) = v.get("error") {
            let code = err.get("err_code").and_then(|c| c.as_u64()).unwrap_or(0);
            let text = err
                .get("description")
                .and_then(|d| d.as_str())
                .unwrap_or("")
                .to_string();
            return Err(match code {
                // An id of the batch is in the duplicate window: ours (a
                // retry) or a rival's with the same seq; told apart like 10071.
                WRONG_LAST_SEQUENCE | ATOMIC_DUPLICATE => PubError::WrongLast,
                MESSAGE_TOO_LARGE => PubError::TooLarge(format!("{text} (JetStream error {code})")),
                // JetStream not available right now (no leader, no quorum),
                // or an earlier write to the subject still in flight.
                10008 | 10023 | 10077 | LAST_SEQUENCE_IN_FLIGHT => {
                    PubError::Transient(format!("{text} ({code})"))
                }
                _ => PubError::Refused(format!("{text} (JetStream error {code})")),
            });
        }
        let seq = v
            .get("seq")
            .and_then(|s| s.as_u64())
            .ok_or_else(|| PubError::Transient(format!("a publish ack with no seq: {v}")))?;
        Ok(Ack {
            seq,
            duplicate: v.get("duplicate").and_then(|d| d.as_bool()).unwrap_or(false),
        })
    }

    /// Whether the message at `seq` (or the subject's last, for None) is
    /// `msg_id` written by this writer: a retry whose first try was stored.
    async fn ours(&self, seq: Option<u64>, msg_id: &str) -> std::result::Result<Option<u64>, String> {
        let found = match seq {
            Some(seq) => self.message_at(seq).await?,
            None => self.last_message().await?,
        };
        Ok(found.and_then(|(at, h)| {
            let is = h.get(H_WRITER).map(|v| v.as_str()) == Some(self.writer_id.as_str())
                && h.get(H_MSG_ID).map(|v| v.as_str()) == Some(msg_id);
            is.then_some(at)
        }))
    }

    /// Stores `msgs` (at most `ATOMIC_MAX`) after `last`, retrying transient
    /// failures: the stream sequence of the last one, or the error.
    async fn store(&self, msgs: &[Planned<'_>], last: u64) -> std::io::Result<u64> {
        let deadline = Instant::now() + RETRY_FOR;
        let tail_id = &msgs.last().expect("not empty").msg_id;
        let fenced = || {
            Stopped::Fenced {
                session: self.session.clone(),
                again: false,
            }
            .into_io()
        };
        let stopped = || {
            Stopped::LeaseGoneAtAppend {
                session: self.session.clone(),
            }
            .into_io()
        };
        loop {
            if self.stopped.is_cancelled() {
                return Err(stopped());
            }
            let once = tokio::select! {
                once = self.publish_once(msgs, last) => once,
                _ = self.stopped.cancelled() => return Err(stopped()),
            };
            let err = match once {
                Ok(ack) if !ack.duplicate => return Ok(ack.seq),
                Ok(ack) => match self.ours(Some(ack.seq), tail_id).await {
                    Ok(Some(seq)) => return Ok(seq),
                    Ok(None) => return Err(fenced()),
                    Err(e) => e,
                },
                Err(PubError::WrongLast) => match self.ours(None, tail_id).await {
                    Ok(Some(seq)) => return Ok(seq),
                    Ok(None) => return Err(fenced()),
                    Err(e) => e,
                },
                Err(PubError::Refused(e)) => return Err(std::io::Error::other(e)),
                Err(PubError::TooLarge(e)) => {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                }
                Err(PubError::Transient(e)) => e,
            };
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("JetStream did not store the batch in {RETRY_FOR:?}: {err}"),
                ));
            }
            tracing::warn!(session = %self.session, "appending again: {err}");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.stopped.cancelled() => return Err(stopped()),
            }
        }
    }
}

impl Log for JetStreamLog {
    /// Hands a copy of `batch` to the log's writer task and waits for its
    /// answer (on the session writer's blocking thread, never a runtime
    /// worker): the task does the publishing and retrying, holding no lock.
    fn append(&self, batch: &Batch) -> std::io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let (done, answer) = oneshot::channel();
        let gone = || std::io::Error::other(self.writer_gone());
        // Waits while the queue is full (another request ahead of this one).
        self.writer
            .blocking_send(Request::Append {
                batch: batch.clone(),
                done,
            })
            .map_err(|_| gone())?;
        answer.blocking_recv().unwrap_or_else(|_| Err(gone()))
    }

    fn read_events(&self, after: u64, max: usize) -> Result<Vec<(u64, ClientEvent)>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let (from, durable) = {
            let seen = lock(&self.link.seen);
            let from = seen
                .marks
                .range(..=after.saturating_add(1))
                .next_back()
                .map_or(1, |(_, &s)| s);
            (from, seen.durable_seq)
        };
        // A follower serving the direct get may be a moment behind what was acked.
        let want = durable.saturating_sub(after).min(max as u64) as usize;
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            let got = self.read_from(from, after, max);
            match got {
                Ok(events) if events.len() >= want => return Ok(events),
                // Short but up to the durable end: the stream's retention
                // (`max_msgs_per_subject`) dropped the missing ones, which
                // asking again will not bring back (the replay resyncs).
                Ok(events) if events.last().is_some_and(|(seq, _)| *seq >= durable) => return Ok(events),
                Ok(events) if Instant::now() >= deadline => return Ok(events),
                Err(ReadError::Broken(e)) => return Err(e),
                Err(ReadError::Again(e)) if Instant::now() >= deadline => {
                    return Err(Error::internal(format!(
                        "cannot read the log of {}: {e}",
                        self.link.session
                    )))
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn durable_seq(&self) -> u64 {
        lock(&self.link.seen).durable_seq
    }

    /// JetStream acks a message once a quorum of replicas stored it: there is nothing more to force.
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_are_subjects() {
        assert!(subject_safe("0123abcdef"));
        assert!(subject_safe("a_b-C"));
        for bad in ["", "a.b", "a*", "a>", "a b", "é", &"x".repeat(129)] {
            assert!(!subject_safe(bad), "{bad:?}");
        }
    }
}
