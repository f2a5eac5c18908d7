//! Bounds on what clients may hold at once (issue 17, S34): requests in flight and open
//! event streams. Over a bound the answer is 429 `too_many` at once, never a queue that
//! grows. This module only counts; it never looks at a request's content.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Requests in flight the router serves at once unless [`crate::options::HttpOptions::max_requests`]
/// says otherwise. An open event stream counts only against the stream bound.
pub const DEFAULT_MAX_REQUESTS: usize = 1024;

/// Event streams open at once unless [`crate::options::HttpOptions::max_event_streams`] says
/// otherwise.
pub const DEFAULT_MAX_EVENT_STREAMS: usize = 256;

/// The probes: they take no request slot (a slow client cannot fail them); the
/// OpenAPI document documents their answers from this list.
pub(crate) const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// A counter with a ceiling; a [`Slot`] holds one unit until dropped.
#[derive(Debug)]
pub(crate) struct Gauge {
    held: AtomicUsize,
    max: usize,
}

/// One unit of a [`Gauge`], given back on drop.
#[derive(Debug)]
pub(crate) struct Slot(Arc<Gauge>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gauge {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Gauge {
            held: AtomicUsize::new(0),
            max,
        })
    }

    /// A slot, or `None` at the ceiling.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            if held >= self.max {
                return None;
            }
            match self.held.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Slot(self.clone())),
                Err(now) => held = now,
            }
        }
    }

    /// The ceiling.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Units held now.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// 429 with what to do.
pub(crate) fn too_many(what: &str, max: usize) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many",
        format!("the server already serves {max} {what}, its configured bound; retry later"),
    )
}

/// The middleware: one slot per request in flight (event streams are bounded by their
/// own gauge when they open, so a long stream does not hold a request slot). The health
/// probes take no slot (S34a): a server whose slots are all held by slow clients still
/// answers its liveness and readiness probes, so nothing restarts it for that.
pub(crate) async fn bound_requests(
    State(gauge): State<Arc<Gauge>>,
    req: Request,
    next: Next,
) -> Response {
    if PROBES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    match gauge.try_take() {
        Some(slot) => {
            let resp = next.run(req).await;
            drop(slot);
            resp
        }
        None => too_many("requests at once", gauge.max()).into_response(),
    }
}

/// How a request body is bounded: its size and the time it may take to arrive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyBounds {
    /// The largest body, in bytes.
    pub(crate) limit: usize,
    /// How long the whole body may take to arrive.
    pub(crate) read_timeout: std::time::Duration,
}

fn too_large(n: u64, limit: usize) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!(
            "the request body would be {n} bytes, over this server's limit of {limit} \
             ([http] body_limit); send less"
        ),
    )
}

/// Bounds a request's body before a handler sees it (S34a): a `Content-Length` over the
/// limit is refused at once with 413 `too_large` (also on routes that read no body), and
/// a body is read whole within `read_timeout` or refused with 408 `body_timeout`, so a
/// client that sends its body a byte at a time holds its request slot (and a task) for
/// that long at most. The handler gets the body already read.
pub(crate) async fn read_body(
    State(bounds): State<BodyBounds>,
    req: Request,
    next: Next,
) -> Response {
    use axum::http::header;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > bounds.limit as u64) {
        return too_large(n, bounds.limit).into_response();
    }
    let has_body =
        declared.is_some_and(|n| n > 0) || req.headers().contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, bounds.limit);
    let bytes = match tokio::time::timeout(bounds.read_timeout, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            // Over the limit while streaming (no or a false Content-Length), or the
            // client went away mid-body.
            return too_large(bounds.limit as u64 + 1, bounds.limit).into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} ([http] body_read_timeout); \
                     send it at once",
                    humantime::format_duration(bounds.read_timeout)
                ),
            )
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_refuses_at_its_ceiling_and_frees_on_drop() {
        let g = Gauge::new(2);
        let a = g.try_take().expect("first");
        let _b = g.try_take().expect("second");
        assert!(g.try_take().is_none());
        drop(a);
        assert_eq!(g.held(), 1);
        assert!(g.try_take().is_some());
    }
}
