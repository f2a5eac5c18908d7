//! When a persistent session writes its record (S16a): plain vocabulary the record's
//! settings, the session core and the runtime share.

/// When a persistent session writes its record (S16a).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Only at exit (S16): cheapest; a crash loses what the process held.
    Exit,
    /// At every turn end and at exit: each completed turn is durable, and
    /// `TurnEnded { durable: true }` is sent only once the write holding it is flushed.
    /// Pushes are acknowledged at once (a crash loses the items accepted since the last
    /// turn end, and a running turn restarts from its items, not a safe point).
    Turn,
    /// Also whenever an item is accepted and whenever a turn ends or reaches a safe
    /// point, group-committed; `push` is acknowledged only after the write that holds
    /// the item is flushed, and `TurnEnded { durable: true }` is sent only after the
    /// write holding the turn's end is. A SIGKILL at any moment loses no acknowledged
    /// item.
    #[default]
    Sync,
}
