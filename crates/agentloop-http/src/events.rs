//! `GET /sessions/{id}/events` as Server-Sent Events (issue 17): `id:` is the event's
//! sequence number, `event:` its kind, `data:` its JSON; `Last-Event-ID` resumes after
//! that number from the session's replay buffer (a `lagged` event first when some are
//! gone); keep-alive comments every 15 s; the last event is `ended` with the exit.
//! This module only shapes events; subscribing is the supervisor's.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::Stream;
use serde::Serialize;
use serde_json::{json, Value};

use agentloop::{EventStream, SessionEvent};

/// The SSE name and the JSON of one event.
pub(crate) fn event_json<E: Serialize>(ev: &SessionEvent<E>) -> (&'static str, Value) {
    match ev {
        SessionEvent::TurnStarted {
            turn,
            items,
            resumed,
        } => (
            "turn_started",
            json!({"turn": turn, "items": items, "resumed": resumed}),
        ),
        SessionEvent::Agent { turn, event } => (
            "agent",
            json!({"turn": turn, "event": serde_json::to_value(event).unwrap_or_else(|e| json!({"unserializable": e.to_string()}))}),
        ),
        SessionEvent::Preempted { turn } => ("preempted", json!({"turn": turn})),
        SessionEvent::TurnEnded {
            turn,
            outcome,
            durable,
        } => (
            "turn_ended",
            json!({"turn": turn, "outcome": format!("{outcome:?}"), "durable": durable}),
        ),
        SessionEvent::StopRequested { cancel, cause } => (
            "stop_requested",
            json!({"cancel": cancel.map(|c| format!("{c:?}")), "cause": cause}),
        ),
        SessionEvent::Ended(x) => (
            "ended",
            json!({
                "session_id": x.session_id,
                "reason": format!("{:?}", x.reason),
                "stop_cause": x.stop_cause,
                "unhandled": x.unhandled,
                "interrupted": x.interrupted,
                "late": x.late,
                "checkpoint": format!("{:?}", x.checkpoint),
            }),
        ),
        SessionEvent::Lagged { missed } => ("lagged", json!({"missed": missed})),
    }
}

/// The SSE response for a subscribed stream: it ends after `ended`. The stream is the
/// subscription itself (no task between them), so a client that goes away drops its
/// subscriber at once, however quiet the session is.
pub(crate) fn sse<E>(events: EventStream<E>) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    E: Clone + Send + Sync + Serialize + 'static,
{
    let stream = futures_util::stream::unfold(Some(events), |state| async move {
        let mut events = state?;
        let s = events.next_sequenced().await?;
        let (name, data) = event_json(&s.event);
        let ev = Event::default()
            .id(s.seq.to_string())
            .event(name)
            .data(data.to_string());
        // After `ended` nothing follows: close the stream.
        let next = (name != "ended").then_some(events);
        Some((Ok(ev), next))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
