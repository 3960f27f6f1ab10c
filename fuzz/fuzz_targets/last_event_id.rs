//! `sse::parse_cursor`, the `Last-Event-ID` header and `?after=` of
//! `GET /sessions/:id/events`. It must never panic; an accepted value is
//! exactly the trimmed decimal text, and errors never echo more than a
//! clipped prefix of the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vak::edge::http::sse::parse_cursor;

fuzz_target!(|raw: &str| {
    match parse_cursor(raw) {
        Ok(n) => {
            let t = raw.trim();
            assert!(!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()), "{raw:?} accepted");
            assert_eq!(t.parse::<u64>().ok(), Some(n));
            assert_eq!(parse_cursor(&n.to_string()), Ok(n));
        }
        Err(m) => {
            // 40 characters at most, each escaped to at most 10 bytes by {:?}.
            assert!(m.len() <= 512, "error echoes {} bytes", m.len());
        }
    }
});
