//! The proto3 JSON mapping (proto field names as keys) for REST bodies and SSE data, driven by the descriptor set of proto/.
//!
//! One deliberate choice: 64-bit integers (seq, latest_seq, token counts) are
//! written as JSON numbers, not strings, since they stay far below 2^53 and
//! every client wants to compare them as numbers; strings are still accepted
//! on input, as the mapping requires.

use crate::FILE_DESCRIPTOR_SET;
use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};
use std::sync::LazyLock;

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET).expect("build.rs wrote a valid descriptor set")
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
            .map_err(|e| format!("malformed JSON body: {e}"))?;
    de.end().map_err(|e| format!("malformed JSON body: {e}"))?;
    dynamic
        .transcode_to::<M>()
        .map_err(|e| format!("malformed JSON body: {e}"))
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
            outcome: "approved".into(),
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
