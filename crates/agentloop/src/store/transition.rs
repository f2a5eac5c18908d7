//! Every status write a record gets outside a session's own writes (S19), in one table:
//! a status change by compare-and-swap ([`StatusChange`]: past the restart budget, a
//! cancel by id, a session killed by a shutdown, a finished record reopened) and a
//! hand-over of the record's lease to a new owner ([`hand_over`]: a claim at load, an
//! answer, a migration). A session's own final write is decided by its exit table
//! (`session/core/exit.rs`); everything else that changes a status is here, so the
//! lifecycle's rules (a final status is never left, a new owner always takes the next
//! lease epoch) are checked in one place.
//!
//! Plain data and one performer; it decides nothing about *when* a change happens (the
//! supervisor, the shutdown, the session's load and the cluster do).

use crate::store::{
    CasOutcome, CheckpointStore, RecordHeader, RecordWrite, SessionStatus, StateChange, StatusKind,
    StoreError, WriteCondition,
};

/// A status change another party makes to a session's record, by compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StatusChange {
    /// A supervisor gave up on the session past its restart budget (S26): `Failed`
    /// with the error, from any status that is not final.
    FailedPastBudget(String),
    /// A cancel by id (S24): `Running` → `Canceled` (a finalize that wins the race
    /// keeps its status).
    CanceledById,
    /// A shutdown killed a `sync` session (S27): its last durable record, `Running` or
    /// `Stopped`, becomes `Interrupted` (resumed at the next start).
    KilledByShutdown,
    /// A new session starts on a `Completed` record that still lists items (written by
    /// an older version): it becomes `Stopped`, so the items stay durable (S18).
    Reopened,
}

impl StatusChange {
    /// The statuses the change may start from.
    pub(crate) fn from(&self) -> Vec<StatusKind> {
        match self {
            StatusChange::FailedPastBudget(_) => vec![
                StatusKind::Running,
                StatusKind::Stopped,
                StatusKind::Interrupted,
            ],
            StatusChange::CanceledById => vec![StatusKind::Running],
            StatusChange::KilledByShutdown => vec![StatusKind::Running, StatusKind::Stopped],
            StatusChange::Reopened => vec![StatusKind::Completed],
        }
    }

    /// The status it writes.
    pub(crate) fn to(&self) -> SessionStatus {
        match self {
            StatusChange::FailedPastBudget(error) => SessionStatus::Failed(error.clone()),
            StatusChange::CanceledById => SessionStatus::Canceled,
            StatusChange::KilledByShutdown => SessionStatus::Interrupted,
            StatusChange::Reopened => SessionStatus::Stopped,
        }
    }

    /// Performs the change on session `id`'s record: one compare-and-swap.
    pub(crate) async fn apply<I: 'static>(
        &self,
        store: &dyn CheckpointStore<I>,
        id: &str,
    ) -> Result<CasOutcome, StoreError> {
        store.cas_status(id, self.from(), self.to()).await
    }
}

/// The write that hands record `header` (as read, at its version) to `owner` with
/// `status`: the next lease epoch, so the former owner's writes are fenced (S37), a
/// fresh heartbeat, and the version read as its condition (a concurrent change wins and
/// this write is refused with [`StoreError::Changed`]). Items and state are kept. Used
/// by a claim at load (`Running`), an answer (`Running`, with the answer set by the
/// caller) and a migration (`Interrupted` under the node that takes the session over).
pub(crate) fn hand_over(
    header: &RecordHeader,
    owner: Option<String>,
    status: SessionStatus,
    now_ms: u64,
) -> RecordWrite {
    let mut h = header.clone();
    h.owner = owner;
    h.status = status;
    h.lease_epoch += 1;
    h.heartbeat_ms = now_ms;
    h.updated_at_ms = now_ms;
    RecordWrite {
        header: h,
        items: Vec::new(),
        state: StateChange::Keep,
        journal: Vec::new(),
        replace: false,
        condition: WriteCondition::AtVersion(header.version),
        history: None,
        timers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<StatusChange> {
        vec![
            StatusChange::FailedPastBudget("boom".into()),
            StatusChange::CanceledById,
            StatusChange::KilledByShutdown,
            StatusChange::Reopened,
        ]
    }

    /// S19: `Canceled` and `Failed` are final: no change starts from them, and only the
    /// reopen of an old `Completed` record (items still listed) leaves `Completed`.
    #[test]
    fn no_change_leaves_a_final_status_but_the_reopen() {
        for change in all() {
            let from = change.from();
            assert!(!from.is_empty(), "{change:?}");
            assert!(!from.contains(&StatusKind::Canceled), "{change:?}");
            assert!(!from.contains(&StatusKind::Failed), "{change:?}");
            if from.contains(&StatusKind::Completed) {
                assert_eq!(change, StatusChange::Reopened);
            }
            assert!(
                !from.contains(&change.to().kind()),
                "{change:?} must change the status"
            );
        }
    }

    /// A cancel by id only takes a running record: a stopped or interrupted session is
    /// resumed or deleted, not canceled behind its back, and a finalize that won keeps
    /// its status.
    #[test]
    fn a_cancel_by_id_takes_only_a_running_record() {
        assert_eq!(StatusChange::CanceledById.from(), vec![StatusKind::Running]);
        assert_eq!(StatusChange::CanceledById.to(), SessionStatus::Canceled);
    }

    #[tokio::test]
    async fn a_change_is_one_compare_and_swap() {
        let store = crate::store::MemoryStore::<u32>::new();
        // A `Stopped` record.
        let rec = crate::store::SessionRecord::<u32>::new("s", "k", 0);
        store.save(rec).await.unwrap();
        // Not from `Stopped`: the record is left as it is.
        let out = StatusChange::CanceledById.apply(&store, "s").await.unwrap();
        assert!(
            matches!(out, CasOutcome::Mismatch(SessionStatus::Stopped)),
            "{out:?}"
        );
        let out = StatusChange::KilledByShutdown
            .apply(&store, "s")
            .await
            .unwrap();
        assert!(matches!(out, CasOutcome::Swapped(_)), "{out:?}");
        assert_eq!(
            store.load("s").await.unwrap().unwrap().status,
            SessionStatus::Interrupted
        );
        let out = StatusChange::FailedPastBudget("spent".into())
            .apply(&store, "s")
            .await
            .unwrap();
        assert!(matches!(out, CasOutcome::Swapped(_)), "{out:?}");
        // Final now: nothing moves it.
        for change in all() {
            let out = change.apply(&store, "s").await.unwrap();
            assert!(
                matches!(out, CasOutcome::Mismatch(SessionStatus::Failed(_))),
                "{out:?}"
            );
        }
    }

    /// A hand-over always takes the next lease epoch and is conditioned on the version
    /// it read.
    #[test]
    fn a_hand_over_takes_the_next_epoch_at_the_version_read() {
        let h = RecordHeader {
            session_id: "s".into(),
            owner: Some("old".into()),
            status: SessionStatus::Running,
            lease_epoch: 4,
            version: 9,
            ..Default::default()
        };
        let w = hand_over(&h, Some("new".into()), SessionStatus::Interrupted, 77);
        assert_eq!(w.header.lease_epoch, 5);
        assert_eq!(w.header.owner.as_deref(), Some("new"));
        assert_eq!(w.header.status, SessionStatus::Interrupted);
        assert_eq!((w.header.heartbeat_ms, w.header.updated_at_ms), (77, 77));
        assert!(matches!(w.condition, WriteCondition::AtVersion(9)));
        assert!(matches!(w.state, StateChange::Keep) && w.items.is_empty() && !w.replace);
    }
}
