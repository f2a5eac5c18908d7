//! Stops (DESIGN S11, S12, S22–S24): how successive stop requests combine, what a stop
//! does to the turn in flight, detaching to the background, and cancels that come from
//! outside (a record canceled by id, another process's cancel seen by a poll or by a
//! refused write).
//!
//! The combination rules are about stops themselves, independent of turns, and live in
//! `agentloop_core::stop` (the session core folds each request's options in): a stop
//! commits once and only escalates; `until_idle_for` does not commit and only the first
//! one counts; `drain` is the weakest committing stop and any later non-drain stop
//! overrides it; `skip_checkpoint`, `shutdown` and `canceled` are sticky. The first
//! non-empty cause is kept in the session's shared state. Cancels are merged by the
//! turn's control block (S3). These handlers never move an item and never decide the
//! boundary (`Core::advance` does).

use std::collections::VecDeque;
use tokio::time::Instant;

use crate::error::SessionError;
use crate::options::StopOptions;
use crate::session::core::{Core, DetachReply, Effect, Effects, Event, StopReply, Timed};
use crate::store::SessionStatus;
use crate::turn::agent::Agent;
use crate::turn::control::Origin;
pub(crate) use agentloop_core::stop::{StopEffect, StopState};

/// The stop a cancel by id (or any final `Canceled` status seen) applies: Immediate,
/// cause `canceled`, and the record rewritten `Canceled` at exit (S24).
pub(crate) fn canceled_stop() -> StopOptions {
    let mut stop = StopOptions::immediate().cause("canceled");
    stop.canceled = true;
    stop
}

impl<A: Agent> Core<A> {
    pub(super) fn on_stop(
        &mut self,
        options: StopOptions,
        reply: Option<StopReply>,
        now: Instant,
        fx: &mut Effects<A>,
    ) {
        let answer = |fx: &mut Effects<A>, result| {
            if let Some(reply) = reply {
                fx.push(Effect::AnswerStop { reply, result });
            }
        };
        if let Err(e) = options.validate() {
            answer(fx, Err(e));
            return;
        }
        if self.exited {
            // Idempotent: a stop on an exited session is a no-op.
            answer(fx, Ok(()));
            return;
        }
        self.shared.offer_cause(options.cause.as_deref());
        let effect = self.stop.apply(&options.request());
        fx.push(Effect::StopRequested {
            cancel: if options.is_idle_only() {
                None
            } else {
                options.cancel.map(|c| c.mode)
            },
            cause: options.cause.clone(),
        });
        tracing::info!(?options, ?effect, "stop requested");
        if let StopEffect::Commit { cancel, newly } = effect {
            if newly {
                self.shared.fire_stopped();
            }
            if let Some(t) = &self.turn {
                // S6: a committing stop (not drain) aborts a planning turn; its offered
                // items go back in order when the task reports.
                let aborted = !self.stop.drain && !t.is_resume && t.control.abort_planning(cancel);
                if !aborted {
                    if let Some(c) = cancel {
                        let _ = t.control.submit(c, Origin::Stop, now, None);
                    }
                }
            }
        }
        answer(fx, Ok(()));
    }

    /// Writes the live record now and answers once it is durable (S39: a timer for a
    /// session whose record is not written yet). Refused after the exit and without a
    /// store.
    pub(super) fn on_checkpoint(&mut self, reply: DetachReply, fx: &mut Effects<A>) {
        let Some(reply) = self.refuse_unless_stored(reply, SessionError::NotPersistent, fx) else {
            return;
        };
        // Stored already (loaded, or written since): nothing to write, no I/O.
        if self.durable.stored {
            fx.push(Effect::AnswerDetach {
                reply,
                result: Ok(()),
            });
            return;
        }
        let seq = self.write_live(fx);
        self.durable.answer_written_after(seq, reply);
    }

    /// Answers `reply` with the refusal when the session has exited (or is exiting) or
    /// keeps no record (`no_store` names that error); else hands `reply` back.
    fn refuse_unless_stored(
        &self,
        reply: DetachReply,
        no_store: fn(String) -> SessionError,
        fx: &mut Effects<A>,
    ) -> Option<DetachReply> {
        let refusal = if self.exited || self.exit.is_some() {
            SessionError::Exited(self.config.id.clone())
        } else if !self.persists() {
            no_store(self.config.id.clone())
        } else {
            return Some(reply);
        };
        fx.push(Effect::AnswerDetach {
            reply,
            result: Err(refusal),
        });
        None
    }

    /// S23: hands the session to the background: the record becomes `Running` with the
    /// in-flight and queued items in order (answered once that write is durable), the
    /// session drains, and it polls its own record so a cancel written elsewhere is
    /// honoured (S24).
    pub(super) fn on_detach(&mut self, reply: DetachReply, fx: &mut Effects<A>) {
        let Some(reply) = self.refuse_unless_stored(reply, SessionError::DetachNeedsStore, fx)
        else {
            return;
        };
        if self.detached {
            fx.push(Effect::AnswerDetach {
                reply,
                result: Ok(()),
            });
            return;
        }
        self.detached = true;
        self.shared
            .detached
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Issued before the drain commits, so it lists everything accepted so far.
        let seq = self.write_live(fx);
        // Under `exit` a record now exists: it is kept current as items leave the
        // session (delivered, dropped), so a failure that leaves it to the supervisor or
        // the next start (S18, S26) never replays them (S10).
        self.durable.record_stale = true;
        self.durable.answer_detach_after(seq, reply);
        if let StopEffect::Commit { newly: true, .. } =
            self.stop.apply(&StopOptions::drain().request())
        {
            self.shared.fire_stopped();
        }
        fx.push(Effect::Timer {
            after: self.config.poll_interval,
            event: Timed::PollDue,
        });
        tracing::info!("session detached: it drains in the background");
    }

    /// S24: a background session reads its record on every poll interval.
    pub(super) fn on_poll_due(&mut self, fx: &mut Effects<A>) {
        if self.exited || !self.detached {
            return;
        }
        fx.push(Effect::Poll);
    }

    /// The poll's answer: a `Canceled` record (written by anyone, another process
    /// included) stops the session Immediate; otherwise poll again later.
    pub(super) fn on_polled(
        &mut self,
        status: Option<SessionStatus>,
        fx: &mut Effects<A>,
        queue: &mut VecDeque<Event<A>>,
    ) {
        if self.exited {
            return;
        }
        if status == Some(SessionStatus::Canceled) {
            tracing::info!("the record says Canceled: stopping");
            queue.push_back(Event::Stop {
                options: canceled_stop(),
                reply: None,
            });
            return;
        }
        fx.push(Effect::Timer {
            after: self.config.poll_interval,
            event: Timed::PollDue,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn s11_skip_checkpoint_is_sticky() {
        let mut s = StopState::default();
        s.apply(&StopOptions::bare().skip_checkpoint().request());
        s.apply(&StopOptions::immediate().request());
        assert!(s.skip_checkpoint);
    }

    #[test]
    fn s11_only_the_first_idle_request_counts_and_it_does_not_commit() {
        let mut s = StopState::default();
        assert_eq!(
            s.apply(&StopOptions::until_idle_for(Duration::from_secs(3)).request()),
            StopEffect::IdleOnly
        );
        s.apply(&StopOptions::until_idle_for(Duration::from_secs(9)).request());
        assert_eq!(s.idle_for, Some(Duration::from_secs(3)));
        assert!(!s.committed);
        assert!(matches!(
            s.apply(&StopOptions::bare().request()),
            StopEffect::Commit { newly: true, .. }
        ));
    }

    #[test]
    fn s11_drain_is_overridden_by_any_later_non_drain_stop() {
        let mut s = StopState::default();
        s.apply(&StopOptions::drain().request());
        assert!(s.drain && s.committed);
        s.apply(&StopOptions::drain().request());
        assert!(s.drain);
        assert!(matches!(
            s.apply(&StopOptions::bare().request()),
            StopEffect::Commit { newly: false, .. }
        ));
        assert!(!s.drain, "a bare stop after drain escalates");
        s.apply(&StopOptions::drain().request());
        assert!(!s.drain, "a drain after a bare stop never de-escalates");
    }
}
