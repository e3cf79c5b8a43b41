//! Deterministic test objects.

/// `len` pseudo-random bytes, the same for the same `seed` on every run and machine.
///
/// Incompressible (so gzip has real work to do and a misplaced byte shows) and without a period
/// that could line up with block or record sizes and hide an offset error.
pub(crate) fn test_bytes(len: usize, seed: u64) -> Vec<u8> {
    // xorshift64* (Vigna). A zero state would stay zero; setting the low bit rules it out, and
    // the multiplication spreads nearby seeds apart.
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}
