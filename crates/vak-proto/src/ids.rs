//! Ids a client sends and the server echoes (sessions, approvals): one rule, shared by the
//! server and by vak term, which checks an id before it puts it in a URL.

use crate::error::{Error, Result};

/// Session ids are path components and cursor-vector keys: keep them plain.
pub fn validate_session_id(id: &str) -> Result<()> {
    validate_plain_id("session id", id)
}

/// An id a client sends and the server echoes (session, approval): 1 to 64
/// of A-Z a-z 0-9 - _; a refusal echoes at most 80 characters of it.
pub fn validate_plain_id(what: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {what} {:?}: 1 to 64 of A-Z a-z 0-9 - _",
            id.chars().take(80).collect::<String>()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_are_1_to_64_of_the_safe_characters_and_a_refusal_is_bounded() {
        assert!(validate_session_id("a").is_ok());
        assert!(validate_session_id(&"x".repeat(64)).is_ok());
        assert!(validate_session_id("A-z_09").is_ok());
        for bad in ["", "a/b", "a b", "../x", "é", "a\n"] {
            assert!(validate_session_id(bad).is_err(), "{bad:?}");
        }
        let long = "y".repeat(500);
        let e = validate_session_id(&long).unwrap_err();
        assert!(e.message.len() < 200, "{}", e.message);
    }
}
