//! Pushes (DESIGN S5, S7, S9, S14, S15a, S16a): whether an item is accepted, refused
//! (late, invalid options, not storable: handed back) or accepted and written first,
//! and which turn its preempt targets.
//!
//! An accepted item goes to the ledger (the only code that places it) and, in a
//! persistent session, was encoded once and proven to read back before anything is
//! acknowledged; the ledger keeps those bytes, so nothing is encoded again. A `sync`
//! push is answered by `durability` once the write holding it is flushed; its preempt
//! is applied then, to the turn it targeted when it was accepted. This file never
//! decides the boundary and never writes by itself.

use tokio::time::Instant;

use crate::options::{OptionsError, Preempt, PushOptions, TurnView};
use crate::push::{PendingAck, PreemptAck, PushError, PushReply};
use crate::session::core::{Core, Effect, Effects, Timed};
use crate::store::codec;
use crate::turn::agent::Agent;
use crate::turn::control::{Origin, Phase, Submitted};

impl<A: Agent> Core<A> {
    pub(super) fn on_push(
        &mut self,
        item: A::Item,
        options: PushOptions<A::Item>,
        reply: Option<PushReply<A::Item>>,
        now: Instant,
        fx: &mut Effects<A>,
    ) {
        let mut options = options;
        if let Some(guard) = options.unprocessed.take() {
            // The message is being processed: from here on the core accounts for it.
            guard.disarm();
        }
        if self.exited || self.stop.committed || self.exit.is_some() {
            self.reject_late(item, reply, fx);
            return;
        }
        // S9: a strategy sees exactly the turn this push lands on. It runs on a copy of
        // the turn's items (never under the turn's lock); a panic in it refuses the
        // push instead of killing the session.
        let preempt = match &options.strategy {
            Some(strategy) => {
                let (index, phase, consumed) = self.turn_view();
                let view = TurnView {
                    index,
                    phase,
                    consumed: &consumed,
                };
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| strategy(&view))) {
                    Ok(p) => p,
                    Err(_) => {
                        self.reject_invalid(item, OptionsError::StrategyPanicked, reply, fx);
                        return;
                    }
                }
            }
            None => options.preempt,
        };
        if let Some(p) = &preempt {
            if let Err(error) = p.validate() {
                self.reject_invalid(item, error, reply, fx);
                return;
            }
        }
        // S15a: a persistent session stores the item: it must read back as written.
        let bytes = if self.persists() {
            match codec::encode_item(&item) {
                Ok(b) => Some(b.into()),
                Err(error) => {
                    self.reject_unstorable(item, error, reply, fx);
                    return;
                }
            }
        } else {
            None
        };
        // S34a: a key the session accepted a push with is a retry (nothing delivered
        // again) or a reuse (refused); a new one is kept with the item.
        if let Some((key, fingerprint)) = &options.idempotency {
            use crate::session::keys::Seen;
            let seen = self
                .keys
                .as_ref()
                .map_or(Seen::New, |k| k.judge(key, *fingerprint));
            if seen != Seen::New {
                let result = match seen {
                    Seen::Again => {
                        // Answered now: the key need not outlive the window any more.
                        if let Some(keys) = self.keys.as_mut() {
                            keys.retried(key);
                        }
                        Ok(PreemptAck::Duplicate)
                    }
                    _ => Err(PushError::KeyReused { item }),
                };
                match result {
                    Err(error) => self.refuse(reply, error, fx),
                    // A retry: delivered before, nothing is delivered again.
                    Ok(ack) => {
                        if let Some(reply) = reply {
                            fx.push(Effect::AnswerPush {
                                reply,
                                result: Ok(ack),
                            });
                        }
                    }
                }
                return;
            }
        }
        // S34a: what the session holds is bounded; over it nothing is accepted.
        let bound = self.config.buffer_bound;
        let (items, held_bytes) = self.ledger.held();
        let size = bytes
            .as_ref()
            .map_or(0, |b: &crate::store::Payload| b.len());
        if items >= bound.items || held_bytes.saturating_add(size) > bound.bytes {
            let full = crate::push::BufferFull {
                items,
                bytes: held_bytes,
                max_items: bound.items,
                max_bytes: bound.bytes,
            };
            tracing::debug!(session = %self.config.id, %full, "push refused: the session is full");
            self.refuse(reply, PushError::Full { item, full }, fx);
            return;
        }
        // S39: a timer's fire is written at once, its removal (or move) with its item.
        let fire = match options.timer.take() {
            Some(change) if self.persists() => {
                self.durable.timers.push(change);
                true
            }
            _ => false,
        };
        let written = self.syncs() || fire;
        // The number `write_live` gives the write below.
        let next_write = self.durable.seq + 1;
        if let Some((key, fingerprint)) = options.idempotency.take() {
            // A push answered after its write keeps its key unanswered until that
            // write (the next one) completes: a crash between them loses the answer,
            // and the key must outlive the window of answered ones for the retry.
            let write = written.then_some(next_write);
            let dropped = self
                .keys
                .get_or_insert_default()
                .keep(key, fingerprint, write);
            if dropped > 0 {
                tracing::warn!(session = %self.config.id, dropped,
                    max = crate::session::keys::UNANSWERED_KEYS,
                    "idempotency keys of unanswered pushes dropped (over the bound): a retry of those pushes would deliver them again");
            }
        }
        self.await_input = false;
        self.counters.items_accepted += 1;
        self.idle_epoch += 1;
        let (_, changes) = self.ledger.accept(item, bytes);
        self.durable.absorb(changes);
        let target = self
            .turn
            .as_ref()
            .filter(|t| t.control.phase() != Phase::Ended)
            .map(|t| t.index);
        if written {
            // S16a: answered (and its preempt applied) once the write holding it is
            // flushed.
            let seq = self.write_live(fx);
            debug_assert_eq!(seq, next_write, "the keys name the write that holds them");
            self.durable.answer_push_after(
                seq,
                reply,
                preempt,
                target,
                options.answer_at_acceptance,
            );
        } else {
            self.apply_preempt(
                preempt,
                target,
                reply,
                options.answer_at_acceptance,
                now,
                fx,
            );
        }
    }

    /// A push after the stop committed or the exit (S14): hand the item back, keep a
    /// copy in the late list.
    fn reject_late(
        &mut self,
        item: A::Item,
        reply: Option<PushReply<A::Item>>,
        fx: &mut Effects<A>,
    ) {
        self.counters.items_late += 1;
        self.shared.push_late(item.clone());
        tracing::debug!(session = %self.config.id, "push rejected as late");
        if let Some(reply) = reply {
            fx.push(Effect::AnswerPush {
                reply,
                result: Err(PushError::Late { item }),
            });
        }
    }

    /// A push refused for its options (S12): the item goes back in the error. A push
    /// sent without a reply (a `cast!`) has nobody to hand it to, so the item is kept
    /// in the late list instead of vanishing (S10, S14). Not counted as late.
    fn reject_invalid(
        &mut self,
        item: A::Item,
        error: OptionsError,
        reply: Option<PushReply<A::Item>>,
        fx: &mut Effects<A>,
    ) {
        self.refuse(reply, PushError::InvalidOptions { item, error }, fx);
    }

    /// A push whose item cannot be stored (S15a): handed back with the type, the field
    /// and serde's reason; without a reply, kept in the late list. Nothing was
    /// acknowledged.
    fn reject_unstorable(
        &mut self,
        item: A::Item,
        error: codec::PayloadError,
        reply: Option<PushReply<A::Item>>,
        fx: &mut Effects<A>,
    ) {
        tracing::warn!(session = %self.config.id, %error, "push refused: the item cannot be stored");
        self.refuse(reply, PushError::NotStorable { item, error }, fx);
    }

    /// Refuses a push that was not accepted (S12, S15a, S34a): the error, with the item,
    /// goes to whoever waits for the answer. A push sent without a reply (`no_wait`, a
    /// `cast!`) has nobody to hand the item back to, so it is kept in the late list,
    /// with a WARN: a refused item never vanishes (S10, S14). Not counted as late.
    fn refuse(
        &self,
        reply: Option<PushReply<A::Item>>,
        error: PushError<A::Item>,
        fx: &mut Effects<A>,
    ) {
        match reply {
            Some(reply) => fx.push(Effect::AnswerPush {
                reply,
                result: Err(error),
            }),
            None => {
                tracing::warn!(session = %self.config.id, %error,
                    "a push sent without a reply was refused; its item is kept in the late list");
                if let Some(item) = error.into_item() {
                    self.shared.push_late(item);
                }
            }
        }
    }

    /// Applies a push's preempt to the turn it targeted when the push was accepted, and
    /// answers the push (S7): when the cancel is submitted, or, `early`, at once
    /// (S34a: `Scheduled` while the preempt waits).
    pub(super) fn apply_preempt(
        &mut self,
        preempt: Option<Preempt>,
        target: Option<u64>,
        reply: Option<PushReply<A::Item>>,
        early: bool,
        now: Instant,
        fx: &mut Effects<A>,
    ) {
        let answer = |fx: &mut Effects<A>, reply: Option<PushReply<A::Item>>, ack| {
            if let Some(reply) = reply {
                fx.push(Effect::AnswerPush {
                    reply,
                    result: Ok(ack),
                });
            }
        };
        let Some(p) = preempt else {
            answer(fx, reply, PreemptAck::NotRequested);
            return;
        };
        let Some(turn) = target else {
            answer(fx, reply, PreemptAck::NoTarget);
            return;
        };
        let mut reply = reply.map(|r| PendingAck::new(r, turn));
        let current = self.turn.as_ref().filter(|t| t.index == turn).is_some();
        match (current, p.delay) {
            (true, Some(delay)) => {
                if early {
                    if let Some(r) = reply.take() {
                        r.answer(PreemptAck::Scheduled { turn });
                    }
                }
                // The preempt waits in its turn, the timer carries its number only: a
                // turn that ends first answers it and cancels the timer (issue 52).
                self.last_timer += 1;
                let id = self.last_timer;
                if let Some(t) = self.turn.as_mut() {
                    t.delayed.push(super::DelayedPreempt {
                        id,
                        preempt: Preempt { delay: None, ..p },
                        reply,
                    });
                }
                fx.push(Effect::Timer {
                    after: delay,
                    event: Timed::PreemptDue {
                        turn,
                        id,
                        _item: std::marker::PhantomData,
                    },
                })
            }
            (true, None) => self.submit_preempt(turn, p, reply, early, now),
            // The target ended while the push waited for its write.
            (false, _) => {
                if let Some(r) = reply {
                    r.answer(PreemptAck::TargetEnded { turn });
                }
            }
        }
    }

    /// Submits a preempt to its target turn and answers the push (S7); `early`, a
    /// preempt held for a planning target is answered `Scheduled` at once.
    pub(super) fn submit_preempt(
        &mut self,
        turn: u64,
        p: Preempt,
        reply: Option<PendingAck<A::Item>>,
        early: bool,
        now: Instant,
    ) {
        let Some(t) = self.turn.as_ref().filter(|t| t.index == turn) else {
            if let Some(r) = reply {
                r.answer(PreemptAck::TargetEnded { turn });
            }
            return;
        };
        let (held, reply) = match early {
            true => (None, reply),
            false => (reply, None),
        };
        let (submitted, reply) =
            match t
                .control
                .submit(p.cancel_request(), Origin::Preempt, now, held)
            {
                (s, None) => (s, reply),
                (s, back) => (s, back),
            };
        let ack = match submitted {
            Submitted::Active => {
                tracing::debug!(turn, at = %p.at, "preempt submitted");
                PreemptAck::Submitted { turn }
            }
            // Answered now; the preempt lands when the turn starts running.
            Submitted::Pending if early => PreemptAck::Scheduled { turn },
            // Held by the control block; answered when the turn starts or ends planning.
            Submitted::Pending => return,
            Submitted::TurnEnded => PreemptAck::TargetEnded { turn },
        };
        if let Some(r) = reply {
            r.answer(ack);
        }
    }

    pub(super) fn on_preempt_due(&mut self, turn: u64, id: u64, now: Instant) {
        // S7: a delayed preempt whose target has ended does nothing (the turn's end
        // answered it and canceled its timer; this one fired meanwhile).
        let Some(t) = self
            .turn
            .as_mut()
            .filter(|t| t.index == turn && !self.exited)
        else {
            tracing::debug!(turn, "delayed preempt found its target ended");
            return;
        };
        let Some(at) = t.delayed.iter().position(|d| d.id == id) else {
            return;
        };
        let d = t.delayed.swap_remove(at);
        self.submit_preempt(turn, d.preempt, d.reply, false, now);
    }
}
