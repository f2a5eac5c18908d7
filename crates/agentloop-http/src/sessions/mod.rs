//! The session routes (issue 17, S33): spawn, list, read (the S24 redacted view), push
//! (preempt options, idempotency key), stop (every stop option), detach, cancel, resume
//! with an answer, history and delete. Each handler turns JSON into one runtime call
//! and its answer back into JSON; the runtime decides everything. One room a concern:
//! `spawn`, `read`, `push`, `control` (stop, detach, move, cancel, resume), `stored`
//! (history, checkpoint, delete), `stream` (events) and `id` (the path's session id).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

use agentloop::RuntimeHandle;

pub(crate) use crate::error::clean_serde_message;
use crate::error::ApiError;
use crate::idempotency::Idempotency;
use crate::limits::Gauge;

pub(crate) mod control;
mod id;
mod parse;
pub(crate) mod push;
pub(crate) mod read;
pub(crate) mod spawn;
pub(crate) mod stored;
pub(crate) mod stream;
pub(crate) mod timers;

pub(crate) use read::kind_of;

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
    /// Readings `/metrics` adds (see `HttpOptions::metrics_extra`).
    pub(crate) metrics_extra: Option<crate::options::MetricsHook>,
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
pub trait Ev: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T> Ev for T where T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}

/// A JSON body, or the error that says what is wrong with it (413 when too large).
pub(crate) fn body<T: DeserializeOwned>(
    raw: Result<Json<T>, JsonRejection>,
) -> Result<T, ApiError> {
    raw.map(|Json(v)| v).map_err(rejected)
}

/// What a client is told when its JSON body was refused (413 when too large).
pub(crate) fn rejected(e: JsonRejection) -> ApiError {
    match e {
        JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the request body is too large: {e}; send less"),
            )
        }
        e => not_this_body(&e.body_text()),
    }
}

/// A 400 for a body this route does not take, saying why.
pub(crate) fn not_this_body(why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the request body is not what this route takes: {}",
        clean_serde_message(why)
    ))
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
/// A bound as an operator wrote it: whole days as days (`3650 days`, not humantime's
/// `9years 11months 27days 21h 50m 24s`), whole hours as hours, else humantime's.
fn bound_text(d: Duration) -> String {
    let s = d.as_secs();
    match (d.subsec_nanos(), s) {
        (0, s) if s >= 86_400 && s % 86_400 == 0 => format!("{} days", s / 86_400),
        (0, s) if s >= 3_600 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        _ => humantime::format_duration(d).to_string(),
    }
}

/// The bound of a request's durations: `[limits] duration` (S34a).
pub(super) const LIMITS_DURATION: &str = "its [limits] duration";

/// `text` as a duration for `option`, positive and at most `max`; `bound` names where
/// `max` comes from in the refusal (issue 52: a timer's `in`, bounded by ten years,
/// was refused naming `[limits] duration`).
fn duration(option: &str, text: &str, max: Duration, bound: &str) -> Result<Duration, ApiError> {
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
            "{option} `{text}` is longer than this server allows: at most {} ({bound})",
            bound_text(max)
        )));
    }
    Ok(d)
}

#[cfg(test)]
mod message_tests {
    use super::*;

    /// Issue 52: a refused duration names the bound that refused it, and the bound it
    /// states is the one enforced.
    #[test]
    fn a_duration_refusal_names_the_bound_that_refused_it() {
        let e = duration(
            "in",
            "20years",
            Duration::from_secs(3650 * 86_400),
            "the furthest a timer is armed",
        )
        .unwrap_err();
        assert!(
            e.message.contains("the furthest a timer is armed"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("[limits] duration"), "{}", e.message);
        assert!(e.message.contains("at most 3650 days"), "{}", e.message);
        let e = duration("timeout", "2h", Duration::from_secs(3600), LIMITS_DURATION).unwrap_err();
        assert!(
            e.message.contains("at most 1h ([limits] duration)")
                || e.message.contains("at most 1h (its [limits] duration)"),
            "{}",
            e.message
        );
        assert!(duration("timeout", "1h", Duration::from_secs(3600), LIMITS_DURATION).is_ok());
    }
    use serde::Deserialize;

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
