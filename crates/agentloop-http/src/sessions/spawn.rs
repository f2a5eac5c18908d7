//! `POST /sessions`: a spawn's JSON body turned into one [`agentloop::SessionSpec`] and
//! one runtime call. It decides nothing the runtime decides.

use super::{body, AppState, Ev, Item, DEFAULT_REPLAY};
use crate::error::ApiError;
use agentloop::{Durability, SessionSpec};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// The most events a session spawned over HTTP may keep.
const MAX_KEPT_EVENTS: u64 = 1_000_000;
/// The longest a session spawned over HTTP may keep its events, in seconds.
const MAX_KEPT_AGE_S: u64 = 365 * 24 * 3600;

/// `POST /sessions`.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = SpawnRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpawnBody {
    /// The new session's id (1 to 128 bytes, no control characters).
    #[schema(value_type = crate::schemas::SessionIdText)]
    id: String,
    /// A registered agent kind (`sim` on `agentloop serve`).
    kind: String,
    /// The agent's configuration, as its kind reads it.
    #[serde(default)]
    config: Option<Value>,
    /// Keep a record in the store (resumes after restarts).
    #[serde(default)]
    persistent: bool,
    /// `sync` (the default), `turn` or `exit`.
    #[serde(default)]
    #[schema(value_type = Option<crate::schemas::DurabilityName>)]
    durability: Option<String>,
    /// Recent events kept for SSE clients that reconnect with `Last-Event-ID`.
    #[serde(default)]
    replay: Option<usize>,
    /// Turn-end checkpoints to keep (`GET /sessions/{id}/history`); needs `persistent`.
    #[serde(default)]
    history: Option<usize>,
    /// Events kept in the store (S20a): `false` keeps none, `{"count": n,
    /// "max_age_s": s}` sets the retention; a persistent session keeps 10 000 events
    /// for a day by default.
    #[serde(default)]
    events: Option<EventsBody>,
}

/// The `events` field of a spawn.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = EventRetention)]
#[serde(untagged)]
pub(crate) enum EventsBody {
    /// `true` (the defaults) or `false` (none).
    On(bool),
    /// A retention.
    Retention {
        /// Events kept (1 to 1 000 000; 10 000 by default).
        #[serde(default)]
        count: Option<u64>,
        /// Seconds they are kept (at most a year; a day by default).
        #[serde(default)]
        max_age_s: Option<u64>,
    },
}

/// Spawn a session.
#[utoipa::path(
    post, path = "/sessions", operation_id = "spawn_session", tag = "sessions",
    request_body = SpawnBody,
    responses((status = 201, description = "Spawned", body = crate::schemas::Spawned),
        (status = 400, description = "`bad_request`: a bad id, an unknown kind, a refused config, a bad durability, history without persistence", body = crate::schemas::ErrorBody),
        (status = 409, description = "`duplicate`: a session runs or is stored under the id; `version_unavailable` (S40)", body = crate::schemas::ErrorBody),
        (status = 429, description = "`too_many_sessions` (`Retry-After`): the server runs as many sessions as it may; `too_many`", body = crate::schemas::ErrorBody),
        (status = 503, description = "`draining`: the shutdown began", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn spawn<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    raw: Result<Json<SpawnBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = body(raw)?;
    let replay = b.replay.unwrap_or(DEFAULT_REPLAY);
    if replay > st.max_replay {
        return Err(ApiError::bad_request(format!(
            "replay {replay} is more than this server allows: at most {} events (its [limits] replay)",
            st.max_replay
        )));
    }
    let mut spec = SessionSpec::new(b.id.clone(), b.kind)
        .persistent(b.persistent)
        .replay(replay);
    if let Some(n) = b.history {
        if !b.persistent {
            return Err(ApiError::bad_request(
                "history keeps checkpoints in the store: set \"persistent\": true too",
            ));
        }
        let max = agentloop::store::history::MAX_HISTORY;
        if n > max {
            return Err(ApiError::bad_request(format!(
                "history {n} is more than a session may keep: at most {max} checkpoints"
            )));
        }
        spec = spec.history(n);
    }
    let default = agentloop::event_log::Retention::default();
    let keep = match b.events {
        None | Some(EventsBody::On(true)) => b.persistent.then_some(default),
        Some(EventsBody::On(false)) => None,
        Some(EventsBody::Retention { count, max_age_s }) => {
            if !b.persistent {
                return Err(ApiError::bad_request(
                    "events are kept in the store: set \"persistent\": true too",
                ));
            }
            let count = count.unwrap_or(default.count);
            if count == 0 || count > MAX_KEPT_EVENTS {
                return Err(ApiError::bad_request(format!(
                    "events.count {count}: ask for 1 to {MAX_KEPT_EVENTS} events, or set \"events\": false"
                )));
            }
            if max_age_s.is_some_and(|s| s == 0 || s > MAX_KEPT_AGE_S) {
                return Err(ApiError::bad_request(format!(
                    "events.max_age_s: ask for 1 to {MAX_KEPT_AGE_S} seconds (a year)"
                )));
            }
            Some(agentloop::event_log::Retention {
                count,
                max_age_ms: max_age_s
                    .map(|s| s.saturating_mul(1000))
                    .or(default.max_age_ms),
            })
        }
    };
    if let Some(retention) = keep {
        spec = spec.keep_events(retention);
    }
    if let Some(config) = b.config {
        let bytes = serde_json::to_vec(&config)
            .map_err(|e| ApiError::bad_request(format!("config: {e}")))?;
        spec = spec.config(bytes);
    }
    if let Some(d) = b.durability {
        spec = spec.durability(match d.as_str() {
            "sync" => Durability::Sync,
            "turn" => Durability::Turn,
            "exit" => Durability::Exit,
            other => {
                return Err(ApiError::bad_request(format!(
                    "durability `{other}`: use sync, turn or exit"
                )))
            }
        });
    }
    st.runtime.supervisor().spawn(spec).await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": b.id }))).into_response())
}
