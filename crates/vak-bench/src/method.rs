//! The method paragraph of BENCHMARKS.md: how each scenario is measured, with this run's sizes.

use crate::memory;
use crate::scenarios::Env;
use crate::sizes::Sizes;

/// `1, 10, 100` for a list of sizes.
fn list<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

/// The whole paragraph, its parts in order.
pub(crate) fn method(sizes: &Sizes, env: &Env) -> String {
    [
        how(sizes, env),
        latency(sizes, env),
        growth_cluster(sizes, env),
        baselines(sizes, env),
        idle_stalled(sizes, env),
        replay_search(sizes, env),
        realistic(sizes, env),
        cpu_sizes(sizes, env),
    ]
    .concat()
}

/// How the servers run and the clients count.
fn how(sizes: &Sizes, env: &Env) -> String {
    format!(
        "How: the bench starts `target/release/vak serve --listen 127.0.0.1:0` as a child process \
(its own temp home and workspace, a random token, `--max-streams` and `--max-streams-per-client` \
raised to 1 000 000 because every client shares one address), a fresh server for every measurement, \
and drives it with its own clients on a multi-threaded tokio runtime in a separate process. \
Both processes share this machine's cores: the CPU column says how much each used. \
SSE subscribers are raw HTTP/1.1 connections, one per subscriber; gRPC subscribers are tonic \
streams, {per} per HTTP/2 connection (so 1000 subscribers use {c1000} connections and {idle} idle streams \
{cidle}). A run is started with gRPC `Run` after every subscriber has its `stream_opened`. \
Delivered events are counted as `t{{i}} ` tokens in text_delta text, not frames: under backpressure vak \
merges queued deltas into one frame. Every frame's first and last token are checked to continue the \
sequence and one frame in 1024 is decoded in full (serde_json / prost) and compared. \
Throughput = subscribers x deltas / time from `Run` until the last subscriber has its last delta. \
",
        per = env.per_conn,
        c1000 = 1000usize.div_ceil(env.per_conn),
        idle = sizes.idle,
        cidle = format_args!("{} connections", sizes.idle.div_ceil(env.per_conn)),
    )
}

/// The latency curve, its floor, and where p99 crosses 10 ms.
fn latency(sizes: &Sizes, _env: &Env) -> String {
    format!(
        "Latency curve: {lsubs} subscribers of one session (SSE, and gRPC) and `/pace N R` at each rate R of {rates} events/s \
for {lsecs} s (N = R x {lsecs}); the server stamps each delta with its send time (unix microseconds), each client \
subtracts it from its receipt time (both clocks are this machine's one clock) and p50/p99/max are over every \
delta of every subscriber; the p99 goal (< 10 ms) is held at 1 000 events/s ({lsubs} x 1 000 deliveries/s). \
The floor rows (`SSE floor`) run the same curve with no vak: one plain thread in the bench process accepts the \
same SSE clients and, at each rate, writes the same frames to their sockets, each socket once per sweep with \
every frame it has not had (non-blocking writes, sleeping until the next frame is due): what loopback TCP and \
the bench's own reading cost on this machine; its CPU is counted as the bench's. It also runs at 10 events/s, \
where each event reaches every subscriber before the next is due. \
Where p99 crosses 10 ms: the curve's median p99 per rate brackets it (the last rate under 10 ms, the first at or \
over), then up to {steps} bisection steps each measure the bracket's geometric middle once (rounded to 10/s) and keep \
the half that still brackets it (a curve at or over 10 ms already at its lowest rate is first measured at a tenth of \
that rate); the row gives the final bracket and its geometric middle, and every bisection point. \
",
        lsubs = sizes.latency_subs,
        rates = list(&sizes.latency_rates),
        lsecs = sizes.latency_secs,
        steps = sizes.cross_steps,
    )
}

/// The growth table and the cluster.
fn growth_cluster(sizes: &Sizes, _env: &Env) -> String {
    format!(
        "Growth (SSE, {gruns} run(s) per point): server CPU per delivered event (the server's CPU time over the run, from \
/proc, divided by subscribers x deltas) and server peak RSS (VmHWM) as one session gets more subscribers \
({gsubs}), as more sessions run at once with one subscriber each ({gsess}, all `/burst` at once), and as deltas \
grow ({gsizes} bytes, `/burst N SIZE` pads each `t{{i}}` token with `_`, to {gsizesubs} subscribers); each point \
sends about {gdel} deliveries (half that for sessions, but at least {gsd} deltas per session: a run's own work, its \
turn, receipts and search indexing, is the same however many deltas it streams; sized points at most {gbytes} MiB \
of deltas; never fewer than {gmin} deltas per stream), the count is in the row. A point is flagged **faster than linear** when its CPU per \
event exceeds the previous point's by more than 1.5x (on the size axis: by more than 1.5x the size ratio), or when \
the RSS each added subscriber, session or byte costs over the first point rises by more than 1.5x from one step to \
the next (and by more than 16 MiB). Each size point also gives its delivered payload (deltas x size per second), \
and is followed by its floor (`SSE floor`): the same frames, all due at once, written to the same readers by one \
plain thread in the bench process with no vak, read and checked the same way. \
Cluster: 3 nats-server nodes ({cnodes}; JetStream, an R3 stream) on loopback and 3 `vak serve --bus ... --bus-replicas 3` \
replicas with one token; a session made and run on replica 0 (which takes its lease), {csubs} SSE subscribers \
spread round-robin over the 3 replicas: delivered events/s of `/burst {cburst}`, then p50/p99/max of `/pace {cpace} {crate}` \
in a fresh session; then a fresh session with one subscriber on replica 0 gets `/burst {cone}`, and an embedded \
server (no `--bus`) the same right after: the ratio of the two events/s. CPU is the three replicas' together. \
",
        gruns = sizes.growth_runs,
        gsubs = list(&sizes.growth_subs),
        gsess = list(&sizes.growth_sessions),
        gsizes = list(&sizes.growth_sizes),
        gsizesubs = sizes.growth_size_subs,
        gdel = sizes.growth_deliveries,
        gbytes = sizes.growth_size_bytes >> 20,
        gmin = sizes.growth_min_events,
        gsd = sizes.growth_session_deltas,
        cnodes = if std::env::var_os("VAK_NATS_SERVER").is_some() {
            "the binary VAK_NATS_SERVER names"
        } else {
            "target/nats-venv, from `make nats`"
        },
        csubs = sizes.cluster.subs,
        cburst = sizes.cluster.burst,
        cpace = sizes.cluster.pace,
        crate = sizes.cluster.rate,
        cone = sizes.cluster.one_burst,
    )
}

/// Raw tonic and the durability modes.
fn baselines(_sizes: &Sizes, env: &Env) -> String {
    format!(
        "Raw tonic: the bench re-executes itself as a plain tonic server of vak's own generated `AgentService` whose \
Subscribe is a `tokio::sync::broadcast` receiver (capacity {cap}, so nothing lags) and whose `Run(\"/burst N\")` \
sends the same Events; same client code, same connection sharing. \
Every server runs with the default `--durability process` (a batch reaches the kernel before any client sees it) \
except in the rows that say `--durability fsync` (fdatasync per batch before it is visible), measured right after the process rows of the same run. \
",
        cap = env.capacity,
    )
}

/// Idle streams, the peer, the stalled client.
fn idle_stalled(sizes: &Sizes, _env: &Env) -> String {
    format!(
        "Idle: VmRSS of the server before the streams and after every one had stream_opened (plus 1 s), divided \
by the streams; the SSE rows over TLS (`--tls-self-signed`, HTTP/1.1) and over HTTP/2 (h2c) use reqwest, one \
connection per stream. Reconnect storm (SSE): on a fresh server, {idle} streams of one session opened all at once (the idle row opens them at most 128 at a time), VmRSS 2 s after the last had stream_opened, less VmRSS before the first storm, per stream; then they close, and 2 s later the next storm of {idle} comes, {storms} storms in all. nginx + nchan (with `--peer nchan`): nginx 1.22 with Debian's nchan module, one worker \
process, a subscriber location `nchan_subscriber eventsource` read by the same raw SSE client, and a publisher \
location fed by the bench on one connection with pipelined POSTs of the JSON vak writes for a delta (event name \
from `X-EventSource-Event`), then a run_finished; RSS and CPU are the worker's, and its stream is open once its \
response head is in (nchan sends no stream_opened); throughput is from the first publish, not from a Run. Stalled: one of {stalled} subscribers reads stream_opened and then never reads again (on gRPC on its own \
connection); its peers' time to the last delta is compared with an unstalled {stalled}-subscriber fan-out run just \
before it; peak RSS is the server's VmHWM; /burst {sburst_stall}. \
",
        stalled = sizes.stalled_subs,
        sburst_stall = sizes.stall_burst,
        idle = sizes.idle,
        storms = crate::storm::STORMS,
    )
}

/// Replay from disk and search.
fn replay_search(sizes: &Sizes, _env: &Env) -> String {
    format!(
        "Replay from disk: S sessions each get H events of history (`/burst H` in each, all at once, \
with nobody watching: `--first-subscriber-wait-ms 0`); then each gets a stalled subscriber (a stream with `after=0` that \
reads stream_opened and never reads again; on gRPC each on its own connection) and, 0.5 s later, one reader from a \
cursor H events before its latest seq, far older than the 1024-frame replay ring, so the ledger on disk \
serves it (S and H in the row: {replay}); each reader checks every seq continues the last one (a merged delta must cover exactly the seqs it skips), \
the tokens continue and no resync comes, until the session's latest seq. Time: from opening the readers until the \
last has its last event; peak RSS: the server's VmHWM reset (/proc/<pid>/clear_refs) just before the readers. \
Search: S sessions (S in the row), each created and given one run (gRPC `Run` with `wait`, 16 at a time) whose \
prompt carries a word of its own; once the last session's word is found, the first session's word is searched \
{squeries} times in a row with gRPC `Search` (limit 20), each round trip timed by the client. \
",
        replay = sizes
            .replay
            .iter()
            .map(|(t, s, h)| format!("{} {s} x {h}", t.label()))
            .collect::<Vec<_>>()
            .join(", "),
        squeries = sizes.search_queries,
    )
}

/// The realistic-load scenario.
fn realistic(sizes: &Sizes, env: &Env) -> String {
    format!(
        "Realistic load (points S x R x K: {points}): S sessions made at once, K readers each, every other reader in \
(session, reader) order SSE and the rest gRPC ({per} streams per HTTP/2 connection; with K = 2 each session has one of each), \
SSE read buffers 4 KiB; once every reader has its stream_opened, the sessions get their runs (gRPC `Run`, 128 at a \
time): `/sleep` until a common start (1 s + 1 ms per session after the first Run is sent, so every run is admitted \
before any streams; a Run sent later starts at once and is counted late) plus the session's phase (spread evenly over \
one period 1/R), then `/pace N R` (N = R x the seconds): every session streams a delta every 1/R s to its K readers, \
S x R x K deliveries/s offered. Every reader \
checks each delta continues its sequence exactly once and in order and that all N arrive. Latency is publish (the \
model's stamp as it emits the delta) to receipt, p50/p99/max over every delta of every reader; a server that falls \
behind shows in delivered/offered (the pacing catches up late) rather than in this latency. Delivered/offered, \
server CPU and bench CPU come from a sampler reading the readers' delivered count and /proc every 100 ms, over the \
steady window: from 0.25 s after the common start (or the last admission, if later) to 0.1 s before the first session's last delta was due, \
when every session is streaming (the whole run if that is under 0.5 s). Server peak RSS is its VmHWM at the end. \
The bench and the server share the machine's cores: at full size the bench's own reading of every delta competes \
with the server (the CPU column shows both). The floor rows (`SSE floor`) run each point right after with no \
vak: this bench re-executed as a process of its own where one plain thread accepts S x K SSE readers (all SSE: it \
speaks no gRPC) and writes each session's deltas, with the same phases and pacing, to its K sockets as each is due \
(one write per delta per socket, sleeping until the next is due, never spinning); its CPU and RSS are read as a \
server's: what S x R x K small writes a second cost this machine's loopback TCP before vak costs anything. One \
thread, so past about one core of writes the floor itself falls behind (delivered/offered shows it). \
",
        points = sizes
            .realistic
            .iter()
            .map(|p| format!("{} x {}/s x {} for {} s", p.sessions, p.rate, p.readers, p.secs))
            .collect::<Vec<_>>()
            .join(", "),
        per = env.per_conn,
    )
}

/// The CPU column, the memory scenario and the sizes.
fn cpu_sizes(sizes: &Sizes, _env: &Env) -> String {
    format!(
        "The CPU column is the median share of the measured interval each \
process used, in cores; \"others\" is everything else on the machine (/proc/stat), which competes for the same cores. {memory} Sizes: burst {burst}, {sessions} sessions x {sburst}, {runs} runs each ({rruns} of the replay).\n",
        memory = memory::method(&sizes.memory),
        burst = sizes.burst,
        sessions = sizes.sessions,
        sburst = sizes.session_burst,
        runs = sizes.runs,
        rruns = sizes.replay_runs.min(sizes.runs),
    )
}
