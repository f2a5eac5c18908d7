//! Quickstart: one session of the simulated agent. Push items, preempt a turn with a
//! newer message, stop gracefully with a cause, and read the event stream and the exit
//! state.
//!
//! Run: `cargo run --release --example quickstart`

use std::sync::Arc;
use std::time::Duration;

use agentloop::{Preempt, PushOptions, SessionConfig, SessionEvent, SessionHandle, StopOptions};
use agentloop_sim::{Script, SimAgent, SimItem};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();

    // Each turn: model call, tool round, model call (20 ms / 10 ms latencies).
    let agent = SimAgent::new(Script::react(
        1,
        Duration::from_millis(20),
        Duration::from_millis(10),
    ));
    let session =
        SessionHandle::spawn(SessionConfig::new("quickstart"), Arc::new(agent), None).await?;

    let mut events = session.subscribe();
    let printer = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            match event {
                SessionEvent::Agent { .. } => {}
                SessionEvent::Ended(summary) => {
                    println!(
                        "event: Ended (reason {:?}, cause {:?})",
                        summary.reason, summary.stop_cause
                    );
                }
                other => println!("event: {other:?}"),
            }
        }
        println!("stream closed");
    });

    session.push(SimItem::new(1, "what's the weather?")).await?;
    session.push(SimItem::new(2, "in Paris")).await?;
    // A newer message preempts the running turn at its next safe point; the turn's
    // items are offered again to the next turn, first.
    let ack = session
        .push_with(
            SimItem::new(3, "actually, in Lyon"),
            PushOptions::preempt(Preempt::any_safe_point().timeout(Duration::from_secs(1))),
        )
        .await?;
    println!("preempt: {ack:?}");

    tokio::time::sleep(Duration::from_millis(200)).await;
    session
        .stop(StopOptions::graceful_timeout(Duration::from_secs(2)).cause("quickstart done"))
        .await?;
    let exit = session.wait().await;
    printer.await?;
    println!(
        "exit: reason {:?}, cause {:?}, turns completed {}, preempted {}, items delivered {}, unhandled {}, interrupted {}",
        exit.reason,
        exit.stop_cause,
        exit.counters.turns_completed,
        exit.counters.turns_preempted,
        exit.counters.items_delivered,
        exit.unhandled_items.len(),
        exit.interrupted_items.len()
    );
    Ok(())
}
