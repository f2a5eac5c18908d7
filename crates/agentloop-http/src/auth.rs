//! Bearer-token authentication (issue 17, S34): every route but the two probes, the
//! live page and the OpenAPI document needs
//! `Authorization: Bearer <token>`, compared in constant time. The event stream also
//! takes the token as `?access_token=` because a browser's `EventSource` cannot set
//! headers. This module only admits or refuses a request.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Constant-time comparison of the presented and the expected token (the length is not
/// secret).
pub(crate) fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

/// The token of `?access_token=`, for the event stream only: a `GET` of
/// `/sessions/{id}/events`, nothing else.
fn query_token(req: &Request) -> Option<String> {
    let mut parts = req.uri().path().split('/');
    let events = req.method() == axum::http::Method::GET
        && parts.next() == Some("")
        && parts.next() == Some("sessions")
        && parts.next().is_some_and(|id| !id.is_empty())
        && parts.next() == Some("events")
        && parts.next().is_none();
    if !events {
        return None;
    }
    let query = req.uri().query()?;
    form_urlencoded_token(query)
}

/// The `access_token` of a query string, decoded (`%XX` and `+`, as browsers encode an
/// `EventSource` URL; a malformed escape stays as it is, as the URL standard says).
fn form_urlencoded_token(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v.into_owned())
}

/// The credentials of an `Authorization` value whose scheme is `Bearer` (the scheme is
/// case-insensitive, RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
}

/// Counts a request refused for its token and says so at WARN, at most once every ten
/// seconds with the count since (a storm of guesses must be visible, not a log flood).
fn refused_for_token() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    static LAST_LOG_MS: AtomicU64 = AtomicU64::new(0);
    REFUSED.fetch_add(1, Ordering::Relaxed);
    let now = agentloop::store::now_ms();
    let last = LAST_LOG_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= 10_000
        && LAST_LOG_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let count = REFUSED.swap(0, Ordering::Relaxed);
        tracing::warn!(
            refused = count,
            "requests refused for a missing or wrong bearer token (since the last such line)"
        );
    }
}

/// The middleware: passes the probes, the live page and the OpenAPI document, and every
/// request that shows
/// the token; answers 401 `unauthorized` otherwise.
pub(crate) async fn authenticate(
    State(token): State<Option<Arc<str>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(expected) = token else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    // The page itself holds no data: it asks for the token and sends it with every
    // call. The OpenAPI document holds none either: it is the contract, not a session.
    //
    // call.
    if crate::openapi::PUBLIC_PATHS.contains(&path) {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::to_string)
        .or_else(|| query_token(&req));
    match presented {
        Some(p) if token_matches(p.as_bytes(), expected.as_bytes()) => next.run(req).await,
        _ => {
            refused_for_token();
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "no or wrong bearer token: send `Authorization: Bearer <token>`",
            )
            .into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_content_and_length() {
        assert!(token_matches(b"s3cret", b"s3cret"));
        assert!(!token_matches(b"s3cre", b"s3cret"));
        assert!(!token_matches(b"s3creT", b"s3cret"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn the_query_token_is_read_on_the_event_stream_only() {
        let req = |method: &str, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        assert_eq!(
            query_token(&req("GET", "/sessions/s1/events?access_token=t")),
            Some("t".into())
        );
        for (m, u) in [
            ("GET", "/sessions?access_token=t"),
            ("POST", "/sessions/s1/events?access_token=t"),
            ("GET", "/x/y/events?access_token=t"),
            ("GET", "/sessions/s1/history/events?access_token=t"),
            ("GET", "/sessions//events?access_token=t"),
        ] {
            assert_eq!(query_token(&req(m, u)), None, "{m} {u}");
        }
    }

    #[test]
    fn query_token_is_decoded() {
        assert_eq!(
            form_urlencoded_token("a=1&access_token=x%2By+z"),
            Some("x+y z".into())
        );
        assert_eq!(
            form_urlencoded_token("access_token=%zz"),
            Some("%zz".into())
        );
        assert_eq!(form_urlencoded_token("other=1"), None);
    }
}
