//! The HTTP contract as an OpenAPI 3.1 document (S43), generated from the handlers'
//! `#[utoipa::path]` annotations and served at `GET /openapi.json`. The router is built
//! from the same annotations (`Documented::documented`: a route's path and methods
//! are the ones its operation names), so the document lists every route the router
//! serves and no other. `docs/openapi.json` is this document as checked in; a test
//! holds the two equal and validates real answers against it.
//!
//! This module owns the document and the route helper; it does not decide what a route
//! does (the handlers) or how it is guarded (the layers in `lib.rs`).

pub(crate) mod schemas;

use std::sync::OnceLock;

use axum::handler::Handler;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{MethodFilter, MethodRouter};
use axum::Router;
use utoipa::openapi::path::HttpMethod;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Response};
use utoipa::{Modify, OpenApi};

/// The routes without a token: the probes, the page and this document.
pub(crate) const PUBLIC_PATHS: [&str; 4] = ["/", "/healthz", "/readyz", "/openapi.json"];

/// The probes: they take no request slot (a slow client cannot fail them).
pub(crate) const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// Every error `code` the server answers with (the `ErrorCode` schema's values).
pub const ERROR_CODES: [&str; 29] = [
    "bad_request",
    "unauthorized",
    "forbidden_host",
    "unknown_session",
    "unknown_checkpoint",
    "unknown_timer",
    "not_found",
    "method_not_allowed",
    "body_timeout",
    "duplicate",
    "wrong_state",
    "idempotency_mismatch",
    "version_unavailable",
    "not_forwardable",
    "not_a_node",
    "too_large",
    "uri_too_long",
    "headers_too_large",
    "json_required",
    "too_many",
    "too_many_sessions",
    "too_many_timers",
    "session_full",
    "over_memory",
    "internal",
    "owner_unreachable",
    "draining",
    "not_live",
    "unavailable",
];

/// Every `event:` kind of `GET /sessions/{id}/events` (the `StreamEvent` schema's).
pub const EVENT_KINDS: [&str; 10] = [
    "turn_started",
    "agent",
    "step_started",
    "step_finished",
    "preempted",
    "turn_ended",
    "stop_requested",
    "lagged",
    "ended",
    "not_live",
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentloop",
        description = "Long-running agent sessions over HTTP: spawn, push, stop, read, stream \
                       their events (Server-Sent Events) and keep their history. Errors are \
                       `{\"code\", \"message\"}` with a stable code (`ErrorCode`). With a \
                       token, every route but `/`, `/healthz`, `/readyz` and `/openapi.json` \
                       needs `Authorization: Bearer <token>`. docs/http.md tells the rest.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    paths(
        crate::page,
        crate::healthz,
        crate::readyz,
        crate::metrics::metrics,
        openapi_json,
        crate::sessions::spawn::spawn,
        crate::sessions::read::list,
        crate::sessions::read::get_one,
        crate::sessions::stored::delete,
        crate::sessions::push::push,
        crate::sessions::control::stop,
        crate::sessions::control::detach,
        crate::sessions::control::move_to,
        crate::sessions::control::cancel,
        crate::sessions::control::resume,
        crate::sessions::stored::history,
        crate::sessions::stored::checkpoint,
        crate::sessions::stored::fork,
        crate::sessions::stream::events,
        crate::sessions::timers::arm,
        crate::sessions::timers::list,
        crate::sessions::timers::cancel,
    ),
    components(schemas(schemas::StreamEvent, schemas::ErrorCode)),
    modifiers(&Guards),
    tags(
        (name = "probes", description = "Health, readiness, metrics, this document, the page"),
        (name = "sessions", description = "Spawn, list, read, push, stop and delete sessions"),
        (name = "history", description = "Kept checkpoints and forks"),
        (name = "events", description = "A session's events as Server-Sent Events"),
        (name = "timers", description = "Durable timers and schedules (S39)"),
    )
)]
struct ApiDoc;

/// Adds what the layers around the routes may answer (the loopback guard, the request
/// bound, the token, the body bounds) and the bearer scheme.
struct Guards;

impl Modify for Guards {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            let public = PUBLIC_PATHS.contains(&path.as_str());
            for (method, op) in [
                ("get", item.get.as_mut()),
                ("post", item.post.as_mut()),
                ("delete", item.delete.as_mut()),
            ] {
                let Some(op) = op else { continue };
                let mut add = |status: &str, what: &str| {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| error_response(what));
                };
                // Without a token, every route refuses a foreign `Host` (S34a).
                add(
                    "403",
                    "`forbidden_host`: (no token) the `Host` is not a loopback name",
                );
                // Every route but the probes takes a request slot.
                if !PROBES.contains(&path.as_str()) {
                    add(
                        "429",
                        "`too_many`: requests in flight or event streams at their bound",
                    );
                }
                if public {
                    continue;
                }
                add(
                    "401",
                    "`unauthorized`: no or wrong bearer token (with a token configured; \
                     `WWW-Authenticate: Bearer`)",
                );
                if method == "post" {
                    add(
                        "408",
                        "`body_timeout`: the body did not arrive whole in time",
                    );
                    add("413", "`too_large`: the body is over the limit");
                    add(
                        "415",
                        "`json_required`: (no token) not `application/json` and no \
                         `X-Agentloop-Client` header",
                    );
                }
                op.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
                    "bearer",
                    Vec::<String>::new(),
                )]);
            }
        }
    }
}

/// An error answer with the `Error` body.
fn error_response(description: &str) -> RefOr<Response> {
    use utoipa::openapi::{ContentBuilder, ResponseBuilder};
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        "Error",
                    ))))
                    .build(),
            )
            .build(),
    )
}

/// The document, built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(ApiDoc::openapi)
}

/// The document as pretty JSON with a final newline (what `docs/openapi.json` holds and
/// `GET /openapi.json` answers).
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| match document().to_pretty_json() {
        Ok(mut text) => {
            text.push('\n');
            text
        }
        // The document is built from static annotations: it always serializes.
        Err(e) => format!("{{\"error\": \"the OpenAPI document did not serialize: {e}\"}}\n"),
    })
}

/// The OpenAPI 3.1 document of this server's routes.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "probes",
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json"))
)]
pub(crate) async fn openapi_json() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_json(),
    )
}

/// A router that takes routes from their OpenAPI operations.
pub(crate) trait Documented<S> {
    /// Serves `handler` at the path and with the methods its operation `P` (the
    /// `__path_*` type `#[utoipa::path]` made) names.
    fn documented<P: utoipa::Path, H: Handler<T, S>, T: 'static>(self, handler: H) -> Self;
}

impl<S: Clone + Send + Sync + 'static> Documented<S> for Router<S> {
    fn documented<P: utoipa::Path, H: Handler<T, S>, T: 'static>(self, handler: H) -> Self {
        let mut route = MethodRouter::new();
        for method in P::methods() {
            route = route.on(filter(&method), handler.clone());
        }
        self.route(&P::path(), route)
    }
}

/// axum's filter for an OpenAPI method.
fn filter(method: &HttpMethod) -> MethodFilter {
    match method {
        HttpMethod::Get => MethodFilter::GET,
        HttpMethod::Post => MethodFilter::POST,
        HttpMethod::Put => MethodFilter::PUT,
        HttpMethod::Delete => MethodFilter::DELETE,
        HttpMethod::Options => MethodFilter::OPTIONS,
        HttpMethod::Head => MethodFilter::HEAD,
        HttpMethod::Patch => MethodFilter::PATCH,
        HttpMethod::Trace => MethodFilter::TRACE,
    }
}
