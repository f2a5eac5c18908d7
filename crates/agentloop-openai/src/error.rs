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
        /// The server's message.
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
    #[error("the model server `{provider}` sent nothing for {idle:?}")]
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
}
