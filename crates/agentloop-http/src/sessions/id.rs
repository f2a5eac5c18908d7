//! The session id in a route's path, checked before any handler runs (S32, S34a): an
//! invalid id is a 400 on every route, never a 500 from the store, and never echoed.

use crate::error::ApiError;
use axum::extract::Path;

/// A session id taken from the path, checked before a handler runs (S32, S34a): one
/// extractor for every `/sessions/{id}/…` route, so an invalid id is a 400 on each of
/// them (never a 500 from the store) and the answer does not echo it back.
#[derive(utoipa::IntoParams)]
#[into_params(names("id"), parameter_in = Path)]
pub(crate) struct SessionId(
    /// The session's id.
    #[param(value_type = crate::schemas::SessionIdText)]
    pub(crate) String,
);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SessionId {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "the session id in the path cannot be read: {}",
                    e.body_text()
                ))
            })?;
        checked_id(&id)?;
        Ok(SessionId(id))
    }
}

/// `id` as a session id, or a 400 that says what is wrong without repeating it.
pub(super) fn checked_id(id: &str) -> Result<(), ApiError> {
    agentloop::session::validate_session_id(id)
        .map_err(|e| ApiError::bad_request(format!("invalid session id in the path: {e}")))
}
