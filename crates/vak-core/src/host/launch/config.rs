//! A workspace's dev-server configs: `.vak/launch.toml`'s `[[launch]]` entries and package.json's dev/start/serve scripts, bounded and checked.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the launch file is, relative to the workspace.
pub const LAUNCH_FILE: &str = ".vak/launch.toml";
/// The largest launch file read (a bigger one is refused).
pub const MAX_LAUNCH_FILE: usize = 64 << 10;
/// The largest package.json read (a bigger one is ignored).
pub const MAX_PACKAGE_JSON: usize = 1 << 20;
/// The most configs one workspace declares.
pub const MAX_CONFIGS: usize = 32;
/// The longest config name.
pub const MAX_NAME: usize = 64;
/// The longest command.
pub const MAX_COMMAND: usize = 4096;
/// The most environment variables one config sets.
pub const MAX_ENV: usize = 64;
/// package.json scripts offered as dev servers, in this order.
pub const NPM_SCRIPTS: [&str; 3] = ["dev", "start", "serve"];

/// Where a config came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    LaunchToml,
    Npm,
}

/// One dev server a workspace declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub name: String,
    pub command: String,
    /// Relative to the workspace; empty: its root.
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub source: Source,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    launch: Vec<Entry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    command: String,
    #[serde(default)]
    cwd: String,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

/// The configs of `ws`: launch.toml's first, then package.json's scripts
/// whose names launch.toml does not use. Blocking: reads files.
pub fn load(ws: &Path) -> Result<Vec<Config>> {
    let mut out = match read_capped(ws, LAUNCH_FILE, MAX_LAUNCH_FILE)? {
        Some(text) => parse_launch_toml(&text)?,
        None => Vec::new(),
    };
    if let Ok(Some(text)) = read_capped(ws, "package.json", MAX_PACKAGE_JSON) {
        for c in parse_package_json(&text) {
            if !out.iter().any(|o| o.name == c.name) && out.len() < MAX_CONFIGS {
                out.push(c);
            }
        }
    }
    Ok(out)
}

/// The file `rel` inside `ws` (confined: no symlink out), None when there
/// is none; one over `cap` bytes is refused.
fn read_capped(ws: &Path, rel: &str, cap: usize) -> Result<Option<String>> {
    match std::fs::symlink_metadata(ws.join(rel)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        _ => {}
    }
    let read = crate::workspace::read(ws, rel, cap).map_err(|e| Error::invalid(format!("{rel}: {e}")))?;
    if read.truncated {
        return Err(
            Error::invalid(format!("{rel} is {} bytes; the most read is {cap}", read.size))
                .with_reason("launch_config_invalid"),
        );
    }
    String::from_utf8(read.bytes)
        .map(Some)
        .map_err(|_| Error::invalid(format!("{rel} is not UTF-8")).with_reason("launch_config_invalid"))
}

fn bad(msg: String) -> Error {
    Error::invalid(msg).with_reason("launch_config_invalid")
}

/// `[[launch]]` entries, checked: unique names of letters, digits, `.`,
/// `_` and `-`, a command, a relative cwd without `..`, bounded env.
pub fn parse_launch_toml(text: &str) -> Result<Vec<Config>> {
    // toml's message names the line, the column and the field.
    let file: File = toml::from_str(text).map_err(|e| bad(format!("{LAUNCH_FILE}: {e}")))?;
    if file.launch.len() > MAX_CONFIGS {
        return Err(bad(format!(
            "{LAUNCH_FILE}: {} [[launch]] entries; the most is {MAX_CONFIGS}",
            file.launch.len()
        )));
    }
    let mut out: Vec<Config> = Vec::new();
    for (i, e) in file.launch.into_iter().enumerate() {
        let at = format!("{LAUNCH_FILE}: [[launch]] entry {}", i + 1);
        check_name(&e.name).map_err(|m| bad(format!("{at}: name: {m}")))?;
        if out.iter().any(|o| o.name == e.name) {
            return Err(bad(format!("{at}: name: {:?} is used twice", e.name)));
        }
        if e.command.trim().is_empty() || e.command.len() > MAX_COMMAND || e.command.contains('\0') {
            return Err(bad(format!(
                "{at} ({}): command: 1 to {MAX_COMMAND} bytes, no NUL",
                e.name
            )));
        }
        if !e.cwd.is_empty() {
            crate::workspace::components(&e.cwd).map_err(|m| bad(format!("{at} ({}): cwd: {m}", e.name)))?;
        }
        if e.env.len() > MAX_ENV {
            return Err(bad(format!(
                "{at} ({}): env: the most is {MAX_ENV} variables",
                e.name
            )));
        }
        for (k, v) in &e.env {
            let ok_key = !k.is_empty()
                && k.len() <= 256
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok_key || v.contains('\0') || v.len() > MAX_COMMAND {
                return Err(bad(format!(
                    "{at} ({}): env: {k:?} is not a variable name and value",
                    e.name
                )));
            }
        }
        out.push(Config {
            name: e.name,
            command: e.command,
            cwd: e.cwd,
            env: e.env,
            source: Source::LaunchToml,
        });
    }
    Ok(out)
}

fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("1 to {MAX_NAME} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!("{name:?}: letters, digits, `.`, `_` and `-` only"));
    }
    Ok(())
}

/// package.json's dev, start and serve scripts as `npm run <script>`; a
/// file that is not JSON offers none.
pub fn parse_package_json(text: &str) -> Vec<Config> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let Some(scripts) = v.get("scripts").and_then(|s| s.as_object()) else {
        return Vec::new();
    };
    NPM_SCRIPTS
        .iter()
        .filter(|s| scripts.get(**s).is_some_and(|c| c.is_string()))
        .map(|s| Config {
            name: s.to_string(),
            command: format!("npm run {s}"),
            cwd: String::new(),
            env: BTreeMap::new(),
            source: Source::Npm,
        })
        .collect()
}

/// The directory `cwd` names inside `ws`, which must exist and stay inside
/// it once symlinks are resolved. Blocking.
pub fn resolve_cwd(ws: &Path, cwd: &str) -> Result<PathBuf> {
    let root = ws
        .canonicalize()
        .map_err(|e| Error::invalid(format!("the workspace {}: {e}", ws.display())))?;
    if cwd.is_empty() {
        return Ok(root);
    }
    let parts = crate::workspace::components(cwd).map_err(Error::invalid)?;
    let dir = parts.iter().fold(root.clone(), |p, c| p.join(c));
    let real = dir
        .canonicalize()
        .map_err(|e| Error::invalid(format!("cwd {cwd}: {e}")).with_reason("launch_config_invalid"))?;
    if !real.starts_with(&root) || !real.is_dir() {
        return Err(bad(format!("cwd {cwd}: not a folder inside the workspace")));
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_entries_are_checked_and_errors_name_the_field() {
        let ok = parse_launch_toml(
            "[[launch]]\nname = \"web\"\ncommand = \"echo hi\"\ncwd = \"app\"\nenv = { PORT = \"3000\" }\n",
        )
        .unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].env.get("PORT").map(String::as_str), Some("3000"));
        assert_eq!(ok[0].source, Source::LaunchToml);

        let e = parse_launch_toml("[[launch]]\nname = \"web\"\n").unwrap_err();
        assert!(e.message.contains("command"), "{}", e.message);
        let e = parse_launch_toml("[[launch]]\nname = \"w b\"\ncommand = \"x\"\n").unwrap_err();
        assert!(e.message.contains("name"), "{}", e.message);
        let e =
            parse_launch_toml("[[launch]]\nname = \"w\"\ncommand = \"x\"\ncwd = \"../up\"\n").unwrap_err();
        assert!(e.message.contains("cwd"), "{}", e.message);
        let twice = "[[launch]]\nname = \"w\"\ncommand = \"x\"\n[[launch]]\nname = \"w\"\ncommand = \"y\"\n";
        assert!(parse_launch_toml(twice).unwrap_err().message.contains("twice"));
        let e = parse_launch_toml("[[launch]]\nname = 3\n").unwrap_err();
        assert!(e.message.contains("line 2"), "{}", e.message);
    }

    #[test]
    fn a_cwd_stays_inside_the_workspace_also_through_a_symlink() {
        let outside = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("app")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
        let root = ws.path().canonicalize().unwrap();
        assert_eq!(resolve_cwd(ws.path(), "").unwrap(), root);
        assert_eq!(resolve_cwd(ws.path(), "app").unwrap(), root.join("app"));
        assert!(resolve_cwd(ws.path(), "out").is_err(), "a symlink out is refused");
        assert!(resolve_cwd(ws.path(), "../x").is_err());
        assert!(resolve_cwd(ws.path(), "missing").is_err());
    }

    #[test]
    fn a_launch_file_symlinked_out_of_the_workspace_is_not_read() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("launch.toml"),
            "[[launch]]\nname = \"x\"\ncommand = \"true\"\n",
        )
        .unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join(".vak")).unwrap();
        assert!(load(ws.path()).is_err());
        std::fs::remove_file(ws.path().join(".vak")).unwrap();
        std::fs::write(
            ws.path().join("package.json"),
            r#"{"scripts":{"start":"node ."}}"#,
        )
        .unwrap();
        let c = load(ws.path()).unwrap();
        assert_eq!((c.len(), c[0].source), (1, Source::Npm));
    }

    #[test]
    fn package_json_offers_dev_start_and_serve_only() {
        let c = parse_package_json(r#"{"scripts":{"build":"x","serve":"y","dev":"z"}}"#);
        let names: Vec<_> = c.iter().map(|c| (c.name.as_str(), c.command.as_str())).collect();
        assert_eq!(names, [("dev", "npm run dev"), ("serve", "npm run serve")]);
        assert!(parse_package_json("not json").is_empty());
    }
}
