//! `${VAR}` in an MCP server's header values: checked when the definition is given, expanded from vak's environment only when connecting, so a secret never lands in config.toml or an answer.

/// Checks that every `${` opens a well-formed reference to a variable name.
pub(crate) fn references(value: &str) -> Result<(), String> {
    expand_with(value, |_| Some(String::new())).map(drop)
}

/// `value` with each `${VAR}` replaced by the variable's value; an unset
/// variable is an error naming it.
pub(crate) fn expand(value: &str) -> Result<String, String> {
    expand_with(value, |name| std::env::var(name).ok())
}

fn expand_with(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err("an unclosed ${ (write ${VAR})".into());
        };
        let name = &after[..end];
        let ok = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(format!(
                "${{{name}}} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
            ));
        }
        match lookup(name) {
            Some(v) => out.push_str(&v),
            None => return Err(format!("the environment variable {name} is not set")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_from_the_lookup_and_bad_ones_are_named() {
        let env = |n: &str| (n == "TOKEN").then(|| "s3cret".to_string());
        assert_eq!(expand_with("Bearer ${TOKEN}", env).unwrap(), "Bearer s3cret");
        assert_eq!(expand_with("plain $TOKEN", env).unwrap(), "plain $TOKEN");
        assert!(expand_with("${MISSING}", env)
            .unwrap_err()
            .contains("MISSING is not set"));
        assert!(expand_with("${a-b}", env)
            .unwrap_err()
            .contains("not a variable name"));
        assert!(expand_with("x ${TOKEN", env).unwrap_err().contains("unclosed"));
        assert!(references("${ANY_NAME} and ${OTHER}").is_ok());
    }
}
