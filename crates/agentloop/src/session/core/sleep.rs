//! Sleep (DESIGN S39): when an idle session goes to sleep, and what it leaves behind.
//!
//! A supervisor's persistent session with an `idle_after` that stays idle (no turn,
//! nothing held, nothing owed to a writer, not detached, no stop asked for) for that
//! long, with nobody subscribed, writes its record marked asleep; once that write is
//! durable and the session is still idle, the shell closes its subscriptions
//! atomically (a subscriber that slipped in keeps it awake: [`Event::SleepRefused`])
//! and the actor exits with [`ExitReason::Asleep`]. Nothing is moved: the ledger is
//! empty, and the record holds everything the session is. Any accepted push voids the
//! attempt (its epoch), and its write clears the mark.
//!
//! This file decides; it performs nothing, and never moves an item.

use std::time::Duration;

use crate::exit::{CheckpointOutcome, ExitReason, ExitState};
use crate::session::core::durability::JournalPart;
use crate::session::core::{Core, Effect, Effects, ExitPlan, FinalAction, StoreOp, Timed};
use crate::store::{SessionStatus, WriteCondition};
use crate::turn::agent::Agent;

impl<A: Agent> Core<A> {
    /// How long this session waits idle before it sleeps, when it may sleep at all: a
    /// supervisor's persistent session (a session started alone has nobody to wake it),
    /// not handed to the background (S23).
    pub(crate) fn sleeps_after(&self) -> Option<Duration> {
        let may = self.persists() && self.config.supervised && !self.detached;
        self.config.idle_after.filter(|_| may)
    }

    /// Whether the session could go to sleep now: idle, holding nothing, owing no
    /// writer an answer, no stop asked for, nothing pending for an exit.
    fn can_sleep(&self) -> bool {
        self.sleeps_after().is_some()
            && !self.exited
            && self.exit.is_none()
            && self.turn.is_none()
            && !self.stop.committed
            && self.ledger.is_empty()
            && self.seed_state.is_none()
            && self.answer.is_none()
            && self.load_error.is_none()
            && !self.durable.fenced
            && self.durable.settled()
    }

    /// At an idle boundary: arms the sleep timer once per idle period.
    pub(super) fn arm_sleep(&mut self, fx: &mut Effects<A>) {
        let Some(after) = self.sleeps_after() else {
            return;
        };
        if self.sleep_armed == Some(self.idle_epoch) || self.sleep_write.is_some() {
            return;
        }
        self.sleep_armed = Some(self.idle_epoch);
        fx.push(Effect::Timer {
            after,
            event: Timed::SleepDue {
                epoch: self.idle_epoch,
            },
        });
    }

    /// The sleep timer fired: write the record marked asleep if the session stayed idle
    /// for the whole period and nobody is subscribed (`watched`: the shell's count, a
    /// hint; the shell checks again atomically before the actor exits).
    pub(super) fn on_sleep_due(&mut self, epoch: u64, watched: bool, fx: &mut Effects<A>) {
        if epoch != self.idle_epoch || !self.can_sleep() {
            return;
        }
        if watched {
            // Awake while someone listens: look again after another period.
            self.sleep_armed = None;
            return;
        }
        let seq = self.durable.next_seq();
        // An idle session has no cut turn: the record keeps what it carries.
        let carried = self
            .carried_part()
            .and_then(|(tag, bytes)| bytes.map(|b| (tag, b)));
        let mut write = self.record_write(
            SessionStatus::Running,
            carried,
            JournalPart::none(),
            WriteCondition::NotFinal,
            false,
        );
        write.header.asleep = true;
        self.sleep_write = Some((seq, epoch));
        fx.push(Effect::Store {
            seq,
            op: StoreOp::Write(Box::new(write)),
            steps: Vec::new(),
        });
    }

    /// A write finished: when it was the sleep write, durable, and nothing happened
    /// since, the session goes to sleep (the shell closes its subscriptions first).
    pub(super) fn on_sleep_written(&mut self, seq: u64, ok: bool, fx: &mut Effects<A>) {
        let Some((write, epoch)) = self.sleep_write else {
            return;
        };
        if seq < write {
            return;
        }
        self.sleep_write = None;
        if ok && epoch == self.idle_epoch && self.can_sleep() {
            fx.push(Effect::Sleep);
        } else {
            // Try again after another idle period (a push has its own epoch).
            self.sleep_armed = None;
        }
    }

    /// Somebody subscribed while the session was about to sleep: it stays awake.
    pub(super) fn on_sleep_refused(&mut self) {
        self.sleep_armed = None;
    }

    /// The session sleeps: from here it takes nothing. Called by the shell once it
    /// closed the subscriptions ([`Core::sleep_plan`] is what it performs).
    pub(crate) fn begin_sleep(&mut self) {
        self.exited = true;
        tracing::debug!("idle for its idle_after: the session sleeps");
    }

    /// The teardown of a sleep: the exit says `Asleep`, the record written before holds
    /// everything (no final action).
    pub(crate) fn sleep_plan(&self) -> ExitPlan<A::Item> {
        ExitPlan {
            exit: ExitState {
                session_id: self.config.id.clone(),
                reason: ExitReason::Asleep,
                failure: None,
                stop_cause: None,
                unhandled_items: Vec::new(),
                interrupted_items: Vec::new(),
                late_items: self.shared.late_snapshot(),
                has_mid_turn_state: false,
                checkpoint: CheckpointOutcome::Saved,
                counters: self.counters,
                next_turn_index: self.next_index,
            },
            last: FinalAction::Nothing,
        }
    }
}
