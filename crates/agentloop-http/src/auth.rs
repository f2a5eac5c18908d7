//! Bearer-token authentication (issue 17, S34): every route but the two probes needs
//! `Authorization: Bearer <token>`, compared in constant time. The event stream also
//! takes the token as `?access_token=` because a browser's `EventSource` cannot set
//! headers. This module only admits or refuses a request.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiError;

/// Constant-time comparison of the presented and the expected token (the length is not
/// secret).
pub(crate) fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

/// The token of `?access_token=`, for the event stream only.
fn query_token(req: &Request) -> Option<String> {
    if !req.uri().path().ends_with("/events") {
        return None;
    }
    let query = req.uri().query()?;
    form_urlencoded_token(query)
}

fn form_urlencoded_token(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        if k == "access_token" {
            percent_decode(v)
        } else {
            None
        }
    })
}

/// Decodes `%XX` escapes and `+`; `None` for a malformed escape.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The middleware: passes the probes and the live page, and every request that shows
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
    // call.
    if path == "/healthz" || path == "/readyz" || path == "/" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
        .or_else(|| query_token(&req));
    match presented {
        Some(p) if token_matches(p.as_bytes(), expected.as_bytes()) => next.run(req).await,
        _ => {
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
    fn query_token_is_decoded() {
        assert_eq!(
            form_urlencoded_token("a=1&access_token=x%2By+z"),
            Some("x+y z".into())
        );
        assert_eq!(form_urlencoded_token("access_token=%zz"), None);
        assert_eq!(form_urlencoded_token("other=1"), None);
    }
}
