//! One OpenAI-compatible model server: where it is, which model, the key, and what
//! every session calling it shares: one concurrency limit and one retry policy (429
//! and 5xx retried with exponential backoff, `Retry-After` honoured). Cloning a
//! [`Provider`] shares all of it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::error::ProviderError;
use crate::events::Usage;

/// A model server and the limits every session calling it shares.
#[derive(Clone)]
pub struct Provider {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) name: String,
    pub(crate) base_url: String,
    pub(crate) model: String,
    /// `{base_url}/chat/completions`.
    pub(crate) endpoint: String,
    pub(crate) http: reqwest::Client,
    /// Never logged, never in `Debug`.
    pub(crate) key: Option<String>,
    pub(crate) limit: Arc<Semaphore>,
    pub(crate) max_concurrency: usize,
    pub(crate) stream_restarts: u32,
    pub(crate) max_retries: u32,
    pub(crate) backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) bounds: Bounds,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) completion_tokens: AtomicU64,
    pub(crate) calls: AtomicU64,
}

/// What one model call may take and send (S34a at the model server's door): each
/// has a default, the builder sets it, and a call past one fails with a
/// [`crate::ModelError`] that names the setting.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// The longest wait for the status line and headers, per attempt.
    pub(crate) first_byte_timeout: Duration,
    /// The longest a call may take in all, retries and restarts included (from the
    /// moment it holds its concurrency permit).
    pub(crate) call_timeout: Duration,
    /// Bytes of one response (one attempt's stream), on the wire.
    pub(crate) max_response_bytes: u64,
    /// Bytes of the answer's text.
    pub(crate) max_text_bytes: usize,
    /// Tool calls in one answer (and so the highest index + 1).
    pub(crate) max_tool_calls: usize,
    /// Bytes of one tool call's name and arguments.
    pub(crate) max_tool_argument_bytes: usize,
    /// Bytes of one line (and of one event's data) of the stream.
    pub(crate) max_line_bytes: usize,
    /// Bytes of an error answer's body that are read (the rest is not).
    pub(crate) max_error_body_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            first_byte_timeout: Duration::from_secs(120),
            call_timeout: Duration::from_secs(600),
            max_response_bytes: 32 << 20,
            max_text_bytes: 1 << 20,
            max_tool_calls: 128,
            max_tool_argument_bytes: 1 << 20,
            max_line_bytes: 4 << 20,
            max_error_body_bytes: 4 << 10,
        }
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Provider")
            .field("name", &self.inner.name)
            .field("base_url", &self.inner.base_url)
            .field("model", &self.inner.model)
            .field("max_concurrency", &self.inner.max_concurrency)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// A provider of `model` at `base_url` (the API's root, e.g.
    /// `https://api.openai.com/v1` or `http://localhost:11434/v1` for Ollama).
    pub fn builder(base_url: impl Into<String>, model: impl Into<String>) -> ProviderBuilder {
        ProviderBuilder {
            base_url: base_url.into(),
            model: model.into(),
            name: None,
            key: None,
            max_concurrency: 8,
            max_retries: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            stream_restarts: 1,
            idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_tokens: None,
            bounds: Bounds::default(),
        }
    }

    /// Its provider name (in errors, logs, metrics and traces, as
    /// `gen_ai.provider.name`): the builder's, else [`default_provider_name`] of its
    /// URL (`openai`), never the model's.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The model it calls.
    pub fn model(&self) -> &str {
        &self.inner.model
    }

    /// Model calls in flight now (at most the concurrency limit).
    pub fn in_flight(&self) -> usize {
        self.inner.max_concurrency - self.inner.limit.available_permits()
    }

    /// Tokens used by every call so far, and how many calls ended.
    pub fn usage(&self) -> (Usage, u64) {
        (
            Usage {
                prompt_tokens: self.inner.prompt_tokens.load(Ordering::Relaxed),
                completion_tokens: self.inner.completion_tokens.load(Ordering::Relaxed),
            },
            self.inner.calls.load(Ordering::Relaxed),
        )
    }

    /// Registers this provider's readings on `registry` (for `/metrics`; see
    /// `agentloop_http::HttpOptions::metrics_extra`), labelled `provider` and `model`:
    /// `agentloop_model_tokens_total{kind="prompt"|"completion"}` and
    /// `agentloop_model_calls_total` (model calls that ended), and
    /// `agentloop_model_calls_in_flight`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        let (usage, calls) = self.usage();
        let labels = |extra: Option<(&str, &str)>| {
            let mut v = vec![
                ("provider".to_string(), self.inner.name.clone()),
                ("model".to_string(), self.inner.model.clone()),
            ];
            if let Some((k, val)) = extra {
                v.push((k.to_string(), val.to_string()));
            }
            v
        };
        let tokens = Family::<Vec<(String, String)>, Counter>::default();
        tokens
            .get_or_create(&labels(Some(("kind", "prompt"))))
            .inc_by(usage.prompt_tokens);
        tokens
            .get_or_create(&labels(Some(("kind", "completion"))))
            .inc_by(usage.completion_tokens);
        registry.register(
            "agentloop_model_tokens",
            "Tokens the model server reported, by kind (prompt, completion)",
            tokens,
        );
        let ended = Family::<Vec<(String, String)>, Counter>::default();
        ended.get_or_create(&labels(None)).inc_by(calls);
        registry.register("agentloop_model_calls", "Model calls that ended", ended);
        let in_flight = Family::<Vec<(String, String)>, Gauge>::default();
        in_flight
            .get_or_create(&labels(None))
            .set(self.in_flight() as i64);
        registry.register(
            "agentloop_model_calls_in_flight",
            "Model calls in flight now (at most the provider's concurrency limit)",
            in_flight,
        );
    }

    pub(crate) fn count(&self, usage: Usage) {
        self.inner
            .prompt_tokens
            .fetch_add(usage.prompt_tokens, Ordering::Relaxed);
        self.inner
            .completion_tokens
            .fetch_add(usage.completion_tokens, Ordering::Relaxed);
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// Builds a [`Provider`].
pub struct ProviderBuilder {
    base_url: String,
    model: String,
    name: Option<String>,
    key: Option<String>,
    max_concurrency: usize,
    max_retries: u32,
    backoff: Duration,
    max_backoff: Duration,
    stream_restarts: u32,
    idle_timeout: Duration,
    connect_timeout: Duration,
    max_tokens: Option<u32>,
    bounds: Bounds,
}

impl ProviderBuilder {
    /// Its provider name in errors, logs, metrics (label `provider`) and traces
    /// (`gen_ai.provider.name`), e.g. `ollama` or `vllm` (`agentloop serve
    /// --model-provider`). Default: [`default_provider_name`] of the URL, `openai` for
    /// the OpenAI-compatible API; a blank name is no name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The API key (sent as a bearer token, trimmed). Local servers (Ollama) need
    /// none: without a key, or with an empty one, no `Authorization` header is sent.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The API key from environment variable `var` (e.g. `OPENAI_API_KEY`).
    pub fn api_key_from_env(mut self, var: &str) -> Result<Self, ProviderError> {
        let key = std::env::var(var).map_err(|_| ProviderError::KeyVar {
            var: var.to_string(),
        })?;
        self.key = Some(key);
        Ok(self)
    }

    /// The API key from a file (its first line, trimmed), read with a size bound
    /// (`agentloop::operator_file`: a file of more than 1 MiB, or an endless one such
    /// as `/dev/zero`, is refused, issue 52). Blocks: call it before the runtime runs,
    /// or off its workers.
    pub fn api_key_from_file(mut self, path: &Path) -> Result<Self, ProviderError> {
        let text =
            agentloop::operator_file::read_text(path, "the model API key file").map_err(|e| {
                ProviderError::KeyFile {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                }
            })?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return Err(ProviderError::KeyFile {
                path: path.display().to_string(),
                reason: "it is empty".into(),
            });
        }
        self.key = Some(key);
        Ok(self)
    }

    /// Model calls in flight at once over every session using this provider
    /// (default 8); the others wait their turn.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n;
        self
    }

    /// Retries of a request answered 429 or 5xx, that could not connect, or whose
    /// server did not begin to answer within the first-byte timeout (default 5). A `Retry-After` (seconds or an HTTP date) sets the wait; otherwise it
    /// doubles from the backoff up to the maximum.
    pub fn retries(mut self, max: u32, backoff: Duration, max_backoff: Duration) -> Self {
        self.max_retries = max;
        self.backoff = backoff;
        self.max_backoff = max_backoff;
        self
    }

    /// Restarts of a stream that broke after it began (default 1; 0 fails the call
    /// with [`crate::ModelError::StreamCut`] at once).
    pub fn stream_restarts(mut self, n: u32) -> Self {
        self.stream_restarts = n;
        self
    }

    /// The longest wait for the next chunk of a stream (default 120 s).
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// The most tokens an answer may have (the request's `max_tokens`; default: the
    /// server's).
    pub fn max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// The longest wait for a model server to begin answering (its status line and
    /// headers), per attempt (default 120 s). A server that accepts and never answers
    /// is retried as a connect error is, then fails the call with
    /// [`crate::ModelError::FirstByte`].
    pub fn first_byte_timeout(mut self, timeout: Duration) -> Self {
        self.bounds.first_byte_timeout = timeout;
        self
    }

    /// The longest a model call may take in all, from the moment it holds its
    /// concurrency permit, retries and stream restarts included (default 10 min): then
    /// the stream is dropped, the permit released, and the call fails with
    /// [`crate::ModelError::Deadline`].
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.bounds.call_timeout = timeout;
        self
    }

    /// The most bytes one response (one attempt's stream) may have on the wire
    /// (default 32 MiB); past it the call fails with [`crate::ModelError::TooLarge`].
    pub fn max_response_bytes(mut self, bytes: u64) -> Self {
        self.bounds.max_response_bytes = bytes;
        self
    }

    /// The most bytes of text an answer may have (default 1 MiB); past it the call
    /// fails with [`crate::ModelError::TooLarge`].
    pub fn max_text_bytes(mut self, bytes: usize) -> Self {
        self.bounds.max_text_bytes = bytes;
        self
    }

    /// The most tool calls one answer may ask for (default 128): a tool call at an
    /// index at or past it fails the call with [`crate::ModelError::TooManyToolCalls`].
    pub fn max_tool_calls(mut self, n: usize) -> Self {
        self.bounds.max_tool_calls = n;
        self
    }

    /// The most bytes of one tool call's name and arguments (default 1 MiB); past it
    /// the call fails with [`crate::ModelError::TooLarge`].
    pub fn max_tool_argument_bytes(mut self, bytes: usize) -> Self {
        self.bounds.max_tool_argument_bytes = bytes;
        self
    }

    /// The most bytes of one line, and of one event's data, of the server-sent
    /// stream (default 4 MiB); past it the call fails with
    /// [`crate::ModelError::TooLarge`].
    pub fn max_line_bytes(mut self, bytes: usize) -> Self {
        self.bounds.max_line_bytes = bytes;
        self
    }

    /// The most bytes of an error answer's body that are read (default 4 KiB): the
    /// message of [`crate::ModelError::Status`] holds at most these, and says how
    /// long the body was when it was cut.
    pub fn max_error_body_bytes(mut self, bytes: usize) -> Self {
        self.bounds.max_error_body_bytes = bytes;
        self
    }

    /// The provider.
    pub fn build(self) -> Result<Provider, ProviderError> {
        let url = self.base_url.trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ProviderError::Url { url });
        }
        if self.max_concurrency == 0 {
            return Err(ProviderError::Zero {
                what: "the provider's concurrency limit",
            });
        }
        let b = &self.bounds;
        for (zero, what) in [
            (self.idle_timeout, "the provider's idle_timeout"),
            (b.first_byte_timeout, "the provider's first_byte_timeout"),
            (b.call_timeout, "the provider's call_timeout"),
        ] {
            if zero.is_zero() {
                return Err(ProviderError::ZeroDuration { what });
            }
        }
        for (n, what) in [
            (b.max_response_bytes, "the provider's max_response_bytes"),
            (b.max_text_bytes as u64, "the provider's max_text_bytes"),
            (b.max_tool_calls as u64, "the provider's max_tool_calls"),
            (
                b.max_tool_argument_bytes as u64,
                "the provider's max_tool_argument_bytes",
            ),
            (b.max_line_bytes as u64, "the provider's max_line_bytes"),
            (
                b.max_error_body_bytes as u64,
                "the provider's max_error_body_bytes",
            ),
        ] {
            if n == 0 {
                return Err(ProviderError::Zero { what });
            }
        }
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|e| ProviderError::Client(e.to_string()))?;
        // A blank name is no name.
        let name = match self.name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => default_provider_name(&url).to_string(),
        };
        Ok(Provider {
            inner: Arc::new(Inner {
                name,
                endpoint: format!("{url}/chat/completions"),
                base_url: url,
                model: self.model,
                http,
                // An empty key is no key: no `Authorization: Bearer ` with nothing
                // after it (a proxy answered that with a 500, issue 53).
                key: self
                    .key
                    .map(|k| k.trim().to_string())
                    .filter(|k| !k.is_empty()),
                limit: Arc::new(Semaphore::new(self.max_concurrency)),
                max_concurrency: self.max_concurrency,
                stream_restarts: self.stream_restarts,
                max_retries: self.max_retries,
                backoff: self.backoff,
                max_backoff: self.max_backoff,
                idle_timeout: self.idle_timeout,
                bounds: self.bounds,
                max_tokens: self.max_tokens,
                prompt_tokens: AtomicU64::new(0),
                completion_tokens: AtomicU64::new(0),
                calls: AtomicU64::new(0),
            }),
        })
    }
}

/// The provider name a provider at `base_url` has unless the builder names one, as
/// OpenTelemetry's GenAI conventions spell it (`gen_ai.provider.name`):
/// `azure.ai.openai` for Azure OpenAI (a host under `openai.azure.com`), else `openai`:
/// the chat-completions API this client speaks is OpenAI's, whoever serves it (the
/// OpenAI API itself, Ollama, vLLM, llama.cpp). Never the model's name; name the
/// server with [`ProviderBuilder::name`] (`--model-provider`).
pub fn default_provider_name(base_url: &str) -> &'static str {
    let host = reqwest::Url::parse(base_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
        .unwrap_or_default();
    let host = host.trim_end_matches('.');
    if host == "openai.azure.com" || host.ends_with(".openai.azure.com") {
        "azure.ai.openai"
    } else {
        "openai"
    }
}

/// The longest `Retry-After` honoured (a server asking for more is waited for this).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl Inner {
    /// The wait before retry number `attempt + 1`: the server's `Retry-After` (at most
    /// [`MAX_RETRY_AFTER`]), else the backoff doubled per attempt up to its maximum.
    pub(crate) fn retry_wait(&self, attempt: u32, after: Option<Duration>) -> Duration {
        let doubled = self
            .backoff
            .saturating_mul(2u32.saturating_pow(attempt))
            .min(self.max_backoff);
        after.map_or(doubled, |a| a.min(MAX_RETRY_AFTER))
    }
}

/// A `Retry-After` header: seconds, or an HTTP date.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 52: an endless key file (`/dev/zero`) is refused with what to do, not
    /// read until the process runs out of memory.
    #[test]
    fn an_endless_key_file_is_refused() {
        let e = Provider::builder("http://127.0.0.1:1/v1", "m")
            .api_key_from_file(Path::new("/dev/zero"))
            .err()
            .expect("refused");
        let text = e.to_string();
        assert!(text.contains("/dev/zero"), "{text}");
        assert!(text.contains("larger than"), "{text}");
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        let later = std::time::SystemTime::now() + Duration::from_secs(60);
        h.insert(
            reqwest::header::RETRY_AFTER,
            httpdate::fmt_http_date(later).parse().unwrap(),
        );
        let d = retry_after(&h).unwrap();
        assert!(
            d > Duration::from_secs(55) && d <= Duration::from_secs(60),
            "{d:?}"
        );
        h.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn a_bad_url_or_a_zero_limit_is_refused_with_the_reason() {
        let e = Provider::builder("localhost:11434", "m")
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("not an http"), "{e}");
        let e = Provider::builder("http://x", "m")
            .max_concurrency(0)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
        let e = Provider::builder("http://x", "m")
            .api_key_from_env("AGENTLOOP_TEST_SURELY_UNSET_VAR")
            .err()
            .expect("unset");
        assert!(
            e.to_string().contains("AGENTLOOP_TEST_SURELY_UNSET_VAR"),
            "{e}"
        );
    }

    /// Issue 53: the provider's name is `openai` (the GenAI conventions' name of the
    /// API this client speaks) or the builder's, never the model's.
    #[test]
    fn the_provider_name_is_the_apis_or_the_builders_never_the_models() {
        for (url, name) in [
            ("https://api.openai.com/v1", "openai"),
            ("https://API.OpenAI.com./v1/", "openai"),
            ("http://127.0.0.1:11434/v1", "openai"),
            ("http://localhost:8000/v1", "openai"),
            ("http://[::1]:8000/v1", "openai"),
            (
                "https://me.openai.azure.com/openai/deployments/d",
                "azure.ai.openai",
            ),
            ("https://openai.azure.com.example.org/v1", "openai"),
            ("not a url", "openai"),
        ] {
            assert_eq!(default_provider_name(url), name, "{url}");
        }
        let p = Provider::builder("http://127.0.0.1:11434/v1", "llama3.2")
            .build()
            .unwrap();
        assert_eq!(p.name(), "openai");
        let p = Provider::builder("https://api.openai.com/v1", "gpt-4o-mini")
            .build()
            .unwrap();
        assert_eq!(p.name(), "openai");
        let p = Provider::builder("http://127.0.0.1:11434/v1", "llama3.2")
            .name(" ollama ")
            .build()
            .unwrap();
        assert_eq!(p.name(), "ollama");
        let p = Provider::builder("http://x", "m")
            .name("  ")
            .build()
            .unwrap();
        assert_eq!(p.name(), "openai");
    }

    /// Issue 53: an empty or blank key is no key (no `Authorization` header).
    #[test]
    fn an_empty_key_is_no_key() {
        for key in ["", "  ", "\n"] {
            let p = Provider::builder("http://x", "m")
                .api_key(key)
                .build()
                .unwrap();
            assert!(p.inner.key.is_none(), "{key:?}");
        }
        let p = Provider::builder("http://x", "m")
            .api_key(" sk-1\n")
            .build()
            .unwrap();
        assert_eq!(p.inner.key.as_deref(), Some("sk-1"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let p = Provider::builder("http://x", "m")
            .api_key("sk-very-secret")
            .build()
            .unwrap();
        assert!(!format!("{p:?}").contains("sk-very-secret"));
    }
}
