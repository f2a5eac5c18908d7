//! What a store operation can fail with ([`StoreError`], every variant saying what to
//! do) and the wall clock the record layer stamps headers with ([`now_ms`]). Owns no
//! store: the engines, the PostgreSQL store and the runtime's checkpoint actor all
//! answer with these.

use crate::status::SessionStatus;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A store failure. Every variant says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The session id is not usable as a key (S32).
    #[error("invalid session id {id:?}: {reason}")]
    InvalidId {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: crate::ids::SessionIdError,
    },
    /// The session holds as many durable timers as it may (S34a, issue 52): the new
    /// one was not armed.
    #[error("session `{session}` already holds {max} timers, its bound ([limits] session_timers): cancel some (or let them fire) before arming more, or raise the bound")]
    TooManyTimers {
        /// The session.
        session: String,
        /// The bound.
        max: usize,
    },
    /// A stored record may not be resumed (S19), or a write is not applicable to it.
    #[error("session `{session}` cannot be resumed: its record is {status} because {why}")]
    Refused {
        /// The session.
        session: String,
        /// Its status.
        status: String,
        /// Why it is refused, and what to do.
        why: String,
    },
    /// A conditional write found the record already final (S19): it was not written.
    #[error("session `{session}` is already final ({status}); its record was not overwritten")]
    Final {
        /// The session.
        session: String,
        /// The status found.
        status: SessionStatus,
    },
    /// A conditional write needs a stored record and there is none: nothing was
    /// written.
    #[error("session `{session}` has no stored record; the conditional write was not applied")]
    NoRecord {
        /// The session.
        session: String,
    },
    /// A write that must create a record found one stored. Nothing was written.
    #[error("session `{session}` already has a record ({status}); pick another id, or delete that session first")]
    Exists {
        /// The session.
        session: String,
        /// The stored record's status.
        status: SessionStatus,
    },
    /// A write conditioned on the record's version found another version: the record
    /// changed since it was read. Nothing was written.
    #[error("the record of session `{session}` changed since it was read (version {found}, expected {expected}): another caller answered or claimed it first; read it again")]
    Changed {
        /// The session.
        session: String,
        /// The version the writer read.
        expected: u64,
        /// The version stored.
        found: u64,
    },
    /// A write carried an older lease epoch than the stored record: another owner has
    /// claimed the session since (S37). Nothing was written.
    #[error("session `{session}` is owned elsewhere now (lease epoch {current}, this writer holds {held}); this writer must stop writing it")]
    Fenced {
        /// The session.
        session: String,
        /// The writer's epoch.
        held: u64,
        /// The stored epoch.
        current: u64,
    },
    /// The store is closed (its actor stopped).
    #[error("the checkpoint store is closed; start the runtime (or its checkpoint actor) again")]
    Closed,
    /// A stored record or state could not be decoded. The record is left as it is.
    #[error("record of session `{session}` is corrupt: {reason}; it was left untouched: inspect its raw entries with `agentloop sessions show {session} --raw` (with the process using the data directory stopped), then restore it from a backup or delete it")]
    Corrupt {
        /// The session.
        session: String,
        /// What is wrong.
        reason: String,
    },
    /// A value could not be encoded, or would not read back: nothing was written.
    #[error("could not store the record of session `{session}`: {reason}")]
    Encode {
        /// The session.
        session: String,
        /// What is wrong (names the type, the field and serde's reason).
        reason: String,
    },
    /// The backend failed.
    #[error("checkpoint store failed to {operation}{}: {message}; check the data directory and disk, then retry", on_session(.session))]
    Backend {
        /// What was attempted: load, save, delete, flush.
        operation: &'static str,
        /// The session.
        session: String,
        /// The backend's message.
        message: String,
    },
    /// A networked store's database failed or could not be reached (issue 18: the
    /// PostgreSQL store). Nothing of the operation is known to be written unless it
    /// resolves later; a session retries or stops as for any store failure.
    #[error("the session database failed to {operation}{}: {message}; check that the database server runs and is reachable at the configured URL (`--postgres` / `[store] postgres`), then retry", on_session(.session))]
    Database {
        /// What was attempted.
        operation: &'static str,
        /// The session.
        session: String,
        /// The database's message.
        message: String,
    },
}

/// ` session `id`` for an error about one session, nothing for one about the store.
fn on_session(session: &str) -> String {
    if session.is_empty() {
        String::new()
    } else {
        format!(" session `{session}`")
    }
}
