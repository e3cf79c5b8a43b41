//! What a response to a ranged GET says, checked against what was asked. Sans-I/O.

use std::time::Duration;

use rangeway_middleware::rfc9110::{ContentRange, EntityTag, parse_content_range};

use crate::control::Version;
use crate::http1::Head;

/// The body of a response, as its head describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A 206 of `[start, end)` of an object of `complete` bytes.
    Part { start: u64, end: u64, complete: u64 },
    /// A 200: the whole object (`None`: of a length the server does not say).
    Whole(Option<u64>),
    /// A 416: the range asked is not in an object of this length.
    Unsatisfiable(Option<u64>),
}

/// The answer `head` (a 200, 206 or 416) gives, or why it cannot be believed.
pub(crate) fn answer(head: &Head) -> Result<Answer, String> {
    let content_range = head.get("content-range").map(|v| parse_content_range(v.as_bytes()));
    let content_length = match head.get("content-length") {
        Some(v) => Some(v.trim().parse::<u64>().map_err(|_| format!("Content-Length {v:?}"))?),
        None => None,
    };
    match head.status {
        206 => {
            let Some(Some(ContentRange::Satisfied { range, complete_len: Some(complete) })) =
                content_range
            else {
                return Err(match head.get("content-range") {
                    Some(value) => format!(
                        "a 206 with Content-Range {value:?} (a single range of a known length was asked for)"
                    ),
                    None => "a 206 without Content-Range".into(),
                });
            };
            let (start, end) = (range.start(), range.end());
            if end > complete {
                return Err(format!(
                    "Content-Range bytes {start}-{}/{complete} reaches past the object",
                    end - 1
                ));
            }
            if content_length.is_some_and(|length| length != end - start) {
                return Err(format!(
                    "Content-Length {} for Content-Range bytes {start}-{}/{complete} ({} bytes)",
                    content_length.unwrap_or_default(),
                    end - 1,
                    end - start
                ));
            }
            Ok(Answer::Part { start, end, complete })
        }
        200 => Ok(Answer::Whole(content_length)),
        416 => Ok(Answer::Unsatisfiable(match content_range {
            Some(Some(ContentRange::Unsatisfied { complete_len })) => Some(complete_len),
            _ => None,
        })),
        status => Err(format!("status {status}")),
    }
}

/// The version `head` describes, for an object of `length` bytes: its ETag when strong, its
/// Last-Modified when a client may hold it strong (RFC 9110 §8.8.2.2: the response's Date is at
/// least a second later).
pub(crate) fn version(head: &Head, length: u64) -> Version {
    let etag = head
        .get("etag")
        .filter(|v| EntityTag::parse(v.as_bytes()).is_some_and(|tag| !tag.is_weak()))
        .map(str::to_owned);
    let date = |name| head.get(name).and_then(|v| httpdate::parse_http_date(v).ok());
    let last_modified = match (date("last-modified"), date("date")) {
        (Some(modified), Some(date))
            if date.duration_since(modified).is_ok_and(|d| d >= Duration::from_secs(1)) =>
        {
            head.get("last-modified").map(str::to_owned)
        }
        _ => None,
    };
    Version { length, etag, last_modified }
}

/// Whether `head` is of `version` (by the validator the client pinned it with).
pub(crate) fn same_version(head: &Head, version: &Version) -> bool {
    match (&version.etag, head.get("etag")) {
        (Some(ours), Some(theirs)) => ours == theirs,
        (Some(_), None) => false,
        (None, _) => version.last_modified.as_deref() == head.get("last-modified"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_206_must_say_one_range_of_a_known_length_that_adds_up() {
        let part =
            Head::new(206, &[("Content-Range", "bytes 10-19/100"), ("Content-Length", "10")]);
        assert_eq!(answer(&part), Ok(Answer::Part { start: 10, end: 20, complete: 100 }));
        for bad in [
            Head::new(206, &[("Content-Range", "bytes 10-19/*")]),
            Head::new(206, &[("Content-Range", "bytes 10-19/100"), ("Content-Length", "9")]),
            Head::new(206, &[("Content-Range", "bytes 90-109/100")]),
            Head::new(206, &[]),
        ] {
            assert!(answer(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(answer(&Head::new(200, &[("Content-Length", "5")])), Ok(Answer::Whole(Some(5))));
        assert_eq!(answer(&Head::new(200, &[])), Ok(Answer::Whole(None)));
        let empty = Head::new(416, &[("Content-Range", "bytes */0")]);
        assert_eq!(answer(&empty), Ok(Answer::Unsatisfiable(Some(0))));
    }

    #[test]
    fn only_strong_validators_pin_a_version() {
        let strong = Head::new(200, &[("ETag", "\"v1\"")]);
        assert_eq!(version(&strong, 5).validator(), Some("\"v1\""));
        let weak = Head::new(200, &[("ETag", "W/\"v1\"")]);
        assert_eq!(version(&weak, 5).validator(), None);
        let modified = "Tue, 01 Dec 2026 10:00:00 GMT";
        let later = Head::new(
            200,
            &[("Last-Modified", modified), ("Date", "Tue, 01 Dec 2026 10:00:01 GMT")],
        );
        assert_eq!(version(&later, 5).validator(), Some(modified));
        let same_second = Head::new(200, &[("Last-Modified", modified), ("Date", modified)]);
        assert_eq!(
            version(&same_second, 5).validator(),
            None,
            "may have changed within its second"
        );
        assert!(same_version(&strong, &version(&strong, 5)));
        assert!(!same_version(&Head::new(206, &[("ETag", "\"v2\"")]), &version(&strong, 5)));
    }
}
