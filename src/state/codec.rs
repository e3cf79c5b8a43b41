//! The stored form of records: a JSON object with a format number, `{"v":1, ...fields}`.
//!
//! A reader never guesses at a format it does not know: a record of another format number reads
//! as absent, so that rangeway instances of different versions sharing one Redis (a rolling
//! upgrade) each see only what they understand. Whatever does not decode is absent too; the store
//! counts it in its health.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// The format this version of rangeway writes and reads.
pub(crate) const FORMAT: u64 = 1;

#[derive(Serialize)]
struct Envelope<'a, T> {
    v: u64,
    #[serde(flatten)]
    value: &'a T,
}

#[derive(Deserialize)]
struct Opened<T> {
    v: u64,
    #[serde(flatten)]
    value: T,
}

/// Only the format number, to tell another format from garbage.
#[derive(Deserialize)]
struct Format {
    v: u64,
}

/// What a stored value turned out to be.
#[derive(Debug)]
pub(crate) enum Decoded<T> {
    Value(T),
    /// Written in a format this version does not know.
    OtherFormat(u64),
    /// Not a record of any format.
    Invalid(serde_json::Error),
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<String, StoreError> {
    // The model's types always serialise; an error would be a bug here, reported, not a panic.
    serde_json::to_string(&Envelope { v: FORMAT, value })
        .map_err(|e| StoreError::Corrupt(format!("cannot encode a record: {e}")))
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Decoded<T> {
    match serde_json::from_slice::<Opened<T>>(bytes) {
        Ok(Opened { v: FORMAT, value }) => Decoded::Value(value),
        Ok(Opened { v, .. }) => Decoded::OtherFormat(v),
        // Another format may also have another shape: look at its number before calling it
        // garbage.
        Err(err) => match serde_json::from_slice::<Format>(bytes) {
            Ok(Format { v }) if v != FORMAT => Decoded::OtherFormat(v),
            _ => Decoded::Invalid(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rangeway_middleware::ByteRange;

    use super::*;
    use crate::state::model::{Delivery, DownloadSession, Ending, ObjectRecord, ObjectVersion};

    fn session() -> DownloadSession {
        let version = ObjectVersion {
            etag: Some("\"abc\"".to_owned()),
            strong: true,
            size: 1 << 40,
            last_modified: None,
            content_type: Some("text/plain; charset=\"utf-8\"\n".to_owned()),
        };
        let mut delivery = Delivery {
            id: "id with \"quotes\", \\ and \u{1F600}".to_owned(),
            object: "files|/a b.bin".to_owned(),
            route: "files".to_owned(),
            client: "[::1]:5000".to_owned(),
            origin_version: version.clone(),
            version,
            range: ByteRange::new(0, 100).expect("valid"),
            ending: Ending::Cut,
            bytes: 100,
            now: 1_700_000_000,
        };
        let s = DownloadSession::begin(&delivery);
        delivery.range = ByteRange::new(1 << 39, 1 << 40).expect("valid");
        DownloadSession::record(Some(s), &delivery)
    }

    fn decoded<T: DeserializeOwned>(text: &str) -> Decoded<T> {
        decode(text.as_bytes())
    }

    #[test]
    fn records_round_trip_with_their_format_number() {
        let s = session();
        let text = encode(&s).expect("encode");
        assert!(text.starts_with("{\"v\":1,"), "{text}");
        assert!(text.contains("\"sent\":[[0,100],[549755813888,1099511627776]]"), "{text}");
        match decoded::<DownloadSession>(&text) {
            Decoded::Value(back) => assert_eq!(back, s),
            other => panic!("{other:?}"),
        }
        let version = s.versions[0].version.clone();
        let mut record = ObjectRecord::new("files|/a", &version, 5);
        record.observe(&ObjectVersion { etag: None, ..version.clone() }, 6);
        match decoded::<ObjectRecord>(&encode(&record).expect("encode")) {
            Decoded::Value(back) => assert_eq!(back, record),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_format_reads_as_absent_whatever_its_shape() {
        let s = session();
        let v2 = encode(&s).expect("encode").replacen("\"v\":1", "\"v\":2", 1);
        assert!(matches!(decoded::<DownloadSession>(&v2), Decoded::OtherFormat(2)));
        let reshaped = r#"{"v":7,"sessions":{"a":[1,2,3]}}"#;
        assert!(matches!(decoded::<DownloadSession>(reshaped), Decoded::OtherFormat(7)));
    }

    #[test]
    fn garbage_is_invalid() {
        let valid = encode(&session()).expect("encode");
        let truncated = &valid[..valid.len() / 2];
        let without_format = valid.replacen("\"v\":1,", "", 1);
        let bad_intervals = valid.replacen("[[0,100],", "[[100,0],", 1);
        assert_ne!(bad_intervals, valid);
        let negative_size = valid.replacen("\"size\":1099511627776", "\"size\":-1", 1);
        for garbage in [
            "",
            "null",
            "[]",
            "{}",
            "\u{0}\u{1}binary",
            "{\"v\":\"1\"}",
            "{\"v\":1}",
            "{\"v\":1.5}",
            truncated,
            &without_format,
            &bad_intervals,
            &negative_size,
        ] {
            assert!(
                matches!(decoded::<DownloadSession>(garbage), Decoded::Invalid(_)),
                "{garbage:?} was not invalid"
            );
        }
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode::<DownloadSession>(&bytes);
            let _ = decode::<ObjectRecord>(&bytes);
        }

        #[test]
        fn decoding_mangled_records_never_panics(cut in 0usize..400, byte in any::<u8>()) {
            let mut text = encode(&session()).expect("encode").into_bytes();
            if let Some(b) = text.get_mut(cut) {
                *b = byte;
            }
            let _ = decode::<DownloadSession>(&text);
        }
    }
}
