//! What a web page in the caller's browser can make of the public endpoints. A page on
//! another site can send requests to the API's port (a form, `fetch` in `no-cors` mode)
//! and, after DNS rebinding, even read the answers; with `--auth none` (the `dev`
//! default) nothing else stands in its way. So, before any handler runs:
//!
//! 1. Without authentication, the `Host` a request was sent to must be a loopback name
//!    or address (`localhost`, `127.0.0.0/8`, `::1`), the listener's bind address or an
//!    `--allowed-host`: after DNS rebinding a page's requests still name the page's own
//!    host. With authentication, any `Host` is served (a cluster's Service names vary),
//!    and a rebound page has no credential to send.
//! 2. A request with an `Origin` header (every browser sends one on a cross-origin
//!    request and on every non-GET one) must come from the host and port the request
//!    was sent to (its `Host`), or be an `--allowed-origin`. The scheme is not compared:
//!    behind a proxy that ends TLS the browser's is not the listener's, and a page on the
//!    same host and port is served by this listener anyway. The built-in console is
//!    same-origin; non-browser clients send no `Origin`.
//! 3. A write (POST, PUT, PATCH, DELETE) that carries a body, or names its type, must
//!    name `application/json`: the types a page may send without asking first
//!    (`text/plain`, forms) are refused even from a browser that sends no `Origin`. A
//!    write without a body and without `Content-Type` (a DELETE, a pause) passes.
//!
//! Refusals: 403 `forbidden` naming the `Host` or `Origin`, 415 (code `malformed_json`)
//! naming `Content-Type`. Only the public endpoints are guarded: the executor callbacks
//! are authenticated by their lease token, and the health and metrics endpoints are read
//! by probes and scrapers that address the pod by IP.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use asyncd_contract::ErrorCode;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiState;
use super::error::ApiError;

/// What the operator allows beyond the defaults (`--allowed-origin`, `--allowed-host`).
#[derive(Debug, Clone, Default)]
pub struct BrowserSettings {
    /// Origins (`scheme://host[:port]`) whose pages may call the API.
    pub allowed_origins: Vec<String>,
    /// Host names (or addresses) a listener without authentication answers besides
    /// loopback and its bind address.
    pub allowed_hosts: Vec<String>,
}

/// An origin as compared: lower-case scheme and host, the port made explicit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: u16,
    /// `host[:port]` as sent, lower-case: what a same-origin request's `Host` says too.
    authority: String,
}

impl Origin {
    /// `scheme://host[:port]` with nothing after it, as browsers send it.
    fn parse(text: &str) -> Option<Self> {
        let uri: Uri = text.parse().ok()?;
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return None;
        }
        let authority = uri.authority()?;
        if authority.as_str().contains('@') {
            return None;
        }
        Some(Self {
            scheme,
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(default_port),
            authority: authority.as_str().to_ascii_lowercase(),
        })
    }

    /// The same origin, however its port was written.
    fn same_as(&self, other: &Origin) -> bool {
        (&self.scheme, &self.host, self.port) == (&other.scheme, &other.host, other.port)
    }
}

/// The decision's configuration: one per listener.
#[derive(Debug, Clone)]
pub struct RequestGuard {
    allowed_origins: Vec<Origin>,
    /// `Some` without authentication: the hosts besides loopback a request may name.
    hosts: Option<AllowedHosts>,
}

#[derive(Debug, Clone)]
struct AllowedHosts {
    /// The bind address, unless it is unspecified (`0.0.0.0` names no host).
    bind: Option<IpAddr>,
    /// `--allowed-host`, lower-case.
    names: Vec<String>,
}

impl RequestGuard {
    /// The guard of a listener on `listen`; `authenticated` is false for `--auth none`.
    /// An `--allowed-origin` that is not an origin is refused, naming it.
    pub fn new(
        settings: &BrowserSettings,
        listen: SocketAddr,
        authenticated: bool,
    ) -> Result<Self, String> {
        let allowed_origins = settings
            .allowed_origins
            .iter()
            .map(|text| {
                Origin::parse(text).ok_or_else(|| {
                    format!(
                        "--allowed-origin {text:?} is not an origin: http(s)://HOST[:PORT], nothing after it"
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let hosts = (!authenticated).then(|| AllowedHosts {
            bind: Some(listen.ip()).filter(|ip| !ip.is_unspecified()),
            names: settings
                .allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
        });
        Ok(Self {
            allowed_origins,
            hosts,
        })
    }

    /// Whether to serve the request, or the refusal that names the header at fault.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        // HTTP/1.1 sends `Host`; HTTP/2 the `:authority` that lands in the URI.
        let host = match headers.get(HOST) {
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|h| h.parse::<Authority>().ok()),
            None => uri.authority().cloned(),
        };
        if let Some(allowed) = &self.hosts {
            let named = host.as_ref().map(|h| h.host().to_ascii_lowercase());
            if !named.as_deref().is_some_and(|h| allowed.allows(h)) {
                let shown = headers
                    .get(HOST)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .unwrap_or_default();
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "Host: {shown:?} is not localhost, a loopback address, this listener's \
                         address or an --allowed-host; a listener without authentication \
                         answers no other name, so a web page cannot read it through DNS rebinding"
                    ),
                ));
            }
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let text = String::from_utf8_lossy(origin.as_bytes());
            let parsed = Origin::parse(&text);
            let own = host.as_ref().map(|h| h.as_str().to_ascii_lowercase());
            let allowed = parsed.as_ref().is_some_and(|o| {
                own.as_deref() == Some(o.authority.as_str())
                    || self.allowed_origins.iter().any(|a| a.same_as(o))
            });
            if !allowed {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "Origin: {text:?} is neither this listener's own origin nor an \
                         --allowed-origin; pages of other sites may not call the API"
                    ),
                ));
            }
        }
        if matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        ) {
            let json = match headers.get(CONTENT_TYPE) {
                Some(value) => is_json(value.as_bytes()),
                None => !has_body(headers),
            };
            if !json {
                let sent = headers
                    .get(CONTENT_TYPE)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                let message = match sent {
                    Some(sent) => format!(
                        "Content-Type: {sent:?} is not application/json, the only type a request body may have"
                    ),
                    None => "Content-Type: a request with a body must say application/json".into(),
                };
                return Err(ApiError::new(ErrorCode::MalformedJson, message)
                    .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE));
            }
        }
        Ok(())
    }
}

impl AllowedHosts {
    fn allows(&self, host: &str) -> bool {
        if host == "localhost" || self.names.iter().any(|name| name == host) {
            return true;
        }
        // `Authority::host` keeps an IPv6 address's brackets.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || Some(ip) == self.bind)
    }
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &[u8]) -> bool {
    let text = String::from_utf8_lossy(content_type);
    let media_type = text.split(';').next().unwrap_or_default().trim();
    media_type.eq_ignore_ascii_case("application/json")
}

/// Whether the request says it carries a body: a non-zero length, or a chunked one.
fn has_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0");
    length || headers.contains_key(TRANSFER_ENCODING)
}

/// The middleware in front of the public endpoints.
pub async fn guard(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    if let Err(refused) = state
        .guard
        .check(request.method(), request.uri(), request.headers())
    {
        tracing::info!(
            method = %request.method(),
            path = request.uri().path(),
            message = refused.error.message,
            "request refused by the browser guard"
        );
        return refused.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener_guard(authenticated: bool) -> RequestGuard {
        let settings = BrowserSettings {
            allowed_origins: vec!["https://console.example:8443".into()],
            allowed_hosts: vec!["asyncd.dev.internal".into()],
        };
        RequestGuard::new(
            &settings,
            "192.168.1.5:7700".parse().unwrap(),
            authenticated,
        )
        .unwrap()
    }

    fn request(guard: &RequestGuard, method: Method, headers: &[(&str, &str)]) -> Option<u16> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        guard
            .check(&method, &Uri::from_static("/v1/tasks"), &map)
            .err()
            .map(|refused| refused.status.as_u16())
    }

    #[test]
    fn without_auth_only_loopback_the_bind_address_and_allowed_hosts_are_answered() {
        let guard = listener_guard(false);
        for host in [
            "localhost:7700",
            "LOCALHOST",
            "127.0.0.1:7700",
            "127.0.0.2",
            "[::1]:7700",
            "192.168.1.5:7700",
            "asyncd.dev.internal:80",
        ] {
            assert_eq!(
                request(&guard, Method::GET, &[("host", host)]),
                None,
                "{host}"
            );
        }
        for host in [
            "rebind.evil.example",
            "rebind.evil.example:7700",
            "localhost.evil.example",
            "10.0.0.1:7700",
            "[::2]:7700",
        ] {
            assert_eq!(
                request(&guard, Method::GET, &[("host", host)]),
                Some(403),
                "{host}"
            );
        }
        assert_eq!(request(&guard, Method::GET, &[]), Some(403), "no Host");
        assert_eq!(
            request(
                &listener_guard(true),
                Method::GET,
                &[("host", "asyncd.team-a.svc")]
            ),
            None,
            "with auth, any Host"
        );
    }

    #[test]
    fn only_the_own_origin_and_allowed_origins_pass() {
        for guard in [listener_guard(false), listener_guard(true)] {
            let from = |origin| {
                request(
                    &guard,
                    Method::GET,
                    &[("host", "127.0.0.1:7700"), ("origin", origin)],
                )
            };
            assert_eq!(from("http://127.0.0.1:7700"), None);
            assert_eq!(from("HTTP://127.0.0.1:7700"), None);
            assert_eq!(from("https://127.0.0.1:7700"), None, "behind a TLS proxy");
            assert_eq!(from("https://console.example:8443"), None);
            for foreign in [
                "https://evil.example",
                "http://127.0.0.1:7701",
                "http://127.0.0.1",
                "http://localhost:7700",
                "https://console.example",
                "null",
                "http://127.0.0.1:7700/path",
            ] {
                assert_eq!(from(foreign), Some(403), "{foreign}");
            }
        }
        let settings = BrowserSettings {
            allowed_origins: vec!["https://console.example:443".into()],
            ..BrowserSettings::default()
        };
        let explicit = RequestGuard::new(&settings, "127.0.0.1:7700".parse().unwrap(), true);
        let from_default_port = request(
            &explicit.unwrap(),
            Method::GET,
            &[("host", "localhost"), ("origin", "https://console.example")],
        );
        assert_eq!(from_default_port, None, "443 is https's default port");
        let bad = BrowserSettings {
            allowed_origins: vec!["console.example".into()],
            ..BrowserSettings::default()
        };
        let err = RequestGuard::new(&bad, "127.0.0.1:7700".parse().unwrap(), false).unwrap_err();
        assert!(
            err.contains("--allowed-origin \"console.example\""),
            "{err}"
        );
    }

    #[test]
    fn writes_with_a_body_must_be_json_and_bodiless_writes_pass() {
        let guard = listener_guard(false);
        let host = ("host", "127.0.0.1:7700");
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            for refused in [
                vec![
                    host,
                    ("content-type", "text/plain"),
                    ("content-length", "2"),
                ],
                vec![host, ("content-type", "application/x-www-form-urlencoded")],
                vec![host, ("content-type", "multipart/form-data; boundary=x")],
                vec![host, ("content-type", "application/jsonx")],
                vec![host, ("content-length", "12")],
                vec![host, ("transfer-encoding", "chunked")],
            ] {
                assert_eq!(
                    request(&guard, method.clone(), &refused),
                    Some(415),
                    "{method} {refused:?}"
                );
            }
            for accepted in [
                vec![
                    host,
                    ("content-type", "application/json"),
                    ("content-length", "2"),
                ],
                vec![host, ("content-type", "Application/JSON; charset=utf-8")],
                vec![host],
                vec![host, ("content-length", "0")],
            ] {
                assert_eq!(
                    request(&guard, method.clone(), &accepted),
                    None,
                    "{method} {accepted:?}"
                );
            }
        }
        assert_eq!(
            request(&guard, Method::GET, &[host, ("content-type", "text/plain")]),
            None,
            "reads are not checked"
        );
    }
}
