//! The business interrupt (S4): why an agent ended a turn waiting for someone, and what
//! it asks. Vocabulary shared by the agent's API, the events and the stored record; it
//! imports nothing of the runtime, so the record layer can name it without depending on
//! the agent's module.

use serde::{Deserialize, Serialize};

/// Why an agent ended a turn with a business interrupt (S4), e.g. waiting for a human,
/// and what it asks. A persistent session's record keeps it, marked as awaiting an
/// answer; the resumed turn gets the answer in
/// `Turn::answer` (the `agentloop` crate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptInfo {
    /// A short reason, e.g. `"approval required"`.
    pub reason: String,
    /// The question for whoever answers (the tool call to approve, a form): any JSON
    /// value; `null` when the interrupt asks nothing.
    #[serde(default)]
    pub question: serde_json::Value,
}

impl InterruptInfo {
    /// An interrupt with this reason and no question.
    pub fn new(reason: impl Into<String>) -> Self {
        InterruptInfo {
            reason: reason.into(),
            question: serde_json::Value::Null,
        }
    }

    /// An interrupt with this reason that asks `question`.
    pub fn asking(reason: impl Into<String>, question: serde_json::Value) -> Self {
        InterruptInfo {
            reason: reason.into(),
            question,
        }
    }
}
