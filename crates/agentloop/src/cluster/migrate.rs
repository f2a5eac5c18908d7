//! Planned migration (issue 18, S38): moving a session from this node to another while
//! losing nothing. The move stops the session at its next safe point (bounded by a
//! timeout that escalates to Immediate), so its final record holds everything it had;
//! hands the lease to the new owner by compare-and-swap (owner and next epoch, on the
//! version just read); and asks the new owner to resume it. Pushes that arrive here
//! meanwhile queue on the session's gate in arrival order and go to the new owner once
//! it runs the session: none lost, none duplicated. Event numbers continue (the record
//! carries the last one).
//!
//! This file owns the move's steps and the gate; stopping is the supervisor's, the
//! transport the forwarder's ([`super::forward::Forward`]).

use std::time::Duration;

use crate::runtime_handle::moving::Moving;
use crate::store::{now_ms, RecordWrite, SessionStatus, StoreError, Stored};

/// Opens every gate a `migrate` shutdown held, whichever way its hand-over returns.
pub(crate) struct ReleaseAll<'a>(pub(crate) &'a Moving);

impl Drop for ReleaseAll<'_> {
    fn drop(&mut self) {
        self.0.release_all();
    }
}

/// A move that did not happen, and why.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// This runtime is not a cluster node with a forwarder.
    #[error("session `{0}` cannot move: this runtime is not a cluster node (start it with RuntimeBuilder::node and a ClusterNode)")]
    NotANode(String),
    /// The target is this node, or not a node this one is joined to: nothing was done.
    #[error("session `{session}` cannot move to node `{node}`: it is not a node this one is joined to (or it is this node); join it first (--join) or pick another")]
    Unreachable {
        /// The session.
        session: String,
        /// The target.
        node: String,
    },
    /// This node does not run the session.
    #[error("session `{0}` does not run on this node; move it from the node that runs it")]
    NotHere(String),
    /// The store failed or refused the hand-over.
    #[error("session `{session}`: the lease could not be handed over: {error}")]
    Store {
        /// The session.
        session: String,
        /// The store's error.
        error: StoreError,
    },
    /// The new owner did not resume it. Its lease is the new owner's; that node's
    /// adoption (or a resume there) picks it up.
    #[error("session `{session}` was handed to node `{node}`, which did not resume it: {error}; its record is `Interrupted` under that node, which resumes it when it restarts (or the others adopt it if it dies)")]
    NotResumed {
        /// The session.
        session: String,
        /// The new owner.
        node: String,
        /// Why.
        error: String,
    },
}

/// What a completed move took.
#[derive(Clone, Copy, Debug)]
pub struct Moved {
    /// From the request to the session's exit here (its next safe point).
    pub stopped: Duration,
    /// From the request to the new owner running it.
    pub total: Duration,
}

/// The write that hands a stopped session's lease to node `to`: owner `to`, the next
/// epoch, `Interrupted`, conditioned on the version read (a concurrent change wins).
pub(crate) fn hand_over(header: &crate::store::RecordHeader, to: &str) -> RecordWrite {
    crate::store::transition::hand_over(
        header,
        Some(to.to_string()),
        SessionStatus::Interrupted,
        now_ms(),
    )
}

/// Hands a stopped session's record to node `to` (one compare-and-swap write);
/// `Ok(false)` when there is nothing to move (no record: it ended with nothing left; or
/// a final one).
pub(crate) async fn hand_over_stopped<I: 'static>(
    store: &dyn crate::store::CheckpointStore<I>,
    id: &str,
    to: &str,
) -> Result<bool, StoreError> {
    let record = match store.load_stored(id).await? {
        Some(Stored::Current(r)) => r,
        None => return Ok(false),
        Some(other) => {
            return Err(StoreError::Refused {
                session: id.to_string(),
                status: other.status().to_string(),
                why: "a record of the previous format cannot be handed over; resume it here \
                      once to convert it"
                    .into(),
            })
        }
    };
    if record.header.status.is_terminal() {
        return Ok(false);
    }
    store.write(hand_over(&record.header, to)).await?;
    Ok(true)
}
