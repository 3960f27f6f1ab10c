//! The names MCP tools go by with the model: `mcp__<server>__<tool>`, cut to the characters and length every provider accepts.

/// What every MCP tool's name starts with.
pub(crate) const PREFIX: &str = "mcp__";
/// The longest tool name OpenAI and Anthropic both accept.
pub(crate) const MAX_TOOL_NAME: usize = 64;

/// The model-facing name of `server`'s tool `tool`: characters other than
/// letters, digits, `_` and `-` become `_`, and the whole is cut to
/// `MAX_TOOL_NAME` (server names are validated, so the prefix fits).
pub(crate) fn tool_name(server: &str, tool: &str) -> String {
    let mut name = format!("{PREFIX}{server}__");
    for c in tool.chars() {
        if name.len() >= MAX_TOOL_NAME {
            break;
        }
        name.push(if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            c
        } else {
            '_'
        });
    }
    name
}

/// The server a model-facing name belongs to (server names hold no `__`).
pub(crate) fn server_of(name: &str) -> Option<&str> {
    name.strip_prefix(PREFIX)?.split_once("__").map(|(s, _)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitised_cut_and_lead_back_to_their_server() {
        assert_eq!(tool_name("git", "log"), "mcp__git__log");
        assert_eq!(tool_name("fs", "read.file/v2 é"), "mcp__fs__read_file_v2__");
        let long = tool_name("s", &"x".repeat(200));
        assert_eq!(long.len(), MAX_TOOL_NAME);
        assert_eq!(server_of(&long), Some("s"));
        assert_eq!(server_of("mcp__a-b__c__d"), Some("a-b"));
        assert_eq!(server_of("bash"), None);
    }
}
