//! The errors of a provider's configuration and of a model call. Messages say what to
//! do; none contains the API key.

use std::time::Duration;

/// A provider could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The environment variable that should hold the API key is unset or not UTF-8.
    #[error("the API key's environment variable `{var}` is not set: export it, or give the key with a file (--model-key-file)")]
    KeyVar {
        /// The variable.
        var: String,
    },
    /// The key file could not be read, or is empty.
    #[error("the API key file {path} cannot be used: {reason}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The base URL is not an http(s) URL.
    #[error("the model server URL `{url}` is not an http:// or https:// URL")]
    Url {
        /// What was given.
        url: String,
    },
    /// A limit is zero.
    #[error("{what} must be at least 1")]
    Zero {
        /// Which setting.
        what: &'static str,
    },
    /// A timeout is zero.
    #[error("{what} must be longer than zero")]
    ZeroDuration {
        /// Which setting.
        what: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("the HTTP client cannot be built: {0}")]
    Client(String),
}

impl ModelError {
    /// A short name of the kind of failure (a trace's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            ModelError::Status { .. } => "status",
            ModelError::Connect { .. } => "connect",
            ModelError::StreamCut { .. } => "stream_cut",
            ModelError::Idle { .. } => "idle",
            ModelError::Malformed { .. } => "malformed",
            ModelError::FirstByte { .. } => "first_byte_timeout",
            ModelError::Deadline { .. } => "call_timeout",
            ModelError::TooLarge { .. } => "too_large",
            ModelError::TooManyToolCalls { .. } => "too_many_tool_calls",
        }
    }

    /// Whether calling again later may succeed: a rate limit, a server error, a
    /// server that could not be reached, broke its stream, went silent or ran past a
    /// deadline. An answer over a bound, a malformed chunk or a refusal (4xx other
    /// than 429) would come back the same.
    pub fn retryable(&self) -> bool {
        match self {
            ModelError::Status { status, .. } => *status == 429 || *status >= 500,
            ModelError::Connect { .. }
            | ModelError::StreamCut { .. }
            | ModelError::Idle { .. }
            | ModelError::FirstByte { .. }
            | ModelError::Deadline { .. } => true,
            ModelError::Malformed { .. }
            | ModelError::TooLarge { .. }
            | ModelError::TooManyToolCalls { .. } => false,
        }
    }
}

impl ModelError {
    /// Whether the failure is permanent, so the session's agent fails with
    /// [`agentloop::AgentError::Permanent`] and is never restarted (S26): a 4xx
    /// refusal other than 408 (timeout), 409 (conflict), 425 (too early) and 429 (rate
    /// limit), which would come back the same (a bad key, a model that does not
    /// exist, a request the server cannot take), an answer that cannot be decoded
    /// (malformed), or one past the provider's bounds. Everything else (5xx, 408, 409,
    /// 425, 429, connection errors, broken streams, timeouts) is transient.
    pub fn is_permanent(&self) -> bool {
        match self {
            ModelError::Status { status, .. } => {
                (400..500).contains(status) && !matches!(status, 408 | 409 | 425 | 429)
            }
            ModelError::Malformed { .. }
            | ModelError::TooLarge { .. }
            | ModelError::TooManyToolCalls { .. } => true,
            ModelError::Connect { .. }
            | ModelError::StreamCut { .. }
            | ModelError::Idle { .. }
            | ModelError::FirstByte { .. }
            | ModelError::Deadline { .. } => false,
        }
    }

    /// This failure as the agent's error: permanent or transient by
    /// [`ModelError::is_permanent`].
    pub fn into_agent_error(self) -> agentloop::AgentError {
        if self.is_permanent() {
            agentloop::AgentError::permanent(self.to_string())
        } else {
            agentloop::AgentError::failed(self.to_string())
        }
    }
}

/// A model call failed (after the retries its provider allows).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The server kept answering 429 (rate limited) or 5xx.
    #[error(
        "the model server `{provider}` answered HTTP {status} after {retries} retries: {message}"
    )]
    Status {
        /// The provider's name.
        provider: String,
        /// The last status.
        status: u16,
        /// Retries made.
        retries: u32,
        /// The server's message: the body's `error.message` when the body is whole
        /// JSON, else its text; on one line, at most the provider's
        /// `max_error_body_bytes` of it, and said truncated when it was cut.
        message: String,
    },
    /// The server could not be reached.
    #[error("the model server `{provider}` cannot be reached: {reason}")]
    Connect {
        /// The provider's name.
        provider: String,
        /// Why.
        reason: String,
    },
    /// The stream broke (the connection cut, or it ended without a finish reason)
    /// after as many restarts as the provider allows.
    #[error("the model server `{provider}`'s stream broke after {chunks} chunks ({restarts} restarts): {reason}")]
    StreamCut {
        /// The provider's name.
        provider: String,
        /// Chunks read in the last attempt.
        chunks: u64,
        /// Restarts made.
        restarts: u32,
        /// What broke.
        reason: String,
    },
    /// No data for longer than the provider's idle timeout.
    #[error("the model server `{provider}` sent nothing for {idle:?} mid-answer; the provider's `idle_timeout` setting (serve: --model-idle-timeout) raises the bound")]
    Idle {
        /// The provider's name.
        provider: String,
        /// The timeout.
        idle: Duration,
    },
    /// A chunk was not what the chat-completions API sends.
    #[error("the model server `{provider}` sent a malformed chunk: {reason}")]
    Malformed {
        /// The provider's name.
        provider: String,
        /// What was wrong (with the start of the chunk).
        reason: String,
    },
    /// The server did not begin to answer (no status line and headers) within the
    /// provider's first-byte timeout, on the first attempt and every retry.
    #[error("the model server `{provider}` did not begin to answer within {timeout:?} ({retries} retries); the provider's `first_byte_timeout` setting (serve: --model-first-byte-timeout) raises the bound")]
    FirstByte {
        /// The provider's name.
        provider: String,
        /// The timeout of each attempt.
        timeout: Duration,
        /// Retries made.
        retries: u32,
    },
    /// The call (its retries and restarts included) ran past the provider's call
    /// timeout; the stream was dropped and the concurrency permit released.
    #[error("the model call to `{provider}` did not finish within {timeout:?} and was stopped; the provider's `call_timeout` setting (serve: --model-call-timeout) raises the bound")]
    Deadline {
        /// The provider's name.
        provider: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The answer went past one of the provider's size bounds; the stream was
    /// dropped.
    #[error("the model server `{provider}` sent more than {limit} bytes in {what}; the call was stopped. The provider's `{setting}` setting (serve: --model-{flag}) raises the bound")]
    TooLarge {
        /// The provider's name.
        provider: String,
        /// What grew too large (the response, the answer's text, a tool call, one
        /// event of the stream).
        what: &'static str,
        /// The bound, in bytes.
        limit: u64,
        /// The builder setting that raises it.
        setting: &'static str,
        /// The `agentloop serve` flag that raises it, without `--model-`.
        flag: &'static str,
    },
    /// The answer named a tool call at an index past the provider's bound on tool
    /// calls per answer.
    #[error("the model server `{provider}` sent a tool call at index {index}, past the bound of {max} tool calls per answer; the call was stopped. The provider's `max_tool_calls` setting (serve: --model-max-tool-calls) raises the bound")]
    TooManyToolCalls {
        /// The provider's name.
        provider: String,
        /// The index the server sent.
        index: u64,
        /// The bound.
        max: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deadlines, silence, cuts, connect errors, 429 and 5xx are worth calling again;
    /// a bound, a malformed chunk or another 4xx would come back the same. No message
    /// names a Rust type.
    #[test]
    fn retryable_kinds_and_messages_without_type_names() {
        let p = || "m".to_string();
        let t = Duration::from_millis(300);
        let cases = [
            (
                ModelError::FirstByte {
                    provider: p(),
                    timeout: t,
                    retries: 2,
                },
                true,
            ),
            (
                ModelError::Deadline {
                    provider: p(),
                    timeout: t,
                },
                true,
            ),
            (
                ModelError::Status {
                    provider: p(),
                    status: 503,
                    retries: 5,
                    message: "busy".into(),
                },
                true,
            ),
            (
                ModelError::Status {
                    provider: p(),
                    status: 400,
                    retries: 0,
                    message: "bad".into(),
                },
                false,
            ),
            (
                ModelError::TooLarge {
                    provider: p(),
                    what: "the answer's text",
                    limit: 10,
                    setting: "max_text_bytes",
                    flag: "max-text-bytes",
                },
                false,
            ),
            (
                ModelError::TooManyToolCalls {
                    provider: p(),
                    index: 1_000_000_000,
                    max: 128,
                },
                false,
            ),
        ];
        for (e, retryable) in cases {
            assert_eq!(e.retryable(), retryable, "{e}");
            let text = e.to_string();
            for name in ["ModelError", "Provider::", "Duration", "{", "}"] {
                assert!(!text.contains(name), "{text}");
            }
        }
    }

    /// Issue 53: a 4xx refusal (but 408/409/425/429) and an undecodable answer are
    /// permanent failures of the agent (never restarted); 5xx, rate limits, timeouts
    /// and broken connections are transient.
    #[test]
    fn permanent_and_transient_model_errors() {
        let status = |status| ModelError::Status {
            provider: "m".into(),
            status,
            retries: 0,
            message: "no".into(),
        };
        for s in [400, 401, 403, 404, 422] {
            assert!(status(s).is_permanent(), "{s}");
            assert!(status(s).into_agent_error().is_permanent(), "{s}");
        }
        for s in [408, 409, 425, 429, 500, 502, 503] {
            assert!(!status(s).is_permanent(), "{s}");
            assert!(!status(s).into_agent_error().is_permanent(), "{s}");
        }
        let malformed = ModelError::Malformed {
            provider: "m".into(),
            reason: "x".into(),
        };
        assert!(malformed.into_agent_error().is_permanent());
        let connect = ModelError::Connect {
            provider: "m".into(),
            reason: "refused".into(),
        };
        assert!(!connect.into_agent_error().is_permanent());
        let idle = ModelError::Idle {
            provider: "m".into(),
            idle: Duration::from_secs(1),
        };
        assert!(!idle.is_permanent());
    }
}
