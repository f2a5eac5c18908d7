//! What a persistent session writes, when, and who waits for it (DESIGN S15, S16a,
//! S17, S23, S24).
//!
//! Under `turn` the record is written at every turn end (and at exit), with the entry
//! changes since the previous write; pushes are answered at once.
//! Under `sync` and `turn`, a turn's task sends `TurnEnded { durable: true }` only
//! after the write holding its end is flushed (the next turn waits behind it, so
//! events keep their order); the final write holds the end of a turn that ends the
//! session.
//!
//! Under `sync` and `turn` a durable step's journal entry (S1b) is written before the
//! step goes on: the write carries the turn's state and journal mark as they are, so a
//! stored state and the steps it covers always agree; a turn's end deletes its journal
//! unless the turn was cut (the final write then keeps it with the state).
//!
//! Under `sync` every change of placement is written as it happens: a push writes its
//! own entry, a safe point the state, a turn end deletes what the turn consumed; each
//! write also rewrites the header (status `Running`, the turn index, the cut turn's
//! items, the out-of-order front, the next entry number), which the ledger keeps small.
//! A push is answered only after the write holding it is flushed (S16a), a detach after
//! its record is. Under `exit` nothing is written until the exit, except a detach's
//! record and, once items left the session (a completed turn, a plan's drop) after a
//! record was loaded or written by a detach, that stale record's replacement (S17,
//! S10).
//!
//! Invariant: after every event the core handles under `sync`, the writes issued so
//! far, applied in order, make the stored record equal the ledger's placement (a test
//! checks it after every step). Any failed write breaks the assumption that the store
//! holds what was written, so the next write replaces the whole record; and the final
//! write always replaces it, since it may be issued before the results of earlier
//! writes are known (one of them may have been refused).
//!
//! This file builds writes and settles their waiters; it never moves an item and never
//! decides the boundary.

use std::collections::VecDeque;

use tokio::time::Instant;

use crate::error::SessionError;
use crate::options::Preempt;
use crate::push::{PreemptAck, PushError, PushReply};
use crate::session::core::stop::canceled_stop;
use crate::session::core::{
    Core, CoreConfig, DetachReply, DurableTx, Effect, Effects, Event, StoreOp,
};
use crate::session::Durability;
use crate::store::{
    now_ms, ItemChange, JournalChange, Payload, RecordHeader, RecordWrite, SessionStatus,
    StateChange, StoreError, WriteCondition,
};
use crate::turn::agent::Agent;
use agentloop_core::steps::JournalMark;

/// The journal's part of a write (S1b): the header's mark, the entry changes, and the
/// steps whose entry the write holds.
pub(crate) struct JournalPart {
    pub(crate) mark: Option<JournalMark>,
    pub(crate) changes: Vec<JournalChange>,
    pub(crate) waiters: Vec<DurableTx>,
}

impl JournalPart {
    /// No journal: a whole write removes any stored entry.
    pub(crate) fn none() -> Self {
        JournalPart {
            mark: None,
            changes: Vec::new(),
            waiters: Vec::new(),
        }
    }
}

/// A push accepted under `sync`, answered once the write holding its item is flushed.
/// Its preempt is applied then, to the turn it targeted when accepted.
pub(crate) struct UnsyncedPush<I> {
    seq: u64,
    reply: Option<PushReply<I>>,
    preempt: Option<Preempt>,
    target: Option<u64>,
    /// Answer at acceptance ([`crate::options::PushOptions::answer_at_acceptance`]).
    early: bool,
}

/// The session's writes in flight and what they owe.
pub(crate) struct Durable<A: Agent> {
    /// The last store operation issued (they are numbered in issue order).
    pub(crate) seq: u64,
    /// Pushes waiting for their write, in issue order.
    unsynced: VecDeque<UnsyncedPush<A::Item>>,
    /// A detach waiting for its record to be durable.
    detach: Option<(u64, DetachReply)>,
    /// Checkpoints asked for, answered once their write is durable.
    written: Vec<(u64, DetachReply)>,
    /// A record of this session is stored (it was loaded, or a write of it succeeded
    /// and none deleted it since): a checkpoint then has nothing to add.
    pub(crate) stored: bool,
    /// Item entry changes not written yet (`sync`, `turn`).
    pending: Vec<ItemChange>,
    /// Journal entries to delete with the next incremental write: an ended turn's
    /// (`sync`, `turn`, S1b).
    pub(crate) journal_pending: Vec<JournalChange>,
    /// Whether writes are incremental, so entry changes are kept for the next write
    /// (under `exit` every write is whole and keeping them would grow without bound).
    keeps_changes: bool,
    /// Turn tasks waiting to send `TurnEnded`: the write holding the end (`FINAL`: the
    /// final write), and where to say whether it succeeded.
    turn_ends: Vec<(u64, DurableTx)>,
    /// Which state the stored record holds (its tag; `sync`).
    stored_state: Option<u64>,
    /// The next write replaces the whole record (a write failed, or the record was
    /// read in format 1).
    pub(crate) rewrite: bool,
    /// `exit`: a record of this session exists (it was loaded, or a detach wrote it);
    /// it is replaced whenever items leave the session (a completed turn, a plan's
    /// drop) until it is deleted or final (S17, S10).
    pub(crate) record_stale: bool,
    /// `exit`: the plan of the turn being settled dropped items the record still lists.
    pub(crate) dropped_since_write: bool,
    /// The stale record's replacement in flight: its number, and whether it deletes.
    stale_write: Option<(u64, bool)>,
    /// A write was fenced: another owner claimed the session (S37).
    pub(crate) fenced: bool,
    /// Changes to the session's timers (a fired timer's removal, S39) for the next
    /// write.
    pub(crate) timers: Vec<crate::store::TimerChange>,
    /// Timer changes written and not yet answered, with their write's number: a
    /// failed write hands them back to the next (applying one twice changes nothing).
    timers_in_flight: Vec<(u64, crate::store::TimerChange)>,
    pub(crate) created_at_ms: u64,
    /// This owner's fencing token.
    pub(crate) lease_epoch: u64,
}

impl<A: Agent> Durable<A> {
    pub(crate) fn new(config: &CoreConfig) -> Self {
        Durable {
            seq: 0,
            unsynced: VecDeque::new(),
            detach: None,
            written: Vec::new(),
            stored: false,
            pending: Vec::new(),
            journal_pending: Vec::new(),
            keeps_changes: config.persist && config.durability != Durability::Exit,
            turn_ends: Vec::new(),
            stored_state: None,
            rewrite: false,
            record_stale: false,
            dropped_since_write: false,
            stale_write: None,
            fenced: false,
            timers: Vec::new(),
            timers_in_flight: Vec::new(),
            created_at_ms: now_ms(),
            lease_epoch: 1,
        }
    }

    /// Keeps a move's entry changes for the next incremental write.
    pub(crate) fn absorb(&mut self, changes: Vec<ItemChange>) {
        if self.keeps_changes {
            self.pending.extend(changes);
        }
    }

    /// A turn's end is held by write `write`: its task learns the result.
    pub(crate) fn turn_end_after(&mut self, write: u64, tx: Option<DurableTx>) {
        if let Some(tx) = tx {
            self.turn_ends.push((write, tx));
        }
    }

    /// Deletes an ended turn's journal entries with the next incremental write.
    pub(crate) fn drop_journal(&mut self, occurrences: impl IntoIterator<Item = u32>) {
        if self.keeps_changes {
            self.journal_pending
                .extend(occurrences.into_iter().map(JournalChange::Delete));
        }
    }

    /// A turn's end is held by the final write.
    pub(crate) fn turn_end_at_exit(&mut self, tx: Option<DurableTx>) {
        if let Some(tx) = tx {
            self.turn_ends.push((FINAL, tx));
        }
    }

    /// The stored record holds state `tag` (a loaded record's).
    pub(crate) fn state_stored(&mut self, tag: Option<u64>) {
        self.stored_state = tag;
    }

    pub(crate) fn answer_push_after(
        &mut self,
        seq: u64,
        reply: Option<PushReply<A::Item>>,
        preempt: Option<Preempt>,
        target: Option<u64>,
        early: bool,
    ) {
        self.unsynced.push_back(UnsyncedPush {
            seq,
            reply,
            preempt,
            target,
            early,
        });
    }

    /// A checkpoint is answered once write `seq` is durable.
    pub(crate) fn answer_written_after(&mut self, seq: u64, reply: DetachReply) {
        self.written.push((seq, reply));
    }

    pub(crate) fn answer_detach_after(&mut self, seq: u64, reply: DetachReply) {
        self.detach = Some((seq, reply));
    }

    /// The number of the next store operation (issued by the caller now).
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.next()
    }

    /// Nothing is owed: no push, turn end, detach or checkpoint waits for a write,
    /// and no write of a stale record is in flight.
    pub(crate) fn settled(&self) -> bool {
        self.unsynced.is_empty()
            && self.turn_ends.is_empty()
            && self.detach.is_none()
            && self.written.is_empty()
            && self.stale_write.is_none()
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

/// The number a turn end held by the final write waits for.
const FINAL: u64 = u64::MAX;

/// Answers one push that waited for its write, after the loop is over (its preempt
/// has no turn left to apply to).
fn answer_late<I>(u: UnsyncedPush<I>, result: Result<bool, StoreError>) {
    let Some(r) = u.reply else {
        return;
    };
    let _ = r.send(match result {
        Ok(_) => Ok(match (u.preempt, u.target) {
            (None, _) => PreemptAck::NotRequested,
            (Some(_), None) => PreemptAck::NoTarget,
            (Some(_), Some(turn)) => PreemptAck::TargetEnded { turn },
        }),
        Err(e) => Err(PushError::NotDurable {
            error: e.to_string(),
        }),
    });
}

impl<A: Agent> Core<A> {
    /// The header for a write with `status` at the current placement.
    pub(super) fn header(&mut self, status: SessionStatus) -> RecordHeader {
        let turn_index = match (&self.turn, self.ledger.cut()) {
            (Some(t), _) => t.index,
            (None, Some(cut)) => cut.index,
            (None, None) => self.next_index,
        };
        let now = now_ms();
        RecordHeader {
            session_id: self.config.id.clone(),
            agent_kind: self.config.agent_kind.clone(),
            agent_config: self.config.agent_config.clone(),
            status,
            turn_index,
            cut: self.ledger.interrupted(),
            front: self.ledger.header_front(),
            next_seq: self.ledger.next_seq(),
            stop_cause: self.shared.cause(),
            last_error: None,
            owner: self.config.owner.clone(),
            heartbeat_ms: now,
            created_at_ms: self.durable.created_at_ms,
            updated_at_ms: now,
            version: 0,
            lease_epoch: self.durable.lease_epoch,
            last_event_seq: self.shared.event_seq.mark(),
            interrupt: None,
            awaiting_answer: false,
            answer: self.answer.as_ref().map(|a| a.bytes.to_vec().into()),
            settings: Some(self.config.settings),
            idempotency_keys: self
                .keys
                .as_ref()
                .map(|k| k.to_record())
                .unwrap_or_default(),
            journal: None,
            asleep: false,
            state_carried: false,
            agent_version: self.config.agent_version,
        }
    }

    /// The cut turn's state as it should be stored now, with its journal (S1b): (tag,
    /// bytes), or `None` when no state belongs in the record. Bytes are `None` for a
    /// state no safe point encoded (the caller encodes it). `whole`: the write replaces
    /// the record, so the journal part holds every entry.
    #[allow(clippy::type_complexity)]
    fn live_turn(
        &mut self,
        whole: bool,
    ) -> (
        Option<(u64, Option<Payload>)>,
        Option<A::State>,
        JournalPart,
    ) {
        let id = self.config.id.clone();
        let mut value = None;
        let (state, mut part) = match &self.turn {
            // A running turn (or a resume turn) is the live record's cut turn, with
            // its last safe point's state or its input, and its journal.
            Some(t) if self.ledger.split_known() => {
                let live = t.control.take_for_write(whole, &id);
                value = live.value;
                (
                    live.state,
                    JournalPart {
                        mark: live.mark,
                        changes: live.changes,
                        waiters: live.waiters,
                    },
                )
            }
            // A turn still planning: no state of its own yet, but its control block
            // holds the journal it will replay (taken from the record at its start).
            Some(t) => {
                let live = t.control.take_for_write(whole, &id);
                (
                    None,
                    JournalPart {
                        mark: live.mark,
                        changes: live.changes,
                        waiters: live.waiters,
                    },
                )
            }
            None => {
                let state = match (&self.ledger.cut(), &self.seed_state) {
                    (Some(_), Some(seed)) => {
                        if seed.bytes.is_none() {
                            value = Some(seed.value.clone());
                        }
                        Some((seed.tag, seed.bytes.clone()))
                    }
                    _ => None,
                };
                (state, self.cut_journal_part(whole))
            }
        };
        // No cut turn's state: the state the session carries between turns, if any,
        // is what the record keeps (a turn cut before its first safe point resumes
        // with it).
        let state = state.or_else(|| self.carried_part());
        if whole {
            self.durable.journal_pending.clear();
        } else if !self.durable.journal_pending.is_empty() {
            let mut changes = std::mem::take(&mut self.durable.journal_pending);
            changes.append(&mut part.changes);
            part.changes = changes;
        }
        (state, value, part)
    }

    /// The carried state as a write stores it: (tag, bytes). A persistent session's
    /// carried state is always encoded (checked when its turn ended, or read from the
    /// record).
    pub(super) fn carried_part(&self) -> Option<(u64, Option<Payload>)> {
        self.carried
            .as_ref()
            .filter(|c| c.bytes.is_some())
            .map(|c| (c.tag, c.bytes.clone()))
    }

    /// The cut turn's journal (loaded, or kept by a cut turn), for a write while no
    /// turn of it runs.
    fn cut_journal_part(&self, whole: bool) -> JournalPart {
        match self.cut_journal.as_deref() {
            Some(j) => JournalPart {
                mark: Some(j.mark),
                changes: if whole {
                    crate::turn::control::journal_puts(&self.config.id, j)
                } else {
                    Vec::new()
                },
                waiters: Vec::new(),
            },
            None => JournalPart::none(),
        }
    }

    /// A write of everything the session holds with `status`: incremental under
    /// `sync` (unless a replacement is due, or `whole` asks for one), whole otherwise.
    pub(super) fn record_write(
        &mut self,
        status: SessionStatus,
        state: Option<(u64, Payload)>,
        journal: JournalPart,
        condition: WriteCondition,
        whole: bool,
    ) -> RecordWrite {
        let mut header = self.header(status);
        header.journal = journal.mark;
        header.state_carried =
            matches!(state, Some((tag, _)) if crate::turn::control::is_carried(tag));
        let replace = whole || self.durable.rewrite || !self.durable.keeps_changes;
        let items = if replace {
            self.durable.pending.clear();
            self.ledger.all_entries()
        } else {
            std::mem::take(&mut self.durable.pending)
        };
        let state_change = match (state, replace) {
            (Some((tag, bytes)), true) => {
                self.durable.stored_state = Some(tag);
                StateChange::Put(bytes)
            }
            (None, true) => {
                self.durable.stored_state = None;
                StateChange::Delete
            }
            (Some((tag, bytes)), false) if self.durable.stored_state != Some(tag) => {
                self.durable.stored_state = Some(tag);
                StateChange::Put(bytes)
            }
            (None, false) if self.durable.stored_state.is_some() => {
                self.durable.stored_state = None;
                StateChange::Delete
            }
            _ => StateChange::Keep,
        };
        self.durable.rewrite = false;
        // Numbered by the write being built (its caller took the number first).
        let timers = std::mem::take(&mut self.durable.timers);
        let seq = self.durable.seq;
        self.durable
            .timers_in_flight
            .extend(timers.iter().map(|c| (seq, c.clone())));
        RecordWrite {
            header,
            items,
            state: state_change,
            journal: journal.changes,
            replace,
            condition,
            history: None,
            timers,
        }
    }

    /// Writes the live record (`Running`, never over a final one) and returns the
    /// write's number; `Written` reports its completion. A state no safe point encoded
    /// (a detach under `exit`) is encoded here; one that cannot be stored is left out
    /// and logged (the record keeps what it had).
    pub(super) fn write_live(&mut self, fx: &mut Effects<A>) -> u64 {
        let seq = self.durable.next();
        if !self.persists() {
            return seq;
        }
        self.take_plan();
        let whole = self.durable.rewrite || !self.durable.keeps_changes;
        let (state, value, mut journal) = self.live_turn(whole);
        let waiters = std::mem::take(&mut journal.waiters);
        let state = match state {
            None => None,
            Some((tag, Some(bytes))) => Some((tag, bytes)),
            Some((tag, None)) => {
                match value.map(|v| crate::store::codec::encode_state(&self.config.id, &v)) {
                    Some(Ok(b)) => Some((tag, Payload::from(b))),
                    Some(Err(e)) => {
                        tracing::error!(error = %e, "the cut turn's state cannot be stored; the record keeps its previous state");
                        None
                    }
                    None => None,
                }
            }
        };
        let write = self.record_write(
            SessionStatus::Running,
            state,
            journal,
            WriteCondition::NotFinal,
            false,
        );
        fx.push(Effect::Store {
            seq,
            op: StoreOp::Write(Box::new(write)),
            steps: waiters,
        });
        seq
    }

    /// `exit` durability, once items left the session after its record was loaded or
    /// written by a detach (a turn completed, S17, or a plan dropped some, S10): the
    /// record is replaced with what the session still holds, or deleted when nothing
    /// is left, so the same state is never resumed twice and a later failure (which
    /// leaves the record alone, S18) cannot replay delivered or dropped items.
    pub(super) fn replace_stale(&mut self, fx: &mut Effects<A>) {
        self.durable.dropped_since_write = false;
        let seq = self.durable.next();
        // A background session's record stays until it is finalized (S23): a cancel by
        // id (S24) and its finalizer need it.
        // Nor does a session that carries a state between turns: its record is that state.
        let delete = self.ledger.is_empty() && !self.detached && self.carried.is_none();
        let op = if delete {
            StoreOp::Delete
        } else {
            let carried = self
                .carried_part()
                .and_then(|(tag, bytes)| bytes.map(|b| (tag, b)));
            StoreOp::Write(Box::new(self.record_write(
                SessionStatus::Running,
                carried,
                JournalPart::none(),
                WriteCondition::NotFinal,
                false,
            )))
        };
        self.durable.stale_write = Some((seq, delete));
        fx.push(Effect::Store {
            seq,
            op,
            steps: Vec::new(),
        });
    }

    /// A store operation finished: answer what waited for it (S16a, S23), honour a
    /// cancel it revealed (S24).
    pub(super) fn on_written(
        &mut self,
        seq: u64,
        result: Result<bool, StoreError>,
        now: Instant,
        fx: &mut Effects<A>,
        queue: &mut VecDeque<Event<A>>,
    ) {
        match &result {
            Ok(_) => {}
            Err(StoreError::Final { status, .. }) => {
                // Someone finalized the record (cancel by id, another process).
                if *status == SessionStatus::Canceled && !self.stop.canceled && !self.exited {
                    tracing::info!("the record was canceled elsewhere: stopping");
                    queue.push_back(Event::Stop {
                        options: canceled_stop(),
                        reply: None,
                    });
                }
            }
            Err(e @ StoreError::Fenced { .. }) => {
                if !self.durable.fenced && !self.exited {
                    tracing::error!(error = %e,
                        "another owner claimed the session: stopping without touching its record");
                    queue.push_back(Event::Stop {
                        options: crate::options::StopOptions::immediate()
                            .cause("fenced: another owner claimed the session"),
                        reply: None,
                    });
                }
                self.durable.fenced = true;
            }
            Err(e) => tracing::error!(seq, error = %e, "checkpoint write failed"),
        }
        if result.is_err() {
            // What the store holds is no longer known: the next write is whole.
            self.durable.rewrite = true;
        } else {
            self.durable.stored = !self
                .durable
                .stale_write
                .is_some_and(|(s, delete)| s == seq && delete);
        }
        // S34a: the pushes this write held are answered below (whatever its result):
        // their keys count as answered from the next write on.
        if let Some(keys) = self.keys.as_mut() {
            keys.written(seq);
        }
        // Timer changes this write held: done, or handed to the next write.
        let (answered, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.durable.timers_in_flight)
                .into_iter()
                .partition(|(s, _)| *s <= seq);
        self.durable.timers_in_flight = later;
        if result.is_err() {
            let mut again: Vec<_> = answered.into_iter().map(|(_, c)| c).collect();
            again.append(&mut self.durable.timers);
            self.durable.timers = again;
        }
        if let Some((_, delete)) = self.durable.stale_write.filter(|(s, _)| *s == seq) {
            self.durable.stale_write = None;
            match &result {
                // Deleted: nothing is stale any more; replaced: stale again once the
                // next turn completes.
                Ok(_) => self.durable.record_stale = !delete,
                Err(StoreError::Final { .. }) => self.durable.record_stale = false,
                Err(_) => {}
            }
        }
        while self.durable.written.first().is_some_and(|(s, _)| *s <= seq) {
            let (_, reply) = self.durable.written.remove(0);
            fx.push(Effect::AnswerDetach {
                reply,
                result: result.clone().map(|_| ()).map_err(SessionError::from),
            });
        }
        if self.durable.detach.as_ref().is_some_and(|(s, _)| *s <= seq) {
            if let Some((_, reply)) = self.durable.detach.take() {
                fx.push(Effect::AnswerDetach {
                    reply,
                    result: result.clone().map(|_| ()).map_err(SessionError::from),
                });
            }
        }
        // Writes complete in order (the store's ordering contract), so a turn end or
        // a push whose write is `seq` is answered by this result, and earlier ones
        // were by theirs.
        while self
            .durable
            .turn_ends
            .first()
            .is_some_and(|(w, _)| *w <= seq)
        {
            let (_, tx) = self.durable.turn_ends.remove(0);
            fx.push(Effect::TurnDurable {
                tx,
                durable: result.is_ok(),
            });
        }
        while self.durable.unsynced.front().is_some_and(|u| u.seq <= seq) {
            let Some(u) = self.durable.unsynced.pop_front() else {
                break;
            };
            match &result {
                Ok(_) => self.apply_preempt(u.preempt, u.target, u.reply, u.early, now, fx),
                Err(e) => {
                    if let Some(reply) = u.reply {
                        fx.push(Effect::AnswerPush {
                            reply,
                            result: Err(PushError::NotDurable {
                                error: e.to_string(),
                            }),
                        });
                    }
                }
            }
        }
    }

    /// At teardown: answers every push (and a detach) still waiting, each with its own
    /// write's result (`result(seq)`); the loop is over, so no preempt applies. A turn
    /// end the final write holds is durable when `final_durable`.
    pub(crate) fn settle(
        &mut self,
        result: impl Fn(u64) -> Result<bool, StoreError>,
        final_durable: bool,
    ) {
        for (write, tx) in std::mem::take(&mut self.durable.turn_ends) {
            let durable = if write == FINAL {
                final_durable
            } else {
                result(write).is_ok()
            };
            let _ = tx.send(durable);
        }
        if let Some((seq, reply)) = self.durable.detach.take() {
            let _ = reply.send(result(seq).map(|_| ()).map_err(SessionError::from));
        }
        for (seq, reply) in std::mem::take(&mut self.durable.written) {
            let _ = reply.send(result(seq).map(|_| ()).map_err(SessionError::from));
        }
        for u in std::mem::take(&mut self.durable.unsynced) {
            let r = result(u.seq);
            answer_late(u, r);
        }
    }

    /// The actor is dying and cannot learn its writes' results: every waiting push is
    /// answered `NotDurable` (its item is in the exit state).
    pub(crate) fn abandon_writes(&mut self, why: &str) {
        let err = || StoreError::Backend {
            operation: "save",
            session: self.config.id.clone(),
            message: why.to_string(),
        };
        if let Some((_, reply)) = self.durable.detach.take() {
            let _ = reply.send(Err(SessionError::from(err())));
        }
        for (_, reply) in std::mem::take(&mut self.durable.written) {
            let _ = reply.send(Err(SessionError::from(err())));
        }
        for u in std::mem::take(&mut self.durable.unsynced) {
            answer_late(u, Err(err()));
        }
    }
}
