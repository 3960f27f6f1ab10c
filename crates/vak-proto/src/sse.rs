//! Server-Sent Events frames as the server writes them and the bench's floor replays them.

use bytes::{Bytes, BytesMut};

/// Appends one frame: `id:` when given, `event:`, and the JSON as one
/// `data:` line (compact JSON never contains a raw newline).
pub fn write_frame(out: &mut BytesMut, name: &str, id: Option<&str>, json: &[u8]) {
    write_head(out, name, id);
    out.extend_from_slice(json);
    out.extend_from_slice(FRAME_END);
}

/// Appends a frame's head, up to where its JSON starts: a writer that sends
/// a large JSON from a buffer of its own writes this, the JSON, then `FRAME_END`.
pub fn write_head(out: &mut BytesMut, name: &str, id: Option<&str>) {
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

/// What ends a frame after its JSON.
pub const FRAME_END: &[u8] = b"\n\n";

/// One frame on its own.
pub fn frame(name: &str, id: Option<&str>, json: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(json.len() + name.len() + 32);
    write_frame(&mut out, name, id, json);
    out.freeze()
}
