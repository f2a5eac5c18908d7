//! The routes that change a running session's course: stop (every stop option), detach,
//! move, cancel and resume with an answer. Each is one runtime call.

use super::id::SessionId;
use super::{body, duration, from_json_text, optional_body, AppState, Ev, Item};
use crate::{wire, ApiError};
use agentloop::{store::SessionStatus, StopOptions};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;

/// `POST /sessions/{id}/stop`.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[schema(as = StopRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopBody {
    /// `graceful` (default), `at`, `immediate`, `drain`, `bare` or `idle`.
    #[serde(default)]
    #[schema(value_type = Option<crate::schemas::StopMode>)]
    mode: Option<String>,
    /// For `graceful` and `at`: the cancel's timeout, e.g. `"5s"`; for `idle`: how long
    /// idle.
    #[serde(default)]
    timeout: Option<String>,
    /// For `at`: the safe points (`after_model_call`, `after_tool_calls`, `any`).
    #[serde(default)]
    #[schema(value_type = Option<crate::schemas::SafePointName>)]
    at: Option<String>,
    /// For `idle`: how long the session must be idle before it exits.
    #[serde(default)]
    idle_for: Option<String>,
    /// The business stop cause (the first one given wins).
    #[serde(default)]
    cause: Option<String>,
    /// Exit without writing the exit checkpoint (sticky once asked).
    #[serde(default)]
    skip_checkpoint: bool,
}

pub(super) fn stop_options(b: StopBody, max: Duration) -> Result<StopOptions, ApiError> {
    let timeout = b
        .timeout
        .as_deref()
        .map(|t| duration("timeout", t, max, super::LIMITS_DURATION))
        .transpose()?;
    let mode = b.mode.as_deref().unwrap_or("graceful");
    let misplaced = |field: &str| {
        ApiError::bad_request(format!(
            "`{field}` does not apply to the `{mode}` stop mode"
        ))
    };
    if b.at.is_some() && mode != "at" {
        return Err(misplaced("at"));
    }
    if b.idle_for.is_some() && mode != "idle" {
        return Err(misplaced("idle_for"));
    }
    let mut o = match mode {
        "graceful" => match timeout {
            None => StopOptions::graceful(),
            Some(t) => StopOptions::graceful_timeout(t),
        },
        "at" => {
            let at = b.at.as_deref().ok_or_else(|| {
                ApiError::bad_request(
                    "the `at` stop mode needs `at`: after_model_call, after_tool_calls or any",
                )
            })?;
            let p = wire::parse_safe_point(at).map_err(ApiError::bad_request)?;
            let mut o = StopOptions::at(p);
            if let (Some(t), Some(c)) = (timeout, o.cancel.as_mut()) {
                c.timeout = Some(t);
            }
            o
        }
        "idle" => {
            let d = b.idle_for.as_deref().ok_or_else(|| {
                ApiError::bad_request("the `idle` stop mode needs `idle_for`, e.g. \"30s\"")
            })?;
            StopOptions::until_idle_for(duration("idle_for", d, max, super::LIMITS_DURATION)?)
        }
        m @ ("immediate" | "drain" | "bare") => {
            if timeout.is_some() {
                return Err(misplaced("timeout"));
            }
            match m {
                "immediate" => StopOptions::immediate(),
                "drain" => StopOptions::drain(),
                _ => StopOptions::bare(),
            }
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "mode `{other}`: use graceful, at, immediate, drain, bare or idle"
            )))
        }
    };
    if let Some(c) = b.cause {
        o = o.cause(c);
    }
    if b.skip_checkpoint {
        o = o.skip_checkpoint();
    }
    o.validate()
        .map_err(|e| ApiError::bad_request(format!("stop options: {e}")))?;
    Ok(o)
}

/// Stop a session.
#[utoipa::path(
    post, path = "/sessions/{id}/stop", operation_id = "stop_session", tag = "sessions",
    params(super::id::SessionId),
    request_body(content = Option<StopBody>, description = "Any stop option; no body is a graceful stop"),
    responses((status = 202, description = "The stop is on its way", body = crate::schemas::Stopping),
        (status = 400, description = "`bad_request`: an unknown mode, an option that does not apply, a zero duration", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`, `not_forwardable`", body = crate::schemas::ErrorBody),
        (status = 502, description = "`owner_unreachable`", body = crate::schemas::ErrorBody),
        (status = 503, description = "`not_live` (`Retry-After`), `draining`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn stop<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    raw: Result<Json<StopBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = optional_body(raw)?;
    // Wherever it runs: here, or (a cluster node) at its owner (issue 18).
    st.runtime
        .stop_anywhere(&id, stop_options(b, st.max_duration)?)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "id": id, "stopping": true })),
    )
        .into_response())
}

/// Detach a session.
///
/// `POST /sessions/{id}/detach` (S23): the session goes on in the background and its
/// record is finalized when it drains. Refused (409) for a session without a store.
#[utoipa::path(
    post, path = "/sessions/{id}/detach", operation_id = "detach_session", tag = "sessions",
    params(super::id::SessionId),
    responses((status = 200, description = "It drains in the background and its record is finalized (S23)", body = crate::schemas::Detached),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`: not persistent; `not_forwardable`", body = crate::schemas::ErrorBody),
        (status = 502, description = "`owner_unreachable`", body = crate::schemas::ErrorBody),
        (status = 503, description = "`not_live` (`Retry-After`), `draining`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn detach<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    st.runtime.detach_anywhere(&id).await?;
    Ok(Json(json!({ "id": id, "detached": true })))
}

/// `POST /sessions/{id}/move` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = MoveRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveBody {
    /// The node to move the session to.
    to: String,
    /// How long to wait for the next safe point before the stop escalates (default 5s).
    #[serde(default)]
    timeout: Option<String>,
}

/// Move a session to another node.
///
/// `POST /sessions/{id}/move` (issue 18, S38): a planned move of a session this node
/// runs to node `to` (a cluster node only). Pushes sent here meanwhile are queued and
/// delivered there in order.
#[utoipa::path(
    post, path = "/sessions/{id}/move", operation_id = "move_session", tag = "sessions",
    params(super::id::SessionId),
    request_body = MoveBody,
    responses((status = 200, description = "The node `to` runs it", body = crate::schemas::Moved),
        (status = 400, description = "`bad_request`", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: not running here", body = crate::schemas::ErrorBody),
        (status = 409, description = "`not_a_node`, `wrong_state`: the lease hand-over was refused", body = crate::schemas::ErrorBody),
        (status = 502, description = "`owner_unreachable`: `to` is not a joined node, or did not resume it", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn move_to<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    raw: Result<Json<MoveBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    use agentloop::cluster::migrate::MigrateError;
    let b = body(raw)?;
    let timeout = match &b.timeout {
        Some(t) => duration("timeout", t, st.max_duration, super::LIMITS_DURATION)?,
        None => Duration::from_secs(5),
    };
    match st.runtime.migrate(&id, &b.to, timeout).await {
        Ok(moved) => Ok(Json(json!({
            "id": id,
            "to": b.to,
            "stopped_ms": moved.stopped.as_millis() as u64,
            "total_ms": moved.total.as_millis() as u64,
        }))),
        Err(e) => {
            let (status, code) = match &e {
                MigrateError::NotANode(_) => (StatusCode::CONFLICT, "not_a_node"),
                MigrateError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "owner_unreachable"),
                MigrateError::NotHere(_) => (StatusCode::NOT_FOUND, "unknown_session"),
                MigrateError::Store { .. } => (StatusCode::CONFLICT, "wrong_state"),
                MigrateError::NotResumed { .. } => (StatusCode::BAD_GATEWAY, "owner_unreachable"),
            };
            Err(ApiError::new(status, code, e.to_string()))
        }
    }
}

/// Cancel a session.
///
/// `POST /sessions/{id}/cancel` (S24).
#[utoipa::path(
    post, path = "/sessions/{id}/cancel", operation_id = "cancel_session", tag = "sessions",
    params(super::id::SessionId),
    responses((status = 200, description = "Canceled (S24)", body = crate::schemas::Canceled),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody),
        (status = 503, description = "`draining`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn cancel<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    let status: SessionStatus = st.runtime.supervisor().cancel(&id).await?;
    Ok(Json(json!({ "id": id, "status": wire::status(&status) })))
}

/// `POST /sessions/{id}/resume`: `{"answer": <item>}` answers the session's business
/// interrupt and resumes it (S4).
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = ResumeRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeBody {
    /// The answer, an item as the server's item type reads it.
    answer: Value,
}

/// Answer an interrupt and resume.
#[utoipa::path(
    post, path = "/sessions/{id}/resume", operation_id = "resume_session", tag = "sessions",
    params(super::id::SessionId),
    request_body = ResumeBody,
    responses((status = 200, description = "The answer and the claim are one durable write; it runs again (S4)", body = crate::schemas::Resumed),
        (status = 400, description = "`bad_request`: not an item, not storable, an unknown kind", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: nothing stored", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`: not awaiting an answer, answered already, running; `version_unavailable`", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody),
        (status = 503, description = "`draining`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn resume<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    raw: Result<Json<ResumeBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let b = body(raw)?;
    let answer: I = from_json_text(&b.answer.to_string()).map_err(|e| {
        ApiError::bad_request(format!("answer: not an item this server takes: {e}"))
    })?;
    // The stream attached before the start is not needed: clients subscribe by id.
    let (_handle, _events) = st.runtime.resume_with_answer(&id, answer).await?;
    Ok(Json(json!({ "id": id, "resumed": true })))
}
