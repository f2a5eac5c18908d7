//! The chat agent on a runtime whose item and event types are the simulated agent's
//! (`agentloop serve` serves kind `chat` beside `sim`): an item's text is a user
//! message, a chat event travels as `SimEvent::Model` (JSON).

use agentloop_sim::{SimEvent, SimItem};

use crate::agent::ChatInput;
use crate::conversation::Message;
use crate::events::ChatEvent;

impl ChatInput for SimItem {
    fn to_message(&self) -> Message {
        Message::user(self.text.clone())
    }
}

impl From<ChatEvent> for SimEvent {
    fn from(e: ChatEvent) -> Self {
        let event = serde_json::to_value(&e).unwrap_or_else(
            |err| serde_json::json!({"kind": "unencodable", "error": err.to_string()}),
        );
        SimEvent::Model { event }
    }
}
