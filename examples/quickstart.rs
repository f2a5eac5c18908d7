//! Quickstart: one session end to end on a [`Runtime`](agentloop::Runtime). An agent
//! that answers each message, two messages pushed, the event stream read as it comes,
//! a stop with a cause, and how the session ended.
//!
//! Run: `cargo run --example quickstart`

use std::time::Duration;

use agentloop::prelude::*;

/// Answers each message of a turn; the (pretend) model call is followed by a safe
/// point, where a stop or a preempt may end the turn.
struct Assistant;

impl Agent for Assistant {
    type Item = String;
    type Event = String;
    type State = usize;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<usize>, AgentError> {
        for (answered, message) in turn.items.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(20)).await; // the model call
            cx.emit(format!("answer to {message:?}")).await;
            cx.safe_point(SafePoint::AfterModelCall, &(answered + 1))?;
        }
        Ok(TurnOutcome::Completed)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Logs go to stderr; RUST_LOG=info shows the runtime's own.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    // No data directory: sessions live in memory. `.data_dir(..)` keeps them in sled.
    let (runtime, _) = Runtime::<String, String>::builder()
        .register_agent("assistant", |_config: &[u8]| Ok(Assistant))
        .start()
        .await?;
    let session = runtime
        .supervisor()
        .spawn(SessionSpec::new("quickstart", "assistant"))
        .await?;
    let mut events = session.subscribe();

    session.push("what's the weather?".to_string()).await?;
    session.push("and tomorrow?".to_string()).await?;
    // Drain: the session handles everything it accepted, then ends. (A graceful stop,
    // `StopOptions::graceful()`, would end the running turn at its next safe point and
    // hand its messages back in the exit state.)
    session
        .stop(StopOptions::drain().cause("user left"))
        .await?;

    while let Some(event) = events.next().await {
        match event {
            SessionEvent::TurnStarted { turn, items, .. } => {
                println!("turn {turn} started with {items} message(s)")
            }
            SessionEvent::Agent { turn, event } => println!("  turn {turn}: {event}"),
            SessionEvent::TurnEnded { turn, outcome, .. } => {
                let how = if outcome == TurnEnd::Completed {
                    "completed"
                } else {
                    "was cut"
                };
                println!("turn {turn} {how}");
            }
            SessionEvent::StopRequested { cause, .. } => {
                println!(
                    "stop requested (cause: {})",
                    cause.as_deref().unwrap_or("none")
                )
            }
            SessionEvent::Ended(summary) => println!(
                "session ended: {}",
                summary.stop_cause.as_deref().unwrap_or("no cause")
            ),
            _ => {}
        }
    }
    let exit = session.wait().await;
    println!(
        "{} turn(s) completed, {} message(s) handled, {} left over",
        exit.counters.turns_completed,
        exit.counters.items_delivered,
        exit.unhandled_items.len() + exit.interrupted_items.len()
    );
    runtime.shutdown().await?;
    Ok(())
}
