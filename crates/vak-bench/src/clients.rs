//! The bench's own clients: SSE subscribers on raw tokio TCP (HTTP/1.1,
//! chunked body decoded in place, frames found by scanning for "\n\n") and gRPC
//! subscribers on tonic with a raw-bytes codec (Events read by a hand-written
//! protobuf walk). Neither parses a whole frame in the hot path: each counts the
//! `t{i} ` tokens of text_delta frames, checks that the first and last token of
//! every frame continue the sequence, and fully decodes one frame in
//! `VALIDATE_EVERY` (serde_json / prost) to check the fast path against it.
//!
//! Merged frames: under backpressure vak merges consecutive deltas into one
//! frame, so delivered EVENTS are counted as tokens, never as frames.

use bytes::{Buf, Bytes};
use memchr::memmem::Finder;
use prost::Message;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use vak_proto::v1 as pb;

/// One frame in this many (and the first) is decoded in full and compared.
const VALIDATE_EVERY: u64 = 1024;

/// Where a server listens and the token it wants.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub addr: SocketAddr,
    pub token: String,
    /// nginx + nchan: `/sub/<channel>`, a body that is not chunked, no
    /// stream_opened (the response head opens the stream), nchan's own ids.
    pub peer: bool,
}

/// What a subscriber does with its stream.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// Count `t{i} ` tokens until `expect` are in and run_finished arrives.
    Count { expect: u64 },
    /// Like Count with `p{i}@{unix_micros} ` tokens: records each one's latency.
    Latency { expect: u64 },
    /// Holds the stream open, reading (keepalives) until cancelled.
    Idle,
    /// Reads until stream_opened, then never reads again until cancelled.
    Stalled,
    /// Replays history: every frame after the subscriber's cursor up to seq
    /// `until`, gap-free (each seq one past the last, or a merged delta
    /// covering exactly its tokens) and without a resync; the burst tokens
    /// continue from whichever one comes first.
    Replay { until: u64 },
}

/// State every subscriber of one scenario run shares.
pub(crate) struct Shared {
    pub opened: AtomicUsize,
    pub cancel: CancellationToken,
    /// Bounds connections being set up at once (the listen backlog is finite).
    pub connecting: Semaphore,
    /// Tokens delivered so far, every subscriber together (read while a run goes on).
    pub delivered: Delivered,
    /// An SSE subscriber's read buffer in bytes; 0: by its mode (64 KiB when
    /// counting, 2 KiB idle). Many slow streams want small ones.
    pub read_size: usize,
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Shared::with_read_size(0)
    }

    /// `new`, with SSE read buffers of `read_size` bytes.
    pub(crate) fn with_read_size(read_size: usize) -> Arc<Shared> {
        Shared::with_limits(read_size, 128)
    }

    /// `new`, with all `streams` connecting at once (a reconnect storm).
    pub(crate) fn storming(streams: usize) -> Arc<Shared> {
        Shared::with_limits(0, streams.max(1))
    }

    fn with_limits(read_size: usize, connecting: usize) -> Arc<Shared> {
        Arc::new(Shared {
            opened: AtomicUsize::new(0),
            cancel: CancellationToken::new(),
            connecting: Semaphore::new(connecting),
            delivered: Delivered::default(),
            read_size,
        })
    }

    /// Waits until `n` subscribers have received stream_opened.
    pub(crate) async fn wait_opened(&self, n: usize, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        while self.opened.load(Ordering::Acquire) < n {
            if start.elapsed() > limit {
                return Err(format!(
                    "only {} of {n} streams opened within {limit:?}",
                    self.opened.load(Ordering::Acquire)
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }
}

/// Shards of the delivered-token count: each subscriber adds to one of its
/// own, so the bench's threads do not contend for one cache line per delta.
#[derive(Default)]
pub(crate) struct Delivered {
    shards: [Shard; DELIVERED_SHARDS],
    next: AtomicUsize,
}

const DELIVERED_SHARDS: usize = 16;

#[derive(Default)]
#[repr(align(64))]
struct Shard(AtomicU64);

impl Delivered {
    /// The shard a new subscriber adds to.
    fn shard(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % DELIVERED_SHARDS
    }

    fn add(&self, shard: usize, n: u64) {
        self.shards[shard % DELIVERED_SHARDS]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Every subscriber's tokens so far.
    pub(crate) fn total(&self) -> u64 {
        self.shards.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// What one subscriber saw.
#[derive(Debug, Default)]
pub(crate) struct SubResult {
    /// Delivered events: text_delta tokens.
    pub tokens: u64,
    /// text_delta frames (fewer than tokens when deltas were merged).
    pub frames: u64,
    /// When the last expected token arrived.
    pub all_at: Option<Instant>,
    /// Publish-to-receipt latencies in microseconds (Latency mode).
    pub latencies: Vec<u32>,
    /// Frames fully decoded and checked against the fast path.
    pub validated: u64,
    /// Replay mode: the last seq received and the frames that carried a seq.
    pub last_seq: u64,
    pub seq_frames: u64,
    pub error: Option<String>,
}

/// Per-subscriber accounting of text_delta payloads.
struct Tally {
    mode: Mode,
    session: String,
    /// The next token due, and the first one (0 unless a replay started mid-burst).
    next: u64,
    start: u64,
    /// Its shard of `Shared::delivered`.
    shard: usize,
    res: SubResult,
}

pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// A burst token's number: its digits, then the `_` padding of `/burst N SIZE`.
fn padded_digits(s: &[u8]) -> Option<u64> {
    let end = s.iter().rposition(|&b| b != b'_').map_or(0, |i| i + 1);
    digits(&s[..end])
}

impl Tally {
    fn new(mode: Mode, session: &str, after: Option<u64>) -> Tally {
        Tally {
            mode,
            session: session.to_string(),
            next: 0,
            start: 0,
            shard: 0,
            res: SubResult {
                last_seq: after.unwrap_or(0),
                // One latency per delta: sized once (bounded by the run's deltas).
                latencies: match mode {
                    Mode::Latency { expect } => Vec::with_capacity(expect.min(1 << 20) as usize),
                    _ => Vec::new(),
                },
                ..Default::default()
            },
        }
    }

    /// Replay mode: a frame with `seq` arrived (`tokens`: the burst tokens it
    /// carries, if it is a text_delta). It must continue the last seq
    /// exactly, or be a merged delta covering exactly the seqs it skips.
    /// Returns whether the replay is complete.
    fn seq(&mut self, seq: u64, tokens: Option<u64>) -> Result<bool, String> {
        let Mode::Replay { until } = self.mode else {
            return Ok(false);
        };
        let last = self.res.last_seq;
        let covers = seq.saturating_sub(last);
        if covers == 0 || (covers > 1 && tokens != Some(covers)) {
            return Err(format!(
                "replay gap: seq {seq} after seq {last} ({} tokens in the frame)",
                tokens.map_or("no".to_string(), |t| t.to_string())
            ));
        }
        self.res.last_seq = seq;
        self.res.seq_frames += 1;
        if seq >= until && self.res.all_at.is_none() {
            self.res.all_at = Some(Instant::now());
            return Ok(true);
        }
        Ok(false)
    }

    fn expect(&self) -> Option<u64> {
        match self.mode {
            Mode::Count { expect } | Mode::Latency { expect } => Some(expect),
            _ => None,
        }
    }

    /// Whether this frame gets the full decode.
    fn sample(&self) -> bool {
        self.res.frames.is_multiple_of(VALIDATE_EVERY)
    }

    /// One text_delta's text: `t{i} ` tokens (Count, Idle, Stalled, Replay)
    /// or `p{i}@{micros} ` tokens (Latency), continuing the sequence exactly.
    /// Returns how many tokens it carried.
    fn text(&mut self, text: &[u8]) -> Result<u64, String> {
        self.res.frames += 1;
        let bad = |what: &str| {
            format!(
                "{what} in delta {:?}",
                String::from_utf8_lossy(&text[..text.len().min(80)])
            )
        };
        match self.mode {
            Mode::Latency { .. } => {
                let now = unix_micros();
                for tok in text.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
                    let (i, at) = tok
                        .strip_prefix(b"p")
                        .and_then(|t| {
                            let at = memchr::memchr(b'@', t)?;
                            Some((digits(&t[..at])?, digits(&t[at + 1..])?))
                        })
                        .ok_or_else(|| bad("a malformed paced token"))?;
                    if i != self.next {
                        return Err(bad(&format!("token p{i} where p{} was due", self.next)));
                    }
                    self.next += 1;
                    self.res
                        .latencies
                        .push(now.saturating_sub(at).min(u64::from(u32::MAX)) as u32);
                }
            }
            _ => {
                let count = memchr::memchr_iter(b' ', text).count() as u64;
                if count == 0 || text.last() != Some(&b' ') || text.first() != Some(&b't') {
                    return Err(bad("a malformed burst delta"));
                }
                let first_end = memchr::memchr(b' ', text).unwrap_or(0);
                let first =
                    padded_digits(&text[1..first_end]).ok_or_else(|| bad("a malformed first token"))?;
                if matches!(self.mode, Mode::Replay { .. }) && self.res.frames == 1 {
                    // A replay starts mid-burst: its first token sets the sequence.
                    self.next = first;
                    self.start = first;
                }
                let body = &text[..text.len() - 1];
                let last_start = memchr::memrchr(b' ', body).map_or(0, |i| i + 1);
                let last = body
                    .get(last_start + 1..)
                    .filter(|_| body.get(last_start) == Some(&b't'))
                    .and_then(padded_digits)
                    .ok_or_else(|| bad("a malformed last token"))?;
                if first != self.next || last + 1 != first + count {
                    return Err(bad(&format!(
                        "tokens t{first}..t{last} ({count}) where t{} was due",
                        self.next
                    )));
                }
                self.next += count;
            }
        }
        let delivered = self.next - self.start - self.res.tokens;
        self.res.tokens += delivered;
        if self.expect() == Some(self.next) && self.res.all_at.is_none() {
            self.res.all_at = Some(Instant::now());
        }
        Ok(delivered)
    }

    /// A resync frame: a replay must never need one (the ledger has every
    /// event), so in Replay mode it is an error; elsewhere it is ignored.
    fn resync(&self, data: &[u8]) -> Result<Option<u64>, String> {
        match self.mode {
            Mode::Replay { .. } => Err(format!(
                "resync after seq {}: {}",
                self.res.last_seq,
                String::from_utf8_lossy(&data[..data.len().min(200)])
            )),
            _ => Ok(None),
        }
    }

    /// Whether the stream is complete: run_finished seen (the caller checks
    /// that) and every expected token in.
    fn check_complete(&self) -> Result<(), String> {
        match self.expect() {
            Some(e) if self.next != e => Err(format!("run_finished after {} of {e} tokens", self.next)),
            _ => Ok(()),
        }
    }
}

// ---------------------------------------------------------------- SSE

/// Incremental decoder of an HTTP/1.1 chunked body.
#[derive(Default)]
struct Chunked {
    state: ChunkState,
    size: usize,
}

#[derive(Default, Clone, Copy, PartialEq)]
enum ChunkState {
    #[default]
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Done,
    /// Not chunked: every byte is body.
    Raw,
}

impl Chunked {
    /// Appends the body bytes in `input` to `out`; Ok(true) once the last chunk was read.
    fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<bool, String> {
        while !input.is_empty() {
            match self.state {
                ChunkState::Data => {
                    let n = self.size.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.size -= n;
                    if self.size == 0 {
                        self.state = ChunkState::DataCr;
                    }
                    continue;
                }
                ChunkState::Done => return Ok(true),
                ChunkState::Raw => {
                    out.extend_from_slice(input);
                    return Ok(false);
                }
                _ => {}
            }
            let b = input[0];
            input = &input[1..];
            self.state = match (self.state, b) {
                (ChunkState::Size, b) if b.is_ascii_hexdigit() => {
                    let d = (b as char).to_digit(16).unwrap_or(0) as usize;
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(d))
                        .ok_or("chunk size overflow")?;
                    ChunkState::Size
                }
                (ChunkState::Size | ChunkState::Ext, b';') | (ChunkState::Ext, _) if b != b'\r' => {
                    ChunkState::Ext
                }
                (ChunkState::Size | ChunkState::Ext, b'\r') => ChunkState::SizeLf,
                (ChunkState::SizeLf, b'\n') if self.size == 0 => ChunkState::Done,
                (ChunkState::SizeLf, b'\n') => ChunkState::Data,
                (ChunkState::DataCr, b'\r') => ChunkState::DataLf,
                (ChunkState::DataLf, b'\n') => ChunkState::Size,
                (s, b) => {
                    return Err(format!(
                        "malformed chunked body at byte {b:#x} (state {})",
                        s as u8
                    ))
                }
            };
        }
        Ok(self.state == ChunkState::Done)
    }
}

/// What one SSE frame or gRPC message is, as far as the bench cares.
enum Kind<'a> {
    Opened,
    Text(&'a [u8]),
    Finished,
    Resync,
    Other,
}

/// The blank line that ends an SSE frame. A `Finder` is built once: building
/// one per search (`memmem::find`) was the bench's largest cost per frame.
static FRAME_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\n"));

/// Splits one SSE frame (without its blank line) into the event name, the
/// data line and the id line.
fn sse_fields(frame: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let (mut event, mut data, mut id) = (&b""[..], &b""[..], &b""[..]);
    let mut rest = frame;
    while !rest.is_empty() {
        let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..end];
        if let Some(v) = line.strip_prefix(b"event: ") {
            event = v;
        } else if let Some(v) = line.strip_prefix(b"data: ") {
            data = v;
        } else if let Some(v) = line.strip_prefix(b"id: ") {
            id = v;
        }
        rest = rest.get(end + 1..).unwrap_or(b"");
    }
    (event, data, id)
}

/// The text of a text_delta's JSON without parsing the JSON: the bytes
/// between `{"text":"` and the next quote (tokens never need escapes).
fn sse_delta_text(data: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"text_delta\":{\"text\":\"";
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
    let start = FINDER.find(data)? + KEY.len();
    let len = memchr::memchr2(b'"', b'\\', &data[start..])?;
    (data[start + len] == b'"').then(|| &data[start..start + len])
}

/// The full decode of a sampled SSE frame, compared with what the fast path read.
fn sse_validate(data: &[u8], id: &[u8], text: &[u8], session: &str) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_slice(data).map_err(|e| format!("sampled SSE data is not JSON: {e}"))?;
    let seq = v["seq"].as_u64().ok_or("sampled SSE frame has no seq")?;
    if digits(id) != Some(seq) {
        return Err(format!(
            "SSE id {:?} is not the seq {seq}",
            String::from_utf8_lossy(id)
        ));
    }
    if v["session_id"].as_str() != Some(session) {
        return Err("SSE frame of another session".into());
    }
    if v["text_delta"]["text"].as_str().map(str::as_bytes) != Some(text) {
        return Err("the fast path misread a text_delta".into());
    }
    Ok(())
}

fn sse_kind<'a>(event: &[u8], data: &'a [u8]) -> Result<Kind<'a>, String> {
    Ok(match event {
        b"text_delta" => Kind::Text(sse_delta_text(data).ok_or("a text_delta without text")?),
        b"stream_opened" => Kind::Opened,
        b"run_finished" => Kind::Finished,
        b"resync" => Kind::Resync,
        _ => Kind::Other,
    })
}

/// Reads the response head; returns the body bytes that came with it and
/// whether the body is chunked (vak's always is; nchan's is not).
async fn read_head(tcp: &mut TcpStream, buf: &mut [u8], peer: bool) -> Result<(Vec<u8>, bool), String> {
    let mut head = Vec::with_capacity(512);
    loop {
        let n = tcp.read(buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "the server closed before the response head: {:?}",
                String::from_utf8_lossy(&head)
            ));
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = memchr::memmem::find(&head, b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            if !text.starts_with("http/1.1 200") {
                return Err(format!(
                    "SSE refused: {}",
                    String::from_utf8_lossy(&head).lines().next().unwrap_or("")
                ));
            }
            let chunked = text.contains("transfer-encoding: chunked");
            if !(chunked || peer) || !text.contains("text/event-stream") {
                return Err(format!("unexpected SSE response head: {text}"));
            }
            return Ok((head[end + 4..].to_vec(), chunked));
        }
        if head.len() > 16 * 1024 {
            return Err("response head over 16 KiB".into());
        }
    }
}

/// One SSE subscriber of `GET /sessions/:id/events`: live only, or from
/// `?after=` a cursor.
pub(crate) async fn sse_subscriber(
    target: Target,
    session: String,
    after: Option<u64>,
    mode: Mode,
    shared: Arc<Shared>,
) -> SubResult {
    let mut tally = Tally::new(mode, &session, after);
    tally.shard = shared.delivered.shard();
    if let Err(e) = sse_run(&target, &session, after, &mut tally, &shared).await {
        tally.res.error = Some(e);
    }
    tally.res
}

/// Connects (one at a time per scenario, `shared.connecting`) and sends the GET.
async fn sse_connect(
    target: &Target,
    session: &str,
    after: Option<u64>,
    shared: &Shared,
) -> Result<TcpStream, String> {
    let _permit = shared.connecting.acquire().await.map_err(|e| e.to_string())?;
    let mut tcp = TcpStream::connect(target.addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let query = after.map_or(String::new(), |a| format!("?after={a}"));
    let path = match target.peer {
        true => format!("/sub/{session}"),
        false => format!("/sessions/{session}/events{query}"),
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        target.addr, target.token
    );
    tcp.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    Ok(tcp)
}

async fn sse_run(
    target: &Target,
    session: &str,
    after: Option<u64>,
    tally: &mut Tally,
    shared: &Shared,
) -> Result<(), String> {
    let read_size = match (shared.read_size, tally.mode) {
        (0, Mode::Idle | Mode::Stalled) => 2048,
        (0, _) => 64 * 1024,
        (n, _) => n,
    };
    let mut tcp = sse_connect(target, session, after, shared).await?;
    let mut buf = vec![0u8; read_size];
    let mut sse: Vec<u8> = Vec::with_capacity(read_size);
    let (mut pending, is_chunked) = read_head(&mut tcp, &mut buf, target.peer).await?;
    let mut chunked = Chunked::default();
    if !is_chunked {
        chunked.state = ChunkState::Raw;
    }
    // nchan sends no stream_opened: its stream is open once its head is in.
    let mut opened = target.peer;
    if opened {
        shared.opened.fetch_add(1, Ordering::AcqRel);
    }
    let mut scanned = 0usize;
    loop {
        let ended = chunked.feed(&pending, &mut sse)?;
        pending.clear();
        // Every complete frame in `sse`, each ended by a blank line.
        let mut pos = 0usize;
        let mut from = scanned.saturating_sub(1);
        while let Some(rel) = FRAME_END.find(&sse[from..]) {
            let end = from + rel;
            let frame = &sse[pos..end];
            pos = end + 2;
            from = pos;
            if sse_frame(frame, target.peer, tally, shared, &mut opened)? {
                return Ok(());
            }
        }
        sse.drain(..pos);
        scanned = sse.len();
        if ended {
            return Err("the server ended the SSE stream".into());
        }
        if opened && matches!(tally.mode, Mode::Stalled) {
            // Never read again: the server sees a client that stopped reading.
            shared.cancel.cancelled().await;
            return Ok(());
        }
        let n = tokio::select! {
            r = tcp.read(&mut buf) => r.map_err(|e| format!("read: {e}"))?,
            _ = shared.cancel.cancelled() => {
                return match tally.mode {
                    Mode::Idle => Ok(()),
                    _ => Err(format!("cancelled after {} tokens", tally.next)),
                };
            }
        };
        if n == 0 {
            return Err(format!(
                "the server closed the connection after {} tokens",
                tally.next
            ));
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

/// Counts and checks one SSE frame (without its blank line); true once the
/// subscriber has everything it waits for.
fn sse_frame(
    frame: &[u8],
    peer: bool,
    tally: &mut Tally,
    shared: &Shared,
    opened: &mut bool,
) -> Result<bool, String> {
    if frame.first() == Some(&b':') {
        return Ok(false); // keepalive comment
    }
    let (event, data, id) = sse_fields(frame);
    let tokens = match sse_kind(event, data)? {
        Kind::Opened => {
            if !*opened {
                *opened = true;
                shared.opened.fetch_add(1, Ordering::AcqRel);
            }
            None
        }
        Kind::Text(text) => {
            if tally.sample() && !peer {
                sse_validate(data, id, text, &tally.session)?;
                tally.res.validated += 1;
            }
            let n = tally.text(text)?;
            shared.delivered.add(tally.shard, n);
            Some(n)
        }
        Kind::Finished => {
            tally.check_complete()?;
            if tally.expect().is_some() {
                return Ok(true);
            }
            None
        }
        Kind::Resync => tally.resync(data)?,
        Kind::Other => None,
    };
    match (tally.mode, digits(id)) {
        (Mode::Replay { .. }, Some(seq)) => tally.seq(seq, tokens),
        _ => Ok(false),
    }
}

// ---------------------------------------------------------------- gRPC

/// Encodes the request with prost; hands each response message over as its raw bytes.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawCodec;

pub(crate) struct RequestEncoder;
pub(crate) struct RawDecoder;

impl Encoder for RequestEncoder {
    type Item = pb::SubscribeRequest;
    type Error = tonic::Status;
    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

impl Codec for RawCodec {
    type Encode = pb::SubscribeRequest;
    type Decode = Bytes;
    type Encoder = RequestEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Walks a message's fields: (field number, varint value or length-delimited bytes).
fn pb_fields<'a>(mut msg: &'a [u8], mut each: impl FnMut(u64, u64, &'a [u8])) -> Option<()> {
    while !msg.is_empty() {
        let key = varint(&mut msg)?;
        match key & 7 {
            0 => {
                let v = varint(&mut msg)?;
                each(key >> 3, v, b"");
            }
            2 => {
                let len = varint(&mut msg)? as usize;
                let body = msg.get(..len)?;
                msg = &msg[len..];
                each(key >> 3, 0, body);
            }
            _ => return None,
        }
    }
    Some(())
}

/// An Event's seq (field 1), kind (its oneof field number) and payload, read
/// by walking its fields: 10 stream_opened, 13 text_delta (field 1: text),
/// 20 run_finished, 21 resync.
fn pb_kind(msg: &[u8]) -> Result<(u64, Kind<'_>), String> {
    let mut kind = Kind::Other;
    let mut seq = 0;
    let mut text_delta: Option<&[u8]> = None;
    pb_fields(msg, |field, v, body| match field {
        1 => seq = v,
        10 => kind = Kind::Opened,
        13 => text_delta = Some(body),
        20 => kind = Kind::Finished,
        21 => kind = Kind::Resync,
        _ => {}
    })
    .ok_or("a malformed Event message")?;
    if let Some(td) = text_delta {
        let mut text: &[u8] = b"";
        pb_fields(td, |field, _, body| {
            if field == 1 {
                text = body;
            }
        })
        .ok_or("a malformed TextDelta")?;
        kind = Kind::Text(text);
    }
    Ok((seq, kind))
}

fn pb_validate(msg: &[u8], text: &[u8], session: &str) -> Result<(), String> {
    let ev = pb::Event::decode(msg).map_err(|e| format!("sampled Event does not decode: {e}"))?;
    if ev.seq == 0 || ev.session_id != session {
        return Err(format!(
            "sampled Event has seq {} session {:?}",
            ev.seq, ev.session_id
        ));
    }
    match ev.kind {
        Some(pb::event::Kind::TextDelta(t)) if t.text.as_bytes() == text => Ok(()),
        _ => Err("the fast path misread a text_delta".into()),
    }
}

/// `n` HTTP/2 connections to `target`, one tonic Channel each.
pub(crate) async fn grpc_connections(target: &Target, n: usize) -> Result<Vec<Channel>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let ch = Endpoint::from_shared(format!("http://{}", target.addr))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("gRPC connect: {e}"))?;
        out.push(ch);
    }
    Ok(out)
}

/// One gRPC `Subscribe` stream (live only, or after a cursor) on a shared connection.
pub(crate) async fn grpc_subscriber(
    channel: Channel,
    token: String,
    session: String,
    after: Option<u64>,
    mode: Mode,
    shared: Arc<Shared>,
) -> SubResult {
    let mut tally = Tally::new(mode, &session, after);
    tally.shard = shared.delivered.shard();
    if let Err(e) = grpc_run(channel, &token, &session, after, &mut tally, &shared).await {
        tally.res.error = Some(e);
    }
    tally.res
}

async fn grpc_run(
    channel: Channel,
    token: &str,
    session: &str,
    after: Option<u64>,
    tally: &mut Tally,
    shared: &Shared,
) -> Result<(), String> {
    let mut grpc = tonic::client::Grpc::new(channel);
    let mut stream = {
        let _permit = shared.connecting.acquire().await.map_err(|e| e.to_string())?;
        grpc.ready().await.map_err(|e| format!("gRPC not ready: {e}"))?;
        let mut req = tonic::Request::new(pb::SubscribeRequest {
            session_id: session.to_string(),
            after,
        });
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().map_err(|_| "bad token")?,
        );
        let path = http::uri::PathAndQuery::from_static("/vak.v1.AgentService/Subscribe");
        grpc.server_streaming(req, path, RawCodec)
            .await
            .map_err(|s| format!("Subscribe: {s}"))?
            .into_inner()
    };
    let mut opened = false;
    loop {
        if opened && matches!(tally.mode, Mode::Stalled) {
            shared.cancel.cancelled().await;
            return Ok(());
        }
        let msg = tokio::select! {
            m = stream.message() => m.map_err(|s| format!("stream failed after {} tokens: {s}", tally.next))?,
            _ = shared.cancel.cancelled() => {
                return match tally.mode {
                    Mode::Idle => Ok(()),
                    _ => Err(format!("cancelled after {} tokens", tally.next)),
                };
            }
        };
        let Some(msg) = msg else {
            return Err(format!("the stream ended after {} tokens", tally.next));
        };
        let (seq, kind) = pb_kind(&msg)?;
        let tokens = match kind {
            Kind::Opened => {
                if !opened {
                    opened = true;
                    shared.opened.fetch_add(1, Ordering::AcqRel);
                }
                None
            }
            Kind::Text(text) => {
                if tally.sample() {
                    pb_validate(&msg, text, session)?;
                    tally.res.validated += 1;
                }
                let n = tally.text(text)?;
                shared.delivered.add(tally.shard, n);
                Some(n)
            }
            Kind::Finished => {
                tally.check_complete()?;
                if tally.expect().is_some() {
                    return Ok(());
                }
                None
            }
            Kind::Resync => tally.resync(b"")?,
            Kind::Other => None,
        };
        if matches!(tally.mode, Mode::Replay { .. }) && seq > 0 && tally.seq(seq, tokens)? {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------- control

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for split in 0..body.len() {
            let mut d = Chunked::default();
            let mut out = Vec::new();
            let a = d.feed(&body[..split], &mut out).unwrap();
            let b = d.feed(&body[split..], &mut out).unwrap();
            // Done once the last-chunk line "0\r\n" is in (the trailer is not awaited).
            assert!(!a || split >= body.len() - 2);
            assert!(b);
            assert_eq!(out, b"hello, world");
        }
    }

    #[test]
    fn burst_deltas_count_tokens_and_check_the_sequence() {
        let mut t = Tally::new(Mode::Count { expect: 5 }, "s", None);
        t.text(b"t0 ").unwrap();
        t.text(b"t1 t2 t3 ").unwrap();
        assert!(t.text(b"t5 ").is_err(), "a gap is an error");
        let mut t2 = Tally::new(Mode::Count { expect: 2 }, "s", None);
        t2.text(b"t0 t1 ").unwrap();
        assert_eq!(t2.res.tokens, 2);
        assert!(t2.res.all_at.is_some());
        assert!(t2.check_complete().is_ok());
    }

    #[test]
    fn sized_burst_deltas_count_one_token_each_however_they_merge() {
        let mut t = Tally::new(Mode::Count { expect: 3 }, "s", None);
        t.text(b"t0______ ").unwrap();
        t.text(b"t1______ t2______ ").unwrap();
        assert_eq!(t.res.tokens, 3);
        assert!(t.check_complete().is_ok());
        let mut t = Tally::new(Mode::Count { expect: 3 }, "s", None);
        assert!(t.text(b"t1______ ").is_err(), "a gap is an error");
        assert!(Tally::new(Mode::Count { expect: 1 }, "s", None)
            .text(b"t_____ ")
            .is_err());
    }

    #[test]
    fn sse_fast_path_matches_the_json() {
        let frame = b"id: 7\nevent: text_delta\ndata: {\"seq\":7,\"session_id\":\"s\",\"text_delta\":{\"text\":\"t0 t1 \"}}";
        let (event, data, id) = sse_fields(frame);
        let Kind::Text(text) = sse_kind(event, data).unwrap() else {
            panic!("not a delta")
        };
        assert_eq!(text, b"t0 t1 ");
        sse_validate(data, id, text, "s").unwrap();
    }

    #[test]
    fn protobuf_fast_path_matches_prost() {
        let ev = pb::Event {
            seq: 9,
            session_id: "s".into(),
            kind: Some(pb::event::Kind::TextDelta(pb::TextDelta {
                text: "t3 t4 ".into(),
            })),
        };
        let bytes = ev.encode_to_vec();
        let (seq, Kind::Text(text)) = pb_kind(&bytes).unwrap() else {
            panic!("not a delta")
        };
        assert_eq!(seq, 9);
        assert_eq!(text, b"t3 t4 ");
        pb_validate(&bytes, text, "s").unwrap();
        let fin = pb::Event {
            seq: 10,
            session_id: "s".into(),
            kind: Some(pb::event::Kind::RunFinished(pb::RunFinished::default())),
        };
        assert!(matches!(
            pb_kind(&fin.encode_to_vec()).unwrap(),
            (10, Kind::Finished)
        ));
    }

    #[test]
    fn a_replay_starts_mid_burst_and_must_follow_its_cursor_exactly() {
        let mut t = Tally::new(Mode::Replay { until: 14 }, "s", Some(10));
        assert_eq!(t.text(b"t7 ").unwrap(), 1);
        assert!(!t.seq(11, Some(1)).unwrap());
        // A merged delta covers exactly the seqs it skips.
        assert_eq!(t.text(b"t8 t9 ").unwrap(), 2);
        assert!(!t.seq(13, Some(2)).unwrap());
        assert_eq!(t.res.tokens, 3);
        assert!(t.seq(14, None).unwrap(), "seq 14 completes the replay");
        let mut gap = Tally::new(Mode::Replay { until: 20 }, "s", Some(10));
        assert!(gap.seq(12, None).is_err(), "a skipped seq is an error");
        let mut back = Tally::new(Mode::Replay { until: 20 }, "s", Some(10));
        assert!(back.seq(10, None).is_err(), "a repeated seq is an error");
        assert!(back.resync(b"{}").is_err(), "a replay never needs a resync");
    }

    #[test]
    fn paced_tokens_yield_latencies() {
        let mut t = Tally::new(Mode::Latency { expect: 2 }, "s", None);
        let now = unix_micros();
        t.text(format!("p0@{} p1@{} ", now - 500, now - 100).as_bytes())
            .unwrap();
        assert_eq!(t.res.latencies.len(), 2);
        assert!(t.res.latencies[0] >= 500);
    }
}
