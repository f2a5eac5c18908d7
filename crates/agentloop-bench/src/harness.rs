//! The harness the figures share: the order of a round's two sides, the per-round
//! samples of a baseline and an agentloop side with their table and ratio, the units
//! the figures count in, a checkpoint store on a fresh temp dir, stopping a session,
//! and the do-nothing agent and actor several figures start. What a figure measures
//! (its baseline, its agentloop side, its counts, rounds and target) stays in its own
//! module; this one only holds the code they would otherwise each repeat.

use std::fmt::Debug;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use agentloop::store::{CheckpointActor, CheckpointClient, CheckpointStats, Engine};
use agentloop::{
    Agent, AgentError, CheckpointStore, Durability, ExitState, SessionHandle, StopOptions, Turn,
    TurnCx, TurnOutcome,
};
use agentloop_sim::{SimEvent, SimItem};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::report::{print_table, summarize, Summary};
use crate::tempdir::TempDir;

/// A session of the simulated agent, the one most figures run.
pub type SimHandle = SessionHandle<SimItem, SimEvent>;

// ---------------------------------------------------------------------------------
// Units and the header line.

/// The tokio runtime's worker threads, for a figure's header line.
pub fn workers() -> usize {
    tokio::runtime::Handle::current().metrics().num_workers()
}

/// Mean µs per operation: `ops` operations took `d` in all.
pub fn micros_per_op(d: Duration, ops: u64) -> f64 {
    d.as_secs_f64() * 1e6 / ops as f64
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A durability mode's name, as the figures print it and put it in session ids.
pub fn mode_name(d: Durability) -> &'static str {
    match d {
        Durability::Exit => "exit",
        Durability::Turn => "turn",
        Durability::Sync => "sync",
    }
}

// ---------------------------------------------------------------------------------
// Interleaved rounds of two sides.

/// Runs the two sides of round `round`: `a` first in even rounds, `b` first in odd
/// ones, so neither side always runs on a "fresh" or a "tired" process. The futures
/// do nothing until they are awaited here, one after the other; each side times
/// itself. Returns `(a's result, b's result)`.
pub async fn in_turn<A, B>(
    round: usize,
    a: impl Future<Output = A>,
    b: impl Future<Output = B>,
) -> (A, B) {
    if round.is_multiple_of(2) {
        let a = a.await;
        (a, b.await)
    } else {
        let b = b.await;
        (a.await, b)
    }
}

/// The per-round samples of a baseline and an agentloop side (each sample one round's
/// value: a mean, or one timed operation).
#[derive(Default)]
pub struct Paired {
    /// The baseline's samples, in round order.
    pub base: Vec<f64>,
    /// The agentloop side's samples, in round order.
    pub agentloop: Vec<f64>,
}

impl Paired {
    /// Records one round's samples.
    pub fn push(&mut self, base: f64, agentloop: f64) {
        self.base.push(base);
        self.agentloop.push(agentloop);
    }

    /// Records round `round`'s samples unless it is round 0, the warm-up round a figure
    /// runs like the others and discards.
    pub fn record(&mut self, round: usize, base: f64, agentloop: f64) {
        if round > 0 {
            self.push(base, agentloop);
        }
    }

    /// Both sides' summaries: `(baseline, agentloop)`.
    pub fn summaries(&self) -> (Summary, Summary) {
        (summarize(&self.base), summarize(&self.agentloop))
    }

    /// Prints the two sides' table (the baseline's row first, labelled `base`; then
    /// the agentloop side's, labelled `agentloop`) and returns the ratio of the
    /// medians, agentloop over baseline.
    pub fn table(&self, title: &str, unit: &str, base: &str, agentloop: &str) -> f64 {
        let (b, a) = self.summaries();
        print_table(title, unit, &[(base, b), (agentloop, a)]);
        a.median / b.median
    }
}

// ---------------------------------------------------------------------------------
// Stores and sessions.

/// A `CheckpointActor` on a fresh temp dir: its client, the same store as sessions
/// take it, and the directory (removed when this is dropped).
pub struct TempStore<I: Clone + Send + Sync + Serialize + DeserializeOwned + Debug + 'static> {
    /// The actor's client: its counters, `close`.
    pub client: CheckpointClient<I>,
    /// The same store, as `SessionHandle::spawn` takes it.
    pub store: Arc<dyn CheckpointStore<I>>,
    /// The directory; dropped after the store's handles.
    _dir: TempDir,
}

impl<I: Clone + Send + Sync + Serialize + DeserializeOwned + Debug + 'static> TempStore<I> {
    /// Opens `engine` on a fresh directory named after `figure` (lower case, `"b6"`)
    /// and `"store"`, and starts the actor on it.
    pub async fn open(figure: &str, engine: Engine) -> Self {
        let dir = TempDir::new(figure, "store");
        let client: CheckpointClient<I> = CheckpointActor::spawn_engine(dir.path(), engine)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "starting the {} checkpoint actor: {e:?}",
                    figure.to_uppercase()
                )
            });
        let store: Arc<dyn CheckpointStore<I>> = Arc::new(client.clone());
        TempStore {
            client,
            store,
            _dir: dir,
        }
    }
}

/// Stops `h` with `options` and waits for its exit; `what` is the panic message when
/// the stop is refused.
pub async fn stop_and_wait<I, E>(
    h: &SessionHandle<I, E>,
    options: StopOptions,
    what: &str,
) -> ExitState<I>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + Debug + 'static,
    E: Clone + Send + Sync + Debug + 'static,
{
    h.stop(options).await.expect(what);
    h.wait().await
}

/// The store's counters' growth from `before` to `after` (`max_wave`: the largest wave
/// so far).
pub fn stats_delta(after: &CheckpointStats, before: &CheckpointStats) -> CheckpointStats {
    CheckpointStats {
        saves: after.saves - before.saves,
        waves: after.waves - before.waves,
        ops: after.ops - before.ops,
        max_wave: after.max_wave,
        bytes: after.bytes - before.bytes,
        flushes: after.flushes - before.flushes,
        wakes: after.wakes - before.wakes,
    }
}

// ---------------------------------------------------------------------------------
// The do-nothing agent and actor.

/// An agent whose turns do nothing: the default plan (consume everything), a turn that
/// returns at once. `I` and `E` are the session's item and event types.
pub struct NoopAgent<I, E>(PhantomData<fn() -> (I, E)>);

impl<I, E> NoopAgent<I, E> {
    /// The agent.
    pub const fn new() -> Self {
        NoopAgent(PhantomData)
    }
}

impl<I, E> Default for NoopAgent<I, E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<I, E> Agent for NoopAgent<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + Debug + 'static,
    E: Clone + Send + Sync + Debug + 'static,
{
    type Item = I;
    type Event = E;
    type State = ();

    async fn run_turn(
        &self,
        _turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        Ok(TurnOutcome::Completed)
    }
}

/// A ractor actor that keeps its arguments as its state and does nothing else: what a
/// baseline spawns where agentloop starts a session (`Holder<()>`: an empty actor).
pub struct Holder<T>(PhantomData<fn() -> T>);

impl<T> Holder<T> {
    /// The actor.
    pub const fn new() -> Self {
        Holder(PhantomData)
    }
}

impl<T> Default for Holder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> Actor for Holder<T> {
    type Msg = ();
    type State = T;
    type Arguments = T;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }
}
