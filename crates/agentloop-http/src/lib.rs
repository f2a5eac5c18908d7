//! Serve agentloop sessions over HTTP (issue 17, S33–S35): an axum [`Router`] a service
//! mounts on its own server, generic over the runtime's item and event types (JSON on
//! the wire through serde).
//!
//! ```no_run
//! # async fn demo(runtime: &agentloop::Runtime<agentloop_sim::SimItem, agentloop_sim::SimEvent>) {
//! let app = agentloop_http::router(runtime, agentloop_http::HttpOptions::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
//!
//! Routes (JSON in and out; errors are `{"code", "message"}`; docs/http.md has every
//! body and answer):
//!
//! | route | does |
//! |---|---|
//! | `GET /` | the live page |
//! | `GET /healthz` | 200 while the process is up |
//! | `GET /readyz` | 200 while accepting work, 503 once the shutdown began (drain gate) |
//! | `GET /metrics` | Prometheus (OpenMetrics text): turns, pushes, checkpoints, sessions |
//! | `POST /sessions` | spawn |
//! | `GET /sessions` | live sessions and stored records, each marked |
//! | `GET /sessions/{id}` | the S24 redacted view, and what the live session does |
//! | `DELETE /sessions/{id}` | delete the record and its history |
//! | `POST /sessions/{id}/items` | push (preempt options, `Idempotency-Key`) |
//! | `POST /sessions/{id}/stop` | stop with any stop option |
//! | `POST /sessions/{id}/detach` | detach (S23) |
//! | `POST /sessions/{id}/cancel` | cancel by id (S24) |
//! | `POST /sessions/{id}/resume` | resume with an answer (S4) |
//! | `GET /sessions/{id}/history` | kept checkpoints; `/history/{turn}` one of them |
//! | `GET /sessions/{id}/events` | Server-Sent Events; `Last-Event-ID` resumes |
//! | `GET /openapi.json` | the OpenAPI 3.1 document of every route ([`openapi`]) |
//!
//! With [`HttpOptions::token`] every route but the probes, the page and the document needs
//! `Authorization: Bearer <token>` (401 `unauthorized` otherwise); without one,
//! [`check_bind`] allows loopback addresses only. Requests in flight and open event
//! streams are bounded (429 `too_many`); CORS is off unless origins are configured.
//!
//! This crate owns the HTTP shape only: it calls the runtime's handle and never touches
//! a store or a session directly.

mod auth;
mod error;
mod events;
mod full;
mod idempotency;
mod limits;
mod memory;
mod metrics;
pub mod openapi;
mod options;
mod probes;
pub mod same_machine;
mod schemas;
pub mod server;
mod sessions;
pub mod tls;
mod wire;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue};
use axum::Router;

use agentloop::RuntimeHandle;

pub use error::{plain_serde_message, ApiError};
pub use events::KEEP_ALIVE;
pub use idempotency::{DEFAULT_IDEMPOTENCY_KEYS, DEFAULT_IDEMPOTENCY_TTL, MAX_KEY_LEN};
pub use limits::{DEFAULT_MAX_EVENT_STREAMS, DEFAULT_MAX_REQUESTS};
pub use options::{
    check_bind, check_token, HttpOptions, MetricsHook, DEFAULT_BODY_LIMIT,
    DEFAULT_BODY_READ_TIMEOUT, MIN_TOKEN_LEN,
};
pub use sessions::{Ev as HttpEvent, Item as HttpItem, DEFAULT_REPLAY};

use sessions::{AppState, Ev, Item};

/// The router for `runtime`'s sessions (a `&Runtime` works too: it dereferences to its
/// handle). Items and answers are read from JSON (`I: Deserialize`), events written as
/// JSON (`E: Serialize`; kept in the store as JSON too, so `E: Deserialize`).
pub fn router<I: Item, E: Ev>(runtime: &RuntimeHandle<I, E>, options: HttpOptions) -> Router {
    // S20a: persistent sessions spawned over HTTP keep their events, as JSON.
    runtime.keep_events_as_json();
    let max_streams = options
        .max_event_streams
        .unwrap_or(DEFAULT_MAX_EVENT_STREAMS);
    let state = AppState(Arc::new(sessions::Shared {
        runtime: runtime.clone(),
        streams: limits::Gauge::new(max_streams),
        idempotency: idempotency::Idempotency::new(
            options.idempotency_keys.unwrap_or(DEFAULT_IDEMPOTENCY_KEYS),
            options.idempotency_ttl.unwrap_or(DEFAULT_IDEMPOTENCY_TTL),
        ),
        max_replay: options
            .max_replay
            .unwrap_or(agentloop::config::DEFAULT_MAX_REPLAY),
        max_duration: options
            .max_duration
            .unwrap_or(agentloop::config::DEFAULT_MAX_DURATION),
        metrics_extra: options.metrics_extra.clone(),
    }));
    let requests = limits::Gauge::new(options.max_requests.unwrap_or(DEFAULT_MAX_REQUESTS));
    // Each route's path and methods are its OpenAPI operation's (S43): the document
    // lists every route served, and no other.
    use openapi::Documented as _;
    use sessions::{control, push, read, spawn, stored, stream, timers};
    let app = Router::new()
        .documented::<probes::__path_page, _, _>(probes::page)
        .documented::<probes::__path_healthz, _, _>(probes::healthz)
        .documented::<probes::__path_readyz, _, _>(probes::readyz::<I, E>)
        .documented::<metrics::__path_metrics, _, _>(metrics::metrics::<I, E>)
        .documented::<openapi::__path_openapi_json, _, _>(openapi::openapi_json)
        .documented::<spawn::__path_spawn, _, _>(spawn::spawn::<I, E>)
        .documented::<read::__path_list, _, _>(read::list::<I, E>)
        .documented::<read::__path_get_one, _, _>(read::get_one::<I, E>)
        .documented::<stored::__path_delete, _, _>(stored::delete::<I, E>)
        .documented::<push::__path_push, _, _>(push::push::<I, E>)
        .documented::<control::__path_stop, _, _>(control::stop::<I, E>)
        .documented::<control::__path_detach, _, _>(control::detach::<I, E>)
        .documented::<control::__path_move_to, _, _>(control::move_to::<I, E>)
        .documented::<control::__path_cancel, _, _>(control::cancel::<I, E>)
        .documented::<control::__path_resume, _, _>(control::resume::<I, E>)
        .documented::<stored::__path_history, _, _>(stored::history::<I, E>)
        .documented::<stored::__path_checkpoint, _, _>(stored::checkpoint::<I, E>)
        .documented::<stored::__path_fork, _, _>(stored::fork::<I, E>)
        .documented::<stream::__path_events, _, _>(stream::events::<I, E>)
        .documented::<timers::__path_arm, _, _>(timers::arm::<I, E>)
        .documented::<timers::__path_list, _, _>(timers::list::<I, E>)
        .documented::<timers::__path_cancel, _, _>(timers::cancel::<I, E>)
        // Errors are JSON with a stable code on every route, 404 and 405 included
        // (S34a).
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(
            options.body_limit.unwrap_or(DEFAULT_BODY_LIMIT),
        ))
        .layer(axum::middleware::from_fn_with_state(
            limits::BodyBounds {
                limit: options.body_limit.unwrap_or(DEFAULT_BODY_LIMIT),
                read_timeout: options
                    .body_read_timeout
                    .unwrap_or(DEFAULT_BODY_READ_TIMEOUT),
            },
            limits::read_body,
        ))
        // Outside the body's read: a push to a full session waits its turn before its
        // body is read (S34a).
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(full::FullSessions::default()),
            full::order_pushes,
        ));
    // Outside the body's read: work over the memory budget is refused before its body
    // is read (issue 52).
    let app = match options.memory_budget {
        Some(budget) => app.layer(axum::middleware::from_fn_with_state(budget, memory::gate)),
        None => app,
    };
    let mut app = app.with_state(state);
    // Without a token there is nothing to check: no layer at all (a push's latency is
    // a figure, B8).
    match options.token {
        Some(token) => {
            app = app.layer(axum::middleware::from_fn_with_state(
                Some(Arc::<str>::from(token)),
                auth::authenticate,
            ))
        }
        // Without a token: loopback Host names and JSON mutations only (S34a).
        None => app = app.layer(axum::middleware::from_fn(same_machine::guard)),
    }
    app = app.layer(axum::middleware::from_fn_with_state(
        requests,
        limits::bound_requests,
    ));
    if !options.cors_origins.is_empty() {
        app = app.layer(cors(&options.cors_origins));
    }
    if options.access_log {
        app = app.layer(access_log());
    }
    app
}

/// The access log (S34a): one INFO line per answered request, with its method, path
/// (never the query: `?access_token=` must not reach a log), status and latency.
fn access_log() -> tower_http::trace::TraceLayer<
    tower_http::classify::SharedClassifier<tower_http::classify::ServerErrorsAsFailures>,
    impl Fn(&axum::http::Request<axum::body::Body>) -> tracing::Span + Clone,
    tower_http::trace::DefaultOnRequest,
    tower_http::trace::DefaultOnResponse,
> {
    use tower_http::trace::{DefaultOnResponse, TraceLayer};
    TraceLayer::new_for_http()
        .make_span_with(|req: &axum::http::Request<axum::body::Body>| {
            tracing::info_span!(
                target: "agentloop_http::access",
                "request",
                method = %req.method(),
                path = %error::excerpt(req.uri().path()),
            )
        })
        .on_response(
            DefaultOnResponse::new()
                .level(tracing::Level::INFO)
                .latency_unit(tower_http::LatencyUnit::Micros),
        )
}

fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| match HeaderValue::from_str(o) {
            Ok(v) => Some(v),
            Err(_) => {
                tracing::warn!(origin = %o, "a configured CORS origin is not a valid header value; it is ignored");
                None
            }
        })
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([
            axum::http::Method::GET,
            axum::http::Method::POST,
            axum::http::Method::DELETE,
        ])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("idempotency-key"),
            header::HeaderName::from_static("last-event-id"),
        ])
}

/// 404 `not_found` as JSON, for a path no route serves.
async fn not_found(uri: axum::http::Uri) -> ApiError {
    let path: String = uri.path().chars().take(200).collect();
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no route serves `{path}`; the routes are listed in docs/http.md"),
    )
}

/// 405 `method_not_allowed` as JSON, for a route asked with a method it does not take.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let path: String = uri.path().chars().take(200).collect();
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("`{path}` does not take {method}; the routes and their methods are listed in docs/http.md"),
    )
}
