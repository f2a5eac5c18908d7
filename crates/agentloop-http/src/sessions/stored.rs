//! The routes over a session's stored record: its history (S16b), a checkpoint of it,
//! and its deletion.

use super::id::{checked_id, SessionId};
use super::read::view_json;
use super::{AppState, Ev, Item};
use crate::error::ApiError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

/// List a session's kept checkpoints.
///
/// `GET /sessions/{id}/history`: the kept turn-end checkpoints, oldest first.
#[utoipa::path(
    get, path = "/sessions/{id}/history", operation_id = "list_history", tag = "history",
    params(super::id::SessionId),
    responses((status = 200, description = "Kept checkpoints, oldest first", body = Vec<crate::schemas::HistoryEntry>),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: nothing stored", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn history<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    agentloop::ids::validate_session_id(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let list = st.runtime.history(&id).await?;
    if list.is_empty() && st.runtime.view(&id).await?.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!("nothing is stored under `{id}`: no record, no history"),
        ));
    }
    Ok(Json(json!(list)))
}

/// Read a kept checkpoint.
///
/// `GET /sessions/{id}/history/{turn}`: that checkpoint's view (redacted).
#[utoipa::path(
    get, path = "/sessions/{id}/history/{turn}", operation_id = "get_checkpoint", tag = "history",
    params(super::id::SessionId, ("turn" = u64, Path, description = "The turn the checkpoint ended")),
    responses((status = 200, description = "That checkpoint's view (redacted)", body = crate::schemas::SessionView),
        (status = 400, description = "`bad_request`: an invalid id or turn", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_checkpoint`", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn checkpoint<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    path: Result<Path<(String, u64)>, axum::extract::rejection::PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((id, turn)) = path.map_err(|e| {
        ApiError::bad_request(format!(
            "the path must be /sessions/<id>/history/<turn number>: {}",
            e.body_text()
        ))
    })?;
    checked_id(&id)?;
    match st.runtime.checkpoint(&id, turn).await? {
        Some(v) => Ok(Json(view_json(&v))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_checkpoint",
            format!("session `{id}` keeps no checkpoint of turn {turn}; list them with GET /sessions/{id}/history"),
        )),
    }
}

/// Delete a stored session.
///
/// `DELETE /sessions/{id}`: the record and its history. 409 while the session runs.
#[utoipa::path(
    delete, path = "/sessions/{id}", operation_id = "delete_session", tag = "sessions",
    params(super::id::SessionId),
    responses((status = 200, description = "The record, its history and its kept events are deleted", body = crate::schemas::Deleted),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: nothing stored", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state`: it runs (stop it first)", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`: the store failed", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn delete<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    if st.runtime.delete(&id).await? {
        Ok(Json(json!({ "id": id, "deleted": true })))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!("nothing is stored under `{id}`"),
        ))
    }
}

/// `POST /sessions/{id}/history/{turn}/fork`'s body.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[schema(as = ForkRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    /// The new session's id.
    #[schema(value_type = crate::schemas::SessionIdText)]
    id: String,
    /// Checkpoints the new session keeps (default: none).
    #[serde(default)]
    history: usize,
}

/// The most checkpoints a fork over HTTP may ask to keep.
const MAX_FORK_HISTORY: usize = 1_000;

/// Fork a new session from a checkpoint.
///
/// `POST /sessions/{id}/history/{turn}/fork` with `{"id": "<new id>", "history": n?}`:
/// starts a new persistent session from that kept checkpoint (S16b,
/// `SupervisorHandle::fork`), with the source's kind, configuration and settings as
/// the checkpoint kept them; 201 `{"id", "from", "turn"}`.
#[utoipa::path(
    post, path = "/sessions/{id}/history/{turn}/fork", operation_id = "fork_checkpoint", tag = "history",
    params(super::id::SessionId, ("turn" = u64, Path, description = "The turn the checkpoint ended")),
    request_body = ForkBody,
    responses((status = 201, description = "A new persistent session from that checkpoint; it runs at once (S16b)", body = crate::schemas::Forked),
        (status = 400, description = "`bad_request`: a bad id or body", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_checkpoint`", body = crate::schemas::ErrorBody),
        (status = 409, description = "`duplicate`: a record exists under the new id", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn fork<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    path: Result<Path<(String, u64)>, axum::extract::rejection::PathRejection>,
    raw: Result<Json<ForkBody>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Path((from, turn)) = path.map_err(|e| {
        ApiError::bad_request(format!(
            "the path must be /sessions/<id>/history/<turn number>/fork: {}",
            e.body_text()
        ))
    })?;
    checked_id(&from)?;
    let b = super::body(raw)?;
    if b.history > MAX_FORK_HISTORY {
        return Err(ApiError::bad_request(format!(
            "history: {} is over the bound of {MAX_FORK_HISTORY} checkpoints",
            b.history
        )));
    }
    st.runtime
        .supervisor()
        .fork(&from, turn, &b.id, agentloop::Durability::Sync, b.history)
        .await
        .map_err(fork_error)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": b.id, "from": from, "turn": turn})),
    ))
}

/// A refused fork, said with its status.
fn fork_error(e: agentloop::session::ForkError) -> ApiError {
    use agentloop::session::ForkError as F;
    let (status, code) = match &e {
        F::InvalidId(_) | F::NotPersistent(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        F::UnknownCheckpoint { .. } => (StatusCode::NOT_FOUND, "unknown_checkpoint"),
        F::Exists { .. } => (StatusCode::CONFLICT, "duplicate"),
        F::Store { .. } | F::Spawn { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        // S34a: load, so 429 with when to retry (issue 52).
        F::TooManySessions { .. } => {
            return ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "too_many_sessions",
                message: e.to_string(),
                retry_after: Some(std::time::Duration::from_secs(1)),
            }
        }
    };
    ApiError::new(status, code, e.to_string())
}
