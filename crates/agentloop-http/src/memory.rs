//! The process's memory budget at the HTTP door (S34a, issue 52): a request that would
//! bring new work (a spawn, a push, a fork, an answer, a timer, a new event stream)
//! while the process holds more than its budget is refused with 503 `over_memory` and
//! `Retry-After` before its body is read. What frees memory or only reads (stops,
//! cancels, detaches, moves, deletes, views, lists, probes, `/metrics`) always goes through,
//! so the server can always be drained. The budget itself is
//! [`agentloop::memory::MemoryBudget`]; this file only decides which requests it gates.

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use agentloop::memory::MemoryBudget;

use crate::error::ApiError;

/// How long a refused request's body may take to be read and dropped.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a refused client waits before it tries again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a request brings new work (and so waits for memory).
fn brings_work(method: &Method, path: &str) -> bool {
    if *method == Method::GET {
        return path.ends_with("/events");
    }
    if *method == Method::POST || *method == Method::PUT || *method == Method::PATCH {
        return !["/stop", "/cancel", "/detach", "/move"]
            .iter()
            .any(|end| path.ends_with(end));
    }
    false
}

/// The middleware: refuses work over the budget.
pub(crate) async fn gate(State(budget): State<MemoryBudget>, req: Request, next: Next) -> Response {
    if brings_work(req.method(), req.uri().path()) {
        if let Err(over) = budget.check() {
            // The body is read and dropped as it arrives (never held), so a client
            // that sends it whole before reading the answer gets the answer, not a
            // broken pipe.
            let mut body = req.into_body().into_data_stream();
            let drain =
                async { while let Some(Ok(_)) = futures_util::StreamExt::next(&mut body).await {} };
            let _ = tokio::time::timeout(DRAIN, drain).await;
            return ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "over_memory",
                message: over.to_string(),
                retry_after: Some(RETRY),
            }
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_waits_for_memory_and_what_frees_it_does_not() {
        for (m, p) in [
            (Method::POST, "/sessions"),
            (Method::POST, "/sessions/a/items"),
            (Method::POST, "/sessions/a/timers"),
            (Method::POST, "/sessions/a/history/3/fork"),
            (Method::GET, "/sessions/a/events"),
        ] {
            assert!(brings_work(&m, p), "{m} {p}");
        }
        for (m, p) in [
            (Method::POST, "/sessions/a/stop"),
            (Method::POST, "/sessions/a/cancel"),
            (Method::POST, "/sessions/a/detach"),
            (Method::POST, "/sessions/a/move"),
            (Method::DELETE, "/sessions/a"),
            (Method::GET, "/sessions"),
            (Method::GET, "/sessions/a"),
            (Method::GET, "/healthz"),
            (Method::GET, "/metrics"),
        ] {
            assert!(!brings_work(&m, p), "{m} {p}");
        }
    }
}
