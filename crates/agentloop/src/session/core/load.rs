//! What a stored record means for a session starting on it (DESIGN S17, S18, S19): may
//! it be resumed, what to do with a finished one, and how its items and state seed the
//! session. Pure decisions; the shell reads the record and the owner's heartbeat and
//! performs what these say.

use std::time::Duration;

use crate::liveness::{resumable, Resumable};
use crate::session::core::{Answer, Core};
use crate::store::{LoadedRecord, Payload, RecordHeader, SessionStatus, StoreError};
use crate::turn::agent::Agent;
use crate::turn::control::StateSnap;

/// S19 for a session starting on a record: [`crate::liveness::resumable`]'s judgement
/// (the one the runtime's start and the adoption sweep use too), as the error a refused
/// start keeps. `owner_beat` is the owner's instance heartbeat, if any is stored;
/// `orphaned` whether the store proved the owner gone (issue 28).
pub(crate) fn check_resumable(
    header: &RecordHeader,
    me: Option<&str>,
    owner_beat: Option<u64>,
    orphaned: bool,
    now_ms: u64,
    lease_timeout: Duration,
) -> Result<(), StoreError> {
    let refuse = |why: String| StoreError::Refused {
        session: header.session_id.clone(),
        status: header.status.to_string(),
        why,
    };
    match resumable(header, me, owner_beat, orphaned, now_ms, lease_timeout) {
        Resumable::Now => Ok(()),
        Resumable::Recover {
            owner,
            age,
            orphaned: true,
        } => {
            tracing::info!(
                owner,
                age_ms = age.as_millis() as u64,
                "recovering a session whose owner's process is gone"
            );
            Ok(())
        }
        Resumable::Recover { owner, age, .. } => {
            tracing::info!(
                owner,
                age_ms = age.as_millis() as u64,
                "recovering a session whose owner's heartbeat is stale"
            );
            Ok(())
        }
        Resumable::Held { owner, age, .. } => Err(refuse(format!(
            "it is running on instance `{owner}`, last seen {} ms ago (fresh under the {} ms \
             lease); stop it there, or wait for the lease to expire if that process is gone",
            age.as_millis(),
            lease_timeout.as_millis()
        ))),
        Resumable::Never { why } => Err(refuse(why)),
    }
}

/// What to do with a `Completed` record a new session starts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finished {
    /// It holds nothing: delete it, and start afresh (else every `sync` write would be
    /// refused as overwriting a final record, S16a).
    Delete,
    /// It still lists items (written by an older version): make it `Stopped` by
    /// compare-and-swap, so its items stay durable and this run takes them first (S18).
    Reopen,
}

/// The action for a finished record, or `None` when it is not `Completed`.
pub(crate) fn finished<I>(record: &LoadedRecord<I>) -> Option<Finished> {
    if record.header.status != SessionStatus::Completed {
        return None;
    }
    let holds_items = record.item_count() > 0 || record.state.is_some();
    Some(if holds_items {
        Finished::Reopen
    } else {
        Finished::Delete
    })
}

impl<A: Agent> Core<A> {
    /// Seeds the session from a loaded record (S17): its unhandled items at the front
    /// of the buffer, its cut turn (items and decoded state) as the first turn, its turn
    /// index, creation time and entry numbering; its lease epoch plus one is this
    /// owner's. A record read in format 1 is replaced whole by the first write.
    /// `state` is the decoded state of the cut turn, `state_bytes` its format-2 bytes.
    /// `answer` is the decoded answer a caller gave to the record's interrupt, with its
    /// bytes: the resume turn gets it.
    pub(crate) fn seed(
        &mut self,
        mut record: LoadedRecord<A::Item>,
        state: Option<A::State>,
        state_bytes: Option<Payload>,
        answer: Option<(A::Item, Payload)>,
    ) {
        self.answer = answer.map(|(item, bytes)| Box::new(Answer { item, bytes }));
        let header = record.header.clone();
        self.next_index = header.turn_index;
        self.durable.created_at_ms = header.created_at_ms;
        self.durable.lease_epoch = header.lease_epoch + 1;
        if header.last_event_seq > 0 {
            self.shared.event_seq.continue_after(header.last_event_seq);
        }
        if !header.idempotency_keys.is_empty() {
            self.keys = Some(Box::new(crate::session::keys::Keys::from_record(
                &header.idempotency_keys,
            )));
        }
        self.durable.record_stale = true;
        self.durable.stored = true;
        self.durable.rewrite = record.format1;
        // A carried state (`TurnOutcome::CompletedWith`) is no cut turn's: the ledger
        // never sees it (it would make a resume turn of it), the next turn gets it.
        let carried = header.state_carried && record.state.is_some();
        let (state, state_bytes) = if carried {
            record.state = None;
            if let Some(value) = state {
                self.carried = Some(Box::new(StateSnap {
                    value,
                    bytes: state_bytes,
                    tag: crate::turn::control::LOADED_CARRIED_TAG,
                }));
            }
            (None, None)
        } else {
            (state, state_bytes)
        };
        if let Some(index) = self.ledger.seed(&mut record) {
            tracing::info!(
                turn = index,
                items = self.ledger.cut().map_or(0, |c| c.items.len()),
                "resuming a cut turn"
            );
        }
        // The cut turn's journal of durable steps (S1b) is replayed by its resume turn
        // (same index, same items). A journal is only ever written with its turn shown
        // as the record's cut turn; one of another turn, or without a cut turn, is
        // stale: its entries are deleted by the first write.
        if let Some(j) = record.journal.take() {
            let cut = self.ledger.cut().is_some() || state.is_some();
            if cut && j.mark.turn == header.turn_index {
                tracing::info!(
                    turn = j.mark.turn,
                    covered = j.mark.covered,
                    journaled = j.entries.len(),
                    "the cut turn's durable steps will be replayed"
                );
                self.cut_journal = Some(Box::new(j));
            } else if !j.entries.is_empty() {
                tracing::warn!(
                    turn = j.mark.turn,
                    cut_turn = header.turn_index,
                    "a journal of durable steps that belongs to no cut turn is dropped"
                );
                self.durable
                    .drop_journal(j.entries.iter().map(|e| e.occurrence));
            }
        }
        if let Some(value) = state {
            self.seed_state = Some(Box::new(StateSnap {
                value,
                bytes: state_bytes,
                tag: 0,
            }));
        }
        let stored = if carried {
            Some(crate::turn::control::LOADED_CARRIED_TAG)
        } else {
            record.state.as_ref().map(|_| 0).filter(|_| !record.format1)
        };
        self.durable.state_stored(stored);
    }
}
