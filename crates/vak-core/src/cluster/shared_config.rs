//! What replicas share besides sessions (`--bus`): the model route, the permission mode, each workspace's always-allow rules and the providers' keys (sealed with the cluster secret) in the KV bucket `VAK_CONFIG`, which every replica watches.
//!
//! Keys of the bucket:
//! - `route`: the model route (`SharedRoute`); its KV revision is the
//!   configuration's revision (`bus-<n>`), and a change is an update
//!   expecting the revision it was based on, so a stale change is refused
//!   on whichever replica it reaches (the KV update is the compare-and-set).
//! - `mode`: the permission mode, and whether taking it up interrupts
//!   (`POST /config/mode`: every replica denies its approvals and cancels
//!   its runs) or only switches (an approved plan). Last writer wins.
//! - `rules.<workspace key>`: a workspace's always-allow rules, the same
//!   document the rules file holds; changed by compare-and-set too, so two
//!   replicas adding rules at once both keep theirs.
//! - `key.<provider>`: a provider's API key, sealed (`Cipher`): never a
//!   plaintext key in NATS. Without a cluster secret keys are not shared.
//!
//! With a cluster secret, `route`, `mode` and `rules.<…>` are signed
//! (crates/vak-core/src/cluster_secret.rs): a value without a good signature is
//! refused and logged, and the last good value stays in force; a change
//! based on a refused value (a compare-and-set over it) writes the last
//! good value, signed. Deletes carry no value to sign: a deleted route or
//! mode is ignored, deleted rules are no rules (a delete only takes away).
//!
//! Every replica reads the whole bucket when it starts (so it adopts the
//! bucket's route over its flags and config.toml), then applies each change
//! the watch delivers, in revision order: what a replica serves and what a
//! leg uses come from memory, never from a read of NATS on the hot path.
//! Reads made to decide a change go to the stream's leader (a direct get may
//! be served by a follower a moment behind).

use crate::error::{Error, ErrorKind, Result};
use crate::provider::{ProviderKind, Secret};
use crate::route::{RouteSpec, Source};
use crate::rule::Rule;
use crate::PermissionMode;
use async_nats::jetstream::kv;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// The KV bucket of shared configuration.
pub const BUCKET: &str = "VAK_CONFIG";
/// The key of the model route.
pub const ROUTE_KEY: &str = "route";
/// The key of the permission mode.
pub const MODE_KEY: &str = "mode";
/// A provider's key is `key.<provider>`.
pub const KEY_PREFIX: &str = "key.";
/// A workspace's rules are `rules.<workspace key>`.
pub const RULES_PREFIX: &str = "rules.";
/// The key of the MCP servers' table (`PUT /config/mcp`): obeyed only
/// signed with the cluster secret, since it names commands every replica runs.
pub const MCP_KEY: &str = "mcp";
/// The key of the scheduled tasks (`/tasks`): scripts every replica may
/// run, so obeyed only signed, like the MCP servers.
pub const TASKS_KEY: &str = "tasks";
/// The largest value the bucket takes (a workspace's 256 rules fit).
pub const MAX_VALUE: usize = 768 * 1024;
use crate::cluster::cluster_secret::{document, signed, Unsigned};
pub use crate::cluster::cluster_secret::{Cipher, MIN_SECRET};
/// How many times a change is tried when other replicas change the same
/// key meanwhile (a route change without a revision, a rules change).
pub const CAS_TRIES: usize = 16;
/// The longest a read or write of the bucket may take.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// The revision string of a bucket revision.
pub fn revision_string(n: u64) -> String {
    format!("bus-{n}")
}

/// The route as the bucket holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedRoute {
    pub provider: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Kept in the bucket as its name (`Source::as_str`).
    #[serde(with = "source_name")]
    pub source: Source,
    /// The replica that wrote it.
    #[serde(default)]
    pub replica: String,
}

/// A route's source as the bucket holds it: its name, an unknown one read as `Api`.
mod source_name {
    use super::Source;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(s: &Source, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Source, D::Error> {
        String::deserialize(d).map(|s| Source::parse(&s))
    }
}

fn spec_of(r: &SharedRoute) -> Option<RouteSpec> {
    Some(RouteSpec {
        provider: ProviderKind::parse(&r.provider)?,
        model: r.model.clone(),
        base_url: r.base_url.clone(),
        source: r.source,
    })
}

/// The permission mode every replica shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedMode {
    pub mode: PermissionMode,
    /// Whether replicas deny pending approvals and cancel runs when they
    /// take it up (`POST /config/mode`), or only switch (an approved plan).
    pub interrupt: bool,
}

/// `SharedMode` as the bucket holds it: `{"mode":"plan","interrupt":true}`.
#[derive(Serialize, Deserialize)]
struct ModeValue {
    mode: String,
    interrupt: bool,
}

/// A workspace's rules as the bucket holds them (the rules file's shape).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RulesValue {
    pub version: u32,
    pub workspace: String,
    pub rules: Vec<Rule>,
}

/// What the bucket says, as this replica has applied it. Every entry keeps
/// the revision it came with, so an older one never replaces a newer one
/// (a change made here is applied before the watch brings it back).
#[derive(Default)]
struct State {
    route: Option<(RouteSpec, u64)>,
    mode: Option<(SharedMode, u64)>,
    /// None: deleted at that revision.
    keys: HashMap<ProviderKind, (Option<Secret>, u64)>,
    rules: HashMap<String, (Arc<Vec<Rule>>, u64)>,
    mcp: Option<(crate::mcp::config::ServerDefs, u64)>,
    /// The tasks' JSON document (the scheduler's store reads it).
    tasks: Option<(Arc<Vec<u8>>, u64)>,
}

/// Puts `v`, read at revision `rev`, in `slot` unless the slot holds a
/// value at least as new; whether it did.
fn newer<T>(slot: &mut Option<(T, u64)>, v: T, rev: u64) -> bool {
    if slot.as_ref().is_some_and(|(_, r)| *r >= rev) {
        return false;
    }
    *slot = Some((v, rev));
    true
}

/// This replica's view of `VAK_CONFIG`.
pub struct SharedConfig {
    kv: kv::Store,
    cipher: Option<Cipher>,
    replica: String,
    state: Mutex<State>,
    /// Bumped when the route or a key changes (not rules: they are read live).
    changes: watch::Sender<u64>,
    /// Bumped when the permission mode changes.
    modes: watch::Sender<u64>,
    /// Bumped when the MCP servers' table changes.
    mcps: watch::Sender<u64>,
    /// Bumped when the tasks change.
    tasks: watch::Sender<u64>,
    /// This replica's own route (`seed_route`): what stands in for a
    /// refused route when no good one was ever applied here.
    own: Mutex<Option<RouteSpec>>,
}

impl std::fmt::Debug for SharedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConfig")
            .field("keys_shared", &self.cipher.is_some())
            .finish_non_exhaustive()
    }
}

fn nats_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{what}: {e}"))
}

async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(nats_error(what, e)),
        Err(_) => Err(nats_error(what, format!("no answer in {OP_TIMEOUT:?}"))),
    }
}

/// The JetStream error code behind `e`, if any (async-nats passes some,
/// like 10164, on as "other" with the server's error as a source).
fn js_code(e: &(dyn std::error::Error + 'static)) -> Option<u64> {
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(js) = err.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(js.error_code().0);
        }
        at = err.source();
    }
    None
}

/// What a refused compare-and-set means.
enum Refusal {
    /// Another write came first (10071).
    Lost,
    /// The server could not check yet: an earlier write to the key is
    /// still being applied (10164). Asked again, it decides.
    InFlight,
    Other,
}

/// `lost`: async-nats already named it a lost race.
fn refusal(e: &(dyn std::error::Error + 'static), lost: bool) -> Refusal {
    match js_code(e) {
        _ if lost => Refusal::Lost,
        Some(super::jetstream::WRONG_LAST_SEQUENCE) => Refusal::Lost,
        Some(super::jetstream::LAST_SEQUENCE_IN_FLIGHT) => Refusal::InFlight,
        _ => Refusal::Other,
    }
}

/// The value of `key` and the revision of its last message, read from
/// the stream's leader: None when the key was never written, a None
/// value when its last message is a delete.
pub(crate) async fn leader_read(kv: &kv::Store, key: &str) -> Result<Option<(Option<bytes::Bytes>, u64)>> {
    let subject = format!("$KV.{}.{key}", kv.name);
    let got = tokio::time::timeout(OP_TIMEOUT, kv.stream.get_last_raw_message_by_subject(&subject))
        .await
        .map_err(|_| {
            nats_error(
                &format!("cannot read {}", kv.name),
                format!("no answer in {OP_TIMEOUT:?}"),
            )
        })?;
    match got {
        Ok(m) => {
            let deleted = m
                .headers
                .get("KV-Operation")
                .is_some_and(|v| matches!(v.as_str(), "DEL" | "PURGE"));
            Ok(Some(((!deleted).then_some(m.payload), m.sequence)))
        }
        Err(e) if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
            Ok(None)
        }
        Err(e) => Err(nats_error(&format!("cannot read {}", kv.name), e)),
    }
}

/// Writes `value` to `key` if the key's last message is still
/// `expected` (None: the key was never written). Ok(None) when another
/// write came first.
pub(crate) async fn cas(
    kv: &kv::Store,
    key: &str,
    value: Vec<u8>,
    expected: Option<u64>,
) -> Result<Option<u64>> {
    let what = format!("cannot write {key} to {}", kv.name);
    let value = bytes::Bytes::from(value);
    let deadline = tokio::time::Instant::now() + OP_TIMEOUT;
    loop {
        let write = async {
            match expected {
                Some(rev) => kv.update(key, value.clone(), rev).await.map_err(|e| {
                    let lost = e.kind() == kv::UpdateErrorKind::WrongLastRevision;
                    (refusal(&e, lost), e.to_string())
                }),
                None => kv.create(key, value.clone()).await.map_err(|e| {
                    let lost = e.kind() == kv::CreateErrorKind::AlreadyExists;
                    (refusal(&e, lost), e.to_string())
                }),
            }
        };
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(n)) => return Ok(Some(n)),
            Ok(Err((Refusal::Lost, _))) => return Ok(None),
            // Asked again with the same expectation: the server decides
            // once the earlier write is applied.
            Ok(Err((Refusal::InFlight, _))) => tokio::time::sleep(Duration::from_millis(20)).await,
            Ok(Err((Refusal::Other, e))) => return Err(nats_error(&what, e)),
            Err(_) => return Err(nats_error(&what, format!("no answer in {OP_TIMEOUT:?}"))),
        }
    }
}

/// Logs a value of `key` refused for its signature (never applied).
fn refused(key: &str, rev: u64, why: Unsigned) {
    tracing::warn!(
        key,
        revision = rev,
        "refusing the value of {key} in {BUCKET}: it is {}; not applied, the last good value stays in force \
         (written by someone with NATS access but not the cluster secret, or by a replica without \
         --bus-secret-file or from before values were signed; the next change made through vak signs it again)",
        why.as_str()
    );
}

/// Why a key cannot be stored or deleted on a replica without the secret.
fn no_secret() -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        "this replica shares NATS (--bus) but has no cluster secret (--bus-secret-file), so keys \
         cannot be shared encrypted: give every replica the same secret file, or export the key \
         in every replica's environment",
    )
    .with_reason("no_bus_secret")
}

impl SharedConfig {
    /// Opens the bucket (creating it with `replicas` copies if it is
    /// missing), reads all of it, and applies its changes from then on.
    pub async fn open(
        client: async_nats::Client,
        replicas: usize,
        replica: String,
        cipher: Option<Cipher>,
    ) -> Result<Arc<SharedConfig>> {
        let config = super::jetstream::bucket_config(
            BUCKET,
            "vak: the model route, always-allow rules and sealed provider keys every replica shares",
            MAX_VALUE,
            replicas,
        );
        let kv = super::jetstream::key_value(&client, config).await?;
        let shared = Arc::new(SharedConfig {
            kv,
            cipher,
            replica,
            state: Mutex::new(State::default()),
            changes: watch::channel(0).0,
            modes: watch::channel(0).0,
            mcps: watch::channel(0).0,
            tasks: watch::channel(0).0,
            own: Mutex::new(None),
        });
        let held = bounded(
            "cannot read the bucket VAK_CONFIG",
            shared.kv.stream.clone().info(),
        )
        .await?
        .state
        .messages;
        let mut watch = bounded(
            "cannot watch the bucket VAK_CONFIG",
            shared.kv.watch_with_history(">"),
        )
        .await?;
        // Everything the bucket held, before this replica serves anything.
        if held > 0 {
            let initial = async {
                while let Some(entry) = watch.next().await {
                    let entry = entry.map_err(|e| nats_error("cannot read the bucket VAK_CONFIG", e))?;
                    let last = entry.delta == 0;
                    shared.apply(entry);
                    if last {
                        break;
                    }
                }
                Ok::<(), Error>(())
            };
            bounded("cannot read the bucket VAK_CONFIG", initial).await?;
        }
        tokio::spawn(Self::follow(Arc::downgrade(&shared), watch));
        Ok(shared)
    }

    /// Applies every change the watch brings, watching again (from the
    /// last value of each key) when the watch ends, until the config is dropped.
    async fn follow(me: std::sync::Weak<SharedConfig>, mut watch: kv::Watch) {
        loop {
            while let Some(entry) = watch.next().await {
                let Some(shared) = me.upgrade() else { return };
                match entry {
                    Ok(entry) => shared.apply(entry),
                    Err(e) => {
                        tracing::warn!("watching VAK_CONFIG: {e}");
                        break;
                    }
                }
            }
            let Some(shared) = me.upgrade() else { return };
            tracing::warn!("the watch of VAK_CONFIG ended: watching it again");
            loop {
                match shared.kv.watch_with_history(">").await {
                    Ok(w) => {
                        watch = w;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("cannot watch VAK_CONFIG: {e}; trying again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The document of `key`'s value `bytes` (revision `rev`), or None when
    /// its signature is missing or wrong: refused, and logged naming the key.
    fn checked<'a>(&self, key: &str, rev: u64, bytes: &'a [u8]) -> Option<&'a [u8]> {
        match document(self.cipher.as_ref(), key, bytes) {
            Ok(doc) => Some(doc),
            Err(why) => {
                refused(key, rev, why);
                None
            }
        }
    }

    /// Applies one entry of the bucket, unless this replica already has a
    /// newer value of its key.
    fn apply(&self, entry: kv::Entry) {
        let rev = entry.revision;
        let put = entry.operation == kv::Operation::Put;
        let key = entry.key.as_str();
        // Route, mode and rules are obeyed only as signed (with a secret);
        // keys are sealed, which authenticates them already.
        let doc = if put && !key.starts_with(KEY_PREFIX) {
            match self.checked(key, rev, &entry.value) {
                Some(doc) => doc,
                None => return,
            }
        } else {
            &entry.value[..]
        };
        if key == ROUTE_KEY {
            let Some(spec) = put
                .then(|| serde_json::from_slice::<SharedRoute>(doc).ok())
                .flatten()
                .and_then(|r| spec_of(&r))
            else {
                tracing::warn!("ignoring an unreadable route in VAK_CONFIG (revision {rev})");
                return;
            };
            self.set_route(spec, rev);
        } else if key == MODE_KEY {
            let parsed = put
                .then(|| serde_json::from_slice::<ModeValue>(doc).ok())
                .flatten()
                .and_then(|v| {
                    let mode = PermissionMode::parse(&v.mode).ok()?;
                    Some(SharedMode {
                        mode,
                        interrupt: v.interrupt,
                    })
                });
            match parsed {
                Some(m) => self.set_mode(m, rev),
                None => {
                    tracing::warn!("ignoring an unreadable permission mode in VAK_CONFIG (revision {rev})")
                }
            }
        } else if let Some(name) = key.strip_prefix(KEY_PREFIX) {
            let Some(kind) = ProviderKind::parse(name) else {
                return;
            };
            let secret = if put {
                match &self.cipher {
                    Some(c) => match c.open(kind, &entry.value) {
                        Some(s) => Some(s),
                        None => {
                            tracing::error!(
                                provider = kind.as_str(),
                                "the shared key does not open with this replica's cluster secret: \
                                 give every replica the same --bus-secret-file"
                            );
                            None
                        }
                    },
                    None => None,
                }
            } else {
                None
            };
            self.set_key(kind, secret, rev);
        } else if key == MCP_KEY {
            if self.cipher.is_none() {
                tracing::warn!(
                    "ignoring the MCP servers in VAK_CONFIG (revision {rev}): they name commands to run, \
                     and this replica has no cluster secret (--bus-secret-file) to check their signature"
                );
                return;
            }
            let defs = put
                .then(|| serde_json::from_slice::<crate::mcp::config::ServerDefs>(doc).ok())
                .flatten()
                .filter(|d| crate::mcp::config::validate(d).is_ok());
            match defs {
                Some(d) => self.set_mcp(d, rev),
                None => tracing::warn!("ignoring unreadable MCP servers in VAK_CONFIG (revision {rev})"),
            }
        } else if key == TASKS_KEY {
            if self.cipher.is_none() {
                tracing::warn!(
                    "ignoring the tasks in VAK_CONFIG (revision {rev}): they name scripts to run, \
                     and this replica has no cluster secret (--bus-secret-file) to check their signature"
                );
                return;
            }
            let doc = if put { doc.to_vec() } else { b"[]".to_vec() };
            if newer(&mut self.lock().tasks, Arc::new(doc), rev) {
                self.tasks.send_modify(|n| *n += 1);
            }
        } else if let Some(ws) = key.strip_prefix(RULES_PREFIX) {
            let rules = if put {
                match serde_json::from_slice::<RulesValue>(doc) {
                    Ok(v) => v.rules,
                    Err(e) => {
                        tracing::error!(workspace = ws, "ignoring unreadable rules in VAK_CONFIG: {e}");
                        return;
                    }
                }
            } else {
                Vec::new()
            };
            self.set_rules(ws, rules, rev);
        }
    }

    fn set_route(&self, spec: RouteSpec, rev: u64) {
        if newer(&mut self.lock().route, spec, rev) {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    fn set_mode(&self, mode: SharedMode, rev: u64) {
        if newer(&mut self.lock().mode, mode, rev) {
            self.modes.send_modify(|n| *n += 1);
        }
    }

    /// The bucket's permission mode, as last applied here (None: nobody
    /// changed it since the bucket was made; each replica starts in its own).
    pub fn mode(&self) -> Option<SharedMode> {
        self.lock().mode.map(|(m, _)| m)
    }

    /// Notified when the permission mode changed (on any replica).
    pub fn mode_changes(&self) -> watch::Receiver<u64> {
        self.modes.subscribe()
    }

    /// `doc` as stored under `key`: signed with a secret, bare without.
    fn wrap(&self, key: &str, doc: Vec<u8>) -> Vec<u8> {
        match &self.cipher {
            Some(c) => signed(c, key, &doc),
            None => doc,
        }
    }

    /// Makes `mode` every replica's.
    pub async fn put_mode(&self, mode: SharedMode) -> Result<()> {
        let value = serde_json::to_vec(&ModeValue {
            mode: mode.mode.as_str().to_string(),
            interrupt: mode.interrupt,
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        let value = self.wrap(MODE_KEY, value);
        let rev = bounded(
            "cannot write the permission mode to VAK_CONFIG",
            self.kv.put(MODE_KEY, value.into()),
        )
        .await?;
        self.set_mode(mode, rev);
        Ok(())
    }

    fn set_key(&self, kind: ProviderKind, secret: Option<Secret>, rev: u64) {
        {
            let mut s = self.lock();
            if s.keys.get(&kind).is_some_and(|(_, r)| *r >= rev) {
                return;
            }
            s.keys.insert(kind, (secret, rev));
        }
        self.changes.send_modify(|n| *n += 1);
    }

    fn set_rules(&self, ws: &str, rules: Vec<Rule>, rev: u64) {
        let mut s = self.lock();
        if s.rules.get(ws).is_some_and(|(_, r)| *r >= rev) {
            return;
        }
        s.rules.insert(ws.to_string(), (Arc::new(rules), rev));
    }

    fn set_mcp(&self, defs: crate::mcp::config::ServerDefs, rev: u64) {
        if newer(&mut self.lock().mcp, defs, rev) {
            self.mcps.send_modify(|n| *n += 1);
        }
    }

    /// The MCP servers' table in the bucket, as last applied here (None:
    /// nobody has put one, or this replica cannot check its signature).
    pub fn mcp(&self) -> Option<crate::mcp::config::ServerDefs> {
        self.lock().mcp.as_ref().map(|(d, _)| d.clone())
    }

    /// Notified when the MCP servers' table changed (on any replica).
    pub fn mcp_changes(&self) -> watch::Receiver<u64> {
        self.mcps.subscribe()
    }

    /// Makes `defs` every replica's MCP servers: signed, so only a replica
    /// with the cluster secret writes it (PermissionDenied, `no_bus_secret`,
    /// without one) and every replica checks it before it runs anything.
    pub async fn put_mcp(&self, defs: &crate::mcp::config::ServerDefs) -> Result<()> {
        let value = serde_json::to_vec(defs).map_err(|e| Error::internal(e.to_string()))?;
        let rev = self.put_signed(MCP_KEY, "MCP servers", value).await?;
        self.set_mcp(defs.clone(), rev);
        Ok(())
    }

    /// The tasks every replica shares (their JSON document), as last applied here.
    pub fn tasks(&self) -> Option<Arc<Vec<u8>>> {
        self.lock().tasks.as_ref().map(|(d, _)| d.clone())
    }

    /// Bumped when the tasks change (from any replica).
    pub fn task_changes(&self) -> watch::Receiver<u64> {
        self.tasks.subscribe()
    }

    /// Makes `doc` every replica's tasks: signed, like the MCP servers
    /// (their scripts are commands every replica may run).
    pub async fn put_tasks(&self, doc: Vec<u8>) -> Result<()> {
        let rev = self.put_signed(TASKS_KEY, "tasks", doc.clone()).await?;
        newer(&mut self.lock().tasks, Arc::new(doc), rev);
        Ok(())
    }

    /// Writes a value that names commands every replica runs: signed with
    /// the cluster secret, or refused without one. Its revision.
    async fn put_signed(&self, key: &str, what: &str, value: Vec<u8>) -> Result<u64> {
        if self.cipher.is_none() {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "this replica shares NATS (--bus) but has no cluster secret (--bus-secret-file): \
                     {what} name commands every replica runs, so they are shared only signed; give \
                     every replica the same secret file, or configure them in each replica's config.toml"
                ),
            )
            .with_reason("no_bus_secret"));
        }
        let value = self.wrap(key, value);
        if value.len() > MAX_VALUE {
            return Err(Error::too_large(format!(
                "the {what} would be {} bytes; {BUCKET} holds at most {MAX_VALUE} per value",
                value.len()
            )));
        }
        bounded(
            &format!("cannot write the {what} to VAK_CONFIG"),
            self.kv.put(key, value.into()),
        )
        .await
    }

    /// Notified when the route or a key changed (from any replica).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The bucket's route and its revision, as last applied here.
    pub fn route(&self) -> Option<(RouteSpec, u64)> {
        self.lock().route.clone()
    }

    async fn leader_read(&self, key: &str) -> Result<Option<(Option<bytes::Bytes>, u64)>> {
        leader_read(&self.kv, key).await
    }

    async fn cas(&self, key: &str, value: Vec<u8>, expected: Option<u64>) -> Result<Option<u64>> {
        cas(&self.kv, key, value, expected).await
    }

    /// The route now in the bucket and its revision, read from the leader;
    /// `Err` when the value is refused for its signature (logged).
    async fn bucket_route(&self) -> Result<Option<(std::result::Result<RouteSpec, Unsigned>, u64)>> {
        let Some((value, rev)) = self.leader_read(ROUTE_KEY).await? else {
            return Ok(None);
        };
        let doc = match value
            .as_deref()
            .map(|v| document(self.cipher.as_ref(), ROUTE_KEY, v))
        {
            Some(Err(why)) => {
                refused(ROUTE_KEY, rev, why);
                return Ok(Some((Err(why), rev)));
            }
            Some(Ok(doc)) => Some(doc),
            None => None,
        };
        let spec = doc
            .and_then(|v| serde_json::from_slice::<SharedRoute>(v).ok())
            .and_then(|r| spec_of(&r))
            .ok_or_else(|| {
                Error::internal(format!("the route in {BUCKET} (revision {rev}) is unreadable"))
            })?;
        Ok(Some((Ok(spec), rev)))
    }

    /// The route now in the bucket and its revision, read from the leader
    /// (what a change is based on). A route refused for its signature
    /// answers the last good one (this replica's own, when it has none)
    /// with the refused value's revision, so a change overwrites it signed.
    pub async fn read_route(&self) -> Result<Option<(RouteSpec, u64)>> {
        match self.bucket_route().await? {
            None => Ok(None),
            Some((Ok(spec), rev)) => Ok(Some((spec, rev))),
            Some((Err(_), rev)) => {
                let good = self.route().map(|(spec, _)| spec).or_else(|| self.own_route());
                good.map(|spec| Some((spec, rev))).ok_or_else(|| {
                    Error::internal(format!("the route in {BUCKET} (revision {rev}) is refused"))
                })
            }
        }
    }

    /// Writes `spec` as the route if the bucket's route is still at
    /// `expected` (None: it has none); its new revision, or None when
    /// another change came first. Applied here at once.
    pub async fn write_route(&self, spec: &RouteSpec, expected: Option<u64>) -> Result<Option<u64>> {
        let value = serde_json::to_vec(&SharedRoute {
            provider: spec.provider.as_str().to_string(),
            model: spec.model.clone(),
            base_url: spec.base_url.clone(),
            source: spec.source,
            replica: self.replica.clone(),
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        let value = self.wrap(ROUTE_KEY, value);
        let written = self.cas(ROUTE_KEY, value, expected).await?;
        if let Some(rev) = written {
            self.set_route(spec.clone(), rev);
        }
        Ok(written)
    }

    /// At startup, before the route is resolved: writes `spec` (this
    /// replica's flags, environment and config.toml) as the route when the
    /// bucket has none, so the first replica's route becomes everyone's; a
    /// replica that finds one (or loses the race) takes the bucket's.
    pub async fn seed_route(&self, spec: &RouteSpec) -> Result<()> {
        *self.own.lock().unwrap_or_else(|p| p.into_inner()) = Some(spec.clone());
        if self.route().is_some() {
            return Ok(());
        }
        if self.write_route(spec, None).await?.is_none() {
            match self.bucket_route().await? {
                Some((Ok(bucket), rev)) => self.set_route(bucket, rev),
                // Refused (unsigned or forged): this replica's own route
                // replaces it, signed (unless another change comes first).
                Some((Err(_), rev)) => {
                    self.write_route(spec, Some(rev)).await?;
                }
                None => {}
            }
        }
        Ok(())
    }

    /// The route of this replica's flags and files, once `seed_route` has run.
    fn own_route(&self) -> Option<RouteSpec> {
        self.own.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether keys can be shared (this replica has the cluster secret).
    pub fn shares_keys(&self) -> bool {
        self.cipher.is_some()
    }

    /// The shared key of `kind`, opened.
    pub fn key(&self, kind: ProviderKind) -> Option<Secret> {
        self.lock().keys.get(&kind).and_then(|(s, _)| s.clone())
    }

    /// Seals and stores `key` as `kind`'s key for every replica.
    pub async fn put_key(&self, kind: ProviderKind, key: &Secret) -> Result<()> {
        let cipher = self.cipher.as_ref().ok_or_else(no_secret)?;
        let sealed = cipher.seal(kind, key)?;
        let name = format!("{KEY_PREFIX}{}", kind.as_str());
        let rev = bounded(
            &format!("cannot store the {} key in VAK_CONFIG", kind.as_str()),
            self.kv.put(&name, sealed.into()),
        )
        .await?;
        self.set_key(kind, Some(key.clone()), rev);
        Ok(())
    }

    /// Deletes `kind`'s shared key on every replica; whether there was one.
    pub async fn delete_key(&self, kind: ProviderKind) -> Result<bool> {
        if self.cipher.is_none() {
            return Err(no_secret());
        }
        let name = format!("{KEY_PREFIX}{}", kind.as_str());
        let had = matches!(self.leader_read(&name).await?, Some((Some(_), _)));
        if !had {
            return Ok(false);
        }
        bounded(
            &format!("cannot delete the {} key from VAK_CONFIG", kind.as_str()),
            self.kv.delete(&name),
        )
        .await?;
        // The delete's revision is the key's last message now.
        if let Some((_, rev)) = self.leader_read(&name).await? {
            self.set_key(kind, None, rev);
        }
        Ok(true)
    }

    /// Reads every provider's key from the leader and applies it here, so
    /// an answer made after another replica's change shows it (the watch
    /// would bring it a moment later).
    pub async fn refresh_keys(&self) -> Result<()> {
        for kind in ProviderKind::ALL {
            if kind == ProviderKind::Offline {
                continue;
            }
            let name = format!("{KEY_PREFIX}{}", kind.as_str());
            match self.leader_read(&name).await? {
                None => {}
                Some((None, rev)) => self.set_key(kind, None, rev),
                Some((Some(v), rev)) => {
                    let opened = self.cipher.as_ref().and_then(|c| c.open(kind, &v));
                    self.set_key(kind, opened, rev);
                }
            }
        }
        Ok(())
    }

    /// Reads workspace `ws`'s rules from the leader and applies them here
    /// (as `refresh_keys`); the list now in effect.
    pub async fn refresh_rules(&self, ws: &str) -> Result<Arc<Vec<Rule>>> {
        match self.leader_read(&format!("{RULES_PREFIX}{ws}")).await? {
            None => {}
            Some((None, rev)) => self.set_rules(ws, Vec::new(), rev),
            Some((Some(v), rev)) => {
                // Refused: logged, and the last good list stays.
                if let Some(doc) = self.checked(&format!("{RULES_PREFIX}{ws}"), rev, &v) {
                    let value: RulesValue = serde_json::from_slice(doc)
                        .map_err(|e| Error::internal(format!("the rules in {BUCKET} are unreadable: {e}")))?;
                    self.set_rules(ws, value.rules, rev);
                }
            }
        }
        Ok(self.rules(ws))
    }

    /// The rules of the workspace whose key is `ws`, as last applied here.
    pub fn rules(&self, ws: &str) -> Arc<Vec<Rule>> {
        self.lock()
            .rules
            .get(ws)
            .map(|(r, _)| r.clone())
            .unwrap_or_default()
    }

    /// Changes the rules of workspace `ws` (`workspace` its path): `f` gets
    /// the bucket's list and answers the list to write (None: nothing to
    /// write) and what to return; tried again on the newer list when
    /// another replica changed it first.
    pub async fn change_rules<T>(
        &self,
        ws: &str,
        workspace: &str,
        mut f: impl FnMut(&[Rule]) -> Result<(Option<Vec<Rule>>, T)>,
    ) -> Result<T> {
        let key = format!("{RULES_PREFIX}{ws}");
        for _ in 0..CAS_TRIES {
            let read = self.leader_read(&key).await?;
            let (current, expected) = match &read {
                None => (Vec::new(), None),
                Some((None, rev)) => (Vec::new(), Some(*rev)),
                Some((Some(v), rev)) => match self.checked(&key, *rev, v) {
                    Some(doc) => {
                        let value: RulesValue = serde_json::from_slice(doc).map_err(|e| {
                            Error::internal(format!(
                                "the rules of {workspace} in {BUCKET} are unreadable: {e}"
                            ))
                        })?;
                        (value.rules, Some(*rev))
                    }
                    // Refused: the change is made to the last good list,
                    // written over the refused value, signed.
                    None => (self.rules(ws).to_vec(), Some(*rev)),
                },
            };
            let (next, out) = f(&current)?;
            let Some(next) = next else {
                if let Some(rev) = expected {
                    self.set_rules(ws, current, rev);
                }
                return Ok(out);
            };
            let value = serde_json::to_vec(&RulesValue {
                version: 1,
                workspace: workspace.to_string(),
                rules: next.clone(),
            })
            .map_err(|e| Error::internal(e.to_string()))?;
            let value = self.wrap(&key, value);
            if value.len() > MAX_VALUE {
                return Err(Error::too_large(format!(
                    "the rules of this workspace would be {} bytes; {BUCKET} holds at most {MAX_VALUE} per value",
                    value.len()
                )));
            }
            if let Some(rev) = self.cas(&key, value, expected).await? {
                self.set_rules(ws, next, rev);
                return Ok(out);
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("the rules of {workspace} keep changing on other replicas; try again"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routes_source_is_kept_in_the_bucket_by_its_name() {
        let all = [
            (Source::Flag, "flag"),
            (Source::Env, "env"),
            (Source::File, "file"),
            (Source::Api, "api"),
            (Source::Default, "default"),
        ];
        for (source, name) in all {
            assert_eq!(source.as_str(), name);
            assert_eq!(Source::parse(name), source);
            let route = SharedRoute {
                provider: "openai".into(),
                model: "m".into(),
                base_url: None,
                source,
                replica: "r".into(),
            };
            let json = serde_json::to_value(&route).unwrap();
            assert_eq!(json["source"], name);
            assert_eq!(serde_json::from_value::<SharedRoute>(json).unwrap(), route);
        }
        // A name this replica does not know (a newer one's) reads as an API change.
        let newer = r#"{"provider":"openai","model":"m","source":"later","replica":"r"}"#;
        assert_eq!(
            serde_json::from_str::<SharedRoute>(newer).unwrap().source,
            Source::Api
        );
    }
}
