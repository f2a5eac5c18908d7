//! `GET /sessions` (live and stored, paged) and `GET /sessions/{id}` (the S24 redacted
//! view): reads only; nothing here changes a session.

use super::id::SessionId;
use super::{clean_serde_message, AppState, Ev, Item};
use crate::{wire, ApiError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// List sessions.
///
/// `GET /sessions`: the live sessions and the stored records, merged by id, each
/// marked `live`, with its stored `status` (`null` when nothing is stored) and its
/// `state`: `live` (it runs here), `sleeping` (S39: its record says it sleeps and it
/// does not run) or `stored`.
#[utoipa::path(
    get, path = "/sessions", operation_id = "list_sessions", tag = "sessions",
    params(ListPage),
    responses((status = 200, description = "Live sessions and stored records merged by id, in id order; a `Link: <...>; rel=\"next\"` header when more follow", body = Vec<crate::openapi::schemas::SessionRow>),
        (status = 400, description = "`bad_request`: a bad `limit` or query", body = crate::openapi::schemas::ErrorBody),
        (status = 500, description = "`internal`: the store failed", body = crate::openapi::schemas::ErrorBody))
)]
pub(crate) async fn list<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    page: Result<axum::extract::Query<ListPage>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let page = match page {
        Ok(axum::extract::Query(p)) => p,
        Err(e) => {
            return Err(ApiError::bad_request(format!(
                "the query is not what GET /sessions takes ({}): use ?limit=N (1 to {MAX_PAGE}) and ?after=ID",
                clean_serde_message(&e.body_text())
            )))
        }
    };
    let limit = page.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range: 1 to {MAX_PAGE}"
        )));
    }
    // One page, in id order, after `after` (S34a: an answer is bounded), costing what
    // it returns (issue 52): `limit + 1` stored records and `limit + 1` live sessions
    // after `after` hold the page's first `limit + 1` ids, whichever side each is on,
    // so the merge knows whether more follow.
    let after = page.after.as_deref();
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    if let Some(store) = st.runtime.store() {
        for entry in store.list_page(after, limit + 1).await? {
            let row = match &entry.record {
                Ok(stored) => json!({
                    "id": entry.session_id,
                    "kind": kind_of(stored),
                    "version": agentloop::versions::version_of(stored),
                    "live": false,
                    "state": if asleep(stored) { "sleeping" } else { "stored" },
                    "presence": if asleep(stored) { "sleeping" } else { "stored" },
                    "status": wire::status(stored.status()),
                    "restarts": null,
                }),
                Err(e) => json!({
                    "id": entry.session_id,
                    "kind": null,
                    "version": null,
                    "live": false,
                    "state": "stored",
                    "presence": "stored",
                    "status": "unreadable",
                    "error": e.to_string(),
                    "restarts": null,
                }),
            };
            rows.insert(entry.session_id.clone(), row);
        }
    }
    for s in st.runtime.supervisor().list_page(after, limit + 1).await {
        let row = rows.entry(s.id.clone()).or_insert_with(
            || json!({"id": s.id, "kind": s.kind, "version": s.version, "live": true, "status": null, "restarts": 0}),
        );
        row["live"] = json!(true);
        row["state"] = json!("live");
        row["presence"] = json!("live");
        row["kind"] = json!(s.kind);
        row["version"] = json!(s.version);
        row["restarts"] = json!(s.restarts);
    }
    let mut rest = rows.into_iter().filter(|(id, _)| match after {
        Some(after) => id.as_str() > after,
        None => true,
    });
    let out: Vec<(String, Value)> = rest.by_ref().take(limit).collect();
    let more = rest.next().is_some();
    let mut response = Json(out.iter().map(|(_, v)| v).collect::<Vec<_>>()).into_response();
    if let (true, Some((last, _))) = (more, out.last()) {
        let next = format!(
            "</sessions?limit={limit}&after={}>; rel=\"next\"",
            url_escape(last)
        );
        if let Ok(v) = axum::http::HeaderValue::from_str(&next) {
            response.headers_mut().insert(axum::http::header::LINK, v);
        }
    }
    Ok(response)
}

/// Sessions on one page of `GET /sessions` unless `?limit=` says otherwise.
pub const DEFAULT_PAGE: usize = 1_000;
/// The most `?limit=` may ask for.
pub const MAX_PAGE: usize = 10_000;

/// `GET /sessions?limit=N&after=ID`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListPage {
    /// Rows on the page: 1 to 10 000 (1 000 by default).
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<usize>,
    /// Start after this id (the `Link` header's `next` has it).
    after: Option<String>,
}

/// `s` with every byte but unreserved URL characters percent-encoded.
pub(super) fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Whether a record says its session sleeps (S39).
pub(super) fn asleep(stored: &agentloop::store::Stored) -> bool {
    matches!(stored, agentloop::store::Stored::Current(r)
        if r.header.asleep && r.header.status == agentloop::store::SessionStatus::Running)
}

pub(crate) fn kind_of(stored: &agentloop::store::Stored) -> &str {
    match stored {
        agentloop::store::Stored::Current(r) => &r.header.agent_kind,
        agentloop::store::Stored::Format1(r) => &r.agent_kind,
    }
}

/// Read a session.
///
/// `GET /sessions/{id}`: the stored record through the runtime's redaction (S24), with
/// `live`, `presence` (`live`, `sleeping` or `stored`; the view's `state` is the
/// agent's state, S24) and, while the session runs here,
/// what it is doing. A sleeping session is answered from its record, which holds
/// everything it is, without waking it (S39).
#[utoipa::path(
    get, path = "/sessions/{id}", operation_id = "get_session", tag = "sessions",
    params(super::id::SessionId),
    responses((status = 200, description = "The S24 view through the redaction, with what the live session does", body = crate::openapi::schemas::SessionView),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::openapi::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: neither live nor stored", body = crate::openapi::schemas::ErrorBody),
        (status = 500, description = "`internal`: the store failed", body = crate::openapi::schemas::ErrorBody))
)]
pub(crate) async fn get_one<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    let view = st.runtime.view(&id).await?;
    let sleeping = view
        .as_ref()
        .is_some_and(|v| v.asleep && v.status == "Running")
        && !st.runtime.supervisor().is_live(&id);
    let live = match sleeping {
        true => None,
        false => st.runtime.supervisor().inspect(&id).await.ok(),
    };
    let mut out = match (&view, &live) {
        (None, None) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_session",
                format!(
                    "no session `{id}` runs here and none is stored; list them with GET /sessions"
                ),
            ))
        }
        (Some(v), _) => view_json(v),
        (None, Some(_)) => json!({"session_id": id, "status": null}),
    };
    out["live"] = json!(live.is_some());
    out["presence"] = json!(match (&live, sleeping) {
        (Some(_), _) => "live",
        (None, true) => "sleeping",
        (None, false) => "stored",
    });
    if let Some(info) = live {
        out["run"] = json!({
            "phase": match info.phase {
                agentloop::TurnPhase::Idle => "idle",
                agentloop::TurnPhase::Planning => "planning",
                agentloop::TurnPhase::Running => "running",
            },
            "turn_index": info.turn_index,
            "buffered": info.buffered,
            "preempted": info.preempted,
            "stop_committed": info.stop_committed,
        });
    }
    Ok(Json(out))
}

/// A view as clients get it: its status as the stable name (the view carries display
/// text, `Failed(..)` → `failed`).
pub(super) fn view_json(v: &agentloop::SessionView) -> Value {
    let mut out = json!(v);
    let name = v.status.split('(').next().unwrap_or(&v.status);
    out["status"] = json!(name.to_ascii_lowercase());
    out
}
