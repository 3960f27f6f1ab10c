//! Model routes and credentials: which provider and model legs use, resolved from flags, the environment, config.toml's `[model]` and the API (each with its source); keys from the environment or the key store; config.toml read leniently and written back with its comments.

use crate::cluster::shared_config::{self, SharedConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::file_owner::FileOwner;
use crate::host::agent_settings::{
    self, set_keeping_decor, AgentSettings, FileAgent, FileApp, FileSettings, SettingsPatch,
};
use crate::host::hooks::HookSpecs;
use crate::host::secrets::{self, SecretStore};
use crate::provider::{self, Endpoint, Failure, FailureKind, ModelInfo, Provider, ProviderKind, Secret};
pub use crate::route::{Route, RouteSpec, Source};
use crate::CoreConfig;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The longest model name accepted.
pub const MAX_MODEL_LEN: usize = 256;
/// The longest base URL accepted.
pub const MAX_BASE_URL_LEN: usize = 2048;
/// How long a live model listing may take.
const LIST_MODELS_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// The provider's environment variable (`OPENAI_API_KEY`, …).
    Env,
    /// The key store in the home (`PUT /config/key`).
    Store,
}

impl KeySource {
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Env => "env",
            KeySource::Store => "store",
        }
    }
}

/// One layer's say about the route; any part may be missing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteLayer {
    pub provider: Option<ProviderKind>,
    pub model: Option<String>,
    pub base_url: Option<String>,
}

impl RouteLayer {
    fn is_empty(&self) -> bool {
        self.provider.is_none() && self.model.is_none() && self.base_url.is_none()
    }
}

/// What the process environment says, captured once at startup (so a test
/// can hand a server its own and nothing races on the real one).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub route: RouteLayer,
    pub keys: Vec<(ProviderKind, Secret)>,
}

impl Environment {
    /// `VAK_PROVIDER`, `VAK_MODEL`, `VAK_BASE_URL` and each provider's key
    /// variable; an empty variable counts as unset.
    pub fn from_process() -> Result<Environment> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let provider = match var("VAK_PROVIDER") {
            Some(p) => Some(parse_provider(&p, "VAK_PROVIDER")?),
            None => None,
        };
        let route = RouteLayer {
            provider,
            model: var("VAK_MODEL"),
            base_url: var("VAK_BASE_URL"),
        };
        let keys = ProviderKind::ALL
            .into_iter()
            .filter_map(|k| Some((k, Secret::new(var(k.key_env()?)?.trim().to_string()))))
            .collect();
        Ok(Environment { route, keys })
    }

    fn key(&self, kind: ProviderKind) -> Option<Secret> {
        self.keys.iter().find(|(k, _)| *k == kind).map(|(_, s)| s.clone())
    }
}

/// A provider name from `origin` (a flag, a variable, a request field). A
/// refusal echoes the name only when it looks like one (never a pasted key).
pub fn parse_provider(name: &str, origin: &str) -> Result<ProviderKind> {
    ProviderKind::parse(name).ok_or_else(|| {
        let known: Vec<_> = ProviderKind::ALL.iter().map(|k| k.as_str()).collect();
        let shown = if name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            format!(" {name:?}")
        } else {
            String::new()
        };
        Error::invalid(format!(
            "{origin}: unknown provider{shown}: expected one of {}",
            known.join(", ")
        ))
    })
}

pub fn validate_model(model: &str, origin: &str) -> Result<()> {
    if model.trim().is_empty() {
        return Err(Error::invalid(format!("{origin}: the model name is empty")));
    }
    if model.len() > MAX_MODEL_LEN || model.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "{origin}: a model name is 1 to {MAX_MODEL_LEN} characters with no control characters"
        )));
    }
    Ok(())
}

pub fn validate_base_url(url: &str, origin: &str) -> Result<()> {
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() > "http://".len()
        && url.len() <= MAX_BASE_URL_LEN
        && !url.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{origin}: a base URL is an http:// or https:// URL of at most {MAX_BASE_URL_LEN} characters, e.g. http://127.0.0.1:11434/v1"
        )))
    }
}

/// The route from its layers, highest first: flags, environment, config.toml,
/// then the default (offline). The provider comes from the highest layer that
/// names one; a model or base URL comes from the highest layer that names one
/// and names no other provider. The source is the highest layer that said anything.
pub fn resolve_spec(flags: &RouteLayer, env: &RouteLayer, file: &RouteLayer) -> Result<RouteSpec> {
    let layers = [(flags, Source::Flag), (env, Source::Env), (file, Source::File)];
    let provider = layers
        .iter()
        .find_map(|(l, _)| l.provider)
        .unwrap_or(ProviderKind::Offline);
    let agrees = |l: &RouteLayer| l.provider.is_none_or(|p| p == provider);
    let used: Vec<&(&RouteLayer, Source)> = layers
        .iter()
        .filter(|(l, _)| !l.is_empty() && agrees(l))
        .collect();
    let source = used.first().map_or(Source::Default, |(_, s)| *s);
    let model = used.iter().find_map(|(l, _)| l.model.clone());
    let base_url = used.iter().find_map(|(l, _)| l.base_url.clone());
    let model = match (model, provider) {
        (Some(m), _) => m,
        (None, ProviderKind::Offline) => "offline".into(),
        (None, p) => {
            return Err(Error::invalid(format!(
                "the {} provider needs a model: pass --model NAME (or set model in config.toml's [model])",
                p.as_str()
            )))
        }
    };
    validate_model(&model, "model")?;
    if let Some(u) = &base_url {
        validate_base_url(u, "base_url")?;
        offline_takes_no_url(provider)?;
    }
    Ok(RouteSpec {
        provider,
        model,
        base_url,
        source,
    })
}

/// `[server]` of config.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    #[serde(default)]
    pub trusted_hosts: Vec<String>,
    #[serde(default)]
    pub allow_origins: Vec<String>,
    /// Absolute folders `GET /fs/dirs` may list (absent: the workspace alone).
    #[serde(default)]
    pub workspace_roots: Vec<PathBuf>,
    /// `[server.web]`: what the browser surface may do.
    #[serde(default)]
    pub web: FileWeb,
}

/// `[server.web]` of config.toml: the browser terminal (`GET /pty`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWeb {
    /// A shell over a WebSocket is remote code execution by design: off
    /// unless the owner turns it on.
    #[serde(default)]
    pub terminal: bool,
    /// Only a peer on this machine may open one, unless turned off (behind
    /// a proxy that authenticates, say).
    #[serde(default = "yes")]
    pub terminal_requires_loopback: bool,
    /// The terminal's shell (an absolute path); absent: `$SHELL`, else /bin/sh.
    #[serde(default)]
    pub terminal_shell: Option<PathBuf>,
}

fn yes() -> bool {
    true
}

impl Default for FileWeb {
    fn default() -> Self {
        FileWeb {
            terminal: false,
            terminal_requires_loopback: true,
            terminal_shell: None,
        }
    }
}

/// `[sandbox]` of config.toml: the sandbox of the agent's commands
/// (`--sandbox` wins over `mode`).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSandbox {
    #[serde(default)]
    pub mode: Option<crate::tools::sandbox::SandboxMode>,
    /// Whether commands may use the network (loopback included).
    #[serde(default)]
    pub network: bool,
    /// Absolute folders commands may write besides their workspace.
    #[serde(default)]
    pub writable_roots: Vec<PathBuf>,
    /// Environment variables no command inherits, besides the built-in ones.
    #[serde(default)]
    pub scrub_env: Vec<String>,
}

/// `[model]` of config.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModel {
    provider: Option<String>,
    model: Option<String>,
    base_url: Option<String>,
}

/// `$VAK_HOME/config.toml`: the sections this version reads, and the names
/// of those it does not implement (reported once at startup, not refused).
#[derive(Debug, Default)]
pub struct FileConfig {
    pub server: FileServer,
    pub sandbox: FileSandbox,
    pub model: RouteLayer,
    /// `[mcp.servers.<name>]`: the MCP servers.
    pub mcp: crate::mcp::config::ServerDefs,
    /// `[agent]`, `[app]` and `[hooks]` (`agent_settings.rs`).
    pub settings: FileSettings,
    /// `[automation]`: the scheduler's zone and catch-up.
    pub automation: crate::automation::config::FileAutomation,
    /// `[finops]`: prices and the daily budget.
    pub finops: crate::finops::config::FileFinops,
    /// `[intent]` and `[commitment]`: how a prompt's reading engages and
    /// what a fulfilled close needs.
    pub policy: crate::intent::Policy,
    pub ignored: Vec<String>,
}

pub fn config_path(home: &Path) -> PathBuf {
    home.join("config.toml")
}

impl FileConfig {
    /// Reads config.toml (absent: empty). A malformed file or an unknown key
    /// in `[server]` or `[model]` is an error naming the file and the key.
    pub fn load(home: &Path) -> Result<FileConfig> {
        let path = config_path(home);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                FileConfig::parse(&text).map_err(|m| Error::invalid(format!("{} {m}", path.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileConfig::default()),
            Err(e) => Err(Error::invalid(format!("cannot read {}: {e}", path.display()))),
        }
    }

    /// `line N: why` on failure. The known sections are read through serde
    /// with the whole text (so an error has its line); the top-level names
    /// besides them are the ignored sections.
    fn parse(text: &str) -> std::result::Result<FileConfig, String> {
        #[derive(Default, serde::Deserialize)]
        struct Known {
            #[serde(default)]
            server: FileServer,
            #[serde(default)]
            model: FileModel,
            #[serde(default)]
            sandbox: FileSandbox,
            #[serde(default)]
            mcp: crate::mcp::config::FileMcp,
            #[serde(default)]
            agent: FileAgent,
            #[serde(default)]
            app: FileApp,
            #[serde(default)]
            hooks: Option<HookSpecs>,
            #[serde(default)]
            automation: crate::automation::config::FileAutomation,
            #[serde(default)]
            finops: crate::finops::config::FileFinops,
            #[serde(default)]
            intent: crate::intent::FileIntent,
            #[serde(default)]
            commitment: crate::intent::FileCommitment,
        }
        let at = |e: toml::de::Error| {
            let line = e
                .span()
                .map_or(0, |sp| text[..sp.start.min(text.len())].matches('\n').count() + 1);
            format!("line {line}: {}", e.message())
        };
        let known: Known = toml::from_str(text).map_err(at)?;
        let table: toml::Table = toml::from_str(text).map_err(at)?;
        let ignored = table
            .keys()
            .filter(|k| {
                !matches!(
                    k.as_str(),
                    "server"
                        | "model"
                        | "sandbox"
                        | "mcp"
                        | "agent"
                        | "app"
                        | "hooks"
                        | "automation"
                        | "finops"
                        | "intent"
                        | "commitment"
                )
            })
            .cloned()
            .collect();
        let m = known.model;
        let provider = m
            .provider
            .as_deref()
            .map(|p| parse_provider(p, "[model] provider"))
            .transpose()
            .map_err(|e| e.message)?;
        crate::mcp::config::validate(&known.mcp.servers).map_err(|e| format!("[mcp] {}", e.message))?;
        let settings = FileSettings::check(known.agent, known.app, known.hooks).map_err(|e| e.message)?;
        known.finops.validate()?;
        let policy = crate::intent::Policy::from_file(&known.intent, &known.commitment)?;
        Ok(FileConfig {
            policy,
            mcp: known.mcp.servers,
            settings,
            automation: known.automation,
            finops: known.finops,
            server: known.server,
            sandbox: known.sandbox,
            model: RouteLayer {
                provider,
                model: m.model,
                base_url: m.base_url,
            },
            ignored,
        })
    }
}

/// Writes `spec` as config.toml's `[model]` and what `more` names
/// (`[agent]`, `[app]`, `[hooks]`), keeping every other section, key and
/// comment; atomic (temporary file and rename), mode 0600. Blocking.
fn persist(home: &Path, spec: Option<&RouteSpec>, more: &SettingsPatch) -> Result<()> {
    let mut doc = read_doc(home)?;
    agent_settings::write_toml(&mut doc, more)?;
    let Some(spec) = spec else {
        return crate::home::write_private_file(home, "config.toml", doc.to_string().as_bytes());
    };
    let model = doc
        .entry("model")
        .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()));
    let Some(table) = model.as_table_like_mut() else {
        return Err(Error::conflict(
            "config.toml's model is not a table; fix it, then try again",
        ));
    };
    set_keeping_decor(table, "provider", spec.provider.as_str().into());
    set_keeping_decor(table, "model", spec.model.as_str().into());
    match &spec.base_url {
        Some(u) => set_keeping_decor(table, "base_url", u.as_str().into()),
        None => {
            table.remove("base_url");
        }
    }
    crate::home::write_private_file(home, "config.toml", doc.to_string().as_bytes())
}

/// config.toml as an editable document (absent: empty); one that no longer
/// parses is a Conflict the user fixes. Blocking.
fn read_doc(home: &Path) -> Result<toml_edit::DocumentMut> {
    let path = config_path(home);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
    };
    text.parse().map_err(|e: toml_edit::TomlError| {
        Error::conflict(format!(
            "config.toml no longer parses ({}); fix it, then try again",
            e.message()
        ))
    })
}

/// A change asked for through the API; absent parts keep (or, when the
/// provider changes, reset) what is in effect.
#[derive(Clone, Debug, Default)]
pub struct RoutePatch {
    pub provider: Option<ProviderKind>,
    pub model: Option<String>,
    /// `Some("")` clears it.
    pub base_url: Option<String>,
    /// The revision the change was based on; a different one is refused.
    pub revision: Option<String>,
    /// max_turns, theme and hooks (checked).
    pub settings: SettingsPatch,
}

impl RoutePatch {
    /// Whether the route is asked to change (an empty patch counts, as it
    /// always did: it re-resolves and re-persists the route).
    fn touches_route(&self) -> bool {
        self.provider.is_some() || self.model.is_some() || self.base_url.is_some() || self.settings.is_empty()
    }
}

/// One provider as `GET /providers` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderStatus {
    pub kind: ProviderKind,
    pub configured: bool,
    pub fingerprints: Vec<String>,
    pub key_sources: Vec<KeySource>,
}

/// A route in use that lost its key: turns fail as not configured instead of
/// going on with a revoked key.
struct Unconfigured;

impl Provider for Unconfigured {
    fn name(&self) -> &str {
        "unconfigured"
    }
    fn turn<'a>(
        &'a self,
        _request: &'a provider::TurnRequest,
        _sink: &'a dyn provider::Sink,
        _cancel: &'a tokio_util::sync::CancellationToken,
    ) -> provider::TurnFuture<'a> {
        Box::pin(std::future::ready(Err(provider::ProviderError::Failed(
            Failure::new(FailureKind::NotConfigured, "the route's key was deleted", false),
        ))))
    }
    fn list_models(&self) -> provider::ModelsFuture<'_> {
        Box::pin(std::future::ready(Err(Failure::new(
            FailureKind::NotConfigured,
            "the route's key was deleted",
            false,
        ))))
    }
}

struct Current {
    spec: RouteSpec,
    /// Bumped on every route change.
    n: u64,
    /// With `--bus`: the bucket revision of the route in effect (the
    /// revision clients see is then `bus-<n>`, the same on every replica).
    bus_rev: Option<u64>,
    /// max_turns, theme and hooks (this replica's own, also with `--bus`).
    settings: AgentSettings,
    /// With `--bus`: the route revision and the fingerprint of its key that
    /// the route in use was built from (a change of either rebuilds it).
    built: (Option<u64>, Option<String>),
}

/// The live settings of one server: the route description with its
/// revision, the key store and the environment's keys.
pub struct Settings {
    home: PathBuf,
    env: Environment,
    store: SecretStore,
    /// The timeouts and bounds every client of a route or listing gets.
    client: provider::ClientOptions,
    current: Mutex<Current>,
    /// Where every route change runs, one at a time, from resolution to
    /// apply (config.toml and the bucket are written from its task: no lock
    /// is held across that I/O).
    changing: FileOwner<()>,
    /// Per server life, so a revision from before a restart never matches.
    boot: String,
    changes: watch::Sender<u64>,
    /// With `--bus`: the route and keys every replica shares (`shared_config.rs`).
    shared: Option<Arc<SharedConfig>>,
    /// config.toml's `[mcp.servers]` as read at startup.
    file_mcp: crate::mcp::config::ServerDefs,
    /// config.toml's `[automation]` as read at startup.
    file_automation: crate::automation::config::FileAutomation,
    /// config.toml's `[finops]` as read at startup.
    file_finops: crate::finops::config::FileFinops,
    /// config.toml's `[intent]` and `[commitment]` over the defaults.
    file_policy: crate::intent::Policy,
}

impl Settings {
    /// Opens the key store and resolves the route description (startup: reads files).
    pub fn open(cfg: &CoreConfig) -> Result<Settings> {
        let file = FileConfig::load(&cfg.home)?;
        let mut spec = resolve_spec(&cfg.route_flags, &cfg.env.route, &file.model)?;
        let agent = AgentSettings::resolve(cfg.max_turns, cfg.max_turns_from_flag, &file.settings);
        let store = SecretStore::open(&cfg.home)?;
        // With --bus the bucket's route wins over flags, environment and file.
        let bus_rev = match cfg.shared_config.as_ref().and_then(|s| s.route()) {
            Some((shared, rev)) => {
                spec = shared;
                Some(rev)
            }
            None => None,
        };
        let settings = Settings {
            home: cfg.home.clone(),
            env: cfg.env.clone(),
            store,
            client: cfg.provider_client.clone(),
            current: Mutex::new(Current {
                spec,
                n: 1,
                bus_rev,
                settings: agent,
                built: (None, None),
            }),
            changing: FileOwner::new("the model route", ()),
            boot: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            changes: watch::channel(1).0,
            shared: cfg.shared_config.clone(),
            file_mcp: file.mcp,
            file_automation: file.automation,
            file_finops: file.finops,
            file_policy: file.policy,
        };
        let fp = settings.route_key_fingerprint(&settings.lock().spec.clone());
        settings.lock().built = (bus_rev, fp);
        Ok(settings)
    }

    /// config.toml's `[automation]` as read at startup.
    pub(crate) fn file_automation(&self) -> &crate::automation::config::FileAutomation {
        &self.file_automation
    }

    /// config.toml's `[mcp.servers]` as read at startup.
    pub(crate) fn file_mcp(&self) -> crate::mcp::config::ServerDefs {
        self.file_mcp.clone()
    }

    /// config.toml's `[intent]` and `[commitment]` as read at startup, over the defaults.
    pub(crate) fn file_policy(&self) -> crate::intent::Policy {
        self.file_policy.clone()
    }

    /// config.toml's `[finops]` as read at startup.
    pub(crate) fn file_finops(&self) -> crate::finops::config::FileFinops {
        self.file_finops.clone()
    }

    /// Rewrites config.toml with `edit`, keeping every comment and key it
    /// does not touch; on the route's owner task, so two changes of the
    /// file never interleave. Atomic, mode 0600.
    pub(crate) async fn edit_file(
        &self,
        edit: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let home = self.home.clone();
        self.changing
            .change(move |_| {
                Box::pin(async move {
                    tokio::task::spawn_blocking(move || {
                        let mut doc = read_doc(&home)?;
                        edit(&mut doc)?;
                        crate::home::write_private_file(&home, "config.toml", doc.to_string().as_bytes())
                    })
                    .await
                    .map_err(|e| Error::internal(format!("the config writer failed: {e}")))?
                })
            })
            .await?
    }

    fn route_key_fingerprint(&self, spec: &RouteSpec) -> Option<String> {
        match spec.provider {
            ProviderKind::Offline => None,
            kind => self.key(kind).map(|k| secrets::fingerprint(&k)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The route in effect and its revision.
    pub fn current(&self) -> (RouteSpec, String) {
        let c = self.lock();
        let revision = match c.bus_rev {
            Some(rev) => shared_config::revision_string(rev),
            None => format!("{}-{}", self.boot, c.n),
        };
        (c.spec.clone(), revision)
    }

    /// max_turns, theme and hooks in effect, with their sources.
    pub fn agent_settings(&self) -> AgentSettings {
        self.lock().settings.clone()
    }

    /// Notified (with a new number) on every configuration change.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The key a route of `kind` uses: the environment's wins over the
    /// store's (with `--bus`, the store every replica shares; the home's is
    /// not read).
    pub fn key(&self, kind: ProviderKind) -> Option<Secret> {
        self.env.key(kind).or_else(|| self.stored_key(kind))
    }

    /// A real provider's route with no key reachable and no base URL (a
    /// local server needs no key).
    fn lacks_key(&self, spec: &RouteSpec) -> bool {
        spec.provider != ProviderKind::Offline && spec.base_url.is_none() && self.key(spec.provider).is_none()
    }

    fn stored_key(&self, kind: ProviderKind) -> Option<Secret> {
        match &self.shared {
            Some(shared) => shared.key(kind),
            None => self.store.get(kind),
        }
    }

    /// The client for the route in effect (startup). With `--bus` a route
    /// this replica cannot reach (another replica set it, with a key this
    /// one lacks) fails its legs as not configured instead of the start.
    pub fn startup_route(&self) -> Result<Route> {
        let spec = self.lock().spec.clone();
        // No server runs yet: the advice is what works before it starts.
        if self.shared.is_none() && self.lacks_key(&spec) {
            return Err(no_key_at_startup(spec.provider));
        }
        match self.route_for(&spec) {
            Err(e) if self.shared.is_some() => {
                tracing::warn!("the shared route is not usable on this replica: {}", e.message);
                Ok(unconfigured(&spec))
            }
            other => other,
        }
    }

    /// With `--bus`: takes up what another replica changed (the route, or
    /// the key the route uses), for legs that start from now on.
    pub async fn adopt(self: &Arc<Self>, apply: impl FnOnce(Route) + Send + 'static) {
        let me = self.clone();
        let turn = self
            .changing
            .change(move |_| Box::pin(async move { me.adopt_now(apply) }));
        if let Err(e) = turn.await {
            tracing::warn!("a route change on another replica is not taken up: {e}");
        }
    }

    /// `adopt` on the route's owner task.
    fn adopt_now(&self, apply: impl FnOnce(Route)) {
        let Some(shared) = &self.shared else { return };
        let (mut spec, mut rev, built) = {
            let c = self.lock();
            (c.spec.clone(), c.bus_rev, c.built.clone())
        };
        let newer = shared.route().filter(|(_, r)| rev.is_none_or(|mine| *r > mine));
        if let Some((s, r)) = newer.clone() {
            spec = s;
            rev = Some(r);
        }
        let fp = self.route_key_fingerprint(&spec);
        if (rev, fp.clone()) == built && newer.is_none() {
            return;
        }
        let route = self.route_for(&spec).unwrap_or_else(|e| {
            tracing::warn!("the shared route is not usable on this replica: {}", e.message);
            unconfigured(&spec)
        });
        apply(route);
        let n = {
            let mut c = self.lock();
            c.built = (rev, fp);
            if newer.is_none() {
                return;
            }
            c.spec = spec;
            c.bus_rev = rev;
            c.n += 1;
            c.n
        };
        self.changes.send_replace(n);
        tracing::info!("model route changed on another replica");
    }

    /// Resolves `spec` into a client: a key must be reachable (or a base URL
    /// given for a keyless local server), and `connect` must accept it.
    fn route_for(&self, spec: &RouteSpec) -> Result<Route> {
        let key = match spec.provider {
            ProviderKind::Offline => None,
            kind => self.key(kind),
        };
        if self.lacks_key(spec) {
            return Err(no_ai_service(spec.provider));
        }
        let endpoint = Endpoint {
            kind: spec.provider,
            base_url: spec.base_url.clone(),
            key,
        };
        let provider =
            provider::connect_with(&endpoint, &self.client).map_err(|f| failure_error(spec.provider, f))?;
        Ok(Route {
            provider,
            model: spec.model.clone(),
            context_window: spec.provider.context_window(),
        })
    }

    /// Changes the route and the other settings: resolved, then persisted
    /// to config.toml, then handed to `apply` (the new route, when it was
    /// asked to change, and the settings now in effect); nothing changes
    /// when any step fails. Every change bumps the one revision.
    pub async fn update(
        self: &Arc<Self>,
        patch: RoutePatch,
        apply: impl FnOnce(Option<Route>, &AgentSettings) + Send + 'static,
    ) -> Result<()> {
        let me = self.clone();
        self.changing
            .change(move |_| Box::pin(async move { me.update_now(patch, apply).await }))
            .await?
    }

    /// `update` on the route's owner task. With `--bus` the route is the
    /// bucket's (compare-and-set) while max_turns, theme and hooks are this
    /// replica's own: written to its config.toml, and their change alone
    /// leaves the shared revision as it is.
    async fn update_now(
        &self,
        patch: RoutePatch,
        apply: impl FnOnce(Option<Route>, &AgentSettings),
    ) -> Result<()> {
        let (spec, route, bus_rev) = match &self.shared {
            Some(shared) if patch.touches_route() => {
                let (spec, route, rev) = self.update_shared(shared, &patch).await?;
                (Some(spec), Some(route), rev)
            }
            Some(shared) => {
                // Checked against the bucket's revision as the leader has it
                // now (another replica may have changed the route a moment ago).
                if let Some(r) = &patch.revision {
                    let revision = match shared.read_route().await? {
                        Some((_, rev)) => shared_config::revision_string(rev),
                        None => self.current().1,
                    };
                    if *r != revision {
                        return Err(stale(r, &revision));
                    }
                }
                (None, None, None)
            }
            None => {
                let (cur, revision) = self.current();
                if let Some(r) = &patch.revision {
                    if *r != revision {
                        return Err(stale(r, &revision));
                    }
                }
                let spec = patch.touches_route().then(|| patched(&cur, &patch)).transpose()?;
                let route = spec.as_ref().map(|s| self.route_for(s)).transpose()?;
                (spec, route, None)
            }
        };
        // config.toml: the route only without --bus (the bucket holds it then).
        let saved = spec.clone().filter(|_| self.shared.is_none());
        if saved.is_some() || !patch.settings.is_empty() {
            let (home, more) = (self.home.clone(), patch.settings.clone());
            let written = tokio::task::spawn_blocking(move || persist(&home, saved.as_ref(), &more))
                .await
                .map_err(|e| Error::internal(format!("the config writer failed: {e}")))
                .and_then(|r| r);
            match written {
                // With --bus the shared route already changed: go on.
                Err(e) if self.shared.is_some() && spec.is_some() => {
                    tracing::warn!("config.toml keeps its old settings: {}", e.message)
                }
                other => other?,
            }
        }
        let settings = self.lock().settings.patched(&patch.settings);
        let fp = spec.as_ref().map(|s| self.route_key_fingerprint(s));
        let provider = spec.as_ref().map(|s| s.provider);
        apply(route, &settings);
        let n = {
            let mut c = self.lock();
            if let Some(spec) = spec {
                c.spec = spec;
            }
            c.settings = settings;
            c.n += 1;
            if bus_rev.is_some() {
                c.bus_rev = bus_rev;
                c.built = (bus_rev, fp.flatten());
            }
            c.n
        };
        self.changes.send_replace(n);
        match provider {
            Some(p) => {
                tracing::info!(provider = p.as_str(), model = %self.lock().spec.model, "model route changed")
            }
            None => tracing::info!("configuration changed"),
        }
        Ok(())
    }

    /// `update` with `--bus`: based on the bucket's route, read from the
    /// leader (another replica may have changed it a moment ago), and
    /// written expecting its revision: the compare-and-set. A change that
    /// named no revision is based on the newer route and tried again when
    /// another replica wrote first; one that named a revision is stale then.
    /// config.toml is not written: the bucket is where the route lives.
    async fn update_shared(
        &self,
        shared: &SharedConfig,
        patch: &RoutePatch,
    ) -> Result<(RouteSpec, Route, Option<u64>)> {
        let mut last = String::new();
        for _ in 0..shared_config::CAS_TRIES {
            let (cur, revision, based) = match shared.read_route().await? {
                Some((spec, rev)) => (spec, shared_config::revision_string(rev), Some(rev)),
                None => {
                    let (spec, revision) = self.current();
                    (spec, revision, None)
                }
            };
            if let Some(r) = &patch.revision {
                if *r != revision {
                    return Err(stale(r, &revision));
                }
            }
            let spec = patched(&cur, patch)?;
            let route = self.route_for(&spec)?;
            if let Some(rev) = shared.write_route(&spec, based).await? {
                return Ok((spec, route, Some(rev)));
            }
            if let Some(r) = &patch.revision {
                let now = shared
                    .read_route()
                    .await
                    .ok()
                    .flatten()
                    .map_or_else(String::new, |(_, n)| shared_config::revision_string(n));
                return Err(stale(r, &now));
            }
            last = revision;
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("the route keeps changing on other replicas (last seen at {last}); try again"),
        ))
    }

    /// After a key of `kind` changed: a route of that provider gets a new
    /// client with the key now reachable (or one that fails as not
    /// configured when none is). The description and revision stay.
    async fn rekey(self: &Arc<Self>, kind: ProviderKind, apply: impl FnOnce(Route) + Send + 'static) {
        let me = self.clone();
        let turn = self
            .changing
            .change(move |_| Box::pin(async move { me.rekey_now(kind, apply) }));
        if let Err(e) = turn.await {
            tracing::warn!("the {} route keeps its client: {e}", kind.as_str());
        }
    }

    /// `rekey` on the route's owner task.
    fn rekey_now(&self, kind: ProviderKind, apply: impl FnOnce(Route)) {
        let spec = self.lock().spec.clone();
        if spec.provider != kind {
            return;
        }
        match self.route_for(&spec) {
            Ok(route) => apply(route),
            Err(e) => {
                tracing::warn!("the {} route has no usable key now: {}", kind.as_str(), e.message);
                apply(unconfigured(&spec))
            }
        }
        let fp = self.route_key_fingerprint(&spec);
        self.lock().built.1 = fp;
    }

    /// Stores a key; its fingerprint.
    pub async fn set_key(
        self: &Arc<Self>,
        kind: ProviderKind,
        key: &str,
        apply: impl FnOnce(Route) + Send + 'static,
    ) -> Result<String> {
        if kind == ProviderKind::Offline {
            return Err(Error::invalid("the offline provider takes no key"));
        }
        secrets::validate_key(key)?;
        let secret = Secret::new(key.to_string());
        let fp = secrets::fingerprint(&secret);
        match &self.shared {
            Some(shared) => shared.put_key(kind, &secret).await?,
            None => self.store.put(kind, secret).await?,
        }
        self.rekey(kind, apply).await;
        tracing::info!(provider = kind.as_str(), fingerprint = %fp, "key stored");
        Ok(fp)
    }

    /// Revokes the stored key: (whether there was one, whether the
    /// environment still exports one).
    pub async fn delete_key(
        self: &Arc<Self>,
        kind: ProviderKind,
        apply: impl FnOnce(Route) + Send + 'static,
    ) -> Result<(bool, bool)> {
        if kind == ProviderKind::Offline {
            return Err(Error::invalid("the offline provider takes no key"));
        }
        let deleted = match &self.shared {
            Some(shared) => shared.delete_key(kind).await?,
            None => self.store.delete(kind).await?,
        };
        if deleted {
            self.rekey(kind, apply).await;
            tracing::info!(provider = kind.as_str(), "stored key deleted");
        }
        Ok((deleted, self.env.key(kind).is_some()))
    }

    /// With `--bus`: reads the shared keys again, so what is answered next
    /// shows a change made on another replica a moment ago.
    pub async fn refresh_keys(&self) -> Result<()> {
        match &self.shared {
            Some(shared) => shared.refresh_keys().await,
            None => Ok(()),
        }
    }

    /// Every provider with its reachable keys (fingerprints only). One is
    /// configured when a key reaches it, or when it is the route's with a
    /// base URL (a keyless local server).
    pub fn providers(&self) -> Vec<ProviderStatus> {
        let local = {
            let c = self.lock();
            c.spec.base_url.is_some().then_some(c.spec.provider)
        };
        ProviderKind::ALL
            .into_iter()
            .map(|kind| {
                let mut fingerprints = Vec::new();
                let mut key_sources = Vec::new();
                let keys = [
                    (KeySource::Env, self.env.key(kind)),
                    (KeySource::Store, self.stored_key(kind)),
                ];
                for (source, key) in keys {
                    if let Some(k) = key {
                        let fp = secrets::fingerprint(&k);
                        key_sources.push(source);
                        if !fingerprints.contains(&fp) {
                            fingerprints.push(fp);
                        }
                    }
                }
                ProviderStatus {
                    kind,
                    configured: kind == ProviderKind::Offline
                        || !fingerprints.is_empty()
                        || local == Some(kind),
                    fingerprints,
                    key_sources,
                }
            })
            .collect()
    }

    /// Asks the provider which models its key reaches, live. The base URL is
    /// the route's when the route uses this provider, else the service's own.
    pub async fn list_models(&self, kind: ProviderKind) -> Result<Vec<ModelInfo>> {
        let base_url = {
            let c = self.lock();
            (c.spec.provider == kind)
                .then(|| c.spec.base_url.clone())
                .flatten()
        };
        let key = match kind {
            ProviderKind::Offline => None,
            k => self.key(k),
        };
        if kind != ProviderKind::Offline && key.is_none() && base_url.is_none() {
            return Err(no_ai_service(kind));
        }
        let endpoint = Endpoint { kind, base_url, key };
        let client = provider::connect_with(&endpoint, &self.client).map_err(|f| failure_error(kind, f))?;
        match tokio::time::timeout(LIST_MODELS_TIMEOUT, client.list_models()).await {
            Ok(Ok(models)) => Ok(models),
            Ok(Err(f)) => {
                let host = client.host();
                let mut e = failure_error(kind, f.clone());
                // Unreachable: say where (HOST:PORT, never the path or key).
                if f.kind == FailureKind::Network {
                    e.message = f.message_at(host.as_deref());
                }
                Err(e)
            }
            Err(_) => Err(Error::new(
                ErrorKind::Upstream,
                format!(
                    "the {} service did not list its models within {}s",
                    kind.label(),
                    LIST_MODELS_TIMEOUT.as_secs()
                ),
            )
            .with_reason("timeout")),
        }
    }
}

/// The route `patch` makes of `cur`: absent parts keep `cur`'s (or, when
/// the provider changes, reset).
fn patched(cur: &RouteSpec, patch: &RoutePatch) -> Result<RouteSpec> {
    let provider = patch.provider.unwrap_or(cur.provider);
    let switched = provider != cur.provider;
    let model = match &patch.model {
        Some(m) => m.clone(),
        None if !switched => cur.model.clone(),
        None if provider == ProviderKind::Offline => "offline".into(),
        None => {
            return Err(Error::invalid(format!(
                "model is required when switching to the {} provider",
                provider.as_str()
            )))
        }
    };
    validate_model(&model, "model")?;
    let base_url = match &patch.base_url {
        Some(u) if u.is_empty() => None,
        Some(u) => {
            validate_base_url(u, "base_url")?;
            offline_takes_no_url(provider)?;
            Some(u.clone())
        }
        None if switched => None,
        None => cur.base_url.clone(),
    };
    Ok(RouteSpec {
        provider,
        model,
        base_url,
        source: Source::Api,
    })
}

/// A route whose legs fail as not configured (its key is gone, or this
/// replica cannot reach the route another replica set).
fn unconfigured(spec: &RouteSpec) -> Route {
    Route {
        provider: Arc::new(Unconfigured),
        model: spec.model.clone(),
        context_window: None,
    }
}

fn stale(based: &str, now: &str) -> Error {
    Error::conflict(format!(
        "stale revision: the configuration changed since revision {:?} (now {now}); read it again and retry",
        based.chars().take(40).collect::<String>()
    ))
}

fn offline_takes_no_url(provider: ProviderKind) -> Result<()> {
    if provider == ProviderKind::Offline {
        return Err(Error::invalid("the offline provider takes no base_url"));
    }
    Ok(())
}

fn no_ai_service(kind: ProviderKind) -> Error {
    Error::new(
        ErrorKind::NoAiService,
        format!(
            "no API key for the {} provider: export {}, or store one with PUT /config/key (a local server needs none: give its base_url)",
            kind.as_str(),
            kind.key_env().unwrap_or("its key")
        ),
    )
}

/// The same, when `vak serve` starts: the server refuses to start, so the
/// advice is what works before it runs (the key store is filled through a
/// running server: one started on the offline provider).
fn no_key_at_startup(kind: ProviderKind) -> Error {
    let var = kind.key_env().unwrap_or("its key variable");
    Error::new(
        ErrorKind::NoAiService,
        format!(
            "no API key for the {p} provider: set {var} when starting (`{var}=… vak serve --provider {p} …`), \
             or give --base-url for a local server, which needs none; to keep a key in vak's home instead, \
             start with --provider offline, store it with PUT /config/key and switch with PATCH /config \
             (later starts find it)",
            p = kind.as_str(),
        ),
    )
}

/// A provider failure as an error a client sees: its fixed message and a
/// reason; the raw detail goes to the log only.
fn failure_error(kind: ProviderKind, f: Failure) -> Error {
    tracing::warn!(provider = kind.as_str(), detail = %f.detail, "model service failure");
    if f.kind == FailureKind::NotConfigured {
        return Error::new(
            ErrorKind::NoAiService,
            format!(
                "the {} provider is not configured: {}",
                kind.as_str(),
                f.kind.message()
            ),
        );
    }
    upstream_error(&f)
}

/// A model service failure as the error a client sees: its fixed message
/// and a machine-readable reason (never the raw detail).
pub(crate) fn upstream_error(f: &Failure) -> Error {
    Error::new(ErrorKind::Upstream, f.kind.message()).with_reason(f.kind.as_str())
}

#[cfg(test)]
mod tests;
