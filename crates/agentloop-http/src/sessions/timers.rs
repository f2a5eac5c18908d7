//! `/sessions/{id}/timers`: a session's durable timers and schedules (S39): arm one
//! (`at_ms`, `in` or a `schedule`), list them, cancel one. Each is one runtime call,
//! durable before it is answered; the runtime fires them.

use super::id::SessionId;
use super::parse::{off_worker, JsonBytes, OFF_WORKER_AT};
use super::{body, duration, from_json_text, AppState, Ev, Item};
use crate::error::ApiError;
use agentloop::{timers::Timer, timers::TimerError, Schedule};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

/// `POST /sessions/{id}/timers`: the item and exactly one of when.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = TimerRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct TimerBody {
    /// The item to push when it is due.
    #[schema(value_type = serde_json::Value)]
    item: Box<serde_json::value::RawValue>,
    /// When, in ms since the Unix epoch.
    #[serde(default)]
    at_ms: Option<u64>,
    /// In how long, e.g. `"10m"`.
    #[serde(default, rename = "in")]
    in_: Option<String>,
    /// A schedule: `"every 5m"` or a cron expression (UTC).
    #[serde(default)]
    schedule: Option<String>,
}

impl From<TimerError> for ApiError {
    fn from(e: TimerError) -> Self {
        let (status, code) = match &e {
            TimerError::NoRecord { .. } => (StatusCode::NOT_FOUND, "unknown_session"),
            TimerError::Cron { .. } | TimerError::CronNever { .. } | TimerError::Period => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            TimerError::Item(_) | TimerError::PeriodTooShort { .. } => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            // S34a (issue 52): the session's timers are bounded.
            TimerError::ItemTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            TimerError::TooMany { .. } => {
                return ApiError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    code: "too_many_timers",
                    message: e.to_string(),
                    retry_after: Some(Duration::from_secs(1)),
                }
            }
            TimerError::NoStore | TimerError::Session(_) => (StatusCode::CONFLICT, "wrong_state"),
            TimerError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// The furthest `in` a timer takes.
const TEN_YEARS: Duration = Duration::from_secs(3650 * 86_400);

fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn view<I: Item>(t: Timer<I>) -> Value {
    json!({
        "id": t.id,
        "due_ms": ms(t.due),
        "item": t.item,
        "schedule": t.schedule.map(|s| match s {
            Schedule::Every(d) => format!("every {}ms", d.as_millis()),
            Schedule::Cron(expr) => expr,
        }),
        "fired": t.fired,
        "armed_ms": ms(t.armed),
    })
}

/// Arm a timer or a schedule.
#[utoipa::path(
    post, path = "/sessions/{id}/timers", operation_id = "arm_timer", tag = "timers",
    params(super::id::SessionId),
    request_body = TimerBody,
    responses((status = 201, description = "Durable before it is answered; at its time the item is pushed once (S39)", body = crate::schemas::Timer),
        (status = 400, description = "`bad_request`: not an item, none or two of when, a cron expression that does not parse, a schedule more often than `[limits] timer_period`", body = crate::schemas::ErrorBody),
        (status = 413, description = "`too_large`: the item is over `[limits] timer_bytes`", body = crate::schemas::ErrorBody),
        (status = 429, description = "`too_many_timers`: the session holds `[limits] session_timers` timers; `Retry-After`", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`: not persistent, or exiting", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn arm<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    JsonBytes(bytes): JsonBytes,
) -> Result<Response, ApiError> {
    // A timer's item may be up to `[limits] timer_bytes` (64 KiB): a large body is
    // parsed on the blocking pool, as a push's is (the soak: a timer storm of 60 kB
    // items held the workers every other client waits on).
    let (b, item) = off_worker(bytes.len(), move || {
        let b: TimerBody = body(Json::from_bytes(&bytes))?;
        let item: I = from_json_text(b.item.get())
            .map_err(|e| ApiError::bad_request(format!("item: {e}")))?;
        Ok((b, item))
    })
    .await?;
    let n = match (b.at_ms, b.in_, b.schedule) {
        (Some(at), None, None) => {
            let when = SystemTime::UNIX_EPOCH + Duration::from_millis(at);
            if when > SystemTime::now() + TEN_YEARS {
                return Err(ApiError::bad_request(format!(
                    "at_ms {at} is more than ten years away: give a time in ms since the Unix epoch, e.g. {}",
                    ms(SystemTime::now() + Duration::from_secs(3600))
                )));
            }
            st.runtime.wake_at(&id, when, item).await?
        }
        (None, Some(d), None) => {
            // A timer may be far off (not bounded by `max_duration`, which bounds waits).
            let when =
                SystemTime::now() + duration("in", &d, TEN_YEARS, "the furthest a timer is armed")?;
            st.runtime.wake_at(&id, when, item).await?
        }
        (None, None, Some(s)) => {
            let schedule: Schedule = s.parse()?;
            st.runtime.schedule(&id, schedule, item).await?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `at_ms` (ms since the Unix epoch), `in` (e.g. \"10m\") \
                 or `schedule` (\"every 5m\" or a cron expression)",
            ))
        }
    };
    // The new timer alone (issue 52: listing every timer at each arm made arming
    // cost all the session held).
    let timer = st.runtime.timer(&id, n).await?;
    let body = off_worker(bytes_hint(timer.is_some()), move || {
        let v = timer.map(view).unwrap_or_else(|| json!({ "id": n }));
        serde_json::to_vec(&v).map_err(unwritable)
    })
    .await?;
    Ok((StatusCode::CREATED, json_bytes(body)).into_response())
}

/// List a session's timers.
#[utoipa::path(
    get, path = "/sessions/{id}/timers", operation_id = "list_timers", tag = "timers",
    params(super::id::SessionId),
    responses((status = 200, description = "Timers and schedules, by number", body = crate::schemas::Timers),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn list<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Response, ApiError> {
    let timers = st.runtime.timers(&id).await?;
    // No timers and no session, live or stored: 404, as `history` answers (an empty
    // list would tell a client with a mistyped id that all is well).
    if timers.is_empty()
        && !st.runtime.supervisor().is_live(&id)
        && st.runtime.view(&id).await?.is_none()
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!("no session `{id}` runs here and none is stored; list them with GET /sessions"),
        ));
    }
    // Up to `[limits] session_timers` items of up to `timer_bytes` each (16 MiB by
    // default): written out on the blocking pool, never on a worker.
    let body = off_worker(bytes_hint(!timers.is_empty()), move || {
        let timers: Vec<Value> = timers.into_iter().map(view).collect();
        serde_json::to_vec(&json!({ "timers": timers })).map_err(unwritable)
    })
    .await?;
    Ok(json_bytes(body).into_response())
}

/// What [`off_worker`] is told of a response holding timers: any timer's item may be
/// as large as `[limits] timer_bytes`, so one with any is written off the worker.
fn bytes_hint(any_timer: bool) -> usize {
    if any_timer {
        OFF_WORKER_AT
    } else {
        0
    }
}

/// A view that could not be written as JSON (a JSON value always can: a bug).
fn unwritable(e: serde_json::Error) -> ApiError {
    tracing::error!(error = %e, "a timer's view could not be written as JSON");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("the server could not write the timers as JSON ({e}); report this as a bug"),
    )
}

/// A JSON response of bytes already written.
fn json_bytes(body: Vec<u8>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
}

/// Cancel a timer.
#[utoipa::path(
    delete, path = "/sessions/{id}/timers/{timer}", operation_id = "cancel_timer", tag = "timers",
    params(super::id::SessionId, ("timer" = u64, Path, description = "The timer's number")),
    responses((status = 204, description = "Canceled, durably"),
        (status = 400, description = "`bad_request`: an invalid id or number", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_timer`: it fired, or was canceled; `unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn cancel<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    path: Result<Path<(String, u64)>, axum::extract::rejection::PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, n)) = path.map_err(|e| {
        ApiError::bad_request(format!(
            "the path must be /sessions/<id>/timers/<timer number>: {}",
            e.body_text()
        ))
    })?;
    agentloop::ids::validate_session_id(&id)
        .map_err(|e| ApiError::bad_request(format!("session id: {e}")))?;
    match st.runtime.cancel_timer(&id, n).await? {
        true => Ok(StatusCode::NO_CONTENT.into_response()),
        false => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_timer",
            format!("session `{id}` has no timer {n} (it fired, or was canceled): list them with GET /sessions/{id}/timers"),
        )),
    }
}
