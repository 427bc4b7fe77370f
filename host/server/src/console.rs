//! The operator console: a small single-page app served at `/console` on the API's listener.
//!
//! The app is plain ES modules and CSS in `host/server/console/`, with no framework and no build
//! step, embedded in the binary with `include_str!`: what is in the repository is exactly what
//! is served, and nothing is fetched from anywhere else at run time. It talks to the server
//! only through the public HTTP API (`/v1/...`, `/ready`, `/metrics`) with the bearer token the
//! person signed in with, so a tenant token sees in the console exactly what it sees with curl.
//!
//! These routes are not part of the `/v1` OpenAPI document: they serve files, not the API.
//! Every response carries the console's security headers ([`SECURITY_HEADERS`]): a strict
//! Content-Security-Policy (scripts and styles from this origin only, no inline script, no
//! `eval`, `connect-src 'self'`), `nosniff`, no referrer, and no framing.

use axum::Router;
use axum::http::HeaderName;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The Content-Security-Policy of every console response: nothing but this origin's own script,
/// style and API; no inline script or style element, no `eval`, no plugins, no framing, no form
/// posts, no `<base>`.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The headers every console response carries.
pub const SECURITY_HEADERS: [(HeaderName, &str); 5] = [
    (CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY_VALUE),
    (X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (REFERRER_POLICY, "no-referrer"),
    (X_FRAME_OPTIONS, "DENY"),
    // The files change with the binary: always revalidate, never serve a stale app.
    (CACHE_CONTROL, "no-cache"),
];

/// One embedded file of the console: its path under `/console/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// Every file of the console, embedded from `host/server/console/`.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/console/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../console/index.html"),
    },
    Asset {
        path: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../console/app.js"),
    },
    Asset {
        path: "/console/api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../console/api.js"),
    },
    Asset {
        path: "/console/render.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../console/render.js"),
    },
    Asset {
        path: "/console/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../console/style.css"),
    },
];

/// The console's routes, merged into the server's router beside the API (state-free).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut router = Router::new();
    for asset in ASSETS {
        router = router.route(asset.path, get(move || async move { serve(asset) }));
    }
    // The page itself, also without the slash (it names its files by absolute paths).
    router.route("/console", get(|| async { serve(&ASSETS[0]) }))
}

/// Every embedded file as `(path, bytes)`, for tests that compare them with the sources.
pub fn assets() -> impl Iterator<Item = (&'static str, &'static str)> {
    ASSETS.iter().map(|asset| (asset.path, asset.body))
}

fn serve(asset: &'static Asset) -> Response {
    let mut response = ([(CONTENT_TYPE, asset.content_type)], asset.body).into_response();
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, axum::http::HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No console file hands text to an HTML parser or to a JavaScript compiler: everything
    /// data-borne is rendered as text (`textContent`, text nodes), and the CSP forbids `eval`
    /// in the browser as a second line.
    #[test]
    fn no_console_file_uses_an_html_or_code_sink() {
        let sinks = [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "createContextualFragment",
            "DOMParser",
            "srcdoc",
            "eval(",
            "new Function",
            "javascript:",
        ];
        for (path, body) in assets().filter(|(path, _)| path.ends_with(".js")) {
            for sink in sinks {
                assert!(!body.contains(sink), "{path} uses {sink}");
            }
        }
    }

    /// The page loads its code and style by URL only: no inline script or style for the CSP
    /// to allow, and every file it names is served.
    #[test]
    fn the_page_has_no_inline_code_and_names_served_files() {
        let page = ASSETS[0].body;
        assert_eq!(page.matches("<script").count(), 1);
        assert!(page.contains(r#"<script type="module" src="/console/app.js"></script>"#));
        assert!(!page.contains("<style") && !page.contains("style="));
        assert!(
            !page
                .split_whitespace()
                .any(|word| word.to_ascii_lowercase().starts_with("on") && word.contains('=')),
            "no inline event handler"
        );
        let served: Vec<&str> = assets().map(|(path, _)| path).collect();
        for name in ["/console/app.js", "/console/style.css"] {
            assert!(page.contains(name) && served.contains(&name), "{name}");
        }
        for (path, body) in assets().filter(|(path, _)| path.ends_with(".js")) {
            for import in body.lines().filter_map(|l| l.split(" from './").nth(1)) {
                let file = format!("/console/{}", import.trim_end_matches("';"));
                assert!(served.contains(&file.as_str()), "{path} imports {file}");
            }
        }
    }

    #[test]
    fn the_policy_is_strict() {
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(
                CONTENT_SECURITY_POLICY_VALUE.contains(directive),
                "{directive}"
            );
        }
        assert!(!CONTENT_SECURITY_POLICY_VALUE.contains("unsafe"));
    }
}
