//! The TurnLoop actor: the shell around one session's core (DESIGN §1, S20, S21).
//!
//! It turns messages into core events, performs the effects the core returns, and
//! feeds their results back: it issues store operations (in the order the core asked,
//! which is the order the store applies them), spawns turn tasks and timers, answers
//! callers, tells subscribers, and runs the teardown (S21: final checkpoint →
//! session-end hooks → `Ended` → stream close → exit). It decides nothing: every
//! decision is in `core/`. It never runs agent code (that is `turn_task`) and never
//! blocks: store calls are awaited only in `pre_start` (the load) and in the teardown,
//! events from the actor never wait for capacity, and the exit uses ractor's `drain()`
//! (never `stop()`), so messages already queued are answered, not dropped.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::Instrument;

use crate::agent::Agent;
use crate::events::{SessionEvent, Subscribers};
use crate::exit::ExitState;
use crate::session::core::load::{check_resumable, finished, Finished};
use crate::session::core::{Core, CoreConfig, Effect, Event, ExitPlan, StoreOp, Timed};
use crate::session::messages::{Internal, InternalMsg, TurnLoopMsg};
use crate::session::turn_task::{TurnTask, TurnWork};
use crate::session::SessionConfig;
use crate::shared::SessionShared;
use crate::store::{
    codec, now_ms, CasOutcome, CheckpointStore, LoadedRecord, Payload, SessionStatus, StatusKind,
    StoreError,
};
use crate::turn::control::TurnControl;
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
    pub(crate) preloaded: Option<LoadedRecord<A::Item>>,
}

/// The TurnLoop's state: the core and what performing its effects needs.
pub struct LoopState<A: Agent> {
    core: Core<A>,
    agent: Arc<A>,
    store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    subscribers: Arc<Subscribers<A::Event>>,
    /// Store operations issued and not yet reported, by number; each task returns its
    /// operation's result, so the teardown can await exactly those.
    writes: VecDeque<(u64, tokio::task::JoinHandle<Result<bool, StoreError>>)>,
    /// The running turn's task (aborted if the actor dies).
    turn_task: Option<tokio::task::AbortHandle>,
    /// The exit state from the moment the teardown computed it until it is published,
    /// so an actor killed mid-teardown still hands every item back.
    final_exit: Option<Box<ExitState<A::Item>>>,
    /// The exit state is published.
    published: bool,
    /// The effects of the event being handled (its capacity is kept between events).
    effects: Vec<Effect<A>>,
    /// Session-end hooks (S21) and the bound on each.
    end_hooks: Vec<crate::session::EndHook>,
    hook_timeout: std::time::Duration,
    span: tracing::Span,
}

impl<A: Agent> Drop for LoopState<A> {
    fn drop(&mut self) {
        // The actor was killed or failed before its teardown finished (ractor skips
        // post_stop then). Hand everything back through the exit state so nothing is
        // lost and `wait` returns; stop the turn task.
        if self.published {
            return;
        }
        if let Some(t) = &self.turn_task {
            t.abort();
        }
        // Pushes waiting for a write were accepted: they are in the exit state, and
        // their callers must hear that, not a silence that looks like a lost item.
        self.core
            .abandon_writes("the session actor stopped before the write was confirmed");
        let exit = match self.final_exit.take() {
            // The teardown had computed the exit (and done the checkpoint): publish it.
            Some(exit) => *exit,
            None => self.core.salvage(),
        };
        self.subscribers.end(exit.summary());
        self.core.shared.fire_stopped();
        self.core.shared.publish_exit(exit);
    }
}

type Myself<A> = ActorRef<TurnLoopMsg<<A as Agent>::Item, <A as Agent>::Event>>;

fn internal<A: Agent>(msg: InternalMsg<A::Item>) -> TurnLoopMsg<A::Item, A::Event> {
    TurnLoopMsg::Internal(Internal(msg))
}

impl<A: Agent> Actor for TurnLoop<A> {
    type Msg = TurnLoopMsg<A::Item, A::Event>;
    type State = LoopState<A>;
    type Arguments = TurnLoopArgs<A>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: TurnLoopArgs<A>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let span =
            tracing::info_span!("session", id = %args.config.id, kind = %args.config.agent_kind);
        let mut config = args.config;
        let core_config = CoreConfig::from_session(&mut config, args.store.is_some());
        let mut core = Core::new(core_config, args.shared);
        if core.syncs() {
            let me = myself.clone();
            core.progress_hook = Some(Arc::new(move |turn| {
                // The session may be gone; then nobody needs the progress.
                let _ = me.send_message(internal::<A>(InternalMsg::TurnProgress { turn }));
            }));
        }
        if core.persists() && config.load_record {
            if let Some(store) = &args.store {
                load(&mut core, &**store, &config, args.preloaded)
                    .instrument(span.clone())
                    .await;
            }
        }
        Ok(LoopState {
            core,
            agent: args.agent,
            store: args.store,
            subscribers: args.subscribers,
            writes: VecDeque::new(),
            turn_task: None,
            final_exit: None,
            published: false,
            effects: Vec::new(),
            end_hooks: config.end_hooks,
            hook_timeout: config.hook_timeout,
            span,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        Box::pin(step(&myself, state, Event::Start).instrument(span)).await;
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

/// Reads the record (or takes the one the spawner read) and seeds the core (S17).
/// `config` is what is left of the session's configuration once the core took its
/// part (owner and lease timeout are read here).
/// Errors are kept in the core, which ends the session without touching the record
/// (S18).
async fn load<A: Agent>(
    core: &mut Core<A>,
    store: &dyn CheckpointStore<A::Item>,
    config: &SessionConfig,
    preloaded: Option<LoadedRecord<A::Item>>,
) {
    // (The id moved into the core's configuration.)
    let id = core.config.id.clone();
    let loaded = match preloaded.filter(|r| r.header.session_id == id) {
        Some(r) => Ok(Some(r)),
        None => match store.load_stored(&id).await {
            Ok(Some(s)) => s.decode::<A::Item>().map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        },
    };
    let loaded = match loaded {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            core.load_error = Some(Box::new(e));
            return;
        }
    };
    // S19: the owner's heartbeat decides a `Running` record under another owner.
    let owner_beat = match (&loaded.header.status, loaded.header.owner.as_deref()) {
        (SessionStatus::Running, Some(owner)) if config.owner.as_deref() != Some(owner) => {
            match store.heartbeat(owner).await {
                Ok(b) => b,
                Err(e) => {
                    core.load_error = Some(Box::new(e));
                    return;
                }
            }
        }
        _ => None,
    };
    if let Err(e) = check_resumable(
        &loaded.header,
        config.owner.as_deref(),
        owner_beat,
        now_ms(),
        config.lease_timeout,
    ) {
        core.load_error = Some(Box::new(e));
        return;
    }
    match finished(&loaded) {
        Some(Finished::Delete) => {
            // A finished session: this run starts afresh under the id.
            if let Err(e) = store.delete(&id).await {
                // Every `sync` write would be refused: refuse the start instead.
                core.load_error = Some(Box::new(e));
            }
            return;
        }
        Some(Finished::Reopen) => {
            match store
                .cas_status(&id, vec![StatusKind::Completed], SessionStatus::Stopped)
                .await
            {
                Ok(CasOutcome::Swapped(_)) => {}
                Ok(other) => {
                    core.load_error = Some(Box::new(StoreError::Refused {
                        session: id.clone(),
                        status: format!("{other:?}"),
                        why: "its Completed record changed while it was loaded; spawn it again"
                            .into(),
                    }));
                    return;
                }
                Err(e) => {
                    core.load_error = Some(Box::new(e));
                    return;
                }
            }
        }
        None => {}
    }
    // The cut turn's state, decoded for the resume turn; its bytes kept for writes
    // (re-encoded in format 2 when it was read in format 1).
    let (state, bytes) = match &loaded.state {
        None => (None, None),
        Some(b) => match codec::decode_state::<A::State>(&id, b) {
            Err(e) => {
                core.load_error = Some(Box::new(e));
                return;
            }
            Ok(v) if b.starts_with(&codec::FORMAT1_STATE_MARK) => {
                match codec::encode_state(&id, &v) {
                    Ok(enc) => (Some(v), Some(Payload::from(enc))),
                    Err(e) => {
                        core.load_error = Some(Box::new(e));
                        return;
                    }
                }
            }
            Ok(v) => (Some(v), Some(b.clone())),
        },
    };
    core.seed(loaded, state, bytes);
}

async fn handle_msg<A: Agent>(
    myself: &Myself<A>,
    msg: TurnLoopMsg<A::Item, A::Event>,
    state: &mut LoopState<A>,
) {
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
        TurnLoopMsg::Subscribe {
            capacity,
            filter,
            reply,
        } => {
            let _ = reply.send(state.subscribers.subscribe(capacity, filter));
            return;
        }
        TurnLoopMsg::Inspect { reply } => {
            let _ = reply.send(state.core.info());
            return;
        }
        TurnLoopMsg::Internal(Internal(msg)) => match msg {
            InternalMsg::TurnFinished { turn } => {
                if state.core.turn.as_ref().is_some_and(|t| t.index == turn) {
                    state.turn_task = None;
                }
                Event::TurnFinished { turn }
            }
            InternalMsg::TurnProgress { turn } => Event::TurnProgress { turn },
            InternalMsg::PreemptDue {
                turn,
                preempt,
                reply,
            } => Event::PreemptDue {
                turn,
                preempt,
                reply,
            },
            InternalMsg::IdleDue { epoch } => Event::IdleDue { epoch },
            InternalMsg::Written { seq, result } => {
                while state.writes.front().is_some_and(|(s, _)| *s <= seq) {
                    state.writes.pop_front();
                }
                Event::Written { seq, result }
            }
            InternalMsg::PollDue => Event::PollDue,
            InternalMsg::Polled { status } => Event::Polled { status },
        },
    };
    step(myself, state, event).await;
}

/// Feeds one event to the core and performs its effects.
async fn step<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>, event: Event<A>) {
    let mut effects = std::mem::take(&mut state.effects);
    state.core.handle(event, Instant::now(), &mut effects);
    for effect in effects.drain(..) {
        perform(myself, state, effect).await;
    }
    state.effects = effects;
}

async fn perform<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>, effect: Effect<A>) {
    match effect {
        Effect::Store { seq, op } => {
            let Some(store) = state.store.clone() else {
                return;
            };
            // Issued here, now: the store orders writes by call time.
            let fut = match op {
                StoreOp::Write(w) => {
                    let f = store.write(*w);
                    Box::pin(async move { f.await.map(|()| true) })
                        as futures::future::BoxFuture<'static, Result<bool, StoreError>>
                }
                StoreOp::Delete => store.delete(&state.core.config.id),
            };
            let me = myself.clone();
            let task = tokio::spawn(async move {
                let result = fut.await;
                let _ = me.send_message(internal::<A>(InternalMsg::Written {
                    seq,
                    result: result.clone(),
                }));
                result
            });
            state.writes.push_back((seq, task));
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
            let msg = match event {
                Timed::PreemptDue {
                    turn,
                    preempt,
                    reply,
                } => InternalMsg::PreemptDue {
                    turn,
                    preempt,
                    reply,
                },
                Timed::IdleDue { epoch } => InternalMsg::IdleDue { epoch },
                Timed::PollDue => InternalMsg::PollDue,
            };
            let me = myself.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                // The session may have exited meanwhile; then the timer has nothing to do.
                let _ = me.send_message(internal::<A>(msg));
            });
        }
        Effect::Poll => {
            let Some(store) = state.store.clone() else {
                return;
            };
            let id = state.core.config.id.clone();
            let me = myself.clone();
            tokio::spawn(async move {
                let status = match store.load_stored(&id).await {
                    Ok(Some(s)) => Some(s.status().clone()),
                    _ => None,
                };
                let _ = me.send_message(internal::<A>(InternalMsg::Polled { status }));
            });
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
        Effect::Exit(plan) => teardown(myself, state, *plan).await,
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
    let cx = TurnCx::<A> {
        turn: index,
        session: state.core.shared.clone(),
        control: control.clone(),
        subscribers: state.subscribers.clone(),
        stopped: state.core.shared.stopped_signal(),
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
                let _ =
                    myself.send_message(internal::<A>(InternalMsg::TurnFinished { turn: index }));
            }
        }
    };
    let handle = tokio::spawn(Box::pin(guarded.instrument(span)));
    state.turn_task = Some(handle.abort_handle());
}

/// S21 teardown: final checkpoint → session-end hooks → `Ended` → stream close →
/// actor exit (drain, so queued messages are answered).
async fn teardown<A: Agent>(myself: &Myself<A>, state: &mut LoopState<A>, plan: ExitPlan<A::Item>) {
    let ExitPlan { exit, last } = plan;
    // Invariant: from here until it is published, the exit state lives in
    // `final_exit`, so an actor killed during the awaits below (store, hooks) still
    // hands every item back from its destructor.
    state.final_exit = Some(Box::new(exit));
    let result = match (&last, &state.store) {
        (crate::session::core::FinalAction::Write { write, .. }, Some(store)) => {
            store.write((**write).clone()).await.map(|()| true)
        }
        (crate::session::core::FinalAction::Delete, Some(store)) => {
            store.delete(&state.core.config.id).await
        }
        _ => Ok(false),
    };
    let checkpoint = last.outcome(result);
    // Each push waiting for its write is answered with that write's own result.
    let mut results = HashMap::new();
    for (seq, task) in std::mem::take(&mut state.writes) {
        let r = task.await.unwrap_or_else(|e| {
            Err(StoreError::Backend {
                operation: "save",
                session: state.core.config.id.clone(),
                message: format!("the write task failed: {e}"),
            })
        });
        results.insert(seq, r);
    }
    state
        .core
        .settle(|seq| results.get(&seq).cloned().unwrap_or(Ok(true)));
    let summary = match state.final_exit.as_mut() {
        Some(exit) => {
            exit.checkpoint = checkpoint;
            exit.summary()
        }
        None => return, // unreachable: set above and only taken below
    };
    tracing::info!(reason = ?summary.reason, cause = ?summary.stop_cause, checkpoint = ?summary.checkpoint,
        unhandled = summary.unhandled, interrupted = summary.interrupted, "session ended");
    run_end_hooks(&state.end_hooks, state.hook_timeout, &summary).await;
    if let Some(exit) = state.final_exit.take() {
        state.published = true;
        state.core.shared.fire_stopped();
        state.core.shared.publish_exit(*exit);
    }
    state.subscribers.end(summary);
    // Process what is already queued (pushes become late, with their items handed
    // back), then stop; later sends are refused with the message handed back.
    let _ = myself.drain();
}

/// S21: each hook bounded by the timeout and isolated (its own task: a panic or a hang
/// does not stop the next one).
async fn run_end_hooks(
    hooks: &[crate::session::EndHook],
    timeout: std::time::Duration,
    summary: &crate::session::ExitSummary,
) {
    for (i, hook) in hooks.iter().enumerate() {
        // The hook is called inside its task, so even a panic before its future exists
        // stays isolated from the session and from the next hook.
        let (hook, summary) = (hook.clone(), summary.clone());
        let task = tokio::spawn(async move { hook(summary).await });
        let abort = task.abort_handle();
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(hook = i, error = %e, "session-end hook failed"),
            Ok(Err(e)) => tracing::warn!(hook = i, error = %e, "session-end hook panicked"),
            Err(_) => {
                abort.abort();
                tracing::warn!(hook = i, ?timeout, "session-end hook timed out");
            }
        }
    }
}
