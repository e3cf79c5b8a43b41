//! What the stage benches share.

use bytes::Bytes;

/// 64 KiB: what pingora hands a body filter per read under load.
pub(crate) const CHUNK: usize = 64 << 10;

/// `total` bytes of deterministic, incompressible-looking content (xorshift), cut into
/// [`CHUNK`]s of one buffer, as a body arrives. Hashing and AES speed do not depend on content.
pub(crate) fn chunks(total: usize) -> Vec<Bytes> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..total)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let data = Bytes::from(data);
    (0..total).step_by(CHUNK).map(|at| data.slice(at..(at + CHUNK).min(total))).collect()
}
