//! The TurnLoop actor: one session's item buffer, current turn, stop state and
//! teardown (DESIGN S5–S14, S16, S17, S20, S21).
//!
//! It owns every decision about the session: when a turn starts, what it is offered,
//! where a push's preempt goes, what a stop commits, how a turn's end is accounted for
//! (S10: every accepted item ends in exactly one place), and the teardown order of S21.
//! It never runs agent code (that is `turn_task`) and never blocks: store calls are
//! async, events from the actor never wait for capacity, and the exit uses ractor's
//! `drain()` (never `stop()`), so messages already queued are answered, not dropped.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;
use tracing::Instrument;

use crate::agent::{Agent, PlanInput};
use crate::events::{SessionEvent, Subscribers, TurnEnd};
use crate::exit::FailureKind;
use crate::exit::{CheckpointOutcome, ExitCounters, ExitReason, ExitState};
use crate::options::{Preempt, PushOptions, StopOptions, TurnPhase, TurnView};
use crate::session::messages::{
    Internal, InternalMsg, PendingAck, PreemptAck, PushError, PushReply, SessionInfo, TurnLoopMsg,
};
use crate::session::stop::{StopEffect, StopState};
use crate::session::turn_task::{TurnTask, TurnWork};
use crate::session::{Durability, SessionConfig};
use crate::shared::SessionShared;
use crate::store::{
    codec, lease, now_ms, CheckpointStore, SessionRecord, SessionStatus, StoreError,
};
use crate::turn::control::{Ending, LiveTurn, Origin, Phase, Submitted, TurnControl};
use crate::turn::TurnCx;

/// The TurnLoop actor (one per session). Spawn it through
/// [`crate::SessionHandle::spawn`] or [`crate::SessionHandle::spawn_linked`].
pub struct TurnLoop<A: Agent>(PhantomData<fn() -> A>);

impl<A: Agent> Default for TurnLoop<A> {
    fn default() -> Self {
        TurnLoop(PhantomData)
    }
}

/// What a TurnLoop is started with.
pub struct TurnLoopArgs<A: Agent> {
    pub(crate) config: SessionConfig,
    pub(crate) agent: Arc<A>,
    pub(crate) store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    pub(crate) shared: Arc<SessionShared<A::Item>>,
    pub(crate) subscribers: Arc<Subscribers<A::Event>>,
    /// The stored record, when the spawner already read it (the runtime's resume at
    /// start): used instead of loading it again.
    pub(crate) preloaded: Option<SessionRecord<A::Item>>,
}

/// The cut turn a record hands to the first turn (S17).
struct ResumeSeed<A: Agent> {
    items: Vec<A::Item>,
    state: Option<A::State>,
}

/// The turn that is planning or running.
struct ActiveTurn<A: Agent> {
    index: u64,
    control: Arc<TurnControl<A::Item, A::State>>,
    /// The offered items, kept so a plan that does not complete can put them back in
    /// their original order (S6).
    offered: Vec<A::Item>,
    /// How many of `offered` came from a preempted turn.
    offered_preempted: usize,
    is_resume: bool,
    /// A resume turn's saved state (its input), kept so it is never lost.
    input_state: Option<A::State>,
    /// Aborts the turn task if the actor dies.
    task: tokio::task::AbortHandle,
}

/// A push accepted under `sync` durability, answered once the write holding its item
/// is flushed. Its preempt is applied then too, to the turn it targeted when accepted.
struct UnsyncedPush<I> {
    seq: u64,
    reply: Option<PushReply<I>>,
    preempt: Option<Preempt>,
    target: Option<u64>,
}

/// How the session is going to end, decided when a turn ends it.
struct PendingExit<A: Agent> {
    reason: ExitReason,
    failure: Option<FailureKind>,
    interrupted: Vec<A::Item>,
    turn_index: u64,
    state: Option<A::State>,
}

/// The TurnLoop's state.
pub struct LoopState<A: Agent> {
    config: SessionConfig,
    agent: Arc<A>,
    store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    shared: Arc<SessionShared<A::Item>>,
    subscribers: Arc<Subscribers<A::Event>>,
    /// Accepted items waiting for a plan, in push order (remaining items of a plan at
    /// the front).
    buffer: VecDeque<A::Item>,
    /// Items of a preempted turn, offered first to the next plan (S8).
    preempted: Vec<A::Item>,
    resume: Option<ResumeSeed<A>>,
    turn: Option<ActiveTurn<A>>,
    next_index: u64,
    stop: StopState,
    /// Bumped by every accepted push: an idle timer armed before it is void.
    idle_epoch: u64,
    /// The epoch an idle timer is armed for (one timer per idle period, S11).
    idle_armed: Option<u64>,
    /// The last plan consumed nothing: wait for a push before planning again.
    await_input: bool,
    /// Handed to the background (S23): finalized by compare-and-swap at exit.
    detached: bool,
    /// The stored record was loaded and turns have run since: it is stale and is
    /// replaced after each completed turn (so it never replays delivered items).
    record_stale: bool,
    counters: ExitCounters,
    exit: Option<PendingExit<A>>,
    /// `sync` durability: the sequence number of the last write issued.
    sync_seq: u64,
    /// `sync` durability: accepted pushes waiting for the write that holds their item.
    unsynced: VecDeque<UnsyncedPush<A::Item>>,
    /// `sync` durability: writes not yet reported by `Synced`, by sequence number; each
    /// task returns its own write's result, so teardown can await exactly those.
    sync_tasks: VecDeque<(u64, tokio::task::JoinHandle<Result<(), StoreError>>)>,
    /// The exit state from the moment teardown computed it until it is published, so
    /// an actor killed mid-teardown still hands every item back.
    final_exit: Option<ExitState<A::Item>>,
    exited: bool,
    load_error: Option<StoreError>,
    created_at_ms: u64,
    span: tracing::Span,
}

impl<A: Agent> LoopState<A> {
    fn persists(&self) -> bool {
        self.config.persist && self.store.is_some()
    }

    fn syncs(&self) -> bool {
        self.persists() && self.config.durability == Durability::Sync
    }

    fn phase(&self) -> TurnPhase {
        match &self.turn {
            None => TurnPhase::Idle,
            Some(t) => match t.control.phase() {
                Phase::Planning => TurnPhase::Planning,
                Phase::Running => TurnPhase::Running,
                Phase::Ended => TurnPhase::Idle,
            },
        }
    }

    fn info(&self) -> SessionInfo {
        SessionInfo {
            session_id: self.config.id.clone(),
            phase: if self.exited {
                TurnPhase::Idle
            } else {
                self.phase()
            },
            turn_index: self.turn.as_ref().map_or(self.next_index, |t| t.index),
            buffered: self.buffer.len(),
            preempted: self.preempted.len(),
            stop_committed: self.stop.committed,
            exited: self.exited,
        }
    }

    /// A push after the stop committed or the exit (S14): hand the item back, keep a copy.
    fn reject_late(&mut self, item: A::Item, reply: Option<PushReply<A::Item>>) {
        self.counters.items_late += 1;
        self.shared.push_late(item.clone());
        tracing::debug!(session = %self.config.id, "push rejected as late");
        if let Some(r) = reply {
            let _ = r.send(Err(PushError::Late { item }));
        }
    }

    /// A push refused for its options (S12): the item goes back in the error. A push
    /// sent without a reply (a `cast!`) has nobody to hand it to, so the item is kept
    /// in the late list instead of vanishing (S10, S14). Not counted as late.
    fn reject_invalid(
        &mut self,
        item: A::Item,
        error: crate::options::OptionsError,
        reply: Option<PushReply<A::Item>>,
    ) {
        match reply {
            Some(r) => {
                let _ = r.send(Err(PushError::InvalidOptions { item, error }));
            }
            None => {
                tracing::warn!(session = %self.config.id, %error,
                    "push without a reply refused for its options; its item is kept in the late list");
                self.shared.push_late(item);
            }
        }
    }
}

impl<A: Agent> Drop for LoopState<A> {
    fn drop(&mut self) {
        // The actor was killed or failed before teardown finished (ractor skips
        // post_stop then). Hand everything back through the exit state so nothing is
        // lost and `wait` returns; stop the turn task.
        if self.exited {
            return;
        }
        if let Some(t) = self.turn.as_ref() {
            t.task.abort();
        }
        // Pushes waiting for a sync write were accepted: they are in the exit state, and
        // their callers must hear that, not a silence that looks like a lost item.
        abandon_unsynced(
            self,
            "the session actor stopped before the write was confirmed",
        );
        let exit = match self.final_exit.take() {
            // Teardown had computed the exit (and done the checkpoint): publish it.
            Some(exit) => exit,
            None => self.salvage_exit(),
        };
        self.subscribers.end(exit.summary());
        self.shared.fire_stopped();
        self.shared.publish_exit(exit);
    }
}

impl<A: Agent> LoopState<A> {
    /// The exit state of an actor that died before its teardown: every item the
    /// session holds, placed by what the current turn had done with it (S10).
    fn salvage_exit(&mut self) -> ExitState<A::Item> {
        let mut unhandled = Vec::new();
        let mut interrupted = Vec::new();
        if let Some(t) = self.turn.take() {
            match t.control.salvage() {
                // Still planning: every offered item is still to be handled.
                None => unhandled.extend(t.offered),
                Some((consumed, remaining, dropped, end)) => {
                    self.counters.items_dropped_by_plan += dropped;
                    match end {
                        Some(TurnEnd::Completed) => {
                            self.counters.turns_completed += 1;
                            self.counters.items_delivered += consumed.len() as u64;
                        }
                        Some(TurnEnd::Preempted(_)) => unhandled.extend(consumed),
                        _ => interrupted.extend(consumed),
                    }
                    unhandled.extend(remaining);
                }
            }
        }
        if let Some(seed) = self.resume.take() {
            interrupted.extend(seed.items);
        }
        unhandled.append(&mut self.preempted);
        unhandled.extend(self.buffer.drain(..));
        ExitState {
            session_id: self.config.id.clone(),
            reason: ExitReason::Failed(
                "the session actor stopped before its teardown (killed or failed)".into(),
            ),
            failure: Some(FailureKind::Internal),
            stop_cause: self.shared.cause(),
            unhandled_items: unhandled,
            interrupted_items: interrupted,
            late_items: self.shared.late_snapshot(),
            has_mid_turn_state: false,
            checkpoint: CheckpointOutcome::NotAttempted,
            counters: self.counters,
            next_turn_index: self.next_index,
        }
    }
}

type Myself<A> = ActorRef<TurnLoopMsg<<A as Agent>::Item, <A as Agent>::Event>>;

fn spawn_timer<A: Agent>(
    myself: &Myself<A>,
    after: std::time::Duration,
    msg: InternalMsg<A::Item>,
) {
    let myself = myself.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        // The session may have exited meanwhile; then the timer has nothing to do.
        let _ = myself.send_message(TurnLoopMsg::Internal(Internal(msg)));
    });
}

impl<A: Agent> Actor for TurnLoop<A> {
    type Msg = TurnLoopMsg<A::Item, A::Event>;
    type State = LoopState<A>;
    type Arguments = TurnLoopArgs<A>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: TurnLoopArgs<A>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let span =
            tracing::info_span!("session", id = %args.config.id, kind = %args.config.agent_kind);
        let mut state = LoopState {
            config: args.config,
            agent: args.agent,
            store: args.store,
            shared: args.shared,
            subscribers: args.subscribers,
            buffer: VecDeque::new(),
            preempted: Vec::new(),
            resume: None,
            turn: None,
            next_index: 0,
            stop: StopState::default(),
            idle_epoch: 0,
            idle_armed: None,
            await_input: false,
            detached: false,
            record_stale: false,
            counters: ExitCounters::default(),
            exit: None,
            sync_seq: 0,
            unsynced: VecDeque::new(),
            sync_tasks: VecDeque::new(),
            final_exit: None,
            exited: false,
            load_error: None,
            created_at_ms: now_ms(),
            span,
        };
        if state.persists() && state.config.load_record {
            let span = state.span.clone();
            load_record(&mut state, args.preloaded)
                .instrument(span)
                .await;
        }
        Ok(state)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        async {
            if let Some(e) = state.load_error.clone() {
                // S18: a failed load leaves the record as it was and reports the error.
                tracing::error!(error = %e, "loading the session record failed");
                state.exit = Some(PendingExit {
                    reason: ExitReason::Failed(e.to_string()),
                    failure: Some(FailureKind::Record),
                    interrupted: Vec::new(),
                    turn_index: 0,
                    state: None,
                });
            }
            boundary(&myself, state).await;
        }
        .instrument(span)
        .await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        // Boxed: ractor keeps each actor's message loop in one allocation sized for the
        // largest `handle` future; inlining every branch made that ~5 KiB per session
        // (B2). One small allocation per message keeps idle sessions small.
        Box::pin(handle_msg(&myself, msg, state).instrument(span)).await;
        Ok(())
    }
}

/// Loads the record and seeds the buffer or the resume turn (S17). Errors are kept for
/// `post_start`, which ends the session without touching the record (S18).
async fn load_record<A: Agent>(
    state: &mut LoopState<A>,
    preloaded: Option<SessionRecord<A::Item>>,
) {
    let Some(store) = state.store.clone() else {
        return;
    };
    let id = state.config.id.clone();
    let loaded = match preloaded.filter(|r| r.session_id == id) {
        Some(r) => Ok(Some(r)),
        None => store.load(&id).await,
    };
    let record = match loaded {
        Ok(Some(r)) => {
            state.record_stale = true;
            r
        }
        Ok(None) => return,
        Err(e) => {
            state.load_error = Some(e);
            return;
        }
    };
    if let Err(e) = check_resumable(state, &*store, &record).await {
        state.load_error = Some(e);
        return;
    }
    if record.status == SessionStatus::Completed {
        // A finished session: this run starts afresh under the id. Its final record
        // goes, or every `sync` write of the new run would be refused as overwriting a
        // final record and no push could be acknowledged (S16a). A `Completed` record
        // that still lists items (written by an older version) hands them to this run
        // first, like a `Stopped` one: they are never dropped with the record (S18).
        let holds_items = !record.unhandled_items.is_empty()
            || !record.interrupted_items.is_empty()
            || record.state.is_some();
        if !holds_items {
            match store.delete(&id).await {
                Ok(_) => state.record_stale = false,
                Err(e) => {
                    // Every `sync` write would be refused: refuse the start instead.
                    state.load_error = Some(e);
                }
            }
            return;
        }
        // Its items stay durable: the record becomes `Stopped` (not final, so this
        // run's writes replace it) rather than being deleted first.
        match store
            .cas_status(
                &id,
                vec![crate::store::StatusKind::Completed],
                SessionStatus::Stopped,
            )
            .await
        {
            Ok(crate::store::CasOutcome::Swapped(_)) => {}
            Ok(other) => {
                state.load_error = Some(StoreError::Refused {
                    session: id.clone(),
                    status: format!("{other:?}"),
                    why: "its Completed record changed while it was loaded; spawn it again".into(),
                });
                return;
            }
            Err(e) => {
                state.load_error = Some(e);
                return;
            }
        }
    }
    let resume_state = match &record.state {
        Some(bytes) => match codec::decode_state::<A::State>(&id, bytes) {
            Ok(s) => Some(s),
            Err(e) => {
                state.load_error = Some(e);
                return;
            }
        },
        None => None,
    };
    state.created_at_ms = record.created_at_ms;
    state.next_index = record.turn_index;
    state.buffer.extend(record.unhandled_items);
    if resume_state.is_some() || !record.interrupted_items.is_empty() {
        tracing::info!(
            turn = record.turn_index,
            items = record.interrupted_items.len(),
            "resuming a cut turn"
        );
        state.resume = Some(ResumeSeed {
            items: record.interrupted_items,
            state: resume_state,
        });
    }
}

/// S19: a record may be resumed unless it is `Canceled`, `Failed`, or `Running` under
/// another live owner (fresh heartbeat). A `Running` record whose owner's heartbeat is
/// stale (the process died) is recoverable, and so is one this instance owns.
async fn check_resumable<A: Agent>(
    state: &LoopState<A>,
    store: &dyn CheckpointStore<A::Item>,
    record: &SessionRecord<A::Item>,
) -> Result<(), StoreError> {
    let refuse = |why: String| StoreError::Refused {
        session: record.session_id.clone(),
        status: record.status.to_string(),
        why,
    };
    match &record.status {
        SessionStatus::Canceled => Err(refuse("it was canceled".into())),
        SessionStatus::Failed(e) => Err(refuse(format!("it failed: {e}"))),
        SessionStatus::Running => {
            let Some(owner) = record.owner.as_deref() else {
                return Ok(()); // no owner recorded: nothing can hold it
            };
            if state.config.owner.as_deref() == Some(owner) {
                return Ok(());
            }
            let beat = store.heartbeat(owner).await?.unwrap_or(record.heartbeat_ms);
            let age_ms = now_ms().saturating_sub(beat);
            if lease::is_fresh(beat, now_ms(), state.config.lease_timeout) {
                Err(refuse(format!(
                    "it is running on instance `{owner}`, whose heartbeat is {age_ms} ms old \
                     (fresh under the {} ms lease); stop it there, or wait for the lease to expire \
                     if that process is gone",
                    state.config.lease_timeout.as_millis()
                )))
            } else {
                tracing::info!(
                    owner,
                    age_ms,
                    "recovering a session whose owner's heartbeat is stale"
                );
                Ok(())
            }
        }
        SessionStatus::Stopped | SessionStatus::Interrupted | SessionStatus::Completed => Ok(()),
    }
}

async fn handle_msg<A: Agent>(
    myself: &Myself<A>,
    msg: TurnLoopMsg<A::Item, A::Event>,
    state: &mut LoopState<A>,
) {
    match msg {
        TurnLoopMsg::Push {
            item,
            options,
            reply,
        } => on_push(myself, state, item, options, reply).await,
        TurnLoopMsg::Stop { options, reply } => on_stop(myself, state, options, reply).await,
        TurnLoopMsg::Subscribe {
            capacity,
            filter,
            reply,
        } => {
            let _ = reply.send(state.subscribers.subscribe(capacity, filter));
        }
        TurnLoopMsg::Inspect { reply } => {
            let _ = reply.send(state.info());
        }
        TurnLoopMsg::Detach { reply } => on_detach(myself, state, reply).await,
        TurnLoopMsg::Internal(Internal(msg)) => match msg {
            InternalMsg::TurnFinished { turn } => on_turn_finished(myself, state, turn).await,
            InternalMsg::PreemptDue {
                turn,
                preempt,
                reply,
            } => on_preempt_due(state, turn, preempt, reply),
            InternalMsg::Synced { seq, result } => on_synced(myself, state, seq, result).await,
            InternalMsg::PollRecord => on_poll(myself, state).await,
            InternalMsg::SafePointReached { turn } => {
                if state.syncs() && state.turn.as_ref().is_some_and(|t| t.index == turn) {
                    sync_write(myself, state);
                }
            }
            InternalMsg::IdleDue { epoch } => {
                let idle = state.turn.is_none()
                    && state.buffer.is_empty()
                    && state.preempted.is_empty()
                    && state.resume.is_none();
                if epoch == state.idle_epoch && idle && !state.exited && state.exit.is_none() {
                    tracing::info!("idle long enough; exiting (until_idle_for)");
                    teardown(
                        myself,
                        state,
                        ExitReason::Completed,
                        None,
                        Vec::new(),
                        0,
                        None,
                    )
                    .await;
                }
            }
        },
    }
}

async fn on_push<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    item: A::Item,
    options: PushOptions<A::Item>,
    reply: Option<PushReply<A::Item>>,
) {
    let mut options = options;
    if let Some(guard) = options.unprocessed.take() {
        // The message is being processed: from here on the actor accounts for the item.
        guard.disarm();
    }
    if state.exited || state.stop.committed || state.exit.is_some() {
        state.reject_late(item, reply);
        return;
    }
    // S9: a strategy sees exactly the turn this push lands on. It runs on a copy of the
    // turn's items (never under the turn's lock) and a panic in it refuses the push
    // instead of killing the session.
    let preempt = match &options.strategy {
        Some(strategy) => {
            let (index, phase, consumed) = match &state.turn {
                Some(t) => {
                    let (phase, consumed) = t.control.phase_and_consumed();
                    let phase = match phase {
                        Phase::Planning => TurnPhase::Planning,
                        Phase::Running => TurnPhase::Running,
                        Phase::Ended => TurnPhase::Idle,
                    };
                    (Some(t.index), phase, consumed)
                }
                None => (None, TurnPhase::Idle, Vec::new()),
            };
            let view = TurnView {
                index,
                phase,
                consumed: &consumed,
            };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| strategy(&view))) {
                Ok(p) => p,
                Err(_) => {
                    state.reject_invalid(
                        item,
                        crate::options::OptionsError::StrategyPanicked,
                        reply,
                    );
                    return;
                }
            }
        }
        None => options.preempt,
    };
    if let Some(p) = &preempt {
        if let Err(error) = p.validate() {
            state.reject_invalid(item, error, reply);
            return;
        }
    }
    state.await_input = false;
    state.counters.items_accepted += 1;
    state.buffer.push_back(item);
    state.idle_epoch += 1;
    let target = state
        .turn
        .as_ref()
        .filter(|t| t.control.phase() != Phase::Ended)
        .map(|t| t.index);
    if state.syncs() {
        // S16a: answered (and its preempt applied) once the write holding it is flushed.
        let seq = sync_write(myself, state);
        state.unsynced.push_back(UnsyncedPush {
            seq,
            reply,
            preempt,
            target,
        });
    } else {
        apply_preempt(myself, state, preempt, target, reply);
    }
    if state.turn.is_none() {
        boundary(myself, state).await;
    }
}

/// S23: hands the session to the background: the record becomes `Running` with the
/// in-flight and queued items in order (answered once durable), the session drains,
/// and it polls its own record so a cancel written elsewhere is honoured (S24).
async fn on_detach<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    reply: RpcReplyPort<Result<(), crate::error::SessionError>>,
) {
    use crate::error::SessionError;
    if state.exited || state.exit.is_some() {
        let _ = reply.send(Err(SessionError::Exited(state.config.id.clone())));
        return;
    }
    let Some(store) = state.store.clone().filter(|_| state.persists()) else {
        let _ = reply.send(Err(SessionError::DetachNeedsStore(state.config.id.clone())));
        return;
    };
    if state.detached {
        let _ = reply.send(Ok(()));
        return;
    }
    state.detached = true;
    state
        .shared
        .detached
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // Issued before the drain commits, so it lists everything accepted so far.
    let write = match live_record(state) {
        Ok(rec) => store.save_live(rec),
        Err(e) => Box::pin(std::future::ready(Err(e))),
    };
    if let StopEffect::Commit { newly: true, .. } = state.stop.apply(&StopOptions::drain()) {
        state.shared.fire_stopped();
    }
    spawn_timer::<A>(myself, state.config.poll_interval, InternalMsg::PollRecord);
    tracing::info!("session detached: it drains in the background");
    let _ = reply.send(write.await.map_err(SessionError::from));
    if state.turn.is_none() {
        boundary(myself, state).await;
    }
}

/// S24: a background session re-reads its record; a `Canceled` status written by
/// anyone (another process included) stops it Immediate.
async fn on_poll<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>) {
    if state.exited || !state.detached {
        return;
    }
    if let Some(store) = state.store.clone() {
        if let Ok(Some(rec)) = store.load(&state.config.id).await {
            if rec.status == SessionStatus::Canceled {
                tracing::info!("the record says Canceled: stopping");
                let mut cancel = StopOptions::immediate().cause("canceled");
                cancel.canceled = true;
                on_stop(myself, state, cancel, None).await;
                return;
            }
        }
    }
    spawn_timer::<A>(myself, state.config.poll_interval, InternalMsg::PollRecord);
}

/// Applies a push's preempt to the turn it targeted when the push was accepted, and
/// answers the push (S7).
fn apply_preempt<A: Agent>(
    myself: &Myself<A>,
    state: &LoopState<A>,
    preempt: Option<Preempt>,
    target: Option<u64>,
    reply: Option<PushReply<A::Item>>,
) {
    let Some(p) = preempt else {
        if let Some(r) = reply {
            let _ = r.send(Ok(PreemptAck::NotRequested));
        }
        return;
    };
    let Some(turn) = target else {
        if let Some(r) = reply {
            let _ = r.send(Ok(PreemptAck::NoTarget));
        }
        return;
    };
    let reply = reply.map(|r| PendingAck::new(r, turn));
    match (state.turn.as_ref().filter(|t| t.index == turn), p.delay) {
        (Some(_), Some(delay)) => spawn_timer::<A>(
            myself,
            delay,
            InternalMsg::PreemptDue {
                turn,
                preempt: Preempt { delay: None, ..p },
                reply,
            },
        ),
        (Some(t), None) => submit_preempt(t, p, reply),
        // The target ended while the push waited for its write.
        (None, _) => {
            if let Some(r) = reply {
                r.answer(PreemptAck::TargetEnded { turn });
            }
        }
    }
}

/// `sync` durability: rewrites the record with everything the session holds now.
/// Returns the write's sequence number; `Synced` reports its completion.
fn sync_write<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>) -> u64 {
    state.sync_seq += 1;
    let seq = state.sync_seq;
    let Some(store) = state.store.clone() else {
        return seq;
    };
    // Conditional: never overwrites a record already final (a cancel, a finalizer).
    let write = match live_record(state) {
        Ok(rec) => store.save_live(rec),
        Err(e) => Box::pin(std::future::ready(Err(e))),
    };
    let myself = myself.clone();
    let task = tokio::spawn(async move {
        let result = write.await;
        let _ = myself.send_message(TurnLoopMsg::Internal(Internal(InternalMsg::Synced {
            seq,
            result: result.clone(),
        })));
        result
    });
    state.sync_tasks.push_back((seq, task));
    seq
}

/// The `Running` record of a live session: the cut-turn fields describe the turn in
/// flight (so a crash resumes it), everything else waiting is unhandled, in order.
fn live_record<A: Agent>(state: &LoopState<A>) -> Result<SessionRecord<A::Item>, StoreError> {
    let mut unhandled = Vec::new();
    let mut interrupted = Vec::new();
    let mut mid_state = None;
    let mut turn_index = state.next_index;
    if let Some(seed) = &state.resume {
        interrupted = seed.items.clone();
        mid_state = seed.state.clone();
    }
    if let Some(t) = &state.turn {
        // The turn's index until it is known to be done: a resume turn still planning
        // is its seed (S17), any other planning turn holds its offered items.
        turn_index = t.index;
        match t.control.live() {
            LiveTurn::Planning if t.is_resume => {
                interrupted = t.offered.clone();
                mid_state = t.input_state.clone();
            }
            LiveTurn::Planning => unhandled.extend(t.offered.iter().cloned()),
            LiveTurn::Cut {
                consumed,
                remaining,
                state: last,
            } => {
                interrupted = consumed;
                mid_state = last;
                unhandled.extend(remaining);
            }
            LiveTurn::Done { remaining } => {
                turn_index = t.index + 1;
                unhandled.extend(remaining);
            }
            LiveTurn::Requeued {
                consumed,
                remaining,
            } => {
                turn_index = t.index + 1;
                unhandled.extend(consumed);
                unhandled.extend(remaining);
            }
        }
    }
    unhandled.extend(state.preempted.iter().cloned());
    unhandled.extend(state.buffer.iter().cloned());
    let encoded = match &mid_state {
        Some(s) => Some(codec::encode_state(&state.config.id, s)?),
        None => None,
    };
    Ok(record(
        state,
        SessionStatus::Running,
        turn_index,
        unhandled,
        interrupted,
        encoded,
    ))
}

/// `sync` durability: a write finished; answer the pushes it covers (S16a).
async fn on_synced<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    seq: u64,
    result: Result<(), StoreError>,
) {
    if let Err(StoreError::Final { status, .. }) = &result {
        // Someone finalized the record (cancel by id, another process): honour it.
        if *status == SessionStatus::Canceled && !state.stop.canceled && !state.exited {
            tracing::info!("the record was canceled elsewhere: stopping");
            let mut cancel = StopOptions::immediate().cause("canceled");
            cancel.canceled = true;
            on_stop(myself, state, cancel, None).await;
        }
    } else if let Err(e) = &result {
        tracing::error!(seq, error = %e, "sync checkpoint write failed");
    }
    while state.sync_tasks.front().is_some_and(|(s, _)| *s <= seq) {
        state.sync_tasks.pop_front();
    }
    // Writes complete in order (the store's ordering contract), so a push whose write is
    // `seq` is answered by this result, and earlier ones were answered by theirs.
    while state.unsynced.front().is_some_and(|u| u.seq <= seq) {
        let Some(u) = state.unsynced.pop_front() else {
            break;
        };
        match &result {
            Ok(()) => apply_preempt(myself, state, u.preempt, u.target, u.reply),
            Err(e) => {
                if let Some(r) = u.reply {
                    let _ = r.send(Err(PushError::NotDurable {
                        error: e.to_string(),
                    }));
                }
            }
        }
    }
}

/// Answers every push still waiting for its write, each with its own write's result:
/// called at teardown, which awaits the outstanding writes (the loop is over, so no
/// preempt is left to apply).
async fn settle_unsynced<A: Agent>(state: &mut LoopState<A>) {
    let mut results = std::collections::HashMap::new();
    for (seq, task) in std::mem::take(&mut state.sync_tasks) {
        let r = task.await.unwrap_or_else(|e| {
            Err(StoreError::Backend {
                operation: "save",
                session: state.config.id.clone(),
                message: format!("the write task failed: {e}"),
            })
        });
        results.insert(seq, r);
    }
    for u in std::mem::take(&mut state.unsynced) {
        let result = results.remove(&u.seq).unwrap_or(Ok(()));
        answer_push(u, result);
    }
}

/// Answers one push that waited for its write, after the loop is over.
fn answer_push<I>(u: UnsyncedPush<I>, result: Result<(), StoreError>) {
    let Some(r) = u.reply else {
        return;
    };
    let _ = r.send(match result {
        Ok(()) => Ok(match (u.preempt, u.target) {
            (None, _) => PreemptAck::NotRequested,
            (Some(_), None) => PreemptAck::NoTarget,
            (Some(_), Some(turn)) => PreemptAck::TargetEnded { turn },
        }),
        Err(e) => Err(PushError::NotDurable {
            error: e.to_string(),
        }),
    });
}

/// Answers every waiting push with `NotDurable`: the actor is dying and cannot learn
/// its writes' results (the items are in the exit state).
fn abandon_unsynced<A: Agent>(state: &mut LoopState<A>, why: &str) {
    for u in std::mem::take(&mut state.unsynced) {
        answer_push(
            u,
            Err(StoreError::Backend {
                operation: "save",
                session: state.config.id.clone(),
                message: why.to_string(),
            }),
        );
    }
}

/// Submits a preempt to its target turn and answers the push (S7).
fn submit_preempt<A: Agent>(t: &ActiveTurn<A>, p: Preempt, reply: Option<PendingAck<A::Item>>) {
    let turn = t.index;
    let (submitted, reply) =
        t.control
            .submit(p.cancel_request(), Origin::Preempt, Instant::now(), reply);
    let ack = match submitted {
        Submitted::Active => {
            tracing::debug!(turn, at = %p.at, "preempt submitted");
            PreemptAck::Submitted { turn }
        }
        // Held by the control block; answered when the turn starts or ends planning.
        Submitted::Pending => return,
        Submitted::TurnEnded => PreemptAck::TargetEnded { turn },
    };
    if let Some(r) = reply {
        r.answer(ack);
    }
}

fn on_preempt_due<A: Agent>(
    state: &mut LoopState<A>,
    turn: u64,
    preempt: Preempt,
    reply: Option<PendingAck<A::Item>>,
) {
    match state.turn.as_ref().filter(|t| t.index == turn) {
        Some(t) if !state.exited => submit_preempt(t, preempt, reply),
        _ => {
            // S7: a delayed preempt whose target has ended does nothing.
            tracing::debug!(turn, "delayed preempt found its target ended");
            if let Some(r) = reply {
                r.answer(PreemptAck::TargetEnded { turn });
            }
        }
    }
}

async fn on_stop<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    options: StopOptions,
    reply: Option<RpcReplyPort<Result<(), crate::options::OptionsError>>>,
) {
    if let Err(e) = options.validate() {
        if let Some(r) = reply {
            let _ = r.send(Err(e));
        }
        return;
    }
    if state.exited {
        // Idempotent: a stop on an exited session is a no-op.
        if let Some(r) = reply {
            let _ = r.send(Ok(()));
        }
        return;
    }
    state.shared.offer_cause(options.cause.as_deref());
    let effect = state.stop.apply(&options);
    let skipped = state.subscribers.try_send(SessionEvent::StopRequested {
        cancel: if options.is_idle_only() {
            None
        } else {
            options.cancel.map(|c| c.mode)
        },
        cause: options.cause.clone(),
    });
    if skipped > 0 {
        tracing::debug!(
            skipped,
            "StopRequested skipped for subscribers with a full buffer"
        );
    }
    tracing::info!(?options, ?effect, "stop requested");
    match effect {
        StopEffect::IdleOnly => {
            if state.turn.is_none() {
                boundary(myself, state).await;
            }
        }
        StopEffect::Commit { cancel, newly } => {
            if newly {
                state.shared.fire_stopped();
            }
            match &state.turn {
                Some(t) => {
                    // S6: a committing stop (not drain) aborts a planning turn; its
                    // offered items go back in order when the task reports.
                    let aborted =
                        !state.stop.drain && !t.is_resume && t.control.abort_planning(cancel);
                    if !aborted {
                        if let Some(c) = cancel {
                            let _ = t.control.submit(c, Origin::Stop, Instant::now(), None);
                        }
                    }
                }
                None => boundary(myself, state).await,
            }
        }
    }
    if let Some(r) = reply {
        let _ = r.send(Ok(()));
    }
}

async fn on_turn_finished<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>, turn: u64) {
    let Some(active) = state.turn.take_if(|t| t.index == turn) else {
        return;
    };
    let Some((ending, remaining, dropped)) = active.control.take_ending() else {
        state.exit = Some(PendingExit {
            reason: ExitReason::Failed("turn task ended without reporting how".into()),
            failure: Some(FailureKind::Internal),
            interrupted: active.offered,
            turn_index: active.index,
            state: None,
        });
        boundary(myself, state).await;
        return;
    };
    match ending {
        Ending::Deferred => {
            // The plan consumed nothing: what it handed back waits for new input. Items
            // pushed while it planned are new input it never saw: plan again for them.
            let arrived_while_planning = !state.buffer.is_empty();
            for item in remaining.into_iter().rev() {
                state.buffer.push_front(item);
            }
            if dropped > 0 {
                state.counters.items_dropped_by_plan += dropped;
                tracing::info!(turn, dropped, "items dropped by the plan's decision");
            }
            tracing::debug!(
                turn,
                arrived_while_planning,
                "the plan consumed nothing; waiting for new input"
            );
            state.await_input = !arrived_while_planning;
        }
        Ending::PlanAborted {
            reason,
            plan_failed,
        } => {
            // S6: back to the front in their original push order, whatever the plan did.
            tracing::info!(turn, %reason, "turn aborted while planning; offered items restored");
            if active.is_resume {
                state.resume = Some(ResumeSeed {
                    items: active.offered,
                    state: active.input_state,
                });
            } else {
                let mut offered = active.offered;
                let rest = offered.split_off(active.offered_preempted);
                state.preempted = offered;
                for item in rest.into_iter().rev() {
                    state.buffer.push_front(item);
                }
            }
            if plan_failed.is_some() {
                state.exit = Some(PendingExit {
                    reason: ExitReason::Failed(reason),
                    failure: plan_failed,
                    interrupted: Vec::new(),
                    turn_index: turn,
                    state: None,
                });
            }
        }
        Ending::Ran {
            end,
            consumed,
            resume_state,
            failure,
        } => {
            for item in remaining.into_iter().rev() {
                state.buffer.push_front(item);
            }
            if dropped > 0 {
                state.counters.items_dropped_by_plan += dropped;
                tracing::info!(turn, dropped, "items dropped by the plan's decision");
            }
            tracing::debug!(turn, outcome = ?end, "turn ended");
            match end {
                TurnEnd::Completed => {
                    state.counters.turns_completed += 1;
                    state.counters.items_delivered += consumed.len() as u64;
                    if state.record_stale && state.persists() && !state.syncs() {
                        replace_stale_record(state).await;
                    }
                }
                TurnEnd::Preempted(_) => {
                    // S8: no exit reason, no checkpoint, no interrupted items.
                    state.counters.turns_preempted += 1;
                    state.preempted = consumed;
                }
                TurnEnd::Canceled(info) => {
                    let reason = if state.stop.shutdown {
                        ExitReason::Shutdown
                    } else {
                        ExitReason::Canceled(info)
                    };
                    state.exit = Some(PendingExit {
                        reason,
                        failure: None,
                        interrupted: consumed,
                        turn_index: turn,
                        state: resume_state,
                    });
                }
                TurnEnd::Interrupted(info) => {
                    state.exit = Some(PendingExit {
                        reason: ExitReason::Interrupted(info),
                        failure: None,
                        interrupted: consumed,
                        turn_index: turn,
                        state: resume_state,
                    });
                }
                TurnEnd::Failed(e) => {
                    tracing::warn!(turn, error = %e, "turn failed");
                    state.exit = Some(PendingExit {
                        reason: ExitReason::Failed(e),
                        failure,
                        interrupted: consumed,
                        turn_index: turn,
                        state: None,
                    });
                }
                TurnEnd::PlanAborted(_) => {}
            }
        }
    }
    // S16a: the turn's end is on record before the next turn starts (unless the
    // session is about to exit: teardown writes the final record).
    let exiting = state.exit.is_some() || (state.stop.committed && !state.stop.drain);
    if state.syncs() && !exiting {
        sync_write(myself, state);
    }
    boundary(myself, state).await;
}

/// S17: once a turn completed after the record was loaded, the record is stale (a
/// resumed turn's state, or items since delivered): replace it with what the session
/// still holds, or delete it when nothing is left, so the same state is never resumed
/// twice and a later failure (which leaves the record alone, S18) cannot replay
/// delivered items.
async fn replace_stale_record<A: Agent>(state: &mut LoopState<A>) {
    let Some(store) = state.store.clone() else {
        return;
    };
    let nothing_left = state.buffer.is_empty() && state.preempted.is_empty();
    let result = if nothing_left {
        store.delete(&state.config.id).await.map(|_| ())
    } else {
        let mut unhandled = state.preempted.clone();
        unhandled.extend(state.buffer.iter().cloned());
        // Conditional: never over a cancel that landed meanwhile (S24).
        store
            .save_live(record(
                state,
                SessionStatus::Running,
                state.next_index,
                unhandled,
                Vec::new(),
                None,
            ))
            .await
    };
    match result {
        Ok(()) => state.record_stale = !nothing_left,
        Err(StoreError::Final { status, .. }) => {
            tracing::info!(%status, "the record became final; left as it is");
            state.record_stale = false;
        }
        Err(e) => {
            tracing::error!(error = %e, "replacing the stale record failed; it may be resumed again")
        }
    }
}

fn record<A: Agent>(
    state: &LoopState<A>,
    status: SessionStatus,
    turn_index: u64,
    unhandled: Vec<A::Item>,
    interrupted: Vec<A::Item>,
    encoded_state: Option<Vec<u8>>,
) -> SessionRecord<A::Item> {
    let now = now_ms();
    SessionRecord {
        session_id: state.config.id.clone(),
        agent_kind: state.config.agent_kind.clone(),
        agent_config: state.config.agent_config.clone(),
        status,
        turn_index,
        unhandled_items: unhandled,
        interrupted_items: interrupted,
        state: encoded_state,
        stop_cause: state.shared.cause(),
        last_error: None,
        owner: state.config.owner.clone(),
        heartbeat_ms: now,
        created_at_ms: state.created_at_ms,
        updated_at_ms: now,
        version: 0,
        lease_epoch: 0,
    }
}

/// What happens at a turn boundary: exit, start the next turn, or go idle.
async fn boundary<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>) {
    if state.exited || state.turn.is_some() {
        return;
    }
    if let Some(exit) = state.exit.take() {
        teardown(
            myself,
            state,
            exit.reason,
            exit.failure,
            exit.interrupted,
            exit.turn_index,
            exit.state,
        )
        .await;
        return;
    }
    // After a plan that consumed nothing, only a new push makes another plan worth it.
    let has_work = !state.await_input
        && (state.resume.is_some() || !state.preempted.is_empty() || !state.buffer.is_empty());
    if state.stop.committed && !(state.stop.drain && has_work) {
        // Bare/graceful/immediate stop at a boundary, or a drain with nothing it can
        // still finish.
        let reason = if state.stop.shutdown {
            ExitReason::Shutdown
        } else {
            ExitReason::Completed
        };
        teardown(myself, state, reason, None, Vec::new(), 0, None).await;
        return;
    }
    if has_work {
        start_turn(myself, state);
        return;
    }
    // Idle: one timer per idle period (a second until_idle_for must not postpone the
    // exit); every accepted push bumps the epoch, which voids the armed timer.
    if let Some(d) = state.stop.idle_for {
        if state.idle_armed != Some(state.idle_epoch) {
            state.idle_armed = Some(state.idle_epoch);
            spawn_timer::<A>(
                myself,
                d,
                InternalMsg::IdleDue {
                    epoch: state.idle_epoch,
                },
            );
        }
    }
}

fn start_turn<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>) {
    let index = state.next_index;
    state.next_index += 1;
    let (work, offered, offered_preempted, is_resume, input_state) = match state.resume.take() {
        Some(seed) => (
            TurnWork::Resume {
                items: seed.items.clone(),
                state: seed.state.clone(),
            },
            seed.items,
            0,
            true,
            seed.state,
        ),
        None => {
            let preempted = std::mem::take(&mut state.preempted);
            let buffered: Vec<A::Item> = state.buffer.drain(..).collect();
            let n_pre = preempted.len();
            let mut offered = preempted.clone();
            offered.extend(buffered.iter().cloned());
            (
                TurnWork::Plan(PlanInput {
                    turn_index: index,
                    preempted,
                    buffered,
                }),
                offered,
                n_pre,
                false,
                None,
            )
        }
    };
    let control = Arc::new(TurnControl::new(index, input_state.clone()));
    let cx = TurnCx::<A> {
        turn: index,
        session: state.shared.clone(),
        control: control.clone(),
        subscribers: state.subscribers.clone(),
        stopped: state.shared.stopped_signal(),
        sync_notify: state.syncs().then(|| myself.clone()),
    };
    let task = TurnTask {
        agent: state.agent.clone(),
        control: control.clone(),
        cx,
        subscribers: state.subscribers.clone(),
        myself: myself.clone(),
        work,
    };
    let span = tracing::info_span!(parent: &state.span, "turn", index, resume = is_resume);
    // The task always reports: a panic that escapes the agent's guarded futures (e.g.
    // in a future's destructor) is recorded as the turn's failure, so the session never
    // waits for a turn that is gone. Boxed: the future is large, and spawning it by
    // value copies it around.
    let guarded = {
        let control = control.clone();
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
                let _ = myself.send_message(TurnLoopMsg::Internal(Internal(
                    InternalMsg::TurnFinished { turn: index },
                )));
            }
        }
    };
    let handle = tokio::spawn(Box::pin(guarded.instrument(span)));
    state.turn = Some(ActiveTurn {
        index,
        control,
        offered,
        offered_preempted,
        is_resume,
        input_state,
        task: handle.abort_handle(),
    });
}

/// S21 teardown: final checkpoint → session-end hooks → `Ended` → stream close →
/// actor exit (drain, so queued messages are answered).
#[allow(clippy::too_many_arguments)]
async fn teardown<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    reason: ExitReason,
    failure: Option<FailureKind>,
    interrupted: Vec<A::Item>,
    cut_turn_index: u64,
    mid_state: Option<A::State>,
) {
    let mut unhandled = std::mem::take(&mut state.preempted);
    unhandled.extend(state.buffer.drain(..));
    let (mut interrupted, mut mid_state, mut cut_turn_index) =
        (interrupted, mid_state, cut_turn_index);
    if let Some(seed) = state.resume.take() {
        // A resume turn that never ran is still the cut turn to resume (S17): keep its
        // items and state as they were loaded. (Only a load-failed exit has no cut
        // turn of its own here, and that one leaves the record untouched anyway.)
        if interrupted.is_empty() && mid_state.is_none() {
            interrupted = seed.items;
            mid_state = seed.state;
            cut_turn_index = state.next_index;
        } else {
            let mut items = seed.items;
            items.extend(unhandled);
            unhandled = items;
        }
    }
    // Invariant: from here until it is published, the exit state lives in
    // `state.final_exit`, so an actor killed during the awaits below (store, hooks)
    // still hands every item back from its destructor.
    state.final_exit = Some(ExitState {
        session_id: state.config.id.clone(),
        reason: reason.clone(),
        failure,
        stop_cause: state.shared.cause(),
        unhandled_items: unhandled.clone(),
        interrupted_items: interrupted.clone(),
        late_items: state.shared.late_snapshot(),
        has_mid_turn_state: mid_state.is_some(),
        checkpoint: CheckpointOutcome::NotAttempted,
        counters: state.counters,
        next_turn_index: state.next_index,
    });
    let checkpoint = final_checkpoint(
        state,
        &reason,
        &unhandled,
        &interrupted,
        cut_turn_index,
        &mid_state,
    )
    .await;
    drop((unhandled, interrupted));
    // Each push waiting for its write is answered with that write's own result.
    settle_unsynced(state).await;
    let summary = match state.final_exit.as_mut() {
        Some(exit) => {
            exit.checkpoint = checkpoint;
            exit.summary()
        }
        None => return, // unreachable: set above and only taken below
    };
    tracing::info!(reason = ?summary.reason, cause = ?summary.stop_cause, checkpoint = ?summary.checkpoint,
        unhandled = summary.unhandled, interrupted = summary.interrupted, "session ended");
    run_end_hooks(state, &summary).await;
    if let Some(exit) = state.final_exit.take() {
        state.exited = true;
        state.shared.fire_stopped();
        state.shared.publish_exit(exit);
    }
    state.subscribers.end(summary);
    // Process what is already queued (pushes become late, with their items handed
    // back), then stop; later sends are refused with the message handed back.
    let _ = myself.drain();
}

/// S16: save when the exit was caused by a stop, an interrupt or shutdown, something is
/// left to resume and skip_checkpoint is not set; otherwise delete a stale record. A
/// failure (of the load, the plan or the turn) leaves the record as it was (S18).
async fn final_checkpoint<A: Agent>(
    state: &mut LoopState<A>,
    reason: &ExitReason,
    unhandled: &[A::Item],
    interrupted: &[A::Item],
    cut_turn_index: u64,
    mid_state: &Option<A::State>,
) -> CheckpointOutcome {
    if !state.persists() || state.load_error.is_some() {
        // No store, or a record this run must not touch (S18).
        return CheckpointOutcome::NotAttempted;
    }
    let Some(store) = state.store.clone() else {
        return CheckpointOutcome::NotAttempted;
    };
    let encode_mid = |mid: &Option<A::State>| match mid {
        Some(s) => codec::encode_state(&state.config.id, s).map(Some),
        None => Ok(None),
    };
    let turn_index = if interrupted.is_empty() && mid_state.is_none() {
        state.next_index
    } else {
        cut_turn_index
    };
    if state.stop.canceled {
        // S24: `cancel(id)` flipped the record to `Canceled`, a terminal status nobody
        // else writes. It is rewritten with what the session holds at its end, so it
        // never lists an item a turn delivered after the record was last written (S10);
        // a session canceled without a record gets none.
        return match store.load(&state.config.id).await {
            // Canceled (ours to rewrite), or not final: a write that raced the cancel
            // put a live status back, and the cancel must still win (S24).
            Ok(Some(rec)) if rec.status == SessionStatus::Canceled || !rec.status.is_terminal() => {
                let was_canceled = rec.status == SessionStatus::Canceled;
                let encoded = match encode_mid(mid_state) {
                    Ok(b) => b,
                    Err(e) => return CheckpointOutcome::Failed(e.to_string()),
                };
                let rec = record(
                    state,
                    SessionStatus::Canceled,
                    turn_index,
                    unhandled.to_vec(),
                    interrupted.to_vec(),
                    encoded,
                );
                let write = if was_canceled {
                    store.save(rec)
                } else {
                    store.save_live(rec)
                };
                match write.await {
                    Ok(()) => CheckpointOutcome::Saved,
                    Err(e) => CheckpointOutcome::Failed(e.to_string()),
                }
            }
            Ok(_) => CheckpointOutcome::NotAttempted,
            Err(e) => CheckpointOutcome::Failed(e.to_string()),
        };
    }
    if state.detached && !state.stop.shutdown {
        if matches!(reason, ExitReason::Failed(_)) && state.config.supervised {
            // S26: the supervisor restarts the session from this record (and detaches
            // the new incarnation again) or marks it `Failed`; a final status here
            // would refuse the restart's writes.
            return CheckpointOutcome::NotAttempted;
        }
        // S23: a background session's record is finalized by a conditional write (it
        // never overwrites a final record), so a cancel that landed first wins over
        // this finalizer. The final record lists what the session still holds at its
        // end, not what it held when it was detached: a drained session's record
        // names no item its turns already delivered (S10).
        // A drain that could not finish everything (its plan deferred items) leaves
        // them resumable: `Stopped`, not a final `Completed` that lists items (S18).
        let left = !unhandled.is_empty() || !interrupted.is_empty() || mid_state.is_some();
        let to = match reason {
            ExitReason::Failed(e) => SessionStatus::Failed(e.clone()),
            ExitReason::Canceled(_) => SessionStatus::Canceled,
            _ if left => SessionStatus::Stopped,
            _ => SessionStatus::Completed,
        };
        let encoded = match encode_mid(mid_state) {
            Ok(b) => b,
            Err(e) => return CheckpointOutcome::Failed(e.to_string()),
        };
        let last_error = match &to {
            SessionStatus::Failed(e) => Some(e.clone()),
            _ => None,
        };
        let mut rec = record(
            state,
            to,
            turn_index,
            unhandled.to_vec(),
            interrupted.to_vec(),
            encoded,
        );
        rec.last_error = last_error;
        return match store.save_live(rec).await {
            Ok(()) => CheckpointOutcome::Saved,
            Err(StoreError::Final { status, .. }) => {
                tracing::info!(
                    %status,
                    "the record was already final; the finalizer left it"
                );
                CheckpointOutcome::NotAttempted
            }
            Err(e) => CheckpointOutcome::Failed(e.to_string()),
        };
    }
    if matches!(reason, ExitReason::Failed(_)) {
        return CheckpointOutcome::NotAttempted;
    }
    let caused_by_stop = state.stop.committed
        || matches!(
            reason,
            ExitReason::Interrupted(_) | ExitReason::Shutdown | ExitReason::Canceled(_)
        );
    let left = !unhandled.is_empty() || !interrupted.is_empty() || mid_state.is_some();
    // S27: a session ended by shutdown is recorded `Interrupted` even when it holds
    // nothing, so the next start brings it back (it was alive, not finished).
    let shutdown = state.stop.shutdown || matches!(reason, ExitReason::Shutdown);
    if caused_by_stop && (left || shutdown) && !state.stop.skip_checkpoint {
        let encoded = match encode_mid(mid_state) {
            Ok(b) => b,
            Err(e) => return CheckpointOutcome::Failed(e.to_string()),
        };
        let status = if shutdown {
            SessionStatus::Interrupted
        } else {
            SessionStatus::Stopped
        };
        let rec = record(
            state,
            status,
            turn_index,
            unhandled.to_vec(),
            interrupted.to_vec(),
            encoded,
        );
        // Conditional: a cancel that landed while the session was ending wins (S24);
        // its items stay in the exit state.
        match store.save_live(rec).await {
            Ok(()) => CheckpointOutcome::Saved,
            Err(StoreError::Final { status, .. }) => {
                tracing::info!(%status, "the record became final meanwhile; the exit leaves it");
                CheckpointOutcome::NotAttempted
            }
            Err(e) => {
                tracing::error!(error = %e, "final checkpoint failed");
                CheckpointOutcome::Failed(e.to_string())
            }
        }
    } else {
        match store.delete(&state.config.id).await {
            Ok(true) => CheckpointOutcome::Deleted,
            Ok(false) => CheckpointOutcome::NotAttempted,
            Err(e) => {
                tracing::error!(error = %e, "deleting the stale record failed");
                CheckpointOutcome::Failed(e.to_string())
            }
        }
    }
}

/// S21: each hook bounded by the timeout and isolated (its own task: a panic or a hang
/// does not stop the next one).
async fn run_end_hooks<A: Agent>(state: &LoopState<A>, summary: &crate::session::ExitSummary) {
    for (i, hook) in state.config.end_hooks.iter().enumerate() {
        // The hook is called inside its task, so even a panic before its future exists
        // stays isolated from the session and from the next hook.
        let (hook, summary) = (hook.clone(), summary.clone());
        let task = tokio::spawn(async move { hook(summary).await });
        let abort = task.abort_handle();
        match tokio::time::timeout(state.config.hook_timeout, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(hook = i, error = %e, "session-end hook failed"),
            Ok(Err(e)) => tracing::warn!(hook = i, error = %e, "session-end hook panicked"),
            Err(_) => {
                abort.abort();
                tracing::warn!(hook = i, timeout = ?state.config.hook_timeout, "session-end hook timed out");
            }
        }
    }
}
