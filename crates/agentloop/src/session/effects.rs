//! Performing the core's effects (DESIGN S16a, S20, S24): store operations issued in
//! the order the core asked (the order the store applies them) with their results fed
//! back as events, turn tasks spawned, timers, polls of the record, answers to callers
//! and the `StopRequested` event.
//!
//! It decides nothing (every decision is in `core/`) and never blocks the actor: store
//! operations and timers run in their own tasks and report by message. The exit effect
//! is handed to `teardown`.

use std::sync::Arc;

use tracing::Instrument;

use crate::events::SessionEvent;
use crate::session::core::TurnWork;
use crate::session::core::{Effect, StoreOp};
use crate::session::loop_state::{internal, LoopState, Myself};
use crate::session::messages::InternalMsg;
use crate::session::teardown::teardown;
use crate::session::turn_task::TurnTask;
use crate::store::committer::Answer;
use crate::store::StoreError;
use crate::turn::agent::Agent;
use crate::turn::control::TurnControl;
use crate::turn::TurnCx;

/// What performing an effect at once left to await: the exit (the teardown's store
/// and hook awaits) or a sleep (its teardown). Every other effect is performed without
/// waiting, so a message whose effects are all of that kind is handled without an
/// async performer (B1, B2).
pub(super) enum Awaited<A: Agent> {
    /// The session exits with this plan.
    Exit(Box<crate::session::core::ExitPlan<A::Item>>),
    /// The session tries to sleep (S39).
    Sleep,
}

/// Performs one effect now, or hands it back as [`Awaited`] when it must be awaited
/// (then [`perform_awaited`] performs it).
pub(super) fn perform_now<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    effect: Effect<A>,
) -> Option<Awaited<A>> {
    match effect {
        Effect::Store { seq, op, steps } => {
            // Without a store there is nothing to write, and nothing to await.
            let store = state.store.clone()?;
            // Issued here, now: the store orders writes by call time. The completion
            // comes back from whichever thread completes the write (the store's
            // committer, S15c) as a message in this session's mailbox, and to the
            // teardown through a oneshot: no task waits for it.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let me = myself.clone();
            // A write of the running turn (its plan's answer known: the record shows it
            // as the cut turn) lets its steps' entries go straight into the record once
            // it is durable (S1b).
            let running = match (&op, &state.core.turn) {
                (StoreOp::Write(_), Some(t))
                    if state.core.ledger.split_known()
                        && t.control.phase() == crate::turn::control::Phase::Running =>
                {
                    Some(t.control.clone())
                }
                _ => None,
            };
            let done = move |result: Result<bool, StoreError>| {
                if let (Some(control), true) = (&running, result.is_ok()) {
                    control.cut_on_record();
                }
                // Durable steps and a turn's end first: the turn task goes on at once
                // (S1b, S16b).
                for tx in steps {
                    let _ = tx.send(result.is_ok());
                }
                me.send_message(internal::<A>(InternalMsg::Written {
                    seq,
                    result: result.clone(),
                }));
                let _ = tx.send(result);
            };
            match op {
                StoreOp::Write(w) => {
                    store.write_then(*w, Answer::new(move |r| done(r.map(|()| true))))
                }
                StoreOp::Delete => store.delete_then(&state.core.config.id, Answer::new(done)),
            }
            state.writes.push_back((seq, rx));
        }
        Effect::StartTurn {
            index,
            work,
            control,
        } => start_turn(myself, state, index, work, control),
        Effect::AnswerPush { reply, result } => {
            let _ = reply.send(result);
        }
        Effect::AnswerStop { reply, result } => {
            let _ = reply.send(result);
        }
        Effect::AnswerDetach { reply, result } => {
            let _ = reply.send(result);
        }
        Effect::Timer { after, event } => {
            // ractor's timer: a task that sends after `after`; the session may have
            // exited meanwhile, and then the send fails and the timer has nothing to do.
            // A delayed preempt's is kept, to cancel when its turn ends.
            let preempt = match &event {
                crate::session::core::Timed::PreemptDue { id, .. } => Some(*id),
                _ => None,
            };
            let msg = InternalMsg::Due(event);
            let timer = myself.send_after(after, move || internal::<A>(msg));
            if let Some(id) = preempt {
                state.preempt_timers.insert(id, timer);
            }
        }
        Effect::CancelTimers { ids } => {
            for id in ids {
                if let Some(t) = state.preempt_timers.remove(&id) {
                    t.abort();
                }
            }
        }
        Effect::Poll => {
            // Without a store there is no record to poll.
            let store = state.store.clone()?;
            let id = state.core.config.id.clone();
            let me = myself.clone();
            tokio::spawn(async move {
                let status = match store.load_stored(&id).await {
                    Ok(Some(s)) => Some(s.status().clone()),
                    _ => None,
                };
                me.send_message(internal::<A>(InternalMsg::Polled { status }));
            });
        }
        Effect::TurnDurable { tx, durable } => {
            // The turn task may be gone (killed); then nobody waits.
            let _ = tx.send(durable);
        }
        Effect::StopRequested { cancel, cause } => {
            let skipped = state
                .subscribers
                .try_send(SessionEvent::StopRequested { cancel, cause });
            if skipped > 0 {
                tracing::debug!(
                    skipped,
                    "StopRequested skipped for subscribers with a full buffer"
                );
            }
        }
        Effect::Exit(plan) => return Some(Awaited::Exit(plan)),
        Effect::Sleep => return Some(Awaited::Sleep),
    }
    None
}

/// Performs an effect that [`perform_now`] handed back.
pub(super) async fn perform_awaited<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    awaited: Awaited<A>,
) {
    match awaited {
        Awaited::Exit(plan) => teardown(myself, state, *plan).await,
        Awaited::Sleep => {
            // S39: closed atomically against subscriptions; one that slipped in keeps
            // the session awake (the core tries again after another idle period).
            let plan = state.core.sleep_plan();
            if state.subscribers.sleep_if_unwatched(plan.exit.summary()) {
                state.core.begin_sleep();
                teardown(myself, state, plan).await;
            } else {
                myself.send_message(internal::<A>(InternalMsg::SleepRefused));
            }
        }
    }
}

fn start_turn<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    index: u64,
    work: TurnWork<A>,
    control: Arc<TurnControl<A::Item, A::State>>,
) {
    let is_resume = matches!(work, TurnWork::Resume { .. });
    // S1b: durable steps' entries straight into the record, when every step's entry is
    // written (`sync`, `turn`) and the record is not due to be replaced whole.
    if let Some(store) = state.store.clone() {
        if state.core.writes_turn_ends() && !state.core.durable.rewrite {
            let (id, epoch) = (state.core.config.id.clone(), state.core.durable.lease_epoch);
            control.set_direct(Box::new(move |change, done| {
                store.append_journal_then(&id, epoch, index, change, done)
            }));
        }
    }
    let cx = TurnCx::<A> {
        turn: index,
        session: state.core.shared.clone(),
        control: control.clone(),
        subscribers: state.subscribers.clone(),
        stopped: state.core.shared.stopped_signal(),
        metrics: state.metrics.clone(),
    };
    let task = TurnTask {
        agent: state.agent.clone(),
        control: control.clone(),
        cx,
        subscribers: state.subscribers.clone(),
        myself: myself.clone(),
        work,
        metrics: state.metrics.clone(),
    };
    let span = tracing::info_span!(parent: &state.span, "turn", index, resume = is_resume);
    // The task always reports: a panic that escapes the agent's guarded futures (e.g.
    // in a future's destructor) is recorded as the turn's failure, so the session never
    // waits for a turn that is gone. Boxed: the future is large, and spawning it by
    // value copies it around.
    let guarded = {
        let myself = myself.clone();
        async move {
            use futures::FutureExt;
            if let Err(p) = std::panic::AssertUnwindSafe(task.run())
                .catch_unwind()
                .await
            {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                control.abandon(format!("turn task panicked: {msg}"));
                myself.send_message(internal::<A>(InternalMsg::TurnFinished {
                    turn: index,
                    finals: None,
                }));
            }
        }
    };
    let handle = tokio::spawn(Box::pin(guarded.instrument(span)));
    state.turn_task = Some(handle.abort_handle());
}
