//! The TurnLoop actor: the shell around one session's core (DESIGN §1, S20, S21).
//!
//! This file is the dispatch: it turns messages into core events, hands each to the
//! core and the effects it returns to `effects` (which feeds their results back as
//! messages). Loading the record at start is `load`, the exit is `teardown`. It
//! decides nothing (every decision is in `core/`), never runs agent code (that is
//! `turn_task`) and never blocks: store calls are awaited only in `pre_start` (the
//! load) and in the teardown, and events from the actor never wait for capacity.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::Instrument;

use crate::events::Subscribers;
use crate::session::core::{Core, CoreConfig, Effects, Event};
use crate::session::effects::{perform_awaited, perform_now, Awaited};
use crate::session::load::load;
use crate::session::loop_state::{internal, LoopState, Myself};
use crate::session::messages::{Internal, InternalMsg, TurnLoopMsg};
use crate::session::session_ref::SessionRef;
use crate::session::SessionSpec;
use crate::shared::SessionShared;
use crate::store::{CheckpointStore, LoadedRecord};
use crate::turn::agent::Agent;

/// The TurnLoop actor (one per session). Spawn it through
/// [`crate::session::SessionHandle::spawn`] (`.linked(parent)` under your actor).
pub(crate) struct TurnLoop<A: Agent>(PhantomData<fn() -> A>);

impl<A: Agent> Default for TurnLoop<A> {
    fn default() -> Self {
        TurnLoop(PhantomData)
    }
}

/// What a TurnLoop is started with.
pub(crate) struct TurnLoopArgs<A: Agent> {
    pub(crate) config: SessionSpec<A::Item>,
    pub(crate) agent: Arc<A>,
    pub(crate) store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    pub(crate) shared: Arc<SessionShared<A::Item>>,
    pub(crate) subscribers: Arc<Subscribers<A::Event>>,
    /// The stored record, when the spawner already read it (the runtime's resume at
    /// start): used instead of loading it again.
    pub(crate) preloaded: Option<LoadedRecord<A::Item>>,
}

impl<A: Agent> Actor for TurnLoop<A> {
    type Msg = TurnLoopMsg<A::Item, A::Event>;
    type State = LoopState<A>;
    type Arguments = TurnLoopArgs<A>;

    // Not `async fn`s: an `async fn` here would keep its arguments (the spec, the
    // message) in every session's task beside the future it hands them to (B2). The
    // start's future is the whole of `pre_start`; `handle` decides and performs at once
    // and its future holds only what must be awaited.
    fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: TurnLoopArgs<A>,
    ) -> impl std::future::Future<Output = Result<Self::State, ActorProcessingErr>> + Send {
        start_state(SessionRef::Actor(myself), args).map(Ok)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        start(&SessionRef::Actor(myself), state).await;
        Ok(())
    }

    fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> impl std::future::Future<Output = Result<(), ActorProcessingErr>> + Send {
        // Called by ractor inside the poll it guards against panics, like the future.
        let me = SessionRef::Actor(myself);
        let rest = decide_and_perform(&me, msg, state);
        async move {
            if let Some(rest) = rest {
                let span = state.span.clone();
                Box::pin(perform_rest(&me, state, rest).instrument(span)).await;
            }
            Ok(())
        }
    }
}

/// The session's state at its start: the core, with the record loaded (S17, S18) and
/// the keeper of events started (S20a).
pub(super) async fn start_state<A: Agent>(me: Myself<A>, args: TurnLoopArgs<A>) -> LoopState<A> {
    // S42: OpenTelemetry's GenAI attribute for the conversation beside agentloop's.
    let span = tracing::info_span!(
        "session",
        id = %args.config.id,
        kind = %args.config.kind,
        gen_ai.conversation.id = %args.config.id,
    );
    let mut config = args.config;
    let core_config = CoreConfig::from_session(&mut config, args.store.is_some());
    let mut core = Core::new(core_config, args.shared);
    // `sync` writes every safe point; `sync` and `turn` write every durable step's
    // journal entry (S1b).
    if core.writes_turn_ends() {
        core.progress_hook = Some(Arc::new(move |turn| {
            // The session may be gone; then nobody needs the progress.
            me.send_message(internal::<A>(InternalMsg::TurnProgress { turn }));
        }));
    }
    if core.persists() && config.run.load_record {
        if let Some(store) = &args.store {
            load(&mut core, &**store, &config, args.preloaded)
                .instrument(span.clone())
                .await;
        }
    }
    if let (Some(keeper), Some(store)) = (args.subscribers.keeper(), &args.store) {
        if core.load_error.is_none() {
            start_keeper(&core, keeper, store, config.run.load_record)
                .instrument(span.clone())
                .await;
        }
    }
    LoopState {
        core,
        agent: args.agent,
        store: args.store,
        subscribers: args.subscribers,
        writes: VecDeque::new(),
        turn_task: None,
        preempt_timers: Default::default(),
        final_exit: None,
        published: false,
        effects: Vec::new(),
        end_hooks: config.end_hooks,
        hook_timeout: config.hook_timeout,
        span,
        metrics: config.run.metrics,
        restart_oracle: config.run.restart_oracle,
    }
}

/// The session's start: the core's `Start` event, performed.
pub(super) async fn start<A: Agent>(me: &Myself<A>, state: &mut LoopState<A>) {
    // Most sessions start idle and the start has no effects: decide and perform at
    // once; only what must be awaited gets a boxed future (B2).
    let span = state.span.clone();
    let rest = {
        // In the session's span: the start logs a record that failed to load.
        let _entered = span.enter();
        let mut effects = std::mem::take(&mut state.effects);
        state
            .core
            .handle(Event::Start, Instant::now(), &mut effects);
        perform_effects(me, state, effects)
    };
    if let Some(rest) = rest {
        Box::pin(perform_rest(me, state, rest).instrument(span)).await;
    }
}

/// Handles one message, as the actor's `handle` does (the bench shell's loop).
///
/// Decided and performed at once, in the session's span: every effect but an exit or
/// a sleep is performed without waiting, so the message's future holds nothing large
/// and allocates nothing (B1). ractor keeps each actor's message loop in one
/// allocation sized for the largest `handle` future; the awaited rest is boxed so that
/// stays small too (B2).
#[cfg(feature = "bench-shell")]
pub(super) async fn handle_message<A: Agent>(
    me: &Myself<A>,
    msg: TurnLoopMsg<A::Item, A::Event>,
    state: &mut LoopState<A>,
) {
    if let Some(rest) = decide_and_perform(me, msg, state) {
        let span = state.span.clone();
        Box::pin(perform_rest(me, state, rest).instrument(span)).await;
    }
}

/// The part of handling a message that never waits, in the session's span: what must
/// be awaited is returned.
fn decide_and_perform<A: Agent>(
    me: &Myself<A>,
    msg: TurnLoopMsg<A::Item, A::Event>,
    state: &mut LoopState<A>,
) -> Option<Rest<A>> {
    let span = state.span.clone();
    let _entered = span.enter();
    handle_now(me, msg, state)
}

/// Turns a message into a core event, hands it to the core and performs its effects;
/// returns what must be awaited, if anything.
fn handle_now<A: Agent>(
    myself: &Myself<A>,
    msg: TurnLoopMsg<A::Item, A::Event>,
    state: &mut LoopState<A>,
) -> Option<Rest<A>> {
    let event = match msg {
        TurnLoopMsg::Push {
            item,
            options,
            reply,
        } => Event::Push {
            item,
            options,
            reply,
        },
        TurnLoopMsg::Stop { options, reply } => Event::Stop { options, reply },
        TurnLoopMsg::Detach { reply } => Event::Detach { reply },
        TurnLoopMsg::Checkpoint { reply } => Event::Checkpoint { reply },
        TurnLoopMsg::Subscribe {
            capacity,
            filter,
            reply,
        } => {
            let _ = reply.send(state.subscribers.subscribe(capacity, filter));
            return None;
        }
        TurnLoopMsg::Inspect { reply } => {
            let _ = reply.send(state.core.info());
            return None;
        }
        TurnLoopMsg::Internal(Internal(msg)) => match msg {
            InternalMsg::TurnFinished { turn, finals } => {
                // The turn's final events first, before anything the core decides:
                // `Ended` and the next turn's events come after them (S20).
                if let Some(finals) = finals {
                    finals.deliver();
                }
                if state.core.turn.as_ref().is_some_and(|t| t.index == turn) {
                    state.turn_task = None;
                }
                Event::TurnFinished { turn }
            }
            InternalMsg::TurnProgress { turn } => Event::TurnProgress { turn },
            // S39: the core decides whether to sleep; the shell says who listens.
            InternalMsg::Due(crate::session::core::Timed::SleepDue { epoch }) => Event::SleepDue {
                epoch,
                watched: state.subscribers.watched(),
            },
            InternalMsg::Due(timed) => {
                if let crate::session::core::Timed::PreemptDue { id, .. } = &timed {
                    state.preempt_timers.remove(id);
                }
                Event::from(timed)
            }
            InternalMsg::Written { seq, result } => {
                while state.writes.front().is_some_and(|(s, _)| *s <= seq) {
                    state.writes.pop_front();
                }
                Event::Written { seq, result }
            }
            InternalMsg::Polled { status } => Event::Polled { status },
            InternalMsg::SleepRefused => Event::SleepRefused,
        },
    };
    let mut effects = std::mem::take(&mut state.effects);
    state.core.handle(event, Instant::now(), &mut effects);
    perform_effects(myself, state, effects)
}

/// An effect to await and the effects that come after it, in the core's order.
struct Rest<A: Agent> {
    awaited: Awaited<A>,
    after: Effects<A>,
}

/// Performs `effects` in order until one must be awaited; that one and those after it
/// are returned. The emptied vector goes back to the state, so its capacity is reused
/// by the next event.
fn perform_effects<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    mut effects: Effects<A>,
) -> Option<Rest<A>> {
    let mut rest = None;
    let mut drain = effects.drain(..);
    for effect in drain.by_ref() {
        if let Some(awaited) = perform_now(myself, state, effect) {
            rest = Some(Rest {
                awaited,
                after: drain.by_ref().collect(),
            });
            break;
        }
    }
    drop(drain);
    state.effects = effects;
    rest
}

/// Performs what must be awaited, and the effects after it, in order.
async fn perform_rest<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>, rest: Rest<A>) {
    let mut rest = rest;
    loop {
        perform_awaited(myself, state, rest.awaited).await;
        match perform_effects(myself, state, rest.after) {
            Some(more) => rest = more,
            None => return,
        }
    }
}

/// How long a session's start waits for its first reservation of event numbers.
const FIRST_RESERVATION: std::time::Duration = std::time::Duration::from_secs(30);

/// Starts the session's keeper of events (S20a): its appends fenced by this owner's
/// epoch; numbering after everything a previous incarnation kept or reserved, so no
/// number is given twice; a new life (no record was found) drops what a previous
/// session of this id kept.
async fn start_keeper<A: Agent>(
    core: &Core<A>,
    keeper: &Arc<crate::events::keeper::Keeper<A::Event>>,
    store: &Arc<dyn crate::store::CheckpointStore<A::Item>>,
    loaded: bool,
) {
    let id = core.config.id.clone();
    let fresh = loaded && !core.durable.record_stale;
    let seq = &core.shared.event_seq;
    if !fresh {
        match store.read_events(&id, u64::MAX, 0).await {
            Ok(k) => {
                seq.continue_from(k.last.max(k.reserved));
                // S20a: the numbers between them may include ones never given.
                keeper.after_crash(k.last, k.reserved);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the kept events' reserved mark could not be read: numbering continues after the record's")
            }
        }
    }
    let epoch = core.durable.lease_epoch;
    let (s1, s2, id2) = (store.clone(), store.clone(), id.clone());
    let after = seq.last();
    keeper.start(
        Box::new(move |rider, wake| s1.ride_events(&id, epoch, rider, wake)),
        Box::new(move |after, max| s2.read_events(&id2, after, max)),
        fresh,
        after,
    );
    // The first reservation is durable before the session numbers anything (the actor
    // numbers some events without waiting); a store that does not answer is not
    // waited for forever.
    if tokio::time::timeout(FIRST_RESERVATION, keeper.gate(after + 1))
        .await
        .is_err()
    {
        tracing::warn!(
            waited = ?FIRST_RESERVATION,
            "the kept events' first reservation is not durable yet: the session starts anyway, and a crash before it is may give a number again"
        );
    }
}
