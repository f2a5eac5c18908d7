//! Pushes to a full session, taken one at a time (S34a): once a session has refused a
//! push as full (`429 session_full`), the next pushes to it wait here, in arrival order,
//! before their bodies are read, and are tried one at a time at most once per
//! [`HOLD`]; the first one the session accepts opens the way for all. A client that
//! ignores `Retry-After` and floods a full session then costs the server one try per
//! hold instead of a body read and a parse per request, so the sessions of other
//! clients keep their latency. At most [`MAX_WAITING`] pushes wait per session; more
//! are refused at once, their bodies unread.
//!
//! This module only orders and holds requests by the answers the push route gave; it
//! never reads a body, parses an item or asks the runtime anything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::error::ApiError;
use crate::error::ErrorCode;

/// How long a full session is left alone between two tries of the pushes waiting for it.
pub const HOLD: Duration = Duration::from_millis(50);

/// How many pushes may wait for one full session; more are refused at once.
pub const MAX_WAITING: usize = 64;

/// Gates kept before stale ones (no waiter, last refusal long past) are dropped.
const PRUNE_AT: usize = 1024;

/// The route whose requests this gate orders.
const PUSH_ROUTE: &str = "/sessions/{id}/items";

/// One full session's gate: its pushes pass one at a time, each no sooner than
/// `not_before`.
#[derive(Debug)]
struct Gate {
    /// When the next waiting push may be tried; held by the push being tried.
    not_before: tokio::sync::Mutex<Instant>,
    /// Pushes waiting or being tried.
    waiting: AtomicUsize,
}

/// The sessions that refused their last push as full, by id.
#[derive(Debug, Default)]
pub(crate) struct FullSessions {
    gates: parking_lot::Mutex<HashMap<String, Arc<Gate>>>,
    /// How many gates there are, read without the lock: while no session is full (the
    /// usual case) a push passes without copying its id or taking the lock (B8). A push
    /// that reads 0 as a gate is made passes ungated once, which the gate allows.
    count: AtomicUsize,
}

/// A waiting push's place; gives it back on drop (also when the client goes away).
struct Waiting(Arc<Gate>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

fn is_full(response: &Response) -> bool {
    response
        .extensions()
        .get::<ErrorCode>()
        .is_some_and(|c| c.0 == "session_full")
}

impl FullSessions {
    fn gates(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Arc<Gate>>> {
        self.gates.lock()
    }

    fn gate(&self, id: &str) -> Option<Arc<Gate>> {
        self.gates().get(id).cloned()
    }

    /// Marks `id` full from now: the next push waits for [`HOLD`].
    fn close(&self, id: &str) {
        let mut gates = self.gates();
        if gates.len() >= PRUNE_AT {
            gates.retain(|_, g| {
                g.waiting.load(Ordering::Acquire) > 0
                    || g.not_before
                        .try_lock()
                        .map_or(true, |t| t.elapsed() < Duration::from_secs(60))
            });
        }
        gates.entry(id.to_owned()).or_insert_with(|| {
            Arc::new(Gate {
                not_before: tokio::sync::Mutex::new(Instant::now() + HOLD),
                waiting: AtomicUsize::new(0),
            })
        });
        self.count.store(gates.len(), Ordering::Release);
    }

    /// Opens `id` again (its session took a push), unless another gate replaced `gate`.
    fn open(&self, id: &str, gate: &Arc<Gate>) {
        let mut gates = self.gates();
        if gates.get(id).is_some_and(|g| Arc::ptr_eq(g, gate)) {
            gates.remove(id);
        }
        self.count.store(gates.len(), Ordering::Release);
    }

    /// Whether any session is full (a gate exists).
    fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }
}

/// The session's id as the client wrote it (percent-encoded or not, one client writes
/// it the same way each time): the push route's one parameter.
fn push_id(uri: &axum::http::Uri) -> Option<&str> {
    uri.path()
        .strip_prefix("/sessions/")?
        .strip_suffix("/items")
}

/// The middleware: a push to a session with a gate waits its turn; every push's answer
/// closes or opens its session's gate.
pub(crate) async fn order_pushes(
    State(full): State<Arc<FullSessions>>,
    req: Request,
    next: Next,
) -> Response {
    let is_push = req
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| p.as_str() == PUSH_ROUTE);
    if !is_push {
        return next.run(req).await;
    }
    if !full.any() {
        // No session is full: no id copied, no lock taken; a refusal as full makes
        // this push's session the first gate.
        let uri = req.uri().clone();
        let response = next.run(req).await;
        if is_full(&response) {
            if let Some(id) = push_id(&uri) {
                full.close(id);
            }
        }
        return response;
    }
    let Some(id) = push_id(req.uri()).map(str::to_owned) else {
        return next.run(req).await;
    };
    let Some(gate) = full.gate(&id) else {
        let response = next.run(req).await;
        if is_full(&response) {
            full.close(&id);
        }
        return response;
    };
    if gate.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
        gate.waiting.fetch_sub(1, Ordering::AcqRel);
        return ApiError::session_full(format!(
            "session {id} is full and {MAX_WAITING} pushes already wait for room; retry \
             later (after Retry-After), the body of this one was not read"
        ))
        .into_response();
    }
    let place = Waiting(gate.clone());
    let mut not_before = place.0.not_before.lock().await;
    tokio::time::sleep_until(*not_before).await;
    let response = next.run(req).await;
    if is_full(&response) {
        *not_before = Instant::now() + HOLD;
    } else {
        full.open(&id, &place.0);
    }
    drop(not_before);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    /// A push route that answers full while `room` is zero, counting the pushes it saw.
    fn app(room: Arc<AtomicUsize>, seen: Arc<AtomicUsize>) -> Router {
        let full = Arc::new(FullSessions::default());
        Router::new()
            .route(
                PUSH_ROUTE,
                post(move || {
                    let (room, seen) = (room.clone(), seen.clone());
                    async move {
                        seen.fetch_add(1, Ordering::AcqRel);
                        if room.load(Ordering::Acquire) == 0 {
                            ApiError::session_full("full").into_response()
                        } else {
                            room.fetch_sub(1, Ordering::AcqRel);
                            "ok".into_response()
                        }
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(full, order_pushes))
    }

    fn push(id: &str) -> Request {
        Request::post(format!("/sessions/{id}/items"))
            .body(axum::body::Body::empty())
            .expect("request")
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_session_is_tried_once_per_hold_and_opens_on_the_first_acceptance() {
        let room = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(0));
        let app = app(room.clone(), seen.clone());
        // The first refusal closes the gate.
        let r = app.clone().oneshot(push("s")).await.expect("answer");
        assert_eq!(r.status(), 429);
        // A flood of 20 pushes while full: each waits its turn, one try per hold.
        let started = Instant::now();
        let flood: Vec<_> = (0..20)
            .map(|_| tokio::spawn(app.clone().oneshot(push("s"))))
            .collect();
        for f in flood {
            let r = f.await.expect("task").expect("answer");
            assert_eq!(r.status(), 429);
        }
        assert_eq!(
            seen.load(Ordering::Acquire),
            21,
            "every waiting push is tried"
        );
        assert!(
            started.elapsed() >= HOLD * 20,
            "20 tries of a full session took {:?}, under 20 holds",
            started.elapsed()
        );
        // Another session is not held.
        let other = Instant::now();
        room.store(1, Ordering::Release);
        let r = app.clone().oneshot(push("t")).await.expect("answer");
        assert_eq!(r.status(), 200);
        assert_eq!(other.elapsed(), Duration::ZERO);
        // Room again: one more hold, then the gate opens and pushes pass at once.
        room.store(100, Ordering::Release);
        let r = app.clone().oneshot(push("s")).await.expect("answer");
        assert_eq!(r.status(), 200);
        let open = Instant::now();
        for _ in 0..5 {
            let r = app.clone().oneshot(push("s")).await.expect("answer");
            assert_eq!(r.status(), 200);
        }
        assert_eq!(
            open.elapsed(),
            Duration::ZERO,
            "an open session is not held"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn more_than_max_waiting_are_refused_at_once_unread() {
        let room = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(0));
        let app = app(room, seen.clone());
        let _ = app.clone().oneshot(push("s")).await.expect("answer");
        let waiting: Vec<_> = (0..MAX_WAITING)
            .map(|_| tokio::spawn(app.clone().oneshot(push("s"))))
            .collect();
        // Let every waiter take its place.
        tokio::task::yield_now().await;
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let before = seen.load(Ordering::Acquire);
        let r = app.clone().oneshot(push("s")).await.expect("answer");
        assert_eq!(r.status(), 429);
        assert_eq!(
            seen.load(Ordering::Acquire),
            before,
            "the push over the bound never reached the route"
        );
        for w in waiting {
            let _ = w.await;
        }
    }
}
