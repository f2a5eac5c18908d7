//! `GET /sessions/{id}/events` as Server-Sent Events (issue 17, S33): `id:` is the
//! event's sequence number, `event:` its kind, `data:` its JSON (stable names from
//! `wire`; agent events and questions through the runtime's redaction); `Last-Event-ID`
//! resumes after that number from the session's replay buffer (a `lagged` event first
//! when some are gone); keep-alive comments every 15 s; the last event is `ended` with
//! the exit reason (`{"kind": "shutdown"}` when the server is going away), sent only when
//! nothing of the session runs again: an incarnation its supervisor restarts ends its
//! stream with `restarting` `{attempt, after_ms, error}` instead, and the client's
//! reconnect with `Last-Event-ID` follows the new one (S26, issue 53). A session that
//! is stored but not live yet answers one `not_live` event with SSE's `retry:` (issue
//! 28). This module only shapes events; subscribing is the supervisor's.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::Stream;
use futures_util::StreamExt as _;
use serde::Serialize;
use serde_json::{json, Value};

use agentloop::{view::Part, view::Redaction, EventStream, SessionEvent};

use crate::limits::Slot;
use crate::wire;

/// How often an idle stream sends a keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The reconnection delay every stream announces first (SSE `retry:`): a client whose
/// stream closed (a restart, a deploy, a failover) reconnects after it with its
/// `Last-Event-ID`, and gets what it missed from the store (S20a).
pub const RETRY: Duration = Duration::from_secs(1);

/// The SSE name and the JSON of one event, as a client may see it; `upper_bound`:
/// a `lagged`'s count is an upper bound ([`EventStream::lagged_upper_bound`]).
pub(crate) fn event_json<E: Serialize>(
    ev: &SessionEvent<E>,
    redaction: &Redaction,
    upper_bound: bool,
) -> (&'static str, Value) {
    match ev {
        SessionEvent::TurnStarted {
            turn,
            items,
            resumed,
        } => (
            "turn_started",
            json!({"turn": turn, "items": items, "resumed": resumed}),
        ),
        SessionEvent::Agent { turn, event } => {
            let event = serde_json::to_value(event)
                .unwrap_or_else(|e| json!({"unserializable": e.to_string()}));
            (
                "agent",
                json!({"turn": turn, "event": redaction.apply(Part::Event, event)}),
            )
        }
        SessionEvent::StepStarted { turn, key, rerun } => (
            "step_started",
            json!({"turn": turn, "key": key.to_string(), "name": key.name, "occurrence": key.occurrence, "rerun": rerun}),
        ),
        SessionEvent::StepFinished {
            turn,
            key,
            replayed,
            unknown,
        } => (
            "step_finished",
            json!({"turn": turn, "key": key.to_string(), "name": key.name, "occurrence": key.occurrence, "replayed": replayed, "unknown": unknown}),
        ),
        SessionEvent::Preempted { turn } => ("preempted", json!({"turn": turn})),
        SessionEvent::TurnEnded {
            turn,
            outcome,
            durable,
        } => (
            "turn_ended",
            json!({"turn": turn, "outcome": redact_question(wire::turn_end(outcome), redaction), "durable": durable}),
        ),
        SessionEvent::StopRequested { cancel, cause } => (
            "stop_requested",
            json!({"cancel": cancel.map(wire::cancel_mode), "cause": cause}),
        ),
        SessionEvent::Ended(x) => (
            "ended",
            json!({
                "session_id": x.session_id,
                "reason": redact_question(wire::exit_reason(&x.reason), redaction),
                "stop_cause": x.stop_cause,
                "unhandled": x.unhandled,
                "interrupted": x.interrupted,
                "late": x.late,
                "checkpoint": wire::checkpoint(&x.checkpoint),
            }),
        ),
        SessionEvent::Restarting {
            attempt,
            after_ms,
            error,
        } => (
            "restarting",
            json!({"attempt": attempt, "after_ms": after_ms, "error": error}),
        ),
        SessionEvent::Lagged { missed } => (
            "lagged",
            json!({"missed": missed, "upper_bound": upper_bound}),
        ),
    }
}

/// An interrupt's question goes through the redaction like the view's does.
fn redact_question(mut v: Value, redaction: &Redaction) -> Value {
    if let Some(q) = v.get_mut("question") {
        *q = redaction.apply(Part::Question, q.take());
    }
    v
}

/// The SSE response for a subscribed stream: it ends after `ended`. The stream is the
/// subscription itself (no task between them), so a client that goes away drops its
/// subscriber, and its stream slot, at once, however quiet the session is.
pub(crate) fn sse<E>(
    events: EventStream<E>,
    redaction: Redaction,
    slot: Slot,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    E: Clone + Send + Sync + Serialize + 'static,
{
    let stream = futures_util::stream::unfold(Some((events, slot)), move |state| {
        let redaction = redaction.clone();
        async move {
            let (mut events, slot) = state?;
            // A replay's events are in memory and come without waiting, and hyper
            // polls the body for as long as its buffer takes them: each event spends
            // a unit of the task's budget, so that a client reading a long replay as
            // fast as it can yields its worker every 128 events to everyone else's
            // requests (without it, the soak's replay storm took another client's
            // push p99 from 4-25 ms to 0.6-1.2 s on two cores).
            tokio::task::consume_budget().await;
            let s = events.next_sequenced().await?;
            let (name, data) = event_json(&s.event, &redaction, events.lagged_upper_bound());
            let ev = Event::default()
                .id(s.seq.to_string())
                .event(name)
                .data(data.to_string());
            // After `ended` nothing follows: close the stream. After `restarting` this
            // incarnation's stream ends too: the client's reconnect (SSE `retry:`,
            // with `Last-Event-ID`) follows the restarted incarnation.
            let next = (name != "ended" && name != "restarting").then_some((events, slot));
            Some((Ok(ev), next))
        }
    });
    let retry = futures_util::stream::once(async { Ok(Event::default().retry(RETRY)) });
    Sse::new(retry.chain(stream)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// The answer to a subscription for a session that is stored but not live yet (issue
/// 28): a `200` event stream of one `not_live` event (`{"code": "not_live", "message",
/// "retry_after_ms"}`) after an SSE `retry:` field of `retry_after`, then closed. A
/// browser's EventSource treats any other status as final; this way it reconnects after
/// `retry_after` with the same `Last-Event-ID`. `Retry-After` says the same for other
/// clients.
pub(crate) fn not_live(message: &str, retry_after: Duration) -> axum::response::Response {
    use axum::http::{header, HeaderValue, StatusCode};
    use axum::response::IntoResponse;
    let ms = retry_after.as_millis() as u64;
    let data = json!({ "code": "not_live", "message": message, "retry_after_ms": ms });
    let body = format!("retry: {ms}\nevent: not_live\ndata: {data}\n\n");
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(crate::error::retry_after_secs(retry_after)),
    );
    response
}
