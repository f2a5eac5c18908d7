//! What keeps a web page from driving a server that has no token (S34a, issue 29).
//! Without a token the server listens on loopback only ([`crate::check_bind`]), but a
//! page the operator visits runs on that machine too: it could post a plain `<form>`
//! (CSRF) or rebind a DNS name of its own to 127.0.0.1 and read the answers. So without
//! a token:
//!
//! - the `Host` a request names must be a loopback name (`localhost`, `*.localhost`,
//!   `127.x.y.z`, `[::1]`), else 403 `forbidden_host`: a rebound name is refused;
//! - a `POST` must be JSON (`Content-Type: application/json`) or carry the header
//!   `X-Agentloop-Client`, else 415 `json_required`: neither is something a page can
//!   send to another origin without a CORS preflight, which this server never grants
//!   without configured origins.
//!
//! With a token none of this is needed (a page cannot attach the bearer header), and the
//! layer is not installed. This module only admits or refuses a request.

use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::excerpt;
use crate::error::ApiError;

/// The header a non-JSON client may send instead of a JSON content type.
pub const CLIENT_HEADER: &str = "x-agentloop-client";

/// Whether `host` (a `Host` header's value, with or without a port) names this machine's
/// loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    // `[::1]:7420`, `[::1]`
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, _)) => inside,
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// The middleware, installed only when the server has no token.
pub(crate) async fn guard(req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    if let Some(host) = host.filter(|h| !is_loopback_host(h)) {
        // Client input: at most one line a second, with the count since, and an
        // excerpt of the name (issue 52: a 60 KB Host once made 120 MB of log in 0.3 s).
        static REFUSED: crate::server::Throttle = crate::server::Throttle::new();
        if let Some(count) = REFUSED.note() {
            tracing::warn!(
                host = %excerpt(&host),
                path = %excerpt(req.uri().path()),
                refused = count,
                "refused requests for a foreign Host on a server without a token (since the last such line)"
            );
        }
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden_host",
            format!(
                "this server has no token, so it answers only requests for loopback host names \
                 (localhost, 127.0.0.1, [::1]), not `{}`; set a token to serve other names",
                excerpt(&host)
            ),
        )
        .into_response();
    }
    if req.method() == Method::POST && !is_json(&req) && !req.headers().contains_key(CLIENT_HEADER)
    {
        return ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "json_required",
            "this server has no token, so it takes state-changing requests only as JSON \
             (Content-Type: application/json, `{}` when there is nothing to send) or with the \
             X-Agentloop-Client header, which a web page cannot send to it; or set a token",
        )
        .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_and_without_ports() {
        for ok in [
            "localhost",
            "localhost:7420",
            "LOCALHOST.",
            "app.localhost:80",
            "127.0.0.1",
            "127.0.0.1:7420",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:7420",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        assert_eq!(excerpt("evil\n.example"), "evil\\n.example");
        let long = "a".repeat(60_000);
        let cut = excerpt(&long);
        assert!(cut.len() < 200 && cut.ends_with("(60000 bytes)"), "{cut}");
        for bad in [
            "evil.example",
            "evil.example:7420",
            "localhost.evil.example",
            "10.0.0.1:7420",
            "[::2]:80",
            "[::1",
            "",
            "127.0.0.1.evil.example",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
