//! `GET /sessions/{id}/events`: the session's events as server-sent events, after the
//! client's `Last-Event-ID` when it gives one (S20).

use super::id::SessionId;
use super::{AppState, Ev, Item};
use crate::limits::too_many;
use crate::ApiError;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::Response;

/// `GET /sessions/{id}/events`.
pub(crate) async fn events<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Last-Event-ID must be an event id this server sent (a number)",
                    )
                })?,
        ),
    };
    let slot = st
        .streams
        .try_take()
        .ok_or_else(|| too_many("event streams", st.streams.max()))?;
    let filter = agentloop::EventFilter::all();
    // Here, or relayed from the node that runs it (issue 18).
    let stream = match st.runtime.subscribe_anywhere(&id, after, filter).await {
        Ok(stream) => stream,
        // Issue 28: stored but not live yet. A browser's EventSource treats any answer
        // but a 200 event stream as final and stops reconnecting, so this is a 200
        // stream of one `not_live` event whose `retry:` tells it when to reconnect
        // (with the same Last-Event-ID); it closes at once.
        Err(e @ agentloop::cluster::control::ControlError::NotLive { .. }) => {
            let after = e.retry_after().unwrap_or(agentloop::liveness::RETRY_SOON);
            return Ok(crate::events::not_live(&e.to_string(), after));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(crate::events::sse(stream, st.runtime.redaction().clone(), slot).into_response())
}
