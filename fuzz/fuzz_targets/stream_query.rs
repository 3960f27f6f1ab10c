//! `stream::parse_query`, the query string of `GET /stream`
//! (`session=A&session=B&host=1&config=1&cursor=V`). It must never panic,
//! never accept more than 64 distinct sessions, and never keep duplicates.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vak::core::stream::cursor::{CursorVector, MAX_SESSIONS};
use vak::edge::http::stream::parse_query;

fuzz_target!(|raw: &str| {
    if let Ok(req) = parse_query(raw) {
        assert!(req.sessions.len() <= MAX_SESSIONS, "{} sessions", req.sessions.len());
        for (i, s) in req.sessions.iter().enumerate() {
            assert!(!req.sessions[..i].contains(s), "session {s:?} twice");
        }
        // The cursor goes on to the vector parser; that must not panic either.
        let _ = CursorVector::parse(&req.cursor);
    }
});
