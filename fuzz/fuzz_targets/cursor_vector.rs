//! `CursorVector::parse` on arbitrary UTF-8 (the `cursor` of `GET /stream`,
//! its Last-Event-ID, and `StreamRequest.cursor` over gRPC). It must never
//! panic; whatever it accepts is within the bounds and survives Display and a
//! second parse unchanged; its errors never echo more than a clipped prefix.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vak::core::stream::cursor::{CursorVector, MAX_LEN, MAX_SESSIONS};

fuzz_target!(|raw: &str| {
    match CursorVector::parse(raw) {
        Ok(v) => {
            assert!(v.len() <= MAX_SESSIONS, "{} sessions accepted", v.len());
            let text = v.to_string();
            assert!(text.len() <= MAX_LEN, "formatted vector is {} bytes", text.len());
            let again = CursorVector::parse(&text)
                .unwrap_or_else(|e| panic!("{text:?} was formatted but does not parse: {}", e.message));
            assert_eq!(again, v, "{text:?} did not round-trip");
            assert_eq!(again.to_string(), text);
            let sessions: Vec<&str> = v.sessions().collect();
            for (i, s) in sessions.iter().enumerate() {
                assert!(!sessions[..i].contains(s), "session {s:?} twice");
            }
        }
        Err(e) => {
            // Clipped to 80 characters, each escaped to at most 10 bytes by {:?}.
            assert!(e.message.len() <= 1024, "error echoes {} bytes", e.message.len());
        }
    }
});
