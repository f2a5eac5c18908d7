//! Answering a business interrupt (DESIGN S4; issue 13): LangGraph's `interrupt()` and
//! `Command(resume=…)` on agentloop's record.
//!
//! A turn that ends `Interrupted` leaves a persistent session's record `Stopped`, with
//! the interrupt (reason and question) and `awaiting_answer` set. Nothing resumes such
//! a record by itself: a plain spawn is refused (S18: the record is kept) and
//! `Runtime::start` does not list it. A caller answers with a value of the item type:
//! [`claim_with_answer`] encodes it, checks that the record awaits an answer, and in
//! **one** conditional write (at the version it read, so of two answers one wins) stores
//! the answer and claims the session for the new owner (`Running`, owner, lease epoch
//! plus one). Only then is the session spawned on that record: its resume turn gets the
//! answer beside its saved state and interrupted items, before any new item.
//!
//! This module owns that read-check-write and the answer's errors; it spawns nothing
//! and decides nothing about turns (the handle, the supervisor and the runtime spawn).

use crate::store::transition::hand_over;
use std::fmt;

use crate::store::{codec, now_ms, CheckpointStore, LoadedRecord, SessionStatus, StoreError};

/// An answer that was not given. The answer always comes back, and nothing in the
/// record changed unless the variant says so.
pub enum AnswerError<I> {
    /// The session is not persistent (or no store was given): there is no record to
    /// resume from.
    NotPersistent {
        /// The session.
        id: String,
        /// The answer, handed back.
        answer: I,
    },
    /// No record is stored under this id.
    NotFound {
        /// The session.
        id: String,
        /// The answer, handed back.
        answer: I,
    },
    /// The record does not await an answer: it was never interrupted, was answered
    /// already (also by a concurrent caller), or the session runs.
    NotAwaiting {
        /// The session.
        id: String,
        /// What the record (or the runtime) says instead.
        state: String,
        /// The answer, handed back.
        answer: I,
    },
    /// The answer cannot be stored (S15a): it would not read back as written.
    NotStorable {
        /// The session.
        id: String,
        /// Why (the type, the field, serde's reason).
        reason: String,
        /// The answer, handed back.
        answer: I,
    },
    /// The record names an agent kind this runtime does not know.
    UnknownKind {
        /// The session.
        id: String,
        /// The record's kind.
        kind: String,
        /// The answer, handed back.
        answer: I,
    },
    /// The store failed to read or write the record.
    Store {
        /// The session.
        id: String,
        /// The store's error.
        error: StoreError,
        /// The answer, handed back.
        answer: I,
    },
    /// Nothing can take the answer now (the supervisor or runtime is gone or shutting
    /// down). Nothing was written.
    Unavailable {
        /// The session.
        id: String,
        /// Why.
        reason: String,
        /// The answer, handed back.
        answer: I,
    },
    /// The answer and the claim are on record, but the session did not start. Nothing
    /// is lost: spawning the session again (same owner) resumes it with the answer.
    Spawn {
        /// The session.
        id: String,
        /// Why it did not start.
        reason: String,
    },
}

impl<I> AnswerError<I> {
    /// The answer, handed back (`None` once it is on record: [`AnswerError::Spawn`]).
    pub fn into_answer(self) -> Option<I> {
        match self {
            AnswerError::NotPersistent { answer, .. }
            | AnswerError::NotFound { answer, .. }
            | AnswerError::NotAwaiting { answer, .. }
            | AnswerError::NotStorable { answer, .. }
            | AnswerError::UnknownKind { answer, .. }
            | AnswerError::Store { answer, .. }
            | AnswerError::Unavailable { answer, .. } => Some(answer),
            AnswerError::Spawn { .. } => None,
        }
    }
}

impl<I> fmt::Display for AnswerError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnswerError::NotPersistent { id, .. } => write!(
                f,
                "session `{id}` is not persistent: only a session with a checkpoint store \
                 keeps an interrupt to answer; spawn it persistent, with a store"
            ),
            AnswerError::NotFound { id, .. } => write!(
                f,
                "no record is stored for session `{id}`: nothing awaits an answer; list the \
                 stored sessions (`agentloop sessions list`) to find it"
            ),
            AnswerError::NotAwaiting { id, state, .. } => write!(
                f,
                "session `{id}` does not await an answer ({state}); the answer was not given"
            ),
            AnswerError::NotStorable { id, reason, .. } => write!(
                f,
                "the answer to session `{id}` cannot be stored, so it was not given: {reason}"
            ),
            AnswerError::UnknownKind { id, kind, .. } => write!(
                f,
                "session `{id}` runs agent kind `{kind}`, which this runtime does not register; \
                 register it and answer again (the record is unchanged)"
            ),
            AnswerError::Store { id, error, .. } => {
                write!(f, "the answer to session `{id}` was not given: {error}")
            }
            AnswerError::Unavailable { id, reason, .. } => {
                write!(f, "the answer to session `{id}` was not given: {reason}")
            }
            AnswerError::Spawn { id, reason } => write!(
                f,
                "the answer to session `{id}` is on record but the session did not start \
                 ({reason}); spawn it again to resume it with the answer"
            ),
        }
    }
}

impl<I> fmt::Debug for AnswerError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<I> std::error::Error for AnswerError<I> {}

/// Reads `id`'s record, checks that it awaits an answer (and, with `known_kinds`, that
/// its agent kind is one of them), and writes the answer with the claim for `owner` in
/// one write conditioned on the version read. Returns the record as written, for the
/// session to start on without reading it again.
pub(crate) async fn claim_with_answer<I>(
    store: &dyn CheckpointStore<I>,
    id: &str,
    owner: Option<&str>,
    answer: I,
    known_kinds: Option<&[String]>,
) -> Result<LoadedRecord<I>, AnswerError<I>>
where
    I: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    let id = id.to_string();
    let bytes = match codec::encode_item(&answer) {
        Ok(b) => b,
        Err(e) => {
            return Err(AnswerError::NotStorable {
                reason: e.to_string(),
                id,
                answer,
            })
        }
    };
    let stored = match store.load_stored(&id).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(AnswerError::NotFound { id, answer }),
        Err(error) => return Err(AnswerError::Store { id, error, answer }),
    };
    let mut record = match stored.decode::<I>() {
        Ok(r) => r,
        Err(error) => return Err(AnswerError::Store { id, error, answer }),
    };
    let h = &record.header;
    let awaiting = h.status == SessionStatus::Stopped && h.awaiting_answer && h.answer.is_none();
    if !awaiting {
        let state = match (&h.status, h.awaiting_answer, &h.answer) {
            (_, _, Some(_)) => "it was answered already".to_string(),
            (SessionStatus::Stopped, false, _) => {
                "it stopped without an interrupt; spawn it to resume it".to_string()
            }
            (status, ..) => format!("its record is {status}"),
        };
        return Err(AnswerError::NotAwaiting { id, state, answer });
    }
    if let Some(kinds) = known_kinds {
        if !kinds.contains(&h.agent_kind) {
            let kind = h.agent_kind.clone();
            return Err(AnswerError::UnknownKind { id, kind, answer });
        }
    }
    let read_version = h.version;
    let mut write = hand_over(
        h,
        owner.map(str::to_string),
        SessionStatus::Running,
        now_ms(),
    );
    write.header.awaiting_answer = false;
    write.header.answer = Some(serde_bytes::ByteBuf::from(bytes));
    let mut header = write.header.clone();
    if let Err(error) = store.write(write).await {
        return Err(match error {
            StoreError::Changed { .. } => AnswerError::NotAwaiting {
                id,
                state: "another caller answered or claimed it first".into(),
                answer,
            },
            error => AnswerError::Store { id, error, answer },
        });
    }
    header.version = read_version + 1;
    record.header = header;
    Ok(record)
}
