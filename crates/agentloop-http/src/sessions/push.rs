//! `POST /sessions/{id}/items`: an item and its preempt options, with an
//! `Idempotency-Key` remembered with the session (S34a), delivered wherever the session
//! runs. The runtime decides acceptance; this turns its answer into JSON.

use super::id::SessionId;
use super::parse::{off_worker, JsonBytes};
use super::{body, duration, fingerprint_hash, from_json_text, AppState, Ev, Item};
use crate::{wire, ApiError};
use agentloop::{Preempt, PushOptions};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// `POST /sessions/{id}/items`. The item stays raw JSON until the whole body is read:
/// it is parsed once, into the item type, and its text is the idempotency fingerprint.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = PushRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct PushBody {
    /// The item, as the server's item type reads it.
    #[schema(value_type = serde_json::Value)]
    item: Box<serde_json::value::RawValue>,
    /// Cut the running turn at a safe point so the item is handled sooner.
    #[serde(default)]
    preempt: Option<PreemptBody>,
}

/// The `Idempotency-Key` header, if any (read alone: the push path does not copy the
/// whole header map).
pub(crate) struct IdempotencyKey(Option<String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        match parts.headers.get("idempotency-key") {
            None => Ok(IdempotencyKey(None)),
            Some(v) => v
                .to_str()
                .map(|s| IdempotencyKey(Some(s.to_string())))
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be visible ASCII")),
        }
    }
}

/// A push's answer.
#[derive(serde::Serialize)]
pub(super) struct Pushed {
    preempt: Value,
}

/// A push's preempt: `{"at": "any", "timeout"?: "5s", "delay"?: "1s"}`.
#[derive(Deserialize, Debug, utoipa::ToSchema)]
#[schema(as = Preempt)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreemptBody {
    /// The safe point to cut the running turn at.
    #[schema(value_type = crate::schemas::SafePointName)]
    at: String,
    /// How long to wait for it before cutting at once (e.g. `"5s"`).
    #[serde(default)]
    timeout: Option<String>,
    /// Wait this long before asking (e.g. `"1s"`).
    #[serde(default)]
    delay: Option<String>,
}

pub(super) fn preempt(b: PreemptBody, max: Duration) -> Result<Preempt, ApiError> {
    let at = wire::parse_safe_point(&b.at)
        .map_err(|e| ApiError::bad_request(format!("preempt: {e}")))?;
    let mut p = Preempt::at(at);
    if let Some(t) = b.timeout {
        p = p.timeout(duration(
            "preempt timeout",
            &t,
            max,
            super::LIMITS_DURATION,
        )?);
    }
    if let Some(d) = b.delay {
        p = p.delay(duration("preempt delay", &d, max, super::LIMITS_DURATION)?);
    }
    p.validate()
        .map_err(|e| ApiError::bad_request(format!("preempt: {e}")))?;
    Ok(p)
}

/// Push an item to a session.
#[utoipa::path(
    post, path = "/sessions/{id}/items", operation_id = "push_item", tag = "sessions",
    params(super::id::SessionId, ("Idempotency-Key" = Option<String>, Header, description = "1 to 256 bytes: a retry with the same key delivers nothing again and gets the first answer")),
    request_body = PushBody,
    responses((status = 200, description = "Accepted (durable under `sync`)", body = crate::schemas::Pushed),
        (status = 400, description = "`bad_request`: not an item, not storable, a bad preempt, an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: nothing stored", body = crate::schemas::ErrorBody),
        (status = 409, description = "`wrong_state` (also: stored but not running), `idempotency_mismatch`, `version_unavailable`, `not_forwardable`", body = crate::schemas::ErrorBody),
        (status = 429, description = "`session_full` (`Retry-After`): nothing accepted; `too_many`", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`", body = crate::schemas::ErrorBody),
        (status = 502, description = "`owner_unreachable`: the node that runs it could not be reached", body = crate::schemas::ErrorBody),
        (status = 503, description = "`draining`: not accepted; `not_live` (`Retry-After`): stored, not live yet, retry; `unavailable`: the body could not be parsed now, retry", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn push<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    key: IdempotencyKey,
    JsonBytes(bytes): JsonBytes,
) -> Result<Response, ApiError> {
    // Parsed once (a large body on the blocking pool, not a worker): the body, the
    // fingerprint, the item. The whole request is checked before anything is
    // delivered: never half-accepted.
    let keyed = key.0.is_some();
    let (b, fingerprint, item) = off_worker(bytes.len(), move || {
        let b: PushBody = body(Json::from_bytes(&bytes))?;
        // What a retry with the same key must repeat: the item's text and its preempt
        // options (S34a: a retry that changes the preempt is another request). Built
        // only for a keyed push (a 64 KiB item is not copied for nothing).
        let fingerprint = match (keyed, &b.preempt) {
            (false, _) => String::new(),
            (true, None) => b.item.get().to_string(),
            (true, Some(p)) => format!("{}\u{0}{p:?}", b.item.get()),
        };
        let item: I = from_json_text(b.item.get()).map_err(|e| {
            ApiError::bad_request(format!("item: not an item this server takes: {e}"))
        })?;
        Ok((b, fingerprint, item))
    })
    .await?;
    // Answered once accepted (S34a): a delayed preempt never holds the client.
    let mut options = match b.preempt {
        Some(p) => PushOptions::preempt(preempt(p, st.max_duration)?),
        None => PushOptions::new(),
    }
    .answer_at_acceptance();
    // The session keeps the key with the item (S34a): a retry after a restart is
    // recognised by the record, not only by this process's memory.
    if let Some(k) = key.0.as_deref() {
        options = options.idempotency_key(k, fingerprint_hash(&fingerprint));
    }
    // Wherever the session runs: here, or (a cluster node) at its owner (issue 18).
    let runtime = st.runtime.clone();
    let session = id.clone();
    let deliver = async move {
        match runtime.push(&session, item).options(options).await {
            Ok(ack) => Json(Pushed {
                preempt: wire::preempt_ack(ack),
            })
            .into_response(),
            Err(e) => ApiError::from(e).into_response(),
        }
    };
    match key.0.as_deref() {
        None => Ok(deliver.await),
        Some(key) => {
            let run = st.idempotency.run(&id, key, &fingerprint, async move {
                crate::idempotency::outcome(deliver.await).await
            });
            // A push still waiting when the shutdown has finished every session gets
            // 503 before the server closes, never an empty reply; the record decides
            // whether its item was accepted, and a retry with the same key after the
            // restart delivers it at most once.
            let (status, out) = tokio::select! {
                outcome = run => outcome?,
                () = st.closed() => {
                    tracing::warn!(session = %id, key, "a keyed push was still waiting when the server shut down; answered 503 (a retry with the same key after the restart delivers it at most once)");
                    return Err(ApiError::draining(
                        "the server shut down while this push waited; retry with the same \
                         Idempotency-Key once it is back: the session's record keeps the key, \
                         so the item is delivered at most once",
                    ));
                }
            };
            // A remembered outcome is status and body: `Retry-After` comes back from
            // the body's `retry_after_ms` (a `not_live` answer).
            let retry = out["retry_after_ms"].as_u64().map(Duration::from_millis);
            let full = out["code"] == "session_full";
            let mut response = (status, Json(out)).into_response();
            if full {
                response
                    .extensions_mut()
                    .insert(crate::error::ErrorCode("session_full"));
            }
            if let Some(d) = retry {
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(crate::error::retry_after_secs(d)),
                );
            }
            Ok(response)
        }
    }
}
