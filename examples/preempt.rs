//! Preemption (S7, S8): a newer message preempts the running turn at its next safe
//! point. The preempted turn ends there, and its items are offered again to the next
//! turn, first, together with everything pushed since: the agent answers them with the
//! newer message in view, and nothing is lost.
//!
//! Run: `cargo run --example preempt`

use std::sync::Arc;
use std::time::Duration;

use agentloop::prelude::*;
use agentloop::PreemptAck;

/// A writer whose turn makes one slow "model call" per message, each followed by a
/// safe point where a preempt may end the turn.
struct Writer;

impl Agent for Writer {
    type Item = String;
    type Event = String;
    type State = usize;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<usize>, AgentError> {
        for (done, request) in turn.items.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(150)).await; // the model call
            cx.emit(format!("drafted an answer to {request:?}")).await;
            cx.safe_point(SafePoint::AfterModelCall, &(done + 1))?;
        }
        Ok(TurnOutcome::Completed)
    }
}

/// How a turn ended, in words.
fn ending(outcome: &TurnEnd) -> &'static str {
    match outcome {
        TurnEnd::Completed => "completed",
        TurnEnd::Preempted(_) => "preempted (its messages go to the next turn, first)",
        TurnEnd::Canceled(_) => "canceled",
        TurnEnd::Interrupted(_) => "interrupted",
        TurnEnd::Failed(_) | TurnEnd::PlanAborted(_) => "failed",
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let session = SessionHandle::spawn(
        SessionSpec::new("writer", "default"),
        Arc::new(Writer),
        None,
    )
    .await?;
    let mut events = session.subscribe();

    session
        .push("write a poem about the sea".to_string())
        .await?;
    session.push("with four lines".to_string()).await?;

    // Wait until the first turn runs, then change our mind.
    let mut preempted = false;
    while let Some(event) = events.next().await {
        match event {
            SessionEvent::TurnStarted { turn, items, .. } => {
                println!("turn {turn} started with {items} message(s)");
                if turn == 0 {
                    let ack = session
                        .push("actually, about mountains".to_string())
                        .options(PushOptions::preempt(
                            Preempt::any_safe_point().timeout(Duration::from_secs(5)),
                        ))
                        .await?;
                    if let PreemptAck::Submitted { turn } = ack {
                        println!(
                            "pushed a newer message: turn {turn} will end at its next safe point"
                        );
                    }
                }
            }
            SessionEvent::Agent { turn, event } => println!("  turn {turn}: {event}"),
            SessionEvent::Preempted { turn } => {
                preempted = true;
                println!("turn {turn} was preempted at a safe point");
            }
            SessionEvent::TurnEnded { turn, outcome, .. } => {
                println!("turn {turn} ended: {}", ending(&outcome));
                if turn >= 1 {
                    break;
                }
            }
            _ => {}
        }
    }
    session.stop(StopOptions::graceful()).await?;
    let exit = session.wait().await;
    println!(
        "the session ended: {} turns completed, {} preempted, {} messages handled, {} left over",
        exit.counters.turns_completed,
        exit.counters.turns_preempted,
        exit.counters.items_delivered,
        exit.unhandled_items.len() + exit.interrupted_items.len()
    );
    if !preempted || exit.counters.items_delivered != 3 {
        return Err("expected one preempted turn and all three messages handled".into());
    }
    Ok(())
}
