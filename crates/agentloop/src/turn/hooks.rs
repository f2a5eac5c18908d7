//! What the session installs in each turn's control block ([`TurnHooks`]): how states
//! are encoded when the session writes them, and how the turn tells the session it
//! progressed. It owns no state and decides nothing; the turn's machine reads the
//! settings derived from it.

use agentloop_core::turn::TurnSettings;

use crate::store::codec::PayloadError;
use crate::store::Payload;

/// Encodes an agent state, checked (see `store::codec::payload::encode_checked`).
pub(crate) type EncodeState<S> = fn(&S) -> Result<Vec<u8>, PayloadError>;

pub(crate) fn encode_with<S>(f: EncodeState<S>, state: &S) -> Result<Payload, String> {
    f(state).map(Payload::from).map_err(|e| e.to_string())
}

/// What the session installs in each turn's control block.
pub(crate) struct TurnHooks<S> {
    /// When the session writes every safe point (`sync`): encodes a state (checked, so
    /// only a state that reads back is ever written).
    pub(crate) encode_state: Option<EncodeState<S>>,
    /// When the session persists (any durability): encodes the state a completed turn
    /// carries (`TurnOutcome::CompletedWith`), so a carried state is always stored as
    /// it was checked, and one that does not read back fails its turn.
    pub(crate) encode_carried: Option<EncodeState<S>>,
    /// Tells the session the turn progressed: a safe point recorded a state (`sync`),
    /// the plan's answer changes stored entries, or a step's journal entry waits for
    /// its write (`sync`, `turn`). Called outside the lock.
    pub(crate) progress: Option<Box<dyn Fn() + Send + Sync>>,
    /// Each journal entry is written before its step goes on (`sync` and `turn`, S1b);
    /// otherwise the journal is only kept in memory until the final write.
    pub(crate) journal_writes: bool,
}

impl<S> TurnHooks<S> {
    /// No hooks (a session that writes nothing while a turn runs).
    pub(crate) fn none() -> Self {
        TurnHooks {
            encode_state: None,
            encode_carried: None,
            progress: None,
            journal_writes: false,
        }
    }

    pub(crate) fn settings(&self) -> TurnSettings {
        TurnSettings {
            safe_points_written: self.encode_state.is_some(),
            journal_writes: self.journal_writes,
        }
    }
}
