//! Forking a session from a kept checkpoint (issue 13, 4; LangGraph's "time travel"):
//! a new session, under a new id, starts from the items and state a turn-end
//! checkpoint of another session holds.
//!
//! [`write_fork`] reads the checkpoint from the store's history, writes it as the new
//! session's record (status `Stopped`, no owner, a fresh lease and event numbering, no
//! interrupt or answer) with `WriteCondition::Absent`, so it never overwrites a record,
//! and returns it for the new session to start on. The source session is untouched.
//! This module spawns nothing (the handle, the supervisor and the runtime do).

use crate::session::SessionSettings;
use crate::store::history::{HistoryAnswer, HistoryQuery};
use crate::store::{
    now_ms, CheckpointStore, ItemChange, LoadedRecord, RecordWrite, SessionStatus, StateChange,
    StoreError, Stored, WriteCondition,
};

/// A fork that did not happen. Nothing was written unless the variant says so.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The new session is not persistent (or no store was given).
    #[error("cannot fork into session `{0}`: a fork is a stored record, so the new session must be persistent, with a store")]
    NotPersistent(String),
    /// The new id is invalid.
    #[error("cannot fork: {0}")]
    InvalidId(#[from] crate::session::SessionIdError),
    /// No checkpoint of that turn is kept for the source session.
    #[error("session `{from}` keeps no checkpoint of turn {turn}; list them with `agentloop sessions history {from}` (a session keeps its last N turn ends when spawned with a history)")]
    UnknownCheckpoint {
        /// The source session.
        from: String,
        /// The turn asked for.
        turn: u64,
    },
    /// A record already exists under the new id.
    #[error("cannot fork into session `{id}`: it already has a record; pick another id, or delete that session first")]
    Exists {
        /// The new id.
        id: String,
    },
    /// The store failed.
    #[error("cannot fork into session `{id}`: {error}")]
    Store {
        /// The new id.
        id: String,
        /// The store's error.
        error: StoreError,
    },
    /// The runtime already runs as many live sessions as its bound allows (S34a,
    /// `[limits] sessions`); nothing was written.
    #[error("cannot fork into session `{id}`: this runtime already runs {max} sessions, its bound ([limits] sessions); nothing was written; retry once some have ended, or raise the bound")]
    TooManySessions {
        /// The new id.
        id: String,
        /// The bound.
        max: usize,
    },
    /// The record was written but the new session did not start; spawning it again
    /// (persistent, same id) resumes it.
    #[error("the fork `{id}` is on record but did not start ({reason}); spawn it again to run it")]
    Spawn {
        /// The new id.
        id: String,
        /// Why.
        reason: String,
    },
}

/// Writes turn `turn`'s checkpoint of session `from` as the record of new session
/// `to`, with the settings `settings` makes of the checkpoint's (`None` when it kept
/// none): a fork inherits them or overrides them (issue 28); returns it, decoded, for
/// the new session to start on.
pub(crate) async fn write_fork<I>(
    store: &dyn CheckpointStore<I>,
    from: &str,
    turn: u64,
    to: &str,
    settings: impl FnOnce(Option<SessionSettings>) -> SessionSettings,
) -> Result<LoadedRecord<I>, ForkError>
where
    I: serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    agentloop_core::ids::validate_session_id(to)?;
    let store_err = |error| ForkError::Store {
        id: to.to_string(),
        error,
    };
    let checkpoint = match store
        .history(from, HistoryQuery::Load(turn))
        .await
        .map_err(store_err)?
    {
        HistoryAnswer::Load(Some(r)) => *r,
        _ => {
            return Err(ForkError::UnknownCheckpoint {
                from: from.to_string(),
                turn,
            })
        }
    };
    let mut header = checkpoint.header.clone();
    let now = now_ms();
    header.session_id = to.to_string();
    header.status = SessionStatus::Stopped;
    header.owner = None;
    header.lease_epoch = 0;
    header.version = 0;
    header.last_event_seq = 0;
    header.interrupt = None;
    header.awaiting_answer = false;
    header.answer = None;
    header.stop_cause = None;
    header.last_error = None;
    header.created_at_ms = now;
    header.updated_at_ms = now;
    header.heartbeat_ms = now;
    header.settings = Some(settings(header.settings));
    // A fork's steps have their own keys (the session is part of a key): it journals
    // anew, so it runs the cut turn's steps after the checkpoint again.
    header.journal = None;
    let write = RecordWrite {
        header: header.clone(),
        items: checkpoint
            .items
            .iter()
            .map(|(seq, b)| ItemChange::Put(*seq, b.clone()))
            .collect(),
        state: checkpoint
            .state
            .clone()
            .map_or(StateChange::Delete, StateChange::Put),
        journal: Vec::new(),
        replace: true,
        condition: WriteCondition::Absent,
        history: None,
        timers: Vec::new(),
    };
    match store.write(write).await {
        Ok(()) => {}
        Err(StoreError::Exists { .. }) => return Err(ForkError::Exists { id: to.to_string() }),
        Err(e) => return Err(store_err(e)),
    }
    header.version = 1;
    let stored = Stored::Current(crate::store::StoredRecord {
        header,
        items: checkpoint.items,
        state: checkpoint.state,
        journal: Vec::new(),
    });
    stored.decode::<I>().map_err(store_err)
}
