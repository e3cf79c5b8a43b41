//! What an expired authorization — a signed link, a presigned S3 URL — still lets through within
//! its route's grace: the rest of a download that began before it expired, never a new one. An
//! id that fetched one byte in time must not be a way to start whole downloads afterwards. Pure:
//! the session is what the store knew as the request came.

use crate::range::ClientRange;
use crate::state::DownloadSession;

/// Whether a request for `range`, under the download whose session is `session`, continues that
/// download after what authorized it expired at `expires` (Unix seconds): the download began by
/// then, and every range asked for starts at a byte of one version sent to it, or right after
/// one — neither at byte 0 (a new download) nor beyond what was begun (a piece never fetched).
///
/// A suffix range starts where the version's length puts it. What the session forgot or had no
/// room to record (`DownloadSession::forgot`, `VersionSent::overflowed`) is not taken as sent:
/// past the expiry, only what is known to have begun goes on.
pub(super) fn continues_download(
    session: Option<&DownloadSession>,
    expires: u64,
    range: &ClientRange,
) -> bool {
    let (Some(session), ClientRange::Bytes(ranges)) = (session, range) else { return false };
    session.started_at <= expires
        && session.versions.iter().any(|sent| {
            ranges.specs().iter().all(|spec| {
                spec.resolve(sent.version.size).is_some_and(|asked| {
                    let start = asked.start();
                    start > 0 && (sent.sent.contains(start) || sent.sent.contains(start - 1))
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use rangeway_middleware::ByteRange;
    use rangeway_middleware::rfc9110::{RangeSet, RangeSpec};

    use super::*;
    use crate::state::{Delivery, Ending, ObjectVersion};

    const EXPIRES: u64 = 1_000;

    fn version(etag: &str) -> ObjectVersion {
        ObjectVersion {
            etag: Some(format!("\"{etag}\"")),
            strong: true,
            size: 10_000,
            last_modified: None,
            content_type: None,
        }
    }

    fn delivery(version: &ObjectVersion, start: u64, end: u64, now: u64) -> Delivery {
        Delivery {
            id: "dl".to_owned(),
            object: "route|/a".to_owned(),
            route: "route".to_owned(),
            client: "192.0.2.1".to_owned(),
            version: version.clone(),
            origin_version: version.clone(),
            range: ByteRange::new(start, end).expect("a range"),
            ending: Ending::Cut,
            bytes: end - start,
            now,
        }
    }

    fn ranges(specs: &[RangeSpec]) -> ClientRange {
        ClientRange::Bytes(RangeSet::new(specs.to_vec()).expect("ranges"))
    }

    fn from(first: u64) -> ClientRange {
        ranges(&[RangeSpec::From { first }])
    }

    #[test]
    fn only_what_began_goes_on() {
        // One byte fetched in time.
        let session = DownloadSession::begin(&delivery(&version("a"), 0, 1, EXPIRES - 10));
        let continues = |range: &ClientRange| continues_download(Some(&session), EXPIRES, range);
        assert!(continues(&from(1)), "the rest of the byte begun");
        assert!(!continues(&from(0)), "the whole object again");
        assert!(!continues(&from(5_000)), "bytes never begun");
        assert!(!continues(&ranges(&[RangeSpec::Closed { first: 0, last: 99 }])));
        assert!(!continues(&ranges(&[RangeSpec::Suffix { len: 100 }])));
        assert!(!continues(&ClientRange::Absent), "no range: a new download");
        assert!(!continues_download(None, EXPIRES, &from(1)), "no session: nothing began");
    }

    #[test]
    fn pieces_begun_go_on_and_others_do_not() {
        let a = version("a");
        let mut session = DownloadSession::begin(&delivery(&a, 0, 2_000, EXPIRES - 10));
        session.record_in_place(&delivery(&a, 6_000, 7_000, EXPIRES - 5));
        let continues = |range: &ClientRange| continues_download(Some(&session), EXPIRES, range);
        for first in [1, 1_000, 2_000, 6_000, 6_500, 7_000] {
            assert!(continues(&from(first)), "from {first}");
        }
        for first in [2_001, 5_999, 7_001] {
            assert!(!continues(&from(first)), "from {first}");
        }
        let both = [
            RangeSpec::Closed { first: 1_500, last: 1_999 },
            RangeSpec::Closed { first: 6_500, last: 9_999 },
        ];
        assert!(continues(&ranges(&both)));
        let one_new =
            [RangeSpec::Closed { first: 1_500, last: 1_999 }, RangeSpec::From { first: 8_000 }];
        assert!(!continues(&ranges(&one_new)), "every range must continue one begun");
        // The suffix of the last 3 000 bytes starts at 7 000, right after the second piece.
        assert!(continues(&ranges(&[RangeSpec::Suffix { len: 3_000 }])));
    }

    #[test]
    fn a_download_begun_after_the_expiry_does_not_go_on() {
        let session = DownloadSession::begin(&delivery(&version("a"), 0, 2_000, EXPIRES + 1));
        assert!(!continues_download(Some(&session), EXPIRES, &from(1_000)));
        // Bytes sent within the grace, to a download begun in time, are part of what began.
        let mut session = DownloadSession::begin(&delivery(&version("a"), 0, 1, EXPIRES));
        session.record_in_place(&delivery(&version("a"), 1, 4_000, EXPIRES + 60));
        assert!(continues_download(Some(&session), EXPIRES, &from(4_000)));
    }

    #[test]
    fn any_version_sent_may_be_the_one_continued() {
        let mut session = DownloadSession::begin(&delivery(&version("a"), 0, 100, EXPIRES - 10));
        session.record_in_place(&delivery(&version("b"), 0, 5_000, EXPIRES - 5));
        let continues = |first| continues_download(Some(&session), EXPIRES, &from(first));
        assert!(continues(50) && continues(5_000));
        assert!(!continues(5_001));
    }
}
