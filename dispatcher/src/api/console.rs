//! The web console at `/ui` (docs/console.md): three static files compiled into the
//! binary, served by the roles that serve the public API. The console is a client of
//! that API like any other — same endpoints, same bearer token — so this module only
//! hands out the files, with headers that keep a page showing untrusted task payloads
//! from running anything but these files' own script.

use axum::Router;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Only this origin's files: no inline script or style (a payload rendered into the page
/// cannot run), no plugins, no framing, API calls to this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("../../console/index.html");
const APP: &str = include_str!("../../console/app.js");
const STYLE: &str = include_str!("../../console/style.css");

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(headers);
    response
}

/// The headers every `/ui` answer carries.
fn secure(headers: &mut axum::http::HeaderMap) {
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The files change with the binary; a browser asks again rather than run an old
    // script against a new API.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

/// `/ui` itself: to `/ui/`, so the page's relative links resolve under it.
async fn to_index() -> Response {
    let mut response = StatusCode::PERMANENT_REDIRECT.into_response();
    response
        .headers_mut()
        .insert(LOCATION, HeaderValue::from_static("/ui/"));
    secure(response.headers_mut());
    response
}

/// The console's routes, merged into the public router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(to_index))
        .route(
            "/ui/",
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { file("text/javascript; charset=utf-8", APP) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { file("text/css; charset=utf-8", STYLE) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page loads its script and style as files (which the policy allows), never
    /// inline (which it forbids).
    #[test]
    fn the_page_has_no_inline_script_or_style() {
        assert!(INDEX.contains(r#"<script type="module" src="app.js"></script>"#));
        assert!(INDEX.contains(r#"<link rel="stylesheet" href="style.css">"#));
        assert_eq!(INDEX.matches("<script").count(), 1, "one script, a file");
        assert!(!INDEX.contains("<style") && !INDEX.contains(" style="));
        assert!(
            !INDEX
                .split_whitespace()
                .any(|word| word.starts_with("on") && word.contains('=')),
            "no inline event handlers"
        );
        for text in [INDEX, APP, STYLE] {
            assert!(
                !text.contains("http://") && !text.contains("https://"),
                "nothing from outside"
            );
        }
        assert!(!APP.contains("innerHTML") && !APP.contains("outerHTML"));
        assert!(!APP.contains("insertAdjacentHTML") && !APP.contains("document.write"));
        assert!(!APP.contains("eval(") && !APP.contains("new Function"));
    }
}
