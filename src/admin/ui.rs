//! The live downloads page: `/ui` and its script and style sheet, built into the binary.
//!
//! The page holds no data, so it is served without the admin token; its script asks the JSON API
//! for everything it shows, with the token the user types in. The Content-Security-Policy allows
//! only these files and requests to this listener: no inline script or style, no other origin.

use http::{HeaderValue, Response, StatusCode, header};

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// Where the page lives; its assets are under it.
pub(super) const PAGE_PATH: &str = "/ui";

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Whether `path` is the page or under it: the admin listener routes it here.
pub(super) fn is_ui_path(path: &str) -> bool {
    path.strip_prefix(PAGE_PATH).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The answer to `path` (one [`is_ui_path`] admits): a file of the page, or 404.
pub(super) fn response(path: &str) -> Response<Vec<u8>> {
    let (status, body, content_type) = match path {
        "/ui" | "/ui/" => (StatusCode::OK, INDEX_HTML, "text/html; charset=utf-8"),
        "/ui/app.js" => (StatusCode::OK, APP_JS, "text/javascript; charset=utf-8"),
        "/ui/app.css" => (StatusCode::OK, APP_CSS, "text/css; charset=utf-8"),
        _ => (
            StatusCode::NOT_FOUND,
            "not found: the live downloads page is /ui\n",
            "text/plain; charset=utf-8",
        ),
    };
    let mut response = Response::new(body.as_bytes().to_vec());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    // The files change with the binary, and an old script against a new API would mislead.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // The page's address says nothing secret, but nothing else needs to learn it either.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(response: &Response<Vec<u8>>, name: header::HeaderName) -> &str {
        response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    #[test]
    fn only_ui_and_what_is_under_it_is_the_page() {
        for path in ["/ui", "/ui/", "/ui/app.js", "/ui/app.css", "/ui/nothing"] {
            assert!(is_ui_path(path), "{path}");
        }
        for path in ["/uix", "/u", "/", "/v1/ui", "/metrics", "/ui.js"] {
            assert!(!is_ui_path(path), "{path}");
        }
    }

    #[test]
    fn each_file_has_its_type_and_every_answer_the_same_protections() {
        for (path, status, content_type) in [
            ("/ui", StatusCode::OK, "text/html; charset=utf-8"),
            ("/ui/", StatusCode::OK, "text/html; charset=utf-8"),
            ("/ui/app.js", StatusCode::OK, "text/javascript; charset=utf-8"),
            ("/ui/app.css", StatusCode::OK, "text/css; charset=utf-8"),
            ("/ui/app.js.map", StatusCode::NOT_FOUND, "text/plain; charset=utf-8"),
            ("/ui/../metrics", StatusCode::NOT_FOUND, "text/plain; charset=utf-8"),
        ] {
            let response = response(path);
            assert_eq!(response.status(), status, "{path}");
            assert_eq!(header(&response, header::CONTENT_TYPE), content_type, "{path}");
            assert_eq!(
                header(&response, header::CONTENT_LENGTH),
                response.body().len().to_string(),
                "{path}"
            );
            assert_eq!(header(&response, header::CACHE_CONTROL), "no-store", "{path}");
            assert_eq!(header(&response, header::X_CONTENT_TYPE_OPTIONS), "nosniff", "{path}");
            let csp = header(&response, header::CONTENT_SECURITY_POLICY);
            for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'"] {
                assert!(csp.contains(directive), "{path}: {csp}");
            }
            assert!(!csp.contains("unsafe"), "{path}: {csp}");
        }
    }

    /// The policy forbids inline script and style: the page must need none, and must load the
    /// very files served beside it.
    #[test]
    fn the_page_needs_nothing_the_policy_forbids() {
        let html = INDEX_HTML.to_ascii_lowercase();
        assert!(html.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(html.contains(r#"<link rel="stylesheet" href="/ui/app.css">"#));
        assert_eq!(html.matches("<script").count(), 1, "one script, by its address");
        assert!(!html.contains("<style"));
        assert!(!html.contains(" style="));
        let handlers = html.split_whitespace().filter(|w| w.starts_with("on") && w.contains('='));
        assert_eq!(handlers.count(), 0, "no inline event handlers");
        for text in [INDEX_HTML, APP_JS, APP_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"), "nothing external");
        }
    }

    /// Ids and clients come from the network: the script puts text in the page as text only.
    #[test]
    fn the_script_never_parses_data_as_html() {
        for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
            assert!(!APP_JS.contains(sink), "app.js uses {sink}");
        }
    }
}
