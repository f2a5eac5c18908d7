//! Serve agentloop sessions over HTTP (issue 17, first step): an axum [`Router`] a
//! service mounts on its own server, generic over the runtime's item and event types.
//!
//! ```no_run
//! # async fn demo(runtime: &agentloop::Runtime<agentloop_sim::SimItem, agentloop_sim::SimEvent>) {
//! let app = agentloop_http::router(runtime, agentloop_http::HttpOptions::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
//!
//! Routes (JSON in and out; errors are `{"code", "message"}` with 400 bad input, 404
//! unknown session, 409 duplicate or wrong state, 413 body too large, 503 draining):
//!
//! | route | does |
//! |---|---|
//! | `GET /healthz` | 200 while the process is up |
//! | `GET /readyz` | 200 while accepting work, 503 once the shutdown began (drain gate) |
//! | `POST /sessions` | spawn: `{"id", "kind", "config"?, "persistent"?, "durability"?, "replay"?}` → 201 |
//! | `GET /sessions` | the live sessions: `[{"id", "kind", "restarts"}]` |
//! | `POST /sessions/{id}/items` | push `{"item": …}` → `{"preempt": …}` (acknowledged) |
//! | `POST /sessions/{id}/stop` | stop `{"mode"?, "timeout"?, "cause"?, "skip_checkpoint"?}` → 202 |
//! | `POST /sessions/{id}/cancel` | cancel by id → `{"status": …}` |
//! | `GET /sessions/{id}/events` | Server-Sent Events; `Last-Event-ID` resumes |
//!
//! With [`HttpOptions::token`] every route but the two probes needs `Authorization:
//! Bearer <token>` (401 `unauthorized` otherwise); without one, [`check_bind`] allows
//! loopback addresses only.
//!
//! This crate owns the HTTP shape only: it calls the runtime's supervisor and shutdown
//! handles and never touches a store or a session directly.

mod error;
mod events;

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use agentloop::shutdown::ShutdownHandle;
use agentloop::{Durability, PreemptAck, Runtime, SessionSpec, StopOptions, SupervisorHandle};

pub use error::ApiError;

/// How the router is bounded and guarded.
#[derive(Clone, Default)]
pub struct HttpOptions {
    /// The largest request body accepted, in bytes (413 above it). `None`: 1 MiB.
    pub body_limit: Option<usize>,
    /// The bearer token every route but `/healthz` and `/readyz` requires
    /// (`Authorization: Bearer <token>`, compared in constant time; 401 without it or
    /// with another). `None`: no authentication, so serve on loopback only
    /// ([`check_bind`]).
    pub token: Option<String>,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("body_limit", &self.body_limit)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// Whether the router may listen on `addr`: without a token only on a loopback address
/// (anyone who reaches the port could drive every session).
pub fn check_bind(addr: std::net::SocketAddr, options: &HttpOptions) -> Result<(), String> {
    if options.token.is_none() && !addr.ip().is_loopback() {
        return Err(format!(
            "refusing to listen on {addr} without a token: set a bearer token (config or \
             environment) to serve beyond this machine, or listen on 127.0.0.1"
        ));
    }
    Ok(())
}

/// Constant-time comparison of the presented and the expected token.
fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

async fn authenticate(
    State(token): State<Option<std::sync::Arc<str>>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(expected) = token else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/healthz" || path == "/readyz" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(p) if token_matches(p.as_bytes(), expected.as_bytes()) => next.run(req).await,
        _ => {
            let mut resp = ApiError {
                status: StatusCode::UNAUTHORIZED,
                code: "unauthorized",
                message: "no or wrong bearer token: send `Authorization: Bearer <token>`".into(),
            }
            .into_response();
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            resp
        }
    }
}

/// Events a session spawned over HTTP keeps for reconnecting SSE clients, unless the
/// spawn says otherwise (`"replay": n`).
pub const DEFAULT_REPLAY: usize = 256;

/// What the handlers share.
struct AppState<I, E> {
    supervisor: SupervisorHandle<I, E>,
    shutdown: ShutdownHandle,
}

impl<I, E> Clone for AppState<I, E> {
    fn clone(&self) -> Self {
        AppState {
            supervisor: self.supervisor.clone(),
            shutdown: self.shutdown.clone(),
        }
    }
}

/// The router for `runtime`'s sessions. Items are read from JSON (`I: Deserialize`).
pub fn router<I, E>(runtime: &Runtime<I, E>, options: HttpOptions) -> Router
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + Serialize + 'static,
{
    let state = AppState {
        supervisor: runtime.supervisor().clone(),
        shutdown: runtime.shutdown_handle(),
    };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<I, E>))
        .route("/sessions", post(spawn::<I, E>).get(list::<I, E>))
        .route("/sessions/{id}/items", post(push::<I, E>))
        .route("/sessions/{id}/stop", post(stop::<I, E>))
        .route("/sessions/{id}/cancel", post(cancel::<I, E>))
        .route("/sessions/{id}/events", get(events_route::<I, E>))
        .layer(DefaultBodyLimit::max(options.body_limit.unwrap_or(1 << 20)))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            options.token.map(std::sync::Arc::<str>::from),
            authenticate,
        ))
}

async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "up" }))
}

async fn readyz<I, E>(State(st): State<AppState<I, E>>) -> Result<impl IntoResponse, ApiError>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    if st.shutdown.is_started().await {
        return Err(ApiError::draining(
            "the runtime is shutting down and accepts no new work; send it elsewhere",
        ));
    }
    Ok(Json(serde_json::json!({ "status": "ready" })))
}

/// `POST /sessions`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnBody {
    id: String,
    kind: String,
    #[serde(default)]
    config: Option<serde_json::Value>,
    #[serde(default)]
    persistent: bool,
    #[serde(default)]
    durability: Option<String>,
    /// Recent events kept for SSE clients that reconnect with `Last-Event-ID`.
    #[serde(default)]
    replay: Option<usize>,
}

fn body<T: DeserializeOwned>(
    raw: Result<Json<T>, axum::extract::rejection::JsonRejection>,
) -> Result<T, ApiError> {
    use axum::extract::rejection::JsonRejection;
    match raw {
        Ok(Json(v)) => Ok(v),
        Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "too_large",
                message: format!("the request body is too large: {e}; send less"),
            })
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not what this route takes: {e}"
        ))),
    }
}

async fn spawn<I, E>(
    State(st): State<AppState<I, E>>,
    raw: Result<Json<SpawnBody>, axum::extract::rejection::JsonRejection>,
) -> Result<impl IntoResponse, ApiError>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let b = body(raw)?;
    let mut spec = SessionSpec::new(b.id.clone(), b.kind)
        .persistent(b.persistent)
        .replay(b.replay.unwrap_or(DEFAULT_REPLAY));
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
    st.supervisor.spawn(spec).await?;
    Ok((StatusCode::CREATED, Json(serde_json::json!({ "id": b.id }))))
}

async fn list<I, E>(State(st): State<AppState<I, E>>) -> impl IntoResponse
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let sessions: Vec<serde_json::Value> = st
        .supervisor
        .list()
        .await
        .into_iter()
        .map(|s| serde_json::json!({ "id": s.id, "kind": s.kind, "restarts": s.restarts }))
        .collect();
    Json(sessions)
}

/// `POST /sessions/{id}/items`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PushBody<I> {
    item: I,
}

fn preempt_json(ack: PreemptAck) -> serde_json::Value {
    match ack {
        PreemptAck::NotRequested => serde_json::json!("not_requested"),
        PreemptAck::NoTarget => serde_json::json!("no_target"),
        PreemptAck::Submitted { turn } => serde_json::json!({ "submitted": { "turn": turn } }),
        other => serde_json::json!(format!("{other:?}")),
    }
}

async fn push<I, E>(
    State(st): State<AppState<I, E>>,
    Path(id): Path<String>,
    raw: Result<Json<PushBody<I>>, axum::extract::rejection::JsonRejection>,
) -> Result<impl IntoResponse, ApiError>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let b = body(raw)?;
    let ack = st.supervisor.push(&id, b.item).await?;
    Ok(Json(serde_json::json!({ "preempt": preempt_json(ack) })))
}

/// `POST /sessions/{id}/stop`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StopBody {
    /// `graceful` (default), `immediate`, `drain` or `bare`.
    #[serde(default)]
    mode: Option<String>,
    /// For `graceful`: the timeout, e.g. `"5s"`.
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    cause: Option<String>,
    #[serde(default)]
    skip_checkpoint: bool,
}

fn stop_options(b: StopBody) -> Result<StopOptions, ApiError> {
    let timeout: Option<Duration> = match &b.timeout {
        None => None,
        Some(t) => Some(humantime::parse_duration(t).map_err(|e| {
            ApiError::bad_request(format!(
                "timeout `{t}` is not a duration ({e}); write e.g. \"5s\""
            ))
        })?),
    };
    let mut o = match (b.mode.as_deref().unwrap_or("graceful"), timeout) {
        ("graceful", None) => StopOptions::graceful(),
        ("graceful", Some(t)) => StopOptions::graceful_timeout(t),
        ("immediate", None) => StopOptions::immediate(),
        ("drain", None) => StopOptions::drain(),
        ("bare", None) => StopOptions::bare(),
        (m @ ("immediate" | "drain" | "bare"), Some(_)) => {
            return Err(ApiError::bad_request(format!(
                "timeout applies to the graceful mode, not `{m}`"
            )))
        }
        (m, _) => {
            return Err(ApiError::bad_request(format!(
                "mode `{m}`: use graceful, immediate, drain or bare"
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

async fn stop<I, E>(
    State(st): State<AppState<I, E>>,
    Path(id): Path<String>,
    raw: Result<Json<StopBody>, axum::extract::rejection::JsonRejection>,
) -> Result<impl IntoResponse, ApiError>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let b = match raw {
        // An empty body is a default (graceful) stop.
        Err(axum::extract::rejection::JsonRejection::MissingJsonContentType(_)) => {
            StopBody::default()
        }
        other => body(other)?,
    };
    st.supervisor.stop(&id, stop_options(b)?).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "id": id, "stopping": true })),
    ))
}

async fn cancel<I, E>(
    State(st): State<AppState<I, E>>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let status = st.supervisor.cancel(&id).await?;
    Ok(Json(
        serde_json::json!({ "id": id, "status": format!("{status:?}") }),
    ))
}

async fn events_route<I, E>(
    State(st): State<AppState<I, E>>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<axum::response::Response, ApiError>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + Serialize + 'static,
{
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
    let filter = agentloop::EventFilter::all();
    let stream = match after {
        Some(seq) => st.supervisor.subscribe_after(&id, seq, filter).await?,
        None => st.supervisor.subscribe(&id, filter).await?,
    };
    Ok(events::sse(stream).into_response())
}
