//! Lifecycle hooks as configured: the events, each hook's command, tool-name matcher and timeout, checked the same way whether they come from config.toml's `[hooks]` or `PATCH /config`, and written back into config.toml as arrays of tables.

use crate::error::{Error, Result};
use std::time::Duration;

/// The most hooks one event may have.
pub const MAX_HOOKS: usize = 16;
/// The longest command a hook may have, in bytes.
pub const MAX_COMMAND_LEN: usize = 4096;
/// The longest matcher, in bytes.
pub const MAX_MATCHER_LEN: usize = 1024;
/// A hook's timeout when it names none, and the most it may name.
pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;
pub const MAX_TIMEOUT_MS: u32 = 600_000;
/// What a compiled matcher may cost (a pathological regex is refused).
const MATCHER_SIZE_LIMIT: usize = 1 << 20;

/// When a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookEvent {
    /// A session was created.
    SessionStart,
    /// A tool call is about to be decided (exit code 2 blocks it).
    PreToolUse,
    /// A tool call has its result.
    PostToolUse,
    /// A run settled.
    Stop,
}

impl HookEvent {
    pub const ALL: [HookEvent; 4] = [
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::SessionStart,
        HookEvent::Stop,
    ];

    /// Its name in config.toml, on the wire and in a hook's stdin document.
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "session_start",
            HookEvent::PreToolUse => "pre_tool_use",
            HookEvent::PostToolUse => "post_tool_use",
            HookEvent::Stop => "stop",
        }
    }
}

/// A hook as asked for (config.toml or the API), before it is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    pub command: String,
    #[serde(default)]
    pub matcher: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Every event's hooks as asked for: config.toml's `[hooks]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpecs {
    #[serde(default)]
    pub pre_tool_use: Vec<HookSpec>,
    #[serde(default)]
    pub post_tool_use: Vec<HookSpec>,
    #[serde(default)]
    pub session_start: Vec<HookSpec>,
    #[serde(default)]
    pub stop: Vec<HookSpec>,
}

impl HookSpecs {
    pub fn of(&self, event: HookEvent) -> &[HookSpec] {
        match event {
            HookEvent::SessionStart => &self.session_start,
            HookEvent::PreToolUse => &self.pre_tool_use,
            HookEvent::PostToolUse => &self.post_tool_use,
            HookEvent::Stop => &self.stop,
        }
    }

    fn of_mut(&mut self, event: HookEvent) -> &mut Vec<HookSpec> {
        match event {
            HookEvent::SessionStart => &mut self.session_start,
            HookEvent::PreToolUse => &mut self.pre_tool_use,
            HookEvent::PostToolUse => &mut self.post_tool_use,
            HookEvent::Stop => &mut self.stop,
        }
    }
}

/// One checked hook.
#[derive(Clone, Debug)]
pub struct Hook {
    pub command: String,
    /// None: every tool (and the events without a tool).
    pub matcher: Option<regex::Regex>,
    /// As asked for (None: the default).
    pub timeout_ms: Option<u32>,
}

impl PartialEq for Hook {
    fn eq(&self, other: &Hook) -> bool {
        self.command == other.command
            && self.matcher.as_ref().map(regex::Regex::as_str)
                == other.matcher.as_ref().map(regex::Regex::as_str)
            && self.timeout_ms == other.timeout_ms
    }
}

impl Eq for Hook {}

impl Hook {
    /// How long it may run.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)))
    }

    /// Whether it runs for a call of `tool` (None: an event without a tool).
    pub fn matches(&self, tool: Option<&str>) -> bool {
        match (&self.matcher, tool) {
            (Some(m), Some(t)) => m.is_match(t),
            _ => true,
        }
    }

    /// Checks `spec`; an error names `at` (`hooks.pre_tool_use[0]`) and the field.
    fn check(spec: &HookSpec, at: &str) -> Result<Hook> {
        if spec.command.trim().is_empty() {
            return Err(Error::invalid(format!("{at}.command: the command is empty")));
        }
        if spec.command.len() > MAX_COMMAND_LEN || spec.command.contains('\0') {
            return Err(Error::invalid(format!(
                "{at}.command: a command is at most {MAX_COMMAND_LEN} bytes with no NUL"
            )));
        }
        let matcher = match spec.matcher.as_deref() {
            None => None,
            Some(m) if m.len() > MAX_MATCHER_LEN => {
                return Err(Error::invalid(format!(
                    "{at}.matcher: a matcher is at most {MAX_MATCHER_LEN} bytes"
                )))
            }
            Some(m) => Some(
                regex::RegexBuilder::new(m)
                    .size_limit(MATCHER_SIZE_LIMIT)
                    .build()
                    .map_err(|e| {
                        let why = e.to_string();
                        let first = why.lines().last().unwrap_or("").trim().to_string();
                        Error::invalid(format!("{at}.matcher: not a regex: {first}"))
                    })?,
            ),
        };
        let timeout_ms = match spec.timeout_ms {
            None => None,
            Some(n) if (1..=u64::from(MAX_TIMEOUT_MS)).contains(&n) => Some(n as u32),
            Some(n) => {
                return Err(Error::invalid(format!(
                    "{at}.timeout_ms: {n} is not from 1 to {MAX_TIMEOUT_MS}"
                )))
            }
        };
        Ok(Hook {
            command: spec.command.clone(),
            matcher,
            timeout_ms,
        })
    }

    fn spec(&self) -> HookSpec {
        HookSpec {
            command: self.command.clone(),
            matcher: self.matcher.as_ref().map(|m| m.as_str().to_string()),
            timeout_ms: self.timeout_ms.map(u64::from),
        }
    }
}

/// Every event's checked hooks, in the order they run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hooks {
    pre_tool_use: Vec<Hook>,
    post_tool_use: Vec<Hook>,
    session_start: Vec<Hook>,
    stop: Vec<Hook>,
}

impl Hooks {
    /// Checks every hook of `specs`; an error names the first bad one's
    /// field, prefixed with `origin` (`hooks` for the API, `[hooks]` for the file).
    pub fn check(specs: &HookSpecs, origin: &str) -> Result<Hooks> {
        let mut hooks = Hooks::default();
        for event in HookEvent::ALL {
            let asked = specs.of(event);
            if asked.len() > MAX_HOOKS {
                return Err(Error::invalid(format!(
                    "{origin}.{}: at most {MAX_HOOKS} hooks an event",
                    event.as_str()
                )));
            }
            for (i, spec) in asked.iter().enumerate() {
                let at = format!("{origin}.{}[{i}]", event.as_str());
                let hook = Hook::check(spec, &at)?;
                hooks.of_mut(event).push(hook);
            }
        }
        Ok(hooks)
    }

    pub fn of(&self, event: HookEvent) -> &[Hook] {
        match event {
            HookEvent::SessionStart => &self.session_start,
            HookEvent::PreToolUse => &self.pre_tool_use,
            HookEvent::PostToolUse => &self.post_tool_use,
            HookEvent::Stop => &self.stop,
        }
    }

    fn of_mut(&mut self, event: HookEvent) -> &mut Vec<Hook> {
        match event {
            HookEvent::SessionStart => &mut self.session_start,
            HookEvent::PreToolUse => &mut self.pre_tool_use,
            HookEvent::PostToolUse => &mut self.post_tool_use,
            HookEvent::Stop => &mut self.stop,
        }
    }

    /// The hooks of `event` that run for `tool`, in order.
    pub fn matching(&self, event: HookEvent, tool: Option<&str>) -> Vec<Hook> {
        self.of(event)
            .iter()
            .filter(|h| h.matches(tool))
            .cloned()
            .collect()
    }

    /// As asked for (what GET /config shows and config.toml holds).
    pub fn specs(&self) -> HookSpecs {
        let mut specs = HookSpecs::default();
        for event in HookEvent::ALL {
            *specs.of_mut(event) = self.of(event).iter().map(Hook::spec).collect();
        }
        specs
    }
}

/// Writes `hooks` as config.toml's `[hooks]`: one array of tables an event
/// (`[[hooks.pre_tool_use]]`), an event with none removed; every other key,
/// and the comments of the tables kept in place, stay.
pub(crate) fn write_toml(doc: &mut toml_edit::DocumentMut, hooks: &Hooks) -> Result<()> {
    let entry = doc.entry("hooks").or_insert_with(|| {
        let mut t = toml_edit::Table::new();
        t.set_implicit(true);
        toml_edit::Item::Table(t)
    });
    let Some(table) = entry.as_table_mut() else {
        return Err(Error::conflict(
            "config.toml's hooks is not a table; fix it, then try again",
        ));
    };
    for event in HookEvent::ALL {
        let key = event.as_str();
        let list = hooks.of(event);
        if list.is_empty() {
            table.remove(key);
            continue;
        }
        let old = table.get(key).and_then(toml_edit::Item::as_array_of_tables);
        let mut array = toml_edit::ArrayOfTables::new();
        for (i, hook) in list.iter().enumerate() {
            let mut t = toml_edit::Table::new();
            // The comment above an entry stays with the entry in its place.
            if let Some(prev) = old.and_then(|a| a.get(i)) {
                *t.decor_mut() = prev.decor().clone();
            }
            t.insert("command", toml_edit::value(hook.command.as_str()));
            if let Some(m) = &hook.matcher {
                t.insert("matcher", toml_edit::value(m.as_str()));
            }
            if let Some(ms) = hook.timeout_ms {
                t.insert("timeout_ms", toml_edit::value(i64::from(ms)));
            }
            array.push(t);
        }
        table.insert(key, toml_edit::Item::ArrayOfTables(array));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str, matcher: Option<&str>, timeout_ms: Option<u64>) -> HookSpec {
        HookSpec {
            command: command.into(),
            matcher: matcher.map(Into::into),
            timeout_ms,
        }
    }

    #[test]
    fn a_bad_hook_is_refused_naming_its_field() {
        let bad = |s: HookSpec| {
            let specs = HookSpecs {
                post_tool_use: vec![spec("true", None, None), s],
                ..HookSpecs::default()
            };
            Hooks::check(&specs, "hooks").unwrap_err().message
        };
        let e = bad(spec("x", Some("("), None));
        assert!(
            e.starts_with("hooks.post_tool_use[1].matcher: not a regex"),
            "{e}"
        );
        let e = bad(spec(" ", None, None));
        assert!(e.starts_with("hooks.post_tool_use[1].command"), "{e}");
        let e = bad(spec(&"x".repeat(MAX_COMMAND_LEN + 1), None, None));
        assert!(e.starts_with("hooks.post_tool_use[1].command"), "{e}");
        for t in [0, u64::from(MAX_TIMEOUT_MS) + 1] {
            let e = bad(spec("x", None, Some(t)));
            assert!(e.starts_with("hooks.post_tool_use[1].timeout_ms"), "{e}");
        }
        let many = HookSpecs {
            stop: vec![spec("x", None, None); MAX_HOOKS + 1],
            ..HookSpecs::default()
        };
        let e = Hooks::check(&many, "[hooks]").unwrap_err().message;
        assert!(e.starts_with("[hooks].stop: at most"), "{e}");
    }

    #[test]
    fn a_matcher_is_a_regex_on_the_tool_name_and_absent_matches_every_tool() {
        let specs = HookSpecs {
            pre_tool_use: vec![
                spec("a", Some("^bash$"), None),
                spec("b", None, Some(5)),
                spec("c", Some("file"), None),
            ],
            ..HookSpecs::default()
        };
        let hooks = Hooks::check(&specs, "hooks").unwrap();
        let names = |tool| -> Vec<String> {
            hooks
                .matching(HookEvent::PreToolUse, Some(tool))
                .into_iter()
                .map(|h| h.command)
                .collect()
        };
        assert_eq!(names("bash"), ["a", "b"]);
        assert_eq!(names("read_file"), ["b", "c"]);
        assert_eq!(
            hooks.of(HookEvent::PreToolUse)[1].timeout(),
            Duration::from_millis(5)
        );
        assert_eq!(
            hooks.of(HookEvent::PreToolUse)[0].timeout(),
            Duration::from_millis(u64::from(DEFAULT_TIMEOUT_MS))
        );
        assert_eq!(hooks.specs(), specs);
    }

    #[test]
    fn writing_hooks_keeps_the_rest_of_the_file_and_reads_back_the_same() {
        let text = "# top\n[model]\nprovider = \"offline\" # mine\n\n# the stop hooks\n[[hooks.stop]]\ncommand = \"old\"\n\n[[hooks.session_start]]\ncommand = \"gone\"\n";
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        let specs = HookSpecs {
            stop: vec![spec("new", None, None)],
            pre_tool_use: vec![spec("echo \"hi\"", Some("^bash$"), Some(1500))],
            ..HookSpecs::default()
        };
        write_toml(&mut doc, &Hooks::check(&specs, "hooks").unwrap()).unwrap();
        let out = doc.to_string();
        assert!(
            out.starts_with("# top\n[model]\nprovider = \"offline\" # mine\n"),
            "{out}"
        );
        assert!(
            out.contains("# the stop hooks\n[[hooks.stop]]\ncommand = \"new\""),
            "{out}"
        );
        assert!(!out.contains("gone") && !out.contains("session_start"), "{out}");
        #[derive(serde::Deserialize)]
        struct F {
            hooks: HookSpecs,
        }
        let back: F = toml::from_str(&out).unwrap();
        assert_eq!(back.hooks, specs);
    }
}
