//! `GET /sessions/{id}/events`: the session's events as server-sent events, after the
//! client's `Last-Event-ID` when it gives one (S20).

use super::id::SessionId;
use super::{AppState, Ev, Item};
use crate::error::ApiError;
use crate::limits::too_many;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::Response;

/// Follow a session's events (Server-Sent Events).
///
/// `GET /sessions/{id}/events`.
#[utoipa::path(
    get, path = "/sessions/{id}/events", operation_id = "stream_events", tag = "events",
    params(super::id::SessionId,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event number"),
        ("access_token" = Option<String>, Query, description = "The bearer token, for browsers' EventSource (prefer the header)")),
    responses((status = 200, description = "Server-Sent Events, each `id: <number>`, `event: <kind>`, `data: <JSON>`: one `StreamEvent` per event (`id`, `event` and `data`, whose schema the event's name picks); the stream starts with `retry: 1000` and closes after `ended`. A session stored but not live yet answers one `not_live` event with `retry:`.", content_type = "text/event-stream", body = crate::schemas::StreamEvent),
        (status = 400, description = "`bad_request`: a `Last-Event-ID` that is not a number, an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`: stored, not running", body = crate::schemas::ErrorBody),
        (status = 429, description = "`too_many`: event streams at their bound", body = crate::schemas::ErrorBody),
        (status = 502, description = "`owner_unreachable`", body = crate::schemas::ErrorBody))
)]
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
