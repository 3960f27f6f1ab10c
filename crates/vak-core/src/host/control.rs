//! The control plane: what the server is configured with and changes at run time, for every session at once: the model route and keys, the permission mode (`control/mode.rs`), always-allow rules, memory notes, transcript search and the open workspaces.

mod digest;
mod mode;

use crate::error::{Error, Result};
use crate::host::config::{RoutePatch, RouteSpec, Settings};
use crate::host::registry::Registry;
use crate::host::runtimes::Runtimes;
use crate::host::workspaces::Workspaces;
use crate::session::runtime::Runtime;
use crate::CoreConfig;
use crate::PermissionMode;
use std::sync::{Arc, Weak};
use tokio_util::sync::CancellationToken;

/// The effective configuration: what GetConfig answers and config frames carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigInfo {
    pub permission_mode: String,
    pub ring: u64,
    pub route: RouteSpec,
    /// Changes on every route change (and with every server start).
    pub revision: String,
    /// max_turns, theme and hooks, with their sources.
    pub settings: crate::host::agent_settings::AgentSettings,
    /// What a change found worth saying although it was applied (a base
    /// URL nothing answers at); empty but in an `update_route` answer.
    pub warnings: Vec<String>,
}

/// How long `update_route` waits for a new base URL to answer.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// What a permission mode change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeChange {
    pub config: ConfigInfo,
    /// False when the mode was already the one asked for (nothing happened).
    pub changed: bool,
    pub cancelled_runs: usize,
    pub denied_approvals: usize,
}

pub struct ControlPlane {
    /// The server's own workspace's runtime: its route, mode, rules,
    /// memory and search.
    rt: Arc<Runtime>,
    /// The runtimes of other open workspaces (their rules).
    runtimes: Arc<Runtimes>,
    /// The model route's description and revision, keys, config.toml.
    settings: Arc<Settings>,
    /// Where every permission mode change runs, one at a time, from switch
    /// (and, with `--bus`, the bucket's put) to settled runs: no lock is
    /// held across that I/O.
    mode_change: crate::file_owner::FileOwner<()>,
    /// The workspaces open in this process (`workspaces.rs`).
    workspaces: Arc<Workspaces>,
    /// The live sessions a mode change interrupts and search hits name.
    sessions: Arc<Registry>,
    /// Cancelled once the hub has shut down.
    closing: CancellationToken,
}

/// With `--bus`: takes up every route and key change another replica
/// makes, until the hub closes.
async fn adopt_shared_config(
    shared: Arc<crate::cluster::shared_config::SharedConfig>,
    settings: Weak<Settings>,
    rt: Weak<Runtime>,
    closing: CancellationToken,
) {
    let mut changes = shared.changes();
    loop {
        {
            let (Some(s), Some(rt)) = (settings.upgrade(), rt.upgrade()) else {
                return;
            };
            let applied = rt.clone();
            s.adopt(move |route| applied.set_route(route)).await;
            rt.set_route_revision(s.current().1);
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = closing.cancelled() => return,
        }
    }
}

/// With `--bus`: applies every MCP servers' table another replica puts,
/// until the hub closes (servers this replica already runs as given stay).
async fn adopt_shared_mcp(
    shared: Arc<crate::cluster::shared_config::SharedConfig>,
    mcp: Weak<crate::mcp::Mcp>,
    closing: CancellationToken,
) {
    let mut changes = shared.mcp_changes();
    loop {
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = closing.cancelled() => return,
        }
        let (Some(defs), Some(m)) = (shared.mcp(), mcp.upgrade()) else {
            continue;
        };
        if m.defs() == defs {
            continue;
        }
        let applied = m.clone();
        let turn = m
            .changing
            .change(move |_| Box::pin(async move { applied.apply(defs, std::time::Duration::ZERO).await }));
        if turn.await.is_err() {
            return;
        }
        tracing::info!("MCP servers changed on another replica");
    }
}

impl ControlPlane {
    /// The control plane over `runtimes`' primary; with `--bus` it takes
    /// up the shared mode now and every route and key change from now on.
    pub(crate) fn new(
        runtimes: Arc<Runtimes>,
        settings: Settings,
        workspaces: Arc<Workspaces>,
        sessions: Arc<Registry>,
        closing: CancellationToken,
    ) -> ControlPlane {
        let rt = runtimes.primary().clone();
        rt.set_agent_settings(&settings.agent_settings());
        rt.set_route_revision(settings.current().1);
        let settings = Arc::new(settings);
        if let Some(shared) = rt.cfg.shared_config.clone() {
            // The bucket's mode wins over --permission-mode (a bypass this
            // replica does not allow aside: `follow_shared_mode` warns).
            if let Some(m) = shared.mode() {
                if m.mode.check(rt.bypass_allowed()).is_ok() {
                    rt.set_mode(m.mode);
                }
            }
            tokio::spawn(adopt_shared_mcp(
                shared.clone(),
                Arc::downgrade(rt.mcp()),
                closing.clone(),
            ));
            tokio::spawn(adopt_shared_config(
                shared,
                Arc::downgrade(&settings),
                Arc::downgrade(&rt),
                closing.clone(),
            ));
        }
        ControlPlane {
            rt,
            runtimes,
            settings,
            mode_change: crate::file_owner::FileOwner::new("the permission mode", ()),
            workspaces,
            sessions,
            closing,
        }
    }

    /// The workspaces open in this process.
    pub fn workspaces(&self) -> &Arc<Workspaces> {
        &self.workspaces
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Changes the model route and max_turns, theme and hooks (resolved,
    /// persisted, then applied to legs that start from now on); the new
    /// effective configuration.
    ///
    /// A patch naming a base URL probes it once applied (its models
    /// listing, at most `PROBE_TIMEOUT`, with no lock held): when nothing
    /// answers, the change stands (a server may start later) and the
    /// answer carries a warning saying so.
    pub async fn update_route(&self, patch: RoutePatch) -> Result<ConfigInfo> {
        let rt = self.rt.clone();
        let probe = patch
            .base_url
            .as_deref()
            .filter(|u| !u.is_empty())
            .map(str::to_string);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.settings
            .update(patch, move |route, settings| {
                if let Some(route) = route {
                    let _ = tx.send(route.provider.clone());
                    rt.set_route(route);
                }
                rt.set_agent_settings(settings);
            })
            .await?;
        self.rt.set_route_revision(self.settings.current().1);
        let mut info = self.config_info();
        if let (Some(url), Ok(provider)) = (probe, rx.await) {
            if let Err(f) = provider.probe(PROBE_TIMEOUT).await {
                tracing::warn!(base_url = %shown_url(&url), detail = %f.detail, "the new base URL does not answer");
                info.warnings.push(unreachable_warning(&url, &f));
            }
        }
        Ok(info)
    }

    /// Stores a provider key; its fingerprint. A route of that provider
    /// picks it up for its next legs.
    pub async fn set_key(&self, kind: crate::provider::ProviderKind, key: &str) -> Result<String> {
        let rt = self.rt.clone();
        self.settings
            .set_key(kind, key, move |route| rt.set_route(route))
            .await
    }

    /// Deletes a stored key: (deleted, the environment still exports one).
    pub async fn delete_key(&self, kind: crate::provider::ProviderKind) -> Result<(bool, bool)> {
        let rt = self.rt.clone();
        self.settings
            .delete_key(kind, move |route| rt.set_route(route))
            .await
    }

    /// The MCP servers every session shares.
    pub fn mcp(&self) -> &Arc<crate::mcp::Mcp> {
        self.rt.mcp()
    }

    /// Replaces the MCP servers: validated (InvalidArgument naming the
    /// field), written to config.toml's `[mcp.servers]` (every other key
    /// and comment kept), then applied without a restart; the new state,
    /// once the started servers are ready or failed (at most `settle`).
    pub async fn put_mcp(
        &self,
        defs: crate::mcp::config::ServerDefs,
        settle: std::time::Duration,
    ) -> Result<Vec<crate::mcp::ServerStatus>> {
        crate::mcp::config::validate(&defs)?;
        let mcp = self.rt.mcp().clone();
        let settings = self.settings.clone();
        let shared = self.rt.cfg.shared_config.clone();
        let applied = mcp.clone();
        mcp.changing
            .change(move |_| {
                Box::pin(async move {
                    match shared {
                        // With --bus the bucket is where the table lives
                        // (config.toml is not written, as for the route).
                        Some(shared) => shared.put_mcp(&defs).await?,
                        None => {
                            let written = defs.clone();
                            settings
                                .edit_file(move |doc| crate::mcp::config::write_servers(doc, &written))
                                .await?
                        }
                    }
                    applied.apply(defs, settle).await;
                    Ok::<_, crate::error::Error>(())
                })
            })
            .await??;
        Ok(mcp.status())
    }

    /// The workspace's always-allow rules.
    pub fn rules(&self) -> &crate::host::rules::Rules {
        self.rt.rules()
    }

    /// The runtime of the open workspace at `workspace` (an absolute path,
    /// as `GET /workspaces` lists it; None: the server's own), for its
    /// always-allow rules: made on first use like a session's, its folder
    /// re-checked. An empty path is InvalidArgument; a path no open
    /// workspace has is NotFound (`workspace_not_open`).
    pub async fn workspace_runtime(&self, workspace: Option<&str>) -> Result<Arc<Runtime>> {
        self.runtimes.of_open(workspace).await
    }

    /// The best `limit` transcript hits for `q`, in this workspace's
    /// sessions or in every workspace's (`all`), each with its session's title.
    pub async fn search(
        &self,
        q: &str,
        limit: usize,
        all: bool,
    ) -> Result<Vec<(crate::host::search::Hit, String)>> {
        let workspace = (!all).then(|| self.rt.workspace().to_string());
        let hits = self.rt.search().query(q, limit, workspace).await?;
        Ok(hits
            .into_iter()
            .map(|h| {
                let title = self.sessions.title(&h.session_id);
                (h, title)
            })
            .collect())
    }

    /// The commitments of this workspace's sessions (every workspace's with
    /// `all`), in their natural order, and the open ones' priorities as of
    /// now; once what was listed before this start is read back.
    pub async fn commitments(
        &self,
        all: bool,
    ) -> (
        Vec<crate::commitment::Commitment>,
        Vec<crate::commitment::Priority>,
    ) {
        self.rt.portfolio().wait_loaded().await;
        let rows = self.rt.portfolio().list((!all).then(|| self.rt.workspace()));
        let priorities = crate::commitment::priorities(&rows, std::time::SystemTime::now());
        (rows, priorities)
    }

    /// Reads `prompt` as typed on `surface` without running it (`intent.rs`):
    /// no model call, nothing dispatched or written. The tools are the
    /// built-in ones and the MCP servers' as offered now; the mode and route
    /// are the server's now.
    pub fn explain(
        &self,
        prompt: &str,
        surface: crate::intent::Surface,
        given: &crate::intent::Given,
    ) -> Result<Explanation> {
        use crate::intent;
        if prompt.len() > intent::MAX_PROMPT {
            return Err(Error::invalid(format!(
                "the prompt is {} bytes; at most {} are read",
                prompt.len(),
                intent::MAX_PROMPT
            )));
        }
        let tools: Vec<String> = crate::tools::definitions()
            .into_iter()
            .chain(self.rt.mcp().tool_defs())
            .map(|d| d.name)
            .collect();
        let route = self.rt.route();
        let route = format!("{}/{}", route.provider.name(), route.model);
        let policy = self.rt.policy();
        let reading = intent::read(prompt, surface, given);
        let engagement = intent::engage(&reading, policy, self.rt.mode(), &tools, &route);
        let diff = intent::diff(&engagement, &tools);
        Ok(Explanation {
            reading,
            engagement,
            diff,
        })
    }

    /// Skill proposals and the promoted skills.
    pub fn skills(&self) -> &std::sync::Arc<crate::host::skills::Skills> {
        self.rt.skills()
    }

    /// The `[intent]` and `[commitment]` policy in effect, with its sources.
    pub fn policy(&self) -> &crate::intent::Policy {
        self.rt.policy()
    }

    /// The workspace's canonical path (what search hits name).
    pub fn workspace(&self) -> &str {
        self.rt.workspace()
    }

    /// The workspace's and the user's memory notes.
    pub fn memory(&self) -> &crate::host::memory::Memory {
        self.rt.memory()
    }

    /// Notified on every permission mode change (config frames).
    pub fn watch_mode(&self) -> tokio::sync::watch::Receiver<PermissionMode> {
        self.rt.watch_mode()
    }

    /// The sandbox in force for the agent's commands.
    pub fn sandbox(&self) -> crate::tools::sandbox::SandboxFacts {
        self.rt.sandbox().facts()
    }

    pub fn config(&self) -> &CoreConfig {
        &self.rt.cfg
    }

    pub fn config_info(&self) -> ConfigInfo {
        let (route, revision) = self.settings.current();
        ConfigInfo {
            permission_mode: self.rt.mode().as_str().to_string(),
            ring: self.rt.cfg.bus.ring as u64,
            route,
            revision,
            settings: self.settings.agent_settings(),
            warnings: Vec::new(),
        }
    }
}

/// `url` without what may be a secret (a user and password, the query,
/// the fragment), for a warning and the log.
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.as_str().trim_end_matches('/').to_string()
        }
        Err(_) => url.to_string(),
    }
}

/// The warning for a base URL whose probe found nothing answering:
/// `<url> not reachable: connection refused`.
fn unreachable_warning(url: &str, f: &crate::provider::Failure) -> String {
    let why = f.cause.map_or("no answer", crate::provider::NetCause::words);
    format!("{} not reachable: {why}", shown_url(url))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_warning_shows_the_base_url_without_its_secrets_and_says_why() {
        use crate::provider::{Failure, FailureKind, NetCause};
        let refused = Failure::new(FailureKind::Network, "raw", true).with_cause(Some(NetCause::Refused));
        assert_eq!(
            super::unreachable_warning("http://127.0.0.1:9/v1", &refused),
            "http://127.0.0.1:9/v1 not reachable: connection refused"
        );
        let silent = Failure::new(FailureKind::Network, "raw", true);
        assert_eq!(
            super::unreachable_warning("https://me:pw@llm.example:8443/v1/?key=sk-x#f", &silent),
            "https://llm.example:8443/v1 not reachable: no answer"
        );
    }

    use crate::error::ErrorKind;
    use crate::host::hub::Hub;
    use crate::session::live::Route;
    use crate::CoreConfig;
    use std::sync::Arc;

    #[tokio::test]
    async fn an_open_workspace_has_one_runtime_for_its_rules_and_its_sessions() {
        let home = tempfile::tempdir().unwrap();
        let other = home.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let mut cfg = CoreConfig::new(home.path().to_path_buf(), home.path().to_path_buf());
        cfg.workspace_roots = vec![home.path().to_path_buf()];
        let h = Hub::new(cfg, Route::offline()).unwrap();
        let control = h.control();
        let primary = control.workspace_runtime(None).await.unwrap();
        assert!(Arc::ptr_eq(&primary, control.runtimes.primary()));

        let empty = control.workspace_runtime(Some("")).await.map(drop).unwrap_err();
        assert_eq!(empty.kind, ErrorKind::InvalidArgument);
        let asked = other.display().to_string();
        let closed = control
            .workspace_runtime(Some(&asked))
            .await
            .map(drop)
            .unwrap_err();
        assert_eq!(
            (closed.kind, closed.reason),
            (ErrorKind::NotFound, Some("workspace_not_open"))
        );

        let (w, opened) = control.workspaces().open(&asked, true).unwrap();
        assert!(opened);
        let rt = control.workspace_runtime(Some(&asked)).await.unwrap();
        assert!(!Arc::ptr_eq(&rt, &primary));
        let again = control.workspace_runtime(Some(&asked)).await.unwrap();
        assert!(Arc::ptr_eq(&rt, &again), "made once, then kept");
        let s = h.sessions().create_in(Some(w)).await.unwrap();
        assert!(
            std::ptr::eq(s.runtime(), &*rt),
            "the registry's sessions share it"
        );
    }
}

/// What `GET /intent/explain` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub reading: crate::intent::Reading,
    pub engagement: crate::intent::Engagement,
    pub diff: crate::intent::Diff,
}
