//! Resumable SHA-256: the hash state at a block boundary, in a versioned format of our own.

use bytes::{BufMut, Bytes, BytesMut};
use sha2::Sha256;
use sha2::digest::common::hazmat::{SerializableState, SerializedState};

use crate::chain::StageState;

/// SHA-256's block length: a checkpoint lies on a multiple of it, where the hash state is just
/// its eight words, with no partial block pending.
pub(super) const BLOCK: u64 = 64;

/// Tells a checkpoint apart from any other bytes a store might hand back.
const MAGIC: [u8; 4] = *b"S256";

/// The length of sha2 0.11's serialized `Sha256`: the eight state words (little-endian), the
/// count of hashed blocks (u64, little-endian), then the pending partial block: its length in one
/// byte, and room for its at most 63 bytes. Only [`ShaCheckpoint::capture`] and [`ShaCheckpoint::restore`] know this layout, and
/// the tests pin it against sha2's `compress256`, so an upgrade that changes it fails them.
const SHA2_SERIALIZED_LEN: usize = 32 + 8 + 1 + 63;

/// Why bytes are not a usable SHA-256 checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    #[error("not a SHA-256 checkpoint")]
    NotACheckpoint,
    #[error(
        "SHA-256 checkpoint format version {found} is not readable by this build (it reads \
         version {})",
        ShaCheckpoint::FORMAT_VERSION
    )]
    Version { found: u8 },
    #[error("SHA-256 checkpoint is {found} bytes long, not {}", ShaCheckpoint::ENCODED_LEN)]
    Length { found: usize },
    #[error("SHA-256 checkpoint offset {0} is not a multiple of 64")]
    Misaligned(u64),
    #[error("SHA-256 checkpoint for offset {encoded} was stored as one for offset {stored}")]
    OffsetMismatch { encoded: u64, stored: u64 },
}

/// The SHA-256 state after hashing the first `offset` bytes of a stream, `offset` a multiple of
/// 64: FIPS 180-4's intermediate hash value H(offset / 64).
///
/// Kept in a format of our own rather than sha2's serialization, which its crate may change
/// between versions: the intermediate hash value is defined by the standard, so a checkpoint
/// stays readable across sha2 upgrades (and by any other implementation). Encoded, version 1:
///
/// ```text
/// "S256" | version: u8 = 1 | offset: u64 BE | H0..H7: u32 BE each      (45 bytes)
/// ```
///
/// A reader refuses any other magic, version or length, so a checkpoint written by another
/// build is never misread.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ShaCheckpoint {
    offset: u64,
    state: [u32; 8],
}

impl ShaCheckpoint {
    pub const FORMAT_VERSION: u8 = 1;
    pub const ENCODED_LEN: usize = MAGIC.len() + 1 + 8 + 32;

    /// The number of bytes hashed into this state.
    pub const fn offset(&self) -> u64 {
        self.offset
    }

    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(Self::ENCODED_LEN);
        out.put_slice(&MAGIC);
        out.put_u8(Self::FORMAT_VERSION);
        out.put_u64(self.offset);
        self.state.iter().for_each(|&word| out.put_u32(word));
        out.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CheckpointError> {
        let rest = bytes.strip_prefix(&MAGIC).ok_or(CheckpointError::NotACheckpoint)?;
        let (&version, rest) = rest.split_first().ok_or(CheckpointError::NotACheckpoint)?;
        if version != Self::FORMAT_VERSION {
            return Err(CheckpointError::Version { found: version });
        }
        let Some((offset, words)) = rest.split_first_chunk::<8>() else {
            return Err(CheckpointError::Length { found: bytes.len() });
        };
        if words.len() != 32 {
            return Err(CheckpointError::Length { found: bytes.len() });
        }
        let offset = u64::from_be_bytes(*offset);
        if !offset.is_multiple_of(BLOCK) {
            return Err(CheckpointError::Misaligned(offset));
        }
        let mut state = [0u32; 8];
        for (word, bytes) in state.iter_mut().zip(words.chunks_exact(4)) {
            *word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        Ok(Self { offset, state })
    }

    /// As a stage state, for the chain and the store.
    pub fn to_state(&self) -> StageState {
        StageState::new(self.offset, self.encode())
    }

    /// From a stage state, checking that it was stored under its own offset.
    pub fn from_state(state: &StageState) -> Result<Self, CheckpointError> {
        let checkpoint = Self::decode(state.bytes())?;
        if checkpoint.offset != state.offset() {
            return Err(CheckpointError::OffsetMismatch {
                encoded: checkpoint.offset,
                stored: state.offset(),
            });
        }
        Ok(checkpoint)
    }

    /// The state of `hasher` at the last block boundary, `hasher` having been fed `fed` bytes.
    ///
    /// `None` if sha2's serialization does not add up to `fed` bytes: its layout changed, and
    /// reading it as ours would store a wrong state, so no checkpoint is better.
    pub(super) fn capture(hasher: &Sha256, fed: u64) -> Option<Self> {
        let serialized = hasher.serialize();
        let serialized: &[u8] = serialized.as_slice();
        if serialized.len() != SHA2_SERIALIZED_LEN {
            return None;
        }
        let (words, rest) = serialized.split_first_chunk::<32>()?;
        let (blocks, rest) = rest.split_first_chunk::<8>()?;
        let pending = u64::from(*rest.first()?);
        let offset = u64::from_le_bytes(*blocks).checked_mul(BLOCK)?;
        if offset.checked_add(pending)? != fed || pending >= BLOCK {
            return None;
        }
        let mut state = [0u32; 8];
        for (word, bytes) in state.iter_mut().zip(words.chunks_exact(4)) {
            *word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        Some(Self { offset, state })
    }

    /// A hasher that goes on from this state.
    pub(super) fn restore(&self) -> Option<Sha256> {
        let mut serialized = SerializedState::<Sha256>::default();
        let bytes: &mut [u8] = serialized.as_mut_slice();
        if bytes.len() != SHA2_SERIALIZED_LEN {
            return None;
        }
        for (word, out) in self.state.iter().zip(bytes.chunks_exact_mut(4)) {
            out.copy_from_slice(&word.to_le_bytes());
        }
        let (_, rest) = bytes.split_at_mut(32);
        let (blocks, _) = rest.split_at_mut(8);
        blocks.copy_from_slice(&(self.offset / BLOCK).to_le_bytes());
        // The pending-block length and bytes stay zero: nothing is pending at a block boundary.
        Sha256::deserialize(&serialized).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;

    /// The standard's initial hash value H(0).
    const IV: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];

    #[test]
    fn captured_state_is_the_standards_intermediate_hash_value() {
        let data: Vec<u8> = (0..200u8).collect();
        let mut hasher = Sha256::new();
        assert_eq!(
            ShaCheckpoint::capture(&hasher, 0),
            Some(ShaCheckpoint { offset: 0, state: IV })
        );
        hasher.update(&data);
        // Independent of sha2's serialization: its block function, applied by hand.
        let mut expected = IV;
        let blocks: Vec<[u8; 64]> =
            data.chunks_exact(64).map(|block| block.try_into().unwrap()).collect();
        sha2::block_api::compress256(&mut expected, &blocks);
        let captured = ShaCheckpoint::capture(&hasher, 200).unwrap();
        assert_eq!(captured, ShaCheckpoint { offset: 192, state: expected });
        // A count that does not add up is refused.
        assert_eq!(ShaCheckpoint::capture(&hasher, 199), None);
    }

    #[test]
    fn restored_state_continues_the_hash() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut hasher = Sha256::new();
        hasher.update(&data[..640]);
        let checkpoint = ShaCheckpoint::capture(&hasher, 640).unwrap();
        let decoded = ShaCheckpoint::decode(&checkpoint.encode()).unwrap();
        let mut resumed = decoded.restore().unwrap();
        resumed.update(&data[640..]);
        assert_eq!(resumed.finalize(), Sha256::digest(&data));
    }

    #[test]
    fn encoding_is_pinned() {
        let checkpoint = ShaCheckpoint { offset: 64, state: IV };
        let encoded = checkpoint.encode();
        assert_eq!(encoded.len(), ShaCheckpoint::ENCODED_LEN);
        assert_eq!(&encoded[..13], b"S256\x01\0\0\0\0\0\0\0\x40");
        assert_eq!(&encoded[13..17], &[0x6a, 0x09, 0xe6, 0x67]);
        assert_eq!(ShaCheckpoint::decode(&encoded), Ok(checkpoint));
    }

    #[test]
    fn foreign_or_damaged_bytes_are_refused() {
        let good = ShaCheckpoint { offset: 128, state: IV }.encode();
        let with = |index: usize, byte: u8| {
            let mut bytes = good.to_vec();
            bytes[index] = byte;
            ShaCheckpoint::decode(&bytes)
        };
        assert_eq!(with(0, b'X'), Err(CheckpointError::NotACheckpoint));
        assert_eq!(with(4, 2), Err(CheckpointError::Version { found: 2 }));
        assert_eq!(with(12, 0x41), Err(CheckpointError::Misaligned(0x41)));
        assert_eq!(ShaCheckpoint::decode(b""), Err(CheckpointError::NotACheckpoint));
        assert_eq!(ShaCheckpoint::decode(b"S256"), Err(CheckpointError::NotACheckpoint));
        assert_eq!(ShaCheckpoint::decode(&good[..44]), Err(CheckpointError::Length { found: 44 }));
        assert_eq!(ShaCheckpoint::decode(&good[..8]), Err(CheckpointError::Length { found: 8 }));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(ShaCheckpoint::decode(&long), Err(CheckpointError::Length { found: 46 }));
        let misfiled = StageState::new(64, good.clone());
        assert_eq!(
            ShaCheckpoint::from_state(&misfiled),
            Err(CheckpointError::OffsetMismatch { encoded: 128, stored: 64 })
        );
    }
}
