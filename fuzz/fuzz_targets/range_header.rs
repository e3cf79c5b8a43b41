//! Range header parsing and resolution on arbitrary input.
//!
//! Input: 8 bytes of representation length (little-endian; missing bytes are zero), then the
//! header value. Checks every invariant the proxy relies on: no panic or overflow anywhere,
//! resolved ranges non-empty, inside the representation, sorted and disjoint, the covering spec
//! covers them, Content-Range round-trips, and a multipart body is exactly `total_len` long.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{
    ContentRange, EntityTag, EntityTagList, MultipartBody, MultipartError, MultipartPlan,
    RangeLimits, RangeRequest, Resolution, content_range, parse_content_range, parse_range,
    unsatisfied_content_range,
};

/// Representations up to this long are also streamed through a multipart body.
const STREAMED_LEN_LIMIT: u64 = 4096;

fuzz_target!(|input: &[u8]| {
    let (len_bytes, header) = input.split_at(input.len().min(8));
    let mut len_le = [0u8; 8];
    len_le[..len_bytes.len()].copy_from_slice(len_bytes);
    let complete_len = u64::from_le_bytes(len_le);

    check_range_header(header, complete_len);
    check_content_range_parser(header);
    check_entity_tag_parsers(header);
});

fn check_range_header(header: &[u8], complete_len: u64) {
    let limits = RangeLimits::default();
    let set = match parse_range(header, &limits) {
        RangeRequest::Ignore(_) => return,
        RangeRequest::Bytes(set) => set,
    };
    assert!(!set.specs().is_empty() && set.specs().len() <= limits.max_ranges);
    // The canonical form reads back as the same set.
    assert_eq!(
        parse_range(set.header_value().as_bytes(), &limits),
        RangeRequest::Bytes(set.clone())
    );

    let resolution = set.resolve(complete_len);
    let ranges: Vec<ByteRange> = match &resolution {
        Resolution::Unsatisfiable => Vec::new(),
        Resolution::Single(range) => vec![*range],
        Resolution::Multiple(ranges) => {
            assert!(ranges.len() >= 2);
            ranges.clone()
        }
    };
    for range in &ranges {
        assert!(!range.is_empty() && range.end() <= complete_len, "{range:?} of {complete_len}");
        let written = content_range(*range, complete_len);
        let expected = ContentRange::Satisfied { range: *range, complete_len: Some(complete_len) };
        assert_eq!(parse_content_range(written.as_bytes()), Some(expected));
    }
    for pair in ranges.windows(2) {
        assert!(pair[0].end() < pair[1].start(), "{pair:?} not sorted and apart");
    }
    for spec in set.specs() {
        if let Some(wanted) = spec.resolve(complete_len) {
            assert!(ranges.iter().any(|range| range.contains_range(&wanted)), "{spec} lost");
        }
    }
    if ranges.is_empty() {
        assert!(set.specs().iter().all(|spec| spec.resolve(complete_len).is_none()));
        let written = unsatisfied_content_range(complete_len);
        let expected = ContentRange::Unsatisfied { complete_len };
        assert_eq!(parse_content_range(written.as_bytes()), Some(expected));
    }

    if let (Some(cover), Some(first), Some(last)) =
        (set.covering_spec(), ranges.first(), ranges.last())
    {
        let covered = cover.resolve(complete_len).expect("the cover selects what the set does");
        assert!(covered.start() <= first.start() && last.end() <= covered.end(), "{cover}");
    }

    if let Resolution::Multiple(ranges) = resolution {
        check_multipart(&ranges, complete_len, header);
    }
}

fn check_multipart(ranges: &[ByteRange], complete_len: u64, chunking: &[u8]) {
    let plan = match MultipartPlan::new(ranges, complete_len, Some("application/x-fuzz"), "fuzz") {
        Ok(plan) => plan,
        // Only a body past u64::MAX bytes may be refused.
        Err(error) => {
            assert_eq!(error, MultipartError::TooLong);
            return;
        }
    };
    let data_len: u64 = ranges.iter().map(ByteRange::len).sum();
    assert!(plan.total_len() > data_len);
    if complete_len > STREAMED_LEN_LIMIT {
        return;
    }
    // Stream the representation in chunks whose sizes come from the header bytes.
    let data: Vec<u8> = (0..complete_len).map(|offset| offset as u8).collect();
    let data = Bytes::from(data);
    let mut body = MultipartBody::new(plan.clone(), 0).expect("input starts at 0");
    let mut sizes = chunking.iter().map(|&size| usize::from(size).max(1)).cycle();
    let mut produced = 0u64;
    let mut at = 0usize;
    while at < data.len() {
        let end = sizes.next().map_or(data.len(), |size| (at + size).min(data.len()));
        if let Some(piece) = body.push(data.slice(at..end)) {
            produced += piece.len() as u64;
        }
        at = end;
    }
    assert!(body.is_done());
    produced += body.finish().map_or(0, |tail| tail.len() as u64);
    assert_eq!(produced, plan.total_len());
}

fn check_content_range_parser(value: &[u8]) {
    if let Some(ContentRange::Satisfied { range, complete_len }) = parse_content_range(value) {
        assert!(!range.is_empty());
        if let Some(len) = complete_len {
            assert!(range.end() <= len);
            let written = content_range(range, len);
            assert_eq!(parse_content_range(written.as_bytes()), parse_content_range(value));
        }
    }
}

fn check_entity_tag_parsers(value: &[u8]) {
    if let Some(tag) = EntityTag::parse(value) {
        assert_eq!(EntityTag::parse(tag.to_string().as_bytes()), Some(tag));
    }
    // Also as a list split into field lines at every LF.
    let _ = EntityTagList::parse(value.split(|&b| b == b'\n'));
}
