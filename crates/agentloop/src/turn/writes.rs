//! What a turn hands to its session's writes (S1b, S16a): where a step's journal entry
//! is written and how the step learns it is durable ([`StepWrite`], [`StepDurable`]),
//! the writer that puts an entry straight into the record ([`DirectJournal`]), and what
//! a write of the live record takes of the running turn ([`LiveTurn`]).
//!
//! Plain carriers between `control` (which fills them under its lock) and the session's
//! durability code (which writes them); they decide nothing.

use agentloop_core::steps::{JournalEntry, JournalMark, TurnJournal};

use crate::store::{JournalChange, Payload};

/// Where a step learns that the write holding its entry is flushed (`true`), or
/// failed (`false`; a dropped sender: it failed).
pub(crate) type StepDurable = tokio::sync::oneshot::Receiver<bool>;

/// Writes a journal change straight into the stored record (S1b,
/// `CheckpointStore::append_journal_then`), answering when it is durable: what the
/// session installs in a turn whose steps' entries are written (`sync`, `turn`) when
/// its store can.
pub(crate) type DirectJournal =
    Box<dyn Fn(JournalChange, crate::store::committer::Answer<()>) + Send + Sync>;

/// Where a step's journal entry is being written.
pub(crate) enum StepWrite {
    /// With the session's next write.
    Session(StepDurable),
    /// Straight into the record; if the store refuses that (no record yet, another
    /// format), the entry goes with the session's next write instead.
    Direct(
        tokio::sync::oneshot::Receiver<Result<(), crate::store::StoreError>>,
        JournalEntry,
    ),
}

/// What a write of the live record takes of the running turn, under one lock.
pub(crate) struct LiveTurn<S> {
    /// The resumable state's tag and bytes (`None`: not encoded by a safe point).
    pub(crate) state: Option<(u64, Option<Payload>)>,
    /// The state's value when no safe point encoded it (the write encodes it): the
    /// same state as the tag's, so it agrees with the journal's mark.
    pub(crate) value: Option<S>,
    /// The journal's mark, when the record must keep one.
    pub(crate) mark: Option<JournalMark>,
    /// The journal's changes since the last write, or every entry for a whole write.
    pub(crate) changes: Vec<JournalChange>,
    /// Steps whose entry this write holds.
    pub(crate) waiters: Vec<tokio::sync::oneshot::Sender<bool>>,
}

/// Every entry of `journal` as puts (a whole write); an entry that cannot be framed is
/// logged (its step runs again on a resume, as its policy says).
pub(crate) fn journal_puts(session: &str, journal: &TurnJournal) -> Vec<JournalChange> {
    let (puts, unframed) = agentloop_core::turn::journal_puts(session, journal);
    log_unframed(&unframed);
    puts
}

/// Logs the entries a whole write could not frame.
pub(crate) fn log_unframed(unframed: &[(u32, String)]) {
    for (step, why) in unframed {
        tracing::error!(step, error = %why, "a journal entry cannot be stored");
    }
}

/// A receiver whose sender is gone: the step learns no write will hold its entry.
pub(crate) fn no_write() -> StepDurable {
    tokio::sync::oneshot::channel().1
}
