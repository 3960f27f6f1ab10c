//! The proto3 JSON mapping (proto field names as keys) for REST bodies and SSE data, driven by the descriptor set of proto/.
//!
//! Enums travel by their JSON names (`"completed"`, `"accept-edits"`): the
//! pool this module reads is proto/'s with every vak enum value renamed to its
//! JSON name (crates/vak-proto/build/enum_json.rs), so the mapping writes and
//! reads those names with no work of its own; gRPC carries the numbers.
//!
//! One deliberate choice: 64-bit integers (seq, latest_seq, token counts) are
//! written as JSON numbers, not strings, since they stay far below 2^53 and
//! every client wants to compare them as numbers; strings are still accepted
//! on input, as the mapping requires.

use crate::JSON_DESCRIPTOR_SET;
use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, Kind, MessageDescriptor, SerializeOptions,
};
use std::sync::LazyLock;

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(JSON_DESCRIPTOR_SET).expect("build.rs wrote a valid descriptor set")
});

const OUT: SerializeOptions = SerializeOptions::new()
    .use_proto_field_name(true)
    .stringify_64_bit_integers(false)
    .skip_default_fields(false);

fn descriptor<M: Name>() -> MessageDescriptor {
    POOL.get_message_by_name(&M::full_name())
        .expect("every generated message is in the descriptor set")
}

/// Serializes a generated message as proto3 JSON.
pub fn to_json<M: Message + Name>(msg: &M) -> Vec<u8> {
    let dynamic = DynamicMessage::decode(descriptor::<M>(), msg.encode_to_vec().as_slice())
        .expect("a message re-decodes under its own descriptor");
    let mut ser = serde_json::Serializer::new(Vec::new());
    dynamic
        .serialize_with_options(&mut ser, &OUT)
        .expect("serializing to a Vec cannot fail");
    ser.into_inner()
}

/// Parses proto3 JSON into a generated message; unknown fields are refused.
/// An empty body is the empty message.
pub fn from_json<M: Message + Name + Default>(body: &[u8]) -> Result<M, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(M::default());
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let dynamic =
        DynamicMessage::deserialize_with_options(descriptor::<M>(), &mut de, &DeserializeOptions::new())
            .map_err(|e| {
                unknown_enum_name(descriptor::<M>(), body).unwrap_or(format!("malformed JSON body: {e}"))
            })?;
    de.end().map_err(|e| format!("malformed JSON body: {e}"))?;
    dynamic
        .transcode_to::<M>()
        .map_err(|e| format!("malformed JSON body: {e}"))
}

/// After a body failed to parse: the first string that names no value of its
/// field's enum, with the names the field takes (the mapping's own error
/// names neither), still a "malformed JSON body" as every parse error is.
fn unknown_enum_name(desc: MessageDescriptor, body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    find_unknown(&desc, &value)
}

fn find_unknown(desc: &MessageDescriptor, value: &serde_json::Value) -> Option<String> {
    for (key, v) in value.as_object()? {
        let Some(field) = desc
            .get_field_by_name(key)
            .or_else(|| desc.get_field_by_json_name(key))
        else {
            continue;
        };
        let items = match v {
            serde_json::Value::Array(items) => items.iter().collect(),
            v => vec![v],
        };
        for item in items {
            let found = match (field.kind(), item) {
                (Kind::Enum(e), serde_json::Value::String(name)) if e.get_value_by_name(name).is_none() => {
                    let names: Vec<String> = e
                        .values()
                        .map(|v| v.name().to_string())
                        .filter(|n| !n.is_empty())
                        .collect();
                    let expected = match names.as_slice() {
                        [a, b] => format!("{a} or {b}"),
                        names => format!("one of {}", names.join(", ")),
                    };
                    let shown: String = name.chars().take(64).collect();
                    Some(format!(
                        "malformed JSON body: unknown {} {shown:?}: expected {expected}",
                        field.name()
                    ))
                }
                (Kind::Message(m), item) => find_unknown(&m, item),
                _ => None,
            };
            if found.is_some() {
                return found;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1 as pb;

    #[test]
    fn events_use_proto_names_numbers_and_keep_false_fields() {
        let e = pb::Event {
            seq: 7,
            session_id: "s".into(),
            kind: Some(pb::event::Kind::ToolResult(pb::ToolResult {
                call_id: "c".into(),
                ok: false,
                output: String::new(),
            })),
        };
        let v: serde_json::Value = serde_json::from_slice(&to_json(&e)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"seq": 7, "session_id": "s", "tool_result": {"call_id": "c", "ok": false, "output": ""}})
        );
    }

    #[test]
    fn an_answer_without_a_rule_leaves_it_out() {
        let a = pb::ApproveResponse {
            request_id: "ap_1".into(),
            outcome: pb::ApprovalOutcome::Approved as i32,
            persisted: false,
            rule: None,
        };
        assert_eq!(
            String::from_utf8(to_json(&a)).unwrap(),
            r#"{"request_id":"ap_1","outcome":"approved","persisted":false}"#
        );
        let n: pb::ApproveRequest = from_json(br#"{"approve": true, "always": true}"#).unwrap();
        assert_eq!(n.always, Some(true));
    }

    #[test]
    fn request_bodies_parse_strictly() {
        let r: pb::RunRequest = from_json(br#"{"prompt": "hi", "request_id": "r1"}"#).unwrap();
        assert_eq!((r.prompt.as_str(), r.request_id.as_str()), ("hi", "r1"));
        let a: pb::ApproveRequest = from_json(br#"{"approve": false}"#).unwrap();
        assert_eq!(a.approve, Some(false));
        let s: pb::SubscribeRequest = from_json(br#"{"after": "12"}"#).unwrap();
        assert_eq!(s.after, Some(12));
        assert!(from_json::<pb::RunRequest>(b"{").is_err());
        assert!(from_json::<pb::RunRequest>(br#"{"prompt": 3}"#).is_err());
        assert!(from_json::<pb::RunRequest>(br#"{"promt": "x"}"#).is_err());
        assert!(from_json::<pb::RunRequest>(br#"{"prompt": "x"} trailing"#).is_err());
        assert_eq!(
            from_json::<pb::CancelRequest>(b"  ").unwrap(),
            pb::CancelRequest::default()
        );
    }

    #[test]
    fn every_enum_value_travels_by_its_json_name_both_ways() {
        for (full_name, values) in pb::JSON_NAMES {
            // Nested in a message of its own there (build/enum_json.rs).
            let (package, name) = full_name.rsplit_once('.').unwrap();
            let e = POOL
                .get_enum_by_name(&format!("{package}.{name}Json.{name}"))
                .expect("the JSON pool has every enum");
            let pool_names: Vec<(i32, String)> =
                e.values().map(|v| (v.number(), v.name().to_string())).collect();
            let table: Vec<(i32, String)> = values.iter().map(|(n, j)| (*n, j.to_string())).collect();
            assert_eq!(pool_names, table, "{full_name}");
        }
        // Through messages, one field of each kind of enum use.
        let r = pb::RunResult {
            outcome: pb::RunOutcome::MaxTurns as i32,
            ..Default::default()
        };
        let json = String::from_utf8(to_json(&r)).unwrap();
        assert!(json.contains(r#""outcome":"max_turns""#), "{json}");
        assert_eq!(from_json::<pb::RunResult>(json.as_bytes()).unwrap(), r);
        let m: pb::SetModeRequest = from_json(br#"{"mode": "accept-edits"}"#).unwrap();
        assert_eq!(m.mode(), pb::PermissionMode::AcceptEdits);
        let m: pb::SetModeRequest = from_json(br#"{"mode": ""}"#).unwrap();
        assert_eq!(m.mode(), pb::PermissionMode::Unspecified);
        let a: pb::ApproveRequest = from_json(br#"{"approve": true, "mode": "default"}"#).unwrap();
        assert_eq!(a.mode(), pb::PlanExitMode::Default);
        let p = pb::ProviderInfo {
            key_sources: vec![pb::KeySource::Env as i32, pb::KeySource::Store as i32],
            ..Default::default()
        };
        let json = String::from_utf8(to_json(&p)).unwrap();
        assert!(json.contains(r#""key_sources":["env","store"]"#), "{json}");
        let t = pb::TimelineItem::default();
        let json = String::from_utf8(to_json(&t)).unwrap();
        assert!(
            json.contains(r#""kind":"","status":"""#),
            "unspecified is \"\": {json}"
        );
        let h = pb::HostInfo {
            auth: pb::AuthMode::Remote as i32,
            ..Default::default()
        };
        let json = String::from_utf8(to_json(&h)).unwrap();
        assert!(json.contains(r#""auth":"remote","storage":"ledger""#), "{json}");
        let side = pb::SideFinished {
            outcome: pb::SideOutcome::Completed as i32,
            ..Default::default()
        };
        let json = String::from_utf8(to_json(&side)).unwrap();
        assert!(json.contains(r#""outcome":"SIDE_OUTCOME_COMPLETED""#), "{json}");
    }

    #[test]
    fn an_unknown_enum_name_is_refused_with_the_names_it_takes() {
        assert_eq!(
            from_json::<pb::SetModeRequest>(br#"{"mode": "yolo"}"#).unwrap_err(),
            r#"malformed JSON body: unknown mode "yolo": expected one of default, accept-edits, plan, bypass"#
        );
        assert_eq!(
            from_json::<pb::ApproveRequest>(br#"{"approve": true, "mode": "plan"}"#).unwrap_err(),
            r#"malformed JSON body: unknown mode "plan": expected accept-edits or default"#
        );
        assert_eq!(
            from_json::<pb::WriteFileRequest>(br#"{"path": "x", "encoding": "latin-1"}"#).unwrap_err(),
            r#"malformed JSON body: unknown encoding "latin-1": expected utf-8 or base64"#
        );
        // The proto name is not a JSON name.
        assert!(from_json::<pb::SetModeRequest>(br#"{"mode": "PERMISSION_MODE_PLAN"}"#).is_err());
        // Other errors keep the mapping's words.
        assert!(from_json::<pb::SetModeRequest>(br#"{"mode": 3.5}"#)
            .unwrap_err()
            .starts_with("malformed JSON body"));
    }

    proptest::proptest! {
        #[test]
        fn any_body_parses_or_errs_without_panicking(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = from_json::<pb::RunRequest>(&body);
            let _ = from_json::<pb::ApproveRequest>(&body);
            let _ = from_json::<pb::StreamRequest>(&body);
        }

        #[test]
        fn json_like_bodies_parse_or_err_without_panicking(s in r#"\{("[a-z_]{1,12}": ?("[^"]{0,8}"|-?[0-9]{1,22}|true|null|\[\]|\{\}),? ?){0,4}\}"#) {
            let _ = from_json::<pb::RunRequest>(s.as_bytes());
            let _ = from_json::<pb::FollowRequest>(s.as_bytes());
        }

        #[test]
        fn run_requests_round_trip(prompt in ".{0,40}", request_id in "[a-z0-9-]{0,16}") {
            let r = pb::RunRequest { session_id: "s".into(), prompt, request_id, ..Default::default() };
            proptest::prop_assert_eq!(from_json::<pb::RunRequest>(&to_json(&r)).unwrap(), r);
        }
    }
}
