//! `[mcp.servers.<name>]` of config.toml: what each MCP server is (a command over stdio or a URL over streamable HTTP), validated with errors that name the field, and written back keeping every comment and key outside `[mcp.servers]`.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most MCP servers one vak server keeps.
pub const MAX_SERVERS: usize = 32;
/// A call's timeout when `timeout_ms` is absent.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// The longest `timeout_ms` accepted (10 minutes, like bash's longest).
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// The longest server name: `mcp__<server>__<tool>` must leave room for
/// the tool within the providers' 64 characters.
pub const MAX_NAME: usize = 24;
/// Bounds on what one definition holds.
const MAX_ARGS: usize = 256;
const MAX_MAP: usize = 64;
const MAX_TEXT: usize = 4096;

/// One MCP server as config.toml and `PUT /config/mcp` give it: `command`
/// (with `args`, `env`, `cwd`) for stdio, or `url` (with `headers`) for
/// streamable HTTP. A header value may name an environment variable as
/// `${VAR}`: it is expanded when connecting and never stored expanded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerDef {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Each call's timeout (absent: `DEFAULT_TIMEOUT_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The server's working directory (absent: the vak server's workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

/// Every server by name, in name order.
pub type ServerDefs = BTreeMap<String, ServerDef>;

/// How vak reaches a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    Stdio,
    Http,
}

impl ServerDef {
    pub fn transport(&self) -> TransportKind {
        if self.url.is_some() {
            TransportKind::Http
        } else {
            TransportKind::Stdio
        }
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS))
    }
}

/// `[mcp]` of config.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMcp {
    #[serde(default)]
    pub servers: ServerDefs,
}

/// Checks every definition; an error names the field as `servers.<name>.<key>`.
pub fn validate(defs: &ServerDefs) -> Result<()> {
    if defs.len() > MAX_SERVERS {
        return Err(Error::invalid(format!(
            "servers: {} MCP servers given; at most {MAX_SERVERS} are kept",
            defs.len()
        )));
    }
    for (name, def) in defs {
        validate_one(name, def)?;
    }
    Ok(())
}

fn validate_one(name: &str, def: &ServerDef) -> Result<()> {
    let field = |k: &str| format!("servers.{name}.{k}");
    let bad = |k: &str, why: &str| Err(Error::invalid(format!("{}: {why}", field(k))));
    let name_ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.contains("__")
        && !name.starts_with('_')
        && !name.ends_with('_');
    if !name_ok {
        return Err(Error::invalid(format!(
            "servers.{}: a server name is 1 to {MAX_NAME} letters, digits, `-` or single `_` (not at either end): it becomes part of the tool names mcp__<server>__<tool>",
            name.chars().take(40).collect::<String>()
        )));
    }
    if let Some(t) = def.timeout_ms {
        if t == 0 || t > MAX_TIMEOUT_MS {
            return bad(
                "timeout_ms",
                &format!("expected 1 to {MAX_TIMEOUT_MS} milliseconds"),
            );
        }
    }
    let text_ok = |s: &str| !s.is_empty() && s.len() <= MAX_TEXT && !s.contains('\0');
    match (&def.command, &def.url) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(format!(
                "servers.{name}: give command (stdio) or url (streamable HTTP), not both"
            )))
        }
        (None, None) => {
            return Err(Error::invalid(format!(
            "servers.{name}: give command (a program to run over stdio) or url (a streamable HTTP endpoint)"
        )))
        }
        (Some(c), None) => {
            if !text_ok(c) || c.trim().is_empty() {
                return bad("command", "a program name or path, not empty, without NUL");
            }
            if !def.headers.is_empty() {
                return bad("headers", "headers go with url; a stdio server takes env");
            }
        }
        (None, Some(u)) => {
            let ok = (u.starts_with("http://") || u.starts_with("https://"))
                && u.len() > "https://".len()
                && u.len() <= MAX_TEXT
                && !u.chars().any(|c| c.is_control() || c.is_whitespace());
            if !ok {
                return bad(
                    "url",
                    "an http:// or https:// URL, e.g. http://127.0.0.1:8000/mcp",
                );
            }
            if def.command.is_none() && (!def.args.is_empty() || !def.env.is_empty() || def.cwd.is_some()) {
                let k = if !def.args.is_empty() {
                    "args"
                } else if !def.env.is_empty() {
                    "env"
                } else {
                    "cwd"
                };
                return bad(
                    k,
                    "args, env and cwd go with command; an HTTP server takes headers",
                );
            }
        }
    }
    if def.args.len() > MAX_ARGS || def.args.iter().any(|a| a.len() > MAX_TEXT || a.contains('\0')) {
        return bad("args", &format!("at most {MAX_ARGS} arguments, each without NUL"));
    }
    if def.env.len() > MAX_MAP {
        return bad("env", &format!("at most {MAX_MAP} variables"));
    }
    for (k, v) in &def.env {
        let key_ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !key_ok || v.len() > MAX_TEXT || v.contains('\0') {
            return bad(
                &format!("env.{k}"),
                "a variable name ([A-Za-z_][A-Za-z0-9_]*) and a value without NUL",
            );
        }
    }
    if let Some(cwd) = &def.cwd {
        if !text_ok(cwd) || !std::path::Path::new(cwd).is_absolute() {
            return bad("cwd", "an absolute folder");
        }
    }
    if def.headers.len() > MAX_MAP {
        return bad("headers", &format!("at most {MAX_MAP} headers"));
    }
    for (k, v) in &def.headers {
        if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            return bad(&format!("headers.{k}"), "not a valid HTTP header name");
        }
        if v.len() > MAX_TEXT || http::HeaderValue::from_str(v).is_err() {
            return bad(
                &format!("headers.{k}"),
                "not a valid header value (visible ASCII; ${VAR} names an environment variable)",
            );
        }
        if let Err(why) = super::env::references(v) {
            return bad(&format!("headers.{k}"), &why);
        }
    }
    Ok(())
}

/// Writes `defs` as config.toml's `[mcp.servers]`, keeping every other
/// section, key and comment (`[mcp]`'s other keys included).
pub(crate) fn write_servers(doc: &mut toml_edit::DocumentMut, defs: &ServerDefs) -> Result<()> {
    let mcp = doc.entry("mcp").or_insert_with(|| {
        let mut t = toml_edit::Table::new();
        t.set_implicit(true);
        toml_edit::Item::Table(t)
    });
    let Some(mcp) = mcp.as_table_mut() else {
        return Err(Error::conflict(
            "config.toml's mcp is not a table; fix it, then try again",
        ));
    };
    let mut servers = toml_edit::Table::new();
    servers.set_implicit(true);
    for (name, def) in defs {
        let mut t = toml_edit::Table::new();
        if !def.enabled {
            t.insert("enabled", toml_edit::value(false));
        }
        if let Some(ms) = def.timeout_ms {
            t.insert("timeout_ms", toml_edit::value(ms as i64));
        }
        if let Some(c) = &def.command {
            t.insert("command", toml_edit::value(c.as_str()));
        }
        if !def.args.is_empty() {
            let a: toml_edit::Array = def.args.iter().map(String::as_str).collect();
            t.insert("args", toml_edit::value(a));
        }
        if let Some(c) = &def.cwd {
            t.insert("cwd", toml_edit::value(c.as_str()));
        }
        if let Some(u) = &def.url {
            t.insert("url", toml_edit::value(u.as_str()));
        }
        for (key, map) in [("env", &def.env), ("headers", &def.headers)] {
            if !map.is_empty() {
                let mut inline = toml_edit::InlineTable::new();
                for (k, v) in map {
                    inline.insert(k, v.as_str().into());
                }
                t.insert(key, toml_edit::value(inline));
            }
        }
        servers.insert(name, toml_edit::Item::Table(t));
    }
    mcp.insert("servers", toml_edit::Item::Table(servers));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(cmd: &str) -> ServerDef {
        ServerDef {
            enabled: true,
            command: Some(cmd.into()),
            ..ServerDef::default()
        }
    }

    fn one(name: &str, def: ServerDef) -> ServerDefs {
        [(name.to_string(), def)].into_iter().collect()
    }

    #[test]
    fn errors_name_the_field() {
        let msg = |defs: ServerDefs| validate(&defs).unwrap_err().message;
        assert!(msg(one("a__b", stdio("x"))).starts_with("servers.a__b:"));
        assert!(msg(one("", stdio("x"))).starts_with("servers.:"));
        let both = ServerDef {
            url: Some("http://127.0.0.1:1/mcp".into()),
            ..stdio("x")
        };
        assert!(msg(one("s", both)).contains("not both"));
        assert!(msg(one("s", ServerDef::default())).contains("give command"));
        let slow = ServerDef {
            timeout_ms: Some(0),
            ..stdio("x")
        };
        assert!(msg(one("s", slow)).starts_with("servers.s.timeout_ms:"));
        let rel = ServerDef {
            cwd: Some("rel".into()),
            ..stdio("x")
        };
        assert!(msg(one("s", rel)).starts_with("servers.s.cwd:"));
        let http = |h: &str, v: &str| ServerDef {
            url: Some("http://127.0.0.1:1/mcp".into()),
            headers: [(h.to_string(), v.to_string())].into_iter().collect(),
            ..ServerDef::default()
        };
        assert!(msg(one("s", http("bad name", "v"))).starts_with("servers.s.headers.bad name:"));
        assert!(msg(one("s", http("x-a", "${1X}"))).starts_with("servers.s.headers.x-a:"));
        assert!(validate(&one("s", http("authorization", "Bearer ${TOKEN}"))).is_ok());
        let url = ServerDef {
            url: Some("ftp://x".into()),
            ..ServerDef::default()
        };
        assert!(msg(one("s", url)).starts_with("servers.s.url:"));
        assert!(validate(&one("my-server_1", stdio("python3"))).is_ok());
    }

    #[test]
    fn writing_the_servers_keeps_everything_outside_them() {
        let text = "# top comment\n[server]\n# kept\ntrusted_hosts = [\"a\"] # trailing\n\n[mcp.servers.old]\ncommand = \"gone\"\n\n[model]\nprovider = \"offline\"\n";
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        let defs = one(
            "new",
            ServerDef {
                args: vec!["-m".into(), "srv".into()],
                env: [("A".to_string(), "1".to_string())].into_iter().collect(),
                ..stdio("python3")
            },
        );
        write_servers(&mut doc, &defs).unwrap();
        let out = doc.to_string();
        // In place, byte for byte around it.
        assert_eq!(
            out,
            "# top comment\n[server]\n# kept\ntrusted_hosts = [\"a\"] # trailing\n\n[mcp.servers.new]\ncommand = \"python3\"\nargs = [\"-m\", \"srv\"]\nenv = { A = \"1\" }\n\n[model]\nprovider = \"offline\"\n"
        );
        assert!(
            out.starts_with("# top comment\n[server]\n# kept\ntrusted_hosts = [\"a\"] # trailing\n"),
            "{out}"
        );
        assert!(out.contains("[model]\nprovider = \"offline\"\n"), "{out}");
        assert!(!out.contains("gone"), "{out}");
        let back: toml::Table = toml::from_str(&out).unwrap();
        let parsed: FileMcp = back["mcp"].clone().try_into().unwrap();
        assert_eq!(parsed.servers, defs);
    }
}
