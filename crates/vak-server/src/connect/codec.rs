//! The Connect wire pieces: canonical proto3 JSON by the descriptor set, envelopes (the same five-byte prefix gRPC frames use), and gzip, each bounded.

use super::super::protocol::Codec;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, MethodDescriptor, SerializeOptions,
};
use std::io::{Read, Write};
use std::sync::LazyLock;
use tonic::Status;

/// proto/ as written (enum values by their proto names) plus the health and
/// reflection services the port also serves: every RPC a Connect call can
/// name, and its canonical JSON mapping (the REST façade's own JSON style,
/// vak_proto::json, is not used here).
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    let mut pool = DescriptorPool::decode(vak_proto::FILE_DESCRIPTOR_SET)
        .expect("build.rs wrote a valid descriptor set");
    for set in [
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ] {
        pool.decode_file_descriptor_set(set)
            .expect("tonic-health and tonic-reflection ship valid descriptor sets");
    }
    pool
});

/// The RPC a `/<package.Service>/<Method>` path names, if the port serves it.
pub(crate) fn method(path: &str) -> Option<MethodDescriptor> {
    let (service, name) = path.strip_prefix('/')?.split_once('/')?;
    POOL.get_service_by_name(service)?
        .methods()
        .find(|m| m.name() == name)
}

/// Bytes at or over this size are compressed when the client accepts gzip
/// (smaller ones cost more to compress than they save).
pub(crate) const COMPRESS_MIN: usize = 1024;

/// Envelope flag: the message is compressed with the stream's encoding.
pub(crate) const COMPRESSED: u8 = 0b01;
/// Envelope flag: the end-of-stream message (JSON), last in a response.
pub(crate) const END_STREAM: u8 = 0b10;

/// Turns messages between the client's codec and the binary protobuf the
/// tonic service speaks.
#[derive(Clone)]
pub(crate) struct Transcoder {
    codec: Codec,
    input: MessageDescriptor,
    output: MessageDescriptor,
}

impl Transcoder {
    pub(crate) fn new(codec: Codec, method: &MethodDescriptor) -> Transcoder {
        Transcoder {
            codec,
            input: method.input(),
            output: method.output(),
        }
    }

    pub(crate) fn codec(&self) -> Codec {
        self.codec
    }

    /// A request message as protobuf.
    pub(crate) fn request(&self, bytes: Bytes) -> Result<Bytes, Status> {
        match self.codec {
            Codec::Json => from_json(&self.input, &bytes),
            Codec::Proto => Ok(bytes),
        }
    }

    /// A response message in the client's codec.
    pub(crate) fn response(&self, bytes: Bytes) -> Result<Bytes, Status> {
        match self.codec {
            Codec::Json => to_json(&self.output, &bytes),
            Codec::Proto => Ok(bytes),
        }
    }
}

fn from_json(desc: &MessageDescriptor, body: &[u8]) -> Result<Bytes, Status> {
    // curl with no body: the empty message, as `{}` is.
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Bytes::new());
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let msg = DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &DeserializeOptions::new())
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| Status::invalid_argument(format!("malformed {} JSON: {e}", desc.full_name())))?;
    Ok(prost::Message::encode_to_vec(&msg).into())
}

fn to_json(desc: &MessageDescriptor, bytes: &[u8]) -> Result<Bytes, Status> {
    let msg = DynamicMessage::decode(desc.clone(), bytes).map_err(|e| {
        Status::internal(format!(
            "the service answered a message that does not decode: {e}"
        ))
    })?;
    let mut ser = serde_json::Serializer::new(Vec::new());
    msg.serialize_with_options(&mut ser, &SerializeOptions::new())
        .map_err(|e| Status::internal(format!("cannot write JSON: {e}")))?;
    Ok(ser.into_inner().into())
}

/// A message compression Connect names in its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    /// The encoding a `Content-Encoding` (or `Connect-Content-Encoding`) names;
    /// absent is identity; an unknown one is UNIMPLEMENTED, as the spec says.
    pub(crate) fn named(value: Option<&str>) -> Result<Encoding, Status> {
        match value.map(str::trim) {
            None | Some("") | Some("identity") => Ok(Encoding::Identity),
            Some("gzip") => Ok(Encoding::Gzip),
            Some(other) => Err(Status::unimplemented(format!(
                "unsupported compression {other:?}: this server speaks gzip and identity"
            ))),
        }
    }

    /// The encoding to answer with, given `Accept-Encoding` (or `Connect-Accept-Encoding`).
    pub(crate) fn accepted(value: Option<&str>) -> Encoding {
        let gzip = value.is_some_and(|v| {
            v.split(',')
                .any(|e| e.split(';').next().is_some_and(|name| name.trim() == "gzip"))
        });
        if gzip {
            Encoding::Gzip
        } else {
            Encoding::Identity
        }
    }

    /// Decompresses `data`, refusing more than `limit` bytes out.
    pub(crate) fn decode(self, data: Bytes, limit: usize) -> Result<Bytes, Status> {
        match self {
            Encoding::Identity => Ok(data),
            Encoding::Gzip => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(data.as_ref())
                    .take(limit as u64 + 1)
                    .read_to_end(&mut out)
                    .map_err(|e| {
                        Status::invalid_argument(format!("the gzip message does not decompress: {e}"))
                    })?;
                if out.len() > limit {
                    return Err(too_large(limit));
                }
                Ok(out.into())
            }
        }
    }

    pub(crate) fn encode(self, data: &[u8]) -> Bytes {
        match self {
            Encoding::Identity => Bytes::copy_from_slice(data),
            Encoding::Gzip => {
                let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                z.write_all(data).expect("writing to a Vec cannot fail");
                z.finish().expect("writing to a Vec cannot fail").into()
            }
        }
    }
}

pub(crate) fn too_large(limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "the message is larger than this server's limit of {limit} bytes"
    ))
}

/// One envelope: flags, the length (big-endian u32), the payload.
pub(crate) fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// Splits a byte stream into envelopes (or gRPC frames: the same prefix),
/// refusing one whose length is over `limit` before buffering it.
pub(crate) struct Deframer {
    buf: BytesMut,
    limit: usize,
}

impl Deframer {
    pub(crate) fn new(limit: usize) -> Deframer {
        Deframer {
            buf: BytesMut::new(),
            limit,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole envelope as (flags, payload), if one has arrived.
    pub(crate) fn next(&mut self) -> Result<Option<(u8, Bytes)>, Status> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.limit {
            return Err(too_large(self.limit));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let flags = self.buf[0];
        self.buf.advance(5);
        Ok(Some((flags, self.buf.split_to(len).freeze())))
    }

    /// Bytes of a partial envelope left over (a stream cut mid-message).
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_split_however_the_bytes_arrive() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&envelope(0, b"hello"));
        wire.extend_from_slice(&envelope(END_STREAM, b"{}"));
        let mut d = Deframer::new(16);
        let mut got = Vec::new();
        for byte in wire {
            d.push(&[byte]);
            while let Some(e) = d.next().unwrap() {
                got.push(e);
            }
        }
        assert_eq!(
            got,
            vec![
                (0, Bytes::from_static(b"hello")),
                (END_STREAM, Bytes::from_static(b"{}"))
            ]
        );
        assert_eq!(d.pending(), 0);
        let mut d = Deframer::new(4);
        d.push(&envelope(0, b"hello"));
        assert_eq!(d.next().unwrap_err().code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn gzip_round_trips_and_a_bomb_is_refused() {
        let data = vec![b'a'; 100_000];
        let z = Encoding::Gzip.encode(&data);
        assert!(z.len() < 1000);
        assert_eq!(Encoding::Gzip.decode(z.clone(), 100_000).unwrap(), data);
        assert_eq!(
            Encoding::Gzip.decode(z, 99_999).unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(
            Encoding::Gzip
                .decode(Bytes::from_static(b"nope"), 10)
                .unwrap_err()
                .code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            Encoding::named(Some("br")).unwrap_err().code(),
            tonic::Code::Unimplemented
        );
        assert_eq!(Encoding::accepted(Some("br, gzip;q=0.5")), Encoding::Gzip);
        assert_eq!(Encoding::accepted(Some("br")), Encoding::Identity);
    }

    #[test]
    fn json_is_the_canonical_mapping() {
        let m = method("/vak.v1.AgentService/AttachSession").unwrap();
        let t = Transcoder::new(Codec::Json, &m);
        let proto = t.request(Bytes::from_static(br#"{"sessionId": "abc"}"#)).unwrap();
        let back = t
            .request(Bytes::from_static(br#"{"session_id": "abc"}"#))
            .unwrap();
        assert_eq!(proto, back, "proto names are accepted too");
        assert_eq!(
            t.request(Bytes::from_static(br#"{"nope": 1}"#))
                .unwrap_err()
                .code(),
            tonic::Code::InvalidArgument
        );
        assert!(method("/vak.v1.AgentService/Nope").is_none());
        assert!(method("/grpc.health.v1.Health/Check").is_some());
        assert!(method("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo").is_some());
        assert!(method("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo").is_some());
        assert!(method("/no.Such/Thing").is_none());
    }
}
