//! The HTTP front's errors (issue 17): a JSON body with a stable `code` and a message
//! that says what to do, and the status that goes with it. This module maps the
//! runtime's errors to them; it does not decide anything else.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use agentloop::{PushError, SessionError, SupervisorError};

/// An error answer: `{"code": "...", "message": "..."}` with its status.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable, machine-readable code (`bad_request`, `unknown_session`, …).
    pub code: &'static str,
    /// What happened and what to do.
    pub message: String,
    /// When to retry (`Retry-After`, whole seconds rounded up), for `503 not_live`.
    pub retry_after: Option<std::time::Duration>,
}

/// The `code` of an error answer, kept in the response's extensions so that layers
/// (the full-session gate) can read what happened without parsing the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ErrorCode(pub(crate) &'static str);

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    message: &'a str,
    /// For `not_live`: when to retry, in milliseconds (also as `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request cannot be used as it is.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: message.into(),
            retry_after: None,
        }
    }

    /// 429 `session_full`: the session holds all it may (S34a); retry after
    /// `Retry-After`.
    pub fn session_full(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "session_full",
            message: message.into(),
            retry_after: Some(FULL_RETRY),
        }
    }

    /// 503: the runtime is shutting down.
    pub fn draining(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "draining",
            message: message.into(),
            retry_after: None,
        }
    }
}

impl ApiError {
    /// `503 not_live` (issue 28): a session is stored but not live yet; retry after
    /// `retry_after`.
    pub fn not_live(message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "not_live",
            message: message.into(),
            retry_after: Some(retry_after),
        }
    }
}

/// serde's message for JSON that does not fit a type, in JSON's terms (S34a: `expected
/// struct Partial` becomes `expected an object`, `expected u64` a whole number): for an
/// embedder that parses a client's JSON itself (the agent configurations of `agentloop
/// serve`).
pub fn plain_serde_message(message: &str) -> String {
    clean_serde_message(message)
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

/// Every error `code` the server answers with (the OpenAPI document's `ErrorCode`
/// schema lists these values; a test holds the two together).
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

/// At most this many characters of a client's input go into a log line or a message.
pub(crate) const EXCERPT_CHARS: usize = 100;

/// `text` from a client as a log line or a message may carry it (issue 52): its first
/// [`EXCERPT_CHARS`] characters, control characters escaped, and how long it was when
/// cut. A 60 KB `Host` is 100 characters of log, not 60 KB.
pub(crate) fn excerpt(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(EXCERPT_CHARS)
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect();
    if text.chars().nth(EXCERPT_CHARS).is_some() {
        out.push_str(&format!("… ({} bytes)", text.len()));
    }
    out
}

/// `Retry-After` in whole seconds, rounded up, at least 1.
pub fn retry_after_secs(d: std::time::Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        debug_assert!(
            ERROR_CODES.contains(&self.code),
            "the error code `{}` is not in the OpenAPI document's ErrorCode",
            self.code
        );
        let body = Json(Body {
            code: self.code,
            message: &self.message,
            retry_after_ms: self.retry_after.map(|d| d.as_millis() as u64),
        });
        let mut response = (self.status, body).into_response();
        response.extensions_mut().insert(ErrorCode(self.code));
        if let Some(d) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_after_secs(d)),
            );
        }
        response
    }
}

/// When to retry a push or a spawn refused for a bound on what is held (S34a).
const FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl From<SupervisorError> for ApiError {
    fn from(e: SupervisorError) -> Self {
        let (status, code) = match &e {
            SupervisorError::InvalidId(_)
            | SupervisorError::UnknownKind { .. }
            | SupervisorError::BadConfig { .. }
            | SupervisorError::BatchTooLarge { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
            SupervisorError::Duplicate(_) => (StatusCode::CONFLICT, "duplicate"),
            SupervisorError::Running(_) | SupervisorError::NoStore(_) => {
                (StatusCode::CONFLICT, "wrong_state")
            }
            SupervisorError::UnknownSession(_) => (StatusCode::NOT_FOUND, "unknown_session"),
            // S40: the record's version does not run here (kept as it was).
            SupervisorError::Version(
                agentloop::versions::VersionError::Unavailable { .. }
                | agentloop::versions::VersionError::Migration { .. },
            ) => (StatusCode::CONFLICT, "version_unavailable"),
            SupervisorError::ShuttingDown(_) => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
            // S34a: load, so 429 with when to retry.
            SupervisorError::TooManySessions { .. } => {
                return ApiError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    code: "too_many_sessions",
                    message: e.to_string(),
                    retry_after: Some(FULL_RETRY),
                }
            }
            SupervisorError::Session(SessionError::InvalidOptions(_)) => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            SupervisorError::Session(
                SessionError::DetachNeedsStore(_) | SessionError::Exited(_),
            ) => (StatusCode::CONFLICT, "wrong_state"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError {
            status,
            code,
            message: e.to_string(),
            retry_after: None,
        }
    }
}

impl From<agentloop::cluster::control::ControlError> for ApiError {
    fn from(e: agentloop::cluster::control::ControlError) -> Self {
        use agentloop::cluster::control::ControlError;
        match e {
            ControlError::Here(e) => e.into(),
            e @ ControlError::Unreachable { .. } => {
                ApiError::new(StatusCode::BAD_GATEWAY, "owner_unreachable", e.to_string())
            }
            e @ ControlError::Refused { .. } => {
                ApiError::new(StatusCode::CONFLICT, "wrong_state", e.to_string())
            }
            e @ ControlError::NotForwardable(_) => {
                ApiError::new(StatusCode::CONFLICT, "not_forwardable", e.to_string())
            }
            // Issue 28: stored, not live yet (retry) or not running (what to do).
            ControlError::NotLive {
                ref retry_after, ..
            } => {
                let after = *retry_after;
                ApiError::not_live(e.to_string(), after)
            }
            e @ ControlError::NotRunning { .. } => {
                ApiError::new(StatusCode::CONFLICT, "wrong_state", e.to_string())
            }
        }
    }
}

impl<I> From<PushError<I>> for ApiError {
    fn from(e: PushError<I>) -> Self {
        let (status, code) = match &e {
            PushError::UnknownSession { .. } => (StatusCode::NOT_FOUND, "unknown_session"),
            PushError::Late { .. } => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
            PushError::NotStorable { .. } | PushError::InvalidOptions { .. } => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            // S34a: the record knows this key with another push.
            PushError::KeyReused { .. } => (StatusCode::CONFLICT, "idempotency_mismatch"),
            // S34a: the session holds all it may; nothing was accepted.
            PushError::Full { .. } => return ApiError::session_full(e.to_string()),
            PushError::NotDurable { .. } => (StatusCode::CONFLICT, "wrong_state"),
            // Issue 18: the session runs on another node.
            PushError::NotForwardable { .. } => (StatusCode::CONFLICT, "not_forwardable"),
            PushError::RefusedByOwner { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
            PushError::OwnerUnreachable { .. } => (StatusCode::BAD_GATEWAY, "owner_unreachable"),
            // Issue 28: stored, not live yet (retry) or not running (what to do).
            PushError::NotLive { retry_after, .. } => {
                return ApiError::not_live(e.to_string(), *retry_after)
            }
            PushError::NotRunning { .. } => (StatusCode::CONFLICT, "wrong_state"),
        };
        ApiError {
            status,
            code,
            message: e.to_string(),
            retry_after: None,
        }
    }
}

impl<I> From<agentloop::session::AnswerError<I>> for ApiError {
    fn from(e: agentloop::session::AnswerError<I>) -> Self {
        use agentloop::session::AnswerError as A;
        let (status, code) = match &e {
            A::NotFound { .. } => (StatusCode::NOT_FOUND, "unknown_session"),
            A::NotPersistent { .. } | A::NotAwaiting { .. } => {
                (StatusCode::CONFLICT, "wrong_state")
            }
            A::NotStorable { .. } | A::UnknownKind { .. } => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            A::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError {
            status,
            code,
            message: e.to_string(),
            retry_after: None,
        }
    }
}

impl From<agentloop::StoreError> for ApiError {
    fn from(e: agentloop::StoreError) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: format!("the checkpoint store failed: {e}"),
            retry_after: None,
        }
    }
}
