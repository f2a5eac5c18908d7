//! How the router is bounded and guarded ([`HttpOptions`]) and the checks a server runs
//! before it listens (a token's strength, a bind address without one). Plain
//! configuration: it serves nothing.

use std::sync::Arc;
use std::time::Duration;

/// The largest request body accepted unless [`HttpOptions::body_limit`] says otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// How long a request body may take to arrive unless [`HttpOptions::body_read_timeout`]
/// says otherwise.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How the router is bounded and guarded. `Default` is loopback use: no token, the
/// default bounds, no CORS.
#[derive(Clone, Default)]
pub struct HttpOptions {
    /// The largest request body accepted, in bytes (413 above it). `None`:
    /// [`DEFAULT_BODY_LIMIT`].
    pub body_limit: Option<usize>,
    /// How long a whole request body may take to arrive (408 `body_timeout` after it;
    /// S34a). `None`: [`DEFAULT_BODY_READ_TIMEOUT`].
    pub body_read_timeout: Option<Duration>,
    /// The bearer token every route but `/healthz`, `/readyz`, the page and
    /// `/openapi.json` requires
    /// (`Authorization: Bearer <token>`, compared in constant time; 401 without it or
    /// with another). `None`: no authentication, so serve on loopback only
    /// ([`check_bind`]).
    pub token: Option<String>,
    /// Requests in flight at once (429 above it). `None`: [`DEFAULT_MAX_REQUESTS`](crate::DEFAULT_MAX_REQUESTS).
    pub max_requests: Option<usize>,
    /// Event streams open at once (429 above it). `None`:
    /// [`DEFAULT_MAX_EVENT_STREAMS`](crate::DEFAULT_MAX_EVENT_STREAMS).
    pub max_event_streams: Option<usize>,
    /// Origins allowed to call from a browser page served elsewhere (CORS). Empty: no
    /// CORS headers at all, so browsers allow same-origin calls only.
    pub cors_origins: Vec<String>,
    /// Idempotency keys remembered at most. `None`: [`DEFAULT_IDEMPOTENCY_KEYS`](crate::DEFAULT_IDEMPOTENCY_KEYS).
    pub idempotency_keys: Option<usize>,
    /// How long an idempotency key is remembered. `None`: [`DEFAULT_IDEMPOTENCY_TTL`](crate::DEFAULT_IDEMPOTENCY_TTL).
    pub idempotency_ttl: Option<Duration>,
    /// The largest replay buffer a spawn may ask for (400 above it; S34a). `None`:
    /// [`agentloop::config::DEFAULT_MAX_REPLAY`].
    pub max_replay: Option<usize>,
    /// The longest duration a request may carry (timeouts, delays, idle; 400 above it;
    /// S34a). `None`: [`agentloop::config::DEFAULT_MAX_DURATION`].
    pub max_duration: Option<Duration>,
    /// Log every request at INFO (target `agentloop_http::access`: method, path,
    /// status, latency; never the query, which may carry a token) through
    /// `tower_http::trace`. Off by default.
    pub access_log: bool,
    /// The process's memory budget (S34a, issue 52): over it, a request that brings
    /// new work (spawn, push, fork, answer, timer, a new event stream) gets 503
    /// `over_memory` with `Retry-After` before its body is read. `None`: no budget.
    pub memory_budget: Option<agentloop::memory::MemoryBudget>,
    /// Readings `/metrics` adds at every scrape, beside the runtime's (e.g. a model
    /// provider's token usage: `agentloop_openai::Provider::register_metrics`).
    pub metrics_extra: Option<MetricsHook>,
}

/// Registers readings on the registry `/metrics` encodes (called at every scrape; it
/// must not block).
pub type MetricsHook =
    Arc<dyn Fn(&mut prometheus_client::registry::Registry) + Send + Sync + 'static>;

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("body_limit", &self.body_limit)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("max_requests", &self.max_requests)
            .field("max_event_streams", &self.max_event_streams)
            .field("cors_origins", &self.cors_origins)
            .field("idempotency_keys", &self.idempotency_keys)
            .field("idempotency_ttl", &self.idempotency_ttl)
            .field("max_replay", &self.max_replay)
            .field("max_duration", &self.max_duration)
            .field("access_log", &self.access_log)
            .field(
                "metrics_extra",
                &self.metrics_extra.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

/// The shortest bearer token accepted (S34a): a short one is guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// Whether `token` may guard the server (S34a): not empty or blank, at least
/// [`MIN_TOKEN_LEN`] characters, no whitespace or control characters (a header cannot
/// carry them).
pub fn check_token(token: &str) -> Result<(), String> {
    if token.trim().is_empty() {
        return Err(
            "the bearer token is empty: set a secret of at least 16 characters (e.g. \
                    `openssl rand -hex 24`), or leave it unset to serve on loopback only"
                .into(),
        );
    }
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(format!(
            "the bearer token is {} characters long: use at least {MIN_TOKEN_LEN} (e.g. \
             `openssl rand -hex 24`)",
            token.chars().count()
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(
            "the bearer token contains whitespace or control characters, which an \
                    Authorization header cannot carry: use letters, digits and punctuation"
                .into(),
        );
    }
    Ok(())
}

/// Whether the router may listen on `addr`: a token, when set, passes [`check_token`];
/// without one only a loopback address (anyone who reaches the port could drive every
/// session).
pub fn check_bind(addr: std::net::SocketAddr, options: &HttpOptions) -> Result<(), String> {
    if let Some(t) = &options.token {
        check_token(t)?;
    }
    if options.token.is_none() && !addr.ip().is_loopback() {
        return Err(format!(
            "refusing to listen on {addr} without a token: set a bearer token (config or \
             environment) to serve beyond this machine, or listen on 127.0.0.1"
        ));
    }
    Ok(())
}
