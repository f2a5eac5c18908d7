//! The front door's own routes (S28, S34a): the live page, the liveness probe and the
//! readiness probe (503 once the shutdown began). They read nothing of a session.

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::Json;

use crate::error::ApiError;
use crate::sessions::{AppState, Ev, Item};

/// The live page (static HTML and JavaScript, no build step).
const PAGE: &str = include_str!("../assets/index.html");

/// The live page.
///
/// The page (HTML), with headers that keep it from being framed, sniffed or leaking its
/// URL (which may carry the token) to other sites (S34a).
#[utoipa::path(
    get, path = "/", operation_id = "page", tag = "probes",
    responses((status = 200, description = "The live page (HTML)", content_type = "text/html"))
)]
pub(crate) async fn page() -> impl IntoResponse {
    (
        [
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' \
                 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; frame-ancestors \
                 'none'; base-uri 'none'; form-action 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        Html(PAGE),
    )
}

/// Liveness probe.
#[utoipa::path(
    get, path = "/healthz", operation_id = "healthz", tag = "probes",
    responses((status = 200, description = "The process is up", body = crate::schemas::Health))
)]
pub(crate) async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "up" }))
}

/// Readiness probe.
#[utoipa::path(
    get, path = "/readyz", operation_id = "readyz", tag = "probes",
    responses((status = 200, description = "It accepts work", body = crate::schemas::Ready),
        (status = 503, description = "`draining`: the shutdown began", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn readyz<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
) -> Result<impl IntoResponse, ApiError> {
    if st.runtime.shutdown_handle().is_started().await {
        return Err(ApiError::draining(
            "the runtime is shutting down and accepts no new work; send it elsewhere",
        ));
    }
    Ok(Json(serde_json::json!({ "status": "ready" })))
}
