//! `GET /sessions` (live and stored, paged) and `GET /sessions/{id}` (the S24 redacted
//! view): reads only; nothing here changes a session.

use super::id::SessionId;
use super::{clean_serde_message, AppState, Ev, Item};
use crate::error::ApiError;
use agentloop::lifecycle::Lifecycle;
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
/// marked `live`, with its `status` judged once for every door (S26a: `running`,
/// `sleeping`, `stopped`, `interrupted`, `completed`, `canceled`, `failed`) and its
/// `state`: `live` (it runs here), `sleeping` (S39: its record says it sleeps and it
/// does not run) or `stored`. A session that ended cleanly and keeps history or events
/// keeps a final record, so it stays listed until it is deleted; one whose record is
/// gone while its history or events remain is listed `completed`, its kind `null`.
/// `?status=` filters by status (several separated by commas).
#[utoipa::path(
    get, path = "/sessions", operation_id = "list_sessions", tag = "sessions",
    params(ListPage),
    responses((status = 200, description = "Live sessions and stored records merged by id, in id order; a `Link: <...>; rel=\"next\"` header when more follow", body = Vec<crate::schemas::SessionRow>),
        (status = 400, description = "`bad_request`: a bad `limit`, `status` or query", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`: the store failed", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn list<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    page: Result<axum::extract::Query<ListPage>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let page = match page {
        Ok(axum::extract::Query(p)) => p,
        Err(e) => {
            return Err(ApiError::bad_request(format!(
                "the query is not what GET /sessions takes ({}): use ?limit=N (1 to {MAX_PAGE}), ?after=ID and ?status=S1,S2",
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
    let wanted = match page.status.as_deref() {
        None | Some("") => None,
        Some(names) => Some(
            names
                .split(',')
                .map(|n| {
                    Lifecycle::parse(n.trim()).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "`{n}` is not a session status: use ?status= with one or more of {}, separated by commas",
                            Lifecycle::ALL.map(Lifecycle::as_str).join(", ")
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    // With a filter, pages of ids are read until one fills or a bounded scan ends
    // (S34a: an answer costs what it returns, at most `SCAN_PAGES` pages of ids); the
    // `Link` then continues after the last id read.
    let mut after = page.after.clone();
    let mut out: Vec<(String, Value)> = Vec::new();
    // Where the next page starts, when more may follow.
    let mut next_after: Option<String> = None;
    for _ in 0..SCAN_PAGES {
        let (rows, page_more, last) = one_page(&st, after.as_deref(), limit).await?;
        let mut full_before_page_end = false;
        for (id, row) in rows {
            let keep = match &wanted {
                None => true,
                Some(w) => row["status"]
                    .as_str()
                    .and_then(Lifecycle::parse)
                    .is_some_and(|l| w.contains(&l)),
            };
            if !keep {
                continue;
            }
            if out.len() < limit {
                out.push((id, row));
            } else {
                full_before_page_end = true;
                break;
            }
        }
        if full_before_page_end {
            next_after = out.last().map(|(id, _)| id.clone());
            break;
        }
        if !page_more {
            next_after = None;
            break;
        }
        // More ids follow this page: continue after its last one (the next request
        // does, when this one is full or its scan is spent).
        next_after = last.clone();
        if out.len() >= limit || wanted.is_none() {
            break;
        }
        after = last;
    }
    let mut response = Json(out.iter().map(|(_, v)| v).collect::<Vec<_>>()).into_response();
    if let Some(next_after) = next_after {
        let mut next = format!("</sessions?limit={limit}&after={}", url_escape(&next_after));
        if let Some(status) = page.status.as_deref().filter(|s| !s.is_empty()) {
            next.push_str(&format!("&status={}", url_escape(status)));
        }
        next.push_str(">; rel=\"next\"");
        if let Ok(v) = axum::http::HeaderValue::from_str(&next) {
            response.headers_mut().insert(axum::http::header::LINK, v);
        }
    }
    Ok(response)
}

/// How many pages of ids one filtered `GET /sessions` reads at most.
const SCAN_PAGES: usize = 8;

/// One page of rows in id order after `after`, live sessions, stored records and the
/// sessions kept only as history or events merged by id, each with the status every door shows (S26a); whether more follow, and the
/// last id of the page.
async fn one_page<I: Item, E: Ev>(
    st: &AppState<I, E>,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<(String, Value)>, bool, Option<String>), ApiError> {
    // One page, in id order, after `after` (S34a: an answer is bounded), costing what
    // it returns (issue 52): `limit + 1` stored records, `limit + 1` kept sessions and
    // `limit + 1` live sessions after `after` hold the page's first `limit + 1` ids,
    // whichever side each is on, so the merge knows whether more follow.
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    let mut statuses: BTreeMap<String, (agentloop::store::SessionStatus, bool)> = BTreeMap::new();
    let mut kept_only: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    if let Some(store) = st.runtime.store() {
        for entry in store.list_page(after, limit + 1).await? {
            let row = match &entry.record {
                Ok(stored) => {
                    statuses.insert(
                        entry.session_id.clone(),
                        (stored.status().clone(), asleep(stored)),
                    );
                    json!({
                        "id": entry.session_id,
                        "kind": kind_of(stored),
                        "version": agentloop::versions::version_of(stored),
                        "live": false,
                        "state": if asleep(stored) { "sleeping" } else { "stored" },
                        "presence": if asleep(stored) { "sleeping" } else { "stored" },
                        "restarts": null,
                    })
                }
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
        // S26a: a session whose record is gone but whose history or events remain
        // (deleted by a build before S26a, or by `CheckpointStore::delete`) is known
        // too: its first `limit + 1` ids after `after` join the merge.
        for id in store.list_kept_page(after, limit + 1).await? {
            rows.entry(id.clone()).or_insert_with(|| {
                kept_only.insert(id.clone());
                json!({
                    "id": id,
                    "kind": null,
                    "version": null,
                    "live": false,
                    "state": "stored",
                    "presence": "stored",
                    "restarts": null,
                })
            });
        }
    }
    for s in st.runtime.supervisor().list_page(after, limit + 1).await {
        let row = rows.entry(s.id.clone()).or_insert_with(
            || json!({"id": s.id, "kind": s.kind, "version": s.version, "live": true, "restarts": 0}),
        );
        row["live"] = json!(true);
        row["state"] = json!("live");
        row["presence"] = json!("live");
        row["kind"] = json!(s.kind);
        row["version"] = json!(s.version);
        row["restarts"] = json!(s.restarts);
    }
    // One judgement of the status for every row (S26a).
    for (id, row) in rows.iter_mut() {
        if row.get("status").is_some() {
            continue; // unreadable
        }
        let record = statuses.get(id);
        let lifecycle = agentloop::lifecycle::judge(agentloop::lifecycle::Facts {
            live: row["live"] == json!(true),
            record: record.map(|(s, _)| s),
            asleep: record.is_some_and(|(_, a)| *a),
            kept_beyond_record: kept_only.contains(id),
        });
        row["status"] = json!(lifecycle.map(Lifecycle::as_str));
    }
    let mut rest = rows.into_iter().filter(|(id, _)| match after {
        Some(after) => id.as_str() > after,
        None => true,
    });
    let out: Vec<(String, Value)> = rest.by_ref().take(limit).collect();
    let more = rest.next().is_some();
    let last = out.last().map(|(id, _)| id.clone());
    Ok((out, more, last))
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
    /// Only sessions of these statuses, separated by commas: `running`, `sleeping`,
    /// `stopped`, `interrupted`, `completed`, `canceled`, `failed` (S26a).
    #[param(example = "stopped,completed")]
    status: Option<String>,
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
pub(crate) fn asleep(stored: &agentloop::store::Stored) -> bool {
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
/// its `status` judged once for every door (S26a), `kept` (its record, history and
/// kept events), `live`, `presence` (`live`, `sleeping` or `stored`; the view's
/// `state` is the agent's state, S24) and, while the session runs here,
/// what it is doing. 404 only when nothing of the session runs or is kept. A sleeping session is answered from its record, which holds
/// everything it is, without waking it (S39).
#[utoipa::path(
    get, path = "/sessions/{id}", operation_id = "get_session", tag = "sessions",
    params(super::id::SessionId),
    responses((status = 200, description = "The S24 view through the redaction, with what the live session does", body = crate::schemas::SessionView),
        (status = 400, description = "`bad_request`: an invalid id", body = crate::schemas::ErrorBody),
        (status = 404, description = "`unknown_session`: nothing of it runs or is kept (no record, history or events)", body = crate::schemas::ErrorBody),
        (status = 500, description = "`internal`: the store failed", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn get_one<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    // One judgement for every door (S26a): unknown only when nothing runs or is kept.
    let Some((life, view)) = st.runtime.life_view(&id).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!(
                "no session `{id}` runs here and nothing of it is kept (no record, history or events); list them with GET /sessions"
            ),
        ));
    };
    let sleeping = life.lifecycle == Lifecycle::Sleeping;
    let live = match life.lifecycle {
        Lifecycle::Running => st.runtime.supervisor().inspect(&id).await.ok(),
        _ => None,
    };
    let mut out = match &view {
        Some(v) => view_json(v),
        None => json!({"session_id": id}),
    };
    out["status"] = json!(life.lifecycle.as_str());
    out["kept"] = json!(life.kept);
    out["live"] = json!(live.is_some());
    out["presence"] = json!(match (&live, sleeping) {
        (Some(_), _) => "live",
        (None, true) => "sleeping",
        (None, false) => "stored",
    });
    if let Some(info) = live {
        out["run"] = json!({
            "phase": match info.phase {
                agentloop::options::TurnPhase::Idle => "idle",
                agentloop::options::TurnPhase::Planning => "planning",
                agentloop::options::TurnPhase::Running => "running",
            },
            "turn_index": info.turn_index,
            "buffered": info.buffered,
            "preempted": info.preempted,
            "stop_committed": info.stop_committed,
        });
        if let Some(r) = st.runtime.supervisor().restart_use(&id).await {
            out["run"]["restarts"] = json!(r);
        }
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
