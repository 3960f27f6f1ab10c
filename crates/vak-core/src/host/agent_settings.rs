//! The settings `PATCH /config` changes besides the model route: max_turns (config.toml's `[agent]`), the clients' theme (`[app]`) and the lifecycle hooks (`[hooks]`), each with where it came from, checked, and written back into config.toml keeping everything else.

use crate::error::{Error, Result};
use crate::host::hooks::{HookSpecs, Hooks};
use crate::route::Source;
use std::sync::Arc;

/// The most model turns one leg may be given through the API or config.toml.
pub const MAX_MAX_TURNS: u32 = 1000;

/// The clients' colour theme (`/app` honours it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Theme {
    Light,
    Dark,
    /// Whatever the browser prefers.
    #[default]
    System,
}

impl Theme {
    pub fn as_str(self) -> &'static str {
        match self {
            Theme::Light => "light",
            Theme::Dark => "dark",
            Theme::System => "system",
        }
    }
}

/// `[agent]` of config.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileAgent {
    #[serde(default)]
    pub(crate) max_turns: Option<u32>,
}

/// `[app]` of config.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileApp {
    #[serde(default)]
    pub(crate) theme: Option<Theme>,
}

/// What config.toml says about these settings (None: its section or key is absent).
#[derive(Debug, Default)]
pub struct FileSettings {
    pub max_turns: Option<u32>,
    pub theme: Option<Theme>,
    pub hooks: Option<Hooks>,
}

impl FileSettings {
    /// Checks what the file's sections hold; an error names the key.
    pub(crate) fn check(agent: FileAgent, app: FileApp, hooks: Option<HookSpecs>) -> Result<FileSettings> {
        if let Some(n) = agent.max_turns {
            check_max_turns(n, "[agent] max_turns")?;
        }
        let hooks = hooks.map(|h| Hooks::check(&h, "[hooks]")).transpose()?;
        Ok(FileSettings {
            max_turns: agent.max_turns,
            theme: app.theme,
            hooks,
        })
    }
}

/// 1 to `MAX_MAX_TURNS`; an error names `origin`.
pub fn check_max_turns(n: u32, origin: &str) -> Result<u32> {
    if (1..=MAX_MAX_TURNS).contains(&n) {
        Ok(n)
    } else {
        Err(Error::invalid(format!(
            "{origin}: {n} is not from 1 to {MAX_MAX_TURNS}"
        )))
    }
}

/// These settings in effect, each with its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSettings {
    pub max_turns: u32,
    pub max_turns_source: Source,
    pub theme: Theme,
    pub theme_source: Source,
    pub hooks: Arc<Hooks>,
    pub hooks_source: Source,
}

impl AgentSettings {
    /// At startup: `--max-turns` (`flag`, the value `cfg.max_turns` then
    /// holds) over config.toml over the default (`cfg.max_turns` too); the
    /// theme and hooks from config.toml or their defaults.
    pub(crate) fn resolve(max_turns: u32, from_flag: bool, file: &FileSettings) -> AgentSettings {
        let (max_turns, max_turns_source) = match (from_flag, file.max_turns) {
            (true, _) => (max_turns, Source::Flag),
            (false, Some(n)) => (n, Source::File),
            (false, None) => (max_turns, Source::Default),
        };
        let (theme, theme_source) = match file.theme {
            Some(t) => (t, Source::File),
            None => (Theme::default(), Source::Default),
        };
        let (hooks, hooks_source) = match &file.hooks {
            Some(h) => (Arc::new(h.clone()), Source::File),
            None => (Arc::new(Hooks::default()), Source::Default),
        };
        AgentSettings {
            max_turns,
            max_turns_source,
            theme,
            theme_source,
            hooks,
            hooks_source,
        }
    }

    /// These settings with `patch` applied (what it names comes from the API).
    pub(crate) fn patched(&self, patch: &SettingsPatch) -> AgentSettings {
        let mut next = self.clone();
        if let Some(n) = patch.max_turns {
            next.max_turns = n;
            next.max_turns_source = Source::Api;
        }
        if let Some(t) = patch.theme {
            next.theme = t;
            next.theme_source = Source::Api;
        }
        if let Some(h) = &patch.hooks {
            next.hooks = Arc::new(h.clone());
            next.hooks_source = Source::Api;
        }
        next
    }
}

/// A change of these settings asked for through the API, checked.
#[derive(Clone, Debug, Default)]
pub struct SettingsPatch {
    pub max_turns: Option<u32>,
    pub theme: Option<Theme>,
    /// Replaces every hook.
    pub hooks: Option<Hooks>,
}

impl SettingsPatch {
    pub fn is_empty(&self) -> bool {
        self.max_turns.is_none() && self.theme.is_none() && self.hooks.is_none()
    }
}

/// Writes what `patch` names into `doc`: `[agent] max_turns`, `[app] theme`
/// and `[hooks]`, keeping every other key and comment.
pub(crate) fn write_toml(doc: &mut toml_edit::DocumentMut, patch: &SettingsPatch) -> Result<()> {
    if let Some(n) = patch.max_turns {
        let agent = table(doc, "agent")?;
        set_keeping_decor(agent, "max_turns", toml_edit::Value::from(i64::from(n)));
    }
    if let Some(t) = patch.theme {
        let app = table(doc, "app")?;
        set_keeping_decor(app, "theme", toml_edit::Value::from(t.as_str()));
    }
    if let Some(h) = &patch.hooks {
        crate::host::hooks::write_toml(doc, h)?;
    }
    Ok(())
}

/// The table `name` of `doc`, made when absent.
fn table<'a>(doc: &'a mut toml_edit::DocumentMut, name: &str) -> Result<&'a mut dyn toml_edit::TableLike> {
    doc.entry(name)
        .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()))
        .as_table_like_mut()
        .ok_or_else(|| {
            Error::conflict(format!(
                "config.toml's {name} is not a table; fix it, then try again"
            ))
        })
}

/// Sets `key` to `v`, keeping the comments around an existing value.
pub(crate) fn set_keeping_decor(table: &mut dyn toml_edit::TableLike, key: &str, mut v: toml_edit::Value) {
    match table.get_mut(key) {
        Some(item) => {
            if let Some(old) = item.as_value() {
                *v.decor_mut() = old.decor().clone();
            }
            *item = toml_edit::Item::Value(v);
        }
        None => {
            table.insert(key, toml_edit::Item::Value(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_file_over_the_default_and_a_patch_is_the_apis() {
        let file = FileSettings {
            max_turns: Some(9),
            theme: Some(Theme::Dark),
            hooks: None,
        };
        let s = AgentSettings::resolve(50, false, &file);
        assert_eq!((s.max_turns, s.max_turns_source), (9, Source::File));
        assert_eq!((s.theme, s.theme_source), (Theme::Dark, Source::File));
        assert_eq!(s.hooks_source, Source::Default);
        let s = AgentSettings::resolve(7, true, &file);
        assert_eq!((s.max_turns, s.max_turns_source), (7, Source::Flag));
        let s = AgentSettings::resolve(50, false, &FileSettings::default());
        assert_eq!((s.max_turns, s.max_turns_source), (50, Source::Default));
        assert_eq!((s.theme, s.theme_source), (Theme::System, Source::Default));
        let p = s.patched(&SettingsPatch {
            theme: Some(Theme::Light),
            ..SettingsPatch::default()
        });
        assert_eq!((p.theme, p.theme_source), (Theme::Light, Source::Api));
        assert_eq!((p.max_turns, p.max_turns_source), (50, Source::Default));
        assert!(check_max_turns(0, "max_turns").is_err() && check_max_turns(1001, "max_turns").is_err());
    }

    #[test]
    fn writing_keeps_comments_and_other_keys() {
        let text =
            "# mine\n[agent]\n# how many\nmax_turns = 5 # five\nother = 1\n\n[server]\ntrusted_hosts = []\n";
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        let patch = SettingsPatch {
            max_turns: Some(12),
            theme: Some(Theme::Dark),
            hooks: None,
        };
        write_toml(&mut doc, &patch).unwrap();
        let out = doc.to_string();
        assert!(
            out.starts_with("# mine\n[agent]\n# how many\nmax_turns = 12 # five\nother = 1\n\n[server]\ntrusted_hosts = []\n"),
            "{out}"
        );
        assert!(out.ends_with("[app]\ntheme = \"dark\"\n"), "{out}");
    }
}
