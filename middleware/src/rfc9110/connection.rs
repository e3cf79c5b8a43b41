//! Connection options (RFC 9110 §7.6.1): the fields a message's `Connection` names concern its
//! connection only, and an intermediary removes them with `Connection` itself before it forwards
//! the message — or stores it, since a stored answer is forwarded later.

use http::{HeaderMap, HeaderName, header};

/// The fields that describe one connection, not the message, whatever `Connection` says
/// (RFC 9110 §7.6.1; `Proxy-Connection`, never standard, is still sent). Names, not strings: a
/// map finds a `HeaderName` without parsing it again. `Connection` first, whose list names more.
pub static HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// The field names `headers`' `Connection` fields list, in order; tokens that are not field
/// names (`close`, empty list items) are among them only when they parse as one, which removes
/// nothing a message has.
pub fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = HeaderName> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
        .filter_map(|token| HeaderName::from_bytes(token.trim_ascii()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_field_line_and_list_item_is_read() {
        let mut headers = HeaderMap::new();
        headers.append(header::CONNECTION, "close, X-Foo ,, keep-alive".parse().unwrap());
        headers.append(header::CONNECTION, "x-bar".parse().unwrap());
        headers.append("x-foo", "1".parse().unwrap());
        let named: Vec<_> = connection_options(&headers).collect();
        assert_eq!(named, ["close", "x-foo", "keep-alive", "x-bar"]);
        assert_eq!(connection_options(&HeaderMap::new()).count(), 0);
    }

    #[test]
    fn tokens_that_are_no_field_name_name_nothing() {
        let mut headers = HeaderMap::new();
        headers.append(header::CONNECTION, "a b, \"quoted\", ok".parse().unwrap());
        let named: Vec<_> = connection_options(&headers).collect();
        assert_eq!(named, ["ok"]);
    }
}
