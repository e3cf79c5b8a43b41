//! The parts of RFC 9110 (HTTP Semantics) rangeway implements itself: `Range` (§14.1–14.2),
//! `Content-Range` (§14.4), `multipart/byteranges` (§14.6), entity tags (§8.8.3), conditional
//! requests (§13) and connection options (§7.6.1).
//!
//! Everything here is a pure function of header bytes, lengths and validators: no panic, no
//! overflow and no unbounded work for any input (the parsers are fuzzed, see `fuzz/`).
//!
//! # Choices this module makes
//!
//! **Ignored (200, the whole representation) rather than 416.** A `Range` header is ignored when
//! its unit is not `bytes` (§14.2 requires it), when any one of its range-specs is syntactically
//! invalid — reversed (`5-2`), signs, spaces inside a spec, digits that overflow `u64`, garbage
//! (§14.1.1: the whole field goes) — when it has more specs than [`RangeLimits::max_ranges`], or
//! when it is longer than [`RangeLimits::max_header_len`] (§14.2 lets a server ignore Range for any
//! reason, and names many ranges as a denial-of-service sign). A 200 is always a correct answer.
//!
//! **416 only for a valid, unsatisfiable set.** 416 with `Content-Range: bytes */len` is the answer
//! only when the header is valid but none of its specs selects a byte (§14.1.1, §15.5.17): every
//! `first` at or past the end, or every suffix `-0`. An empty representation satisfies no range at
//! all — RFC 9110 counts a non-zero suffix as satisfiable there, but no 206 can state an empty
//! range — so it gets 416 and `bytes */0` (see [`RangeSpec::resolve`]).
//!
//! **Coalescing.** Satisfiable ranges are sorted, then any two that overlap, touch, or lie less
//! than 80 bytes (about a part's headers) apart are merged (§14.2 allows it regardless of their
//! order). One range left is a plain 206; more make a `multipart/byteranges` body whose parts
//! come in ascending order — §14.6 says a server SHOULD keep the request's order, but one ascending
//! pass over the upstream bytes is what streaming without buffering needs, and clients must read
//! each part's `Content-Range` anyway. Merging overlaps is the defence against CVE-2011-3192
//! (`bytes=0-,0-,0-,…`): the body is never larger than the representation plus part headers.
//!
//! **Unreadable preconditions fail safe.** An invalid `If-Match` matches nothing (412); an invalid
//! `If-None-Match` matches nothing (the full response goes out, never a 304); invalid dates, and
//! lists of dates, are ignored as §13.1.3–4 require. See [`evaluate_preconditions`].
//!
//! **If-Range holds only on strong evidence.** An entity tag must match strongly; a date must
//! equal `Last-Modified`, that `Last-Modified` must be at least 60 s old (§8.8.2.2), and the
//! representation must have no entity tag the client could have sent instead. Anything else,
//! malformed values included, serves the whole representation. See [`if_range_holds`].

mod conditional;
mod connection;
mod content_range;
mod etag;
mod multipart;
mod range;
mod syntax;

pub use conditional::{Precondition, Validators, evaluate_preconditions, if_range_holds};
pub use connection::{HOP_BY_HOP, connection_options};
pub use content_range::{
    ContentRange, content_range, parse_content_range, unsatisfied_content_range,
};
pub use etag::{EntityTag, EntityTagList};
pub use multipart::{MultipartBody, MultipartError, MultipartPlan};
pub use range::{
    IgnoreReason, RangeLimits, RangeRequest, RangeSet, RangeSpec, Resolution, parse_range,
    parse_range_header,
};
