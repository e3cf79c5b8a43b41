//! What a route's stages learned about one object version: digests of ranges of their input,
//! states to resume from, and the index of their output segments.
//!
//! Stored as a map of one field per fact, so that writers merge by adding fields: two instances
//! (or two connections of one download) reporting at once both keep what they learned, without a
//! read-modify-write. A field `v` names the version the facts are about; facts for another version
//! replace them whole, so a digest recorded for one ETag is never shown for another.

use std::collections::BTreeMap;

use bytes::Bytes;
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{Digest, RangeDigest, Segment, StageReport, StageState};

/// The field holding the version the other fields are about.
pub(super) const VERSION_FIELD: &str = "v";

/// The most fields one stage's facts hold: 16 Ki checkpoints or segments (16 GiB of 1 MiB gzip
/// blocks; 128 GiB at the checksum's 8 MiB interval). Facts beyond it are not recorded; what is
/// recorded stays true.
pub const MAX_FIELDS: usize = 16 << 10;

/// What one stage of a route learned about one object version.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct StageFacts {
    /// The version: the origin's strong ETag and size ([`StageFacts::version_of`]).
    pub version: String,
    pub digests: Vec<RangeDigest>,
    /// By ascending offset.
    pub checkpoints: Vec<StageState>,
    pub segments: BTreeMap<u64, Segment>,
}

impl StageFacts {
    /// The version string of an object with a strong ETag; facts are kept only for those, as
    /// nothing else tells two versions apart.
    pub fn version_of(strong_etag: &str, size: u64) -> String {
        format!("{size} {strong_etag}")
    }

    /// The facts of a stage's report about `version`.
    pub fn from_report(version: String, report: StageReport) -> Self {
        Self {
            version,
            digests: report.digests,
            checkpoints: report.checkpoints,
            segments: report.segments.into_iter().collect(),
        }
    }

    /// Whether there is nothing to record.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty() && self.checkpoints.is_empty() && self.segments.is_empty()
    }

    /// The segments from segment 0 on, as far as they run without a gap.
    pub fn contiguous_segments(&self) -> Vec<Segment> {
        self.segments
            .iter()
            .zip(0u64..)
            .take_while(|((k, _), expected)| *k == expected)
            .map(|((_, segment), _)| *segment)
            .collect()
    }

    /// The SHA-256 of `range`, when recorded.
    pub fn sha256(&self, range: ByteRange) -> Option<[u8; 32]> {
        self.digests.iter().filter(|d| d.range == range).find_map(|d| match d.digest {
            Digest::Sha256(sha) => Some(sha),
            _ => None,
        })
    }

    /// The CRC32 of `range`, when recorded.
    pub fn crc32(&self, range: ByteRange) -> Option<u32> {
        self.digests.iter().filter(|d| d.range == range).find_map(|d| match d.digest {
            Digest::Crc32(crc) => Some(crc),
            _ => None,
        })
    }

    /// The fields to add to the stored map (all but the version).
    pub fn to_fields(&self) -> Vec<(String, Vec<u8>)> {
        let mut fields =
            Vec::with_capacity(self.digests.len() + self.checkpoints.len() + self.segments.len());
        for RangeDigest { range, digest } in &self.digests {
            let (algorithm, value) = match digest {
                Digest::Sha256(sha) => ("s", sha.to_vec()),
                Digest::Crc32(crc) => ("c", crc.to_be_bytes().to_vec()),
                // A digest kind this build does not store.
                _ => continue,
            };
            fields.push((format!("d:{algorithm}:{}-{}", range.start(), range.end()), value));
        }
        for state in &self.checkpoints {
            fields.push((format!("c:{}", state.offset()), state.bytes().to_vec()));
        }
        for (k, segment) in &self.segments {
            let mut value = Vec::with_capacity(16);
            value.extend_from_slice(&segment.output_len.to_be_bytes());
            value.extend_from_slice(&segment.output_crc32.to_be_bytes());
            value.extend_from_slice(&segment.input_crc32.to_be_bytes());
            fields.push((format!("s:{k}"), value));
        }
        fields
    }

    /// Reads a stored map. Fields this build does not know, or cannot read, are skipped: each
    /// field is a fact on its own, true or absent. `None` without a version.
    pub fn from_fields<'a, I>(fields: I) -> Option<Self>
    where
        I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
    {
        let mut facts = Self::default();
        let mut version = None;
        for (name, value) in fields {
            let Ok(name) = std::str::from_utf8(name) else { continue };
            if name == VERSION_FIELD {
                version = String::from_utf8(value.to_vec()).ok();
                continue;
            }
            let Some((kind, rest)) = name.split_once(':') else { continue };
            match kind {
                "d" => facts.digests.extend(read_digest(rest, value)),
                "c" => {
                    if let Ok(offset) = rest.parse() {
                        facts
                            .checkpoints
                            .push(StageState::new(offset, Bytes::copy_from_slice(value)));
                    }
                }
                "s" => {
                    if let (Ok(k), Ok(raw)) = (rest.parse(), <[u8; 16]>::try_from(value)) {
                        let (len, crcs) = raw.split_at(8);
                        let (output_crc32, input_crc32) = crcs.split_at(4);
                        let segment = Segment {
                            output_len: u64::from_be_bytes(len.try_into().ok()?),
                            output_crc32: u32::from_be_bytes(output_crc32.try_into().ok()?),
                            input_crc32: u32::from_be_bytes(input_crc32.try_into().ok()?),
                        };
                        facts.segments.insert(k, segment);
                    }
                }
                _ => {}
            }
        }
        facts.checkpoints.sort_unstable_by_key(StageState::offset);
        facts.version = version?;
        Some(facts)
    }
}

fn read_digest(rest: &str, value: &[u8]) -> Option<RangeDigest> {
    let (algorithm, range) = rest.split_once(':')?;
    let (start, end) = range.split_once('-')?;
    let range = ByteRange::new(start.parse().ok()?, end.parse().ok()?)?;
    let digest = match algorithm {
        "s" => Digest::Sha256(value.try_into().ok()?),
        "c" => Digest::Crc32(u32::from_be_bytes(value.try_into().ok()?)),
        _ => return None,
    };
    Some(RangeDigest { range, digest })
}

/// Adds `fields` about `version` to a stored map, the rule `redis/facts.lua` applies in Redis:
/// facts about another version are dropped first, and no field is added past [`MAX_FIELDS`].
pub(super) fn merge_fields(
    map: &mut BTreeMap<String, Vec<u8>>,
    version: &str,
    fields: Vec<(String, Vec<u8>)>,
) {
    if map.get(VERSION_FIELD).map(Vec::as_slice) != Some(version.as_bytes()) {
        map.clear();
        map.insert(VERSION_FIELD.to_owned(), version.as_bytes().to_vec());
    }
    for (name, value) in fields {
        if map.len() > MAX_FIELDS && !map.contains_key(&name) {
            break;
        }
        map.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> StageFacts {
        StageFacts {
            version: StageFacts::version_of("\"e1\"", 100),
            digests: vec![
                RangeDigest { range: ByteRange::whole(100), digest: Digest::Sha256([7; 32]) },
                RangeDigest {
                    range: ByteRange::new(10, 20).expect("valid"),
                    digest: Digest::Crc32(0xdead_beef),
                },
            ],
            checkpoints: vec![StageState::new(64, Bytes::from_static(b"state"))],
            segments: [
                (0, Segment { output_len: 9, output_crc32: 1, input_crc32: 2 }),
                (1, Segment { output_len: 8, output_crc32: 3, input_crc32: 4 }),
                (3, Segment { output_len: 7, output_crc32: 5, input_crc32: 6 }),
            ]
            .into(),
        }
    }

    fn read(map: &BTreeMap<String, Vec<u8>>) -> Option<StageFacts> {
        StageFacts::from_fields(map.iter().map(|(k, v)| (k.as_bytes(), v.as_slice())))
    }

    #[test]
    fn fields_round_trip() {
        let facts = facts();
        let mut map = BTreeMap::new();
        merge_fields(&mut map, &facts.version, facts.to_fields());
        let back = read(&map).expect("has a version");
        assert_eq!(back.version, facts.version);
        assert_eq!(back.checkpoints, facts.checkpoints);
        assert_eq!(back.segments, facts.segments);
        for digest in &facts.digests {
            assert!(back.digests.contains(digest), "{digest:?}");
        }
        assert_eq!(back.contiguous_segments().len(), 2);
        assert_eq!(back.sha256(ByteRange::whole(100)), Some([7; 32]));
        assert_eq!(back.crc32(ByteRange::whole(100)), None);
        assert_eq!(back.crc32(ByteRange::new(10, 20).expect("valid")), Some(0xdead_beef));
    }

    #[test]
    fn another_version_replaces_and_unknown_fields_are_skipped() {
        let facts = facts();
        let mut map = BTreeMap::new();
        merge_fields(&mut map, &facts.version, facts.to_fields());
        map.insert("x:future".to_owned(), b"?".to_vec());
        map.insert("s:notanumber".to_owned(), vec![0; 16]);
        map.insert("d:s:5-1".to_owned(), vec![0; 32]);
        map.insert("d:s:0-5".to_owned(), vec![0; 3]);
        let back = read(&map).expect("readable");
        assert_eq!(back.digests.len(), 2);
        assert_eq!(back.segments.len(), 3);

        let other = StageFacts::version_of("\"e2\"", 100);
        merge_fields(&mut map, &other, vec![("c:0".to_owned(), b"s".to_vec())]);
        let back = read(&map).expect("readable");
        assert_eq!(back.version, other);
        assert!(back.digests.is_empty() && back.segments.is_empty());
        assert_eq!(back.checkpoints.len(), 1);

        map.remove(VERSION_FIELD);
        assert_eq!(read(&map), None);
    }

    #[test]
    fn bounded() {
        let mut map = BTreeMap::new();
        let many = (0..MAX_FIELDS + 10).map(|k| (format!("s:{k}"), vec![0; 16])).collect();
        merge_fields(&mut map, "v", many);
        assert_eq!(map.len(), MAX_FIELDS + 1);
    }
}
