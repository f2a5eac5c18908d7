//! The session routes (issue 17, S33): spawn, list, read (the S24 redacted view), push
//! (preempt options, idempotency key), stop (every stop option), detach, cancel, resume
//! with an answer, history and delete. Each handler turns JSON into one runtime call
//! and its answer back into JSON; the runtime decides everything.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use agentloop::{
    Durability, Preempt, PushOptions, RuntimeHandle, SessionSpec, SessionStatus, StopOptions,
};

use crate::idempotency::Idempotency;
use crate::limits::{too_many, Gauge};
use crate::{wire, ApiError};

/// Events a session spawned over HTTP keeps for reconnecting SSE clients, unless the
/// spawn says otherwise (`"replay": n`).
pub const DEFAULT_REPLAY: usize = 256;

/// What the handlers share. axum clones the state for every request: it is one `Arc`,
/// so that clone is one reference count, not a copy of the runtime handle.
pub(crate) struct AppState<I, E>(pub(crate) Arc<Shared<I, E>>);

/// The shared part of [`AppState`].
pub(crate) struct Shared<I, E> {
    pub(crate) runtime: RuntimeHandle<I, E>,
    /// Open event streams, and their bound.
    pub(crate) streams: Arc<Gauge>,
    pub(crate) idempotency: Idempotency,
    /// The largest replay buffer a spawn may ask for (S34a).
    pub(crate) max_replay: usize,
    /// The longest duration a request may carry (S34a).
    pub(crate) max_duration: Duration,
}

impl<I: Item, E: Ev> Shared<I, E> {
    /// Resolves once the runtime's shutdown finished its sessions (its report is
    /// published on a watch channel: no message, no task).
    async fn closed(&self) {
        let _ = self.runtime.shutdown_handle().wait_report().await;
    }
}

/// A fingerprint of a keyed push that is the same in every process (FNV-1a): the
/// record keeps it with the key (S34a).
fn fingerprint_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl<I, E> Clone for AppState<I, E> {
    fn clone(&self) -> Self {
        AppState(self.0.clone())
    }
}

impl<I, E> std::ops::Deref for AppState<I, E> {
    type Target = Shared<I, E>;
    fn deref(&self) -> &Shared<I, E> {
        &self.0
    }
}

/// What the router needs of the runtime's item type: read from JSON (pushes,
/// answers), written to JSON. Implemented for every such type.
pub trait Item:
    Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static
{
}
impl<T> Item for T where
    T: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static
{
}

/// What the router needs of the runtime's event type: written to JSON for the event
/// stream. Implemented for every such type.
pub trait Ev: Clone + Send + Sync + Serialize + 'static {}
impl<T> Ev for T where T: Clone + Send + Sync + Serialize + 'static {}

/// A JSON body, or the error that says what is wrong with it (413 when too large).
pub(crate) fn body<T: DeserializeOwned>(
    raw: Result<Json<T>, JsonRejection>,
) -> Result<T, ApiError> {
    match raw {
        Ok(Json(v)) => Ok(v),
        Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the request body is too large: {e}; send less"),
            ))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not what this route takes: {}",
            clean_serde_message(&e.body_text())
        ))),
    }
}

/// A JSON value read into `T`, with the field path and a message a client can act on
/// when it does not fit (S34a: no Rust type names).
pub(crate) fn from_json_text<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    // The fast path; the path is only tracked to explain a failure.
    if let Ok(v) = serde_json::from_str(text) {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = clean_serde_message(&e.into_inner().to_string());
        match path.as_str() {
            "." | "" => inner,
            p => format!("{p}: {inner}"),
        }
    })
}

/// serde's message without the Rust types it names (S34a): `expected struct SimItem`
/// becomes `expected an object`, `expected u64` a whole number, and axum's prefix goes.
pub(crate) fn clean_serde_message(message: &str) -> String {
    let mut m = message
        .replace(
            "Failed to deserialize the JSON body into the target type: ",
            "",
        )
        .replace("Failed to parse the request body as JSON: ", "not JSON: ")
        .replace("Failed to deserialize query string: ", "");
    for (named, plain) in [
        ("expected tuple struct ", "expected an array"),
        ("expected unit struct ", "expected null"),
        ("expected newtype struct ", "expected a value"),
        ("expected struct ", "expected an object"),
        ("expected enum ", "expected one of its named values"),
    ] {
        while let Some(at) = m.find(named) {
            let rest = &m[at + named.len()..];
            let name_len = rest
                .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | ':' | '<' | '>')))
                .unwrap_or(rest.len());
            m = format!("{}{plain}{}", &m[..at], &rest[name_len..]);
        }
    }
    for (ty, plain) in [
        ("usize", "a whole number (0 or more)"),
        ("u64", "a whole number (0 or more)"),
        ("u32", "a whole number (0 or more)"),
        ("u16", "a whole number (0 or more)"),
        ("u8", "a whole number (0 or more)"),
        ("i64", "a whole number"),
        ("i32", "a whole number"),
        ("f64", "a number"),
        ("f32", "a number"),
    ] {
        for end in [" ", ",", ")", ""] {
            let from = format!("expected {ty}{end}");
            if end.is_empty() {
                if m.ends_with(&from) {
                    let cut = m.len() - from.len();
                    m = format!("{}expected {plain}", &m[..cut]);
                }
            } else {
                m = m.replace(&from, &format!("expected {plain}{end}"));
            }
        }
    }
    m
}

/// A body that may be empty (no content type): its default then.
fn optional_body<T: DeserializeOwned + Default>(
    raw: Result<Json<T>, JsonRejection>,
) -> Result<T, ApiError> {
    match raw {
        Err(JsonRejection::MissingJsonContentType(_)) => Ok(T::default()),
        other => body(other),
    }
}

/// A request's duration `text` for `option`: positive and at most `max` (the server's
/// `[limits] duration`, S34a).
fn duration(option: &str, text: &str, max: Duration) -> Result<Duration, ApiError> {
    let d = humantime::parse_duration(text).map_err(|e| {
        ApiError::bad_request(format!(
            "{option} `{text}` is not a duration ({e}); write e.g. \"5s\""
        ))
    })?;
    if d.is_zero() {
        return Err(ApiError::bad_request(format!(
            "{option} must be positive, not `{text}`"
        )));
    }
    if d > max {
        return Err(ApiError::bad_request(format!(
            "{option} `{text}` is longer than this server allows: at most {} (its [limits] duration)",
            humantime::format_duration(max)
        )));
    }
    Ok(d)
}

/// `POST /sessions`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpawnBody {
    id: String,
    kind: String,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    persistent: bool,
    #[serde(default)]
    durability: Option<String>,
    /// Recent events kept for SSE clients that reconnect with `Last-Event-ID`.
    #[serde(default)]
    replay: Option<usize>,
    /// Turn-end checkpoints to keep (`GET /sessions/{id}/history`); needs `persistent`.
    #[serde(default)]
    history: Option<usize>,
}

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

/// `GET /sessions`: the live sessions and the stored records, merged by id, each
/// marked `live` and with its stored `status` (`null` when nothing is stored).
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
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    if let Some(store) = st.runtime.store() {
        for entry in store.list_stored(None).await? {
            let row = match &entry.record {
                Ok(stored) => json!({
                    "id": entry.session_id,
                    "kind": kind_of(stored),
                    "live": false,
                    "status": wire::status(stored.status()),
                    "restarts": null,
                }),
                Err(e) => json!({
                    "id": entry.session_id,
                    "kind": null,
                    "live": false,
                    "status": "unreadable",
                    "error": e.to_string(),
                    "restarts": null,
                }),
            };
            rows.insert(entry.session_id.clone(), row);
        }
    }
    for s in st.runtime.supervisor().list().await {
        let row = rows.entry(s.id.clone()).or_insert_with(
            || json!({"id": s.id, "kind": s.kind, "live": true, "status": null, "restarts": 0}),
        );
        row["live"] = json!(true);
        row["kind"] = json!(s.kind);
        row["restarts"] = json!(s.restarts);
    }
    // One page, in id order, after `after` (S34a: an answer is bounded).
    let mut rest = rows.into_iter().filter(|(id, _)| match &page.after {
        Some(after) => id > after,
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
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListPage {
    limit: Option<usize>,
    after: Option<String>,
}

/// `s` with every byte but unreserved URL characters percent-encoded.
fn url_escape(s: &str) -> String {
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

fn kind_of(stored: &agentloop::store::Stored) -> &str {
    match stored {
        agentloop::store::Stored::Current(r) => &r.header.agent_kind,
        agentloop::store::Stored::Format1(r) => &r.agent_kind,
    }
}

/// `GET /sessions/{id}`: the stored record through the runtime's redaction (S24), with
/// `live` and, while the session runs here, what it is doing.
pub(crate) async fn get_one<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    let view = st.runtime.view(&id).await?;
    let live = st.runtime.supervisor().inspect(&id).await.ok();
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
fn view_json(v: &agentloop::SessionView) -> Value {
    let mut out = json!(v);
    let name = v.status.split('(').next().unwrap_or(&v.status);
    out["status"] = json!(name.to_ascii_lowercase());
    out
}

/// `POST /sessions/{id}/items`. The item stays raw JSON until the whole body is read:
/// it is parsed once, into the item type, and its text is the idempotency fingerprint.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PushBody {
    item: Box<serde_json::value::RawValue>,
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

/// A session id taken from the path, checked before a handler runs (S32, S34a): one
/// extractor for every `/sessions/{id}/…` route, so an invalid id is a 400 on each of
/// them (never a 500 from the store) and the answer does not echo it back.
pub(crate) struct SessionId(pub(crate) String);

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
fn checked_id(id: &str) -> Result<(), ApiError> {
    agentloop::session::validate_session_id(id)
        .map_err(|e| ApiError::bad_request(format!("invalid session id in the path: {e}")))
}

/// A push's answer.
#[derive(serde::Serialize)]
struct Pushed {
    preempt: Value,
}

/// A push's preempt: `{"at": "any", "timeout"?: "5s", "delay"?: "1s"}`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreemptBody {
    at: String,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    delay: Option<String>,
}

fn preempt(b: PreemptBody, max: Duration) -> Result<Preempt, ApiError> {
    let at = wire::parse_safe_point(&b.at)
        .map_err(|e| ApiError::bad_request(format!("preempt: {e}")))?;
    let mut p = Preempt::at(at);
    if let Some(t) = b.timeout {
        p = p.timeout(duration("preempt timeout", &t, max)?);
    }
    if let Some(d) = b.delay {
        p = p.delay(duration("preempt delay", &d, max)?);
    }
    p.validate()
        .map_err(|e| ApiError::bad_request(format!("preempt: {e}")))?;
    Ok(p)
}

pub(crate) async fn push<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    key: IdempotencyKey,
    raw: Result<Json<PushBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = body(raw)?;
    // What a retry with the same key must repeat: the item's text and its preempt
    // options (S34a: a retry that changes the preempt is another request).
    // Built only for a keyed push (a 64 KiB item is not copied for nothing).
    let fingerprint = match (&key.0, &b.preempt) {
        (None, _) => String::new(),
        (Some(_), None) => b.item.get().to_string(),
        (Some(_), Some(p)) => format!("{}\u{0}{p:?}", b.item.get()),
    };
    // The whole request is checked before anything is delivered: never half-accepted.
    let item: I = from_json_text(b.item.get())
        .map_err(|e| ApiError::bad_request(format!("item: not an item this server takes: {e}")))?;
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
        match runtime.push_anywhere(&session, item, options).await {
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

/// `POST /sessions/{id}/stop`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopBody {
    /// `graceful` (default), `at`, `immediate`, `drain`, `bare` or `idle`.
    #[serde(default)]
    mode: Option<String>,
    /// For `graceful` and `at`: the cancel's timeout, e.g. `"5s"`; for `idle`: how long
    /// idle.
    #[serde(default)]
    timeout: Option<String>,
    /// For `at`: the safe points (`after_model_call`, `after_tool_calls`, `any`).
    #[serde(default)]
    at: Option<String>,
    /// For `idle`: how long the session must be idle before it exits.
    #[serde(default)]
    idle_for: Option<String>,
    #[serde(default)]
    cause: Option<String>,
    #[serde(default)]
    skip_checkpoint: bool,
}

fn stop_options(b: StopBody, max: Duration) -> Result<StopOptions, ApiError> {
    let timeout = b
        .timeout
        .as_deref()
        .map(|t| duration("timeout", t, max))
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
            StopOptions::until_idle_for(duration("idle_for", d, max)?)
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

/// `POST /sessions/{id}/detach` (S23): the session goes on in the background and its
/// record is finalized when it drains. Refused (409) for a session without a store.
pub(crate) async fn detach<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    st.runtime.detach_anywhere(&id).await?;
    Ok(Json(json!({ "id": id, "detached": true })))
}

/// `POST /sessions/{id}/move` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveBody {
    /// The node to move the session to.
    to: String,
    /// How long to wait for the next safe point before the stop escalates (default 5s).
    #[serde(default)]
    timeout: Option<String>,
}

/// `POST /sessions/{id}/move` (issue 18, S38): a planned move of a session this node
/// runs to node `to` (a cluster node only). Pushes sent here meanwhile are queued and
/// delivered there in order.
pub(crate) async fn move_to<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    raw: Result<Json<MoveBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    use agentloop::cluster::migrate::MigrateError;
    let b = body(raw)?;
    let timeout = match &b.timeout {
        Some(t) => duration("timeout", t, st.max_duration)?,
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

/// `POST /sessions/{id}/cancel` (S24).
pub(crate) async fn cancel<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
) -> Result<Json<Value>, ApiError> {
    let status: SessionStatus = st.runtime.supervisor().cancel(&id).await?;
    Ok(Json(json!({ "id": id, "status": wire::status(&status) })))
}

/// `POST /sessions/{id}/resume`: `{"answer": <item>}` answers the session's business
/// interrupt and resumes it (S4).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeBody {
    answer: Value,
}

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

/// `GET /sessions/{id}/events`.
pub(crate) async fn events<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
    SessionId(id): SessionId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Last-Event-ID must be an event id this server sent (a number)",
                    )
                })?,
        ),
    };
    let slot = st
        .streams
        .try_take()
        .ok_or_else(|| too_many("event streams", st.streams.max()))?;
    let filter = agentloop::EventFilter::all();
    // Here, or relayed from the node that runs it (issue 18).
    let stream = match st.runtime.subscribe_anywhere(&id, after, filter).await {
        Ok(stream) => stream,
        // Issue 28: stored but not live yet. A browser's EventSource treats any answer
        // but a 200 event stream as final and stops reconnecting, so this is a 200
        // stream of one `not_live` event whose `retry:` tells it when to reconnect
        // (with the same Last-Event-ID); it closes at once.
        Err(e @ agentloop::cluster::control::ControlError::NotLive { .. }) => {
            let after = e.retry_after().unwrap_or(agentloop::liveness::RETRY_SOON);
            return Ok(crate::events::not_live(&e.to_string(), after));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(crate::events::sse(stream, st.runtime.redaction().clone(), slot).into_response())
}

#[cfg(test)]
mod message_tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        count: u64,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        inner: Inner,
        mode: Mode,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Fast,
    }

    #[test]
    fn messages_name_the_field_and_no_rust_type() {
        let cases = [
            (
                r#"{"inner": "x", "mode": "fast"}"#,
                "inner: invalid type: string \"x\", expected an object",
            ),
            (
                r#"{"inner": {"count": -1}, "mode": "fast"}"#,
                "inner.count: invalid value: integer `-1`, expected a whole number (0 or more)",
            ),
            (
                r#"{"inner": {"count": 1}, "mode": "slow"}"#,
                "mode: unknown variant `slow`, expected `fast`",
            ),
        ];
        assert_eq!(
            clean_serde_message("invalid type: string \"x\", expected enum Mode"),
            "invalid type: string \"x\", expected one of its named values"
        );
        for (text, want) in cases {
            let e = from_json_text::<Outer>(text).unwrap_err();
            assert!(e.starts_with(want), "{text}: {e}");
            for rust in ["Inner", "Outer", "Mode", "u64", "struct", "enum"] {
                assert!(!e.contains(rust), "{text}: {e} names {rust}");
            }
        }
    }
}
