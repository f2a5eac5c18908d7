//! The conversation a chat session carries between turns (its agent state): messages
//! as the chat-completions API knows them, and the bound that keeps the state (written
//! with the session's record) from growing without end. Plain data: no I/O here.

use serde::{Deserialize, Serialize};

/// Who said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The instructions the agent was configured with.
    System,
    /// A person (or a client) speaking to the agent.
    User,
    /// The model.
    Assistant,
    /// A tool's result, answering one of the model's tool calls.
    Tool,
}

/// One tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, chosen by the model server; the tool's result names it.
    pub id: String,
    /// The registered tool's name.
    pub name: String,
    /// Its arguments, as the JSON text the model wrote.
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said (empty for an assistant message that only calls tools).
    pub content: String,
    /// The tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::plain(Role::System, text)
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::plain(Role::User, text)
    }

    /// An assistant message without tool calls.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::plain(Role::Assistant, text)
    }

    /// A tool's result for call `id`.
    pub fn tool(id: impl Into<String>, result: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: result.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(id.into()),
        }
    }

    fn plain(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: text.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// Characters the bound counts for it: its text, its calls' names and arguments.
    fn size(&self) -> usize {
        self.content.len()
            + self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>()
    }
}

/// How large a conversation may grow (see [`Conversation::truncate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConversationBound {
    /// The most messages kept (the system message included).
    pub max_messages: usize,
    /// The most characters (bytes of UTF-8) kept over every message.
    pub max_chars: usize,
}

impl Default for ConversationBound {
    /// 200 messages, 200 000 characters: a long conversation that still writes a
    /// record of a few hundred KiB at most.
    fn default() -> Self {
        ConversationBound {
            max_messages: 200,
            max_chars: 200_000,
        }
    }
}

/// The conversation: the chat session's state, carried from turn to turn.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// How many messages the bound dropped so far.
    #[serde(default)]
    pub dropped: u64,
    /// What every model call of the conversation used so far.
    #[serde(default)]
    pub usage: crate::events::Usage,
}

impl Conversation {
    /// A conversation that starts with `system` instructions, if any.
    pub fn new(system: Option<&str>) -> Self {
        Conversation {
            messages: system.map(Message::system).into_iter().collect(),
            dropped: 0,
            usage: crate::events::Usage::default(),
        }
    }

    /// Appends a message.
    pub fn push(&mut self, message: Message) {
        self.messages.push(message);
    }

    /// Appends a turn's items' messages, in order.
    pub fn extend_items(&mut self, messages: impl IntoIterator<Item = Message>) {
        self.messages.extend(messages);
    }

    /// The calls of the last assistant message that no tool message answers yet, in
    /// the model's order: what the turn must still run.
    pub fn pending_tool_calls(&self) -> Vec<ToolCall> {
        let Some(at) = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            return Vec::new();
        };
        let answered: Vec<&str> = self.messages[at + 1..]
            .iter()
            .filter_map(|m| m.tool_call_id.as_deref())
            .collect();
        self.messages[at]
            .tool_calls
            .iter()
            .filter(|c| !answered.contains(&c.id.as_str()))
            .cloned()
            .collect()
    }

    /// Whether the model has answered the last user message without asking for tools
    /// (the turn's work is done).
    pub fn answered(&self) -> bool {
        matches!(self.messages.last(), Some(m) if m.role == Role::Assistant && m.tool_calls.is_empty())
    }

    /// Applies `bound`: keeps the system message (the first, if it is one) and drops
    /// the oldest exchanges after it, whole (a user message and everything up to the
    /// next user message: an assistant's tool calls never lose their results), until
    /// both limits hold. The newest exchange is never dropped, even alone over the
    /// bound. Returns how many messages were dropped (also added to `dropped`).
    pub fn truncate(&mut self, bound: ConversationBound) -> usize {
        let start = usize::from(matches!(self.messages.first(), Some(m) if m.role == Role::System));
        let mut removed = 0;
        loop {
            let chars: usize = self.messages.iter().map(Message::size).sum();
            if self.messages.len() <= bound.max_messages && chars <= bound.max_chars {
                break;
            }
            // The end of the oldest exchange after the system message: the next user
            // message after its first one.
            let next_user = self.messages[start..]
                .iter()
                .enumerate()
                .skip(1)
                .find(|(_, m)| m.role == Role::User)
                .map(|(i, _)| start + i);
            let Some(end) = next_user else {
                break; // only the newest exchange is left
            };
            removed += end - start;
            self.messages.drain(start..end);
        }
        self.dropped += removed as u64;
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(c: &mut Conversation, n: usize) {
        c.push(Message::user(format!("question {n}")));
        c.push(Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: format!("c{n}"),
                name: "look".into(),
                arguments: "{}".into(),
            }],
            tool_call_id: None,
        });
        c.push(Message::tool(format!("c{n}"), "found"));
        c.push(Message::assistant(format!("answer {n}")));
    }

    #[test]
    fn truncation_keeps_the_system_message_and_drops_whole_exchanges() {
        let mut c = Conversation::new(Some("be brief"));
        for n in 0..10 {
            exchange(&mut c, n);
        }
        let bound = ConversationBound {
            max_messages: 9,
            max_chars: 1_000_000,
        };
        let removed = c.truncate(bound);
        assert_eq!(removed, 32);
        assert_eq!(c.dropped, 32);
        assert_eq!(c.messages.len(), 9);
        assert_eq!(c.messages[0], Message::system("be brief"));
        assert_eq!(c.messages[1], Message::user("question 8"));
        // No tool message lost its call.
        assert!(c.pending_tool_calls().is_empty());
        assert!(c.answered());
    }

    #[test]
    fn the_newest_exchange_stays_even_over_the_bound() {
        let mut c = Conversation::new(None);
        exchange(&mut c, 0);
        let removed = c.truncate(ConversationBound {
            max_messages: 1,
            max_chars: 1,
        });
        assert_eq!(removed, 0);
        assert_eq!(c.messages.len(), 4);
    }

    #[test]
    fn pending_calls_are_the_last_assistants_unanswered_ones() {
        let mut c = Conversation::new(None);
        c.push(Message::user("hi"));
        c.push(Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![
                ToolCall {
                    id: "a".into(),
                    name: "x".into(),
                    arguments: "{}".into(),
                },
                ToolCall {
                    id: "b".into(),
                    name: "y".into(),
                    arguments: "{}".into(),
                },
            ],
            tool_call_id: None,
        });
        c.push(Message::tool("a", "1"));
        let pending = c.pending_tool_calls();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].id, "b");
        assert!(!c.answered());
    }
}
