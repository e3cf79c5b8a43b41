//! An origin that never answers gets the client a 504 within the upstream's `read_timeout`,
//! counted and logged as an upstream timeout.

mod support;

use std::time::{Duration, Instant};

use support::http::{RawRequest, request};
use support::origin::{Behaviour, Origin};
use support::proxy::Proxy;

/// An upstream `origin` with `read_timeout`, then one route per `(prefix, extra route keys)`.
fn routes(origin: &Origin, read_timeout: &str, routes: &[(&str, &str)]) -> String {
    let mut config = format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"{read_timeout}\"\n",
        origin.base_url()
    );
    for (prefix, keys) in routes {
        config += &format!(
            "\n[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n{keys}\n"
        );
    }
    config
}

#[test]
fn an_origin_that_never_answers_is_a_504_within_read_timeout() {
    let origin = Origin::start();
    origin.put("/hung", b"never sent".to_vec());
    origin.set_behaviour("/hung", Behaviour::Silent);
    let proxy = Proxy::start(&routes(&origin, "1s", &[("/", "")]));
    for (path, method) in [("/hung", "GET"), ("/hung", "HEAD")] {
        let started = Instant::now();
        let response =
            request(proxy.addr(), &RawRequest::new(method, path)).expect("an answer from rangeway");
        let took = started.elapsed();
        assert_eq!(response.status, 504, "{method} {path}");
        assert!(took < Duration::from_secs(2), "{method} {path}: answered after {took:?}");
        assert!(took >= Duration::from_millis(900), "{method} {path}: after {took:?}");
    }
    let timeouts = proxy.metric_at_least("rangeway_upstream_errors_total", "kind=\"timeout\"", 2);
    assert!(timeouts >= 2, "{timeouts} timeouts counted");
    assert_eq!(proxy.metric("rangeway_active_downloads", ""), 0);
}
