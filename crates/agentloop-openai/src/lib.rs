//! An agentloop [`Agent`](agentloop::Agent) over OpenAI-compatible chat-completions
//! servers: OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp's server (docs/models.md).
//!
//! - [`Provider`]: one model server (base URL, model, key from the environment or a
//!   file), its concurrency limit shared by every session that uses it, and its retry
//!   policy (429 and 5xx retried with backoff, honouring `Retry-After`).
//! - [`ChatAgent`]: items are chat messages ([`ChatInput`]); the state is the
//!   [`Conversation`], carried between turns (`TurnOutcome::CompletedWith`) and bounded
//!   by a [`ConversationBound`]; streamed tokens become [`ChatEvent::Token`] events as
//!   they arrive; the model's tool calls run registered [`Tools`] as durable steps
//!   keyed by the tool-call id; a safe point follows every model call and every round
//!   of tool calls; a cancel or a preemption drops the stream at once.
//!
//! This crate owns the model client and the chat turn. It must not reach into the
//! runtime's internals: it uses agentloop's public agent API only.

mod agent;
mod conversation;
mod error;
mod events;
mod provider;
mod sim;
mod sse;
mod stream;
mod tools;

pub use agent::{ChatAgent, ChatInput};
pub use conversation::{Conversation, ConversationBound, Message, Role, ToolCall};
pub use error::{ModelError, ProviderError};
pub use events::{ChatEvent, Usage};
pub use provider::{default_provider_name, Provider, ProviderBuilder};
pub use tools::{ToolKey, Tools};
