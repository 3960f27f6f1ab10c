//! What every session of a server shares: the config, the route, permission mode, max_turns and hooks (shared by every workspace), the MCP servers and the cost ledger, and a workspace's rules, memory, search index and sandbox.

use crate::error::{Error, Result};
use crate::host::hooks::Hooks;
use crate::host::rules::Rules;
use crate::route::Route;
use crate::{CoreConfig, PermissionMode};
use std::sync::Arc;
use tokio::sync::watch;

/// The live settings a leg reads when it starts (or a hook event when it fires).
#[derive(Clone)]
struct Agent {
    max_turns: u32,
    hooks: Arc<Hooks>,
}

/// What every workspace's runtime shares besides the route, mode and agent settings.
struct Services {
    search: Arc<crate::host::search::Search>,
    sandbox: Arc<crate::tools::sandbox::Sandbox>,
    mcp: Arc<crate::mcp::Mcp>,
    finops: Arc<crate::finops::Finops>,
    spawner: Arc<std::sync::RwLock<Option<Arc<dyn crate::worker::Spawner>>>>,
    portfolio: Arc<crate::host::portfolio::Portfolio>,
    policy: Arc<crate::intent::Policy>,
    skills: Arc<crate::host::skills::Skills>,
}

/// Shared by every session of a server.
pub struct Runtime {
    pub cfg: CoreConfig,
    /// Shared by the runtimes of every workspace (`in_workspace`): one route,
    /// with the config revision it came from.
    route: Arc<std::sync::RwLock<(Route, String)>>,
    /// The live permission mode; watched by config frames. Shared like the route.
    mode: Arc<watch::Sender<PermissionMode>>,
    /// Model turns a leg may take and the lifecycle hooks, shared like the
    /// route (`PATCH /config` changes them for legs and calls from then on).
    agent: Arc<std::sync::RwLock<Agent>>,
    /// The workspace's always-allow rules.
    rules: Rules,
    /// The memory notes the system prompt carries.
    memory: crate::host::memory::Memory,
    /// The workspace's canonical path, as ledger headers and search name it.
    workspace: String,
    /// The transcript search index, fed as runs finish (one for every workspace).
    search: Arc<crate::host::search::Search>,
    /// The sandbox the agent's commands run in (one for every workspace).
    sandbox: Arc<crate::tools::sandbox::Sandbox>,
    /// The MCP servers (one set for every workspace and session).
    mcp: Arc<crate::mcp::Mcp>,
    /// Prices, the cost ledger and the daily budget (one for every workspace).
    finops: Arc<crate::finops::Finops>,
    /// What spawns child sessions (the host's children table), set when
    /// the hub is built; shared by every workspace's runtime.
    spawner: Arc<std::sync::RwLock<Option<Arc<dyn crate::worker::Spawner>>>>,
    /// Every session's commitments, for listing (one for every workspace).
    portfolio: Arc<crate::host::portfolio::Portfolio>,
    /// config.toml's `[intent]` and `[commitment]` (one for every workspace:
    /// a workspace has no layer of its own, so a repository cannot loosen it).
    policy: Arc<crate::intent::Policy>,
    /// Skill proposals and where promoted skills are (one for every workspace).
    skills: Arc<crate::host::skills::Skills>,
    /// An opened workspace's folder, re-checked at every use; None for the
    /// server's own.
    pin: Option<crate::host::workspaces::Pinned>,
}

impl Runtime {
    /// Reads the workspace's rules file and resolves its path: blocking, for startup.
    pub fn new(
        cfg: CoreConfig,
        route: Route,
        search: crate::host::search::Search,
        sandbox: crate::tools::sandbox::Sandbox,
        mcp: Arc<crate::mcp::Mcp>,
        finops: Arc<crate::finops::Finops>,
    ) -> Runtime {
        let mode = Arc::new(watch::channel(cfg.permission).0);
        let home = cfg.home.clone();
        let agent = Agent {
            max_turns: cfg.max_turns,
            hooks: Arc::new(Hooks::default()),
        };
        Self::with_shared(
            cfg,
            Arc::new(std::sync::RwLock::new((route, String::new()))),
            mode,
            Arc::new(std::sync::RwLock::new(agent)),
            Services {
                search: Arc::new(search),
                sandbox: Arc::new(sandbox),
                mcp,
                finops,
                spawner: Arc::default(),
                // In memory only; the hub gives its runtime the home's (`with_portfolio`).
                portfolio: Arc::new(crate::host::portfolio::Portfolio::open(None)),
                policy: Arc::default(),
                skills: Arc::new(crate::host::skills::Skills::open(&home, false)),
            },
        )
    }

    /// This runtime with `portfolio` as the commitments listing every
    /// workspace's runtime made from it shares.
    pub(crate) fn with_portfolio(mut self, portfolio: Arc<crate::host::portfolio::Portfolio>) -> Runtime {
        self.portfolio = portfolio;
        self
    }

    /// This runtime with the home's skill proposals, which every
    /// workspace's runtime made from it shares.
    pub(crate) fn with_skills(mut self, skills: Arc<crate::host::skills::Skills>) -> Runtime {
        self.skills = skills;
        self
    }

    /// This runtime with config.toml's `policy`, which every workspace's
    /// runtime made from it shares.
    pub(crate) fn with_policy(mut self, policy: Arc<crate::intent::Policy>) -> Runtime {
        self.policy = policy;
        self
    }

    fn with_shared(
        cfg: CoreConfig,
        route: Arc<std::sync::RwLock<(Route, String)>>,
        mode: Arc<watch::Sender<PermissionMode>>,
        agent: Arc<std::sync::RwLock<Agent>>,
        services: Services,
    ) -> Runtime {
        let Services {
            search,
            sandbox,
            mcp,
            finops,
            spawner,
            portfolio,
            policy,
            skills,
        } = services;
        let rules = match &cfg.shared_config {
            Some(shared) => Rules::shared(shared.clone(), &cfg.home, &cfg.workspace),
            None => Rules::load(&cfg.home, &cfg.workspace),
        };
        let memory = crate::host::memory::Memory::new(&cfg.home, &cfg.workspace, cfg.shared_memory.clone());
        let workspace = crate::home::workspace_key(&cfg.workspace).0;
        Runtime {
            workspace,
            search,
            sandbox,
            mcp,
            finops,
            spawner,
            portfolio,
            policy,
            skills,
            cfg,
            route,
            mode,
            agent,
            rules,
            memory,
            pin: None,
        }
    }

    /// The runtime of sessions in another workspace: its own rules, memory
    /// and tools' folder, this one's route, mode and search index (a change
    /// of either applies to every workspace). Blocking: reads its rules file.
    /// `pin` is how the folder is re-checked at every use.
    pub(crate) fn in_workspace(&self, pin: crate::host::workspaces::Pinned) -> Runtime {
        let mut cfg = self.cfg.clone();
        cfg.workspace = pin.path.clone();
        Runtime {
            pin: Some(pin),
            ..Self::with_shared(
                cfg,
                self.route.clone(),
                self.mode.clone(),
                self.agent.clone(),
                Services {
                    search: self.search.clone(),
                    sandbox: self.sandbox.clone(),
                    mcp: self.mcp.clone(),
                    finops: self.finops.clone(),
                    spawner: self.spawner.clone(),
                    portfolio: self.portfolio.clone(),
                    policy: self.policy.clone(),
                    skills: self.skills.clone(),
                },
            )
        }
    }

    /// The pinned folder of an opened workspace (None: the server's own).
    pub(crate) fn pinned(&self) -> Option<&crate::host::workspaces::Pinned> {
        self.pin.as_ref()
    }

    /// Re-checks the workspace folder before a use (`workspaces::recheck`):
    /// an opened workspace replaced since (by a symlink or another folder)
    /// is PermissionDenied, `workspace_replaced`. Runs off the runtime's
    /// workers; the server's own workspace always passes.
    pub async fn check_workspace(&self) -> Result<()> {
        let Some(pin) = self.pin.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || pin.check())
            .await
            .map_err(|e| Error::internal(e.to_string()))?
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    pub fn memory(&self) -> &crate::host::memory::Memory {
        &self.memory
    }

    pub fn search(&self) -> &crate::host::search::Search {
        &self.search
    }

    /// Skill proposals and the promoted skills.
    pub fn skills(&self) -> &Arc<crate::host::skills::Skills> {
        &self.skills
    }

    /// The `[intent]` and `[commitment]` policy.
    pub fn policy(&self) -> &crate::intent::Policy {
        &self.policy
    }

    /// Every session's commitments, for listing.
    pub fn portfolio(&self) -> &Arc<crate::host::portfolio::Portfolio> {
        &self.portfolio
    }

    pub fn sandbox(&self) -> &Arc<crate::tools::sandbox::Sandbox> {
        &self.sandbox
    }

    /// The MCP servers every session shares.
    pub fn mcp(&self) -> &Arc<crate::mcp::Mcp> {
        &self.mcp
    }

    /// Prices, the cost ledger and the daily budget: where a model call's usage is recorded.
    pub fn finops(&self) -> &Arc<crate::finops::Finops> {
        &self.finops
    }

    /// What spawns child sessions; None until the hub has set it (a
    /// runtime built without a hub, in unit tests).
    pub fn spawner(&self) -> Option<Arc<dyn crate::worker::Spawner>> {
        self.spawner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sets (or, with None, takes away) what spawns child sessions, for
    /// every workspace's runtime.
    pub(crate) fn set_spawner(&self, spawner: Option<Arc<dyn crate::worker::Spawner>>) {
        *self.spawner.write().unwrap_or_else(|p| p.into_inner()) = spawner;
    }

    /// The workspace's canonical path (what ledger headers and search hits name).
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// The permission mode in effect now; each tool call reads it when it is decided.
    pub fn mode(&self) -> PermissionMode {
        *self.mode.borrow()
    }

    /// Whether `bypass` may be chosen: `--allow-bypass`, or a server started in it.
    pub fn bypass_allowed(&self) -> bool {
        self.cfg.allow_bypass || self.cfg.permission == PermissionMode::Bypass
    }

    /// Switches the mode (the caller checked `bypass`); true when it changed.
    /// Watchers (config frames) hear of a change.
    pub fn set_mode(&self, mode: PermissionMode) -> bool {
        self.mode.send_if_modified(|m| std::mem::replace(m, mode) != mode)
    }

    /// Notified on every mode change.
    pub fn watch_mode(&self) -> watch::Receiver<PermissionMode> {
        self.mode.subscribe()
    }

    /// The current route; a leg takes it once and keeps it.
    pub fn route(&self) -> Route {
        self.route.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// The current route and the config revision it came from (receipts name it).
    pub fn route_and_revision(&self) -> (Route, String) {
        self.route.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the route for legs that start from now on.
    pub fn set_route(&self, route: Route) {
        self.route.write().unwrap_or_else(|p| p.into_inner()).0 = route;
    }

    /// The config revision now in effect (`ConfigInfo::revision`), set by
    /// the control plane after each change of it.
    pub fn set_route_revision(&self, revision: String) {
        self.route.write().unwrap_or_else(|p| p.into_inner()).1 = revision;
    }

    fn agent(&self) -> Agent {
        self.agent.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The model turns a leg starting now may take.
    pub fn max_turns(&self) -> u32 {
        self.agent().max_turns
    }

    /// The lifecycle hooks in effect now (a snapshot: no lock is held while they run).
    pub fn hooks(&self) -> Arc<Hooks> {
        self.agent().hooks
    }

    /// Takes up max_turns and hooks for legs and events from now on.
    pub fn set_agent_settings(&self, s: &crate::host::agent_settings::AgentSettings) {
        *self.agent.write().unwrap_or_else(|p| p.into_inner()) = Agent {
            max_turns: s.max_turns,
            hooks: s.hooks.clone(),
        };
    }
}
