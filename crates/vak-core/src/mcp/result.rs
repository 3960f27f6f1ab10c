//! An MCP `tools/call` result as the tool_result the model sees: text blocks as they are, other blocks described in a line, `isError` as a failed call, the whole bounded like every tool's output.

use serde_json::Value;

/// The most an MCP result hands the model; the rest is cut with a note.
pub(crate) const MAX_RESULT: usize = 1 << 20;

/// The text of a `CallToolResult` (taken as its JSON, the wire format, so
/// this does not depend on the SDK's types) and whether it is an error.
pub(crate) fn render(result: &Value) -> (bool, String) {
    let is_error = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let mut parts: Vec<String> = Vec::new();
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or_default();
        let size = |k: &str| crate::text::count(s(k).len() * 3 / 4, "byte");
        parts.push(match s("type") {
            "text" => s("text").to_string(),
            "image" => format!("[image {} ({}), not shown]", s("mimeType"), size("data")),
            "audio" => format!("[audio {} ({}), not shown]", s("mimeType"), size("data")),
            "resource" => {
                let r = block.get("resource").cloned().unwrap_or_default();
                let rs = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                match r.get("text").and_then(Value::as_str) {
                    Some(t) => format!("[resource {}]\n{t}", rs("uri")),
                    None => format!(
                        "[resource {} ({}, {}), not shown]",
                        rs("uri"),
                        rs("mimeType"),
                        crate::text::count(rs("blob").len() * 3 / 4, "byte")
                    ),
                }
            }
            "resource_link" => format!("[resource link {} {}]", s("uri"), s("name")),
            other => format!("[a {other:?} block, not shown]"),
        });
    }
    if parts.is_empty() {
        if let Some(structured) = result.get("structuredContent") {
            parts.push(structured.to_string());
        }
    }
    let mut text = parts.join("\n");
    if text.len() > MAX_RESULT {
        let total = text.len();
        let mut cut = MAX_RESULT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(&format!(
            "\n[output truncated: the MCP result is {}; this is the first {}]",
            crate::text::count(total, "byte"),
            crate::text::count(cut, "byte")
        ));
    }
    (!is_error, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_become_text_errors_fail_and_long_results_are_cut_with_a_note() {
        let r = json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "mimeType": "image/png", "data": "AAAA"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "body"}},
            {"type": "resource_link", "uri": "file:///b", "name": "b"}
        ]});
        assert_eq!(
            render(&r),
            (
                true,
                "hello\n[image image/png (3 bytes), not shown]\n[resource file:///a]\nbody\n[resource link file:///b b]".into()
            )
        );
        let (ok, text) = render(&json!({"isError": true, "content": [{"type": "text", "text": "boom"}]}));
        assert_eq!((ok, text.as_str()), (false, "boom"));
        assert_eq!(render(&json!({"structuredContent": {"n": 1}})).1, r#"{"n":1}"#);
        let big = "é".repeat(MAX_RESULT);
        let (_, text) = render(&json!({"content": [{"type": "text", "text": big}]}));
        assert!(text.len() < MAX_RESULT + 200);
        assert!(
            text.ends_with(
                "[output truncated: the MCP result is 2097152 bytes; this is the first 1048576 bytes]"
            ),
            "{}",
            &text[text.len() - 120..]
        );
    }
}
