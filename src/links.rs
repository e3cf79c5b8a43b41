//! Signed links: a route that requires them serves a path only to a URL that carries an
//! HMAC-SHA-256 signature over the path, an expiry, and optionally a client address prefix and a
//! download id, made with one of the route's keys (`rangeway sign` makes them).
//!
//! ```text
//! /files/a.iso?rw-expires=1767225600&rw-key=2026-12&rw-sig=BASE64URL
//!              [&rw-client=203.0.113.0/24][&rw-id=ID]
//! signature = HMAC-SHA-256(key, "rangeway-link-v1\n" PATH "\n" EXPIRES "\n" CLIENT "\n" ID)
//! ```
//!
//! PATH is the path as rangeway normalises it (percent-decoded, dot segments resolved), so a
//! client that re-encodes the URL keeps a valid link. What to do with an expired link — refuse
//! it, or let a download that began before the expiry resume — is the proxy's decision
//! (`proxy/mod.rs`): here, only what the link says and whether it is genuine. Pure: no I/O, no
//! clock (the time is an argument).

use std::collections::BTreeMap;
use std::net::IpAddr;

use base64::Engine as _;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::ip_net::IpNet;

/// The query parameters of a signed link. All begin with `rw-`, which is how they are told from
/// the origin's own parameters (and never forwarded to it).
pub const EXPIRES: &str = "rw-expires";
pub const KEY: &str = "rw-key";
pub const SIGNATURE: &str = "rw-sig";
pub const CLIENT: &str = "rw-client";
pub const ID: &str = "rw-id";
const PREFIX: &str = "rw-";

const CONTEXT: &str = "rangeway-link-v1";

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

/// The query that signs `path` with `terms` under key `key_id` of `keys` (the parameters only,
/// without `?`); `None` when `keys` has no such key.
pub fn sign(keys: &LinkKeys, key_id: &str, path: &str, terms: &LinkTerms) -> Option<String> {
    let key = keys.get(key_id)?;
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(mac(key, path, terms).finalize().into_bytes());
    let mut query = format!("{EXPIRES}={}&{KEY}={}", terms.expires, encode(key_id));
    for (name, value) in [(CLIENT, &terms.client), (ID, &terms.id)] {
        if let Some(value) = value {
            query.push_str(&format!("&{name}={}", encode(value)));
        }
    }
    query.push_str(&format!("&{SIGNATURE}={signature}"));
    Some(query)
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
    let key = keys.get(&key_id).ok_or(LinkError::UnknownKey)?;
    let terms = LinkTerms { expires, client: params.client, id: params.id };
    mac(key, path, &terms).verify_slice(&signature).map_err(|_| LinkError::BadSignature)?;
    if let Some(prefix) = &terms.client
        && !client.is_some_and(|ip| prefix_contains(prefix, ip))
    {
        return Err(LinkError::OtherClient);
    }
    Ok(Link { expired: now > terms.expires, terms })
}

/// `query` without a link's parameters: what goes upstream.
pub fn without_link(query: &str) -> String {
    query.split('&').filter(|pair| !pair.starts_with(PREFIX)).collect::<Vec<_>>().join("&")
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

fn mac(key: &str, path: &str, terms: &LinkTerms) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256>>::new_from_slice(key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    let client = terms.client.as_deref().unwrap_or("");
    let id = terms.id.as_deref().unwrap_or("");
    mac.update(format!("{CONTEXT}\n{path}\n{}\n{client}\n{id}", terms.expires).as_bytes());
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
        let query = sign(&keys, "new", "/files/a b.iso", &terms(1000)).expect("signed");
        let ip = Some("192.0.2.1".parse().expect("an address"));
        let link = verify(&keys, "/files/a b.iso", Some(&query), ip, 1000).expect("valid");
        assert_eq!((link.terms.expires, link.expired), (1000, false));
        let link = verify(&keys, "/files/a b.iso", Some(&query), ip, 1001).expect("genuine");
        assert!(link.expired);
        // Signed with the older key of the ring: still good.
        let old = sign(&keys, "old", "/files/a b.iso", &terms(1000)).expect("signed");
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
        let query = sign(&keys, "new", "/a", &full).expect("signed");
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
        let query = sign(&keys, "new", "/a", &terms(1000)).expect("signed");
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
