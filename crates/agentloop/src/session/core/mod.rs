//! The session core: every decision one session makes, as plain functions of (state,
//! event) that return the effects to perform (DESIGN S5–S24; the *sans-IO* shape of
//! quinn-proto and rustls).
//!
//! The TurnLoop actor is a thin shell around it: it turns messages into [`Event`]s,
//! calls [`Core::handle`], and performs the [`Effect`]s it gets back (issue a store
//! write, spawn a turn task, answer a push, arm a timer, tear down), feeding results
//! back as events (`Written`, `TurnFinished`, `Polled`, …). The core never awaits,
//! never spawns, never touches the store; it reads the turn control block (in-memory
//! state it shares with the turn task) and the session's shared state. So it runs, and
//! is tested, without a runtime.
//!
//! One concern per file, each a set of event handlers on [`Core`]: `intake` (pushes),
//! `stop` (stop requests, detach, cancels from outside), `turns` (starting turns and
//! what a turn's end means), `durability` (what is written when, and who waits for
//! it), `exit` (the exit state and the final checkpoint), `load` (seeding from a
//! record). Handlers never call each other: a handler that needs another decision
//! queues an event, and after every event [`Core::advance`] decides what happens at
//! the boundary (exit, start a turn, or wait). Items move only through the ledger.

mod durability;
mod exit;
mod intake;
pub(crate) mod load;
mod sleep;
pub(crate) mod stop;
mod turns;

pub(crate) use turns::TurnWork;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use tokio::time::Instant;

use crate::cancel::CancelMode;
use crate::error::SessionError;
use crate::exit::{ExitCounters, ExitReason, ExitState, FailureKind};
use crate::options::{OptionsError, Preempt, PushOptions, StopOptions, TurnPhase};
use crate::push::{PendingAck, PreemptAck, PushError, PushReply};
use crate::session::info::SessionInfo;
use crate::session::ledger::Ledger;
use crate::session::{Durability, SessionSpec};
use crate::shared::SessionShared;
use crate::store::{Payload, RecordWrite, StoreError};
use crate::turn::agent::Agent;
use crate::turn::control::{Phase, StateSnap, TurnControl};

pub(crate) use durability::Durable;
pub(crate) use exit::FinalAction;
pub(crate) use stop::StopState;

/// Where a stop's answer goes.
pub(crate) type StopReply = RpcReplyPort<Result<(), OptionsError>>;
/// Where a detach's answer goes.
pub(crate) type DetachReply = RpcReplyPort<Result<(), SessionError>>;
/// Where a turn's task learns whether its end is durable (dropped: it is not).
pub(crate) type DurableTx = tokio::sync::oneshot::Sender<bool>;

/// A store operation the shell issues in order and reports back (`Written`).
#[derive(Debug)]
pub(crate) enum StoreOp {
    /// A change to the record (boxed: writes are large next to a delete).
    Write(Box<RecordWrite>),
    /// Delete the record.
    Delete,
}

/// What happens to the core: a message, a timer, a result.
pub(crate) enum Event<A: Agent> {
    /// The actor started (after the load): begin.
    Start,
    /// A push (S5, S7, S9, S14, S15a).
    Push {
        item: A::Item,
        options: PushOptions<A::Item>,
        reply: Option<PushReply<A::Item>>,
    },
    /// A stop request (S11).
    Stop {
        options: StopOptions,
        reply: Option<StopReply>,
    },
    /// Hand the session to the background (S23).
    Detach { reply: DetachReply },
    /// Write the record now; answered once it is durable.
    Checkpoint { reply: DetachReply },
    /// The turn task of `turn` is done; its ending is in its control block.
    TurnFinished { turn: u64 },
    /// The running turn recorded a state at a safe point, or its plan changed stored
    /// entries (S16a).
    TurnProgress { turn: u64 },
    /// Delayed preempt `id` of turn `turn` is due (S7).
    PreemptDue { turn: u64, id: u64 },
    /// An idle timer fired (S11 `until_idle_for`).
    IdleDue { epoch: u64 },
    /// The sleep timer fired (S39); `watched`: somebody is subscribed.
    SleepDue { epoch: u64, watched: bool },
    /// Somebody subscribed while the session was about to sleep (S39).
    SleepRefused,
    /// A store operation finished.
    Written {
        seq: u64,
        result: Result<bool, StoreError>,
    },
    /// A detached session's poll interval elapsed (S24).
    PollDue,
    /// The record's status, as a poll read it (`None`: no record, or unreadable).
    Polled {
        status: Option<crate::store::SessionStatus>,
    },
}

/// A timer's event.
#[allow(clippy::enum_variant_names)] // each is an event that is *due*
pub(crate) enum Timed<I> {
    /// Delayed preempt `id` of turn `turn` (the preempt itself waits in its turn,
    /// [`ActiveTurn::delayed`]).
    PreemptDue {
        turn: u64,
        id: u64,
        #[doc(hidden)]
        _item: std::marker::PhantomData<fn() -> I>,
    },
    /// Idle long enough?
    IdleDue { epoch: u64 },
    /// Idle long enough to sleep (S39)?
    SleepDue { epoch: u64 },
    /// Poll the record.
    PollDue,
}

impl<I> Timed<I> {
    /// The timer's name, for logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Timed::PreemptDue { .. } => "PreemptDue",
            Timed::IdleDue { .. } => "IdleDue",
            Timed::SleepDue { .. } => "SleepDue",
            Timed::PollDue => "PollDue",
        }
    }
}

/// A due timer is the event it was set for.
impl<A: Agent> From<Timed<A::Item>> for Event<A> {
    fn from(timed: Timed<A::Item>) -> Self {
        match timed {
            Timed::PreemptDue { turn, id, .. } => Event::PreemptDue { turn, id },
            Timed::IdleDue { epoch } => Event::IdleDue { epoch },
            // The shell says whether somebody is subscribed (`turn_loop.rs`).
            Timed::SleepDue { epoch } => Event::SleepDue {
                epoch,
                watched: false,
            },
            Timed::PollDue => Event::PollDue,
        }
    }
}

/// What the shell performs.
pub(crate) enum Effect<A: Agent> {
    /// Issue this store operation now (writes are ordered when issued); report
    /// `Written { seq }`. `steps` wait for the write: durable steps (S1b) whose journal
    /// entry it holds, and the turn whose end it records (S16b); its completion answers
    /// them directly (whether it succeeded), without a trip through the session's
    /// mailbox.
    Store {
        seq: u64,
        op: StoreOp,
        steps: Vec<DurableTx>,
    },
    /// Spawn the task of turn `index`.
    StartTurn {
        index: u64,
        work: TurnWork<A>,
        control: Arc<TurnControl<A::Item, A::State>>,
    },
    /// Answer a push.
    AnswerPush {
        reply: PushReply<A::Item>,
        result: Result<PreemptAck, PushError<A::Item>>,
    },
    /// Answer a stop.
    AnswerStop {
        reply: StopReply,
        result: Result<(), OptionsError>,
    },
    /// Answer a detach.
    AnswerDetach {
        reply: DetachReply,
        result: Result<(), SessionError>,
    },
    /// After `after`, feed this back.
    Timer {
        after: Duration,
        event: Timed<A::Item>,
    },
    /// Cancel these delayed preempts' timers (their turn ended: issue 52, a timer
    /// held for its whole delay, up to 24 h, after its turn).
    CancelTimers { ids: Vec<u64> },
    /// Read the record's status and report `Polled`.
    Poll,
    /// Tell turn `turn`'s task whether its end is durable, so it sends `TurnEnded`.
    TurnDurable { tx: DurableTx, durable: bool },
    /// Tell subscribers a stop was requested (never waits).
    StopRequested {
        cancel: Option<CancelMode>,
        cause: Option<String>,
    },
    /// The session may sleep (S39): its record is written asleep; the shell closes its
    /// subscriptions if nobody holds one and tears down with
    /// [`Core::begin_sleep`]'s plan, else reports [`Event::SleepRefused`].
    Sleep,
    /// The session exits: perform the final checkpoint, then the rest of the teardown
    /// (S21).
    Exit(Box<ExitPlan<A::Item>>),
}

/// What the teardown performs: the exit state (its checkpoint outcome filled in from
/// the final action's result) and the final action on the record.
pub(crate) struct ExitPlan<I> {
    pub(crate) exit: ExitState<I>,
    pub(crate) last: FinalAction,
}

/// An answer to an interrupt (S4), given through `resume_with_answer`.
pub(crate) struct Answer<I> {
    pub(crate) item: I,
    /// Its encoded form, as the record keeps it.
    pub(crate) bytes: Payload,
}

/// The turn that is planning or running.
pub(crate) struct ActiveTurn<A: Agent> {
    pub(crate) index: u64,
    pub(crate) control: Arc<TurnControl<A::Item, A::State>>,
    pub(crate) is_resume: bool,
    /// The turn task waits on it before sending `TurnEnded` (`sync` and `turn`).
    pub(crate) durable_tx: Option<DurableTx>,
    /// Delayed preempts aimed at this turn, waiting for their timers (S7); answered
    /// `TargetEnded` and their timers canceled when the turn ends.
    pub(crate) delayed: Vec<DelayedPreempt<A::Item>>,
}

/// A delayed preempt waiting for its timer (S7).
pub(crate) struct DelayedPreempt<I> {
    /// Its timer's number.
    pub(crate) id: u64,
    pub(crate) preempt: Preempt,
    pub(crate) reply: Option<PendingAck<I>>,
}

/// How the session is going to end, decided when a turn ends it.
pub(crate) struct PendingExit<S> {
    pub(crate) reason: ExitReason,
    pub(crate) failure: Option<FailureKind>,
    /// The cut turn's state, if it left one.
    pub(crate) state: Option<StateSnap<S>>,
}

/// The session's configuration as the core needs it.
pub(crate) struct CoreConfig {
    pub(crate) id: String,
    pub(crate) agent_kind: String,
    /// The version of the kind this incarnation runs (S40).
    pub(crate) agent_version: u32,
    pub(crate) agent_config: Vec<u8>,
    /// The session persists and has a store.
    pub(crate) persist: bool,
    pub(crate) durability: Durability,
    pub(crate) owner: Option<String>,
    pub(crate) poll_interval: Duration,
    pub(crate) supervised: bool,
    /// Turn-end checkpoints to keep (0: none).
    pub(crate) history: usize,
    /// What every record header keeps of the session's settings (issue 28).
    pub(crate) settings: crate::session::SessionSettings,
    /// What the session holds before it refuses pushes (S34a).
    pub(crate) buffer_bound: crate::session::BufferBound,
    /// How long it stays idle before it sleeps (S39): its own, else the runtime's.
    pub(crate) idle_after: Option<std::time::Duration>,
}

impl CoreConfig {
    /// The core's part of a session's configuration (moved out of it, not copied).
    pub(crate) fn from_session<I>(config: &mut SessionSpec<I>, has_store: bool) -> Self {
        CoreConfig {
            id: std::mem::take(&mut config.id),
            agent_kind: std::mem::take(&mut config.kind),
            agent_version: config.run.agent_version,
            agent_config: std::mem::take(&mut config.agent_config),
            persist: config.persist && has_store,
            durability: config.durability,
            owner: config.owner.clone(),
            poll_interval: config.effective_poll_interval(),
            supervised: config.run.supervised,
            history: config.history,
            settings: config.recorded_settings(),
            buffer_bound: config.buffer_bound.unwrap_or_default(),
            idle_after: config.idle_after.or(config.run.idle_after),
        }
    }
}

/// One session's decisions and the state they are made from.
pub(crate) struct Core<A: Agent> {
    pub(crate) config: Box<CoreConfig>,
    pub(crate) shared: Arc<SessionShared<A::Item>>,
    /// Every accepted item's place.
    pub(crate) ledger: Ledger<A::Item>,
    pub(crate) stop: StopState,
    pub(crate) turn: Option<ActiveTurn<A>>,
    pub(crate) next_index: u64,
    /// The state the cut turn resumes from (a record's, S17), until its turn starts.
    pub(crate) seed_state: Option<Box<StateSnap<A::State>>>,
    /// The state the last completed turn left to the next (`TurnOutcome::CompletedWith`,
    /// or a record's carried state): given to every turn that does not resume from a
    /// safe point's state, and stored wherever no cut turn's state is.
    pub(crate) carried: Option<Box<StateSnap<A::State>>>,
    /// The cut turn's journal of durable steps (S1b): a record's, until its turn
    /// starts, or a cut turn's, for the final write.
    pub(crate) cut_journal: Option<Box<agentloop_core::steps::TurnJournal>>,
    /// Bumped by every accepted push: an idle timer armed before it is void.
    pub(crate) idle_epoch: u64,
    /// The epoch an idle timer is armed for (one timer per idle period, S11).
    pub(crate) idle_armed: Option<u64>,
    /// The epoch the sleep timer is armed for (S39).
    pub(crate) sleep_armed: Option<u64>,
    /// The sleep write in flight: its number and the idle epoch it was issued in.
    pub(crate) sleep_write: Option<(u64, u64)>,
    /// The last plan consumed nothing: wait for a push before planning again.
    pub(crate) await_input: bool,
    /// Handed to the background (S23).
    pub(crate) detached: bool,
    pub(crate) counters: ExitCounters,
    pub(crate) exit: Option<Box<PendingExit<A::State>>>,
    /// The teardown has begun: the session takes nothing more.
    pub(crate) exited: bool,
    /// Loading the record failed: exit `Failed` at once, leaving the record (S18).
    pub(crate) load_error: Option<Box<StoreError>>,
    /// What is written, when, and who waits for it.
    pub(crate) durable: Durable<A>,
    /// The turn whose end the final write holds, to keep in the history.
    pub(crate) history_at_exit: Option<u64>,
    /// The answer to the record's interrupt, until the resume turn has run (every write
    /// keeps it meanwhile, so a crash does not lose it).
    pub(crate) answer: Option<Box<Answer<A::Item>>>,
    /// Tells the shell a turn progressed (installed in `sync` turns' control blocks).
    pub(crate) progress_hook: Option<ProgressHook>,
    /// The idempotency keys of accepted pushes (S34a); allocated at the first.
    pub(crate) keys: Option<Box<crate::session::keys::Keys>>,
    /// The last delayed preempt's timer number.
    pub(crate) last_timer: u64,
}

/// Called with a turn's index when it progressed (see [`TurnHooks`]).
///
/// [`TurnHooks`]: crate::turn::control::TurnHooks
pub(crate) type ProgressHook = Arc<dyn Fn(u64) + Send + Sync>;

/// The effects of one event, in order.
pub(crate) type Effects<A> = Vec<Effect<A>>;

impl<A: Agent> Core<A> {
    /// A fresh core (items and state are seeded by [`Core::seed`] when a record was
    /// loaded).
    pub(crate) fn new(config: CoreConfig, shared: Arc<SessionShared<A::Item>>) -> Self {
        let persist = config.persist;
        let durable = Durable::new(&config);
        Core {
            config: Box::new(config),
            shared,
            ledger: Ledger::new(persist),
            stop: StopState::default(),
            turn: None,
            next_index: 0,
            seed_state: None,
            carried: None,
            cut_journal: None,
            idle_epoch: 0,
            idle_armed: None,
            sleep_armed: None,
            sleep_write: None,
            await_input: false,
            detached: false,
            counters: ExitCounters::default(),
            exit: None,
            exited: false,
            load_error: None,
            durable,
            answer: None,
            history_at_exit: None,
            progress_hook: None,
            keys: None,
            last_timer: 0,
        }
    }

    /// Whether the session writes its record (a store, and persistence on).
    pub(crate) fn persists(&self) -> bool {
        self.config.persist
    }

    /// Whether every item, safe point and turn end is written (S16a `sync`).
    pub(crate) fn syncs(&self) -> bool {
        self.persists() && self.config.durability == Durability::Sync
    }

    /// Whether every turn end is written (`sync` and `turn`), so `TurnEnded` waits
    /// for its write and says it is durable.
    pub(crate) fn writes_turn_ends(&self) -> bool {
        self.persists() && self.config.durability != Durability::Exit
    }

    /// Handles one event and appends the effects to perform to `fx`, in order.
    /// Follow-up events a handler queues are handled before returning; after each, the
    /// boundary is decided ([`Core::advance`]). (The caller owns `fx` so its capacity
    /// is reused from one event to the next.)
    pub(crate) fn handle(&mut self, event: Event<A>, now: Instant, fx: &mut Effects<A>) {
        // Follow-ups are rare: the queue allocates only when one is queued.
        let mut queue = VecDeque::new();
        let mut next = Some(event);
        while let Some(event) = next.take().or_else(|| queue.pop_front()) {
            match event {
                Event::Start => self.on_start(),
                Event::Push {
                    item,
                    options,
                    reply,
                } => self.on_push(item, options, reply, now, fx),
                Event::Stop { options, reply } => self.on_stop(options, reply, now, fx),
                Event::Detach { reply } => self.on_detach(reply, fx),
                Event::Checkpoint { reply } => self.on_checkpoint(reply, fx),
                Event::TurnFinished { turn } => self.on_turn_finished(turn, fx),
                Event::TurnProgress { turn } => self.on_turn_progress(turn, fx),
                Event::PreemptDue { turn, id } => self.on_preempt_due(turn, id, now),
                Event::IdleDue { epoch } => self.on_idle_due(epoch),
                Event::SleepDue { epoch, watched } => self.on_sleep_due(epoch, watched, fx),
                Event::SleepRefused => self.on_sleep_refused(),
                Event::Written { seq, result } => {
                    let ok = result.is_ok();
                    self.on_written(seq, result, now, fx, &mut queue);
                    self.on_sleep_written(seq, ok, fx);
                }
                Event::PollDue => self.on_poll_due(fx),
                Event::Polled { status } => self.on_polled(status, fx, &mut queue),
            }
            self.advance(now, fx);
        }
    }

    /// A snapshot of the session (S25 inspect).
    pub(crate) fn info(&self) -> SessionInfo {
        let (buffered, preempted) = self.ledger.waiting();
        SessionInfo {
            session_id: self.config.id.clone(),
            phase: if self.exited {
                TurnPhase::Idle
            } else {
                self.phase()
            },
            turn_index: self.turn.as_ref().map_or(self.next_index, |t| t.index),
            buffered,
            preempted,
            stop_committed: self.stop.committed,
            exited: self.exited,
        }
    }

    /// The current turn's phase as users see it.
    pub(crate) fn phase(&self) -> TurnPhase {
        match &self.turn {
            None => TurnPhase::Idle,
            Some(t) => match t.control.phase() {
                Phase::Planning => TurnPhase::Planning,
                Phase::Running => TurnPhase::Running,
                Phase::Ended => TurnPhase::Idle,
            },
        }
    }

    /// The turn a push lands on, for a push strategy (S9): its index, phase and a copy
    /// of its consumed items (empty while it plans).
    pub(crate) fn turn_view(&self) -> (Option<u64>, TurnPhase, Vec<A::Item>) {
        match &self.turn {
            None => (None, TurnPhase::Idle, Vec::new()),
            Some(t) => {
                let phase = self.phase();
                let consumed = match phase {
                    TurnPhase::Running => self
                        .ledger
                        .consumed_values()
                        .or_else(|| t.control.consumed_view())
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                (Some(t.index), phase, consumed)
            }
        }
    }
}
