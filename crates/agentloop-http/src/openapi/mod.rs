//! The HTTP contract as an OpenAPI 3.1 document (S43), generated from the handlers'
//! `#[utoipa::path]` annotations and served at `GET /openapi.json`. The router is built
//! from the same annotations (`Documented::documented`: a route's path and methods
//! are the ones its operation names), so the document lists every route the router
//! serves and no other. `docs/openapi.json` is this document as checked in; a test
//! holds the two equal and validates real answers against it.
//!
//! This module owns the document and the route helper; it does not decide what a route
//! does (the handlers) or how it is guarded (the layers in `lib.rs`).

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

pub use crate::error::ERROR_CODES;

/// Every `event:` kind of `GET /sessions/{id}/events` (the `StreamEvent` schema's).
pub const EVENT_KINDS: [&str; 11] = [
    "turn_started",
    "agent",
    "step_started",
    "step_finished",
    "preempted",
    "turn_ended",
    "stop_requested",
    "lagged",
    "ended",
    "restarting",
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
        crate::probes::page,
        crate::probes::healthz,
        crate::probes::readyz,
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
    components(schemas(crate::schemas::StreamEvent, crate::schemas::ErrorCode)),
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
/// bound, the token, the body bounds), the bearer scheme and who needs it, the
/// `servers`, and the event stream's shape as generators read it.
///
/// # The token is optional in the document
///
/// A server runs with a token (`--token`, `[http] token`: every route but the public
/// ones needs it) or without one (loopback only, nothing needs it), and it serves one
/// document either way: `docs/openapi.json` is that document, checked in and held equal
/// to the served one, and a client generated from it must work with both servers. So
/// a route that takes the token says `security: [{"bearer": []}, {}]`: the bearer, or
/// nothing (the empty requirement), OpenAPI's "authentication is optional". A
/// mandatory bearer made every generated client demand a token that a server without
/// one neither needs nor checks. It is said once, at the document's root, and every
/// operation but the public ones inherits it: the same meaning as saying it on each
/// operation, and what openapi-python-client (0.29) reads as optional, since it types an
/// operation's `client` as `AuthenticatedClient` whenever the operation's own
/// `security` is non-empty, even with `{}` in it, and as `AuthenticatedClient | Client`
/// otherwise. The public routes ([`PUBLIC_PATHS`], which `auth.rs` passes without a
/// token even when one is configured) say `security: []`: no token, ever. The 401 each
/// token route documents says it is answered only with a token configured.
struct Guards;

impl Modify for Guards {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::SecurityRequirement;
        doc.servers = Some(servers());
        // The bearer, or nothing: a server without a token needs none (see above).
        doc.security = Some(vec![
            SecurityRequirement::new("bearer", Vec::<String>::new()),
            SecurityRequirement::default(),
        ]);
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The server's token (`agentloop serve --token`, `[http] token`), \
                         needed only when one is configured; `GET /sessions/{id}/events` \
                         also takes it as `?access_token=` (browsers' `EventSource`)",
                    ))
                    .build(),
            ),
        );
        if let Some(RefOr::T(stream)) = components.schemas.get_mut("StreamEvent") {
            sse_envelopes(stream);
        }
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
                if !crate::limits::PROBES.contains(&path.as_str()) {
                    add(
                        "429",
                        "`too_many`: requests in flight or event streams at their bound",
                    );
                }
                if public {
                    // No token, even with one configured.
                    op.security = Some(Vec::new());
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
            }
        }
    }
}

/// The document's `servers`.
///
/// First a plain absolute URL, `agentloop serve`'s default address: generators take
/// `servers[0].url` as the client's default base URL, and copy it as it is (hey-api's
/// `baseUrl`, openapi-generator's `basePath`), so it must be a literal URL a client can
/// call, not a template with `{variables}` that some of them leave unexpanded or a
/// relative `/` that a non-browser client cannot resolve. Then `/`, the server that
/// served this document (a relative URL resolves against where `/openapi.json` was
/// fetched): right for a browser client on the live page, and for any address
/// `--listen` picks. openapi-python-client ignores `servers` (its `Client` takes a
/// `base_url`).
fn servers() -> Vec<utoipa::openapi::Server> {
    use utoipa::openapi::ServerBuilder;
    vec![
        ServerBuilder::new()
            .url("http://127.0.0.1:7420")
            .description(Some(
                "`agentloop serve` on its default address (`--listen` changes it)",
            ))
            .build(),
        ServerBuilder::new()
            .url("/")
            .description(Some(
                "The server that served this document (relative to `/openapi.json`)",
            ))
            .build(),
    ]
}

/// Makes each member of the `StreamEvent` oneOf the envelope of one Server-Sent Event
/// as SSE-aware generators read a `text/event-stream` schema (one object per event
/// with the fields `id`, `event`, `data`, `retry`): its `event` is a `const` (the
/// event's name, which a generator turns into the literal that tells the events apart;
/// an `enum` of one value loses it in some), its `data` references the event's own
/// schema (sent as JSON on the `data:` line), and `id` is the event's number (its
/// `id:` line, what `Last-Event-ID` resumes after). `not_live` has no `id` and carries
/// `retry` (its `retry:` line). utoipa 6 has no `const`: it is written as a keyword
/// beside the schema's others.
fn sse_envelopes(stream: &mut utoipa::openapi::schema::Schema) {
    use utoipa::openapi::schema::{Object, ObjectBuilder, Schema, Type};
    let Schema::OneOf(one_of) = stream else {
        return;
    };
    one_of.description = Some(
        "One Server-Sent Event of `GET /sessions/{id}/events`: its `event:` line is \
         `event`, its `data:` line is `data` as JSON, its `id:` line is `id`."
            .into(),
    );
    for member in one_of.items.iter_mut() {
        let RefOr::T(Schema::Object(envelope)) = member else {
            continue;
        };
        let Some(RefOr::T(Schema::Object(event))) = envelope.properties.get_mut("event") else {
            continue;
        };
        let Some(name) = event
            .enum_values
            .take()
            .and_then(|values| values.into_iter().next())
        else {
            continue;
        };
        let not_live = name.as_str() == Some("not_live");
        let mut constant: Object = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("The event's name (its `event:` line)"))
            .build();
        constant
            .extensions
            .get_or_insert_with(Default::default)
            .insert("const".into(), name);
        *event = constant;
        if not_live {
            envelope.properties.insert(
                "retry".into(),
                RefOr::T(Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0))
                        .description(Some(
                            "When to reconnect, in ms (its `retry:` line; the same as \
                             `data.retry_after_ms`)",
                        ))
                        .build(),
                )),
            );
        } else {
            envelope.properties.insert(
                "id".into(),
                RefOr::T(Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some("^[0-9]+$"))
                        .description(Some(
                            "The event's number (its `id:` line): send it back as \
                             `Last-Event-ID` to resume after it",
                        ))
                        .build(),
                )),
            );
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

/// This OpenAPI document.
///
/// The OpenAPI 3.1 document of this server's routes (no token needed: it is the
/// contract, not a session's data).
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
