//! The few lexical rules of RFC 9110 §5.6 that the header parsers share.

/// Strips optional whitespace (`OWS = *( SP / HTAB )`, §5.6.3) from both ends.
///
/// Deliberately not `trim_ascii`: CR, LF and FF are not whitespace in a field value, and a value
/// that carries them must fail to parse rather than be silently cleaned up.
pub(super) fn trim_ows(value: &[u8]) -> &[u8] {
    trim_ows_end(trim_ows_start(value))
}

pub(super) fn trim_ows_start(value: &[u8]) -> &[u8] {
    let skip = value.iter().take_while(|&&b| is_ows(b)).count();
    &value[skip..]
}

fn trim_ows_end(value: &[u8]) -> &[u8] {
    let keep = value.len() - value.iter().rev().take_while(|&&b| is_ows(b)).count();
    &value[..keep]
}

pub(super) const fn is_ows(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

/// `token = 1*tchar` (§5.6.2).
pub(super) fn is_token(value: &[u8]) -> bool {
    !value.is_empty() && value.iter().all(|&b| is_tchar(b))
}

const fn is_tchar(byte: u8) -> bool {
    matches!(byte,
        b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`'
        | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
}

/// `1*DIGIT` as a `u64`; `None` for an empty string, any other byte (signs included), or a value
/// that does not fit. Leading zeros are allowed, as the grammar allows them, and cost nothing.
pub(super) fn parse_digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &byte| {
        let digit = match byte {
            b'0'..=b'9' => u64::from(byte - b'0'),
            _ => return None,
        };
        value.checked_mul(10)?.checked_add(digit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ows_is_only_space_and_tab() {
        assert_eq!(trim_ows(b" \t a b\t "), b"a b");
        assert_eq!(trim_ows(b"\r\na"), b"\r\na");
        assert_eq!(trim_ows(b"   "), b"");
        assert_eq!(trim_ows_start(b" a "), b"a ");
    }

    #[test]
    fn digits() {
        assert_eq!(parse_digits(b"0"), Some(0));
        assert_eq!(parse_digits(b"000123"), Some(123));
        assert_eq!(parse_digits(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_digits(b"18446744073709551616"), None);
        assert_eq!(parse_digits(b"99999999999999999999"), None);
        for bad in [&b""[..], b"+1", b"-1", b"1 ", b"1a", b"\xd9\xa1"] {
            assert_eq!(parse_digits(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tokens() {
        assert!(is_token(b"bytes"));
        assert!(is_token(b"x-custom.unit~1"));
        assert!(!is_token(b""));
        assert!(!is_token(b"by tes"));
        assert!(!is_token(b"a/b"));
    }
}
