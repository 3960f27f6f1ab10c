//! The codec every generated service and client uses: tonic's prost codec with a small first encode buffer, so an idle stream does not keep 8 KiB.
//!
//! tonic allocates an RPC's encode buffer up front (8 KiB by default) and
//! hands each batch out with `split_to`, which leaves the rest of that
//! allocation with the stream for as long as it lives. A subscriber that
//! has had its `stream_opened` and waits keeps all of it, so 10 000 idle
//! gRPC streams held about 80 MB of empty buffers. A busy stream's buffer
//! grows as `BytesMut` grows (by doubling) within a batch; gRPC fan-out to
//! 1 and 100 subscribers measured the same within this machine's spread
//! (BENCHMARKS.md, idle gRPC streams).

use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first encode buffer of an RPC: room for a typical event.
pub const FIRST_ENCODE_BUFFER: usize = 256;
/// Encoded bytes a stream gathers before it hands them to the transport
/// (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// tonic's `ProstCodec` with `FIRST_ENCODE_BUFFER` (decoding as tonic's default).
#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        SmallBufferCodec(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(FIRST_ENCODE_BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}
