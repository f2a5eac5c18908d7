//! The core without a runtime (issue 12): generated sequences of events — pushes,
//! stops, detaches, cancels by id, write results (some failing), timers — and of what
//! the turn task would do (plans that consume, hand back, drop or reorder items, plans
//! that fail, safe points, turn ends of every kind), applied to a `Core` whose effects a
//! harness performs against a memory store at once. After every step:
//!
//! * the ledger's invariants hold;
//! * S10: every accepted item is in exactly one place: delivered by a completed turn,
//!   dropped by a plan, or held by the session (and at the end, in its exit state);
//!   every refused push got its item back;
//! * under `sync`, the stored record is the ledger's placement (the writes issued so
//!   far, applied in order, say where every item is), except right after a failed
//!   write, until the next write replaces the record.
//!
//! At the end, every push got an answer, and a saved record holds the exit state.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::cancel::SafePoint;
use crate::events::TurnEnd;
use crate::exit::{CheckpointOutcome, ExitState};
use crate::options::{Preempt, PushOptions, StopOptions};
use crate::push::{PreemptAck, PushError};
use crate::session::core::TurnWork;
use crate::session::core::{Core, CoreConfig, Effect, Event, FinalAction, StoreOp, Timed};
use crate::session::ledger::split_plan;
use crate::session::Durability;
use crate::shared::SessionShared;
use crate::store::{codec, CheckpointStore, MemoryStore, SessionStatus, StatusKind, StoreError};
use crate::turn::agent::{Agent, AgentError, InterruptInfo, Plan, Turn, TurnOutcome};
use crate::turn::control::{Phase, TurnControl};
use crate::turn::TurnCx;
use agentloop_core::turn::RunEnd;

/// An agent that is never run: the harness plays its turn task.
struct Scripted;

impl Agent for Scripted {
    type Item = u64;
    type Event = ();
    type State = u64;

    async fn run_turn(
        &self,
        _turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<u64>, AgentError> {
        Err(AgentError::failed("the core tests never run a turn"))
    }
}

const ID: &str = "core";

/// What the generated schedule does next.
#[derive(Clone, Debug)]
enum Action {
    Push {
        preempt: bool,
    },
    Stop(u8),
    Detach,
    CancelById,
    /// The plan returns: consume `k` of the offer, hand back `r`, drop the rest;
    /// `reverse`: in reverse order.
    Plan {
        k: usize,
        r: usize,
        reverse: bool,
    },
    PlanFails,
    /// A stop aborted planning: the task ends planning.
    PlanAborted,
    ResumeStarts,
    SafePoint(u64),
    /// The running turn begins a durable step (S1b): one of three names, `NoRetry`
    /// when asked.
    StepBegins {
        name: u8,
        no_retry: bool,
    },
    /// The oldest running step returns its result.
    StepReturns,
    Finish(u8),
    Written,
    FailNextWrite,
    Timer,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => any::<bool>().prop_map(|preempt| Action::Push { preempt }),
        1 => (0u8..6).prop_map(Action::Stop),
        1 => Just(Action::Detach),
        1 => Just(Action::CancelById),
        3 => (0usize..4, 0usize..3, any::<bool>())
            .prop_map(|(k, r, reverse)| Action::Plan { k, r, reverse }),
        1 => Just(Action::PlanFails),
        1 => Just(Action::PlanAborted),
        2 => Just(Action::ResumeStarts),
        2 => (0u64..1000).prop_map(Action::SafePoint),
        3 => (0u8..3, any::<bool>()).prop_map(|(name, no_retry)| Action::StepBegins { name, no_retry }),
        3 => Just(Action::StepReturns),
        3 => (0u8..4).prop_map(Action::Finish),
        3 => Just(Action::Written),
        1 => Just(Action::FailNextWrite),
        1 => Just(Action::Timer),
    ]
}

type Reply = oneshot::Receiver<Result<PreemptAck, PushError<u64>>>;

struct SimTurn {
    control: Arc<TurnControl<u64, u64>>,
    work: Option<TurnWork<Scripted>>,
    /// The items the plan gave the turn (delivered if it completes).
    consumed: Vec<u64>,
    /// The items its plan dropped: they leave the ledger when the core takes the plan.
    dropped: Vec<u64>,
    /// Durable steps begun and not returned: occurrence and name.
    running: Vec<(u32, String)>,
}

struct Harness {
    core: Core<Scripted>,
    store: Arc<MemoryStore<u64>>,
    sync: bool,
    persistent: bool,
    turn: Option<SimTurn>,
    timers: VecDeque<Timed<u64>>,
    /// Store results not yet reported to the core.
    written: VecDeque<(u64, Result<bool, StoreError>)>,
    /// Every store result, by operation number (for the teardown's settle).
    results: Vec<(u64, Result<bool, StoreError>)>,
    progress: Arc<Mutex<Vec<u64>>>,
    fail_next: bool,
    /// A write failed and no write replaced the record since.
    dirty: bool,
    /// The record was changed behind the session's back (a cancel by id).
    out_of_band: bool,
    next_item: u64,
    accepted: Vec<u64>,
    refused: Vec<u64>,
    delivered: Vec<u64>,
    dropped: Vec<u64>,
    replies: Vec<(u64, Reply)>,
    exit: Option<(ExitState<u64>, CheckpointOutcome)>,
    now: Instant,
    /// What each `TurnDurable` said, in order.
    durable_ends: Vec<bool>,
}

fn enc(v: &u64) -> Result<Vec<u8>, codec::PayloadError> {
    codec::payload::encode_checked(v)
}

impl Harness {
    fn new(persistent: bool, durability: Durability) -> Self {
        let sync = durability == Durability::Sync;
        let shared = Arc::new(SessionShared::new(ID.to_string()));
        let config = CoreConfig {
            id: ID.into(),
            agent_kind: "scripted".into(),
            agent_version: 1,
            agent_config: Vec::new(),
            persist: persistent,
            durability,
            owner: Some("me".into()),
            poll_interval: std::time::Duration::from_secs(1),
            supervised: false,
            history: 0,
            settings: crate::session::SessionSettings {
                durability,
                ..Default::default()
            },
            buffer_bound: Default::default(),
            idle_after: None,
        };
        let mut core = Core::new(config, shared);
        let progress = Arc::new(Mutex::new(Vec::new()));
        let p = progress.clone();
        core.progress_hook = Some(Arc::new(move |turn| p.lock().push(turn)));
        let mut h = Harness {
            core,
            store: Arc::new(MemoryStore::new()),
            sync,
            persistent,
            turn: None,
            timers: VecDeque::new(),
            written: VecDeque::new(),
            results: Vec::new(),
            progress,
            fail_next: false,
            dirty: false,
            out_of_band: false,
            next_item: 0,
            accepted: Vec::new(),
            refused: Vec::new(),
            delivered: Vec::new(),
            dropped: Vec::new(),
            replies: Vec::new(),
            exit: None,
            now: Instant::now(),
            durable_ends: Vec::new(),
        };
        h.event(Event::Start);
        h
    }

    fn event(&mut self, event: Event<Scripted>) {
        let mut queue = VecDeque::from([event]);
        while let Some(ev) = queue.pop_front() {
            let mut effects = Vec::new();
            self.core.handle(ev, self.now, &mut effects);
            for fx in effects {
                self.perform(fx, &mut queue);
            }
            for turn in std::mem::take(&mut *self.progress.lock()) {
                queue.push_back(Event::TurnProgress { turn });
            }
        }
    }

    fn perform(&mut self, fx: Effect<Scripted>, queue: &mut VecDeque<Event<Scripted>>) {
        match fx {
            Effect::Store { seq, op, steps } => {
                self.store.fail_saves(std::mem::take(&mut self.fail_next));
                let r = match op {
                    StoreOp::Write(w) => {
                        let replace = w.replace;
                        let r = futures::executor::block_on(self.store.write(*w)).map(|()| true);
                        if r.is_ok() && replace {
                            self.dirty = false;
                        }
                        r
                    }
                    StoreOp::Delete => {
                        let r = futures::executor::block_on(self.store.delete(ID));
                        if r.is_ok() {
                            self.dirty = false;
                        }
                        r
                    }
                };
                self.store.fail_saves(false);
                if matches!(r, Err(StoreError::Backend { .. })) {
                    self.dirty = true;
                }
                for tx in steps {
                    let _ = tx.send(r.is_ok());
                }
                self.results.push((seq, r.clone()));
                self.written.push_back((seq, r));
            }
            Effect::StartTurn { work, control, .. } => {
                assert!(self.turn.is_none(), "a turn starts while one runs");
                self.turn = Some(SimTurn {
                    control,
                    work: Some(work),
                    consumed: Vec::new(),
                    dropped: Vec::new(),
                    running: Vec::new(),
                });
            }
            Effect::AnswerPush { reply, result } => {
                let _ = reply.send(result);
            }
            Effect::AnswerStop { reply, result } => {
                let _ = reply.send(result);
            }
            Effect::AnswerDetach { reply, result } => {
                let _ = reply.send(result);
            }
            Effect::Timer { event, .. } => self.timers.push_back(event),
            Effect::CancelTimers { ids } => self
                .timers
                .retain(|t| !matches!(t, super::Timed::PreemptDue { id, .. } if ids.contains(id))),
            Effect::Poll => {
                let status = futures::executor::block_on(self.store.load_stored(ID))
                    .ok()
                    .flatten()
                    .map(|s| s.status().clone());
                queue.push_back(Event::Polled { status });
            }
            Effect::StopRequested { .. } => {}
            Effect::TurnDurable { durable, .. } => self.durable_ends.push(durable),
            Effect::Sleep => {
                // S39: the session held nothing, and its record (written asleep) holds
                // nothing either.
                assert!(
                    self.core.ledger.is_empty(),
                    "a session sleeps holding items"
                );
                if !self.dirty {
                    let rec = self.store.get_stored(ID).expect("a record written asleep");
                    match rec {
                        crate::store::Stored::Current(r) => assert!(r.header.asleep),
                        other => panic!("expected a current record, got {other:?}"),
                    }
                }
                let plan = self.core.sleep_plan();
                self.core.begin_sleep();
                assert!(
                    plan.exit.unhandled_items.is_empty() && plan.exit.interrupted_items.is_empty()
                );
                self.exit = Some((plan.exit, CheckpointOutcome::Saved));
            }
            Effect::Exit(plan) => {
                let result = match &plan.last {
                    FinalAction::Write { write, .. } => {
                        futures::executor::block_on(self.store.write((**write).clone()))
                            .map(|()| true)
                    }
                    FinalAction::Delete => futures::executor::block_on(self.store.delete(ID)),
                    FinalAction::End { write } => futures::executor::block_on(async {
                        let existed = self.store.delete(ID).await?;
                        self.store.write((**write).clone()).await.map(|()| existed)
                    }),
                    _ => Ok(false),
                };
                let outcome = plan.last.outcome(result);
                let results = self.results.clone();
                let final_durable = matches!(
                    outcome,
                    crate::exit::CheckpointOutcome::Saved | crate::exit::CheckpointOutcome::Deleted
                );
                self.core.settle(
                    |seq| {
                        results
                            .iter()
                            .find(|(s, _)| *s == seq)
                            .map(|(_, r)| r.clone())
                            .unwrap_or(Ok(true))
                    },
                    final_durable,
                );
                self.exit = Some((plan.exit, outcome));
            }
        }
    }

    fn finished(&mut self, turn: u64) {
        if let Some(t) = self.turn.take() {
            // The core takes the plan's answer at the latest now.
            self.dropped.extend(t.dropped);
        }
        self.event(Event::TurnFinished { turn });
    }

    fn apply(&mut self, action: Action) {
        if self.exit.is_some() {
            // Only pushes reach an exited session (late).
            if let Action::Push { .. } = action {
                self.push(false);
            }
            return;
        }
        match action {
            Action::Push { preempt } => self.push(preempt),
            Action::Stop(kind) => {
                let options = match kind {
                    0 => StopOptions::bare(),
                    1 => StopOptions::graceful(),
                    2 => StopOptions::immediate(),
                    3 => StopOptions::drain(),
                    4 => StopOptions::bare().skip_checkpoint(),
                    _ => StopOptions::graceful().shutdown(),
                };
                self.event(Event::Stop {
                    options,
                    reply: None,
                });
            }
            Action::Detach => {
                let (tx, _rx) = oneshot::channel();
                self.event(Event::Detach {
                    reply: ractor::RpcReplyPort::from(tx),
                });
            }
            Action::CancelById => {
                if !self.persistent {
                    return;
                }
                let swapped = futures::executor::block_on(self.store.cas_status(
                    ID,
                    vec![StatusKind::Running],
                    SessionStatus::Canceled,
                ));
                if let Ok(crate::store::CasOutcome::Swapped(_)) = swapped {
                    self.out_of_band = true;
                    self.event(Event::Stop {
                        options: crate::session::core::stop::canceled_stop(),
                        reply: None,
                    });
                }
            }
            Action::Plan { k, r, reverse } => self.plan(k, r, reverse),
            Action::PlanFails => {
                let Some(t) = self
                    .turn
                    .as_ref()
                    .filter(|t| t.control.phase() == Phase::Planning)
                else {
                    return;
                };
                if matches!(t.work, Some(TurnWork::Resume { .. })) {
                    return;
                }
                t.control
                    .end_planning("plan failed".into(), Some(crate::exit::FailureKind::Agent));
                let index = t.control.index;
                self.finished(index);
            }
            Action::PlanAborted => {
                let Some(t) = self.turn.as_ref().filter(|t| {
                    t.control.phase() == Phase::Planning && t.control.planning_aborted()
                }) else {
                    return;
                };
                t.control.end_planning("a stop committed".into(), None);
                let index = t.control.index;
                self.finished(index);
            }
            Action::ResumeStarts => {
                let Some(t) = self
                    .turn
                    .as_mut()
                    .filter(|t| t.control.phase() == Phase::Planning)
                else {
                    return;
                };
                if let Some(TurnWork::Resume { items, .. }) = &t.work {
                    t.consumed = items.clone();
                    t.control.start_running(None, Instant::now());
                }
            }
            Action::SafePoint(v) => {
                if let Some(t) = self
                    .turn
                    .as_ref()
                    .filter(|t| t.control.phase() == Phase::Running)
                {
                    let _ = t.control.safe_point(SafePoint::AfterModelCall, &v);
                }
                let progress = std::mem::take(&mut *self.progress.lock());
                for turn in progress {
                    self.event(Event::TurnProgress { turn });
                }
            }
            Action::StepBegins { name, no_retry } => {
                let Some(t) = self
                    .turn
                    .as_mut()
                    .filter(|t| t.control.phase() == Phase::Running)
                else {
                    return;
                };
                let name = ["search", "charge", "mail"][name as usize].to_string();
                let policy = if no_retry {
                    agentloop_core::steps::StepPolicy::NoRetry
                } else {
                    agentloop_core::steps::StepPolicy::Retry
                };
                if let Ok((agentloop_core::steps::StepDecision::Run { key, .. }, _)) =
                    t.control.step_begin(&name, policy, ID)
                {
                    t.running.push((key.occurrence, name));
                }
                let progress = std::mem::take(&mut *self.progress.lock());
                for turn in progress {
                    self.event(Event::TurnProgress { turn });
                }
            }
            Action::StepReturns => {
                let Some(t) = self
                    .turn
                    .as_mut()
                    .filter(|t| t.control.phase() == Phase::Running && !t.running.is_empty())
                else {
                    return;
                };
                let (occ, name) = t.running.remove(0);
                let result = codec::payload::encode_checked(&format!("result of {occ}")).unwrap();
                let _ = t.control.step_finish(occ, &name, result, ID);
                let progress = std::mem::take(&mut *self.progress.lock());
                for turn in progress {
                    self.event(Event::TurnProgress { turn });
                }
            }
            Action::Finish(kind) => {
                let Some(t) = self
                    .turn
                    .as_ref()
                    .filter(|t| t.control.phase() == Phase::Running)
                else {
                    return;
                };
                let run = if t.control.must_kill() {
                    RunEnd::Killed
                } else {
                    RunEnd::Returned(
                        match kind {
                            0 | 1 => Ok(TurnOutcome::Completed),
                            2 => Ok(TurnOutcome::Interrupted {
                                info: InterruptInfo::new("approval"),
                                state: 7,
                            }),
                            _ => Err(AgentError::failed("boom")),
                        }
                        .map(TurnOutcome::into_outcome),
                    )
                };
                let end = t.control.finish(run);
                if end == TurnEnd::Completed {
                    self.delivered.extend(t.consumed.iter().copied());
                }
                let index = t.control.index;
                self.finished(index);
            }
            Action::Written => {
                if let Some((seq, result)) = self.written.pop_front() {
                    self.event(Event::Written { seq, result });
                }
            }
            Action::FailNextWrite => self.fail_next = true,
            Action::Timer => {
                if let Some(t) = self.timers.pop_front() {
                    self.event(Event::from(t));
                }
            }
        }
    }

    fn push(&mut self, preempt: bool) {
        let id = self.next_item;
        self.next_item += 1;
        let (tx, rx) = oneshot::channel();
        let options = if preempt {
            PushOptions::preempt(Preempt::any_safe_point())
        } else {
            PushOptions::new()
        };
        let late_before = self.core.counters.items_late;
        let accepted_before = self.core.counters.items_accepted;
        self.event(Event::Push {
            item: id,
            options,
            reply: Some(ractor::RpcReplyPort::from(tx)),
        });
        if self.core.counters.items_accepted > accepted_before {
            self.accepted.push(id);
        } else {
            assert!(self.core.counters.items_late > late_before || self.exit.is_some());
            self.refused.push(id);
        }
        self.replies.push((id, rx));
    }

    fn plan(&mut self, k: usize, r: usize, reverse: bool) {
        let Some(t) = self
            .turn
            .as_mut()
            .filter(|t| t.control.phase() == Phase::Planning)
        else {
            return;
        };
        let Some(TurnWork::Plan { input, bytes, .. }) = t.work.take() else {
            return;
        };
        let offered = input.len();
        let mut items = input.into_items();
        if reverse {
            items.reverse();
        }
        let k = k.min(items.len());
        let r = r.min(items.len() - k);
        let consumed: Vec<u64> = items[..k].to_vec();
        let remaining: Vec<u64> = items[k..k + r].to_vec();
        t.dropped = items[k + r..].to_vec();
        let split = split_plan(
            offered,
            bytes.as_deref(),
            Plan {
                consumed: consumed.clone(),
                remaining,
            },
            enc,
        )
        .expect("a plan over offered items splits");
        let index = t.control.index;
        if consumed.is_empty() {
            t.control.end_deferred(split);
            self.finished(index);
            return;
        }
        t.consumed = consumed;
        t.control.start_running(Some(split), Instant::now());
        let progress = std::mem::take(&mut *self.progress.lock());
        for turn in progress {
            self.event(Event::TurnProgress { turn });
        }
    }

    /// The checks of the module docs, after every step.
    fn check(&self, step: usize) {
        self.core
            .ledger
            .check()
            .unwrap_or_else(|e| panic!("step {step}: ledger: {e}"));
        let held: Vec<u64> = match &self.exit {
            Some((exit, _)) => exit
                .unhandled_items
                .iter()
                .chain(&exit.interrupted_items)
                .copied()
                .collect(),
            None => {
                let p = self.core.ledger.placement();
                let mut v = self.core.ledger.values(&p.unhandled);
                v.extend(self.core.ledger.values(&p.interrupted));
                v
            }
        };
        let mut places: Vec<u64> = held.clone();
        places.extend(&self.delivered);
        places.extend(&self.dropped);
        if let Some(t) = &self.turn {
            // Dropped by a plan whose answer the core took already (else still held).
            if t.control.consumed_view().is_none() && self.exit.is_none() {
                places.extend(&t.dropped);
            }
        }
        places.sort_unstable();
        let mut accepted = self.accepted.clone();
        accepted.sort_unstable();
        assert_eq!(
            places, accepted,
            "step {step}: S10: held {held:?}, delivered {:?}, dropped {:?}",
            self.delivered, self.dropped
        );
        if self.persistent && self.sync && self.exit.is_none() && !self.dirty && !self.out_of_band {
            let p = self.core.ledger.placement();
            let rec = self.store.get(ID);
            let (stored_unhandled, stored_interrupted) = rec
                .map(|r| (r.unhandled_items, r.interrupted_items))
                .unwrap_or_default();
            assert_eq!(
                (stored_unhandled, stored_interrupted),
                (
                    self.core.ledger.values(&p.unhandled),
                    self.core.ledger.values(&p.interrupted)
                ),
                "step {step}: the stored record is not the placement"
            );
            // S1b: the stored journal is the live turn's (the steps it began and
            // finished since its state), with the mark of that state.
            // (A mark with nothing covered and no entry is no journal.)
            let empty = |j: &agentloop_core::steps::TurnJournal| {
                j.entries.is_empty() && j.mark.covered == 0
            };
            let stored = self
                .store
                .get(ID)
                .and_then(|r| r.journal)
                .filter(|j| !empty(j));
            let live = match &self.turn {
                // A safe point that captured a cancel is not written on its own: its
                // state and the steps it covers go with the turn's end (as the state
                // does; the stored pair stays the previous, consistent one).
                Some(t) if t.control.is_captured() => None,
                Some(t) => t.control.journal(),
                None => self.core.cut_journal.as_deref().cloned(),
            }
            .filter(|j| !empty(j));
            let live = match (&self.turn, live) {
                (Some(t), _) if t.control.is_captured() => stored.clone(),
                (_, live) => live,
            };
            assert_eq!(
                stored, live,
                "step {step}: the stored journal is not the live turn's"
            );
        }
    }

    /// At the end: every push was answered; a saved record holds the exit state.
    fn finish_checks(mut self) {
        for (id, rx) in std::mem::take(&mut self.replies) {
            let mut rx = rx;
            match rx.try_recv() {
                Ok(Ok(_)) => assert!(self.accepted.contains(&id), "item {id} acked, not accepted"),
                Ok(Err(PushError::NotDurable { .. })) => assert!(self.accepted.contains(&id)),
                Ok(Err(e)) => {
                    assert!(self.refused.contains(&id), "item {id}: {e}");
                    assert_eq!(e.into_item(), Some(id), "the refused item comes back");
                }
                // Still waiting for its write: only while the session lives on.
                Err(_) => assert!(
                    self.exit.is_none(),
                    "item {id} was never answered, and the session exited"
                ),
            }
        }
        if let Some((exit, CheckpointOutcome::Saved)) = &self.exit {
            if !self.dirty {
                let rec = self.store.get(ID).expect("a saved record");
                assert_eq!(rec.unhandled_items, exit.unhandled_items);
                assert_eq!(rec.interrupted_items, exit.interrupted_items);
            }
        }
        if let Some((_, CheckpointOutcome::Deleted)) = &self.exit {
            assert!(self.store.get_stored(ID).is_none());
        }
    }
}

fn run(persistent: bool, durability: Durability, actions: Vec<Action>) {
    run_with(Harness::new(persistent, durability), actions);
}

/// A supervisor's persistent session that sleeps when idle (S39).
fn sleepy(durability: Durability) -> Harness {
    let mut h = Harness::new(true, durability);
    h.core.config.supervised = true;
    h.core.config.idle_after = Some(std::time::Duration::from_secs(1));
    // Armed at the next idle boundary.
    h
}

fn run_with(mut h: Harness, actions: Vec<Action>) {
    h.check(0);
    for (i, a) in actions.into_iter().enumerate() {
        h.apply(a);
        h.check(i + 1);
    }
    h.finish_checks();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    /// S10 + S16a on the core alone, `sync`: conservation, and the record is the
    /// placement, after every step.
    #[test]
    fn core_sync_conserves_and_the_record_is_the_placement(actions in proptest::collection::vec(action(), 0..60)) {
        run(true, Durability::Sync, actions);
    }

    /// S10 on the core alone, `exit` durability (the record is written at the end).
    #[test]
    fn core_exit_durability_conserves(actions in proptest::collection::vec(action(), 0..60)) {
        run(true, Durability::Exit, actions);
    }

    /// S10 on the core alone, `turn` durability.
    #[test]
    fn core_turn_durability_conserves(actions in proptest::collection::vec(action(), 0..60)) {
        run(true, Durability::Turn, actions);
    }

    /// S10 + S39 on the core alone: a session that sleeps when idle (every `sync`
    /// write is the placement, it sleeps only holding nothing, its record written
    /// asleep, and every push after it is handed back).
    #[test]
    fn core_sleepy_sync_conserves(actions in proptest::collection::vec(action(), 0..60)) {
        run_with(sleepy(Durability::Sync), actions);
    }

    /// S10 + S39 under `exit` durability: the sleep write carries what the session is.
    #[test]
    fn core_sleepy_exit_durability_conserves(actions in proptest::collection::vec(action(), 0..60)) {
        run_with(sleepy(Durability::Exit), actions);
    }

    /// S10 on the core alone, no store.
    #[test]
    fn core_in_memory_conserves(actions in proptest::collection::vec(action(), 0..60)) {
        run(false, Durability::Exit, actions);
    }
}

mod examples;
