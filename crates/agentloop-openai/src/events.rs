//! What a chat turn tells its subscribers while it runs: streamed tokens, tool calls
//! and their results, token usage, retries. A runtime's event type takes them through
//! `From<ChatEvent>`.

use serde::{Deserialize, Serialize};

/// Tokens a model call used, as the server reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request (the conversation sent).
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
}

impl Usage {
    /// Both together.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// Adds `other` to this.
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// An event of a chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChatEvent {
    /// Text the model streamed, as it arrived.
    Token {
        /// The text of this chunk.
        text: String,
    },
    /// The model asked for a tool; it runs next (or is answered from the journal).
    ToolCalled {
        /// The call's id.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments, as JSON text.
        arguments: String,
    },
    /// A tool's result, as the model will see it.
    ToolResult {
        /// The call's id.
        id: String,
        /// The tool.
        name: String,
        /// Whether the tool succeeded (an error's text is the result otherwise).
        ok: bool,
        /// The result, as the model sees it.
        output: String,
        /// Taken from the journal of durable steps, not run again.
        replayed: bool,
    },
    /// A model call ended: its usage, when the server reported it.
    ModelCallEnded {
        /// What the call used.
        usage: Usage,
        /// Why the model stopped (`stop`, `tool_calls`, `length`, …).
        finish_reason: String,
    },
    /// The turn completed: what its model calls used together, and how many there
    /// were (the last event of a chat turn before its `TurnEnded`).
    TurnUsage {
        /// The turn's model calls' usage, summed.
        usage: Usage,
        /// Model calls the turn made.
        calls: u32,
    },
    /// The stream broke after it began and the call starts again: a client showing
    /// the streamed text drops what it showed of this call.
    StreamRestarted {
        /// The attempt that starts now (from 2).
        attempt: u32,
        /// What broke.
        reason: String,
    },
}
