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
//! Every replica reads the whole bucket when it starts (so it adopts the
//! bucket's route over its flags and config.toml), then applies each change
//! the watch delivers, in revision order: what a replica serves and what a
//! leg uses come from memory, never from a read of NATS on the hot path.
//! Reads made to decide a change go to the stream's leader (a direct get may
//! be served by a follower a moment behind).

use super::config::{RouteSpec, Source};
use super::provider::{ProviderKind, Secret};
use super::rules::Rule;
use super::PermissionMode;
use crate::error::{Error, ErrorKind, Result};
use async_nats::jetstream::kv;
use futures_util::StreamExt;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
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
/// The largest value the bucket takes (a workspace's 256 rules fit).
pub const MAX_VALUE: usize = 768 * 1024;
/// The shortest cluster secret accepted, in bytes.
pub const MIN_SECRET: usize = 32;
/// How many times a change is tried when other replicas change the same
/// key meanwhile (a route change without a revision, a rules change).
pub const CAS_TRIES: usize = 16;
/// The longest a read or write of the bucket may take.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

const SEAL_MAGIC: &[u8] = b"VAKBK1";
const HKDF_SALT: &[u8] = b"vak cluster secret v1";
const HKDF_INFO: &[u8] = b"vak provider keys in VAK_CONFIG";

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
    pub source: String,
    /// The replica that wrote it.
    #[serde(default)]
    pub replica: String,
}

fn spec_of(r: &SharedRoute) -> Option<RouteSpec> {
    let source = match r.source.as_str() {
        "flag" => Source::Flag,
        "env" => Source::Env,
        "file" => Source::File,
        "default" => Source::Default,
        _ => Source::Api,
    };
    Some(RouteSpec {
        provider: ProviderKind::parse(&r.provider)?,
        model: r.model.clone(),
        base_url: r.base_url.clone(),
        source,
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

/// The AEAD keys travel and rest under: ChaCha20-Poly1305 (as the key
/// store in the home), its key derived with HKDF-SHA256 from the cluster
/// secret every replica is given (`--bus-secret-file`).
pub struct Cipher(LessSafeKey);

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(..)")
    }
}

impl Cipher {
    /// From the secret's bytes (surrounding whitespace aside): at least
    /// `MIN_SECRET` of them.
    pub fn new(secret: &[u8]) -> Result<Cipher> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_SECRET {
            return Err(Error::invalid(format!(
                "the cluster secret is {} bytes; it needs at least {MIN_SECRET} (e.g. `openssl rand -hex 32`)",
                secret.len()
            )));
        }
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, HKDF_SALT).extract(secret);
        let okm = prk
            .expand(&[HKDF_INFO], &CHACHA20_POLY1305)
            .map_err(|_| Error::internal("cannot derive the key of the cluster secret"))?;
        Ok(Cipher(LessSafeKey::new(UnboundKey::from(okm))))
    }

    /// Reads the secret from `path` (startup: blocking), a file only its
    /// owner may read.
    pub fn from_file(path: &Path) -> Result<Cipher> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let meta =
            std::fs::metadata(path).map_err(|e| Error::invalid(format!("--bus-secret-file {shown}: {e}")))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(Error::invalid(format!(
                "--bus-secret-file {shown}: other users may read it; make it owner-only (chmod 600)"
            )));
        }
        let bytes =
            std::fs::read(path).map_err(|e| Error::invalid(format!("--bus-secret-file {shown}: {e}")))?;
        Cipher::new(&bytes).map_err(|e| Error::invalid(format!("--bus-secret-file {shown}: {}", e.message)))
    }

    /// `VAKBK1`, a random nonce, then the sealed key; the provider's name is
    /// the associated data, so a value moved to another provider's key does
    /// not open.
    fn seal(&self, kind: ProviderKind, key: &Secret) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::internal("no randomness to seal a key"))?;
        let mut buf = key.expose().as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(kind.as_str().as_bytes()),
                &mut buf,
            )
            .map_err(|_| Error::internal("cannot seal a key"))?;
        let mut out = Vec::with_capacity(SEAL_MAGIC.len() + NONCE_LEN + buf.len());
        out.extend_from_slice(SEAL_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        Ok(out)
    }

    fn open(&self, kind: ProviderKind, bytes: &[u8]) -> Option<Secret> {
        let rest = bytes.strip_prefix(SEAL_MAGIC)?;
        if rest.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(kind.as_str().as_bytes()), &mut buf)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok().map(Secret::new)
    }
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

    /// Applies one entry of the bucket, unless this replica already has a
    /// newer value of its key.
    fn apply(&self, entry: kv::Entry) {
        let rev = entry.revision;
        let put = entry.operation == kv::Operation::Put;
        let key = entry.key.as_str();
        if key == ROUTE_KEY {
            let Some(spec) = put
                .then(|| serde_json::from_slice::<SharedRoute>(&entry.value).ok())
                .flatten()
                .and_then(|r| spec_of(&r))
            else {
                tracing::warn!("ignoring an unreadable route in VAK_CONFIG (revision {rev})");
                return;
            };
            self.set_route(spec, rev);
        } else if key == MODE_KEY {
            let parsed = put
                .then(|| serde_json::from_slice::<ModeValue>(&entry.value).ok())
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
        } else if let Some(ws) = key.strip_prefix(RULES_PREFIX) {
            let rules = if put {
                match serde_json::from_slice::<RulesValue>(&entry.value) {
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

    /// Makes `mode` every replica's.
    pub async fn put_mode(&self, mode: SharedMode) -> Result<()> {
        let value = serde_json::to_vec(&ModeValue {
            mode: mode.mode.as_str().to_string(),
            interrupt: mode.interrupt,
        })
        .map_err(|e| Error::internal(e.to_string()))?;
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

    /// The route now in the bucket and its revision, read from the leader
    /// (what a change is based on).
    pub async fn read_route(&self) -> Result<Option<(RouteSpec, u64)>> {
        let Some((value, rev)) = self.leader_read(ROUTE_KEY).await? else {
            return Ok(None);
        };
        let spec = value
            .and_then(|v| serde_json::from_slice::<SharedRoute>(&v).ok())
            .and_then(|r| spec_of(&r))
            .ok_or_else(|| {
                Error::internal(format!("the route in {BUCKET} (revision {rev}) is unreadable"))
            })?;
        Ok(Some((spec, rev)))
    }

    /// Writes `spec` as the route if the bucket's route is still at
    /// `expected` (None: it has none); its new revision, or None when
    /// another change came first. Applied here at once.
    pub async fn write_route(&self, spec: &RouteSpec, expected: Option<u64>) -> Result<Option<u64>> {
        let value = serde_json::to_vec(&SharedRoute {
            provider: spec.provider.as_str().to_string(),
            model: spec.model.clone(),
            base_url: spec.base_url.clone(),
            source: spec.source.as_str().to_string(),
            replica: self.replica.clone(),
        })
        .map_err(|e| Error::internal(e.to_string()))?;
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
        if self.route().is_some() {
            return Ok(());
        }
        if self.write_route(spec, None).await?.is_none() {
            if let Some((spec, rev)) = self.read_route().await? {
                self.set_route(spec, rev);
            }
        }
        Ok(())
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
                let value: RulesValue = serde_json::from_slice(&v)
                    .map_err(|e| Error::internal(format!("the rules in {BUCKET} are unreadable: {e}")))?;
                self.set_rules(ws, value.rules, rev);
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
                Some((Some(v), rev)) => {
                    let value: RulesValue = serde_json::from_slice(v).map_err(|e| {
                        Error::internal(format!(
                            "the rules of {workspace} in {BUCKET} are unreadable: {e}"
                        ))
                    })?;
                    (value.rules, Some(*rev))
                }
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
    fn a_sealed_key_opens_only_with_the_same_secret_and_provider_and_never_shows_itself() {
        let key = Secret::new("sk-sealed-0123456789abcdef-MARKER".into());
        let cipher = Cipher::new(&[7u8; 40]).unwrap();
        let sealed = cipher.seal(ProviderKind::OpenAi, &key).unwrap();
        assert!(sealed.starts_with(SEAL_MAGIC));
        let plain = key.expose().as_bytes();
        assert!(!sealed.windows(plain.len()).any(|w| w == plain));
        assert_eq!(
            cipher.open(ProviderKind::OpenAi, &sealed).unwrap().expose(),
            key.expose()
        );
        // Another nonce each time; another provider or secret does not open it.
        assert_ne!(cipher.seal(ProviderKind::OpenAi, &key).unwrap(), sealed);
        assert!(cipher.open(ProviderKind::Anthropic, &sealed).is_none());
        assert!(Cipher::new(&[8u8; 40])
            .unwrap()
            .open(ProviderKind::OpenAi, &sealed)
            .is_none());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(cipher.open(ProviderKind::OpenAi, &tampered).is_none());
        // Surrounding whitespace (a file's newline) is not part of the secret.
        let mut padded = vec![b' '];
        padded.extend_from_slice(&[7u8; 40]);
        padded.push(b'\n');
        assert!(Cipher::new(&padded)
            .unwrap()
            .open(ProviderKind::OpenAi, &sealed)
            .is_some());
    }

    #[test]
    fn a_short_or_shared_secret_file_is_refused_with_a_clear_message() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "too short\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Cipher::from_file(&path).unwrap_err();
        assert!(e.message.contains("at least 32"), "{e}");
        std::fs::write(&path, "x".repeat(64)).unwrap();
        assert!(Cipher::from_file(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Cipher::from_file(&path).unwrap_err();
        assert!(e.message.contains("chmod 600"), "{e}");
        let e = Cipher::from_file(&dir.path().join("missing")).unwrap_err();
        assert!(e.message.contains("--bus-secret-file"), "{e}");
    }
}
