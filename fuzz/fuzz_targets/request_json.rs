//! `json::from_json`, the proto3 JSON mapping of REST request bodies, on
//! arbitrary bytes for the bodies of `/run`, `/approvals/:rid` and the
//! stream request. It must never panic; whatever it accepts serializes with
//! `to_json` and parses back to the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vak::edge::http::json::{from_json, to_json};
use vak::proto::v1::{ApproveRequest, RunRequest, StreamRequest};

fn round_trip<M>(data: &[u8])
where
    M: prost::Message + prost::Name + Default + PartialEq + std::fmt::Debug,
{
    if let Ok(m) = from_json::<M>(data) {
        let json = to_json(&m);
        let again = from_json::<M>(&json).unwrap_or_else(|e| {
            panic!("{} does not parse its own JSON {:?}: {e}", M::NAME, String::from_utf8_lossy(&json))
        });
        assert_eq!(again, m);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<RunRequest>(data);
    round_trip::<ApproveRequest>(data);
    round_trip::<StreamRequest>(data);
});
