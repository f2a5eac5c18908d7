//! The vocabulary every layer of the store shares: an encoded payload ([`Payload`]) and
//! the header of a stored record ([`RecordHeader`]). Plain data with no codec and no
//! backend, so the codec, the key layout and the record types all build on it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::interrupt::InterruptInfo;
use crate::status::SessionStatus;

/// An encoded payload (one item, or one agent state), shared without copying.
pub type Payload = Arc<[u8]>;

/// The header of a stored record: every S15 field that is not an item or the state.
///
/// Stored self-describing (MessagePack, fields by name) with `#[serde(default)]`, so a
/// field added later reads as its default from older headers without a format bump,
/// and fields an older build does not know are skipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordHeader {
    /// The session's id (checked against the key it is stored under).
    pub session_id: String,
    /// The agent kind that runs it.
    pub agent_kind: String,
    /// The agent's serialized configuration.
    #[serde(with = "serde_bytes")]
    pub agent_config: Vec<u8>,
    /// The status (S19).
    pub status: SessionStatus,
    /// The index of the next turn to run, or of the cut turn when `cut` is not empty or
    /// a state is stored.
    pub turn_index: u64,
    /// The cut turn's items (the record's `interrupted_items`), by entry number, in the
    /// turn's order.
    pub cut: Vec<u64>,
    /// Unhandled items offered before all others, by entry number, in offer order
    /// (items a plan handed back, a preempted turn's items); the remaining entries
    /// follow in entry-number order.
    pub front: Vec<u64>,
    /// The entry number the next accepted item gets (above every stored one).
    pub next_seq: u64,
    /// The business stop cause.
    pub stop_cause: Option<String>,
    /// The last error, if the session failed.
    pub last_error: Option<String>,
    /// The runtime instance that owns a `Running` record.
    pub owner: Option<String>,
    /// The owner's heartbeat when the record was last written, ms since the Unix epoch.
    pub heartbeat_ms: u64,
    /// Creation time, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Last update time, ms since the Unix epoch.
    pub updated_at_ms: u64,
    /// Incremented by the store on every write (the writer's value is ignored).
    pub version: u64,
    /// The owner's fencing token: a store refuses a write whose epoch is below the
    /// stored one (`StoreError::Fenced`). Each new owner of a session claims the stored
    /// epoch plus one.
    pub lease_epoch: u64,
    /// The last event sequence number the session had given, or promised to a turn's
    /// final events still waiting for their write, when this was written (S20): a new
    /// incarnation numbers its events after it and the previous `Ended` (S26).
    pub last_event_seq: u64,
    /// The business interrupt that stopped the session (S4), with its question.
    pub interrupt: Option<InterruptInfo>,
    /// The session waits for an answer to `interrupt`: it resumes only through an
    /// answer (`resume_with_answer`), never by itself.
    pub awaiting_answer: bool,
    /// The answer given (an encoded item), until the resumed turn has run.
    pub answer: Option<serde_bytes::ByteBuf>,
    /// The session's own settings (issue 28), restored when it is rebuilt from this
    /// record; `None` in records written before they were kept (the runtime's
    /// defaults apply).
    pub settings: Option<crate::settings::SessionSettings>,
    /// The idempotency keys of pushes accepted with one (S34a: the last
    /// [`crate::keys::KEPT_KEYS`] answered ones and every unanswered one, at most
    /// [`crate::keys::UNANSWERED_KEYS`]), written with their items: a retry after a
    /// restart is recognised and delivers nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idempotency_keys: Vec<crate::keys::KeptKey>,
    /// The running or cut turn's durable steps (S1b): which turn the journal entries
    /// belong to and how many of its steps the stored state covers; `None` when no
    /// step of the turn was journaled or covered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<crate::steps::JournalMark>,
    /// The session is asleep (S39): idle, its actor gone, this record all there is of
    /// it; a push, a by-id operation, a subscription or a due timer wakes it. Its
    /// status stays `Running` under its owner (a sleeping session is still that
    /// owner's); the session's next write clears the flag.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asleep: bool,
    /// The state entry is the session's carried state (the state its last completed
    /// turn left, `TurnOutcome::CompletedWith`), not a cut turn's: the next turn gets it
    /// in `Turn::state`, and it makes no turn a resume turn. Written only by sessions
    /// whose agent carries a state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub state_carried: bool,
    /// The version of the agent kind that wrote the record (S40): the session resumes
    /// on this version when the runtime registers it (pinned), else migrated along the
    /// kind's chain of migrations, else it is refused and the record kept. Records
    /// written before versions existed read as version 1 (stored only when not 1).
    #[serde(default = "first_version", skip_serializing_if = "is_first_version")]
    pub agent_version: u32,
}

/// The version of an agent kind registered without one, and of records written before
/// versions existed (S40).
pub const FIRST_VERSION: u32 = 1;

fn first_version() -> u32 {
    FIRST_VERSION
}

fn is_first_version(v: &u32) -> bool {
    *v == FIRST_VERSION
}

impl Default for RecordHeader {
    fn default() -> Self {
        RecordHeader {
            session_id: String::new(),
            agent_kind: String::new(),
            agent_config: Vec::new(),
            status: SessionStatus::Stopped,
            turn_index: 0,
            cut: Vec::new(),
            front: Vec::new(),
            next_seq: 0,
            stop_cause: None,
            last_error: None,
            owner: None,
            heartbeat_ms: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            version: 0,
            lease_epoch: 0,
            last_event_seq: 0,
            interrupt: None,
            awaiting_answer: false,
            answer: None,
            settings: None,
            idempotency_keys: Vec::new(),
            journal: None,
            asleep: false,
            state_carried: false,
            agent_version: FIRST_VERSION,
        }
    }
}
