//! B1: turn round trip (push, then wait for the turn-ended event), no-op agent, one
//! session, against the bare mechanism in the same process and run (DESIGN §10).
//!
//! * Baseline: a ractor actor that, on each push message, spawns a tokio task; the task
//!   casts `Done` back to the actor; the actor then sends one event on a tokio mpsc
//!   channel to the waiting client. The client casts the push and awaits the event.
//! * agentloop: one session of a no-op agent (its turn returns at once). The client
//!   pushes like the baseline client does, as a cast (`push(item).no_wait()`: no reply to wait
//!   for), and reads a turn-ends-only event stream (`EventFilter::turn_ends`) until
//!   `TurnEnded`. Everything else the runtime does per turn is included: planning,
//!   the turn task, the control block, catching panics, tracing spans, the order gate,
//!   the in-flight accounting of final events, and the actor's bookkeeping.
//!
//! * Diagnostic, not the figure: the same session core, effects and turn task driven by
//!   a plain tokio task instead of the ractor actor (`agentloop::session::bench_shell`,
//!   the `bench-shell` feature), against the same baseline: ractor's share of B1.
//!
//! Both sides run in rounds of `OPS_PER_ROUND` round trips, interleaved (the side that
//! goes first alternates), after a warm-up of each. A round's sample is its mean time
//! per round trip; each side's figure is the median over its rounds.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{EventFilter, SessionEvent, SessionHandle, SessionSpec, StopOptions};
use agentloop_sim::{SimEvent, SimItem};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc;

use crate::harness::{in_turn, micros_per_op, stop_and_wait, workers, NoopAgent, Paired};
use crate::report::ratio_line_max;

/// Round trips per round.
const OPS_PER_ROUND: u64 = 20_000;
/// Rounds per side (odd, so the median is one round).
const ROUNDS: usize = 15;
/// Warm-up round trips per side before the first timed round.
const WARMUP_OPS: u64 = 5_000;
/// The target: agentloop ≤ 2 × baseline.
const TARGET: f64 = 2.0;
/// The capacity of the baseline's event channel (agentloop's default subscriber
/// capacity, so both sides use the same kind of channel).
const EVENT_CAPACITY: usize = agentloop::events::DEFAULT_EVENT_CAPACITY;
/// Round trips of one side in a `B1_SIDE` probe.
const PROBE_OPS: u64 = 200_000;

/// One side of the figure: started, driven one round trip at a time, stopped.
trait Side: Sized + Send + 'static {
    /// Starts the side.
    fn start() -> impl Future<Output = Self> + Send;

    /// One round trip: cast the push, await its event.
    fn round_trip(&mut self) -> impl Future<Output = ()> + Send;

    /// Stops the side (and checks what it can).
    fn stop(self) -> impl Future<Output = ()> + Send;

    /// `ops` round trips in sequence; their wall time.
    fn run(&mut self, ops: u64) -> impl Future<Output = Duration> + Send {
        async move {
            let t0 = Instant::now();
            for _ in 0..ops {
                self.round_trip().await;
            }
            t0.elapsed()
        }
    }
}

// ---------------------------------------------------------------------------------
// Baseline: the bare mechanism.

/// The baseline actor's messages.
enum BaseMsg {
    /// A client push: start the "turn".
    Push(u64),
    /// The "turn" task finished.
    Done(u64),
}

agentloop::local_message!(BaseMsg);

struct BaseActor;

struct BaseState {
    events: mpsc::Sender<u64>,
}

impl Actor for BaseActor {
    type Msg = BaseMsg;
    type State = BaseState;
    type Arguments = mpsc::Sender<u64>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        events: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(BaseState { events })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BaseMsg::Push(n) => {
                tokio::spawn(async move {
                    // The actor may be stopping; then nobody waits for this.
                    let _ = myself.send_message(BaseMsg::Done(n));
                });
            }
            BaseMsg::Done(n) => {
                // The client may have gone; then nobody waits for this.
                let _ = state.events.send(n).await;
            }
        }
        Ok(())
    }
}

struct Baseline {
    actor: ActorRef<BaseMsg>,
    join: tokio::task::JoinHandle<()>,
    events: mpsc::Receiver<u64>,
    next: u64,
}

impl Side for Baseline {
    async fn start() -> Self {
        let (tx, rx) = mpsc::channel(EVENT_CAPACITY);
        let (actor, join) = Actor::spawn(None, BaseActor, tx)
            .await
            .expect("spawning the baseline actor");
        Baseline {
            actor,
            join,
            events: rx,
            next: 0,
        }
    }

    async fn round_trip(&mut self) {
        let n = self.next;
        self.next += 1;
        self.actor
            .send_message(BaseMsg::Push(n))
            .unwrap_or_else(|_| panic!("the baseline actor is gone"));
        let got = self
            .events
            .recv()
            .await
            .expect("the baseline event channel closed");
        assert_eq!(got, n, "baseline event out of order");
    }

    async fn stop(self) {
        self.actor.stop(None);
        self.join.await.expect("the baseline actor panicked");
    }
}

// ---------------------------------------------------------------------------------
// agentloop: one session of the no-op agent.

struct Agentloop {
    handle: SessionHandle<SimItem, SimEvent>,
    events: agentloop::EventStream<SimEvent>,
    next: u64,
}

impl Side for Agentloop {
    /// One session of the no-op agent (default plan: consume everything; a turn that
    /// returns at once).
    async fn start() -> Self {
        let agent = NoopAgent::<SimItem, SimEvent>::new();
        let handle = SessionHandle::spawn(SessionSpec::new("b1", "default"), Arc::new(agent), None)
            .await
            .expect("spawning the B1 session");
        let events = handle.subscribe_filtered(EVENT_CAPACITY, EventFilter::turn_ends());
        Agentloop {
            handle,
            events,
            next: 0,
        }
    }

    /// Casts the push, then reads until `TurnEnded`.
    async fn round_trip(&mut self) {
        let n = self.next;
        self.next += 1;
        self.handle.push(SimItem::new(n, "x")).no_wait();
        until_turn_ended(&mut self.events, "the B1 session").await;
    }

    async fn stop(self) {
        let exit =
            stop_and_wait(&self.handle, StopOptions::bare(), "stopping the B1 session").await;
        assert_eq!(
            exit.counters.turns_completed, self.next,
            "every push should have made exactly one completed turn"
        );
    }
}

// ---------------------------------------------------------------------------------
// Diagnostic: the same session core on a plain tokio task (ractor's share).

/// The agentloop side's session core, effects and turn task driven by a plain tokio
/// task and an unbounded channel instead of a ractor actor
/// (`agentloop::session::bench_shell`). Not the product; it tells how much of the
/// figure is ractor's.
struct Shell {
    shell: Option<agentloop::session::bench_shell::TaskShell<SimItem, SimEvent>>,
    events: agentloop::EventStream<SimEvent>,
    next: u64,
}

impl Side for Shell {
    async fn start() -> Self {
        let agent = NoopAgent::<SimItem, SimEvent>::new();
        let shell = agentloop::session::bench_shell::spawn(
            SessionSpec::new("b1-shell", "default"),
            Arc::new(agent),
        )
        .await;
        let events = shell.subscribe_filtered(EVENT_CAPACITY, EventFilter::turn_ends());
        Shell {
            shell: Some(shell),
            events,
            next: 0,
        }
    }

    /// The same round trip as the agentloop side's.
    async fn round_trip(&mut self) {
        let n = self.next;
        self.next += 1;
        if let Some(shell) = &self.shell {
            shell.push_nowait(SimItem::new(n, "x"));
        }
        until_turn_ended(&mut self.events, "the B1 shell's session").await;
    }

    async fn stop(mut self) {
        let Some(shell) = self.shell.take() else {
            return;
        };
        let exit = shell
            .stop(StopOptions::bare())
            .await
            .expect("the B1 shell's session published no exit");
        assert_eq!(
            exit.counters.turns_completed, self.next,
            "every push to the shell should have made exactly one completed turn"
        );
    }
}

/// Reads `events` until `TurnEnded`; the session ending or the stream closing during
/// the run is the bench's failure (`what` names the session).
async fn until_turn_ended(events: &mut agentloop::EventStream<SimEvent>, what: &str) {
    loop {
        match events.next().await {
            Some(SessionEvent::TurnEnded { .. }) => break,
            Some(SessionEvent::Ended(summary)) => {
                panic!("{what} ended during the run: {summary:?}")
            }
            Some(_) => {}
            None => panic!("{what}'s event stream closed during the run"),
        }
    }
}

/// A warm-up of `WARMUP_OPS` round trips per side, then `ROUNDS` interleaved rounds of
/// `OPS_PER_ROUND` round trips per side (the side that goes first alternates, so
/// neither always runs on a "fresh" or a "tired" runtime). Per-round means, µs per
/// round trip.
async fn interleaved<B: Side, A: Side>(base: &mut B, al: &mut A) -> Paired {
    base.run(WARMUP_OPS).await;
    al.run(WARMUP_OPS).await;
    let mut s = Paired::default();
    for round in 0..ROUNDS {
        let (b, a) = in_turn(round, base.run(OPS_PER_ROUND), al.run(OPS_PER_ROUND)).await;
        s.push(
            micros_per_op(b, OPS_PER_ROUND),
            micros_per_op(a, OPS_PER_ROUND),
        );
    }
    s
}

/// Runs B1 and prints its tables and verdict line (the last line).
///
/// The figure has the client as a task on the runtime's workers (DESIGN §10, issue 14):
/// wake-ups stay on a worker and the time is the runtime's own overhead. A second,
/// diagnostic measurement (not the figure) runs the same client on the thread that runs
/// `main` (the `#[tokio::main]` `block_on` thread, outside the worker pool), where the
/// cross-thread wake-up of the client dominates both sides and moves with the load.
pub async fn run() {
    if let Ok(side) = std::env::var("B1_SIDE") {
        return probe(&side).await;
    }
    println!(
        "B1: turn round trip, no-op agent, 1 session; {ROUNDS} interleaved rounds of \
         {OPS_PER_ROUND} round trips per side, warm-up {WARMUP_OPS} per side; tokio workers: {}",
        workers()
    );
    let mut base = Baseline::start().await;
    let mut al = Agentloop::start().await;

    // Diagnostic: the client on the main thread.
    let main_thread = interleaved(&mut base, &mut al).await;

    // The figure: the same client as a runtime task.
    let (mut base, al, on_worker) = tokio::spawn(async move {
        let s = interleaved(&mut base, &mut al).await;
        (base, al, s)
    })
    .await
    .expect("the B1 client task panicked");

    // Diagnostic: the same core on a plain task against the same baseline, client as
    // a task (what the figure would read without ractor's share).
    let (base, shell, plain) = tokio::spawn(async move {
        let mut shell = Shell::start().await;
        let s = interleaved(&mut base, &mut shell).await;
        (base, shell, s)
    })
    .await
    .expect("the B1 shell's client task panicked");

    // Stopping checks that every agentloop push made exactly one completed turn.
    base.stop().await;
    al.stop().await;
    shell.stop().await;

    let sides = ["baseline (bare mechanism)", "agentloop"];
    println!();
    let figure = on_worker.table(
        "B1 turn round trip (the figure: client as a runtime task)",
        "µs/op",
        sides[0],
        sides[1],
    );
    println!();
    let diagnostic = main_thread.table(
        "Diagnostic, not the figure: the same client on the main thread",
        "µs/op",
        sides[0],
        sides[1],
    );
    println!("diagnostic ratio (client on the main thread)={diagnostic:.2}");
    println!();
    let without_ractor = plain.table(
        "Diagnostic, not the figure: the same session core on a plain tokio task (bench-only shell), client as a task",
        "µs/op",
        sides[0],
        "agentloop core, plain task",
    );
    println!(
        "diagnostic ratio (the core on a plain task)={without_ractor:.2}; the actor's figure above={figure:.2}"
    );
    println!();
    println!("{}", ratio_line_max("B1", figure, TARGET));
}

/// Diagnostic (`B1_SIDE=agentloop|baseline|shell`): 200 000 round trips of one side with the
/// client as a task, for `perf stat` / `strace -c` of that side alone. Prints µs per
/// round trip; not a figure.
async fn probe(side: &str) {
    let per_op = match side {
        "baseline" => probe_side::<Baseline>().await,
        "shell" => probe_side::<Shell>().await,
        _ => probe_side::<Agentloop>().await,
    };
    println!(
        "B1 probe {side}: {per_op:.3} µs per round trip ({PROBE_OPS} round trips, client as a task)"
    );
}

/// `PROBE_OPS` round trips of side `S` with the client as a task; µs per round trip.
async fn probe_side<S: Side>() -> f64 {
    tokio::spawn(async {
        let mut s = S::start().await;
        let d = s.run(PROBE_OPS).await;
        s.stop().await;
        micros_per_op(d, PROBE_OPS)
    })
    .await
    .expect("the probe panicked")
}
