//! The turn task: the tokio task that plans and runs one turn of agent code (DESIGN §1
//! "the agent's own code never runs inside an actor handler", S2, S5, S6).
//!
//! It owns the agent's futures for the turn: it waits for the order gate, runs `plan`
//! (dropping it if a stop aborts planning), starts the turn, runs `run_turn` while
//! watching the control block for Immediate cancels and cancel deadlines, catches
//! panics, classifies the end, and reports `TurnFinished` to the actor with the turn's
//! final events for it to deliver (under `sync` and `turn`, the report comes first and
//! the task delivers them once the turn's end is durable). It never touches the
//! actor's state.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::time::Instant;

use crate::events::{SessionEvent, Subscribers, TurnEnd};
use crate::exit::FailureKind;
use crate::session::core::TurnWork;
use crate::session::ledger;
use crate::session::messages::{FinalEvents, Internal, InternalMsg, TurnLoopMsg};
use crate::session::session_ref::SessionRef;
use crate::store::codec;
use crate::turn::agent::{Agent, AgentError, Turn, TurnOutcome, WakeUp};
use crate::turn::control::TurnControl;
use crate::turn::TurnCx;
use agentloop_core::turn::RunEnd;

/// Everything a turn task needs.
pub(crate) struct TurnTask<A: Agent> {
    pub(crate) agent: Arc<A>,
    pub(crate) control: Arc<TurnControl<A::Item, A::State>>,
    pub(crate) cx: TurnCx<A>,
    pub(crate) subscribers: Arc<Subscribers<A::Event>>,
    pub(crate) myself: SessionRef<A::Item, A::Event>,
    pub(crate) work: TurnWork<A>,
    /// Where the turn's end is counted (S35).
    pub(crate) metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
}

fn panic_message(p: Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// A turn that ended with a wake-up time (S39): its timer is armed now, as the turn's
/// last durable step, while the turn still runs (a kill cuts it like any step). Only an
/// outcome that stands is armed: a cancel captured at a safe point, a failed step or a
/// state that could not be stored ends the turn otherwise (`TurnControl::finish`), and
/// then nothing is armed. A timer the store refuses fails the turn with the reason.
async fn arm_wake_up<A: Agent>(
    cx: &TurnCx<A>,
    wake: WakeUp,
) -> Result<TurnOutcome<A::State>, AgentError> {
    if !cx.control.outcome_would_stand() {
        return Ok(TurnOutcome::Completed);
    }
    match cx.arm_wake_up(wake).await {
        Ok(n) => {
            tracing::debug!(session = %cx.session.id, turn = cx.turn, timer = n, "the turn ended with a wake-up time; its timer is armed");
            Ok(TurnOutcome::Completed)
        }
        Err(e) => Err(AgentError::failed(format!(
            "the turn ended with a wake-up time but its timer could not be armed: {e}"
        ))),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What planning produced.
enum Planned<A: Agent> {
    /// A resume turn's items, state and answer.
    Resume {
        items: Vec<A::Item>,
        state: Option<A::State>,
        answer: Option<A::Item>,
    },
    /// A plan's answer by entry.
    Split {
        split: ledger::PlanSplit<A::Item>,
        had_preempted: bool,
    },
}

fn report_finished<I, E>(myself: &SessionRef<I, E>, turn: u64)
where
    I: Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    // The actor may be gone (killed); then nobody needs the report.
    let msg: TurnLoopMsg<I, E> =
        TurnLoopMsg::Internal(Internal(InternalMsg::TurnFinished { turn, finals: None }));
    myself.send_message(msg);
}

/// Reports the turn's end and leaves its final events to the session to deliver (one
/// wake-up at the turn's end, B1). A session that is gone refuses the message, and
/// dropping it delivers the events here.
fn report_finished_with<I, E>(myself: &SessionRef<I, E>, turn: u64, finals: FinalEvents)
where
    I: Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    let msg: TurnLoopMsg<I, E> = TurnLoopMsg::Internal(Internal(InternalMsg::TurnFinished {
        turn,
        finals: Some(finals),
    }));
    myself.send_message(msg);
}

impl<A: Agent> TurnTask<A> {
    /// Runs the turn to its end. See the module docs for the sequence.
    pub(crate) async fn run(self) {
        let TurnTask {
            agent,
            control,
            cx,
            subscribers,
            myself,
            work,
            metrics,
        } = self;
        let count = |end: &TurnEnd| {
            if let Some(m) = &metrics {
                m.turn_ended(end);
            }
        };
        let index = control.index;
        let resumed = matches!(work, TurnWork::Resume { .. });
        let mut work = work;
        let carried = work.take_carried();

        // 1. The order gate and the plan, both abandoned if a stop aborts planning (S6).
        let gate_and_plan = async {
            let gate = subscribers.order_gate().await;
            let planned = match work {
                TurnWork::Resume {
                    items,
                    state,
                    answer,
                    ..
                } => Ok(Planned::<A>::Resume {
                    items,
                    state,
                    answer,
                }),
                TurnWork::Plan { input, bytes, .. } => {
                    let had_preempted = !input.preempted.is_empty();
                    let offered = input.len();
                    match AssertUnwindSafe(async { agent.plan(input).await })
                        .catch_unwind()
                        .await
                    {
                        Err(p) => Err((
                            format!("plan panicked: {}", panic_message(p)),
                            FailureKind::Panic,
                        )),
                        Ok(Err(e)) => {
                            let kind = if e.is_permanent() {
                                FailureKind::AgentPermanent
                            } else {
                                FailureKind::Agent
                            };
                            Err((format!("plan failed: {e}"), kind))
                        }
                        // Which offered entry each returned item is (checked, when the
                        // session persists: an item that cannot be stored fails the plan).
                        Ok(Ok(plan)) => ledger::split_plan(
                            offered,
                            bytes.as_deref(),
                            plan,
                            codec::encode_item::<A::Item>,
                        )
                        .map(|split| Planned::Split {
                            split,
                            had_preempted,
                        })
                        .map_err(|e| (e, FailureKind::Agent)),
                    }
                }
            };
            (gate, planned)
        };
        let planned = {
            let gate_and_plan = gate_and_plan.fuse();
            tokio::pin!(gate_and_plan);
            loop {
                let changed = control.changed();
                tokio::pin!(changed);
                if control.planning_aborted() {
                    break None;
                }
                tokio::select! {
                    biased;
                    // A plan that returned wins over an abort noticed at the same time:
                    // its decision is never discarded (its cancel is pending instead).
                    r = &mut gate_and_plan => break Some(r),
                    _ = &mut changed => continue,
                }
            }
        };
        let (gate, planned) = match planned {
            None => {
                control.end_planning("a stop committed while the turn was planning".into(), None);
                report_finished(&myself, index);
                return;
            }
            Some(r) => r,
        };
        let planned = match planned {
            Err((reason, kind)) => {
                control.end_planning(reason.clone(), Some(kind));
                let outcome = TurnEnd::PlanAborted(reason);
                count(&outcome);
                let fin = subscribers.send_final(
                    vec![SessionEvent::TurnEnded {
                        turn: index,
                        outcome,
                        durable: false,
                    }],
                    gate,
                    None,
                );
                report_finished(&myself, index);
                if let Some(fin) = fin {
                    fin.await;
                }
                return;
            }
            Ok(p) => p,
        };
        let (items, had_preempted, resume_state, answer) = match planned {
            Planned::Resume {
                items,
                state,
                answer,
            } => {
                control.start_running(None, Instant::now());
                (items, false, state, answer)
            }
            Planned::Split {
                split,
                had_preempted,
            } => {
                if split.consumed.is_empty() {
                    // The plan consumed nothing: no turn runs; what it handed back waits
                    // for new input (the session does not re-plan the same items in a
                    // loop).
                    control.end_deferred(split);
                    report_finished(&myself, index);
                    drop(gate);
                    return;
                }
                let items = split.consumed.iter().map(|p| p.item.clone()).collect();
                // S10 + S16a: a split that drops or rewrites entries is reported by the
                // control block, so under `sync` it goes on record before the turn can
                // fail and a restart from the record never offers a dropped item again.
                control.start_running(Some(split), Instant::now());
                (items, had_preempted, None, None)
            }
        };

        // 2. Run the agent, watching for Immediate cancels and deadlines (S2).
        let turn = Turn::<A> {
            index,
            has_preempted_items: had_preempted,
            items,
            resume: resume_state,
            answer,
            state: carried,
        };
        let n_items = turn.items.len();
        let run_subscribers = subscribers.clone();
        let run_end = {
            let run = async move {
                if run_subscribers.wants(|f| f.turn_started) {
                    run_subscribers
                        .send(SessionEvent::TurnStarted {
                            turn: index,
                            items: n_items,
                            resumed,
                        })
                        .await;
                } else {
                    run_subscribers.skip();
                }
                let arm_cx = cx.clone();
                match agent.run_turn(turn, cx).await {
                    Ok(TurnOutcome::WakeAt(wake)) => arm_wake_up(&arm_cx, wake).await,
                    other => other,
                }
            };
            let run = AssertUnwindSafe(run).catch_unwind();
            tokio::pin!(run);
            loop {
                let changed = control.changed();
                tokio::pin!(changed);
                if control.must_kill() {
                    break RunEnd::Killed;
                }
                let deadline = control.deadline();
                tokio::select! {
                    biased;
                    _ = &mut changed => continue,
                    _ = sleep_until_opt(deadline) => {
                        control.escalate_on_timeout(Instant::now());
                        continue;
                    }
                    r = &mut run => break match r {
                        Ok(v) => RunEnd::Returned(v.map(TurnOutcome::into_outcome)),
                        Err(p) => RunEnd::Panicked(panic_message(p)),
                    },
                }
            }
            // Leaving this block drops the agent's future (if it was killed) now.
        };

        // 3. Classify, report, then deliver the final events (never holding up the
        // actor; `Ended` waits for them). Under `sync` and `turn`, `TurnEnded` waits
        // for the write holding the turn's end, still holding the order gate (the
        // next turn's events come after it) and holding `Ended` back.
        let end = control.finish(run_end);
        count(&end);
        let mut finals = Vec::with_capacity(2);
        if matches!(end, TurnEnd::Preempted(_)) {
            finals.push(SessionEvent::Preempted { turn: index });
        }
        let (durable, hold) = match control.take_durable_end() {
            None => (false, None),
            Some(rx) => {
                // The final events (these and `TurnEnded`) owe their numbers from now:
                // a record the session writes meanwhile reserves them (issue 28).
                let hold = subscribers.hold_end(finals.len() as u64 + 1);
                report_finished(&myself, index);
                // A dropped sender (the session died): not durable.
                (rx.await.unwrap_or(false), Some(hold))
            }
        };
        finals.push(SessionEvent::TurnEnded {
            turn: index,
            outcome: end,
            durable,
        });
        match hold {
            Some(mut hold) => {
                let fin = subscribers.send_final(finals, gate, Some(&mut hold));
                // Queued (or registered in flight): `Ended` may follow now.
                drop(hold);
                if let Some(fin) = fin {
                    fin.await;
                }
            }
            // The session delivers them when it takes the report: what fits in the
            // subscribers' buffers at once, the rest from a task of its own (the
            // session never waits).
            None => report_finished_with(
                &myself,
                index,
                FinalEvents::new(move || {
                    if let Some(fin) = subscribers.send_final(finals, gate, None) {
                        match tokio::runtime::Handle::try_current() {
                            Ok(rt) => drop(rt.spawn(fin)),
                            Err(_) => tracing::warn!(
                                turn = index,
                                "a turn's final events for a full subscriber were dropped: no runtime to deliver them from"
                            ),
                        }
                    }
                }),
            ),
        }
    }
}
