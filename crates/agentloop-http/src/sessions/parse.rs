//! Reading a JSON request body without holding an async worker for its parse. A body's
//! bytes are read on the connection's task (that is I/O); turning a large one into
//! values is CPU work that grows with its size (a 64 KiB item is parsed twice: the body,
//! then the item from its raw text), so from [`OFF_WORKER_AT`] bytes it runs on the
//! blocking pool. The workers stay free for the small requests of every other client,
//! which a flood of large pushes must not slow down (S34a, the HTTP soak). This module
//! reads and parses; it decides nothing about what the body means.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use bytes::Bytes;

use super::{not_this_body, rejected};
use crate::error::ApiError;

/// Bodies at least this large are parsed on the blocking pool, smaller ones in place
/// (a thread hand-off costs more than parsing a few KiB).
pub(crate) const OFF_WORKER_AT: usize = 16 * 1024;

/// A JSON request's body, read but not parsed: the same checks as axum's `Json` before
/// its parse (`Content-Type: application/json` or a `+json` type, the body limit), and
/// the same answers when they fail.
pub(crate) struct JsonBytes(pub(crate) Bytes);

/// axum's own words for a body without a JSON content type.
const NOT_JSON: &str = "Expected request with `Content-Type: application/json`";

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(not_this_body(NOT_JSON));
        }
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(JsonBytes(bytes)),
            Err(e) => Err(rejected(JsonRejection::from(e))),
        }
    }
}

/// Whether the request says its body is JSON (as axum's `Json` judges it).
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(Ok(text)) = headers.get(header::CONTENT_TYPE).map(|v| v.to_str()) else {
        return false;
    };
    let Ok(mime) = text.parse::<mime::Mime>() else {
        return false;
    };
    mime.type_() == "application"
        && (mime.subtype() == "json" || mime.suffix().is_some_and(|s| s == "json"))
}

/// Runs `parse` over a body of `len` bytes: in place when it is small, on the blocking
/// pool from [`OFF_WORKER_AT`] bytes.
pub(crate) async fn off_worker<T, F>(len: usize, parse: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
{
    if len < OFF_WORKER_AT {
        return parse();
    }
    match tokio::task::spawn_blocking(parse).await {
        Ok(parsed) => parsed,
        // A parse does not panic on any input (serde returns errors); a panic here is
        // a bug, and the runtime shutting down cancels the task.
        Err(e) => {
            tracing::error!(error = %e, "parsing a request body on the blocking pool failed");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the server could not read this request's body now (it may be shutting \
                 down); retry",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn small_bodies_parse_in_place_and_large_ones_off_the_worker() {
        let here = std::thread::current().id();
        let small = off_worker(10, move || Ok(std::thread::current().id()))
            .await
            .unwrap();
        assert_eq!(small, here, "a small body is parsed on the caller's thread");
        let large = off_worker(OFF_WORKER_AT, move || Ok(std::thread::current().id()))
            .await
            .unwrap();
        assert_ne!(large, here, "a large body is parsed on the blocking pool");
    }

    #[test]
    fn json_content_types_are_judged_as_axum_judges_them() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, v.parse().unwrap());
            json_content_type(&h)
        };
        assert!(with("application/json"));
        assert!(with("application/json; charset=utf-8"));
        assert!(with("application/cloudevents+json"));
        assert!(!with("text/plain"));
        assert!(!with("application/jsonx"));
        assert!(!json_content_type(&HeaderMap::new()));
    }
}
