//! The cursor vector of a multiplexed stream: `<session>:<seq>,<session>:<seq>,...`, one entry per followed session, parsed strictly and bounded.

use crate::error::{Error, Result};
use crate::ids::validate_session_id;
use std::fmt;

/// The most sessions one multiplexed stream may follow.
pub const MAX_SESSIONS: usize = 64;
/// The longest cursor vector accepted (64 entries of a 64-byte id and a 20-digit seq fit).
pub const MAX_LEN: usize = 8192;

/// Where a multiplexed stream is in each session it follows, in a stable order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CursorVector {
    entries: Vec<(String, u64)>,
}

impl CursorVector {
    /// Parses a vector; the empty string is the empty vector. Malformed
    /// entries, duplicate sessions, and vectors over the bounds are refused.
    pub fn parse(raw: &str) -> Result<CursorVector> {
        if raw.len() > MAX_LEN {
            return Err(Error::invalid(format!(
                "the cursor vector is {} bytes; the limit is {MAX_LEN}",
                raw.len()
            )));
        }
        let raw = raw.trim();
        let mut v = CursorVector::default();
        if raw.is_empty() {
            return Ok(v);
        }
        for entry in raw.split(',') {
            let (sid, seq) = entry.trim().rsplit_once(':').ok_or_else(|| {
                Error::invalid(format!(
                    "malformed cursor entry {:?}: expected <session>:<seq>",
                    clip(entry)
                ))
            })?;
            validate_session_id(sid)?;
            if seq.is_empty() || seq.len() > 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
                return Err(Error::invalid(format!(
                    "malformed seq in cursor entry {:?}",
                    clip(entry)
                )));
            }
            let seq: u64 = seq
                .parse()
                .map_err(|_| Error::invalid(format!("seq out of range in cursor entry {:?}", clip(entry))))?;
            if v.get(sid).is_some() {
                return Err(Error::invalid(format!(
                    "session {sid} appears twice in the cursor vector"
                )));
            }
            if v.entries.len() == MAX_SESSIONS {
                return Err(Error::invalid(format!(
                    "a cursor vector names at most {MAX_SESSIONS} sessions"
                )));
            }
            v.entries.push((sid.to_string(), seq));
        }
        Ok(v)
    }

    pub fn get(&self, session_id: &str) -> Option<u64> {
        self.entries
            .iter()
            .find(|(s, _)| s == session_id)
            .map(|(_, q)| *q)
    }

    /// Sets a session's seq, appending it (at the end of the order) if new.
    pub fn set(&mut self, session_id: &str, seq: u64) {
        match self.entries.iter_mut().find(|(s, _)| s == session_id) {
            Some(e) => e.1 = seq,
            None => self.entries.push((session_id.to_string(), seq)),
        }
    }

    pub fn remove(&mut self, session_id: &str) {
        self.entries.retain(|(s, _)| s != session_id);
    }

    pub fn sessions(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(s, _)| s.as_str())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

impl fmt::Display for CursorVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (s, q)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{s}:{q}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_formats() {
        let v = CursorVector::parse("a:1,b-2:0,c_3:18446744073709551615").unwrap();
        assert_eq!(v.get("b-2"), Some(0));
        assert_eq!(v.to_string(), "a:1,b-2:0,c_3:18446744073709551615");
        assert_eq!(CursorVector::parse("").unwrap(), CursorVector::default());
        assert_eq!(CursorVector::parse(" a:1 , b:2 ").unwrap().to_string(), "a:1,b:2");
        for bad in [
            "a",
            "a:",
            ":1",
            "a:1,",
            "a:-1",
            "a:1x",
            "a:1,a:2",
            "a b:1",
            "a:18446744073709551616",
            "../x:1",
            "a:1:2",
        ] {
            assert!(CursorVector::parse(bad).is_err(), "{bad}");
        }
        let many: Vec<String> = (0..=MAX_SESSIONS).map(|i| format!("s{i}:1")).collect();
        assert!(CursorVector::parse(&many.join(",")).is_err());
        assert!(CursorVector::parse(&many[..MAX_SESSIONS].join(",")).is_ok());
        assert!(CursorVector::parse(&"a".repeat(MAX_LEN + 1)).is_err());
    }

    proptest! {
        #[test]
        fn any_input_parses_or_errs_without_panicking(s in ".{0,300}") {
            let _ = CursorVector::parse(&s);
        }

        #[test]
        fn formatting_round_trips(entries in prop::collection::btree_map("[A-Za-z0-9_-]{1,64}", any::<u64>(), 0..MAX_SESSIONS)) {
            let mut v = CursorVector::default();
            for (s, q) in &entries {
                v.set(s, *q);
            }
            let text = v.to_string();
            prop_assert!(text.len() <= MAX_LEN);
            prop_assert_eq!(CursorVector::parse(&text).unwrap(), v);
        }
    }
}
