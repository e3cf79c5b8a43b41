//! Signed links: a route that requires them serves a path only to a URL that carries an
//! HMAC-SHA-256 signature over the path, the origin's query parameters, an expiry, and optionally
//! a client address prefix and a download id, made with one of the route's keys (`rangeway sign`
//! makes them).
//!
//! ```text
//! /files/a.iso?versionId=3&rw-expires=1767225600&rw-key=2026-12&rw-sig=BASE64URL
//!              [&rw-client=203.0.113.0/24][&rw-id=ID]
//! signature = HMAC-SHA-256(key, "rangeway-link-v2\n" PATH "\n" EXPIRES "\n" CLIENT "\n" ID "\n" QUERY)
//! ```
//!
//! PATH is the path as rangeway normalises it (percent-decoded, dot segments resolved), so a
//! client that re-encodes the URL keeps a valid link. QUERY is the link's query as the origin
//! will read it, in a canonical form ([`canonical_query`]): without the `rw-` parameters (never
//! forwarded), each part's percent-encoding normalised, the parameters sorted by name. So a
//! parameter changed, added or removed — an S3 `versionId`, a `response-content-disposition` —
//! breaks the signature, and a client that re-encodes the query does not.
//!
//! Links of the first format (`rangeway-link-v1`, which signed no query) are still taken while
//! they carry no query parameter of the origin's: with one, nothing says it was the signer's.
//!
//! What to do with an expired link — refuse it, or let a download that began before the expiry
//! resume — is the proxy's decision (`proxy/mod.rs`): here, only what the link says and whether
//! it is genuine. Pure: no I/O, no clock (the time is an argument).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::ip_net::IpNet;
use crate::values::Problem;
use crate::values::secret::KeyFile;

/// A route that serves only signed links (`crate::links`); the key file's last line signs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SignedLinks {
    pub keys: LinkKeys,
    pub grace: Duration,
}

/// The query parameters of a signed link. All begin with `rw-`, which is how they are told from
/// the origin's own parameters (and never forwarded to it).
pub const EXPIRES: &str = "rw-expires";
pub const KEY: &str = "rw-key";
pub const SIGNATURE: &str = "rw-sig";
pub const CLIENT: &str = "rw-client";
pub const ID: &str = "rw-id";
const PREFIX: &str = "rw-";

const CONTEXT: &str = "rangeway-link-v2";
/// Shorter than this, a link key could be guessed.
const MIN_KEY_LEN: usize = 32;
/// The first format's: links signed before the query was.
const CONTEXT_V1: &str = "rangeway-link-v1";

/// A route's link keys, by id; the newest signs new links. Zeroed when dropped; `Debug` shows
/// the ids only.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkKeys {
    keys: BTreeMap<String, Zeroizing<String>>,
    newest: String,
}

impl std::fmt::Debug for LinkKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkKeys").field("ids", &self.keys.keys()).finish()
    }
}

impl LinkKeys {
    /// `keys` (id, secret) in the order of their file; the last is the newest. `None` when
    /// there is none.
    pub fn new<'a>(keys: impl IntoIterator<Item = (String, &'a str)>) -> Option<Self> {
        let keys: Vec<_> = keys.into_iter().collect();
        let newest = keys.last()?.0.clone();
        let keys = keys.into_iter().map(|(id, key)| (id, Zeroizing::new(key.to_owned())));
        Some(Self { keys: keys.collect(), newest })
    }

    /// The keys of a route's `keys_file`: a `KEY_ID SECRET` line each, the newest last.
    pub(crate) fn read_file(file: &str) -> Result<Self, Problem> {
        let kind = KeyFile {
            pair: "a `KEY_ID SECRET`",
            fix: "write one `KEY_ID SECRET` pair per line, the newest last (e.g. \
                  `echo \"$(date +%Y-%m) $(openssl rand -hex 32)\" >> FILE`)",
            unreadable_fix: "point keys_file at a readable file of link keys",
            check: |id, secret| {
                if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                    Some("has a key id of other than letters, digits, '-', '_' and '.'".to_owned())
                } else if secret.len() < MIN_KEY_LEN
                    || !secret.bytes().all(|b| b.is_ascii_graphic())
                {
                    Some(format!("has a secret of fewer than {MIN_KEY_LEN} printable characters"))
                } else {
                    None
                }
            },
        };
        let keys = kind.read(file)?;
        let newest = keys.last().map(|(id, _)| id.clone()).unwrap_or_default();
        let keys = keys.into_iter().map(|(id, key)| (id, Zeroizing::new(key.expose().to_owned())));
        // A key file holds at least one key, so there is a newest one.
        Ok(Self { keys: keys.collect(), newest })
    }

    /// The id of the key `rangeway sign` uses.
    pub fn newest(&self) -> &str {
        &self.newest
    }

    fn get(&self, id: &str) -> Option<&str> {
        self.keys.get(id).map(|key| key.as_str())
    }
}

/// What a link is for, beyond its path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkTerms {
    /// Unix seconds after which new downloads are refused.
    pub expires: u64,
    /// An address or prefix (`203.0.113.7`, `203.0.113.0/24`, `2001:db8::/32`) the client must be in.
    pub client: Option<String>,
    /// The download id the link is for.
    pub id: Option<String>,
}

/// A genuine link's terms, and whether they ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub terms: LinkTerms,
    pub expired: bool,
}

/// Why a link is refused (403).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    #[error("this path needs a signed link")]
    Missing,
    #[error("the link's parameters are malformed")]
    Malformed,
    #[error("the link was signed with a key this route does not have")]
    UnknownKey,
    #[error("the link's signature does not match it")]
    BadSignature,
    #[error("the link is for other client addresses")]
    OtherClient,
}

impl LinkError {
    /// Its name in `rangeway_links_refused_total{reason}`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::OtherClient => "other_client",
        }
    }
}

/// Why `rangeway sign` cannot make a link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    #[error("the route's keys file has no key {0}")]
    UnknownKey(String),
    #[error("the parameter {0} is a signed link's own: the link's terms have options of their own")]
    LinkParameter(String),
    #[error("{0:?} cannot stand in a URL's query as it is: percent-encode it ({1})")]
    Unencoded(char, String),
    #[error("a % not followed by two hex digits: write a % itself as %25")]
    BadEscape,
}

/// The query that signs `path`, the origin's parameters `query` (as they will be written in the
/// URL, percent-encoded, without `?`; may be empty) and `terms` under key `key_id` of `keys`:
/// `query` followed by the link's parameters, without `?`.
pub fn sign(
    keys: &LinkKeys,
    key_id: &str,
    path: &str,
    query: &str,
    terms: &LinkTerms,
) -> Result<String, SignError> {
    for pair in query.split('&') {
        if is_link_parameter(pair) {
            let name = pair.split_once('=').map_or(pair, |(name, _)| name);
            return Err(SignError::LinkParameter(name.to_owned()));
        }
    }
    if let Some(c) = query.chars().find(|c| !is_query_char(*c)) {
        let encoded = encode(&c.to_string());
        return Err(SignError::Unencoded(c, encoded));
    }
    let covered = canonical_query(query).map_err(|_| SignError::BadEscape)?;
    let key = keys.get(key_id).ok_or_else(|| SignError::UnknownKey(key_id.to_owned()))?;
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(mac(key, path, terms, Some(&covered)).finalize().into_bytes());
    let mut signed = query.to_owned();
    if !signed.is_empty() {
        signed.push('&');
    }
    signed.push_str(&format!("{EXPIRES}={}&{KEY}={}", terms.expires, encode(key_id)));
    for (name, value) in [(CLIENT, &terms.client), (ID, &terms.id)] {
        if let Some(value) = value {
            signed.push_str(&format!("&{name}={}", encode(value)));
        }
    }
    signed.push_str(&format!("&{SIGNATURE}={signature}"));
    Ok(signed)
}

/// The link `query` makes of `path` for a client at `client`, checked with `keys` at `now`
/// (Unix seconds).
pub fn verify(
    keys: &LinkKeys,
    path: &str,
    query: Option<&str>,
    client: Option<IpAddr>,
    now: u64,
) -> Result<Link, LinkError> {
    let mut params = Params::default();
    for (name, value) in query.into_iter().flat_map(|q| q.split('&')).filter_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        Some((name, percent_encoding::percent_decode_str(value).decode_utf8().ok()?))
    }) {
        let slot = match name {
            EXPIRES => &mut params.expires,
            KEY => &mut params.key,
            SIGNATURE => &mut params.signature,
            CLIENT => &mut params.client,
            ID => &mut params.id,
            _ => continue,
        };
        if slot.replace(value.into_owned()).is_some() {
            // A parameter given twice: which one was signed?
            return Err(LinkError::Malformed);
        }
    }
    let any = params.expires.is_some() || params.key.is_some() || params.signature.is_some();
    let (Some(expires), Some(key_id), Some(signature)) =
        (params.expires, params.key, params.signature)
    else {
        return Err(if any { LinkError::Malformed } else { LinkError::Missing });
    };
    let expires = expires.parse::<u64>().map_err(|_| LinkError::Malformed)?;
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| LinkError::Malformed)?;
    let covered = canonical_query(query.unwrap_or_default())?;
    let key = keys.get(&key_id).ok_or(LinkError::UnknownKey)?;
    let terms = LinkTerms { expires, client: params.client, id: params.id };
    let signed = |covered| mac(key, path, &terms, covered).verify_slice(&signature).is_ok();
    if !(signed(Some(&covered)) || (covered.is_empty() && signed(None))) {
        return Err(LinkError::BadSignature);
    }
    if let Some(prefix) = &terms.client
        && !client.is_some_and(|ip| prefix_contains(prefix, ip))
    {
        return Err(LinkError::OtherClient);
    }
    Ok(Link { expired: now > terms.expires, terms })
}

/// The origin's part of a link's `query` as its signature covers it: the parameters that are not
/// the link's own, each name and value with its percent-encoding normalised ([`normalise`]),
/// sorted by name — stably: an origin may read the first of two values of one name, or the last,
/// so their order is signed. Empty pairs (`a=1&&b=2`) carry nothing and are left out; a name
/// without `=` is kept apart from one with an empty value. Malformed when a `%` is not followed
/// by two hex digits: no origin reads that one way only.
pub fn canonical_query(query: &str) -> Result<String, LinkError> {
    let mut params = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty() && !is_link_parameter(pair)) {
        let (name, value) = match pair.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (pair, None),
        };
        params.push((normalise(name)?, value.map(normalise).transpose()?));
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let mut canonical = String::new();
    for (name, value) in params {
        if !canonical.is_empty() {
            canonical.push('&');
        }
        canonical.push_str(&name);
        if let Some(value) = value {
            canonical.push('=');
            canonical.push_str(&value);
        }
    }
    Ok(canonical)
}

/// One name or value of a query with its percent-encoding normalised, so that encodings a
/// client may choose between sign the same: every byte, whether written as it is or as `%XX`, is
/// written as it is when it is one a query carries unencoded and without meaning to any parser
/// (letters, digits, `-._~!$'()*,:@/?`), and as `%XX` in upper case otherwise (`%20`, `%C3%A9`).
/// Three bytes keep the form they came in: `+` (a space to form parsers), `=` and `;`
/// (separators to some), whose encoded and unencoded forms an origin may read apart.
fn normalise(part: &str) -> Result<String, LinkError> {
    const KEEP_FORM: &[u8] = b"+=;";
    let bytes = part.as_bytes();
    let mut normal = String::with_capacity(part.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        let (value, escaped) = match byte {
            b'%' => {
                let hex = bytes.get(at + 1..at + 3).and_then(|h| std::str::from_utf8(h).ok());
                let value = hex
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or(LinkError::Malformed)?;
                at += 3;
                (value, true)
            }
            _ => {
                at += 1;
                (byte, false)
            }
        };
        let plain = if KEEP_FORM.contains(&value) {
            !escaped
        } else {
            value.is_ascii_alphanumeric() || b"-._~!$'()*,:@/?".contains(&value)
        };
        if plain {
            normal.push(char::from(value));
        } else {
            normal.push_str(&format!("%{value:02X}"));
        }
    }
    Ok(normal)
}

/// Whether `c` may stand unencoded in a URL's query (RFC 3986 §3.4), `%` included for its
/// escapes.
fn is_query_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/?%".contains(c)
}

/// Whether a query's `pair` is one of a link's parameters (which never reach the origin).
fn is_link_parameter(pair: &str) -> bool {
    pair.starts_with(PREFIX)
}

/// `query` without a link's parameters: what goes upstream.
pub fn without_link(query: &str) -> String {
    query.split('&').filter(|pair| !is_link_parameter(pair)).collect::<Vec<_>>().join("&")
}

/// `path_and_query` with a link's signature shortened to its first 4 characters, for logs: enough
/// to tell links apart, too little to use one. Found when written: an access line that is not
/// written (or a trace not sampled) does not look for the signature.
pub fn redacted(path_and_query: &str) -> Redacted<'_> {
    Redacted(path_and_query)
}

/// A request target as [`redacted`] writes it. No `Debug`: it would print the signature.
#[derive(Clone, Copy)]
pub struct Redacted<'a>(&'a str);

impl std::fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MARKER: &str = "rw-sig=";
        let target = self.0;
        let Some(at) = target.find(MARKER) else {
            return f.write_str(target);
        };
        let start = at + MARKER.len();
        let end = target[start..].find('&').map_or(target.len(), |i| start + i);
        let kept = target[start..end].char_indices().nth(4).map_or(end, |(i, _)| start + i);
        write!(f, "{}…{}", &target[..kept], &target[end..])
    }
}

#[derive(Default)]
struct Params {
    expires: Option<String>,
    key: Option<String>,
    signature: Option<String>,
    client: Option<String>,
    id: Option<String>,
}

/// The MAC of a link over the canonical query `covered`; `None`: of the first format's link,
/// which covered no query.
fn mac(key: &str, path: &str, terms: &LinkTerms, covered: Option<&str>) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256>>::new_from_slice(key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    let client = terms.client.as_deref().unwrap_or("");
    let id = terms.id.as_deref().unwrap_or("");
    let expires = terms.expires;
    let message = match covered {
        Some(query) => format!("{CONTEXT}\n{path}\n{expires}\n{client}\n{id}\n{query}"),
        None => format!("{CONTEXT_V1}\n{path}\n{expires}\n{client}\n{id}"),
    };
    mac.update(message.as_bytes());
    mac
}

fn encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Whether `text` is an address (`203.0.113.7`) or a CIDR prefix (`203.0.113.0/24`).
pub fn is_prefix(text: &str) -> bool {
    IpNet::covering(text).is_some()
}

/// Whether `ip` is in `prefix` (see [`is_prefix`]). A prefix that does not parse contains
/// nothing.
fn prefix_contains(prefix: &str, ip: IpAddr) -> bool {
    IpNet::covering(prefix).is_some_and(|net| net.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> LinkKeys {
        LinkKeys::new([
            ("old".to_owned(), "an-old-key-of-more-than-32-characters!"),
            ("new".to_owned(), "a-new-key-of-more-than-32-characters!!"),
        ])
        .expect("keys")
    }

    fn terms(expires: u64) -> LinkTerms {
        LinkTerms { expires, client: None, id: None }
    }

    #[test]
    fn a_signed_link_verifies_until_it_expires() {
        let keys = keys();
        assert_eq!(keys.newest(), "new");
        let query = sign(&keys, "new", "/files/a b.iso", "", &terms(1000)).expect("signed");
        let ip = Some("192.0.2.1".parse().expect("an address"));
        let link = verify(&keys, "/files/a b.iso", Some(&query), ip, 1000).expect("valid");
        assert_eq!((link.terms.expires, link.expired), (1000, false));
        let link = verify(&keys, "/files/a b.iso", Some(&query), ip, 1001).expect("genuine");
        assert!(link.expired);
        // Signed with the older key of the ring: still good.
        let old = sign(&keys, "old", "/files/a b.iso", "", &terms(1000)).expect("signed");
        assert!(verify(&keys, "/files/a b.iso", Some(&old), ip, 10).is_ok());
    }

    #[test]
    fn every_field_is_signed() {
        let keys = keys();
        let full = LinkTerms {
            expires: 1000,
            client: Some("192.0.2.0/24".to_owned()),
            id: Some("dl-1".to_owned()),
        };
        let query = sign(&keys, "new", "/a", "", &full).expect("signed");
        let ip = Some("192.0.2.9".parse().expect("an address"));
        assert!(verify(&keys, "/a", Some(&query), ip, 10).is_ok());
        let tampered = [
            query.replace("rw-expires=1000", "rw-expires=2000"),
            query.replace("rw-client=192%2E0%2E2%2E0%2F24", "rw-client=0%2E0%2E0%2E0%2F0"),
            query.replace("rw-id=dl%2D1", "rw-id=dl%2D2"),
            query.replace("rw-key=new", "rw-key=old"),
        ];
        for query in tampered {
            assert_eq!(
                verify(&keys, "/a", Some(&query), ip, 10),
                Err(LinkError::BadSignature),
                "{query}"
            );
        }
        assert_eq!(verify(&keys, "/b", Some(&query), ip, 10), Err(LinkError::BadSignature));
        let elsewhere = Some("198.51.100.1".parse().expect("an address"));
        assert_eq!(verify(&keys, "/a", Some(&query), elsewhere, 10), Err(LinkError::OtherClient));
        assert_eq!(verify(&keys, "/a", Some(&query), None, 10), Err(LinkError::OtherClient));
    }

    #[test]
    fn bad_links_say_why() {
        let keys = keys();
        let query = sign(&keys, "new", "/a", "", &terms(1000)).expect("signed");
        assert_eq!(verify(&keys, "/a", None, None, 10), Err(LinkError::Missing));
        assert_eq!(verify(&keys, "/a", Some("x=1"), None, 10), Err(LinkError::Missing));
        let cases = [
            (query.replace("rw-key=new", "rw-key=gone"), LinkError::UnknownKey),
            (query.replace("rw-expires=1000", "rw-expires=soon"), LinkError::Malformed),
            (format!("{query}&rw-expires=1000"), LinkError::Malformed),
            (query.replace("&rw-sig=", "&rw-sig=%%"), LinkError::Malformed),
            ("rw-expires=1000".to_owned(), LinkError::Malformed),
        ];
        for (query, error) in cases {
            assert_eq!(verify(&keys, "/a", Some(&query), None, 10), Err(error), "{query}");
        }
    }

    #[test]
    fn the_query_is_signed() {
        let keys = keys();
        let origin = "versionId=3&response-content-disposition=attachment%3B%20filename%3Da.iso";
        let query = sign(&keys, "new", "/a", origin, &terms(1000)).expect("signed");
        assert!(query.starts_with(&format!("{origin}&rw-expires=1000&")), "{query}");
        let check = |query: &str| verify(&keys, "/a", Some(query), None, 10).map(|_| ());
        assert_eq!(check(&query), Ok(()));
        let link = query.strip_prefix(origin).expect("the origin's parameters first");
        let refused = [
            query.replace("versionId=3", "versionId=4"),
            query.replace("versionId=3&", ""),
            format!("{query}&versionId=4"),
            format!("acl=1&{query}"),
            format!("versionId&{query}"),
            // A `+` is a space to some origins, a plus to others: neither is `%2B`.
            query.replace("versionId=3", "versionId=3%2B"),
            query.replace("%20", "+"),
            // The link's own parameters alone: an unsigned query is not this link's.
            link.trim_start_matches('&').to_owned(),
        ];
        for query in refused {
            assert_eq!(check(&query), Err(LinkError::BadSignature), "{query}");
        }
        let equivalent = [
            // Parameters in another order, escapes in lower case, letters escaped, a `:`
            // escaped or not, an empty pair: the same query to every origin.
            format!(
                "response-content-disposition=attachment%3b%20filename%3da.iso&versionId=3{link}"
            ),
            query.replace("versionId=3", "%76ersionId=%33"),
            query.replace("&rw-expires", "&&rw-expires"),
            // rangeway's `rw-` parameters are never the origin's, wherever they stand.
            format!("rw-other=1&{query}"),
        ];
        for query in equivalent {
            assert_eq!(check(&query), Ok(()), "{query}");
        }
        assert_eq!(check(&query.replace("versionId=3", "versionId=%3")), Err(LinkError::Malformed));
    }

    #[test]
    fn the_canonical_query() {
        let canonical = |query: &str| canonical_query(query).expect("well formed");
        assert_eq!(canonical(""), "");
        assert_eq!(canonical("b=2&a=1&rw-sig=x"), "a=1&b=2");
        // Values of one name keep their order: an origin may read the first, or the last.
        assert_eq!(canonical("a=2&b=1&a=1"), "a=2&a=1&b=1");
        assert_ne!(canonical("a=1&a=2"), canonical("a=2&a=1"));
        assert_ne!(canonical("a"), canonical("a="));
        assert_eq!(canonical("p=%2f%3A%7E%41"), "p=/:~A");
        assert_eq!(canonical("p=:'!"), canonical("p=%3A%27%21"));
        assert_eq!(canonical("p=%c3%a9%22"), "p=%C3%A9%22");
        assert_eq!(canonical("p=\u{e9}\""), "p=%C3%A9%22");
        assert_eq!(canonical("p=a+b%2Bc%20d"), "p=a+b%2Bc%20d");
        assert_eq!(canonical("p=a;b%3Bc=d%3De"), "p=a;b%3Bc=d%3De");
        assert_eq!(canonical("p=%26&q=%0A"), "p=%26&q=%0A");
        for malformed in ["p=%", "p=%4", "p=%zz", "%=1"] {
            assert_eq!(canonical_query(malformed), Err(LinkError::Malformed), "{malformed}");
        }
    }

    #[test]
    fn links_of_the_first_format_are_taken_only_without_a_query() {
        let keys = keys();
        let terms = terms(1000);
        let key = keys.get("new").expect("a key");
        let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(mac(key, "/a", &terms, None).finalize().into_bytes());
        let link = format!("rw-expires=1000&rw-key=new&rw-sig={signature}");
        assert!(verify(&keys, "/a", Some(&link), None, 10).is_ok());
        let with_query = format!("versionId=3&{link}");
        assert_eq!(verify(&keys, "/a", Some(&with_query), None, 10), Err(LinkError::BadSignature));
    }

    #[test]
    fn what_sign_refuses() {
        let keys = keys();
        let sign = |query: &str| sign(&keys, "new", "/a", query, &terms(1000)).map(|_| ());
        assert_eq!(sign("a=1&rw-id=x"), Err(SignError::LinkParameter("rw-id".to_owned())));
        assert_eq!(sign("a=b c"), Err(SignError::Unencoded(' ', "%20".to_owned())));
        assert_eq!(sign("a=1#top"), Err(SignError::Unencoded('#', "%23".to_owned())));
        assert_eq!(sign("a=100%"), Err(SignError::BadEscape));
        assert_eq!(
            super::sign(&keys, "gone", "/a", "", &terms(1000)),
            Err(SignError::UnknownKey("gone".to_owned()))
        );
    }

    #[test]
    fn prefixes() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        assert!(prefix_contains("192.0.2.7", ip("192.0.2.7")));
        assert!(!prefix_contains("192.0.2.7", ip("192.0.2.8")));
        assert!(prefix_contains("192.0.2.0/24", ip("192.0.2.200")));
        assert!(!prefix_contains("192.0.2.0/24", ip("192.0.3.1")));
        assert!(prefix_contains("0.0.0.0/0", ip("203.0.113.1")));
        assert!(prefix_contains("2001:db8::/32", ip("2001:db8:1::1")));
        assert!(!prefix_contains("2001:db8::/32", ip("2001:db9::1")));
        assert!(prefix_contains("192.0.2.0/24", ip("::ffff:192.0.2.1")));
        assert!(!prefix_contains("192.0.2.0/33", ip("192.0.2.1")));
        assert!(!prefix_contains("nonsense", ip("192.0.2.1")));
    }

    #[test]
    fn links_leave_the_origin_query_and_the_log() {
        assert_eq!(without_link("a=1&rw-expires=5&rw-sig=xyz&b=2"), "a=1&b=2");
        assert_eq!(without_link("rw-key=k"), "");
        assert_eq!(
            redacted("/a?rw-expires=5&rw-sig=abcdefgh&b=2").to_string(),
            "/a?rw-expires=5&rw-sig=abcd…&b=2"
        );
        assert_eq!(redacted("/a?rw-sig=abcdefgh").to_string(), "/a?rw-sig=abcd…");
        assert_eq!(redacted("/a?b=2").to_string(), "/a?b=2");
    }
}
