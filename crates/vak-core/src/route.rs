//! The model a leg talks to (`Route`: a provider client and a model name) and the
//! description of the route in effect (`RouteSpec`: which provider, model and base URL,
//! and where that came from), shared by the config, the cluster's shared config and
//! the sessions.

use crate::provider::{Provider, ProviderKind};
use std::sync::Arc;

/// The model a leg talks to: a provider and the model name it is asked for.
#[derive(Clone)]
pub struct Route {
    pub provider: Arc<dyn Provider>,
    pub model: String,
    /// The model's context window in tokens; None: unbounded (the offline
    /// model). The history is compacted when a turn comes near it.
    pub context_window: Option<u64>,
}

impl Route {
    /// The embedded offline model.
    pub fn offline() -> Route {
        Route {
            provider: Arc::new(crate::provider::offline::OfflineModel),
            model: "offline".into(),
            context_window: None,
        }
    }
}

/// Where the route in effect came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--provider`, `--model`, `--base-url`.
    Flag,
    /// `VAK_PROVIDER`, `VAK_MODEL`, `VAK_BASE_URL`.
    Env,
    /// `[model]` in `<home>/config.toml`.
    File,
    /// `PATCH /config` (UpdateConfig) in this server's life.
    Api,
    /// Nothing named one: the offline model.
    Default,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "env",
            Source::File => "file",
            Source::Api => "api",
            Source::Default => "default",
        }
    }

    /// The source `as_str` names; any other (a newer replica's) reads as `Api`.
    pub fn parse(s: &str) -> Source {
        match s {
            "flag" => Source::Flag,
            "env" => Source::Env,
            "file" => Source::File,
            "default" => Source::Default,
            _ => Source::Api,
        }
    }
}

/// The route in effect, as a description (the `Route` holds the client).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub provider: ProviderKind,
    pub model: String,
    pub base_url: Option<String>,
    pub source: Source,
}

impl RouteSpec {
    pub fn offline() -> RouteSpec {
        RouteSpec {
            provider: ProviderKind::Offline,
            model: "offline".into(),
            base_url: None,
            source: Source::Default,
        }
    }
}
