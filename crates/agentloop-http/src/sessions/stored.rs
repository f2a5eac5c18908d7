//! The routes over a session's stored record: its history (S16b), a checkpoint of it,
//! and its deletion.

use super::id::{checked_id, SessionId};
use super::read::view_json;
use super::{AppState, Ev, Item};
use crate::ApiError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

/// `GET /sessions/{id}/history`: the kept turn-end checkpoints, oldest first.
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

/// `GET /sessions/{id}/history/{turn}`: that checkpoint's view (redacted).
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

/// `DELETE /sessions/{id}`: the record and its history. 409 while the session runs.
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
