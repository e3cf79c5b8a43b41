//! `multipart/byteranges` bodies (RFC 9110 §14.6), streamed from one pass over the selected bytes.

use bytes::{Bytes, BytesMut};

use super::content_range::content_range;
use crate::ByteRange;

/// Why a multipart body cannot be planned or started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    #[error("a multipart/byteranges body needs at least one range")]
    NoRanges,
    #[error("range {0:?} is empty")]
    EmptyRange(ByteRange),
    #[error("range {range:?} ends past the representation's {complete_len} bytes")]
    RangePastEnd { range: ByteRange, complete_len: u64 },
    #[error("range {0:?} overlaps or precedes the one before it; ranges must be sorted")]
    RangesOutOfOrder(ByteRange),
    #[error("boundary must be 1 to 70 characters, each a letter, a digit or one of ' + _ - .")]
    InvalidBoundary,
    #[error("content type must be visible ASCII, spaces and tabs only")]
    InvalidContentType,
    #[error("the body would be longer than u64::MAX bytes")]
    TooLong,
    #[error("input starting at byte {stream_start} misses the first range, at {first_range_start}")]
    StreamStartsTooLate { stream_start: u64, first_range_start: u64 },
    #[error("input skipping from byte {from} to {to} misses part of range {range:?}")]
    SkipsARange { from: u64, to: u64, range: ByteRange },
}

/// The layout of a `multipart/byteranges` body: its ranges, the headers of each part and the exact
/// length, known before a byte of it is produced so the response can carry `Content-Length`.
///
/// The body is, exactly:
///
/// ```text
/// --B\r\nContent-Type: T\r\nContent-Range: bytes a-b/len\r\n\r\n<data>
/// \r\n--B\r\nContent-Type: T\r\nContent-Range: bytes c-d/len\r\n\r\n<data>
/// \r\n--B--\r\n
/// ```
///
/// (without the line breaks shown between parts, and without the `Content-Type` lines when there
/// is no content type). The CRLF before each delimiter belongs to the delimiter (RFC 2046
/// §5.1.1), so a part's data is exactly the range's bytes.
#[derive(Debug, Clone)]
pub struct MultipartPlan {
    parts: Vec<Part>,
    closing: Bytes,
    content_type_header: String,
    total_len: u64,
    span: ByteRange,
}

#[derive(Debug, Clone)]
struct Part {
    range: ByteRange,
    /// Everything between the previous part's data (or the start of the body) and this part's:
    /// the delimiter line, the part's header fields and the blank line that ends them.
    header: Bytes,
}

impl MultipartPlan {
    /// Plans the body for `ranges` of a representation of `complete_len` bytes.
    ///
    /// `ranges` must be non-empty, sorted and disjoint, each non-empty and inside the
    /// representation — what [`Resolution::Multiple`](super::Resolution::Multiple) holds.
    /// `content_type` is the representation's own, repeated in every part; `boundary` must be 1 to
    /// 70 letters, digits or `'+_-.` (characters that need no quoting in the `Content-Type`
    /// parameter), and must not occur in the data: use a random one of 30 or more characters.
    pub fn new(
        ranges: &[ByteRange],
        complete_len: u64,
        content_type: Option<&str>,
        boundary: &str,
    ) -> Result<Self, MultipartError> {
        if !is_boundary(boundary) {
            return Err(MultipartError::InvalidBoundary);
        }
        if content_type.is_some_and(|value| !is_field_value(value)) {
            return Err(MultipartError::InvalidContentType);
        }
        let type_line = content_type.map(|value| format!("Content-Type: {value}\r\n"));
        let type_line = type_line.as_deref().unwrap_or_default();
        let closing = Bytes::from(format!("\r\n--{boundary}--\r\n"));
        let mut total_len = closing.len() as u64;
        let mut parts = Vec::with_capacity(ranges.len());
        let mut span: Option<ByteRange> = None;
        for (index, &range) in ranges.iter().enumerate() {
            if range.is_empty() {
                return Err(MultipartError::EmptyRange(range));
            }
            if range.end() > complete_len {
                return Err(MultipartError::RangePastEnd { range, complete_len });
            }
            let span_start = match span {
                Some(span) if range.start() < span.end() => {
                    return Err(MultipartError::RangesOutOfOrder(range));
                }
                Some(span) => span.start(),
                None => range.start(),
            };
            // Cannot fail after the check above; refusing is still the right answer if it did.
            span = Some(
                ByteRange::new(span_start, range.end())
                    .ok_or(MultipartError::RangesOutOfOrder(range))?,
            );
            let delimiter_lead = if index == 0 { "" } else { "\r\n" };
            let header = Bytes::from(format!(
                "{delimiter_lead}--{boundary}\r\n{type_line}Content-Range: {}\r\n\r\n",
                content_range(range, complete_len)
            ));
            total_len = total_len
                .checked_add(header.len() as u64)
                .and_then(|len| len.checked_add(range.len()))
                .ok_or(MultipartError::TooLong)?;
            parts.push(Part { range, header });
        }
        Ok(Self {
            parts,
            closing,
            content_type_header: format!("multipart/byteranges; boundary={boundary}"),
            total_len,
            span: span.ok_or(MultipartError::NoRanges)?,
        })
    }

    /// `multipart/byteranges; boundary=…`, the response's `Content-Type`.
    pub fn content_type_header(&self) -> &str {
        &self.content_type_header
    }

    /// The exact length of the body, for `Content-Length`.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// The bytes of the representation the body needs: from the start of the first range to the
    /// end of the last. Input must begin at or before its start.
    pub fn span(&self) -> ByteRange {
        self.span
    }
}

/// Produces a planned `multipart/byteranges` body from the representation's bytes as they stream
/// by, in one pass and without buffering.
///
/// A chunk that falls inside one part's data, with no part header due, comes back as a
/// `Bytes::slice` of itself (no copy). Only the chunks in which a part begins are copied, to join
/// the header to the data; there are at most as many as there are ranges.
#[derive(Debug)]
pub struct MultipartBody {
    plan: MultipartPlan,
    /// Representation offset of the next input byte.
    offset: u64,
    /// The first part whose data is not yet all out.
    next_part: usize,
    closed: bool,
}

impl MultipartBody {
    /// A body whose input begins at byte `stream_start` of the representation; it must not begin
    /// after the first range does (the bytes before it could never be produced).
    pub fn new(plan: MultipartPlan, stream_start: u64) -> Result<Self, MultipartError> {
        let first_range_start = plan.span().start();
        if stream_start > first_range_start {
            return Err(MultipartError::StreamStartsTooLate { stream_start, first_range_start });
        }
        Ok(Self { plan, offset: stream_start, next_part: 0, closed: false })
    }

    /// The body's bytes for the next `chunk` of input; `None` when it yields none.
    pub fn push(&mut self, chunk: Bytes) -> Option<Bytes> {
        let chunk_start = self.offset;
        // A chunk's length fits u64; saturate rather than wrap should input ever claim to run past
        // u64::MAX (no range reaches there, so nothing is lost).
        let chunk_end = chunk_start.saturating_add(chunk.len() as u64);
        self.offset = chunk_end;
        let chunk_range = ByteRange::new(chunk_start, chunk_end)?;
        let mut output = Output::Nothing;
        while let Some(part) = self.plan.parts.get(self.next_part) {
            let Some(inside) = chunk_range.intersect(&part.range) else {
                break;
            };
            // Input is contiguous from at or before the first range, so the first chunk to reach a
            // part holds its first byte: that is when its header is due.
            if inside.start() == part.range.start() {
                output = output.append(part.header.clone());
            }
            // Both bounds lie within the chunk, so they fit usize.
            let from = (inside.start() - chunk_start) as usize;
            let to = (inside.end() - chunk_start) as usize;
            output = output.append(chunk.slice(from..to));
            if inside.end() < part.range.end() {
                break;
            }
            self.next_part += 1;
        }
        output.into_bytes()
    }

    /// The closing delimiter, once every part's data is out; `None` if it was already given, or if
    /// input ended early — a truncated body must not be closed as if it were whole, so that the
    /// client sees it short of `Content-Length` rather than as a well-formed, wrong answer.
    pub fn finish(&mut self) -> Option<Bytes> {
        if self.closed || !self.is_done() {
            return None;
        }
        self.closed = true;
        Some(self.plan.closing.clone())
    }

    /// The next input begins at byte `to` of the representation: the bytes from where the input
    /// stands up to it are not given (they lie between two ranges, fetched apart). Refused when a
    /// range needs one of them, or `to` is behind the input.
    pub fn skip_to(&mut self, to: u64) -> Result<(), MultipartError> {
        let from = self.offset;
        let refused = |range| MultipartError::SkipsARange { from, to, range };
        let skipped = ByteRange::new(from, to).ok_or(refused(self.plan.span))?;
        let parts = self.plan.parts.get(self.next_part..).unwrap_or_default();
        if let Some(part) = parts.iter().find(|part| skipped.intersect(&part.range).is_some()) {
            return Err(refused(part.range));
        }
        self.offset = to;
        Ok(())
    }

    /// The bytes of the representation the body is made of (see [`MultipartPlan::span`]).
    pub fn span(&self) -> ByteRange {
        self.plan.span()
    }

    /// Whether every part's data has gone by: further input yields nothing and
    /// [`finish`](Self::finish) closes the body.
    pub fn is_done(&self) -> bool {
        self.next_part == self.plan.parts.len()
    }
}

/// What one `push` returns, built up piece by piece; copies only once there are two pieces.
enum Output {
    Nothing,
    One(Bytes),
    Joined(BytesMut),
}

impl Output {
    fn append(self, piece: Bytes) -> Self {
        match self {
            Self::Nothing => Self::One(piece),
            Self::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + piece.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&piece);
                Self::Joined(joined)
            }
            Self::Joined(mut joined) => {
                joined.extend_from_slice(&piece);
                Self::Joined(joined)
            }
        }
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Self::Nothing => None,
            Self::One(bytes) => Some(bytes),
            Self::Joined(joined) => Some(joined.freeze()),
        }
    }
}

/// RFC 2046's `bchars` that are also `tchar`s, so the boundary needs no quotes as a parameter.
fn is_boundary(boundary: &str) -> bool {
    (1..=70).contains(&boundary.len())
        && boundary
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'\'' | b'+' | b'_' | b'-' | b'.'))
}

/// A header field value that cannot smuggle in a line break or another header.
fn is_field_value(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| matches!(b, b' ' | b'\t' | 0x21..=0x7E))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(start: u64, end: u64) -> ByteRange {
        ByteRange::new(start, end).unwrap()
    }

    /// The body as §14.6 lays it out, written independently of the plan.
    fn expected_body(
        data: &[u8],
        ranges: &[ByteRange],
        content_type: Option<&str>,
        boundary: &str,
    ) -> Vec<u8> {
        let mut body = Vec::new();
        for (index, r) in ranges.iter().enumerate() {
            if index > 0 {
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
            if let Some(content_type) = content_type {
                body.extend_from_slice(format!("Content-Type: {content_type}\r\n").as_bytes());
            }
            let last = r.end() - 1;
            let header =
                format!("Content-Range: bytes {}-{last}/{}\r\n\r\n", r.start(), data.len());
            body.extend_from_slice(header.as_bytes());
            body.extend_from_slice(&data[r.start() as usize..r.end() as usize]);
        }
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        body
    }

    fn stream(plan: MultipartPlan, stream_start: u64, chunks: &[Bytes]) -> Vec<u8> {
        let mut body = MultipartBody::new(plan, stream_start).unwrap();
        let mut out = Vec::new();
        for chunk in chunks {
            if let Some(piece) = body.push(chunk.clone()) {
                out.extend_from_slice(&piece);
            }
        }
        if let Some(tail) = body.finish() {
            out.extend_from_slice(&tail);
        }
        out
    }

    #[test]
    fn exact_format() {
        let data: Vec<u8> = (0..100).collect();
        let ranges = [range(0, 2), range(98, 100)];
        let plan = MultipartPlan::new(&ranges, 100, Some("application/pdf"), "SEP").unwrap();
        assert_eq!(plan.content_type_header(), "multipart/byteranges; boundary=SEP");
        assert_eq!(plan.span(), range(0, 100));
        let body = stream(plan.clone(), 0, &[Bytes::from(data)]);
        assert_eq!(
            body,
            b"--SEP\r\nContent-Type: application/pdf\r\n\
              Content-Range: bytes 0-1/100\r\n\r\n\x00\x01\
              \r\n--SEP\r\nContent-Type: application/pdf\r\n\
              Content-Range: bytes 98-99/100\r\n\r\n\x62\x63\
              \r\n--SEP--\r\n"
        );
        assert_eq!(plan.total_len(), body.len() as u64);

        let untyped = MultipartPlan::new(&[range(1, 2)], 3, None, "b").unwrap();
        let body = stream(untyped.clone(), 1, &[Bytes::from_static(b"bc")]);
        assert_eq!(body, b"--b\r\nContent-Range: bytes 1-1/3\r\n\r\nb\r\n--b--\r\n");
        assert_eq!(untyped.total_len(), body.len() as u64);
    }

    /// Ranges fetched apart: the input skips what lies between them, and the body is the same as
    /// from one pass over all of it.
    #[test]
    fn input_may_skip_what_lies_between_ranges() {
        let data: Vec<u8> = (0..=255).cycle().take(5000).collect();
        let ranges = [range(10, 20), range(3000, 3010), range(4990, 5000)];
        let plan = MultipartPlan::new(&ranges, 5000, None, "x").unwrap();
        let whole = stream(plan.clone(), 0, &[Bytes::from(data.clone())]);
        let mut body = MultipartBody::new(plan, 10).unwrap();
        let mut out = Vec::new();
        out.extend(body.push(Bytes::copy_from_slice(&data[10..20])).unwrap_or_default());
        // Behind the input, or over a range's bytes: refused, and nothing changes.
        assert!(matches!(body.skip_to(15), Err(MultipartError::SkipsARange { .. })));
        assert_eq!(
            body.skip_to(3005),
            Err(MultipartError::SkipsARange { from: 20, to: 3005, range: range(3000, 3010) })
        );
        body.skip_to(3000).unwrap();
        out.extend(body.push(Bytes::copy_from_slice(&data[3000..3010])).unwrap_or_default());
        body.skip_to(4990).unwrap();
        out.extend(body.push(Bytes::copy_from_slice(&data[4990..5000])).unwrap_or_default());
        out.extend(body.finish().unwrap_or_default());
        assert_eq!(out, whole);
    }

    #[test]
    fn a_chunk_inside_a_part_is_not_copied() {
        let plan =
            MultipartPlan::new(&[range(10, 1000), range(2000, 3000)], 5000, None, "x").unwrap();
        let mut body = MultipartBody::new(plan, 0).unwrap();
        // Reaches the first part: header and data joined.
        let first = body.push(Bytes::from(vec![7; 100])).unwrap();
        assert!(first.starts_with(b"--x\r\n"));
        // Wholly inside: the same buffer comes back.
        let inside = Bytes::from(vec![8; 100]);
        let out = body.push(inside.clone()).unwrap();
        assert_eq!((out.as_ptr(), out.len()), (inside.as_ptr(), inside.len()));
        // Partly inside, no header due: a slice of it.
        let straddling = Bytes::from(vec![9; 1000]);
        let out = body.push(straddling.clone()).unwrap();
        assert_eq!((out.as_ptr(), out.len()), (straddling.as_ptr(), 800));
        // Between the parts: nothing.
        assert_eq!(body.push(Bytes::from(vec![0; 500])), None);
        assert!(!body.is_done());
        assert_eq!(body.finish(), None);
        assert!(body.push(Bytes::from(vec![1; 1500])).is_some());
        assert!(body.is_done());
        assert_eq!(body.push(Bytes::from(vec![2; 10])), None);
        assert_eq!(body.finish(), Some(Bytes::from_static(b"\r\n--x--\r\n")));
        assert_eq!(body.finish(), None);
    }

    #[test]
    fn truncated_input_is_never_closed() {
        let plan = MultipartPlan::new(&[range(0, 10), range(100, 110)], 200, None, "x").unwrap();
        let mut body = MultipartBody::new(plan, 0).unwrap();
        assert!(body.push(Bytes::from(vec![0; 105])).is_some());
        assert_eq!(body.finish(), None);
        assert_eq!(body.push(Bytes::new()), None);
    }

    #[test]
    fn plans_refuse_what_cannot_be_sent() {
        let ok = [range(0, 10), range(10, 20)];
        assert!(
            MultipartPlan::new(&ok, 20, Some("text/plain; charset=utf-8"), "a'b+c_d-e.f").is_ok()
        );
        let refusal = |ranges: &[ByteRange], complete_len, content_type, boundary: &str| {
            MultipartPlan::new(ranges, complete_len, content_type, boundary).err()
        };
        use MultipartError::*;
        assert_eq!(refusal(&[], 20, None, "b"), Some(NoRanges));
        assert_eq!(refusal(&[range(5, 5)], 20, None, "b"), Some(EmptyRange(range(5, 5))));
        assert_eq!(
            refusal(&[range(0, 21)], 20, None, "b"),
            Some(RangePastEnd { range: range(0, 21), complete_len: 20 })
        );
        assert_eq!(
            refusal(&[range(5, 10), range(0, 3)], 20, None, "b"),
            Some(RangesOutOfOrder(range(0, 3)))
        );
        assert_eq!(
            refusal(&[range(0, 10), range(9, 12)], 20, None, "b"),
            Some(RangesOutOfOrder(range(9, 12)))
        );
        for boundary in ["", &"b".repeat(71), "a b", "a\"b", "a/b", "a\r\nb"] {
            assert_eq!(refusal(&ok, 20, None, boundary), Some(InvalidBoundary), "{boundary:?}");
        }
        for content_type in ["text/plain\r\nX-Evil: 1", "", "t\u{e9}xt/plain", "a\0b"] {
            let refused = refusal(&ok, 20, Some(content_type), "b");
            assert_eq!(refused, Some(InvalidContentType), "{content_type:?}");
        }
        assert_eq!(refusal(&[range(0, u64::MAX - 5)], u64::MAX, None, "b"), Some(TooLong));
        assert!(MultipartPlan::new(&[range(0, 10)], 20, None, &"b".repeat(70)).is_ok());
        let plan = MultipartPlan::new(&[range(5, 10)], 20, None, "b").unwrap();
        assert_eq!(
            MultipartBody::new(plan, 6).err(),
            Some(MultipartError::StreamStartsTooLate { stream_start: 6, first_range_start: 5 })
        );
    }

    #[test]
    fn huge_representations_plan_without_overflow() {
        let ranges = [range(0, 1), range(u64::MAX - 1000, u64::MAX - 1)];
        let plan = MultipartPlan::new(&ranges, u64::MAX, None, "b").unwrap();
        assert!(plan.total_len() > 1000);

        // Input running into and past the end of u64 offsets.
        let plan =
            MultipartPlan::new(&[range(u64::MAX - 4, u64::MAX - 1)], u64::MAX, None, "b").unwrap();
        let mut body = MultipartBody::new(plan.clone(), u64::MAX - 4).unwrap();
        let mut out = body.push(Bytes::from_static(b"ab")).unwrap().to_vec();
        out.extend_from_slice(&body.push(Bytes::from_static(b"cdefgh")).unwrap());
        assert_eq!(body.push(Bytes::from_static(b"more")), None);
        out.extend_from_slice(&body.finish().unwrap());
        assert!(out.ends_with(b"\r\n\r\nabc\r\n--b--\r\n"));
        assert_eq!(plan.total_len(), out.len() as u64);
    }

    /// Sorted, disjoint, non-empty ranges inside `0..len`.
    fn ranges_strategy(len: usize) -> impl Strategy<Value = Vec<ByteRange>> {
        proptest::collection::vec(0..=len, 2..12).prop_map(move |mut cuts| {
            cuts.sort_unstable();
            cuts.dedup();
            cuts.chunks_exact(2).map(|pair| range(pair[0] as u64, pair[1] as u64)).collect()
        })
    }

    proptest! {
        #[test]
        fn streaming_in_any_chunks_equals_the_layout(
            (data, ranges) in (1usize..400)
                .prop_flat_map(|len| {
                    (proptest::collection::vec(any::<u8>(), len), ranges_strategy(len))
                })
                .prop_filter("needs a range", |(_, ranges)| !ranges.is_empty()),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..10),
            start_pick in any::<proptest::sample::Index>(),
            typed in any::<bool>(),
        ) {
            let content_type = typed.then_some("application/octet-stream");
            let len = data.len() as u64;
            let plan = MultipartPlan::new(&ranges, len, content_type, "3d6b6a416f9b5").unwrap();
            let expected = expected_body(&data, &ranges, content_type, "3d6b6a416f9b5");
            prop_assert_eq!(plan.total_len(), expected.len() as u64);

            // Whole input at once.
            prop_assert_eq!(&stream(plan.clone(), 0, &[Bytes::from(data.clone())]), &expected);

            // Input from anywhere at or before the first range, cut anywhere.
            let stream_start = start_pick.index(ranges[0].start() as usize + 1);
            let input = Bytes::from(data[stream_start..].to_vec());
            let mut bounds: Vec<usize> =
                cuts.iter().map(|cut| cut.index(input.len() + 1)).collect();
            bounds.extend([0, input.len()]);
            bounds.sort_unstable();
            let chunks: Vec<Bytes> =
                bounds.windows(2).map(|pair| input.slice(pair[0]..pair[1])).collect();
            prop_assert_eq!(&stream(plan, stream_start as u64, &chunks), &expected);
        }
    }
}
