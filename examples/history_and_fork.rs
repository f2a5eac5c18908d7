//! History and fork ("time travel"): a session that keeps its last N turn-end
//! checkpoints. After it ends, list them, read one (the items still queued at that
//! turn's end, and the state), and start a new session from it: the fork picks up
//! exactly where that checkpoint was, while the original's history stays as it was.
//!
//! Run: `cargo run --example history_and_fork`

use std::time::Duration;

use agentloop::prelude::*;

/// Works through a to-do list, one task per turn.
struct Worker;

impl Agent for Worker {
    type Item = String;
    type Event = String;
    type State = ();

    /// One task per turn; the rest stay queued, in order.
    async fn plan(&self, offer: PlanInput<String>) -> Result<Plan<String>, AgentError> {
        let mut consumed = offer.into_items();
        let remaining = consumed.split_off(consumed.len().min(1));
        Ok(Plan {
            consumed,
            remaining,
        })
    }

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        for task in &turn.items {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cx.emit(format!("done: {task}")).await;
            cx.safe_point(SafePoint::AfterToolCalls, &())?;
        }
        Ok(TurnOutcome::Completed)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir =
        std::env::temp_dir().join(format!("agentloop-history-and-fork-{}", std::process::id()));
    let (rt, _) = Runtime::<String, String>::builder()
        .data_dir(&dir)
        .register_agent("worker", |_config: &[u8]| Ok(Worker))
        .start()
        .await?;

    // Keep the last 10 turn-end checkpoints (the runtime's default durability, sync).
    let session = rt
        .supervisor()
        .spawn(
            SessionSpec::new("todo", "worker")
                .persistent(true)
                .history(10),
        )
        .await?;
    for task in [
        "book the venue",
        "send invitations",
        "order food",
        "rent chairs",
    ] {
        session.push(task.to_string()).await?;
    }
    session.stop(StopOptions::drain()).await?;
    let exit = session.wait().await;
    println!("todo ended after {} turns", exit.counters.turns_completed);

    println!("its checkpoints:");
    for entry in rt.history("todo").await? {
        println!("  after turn {} ({} bytes)", entry.turn, entry.size);
    }
    let at_turn_1 = rt
        .checkpoint("todo", 1)
        .await?
        .ok_or("no checkpoint kept for turn 1")?;
    println!(
        "after turn 1, still queued: {}",
        serde_json::to_string(&at_turn_1.unhandled_items)?
    );

    // A new session from that checkpoint: it does the two tasks queued there.
    let branch = rt.fork("todo", 1, "todo-branch", 0).await?;
    branch.stop(StopOptions::drain()).await?;
    let exit = branch.wait().await;
    println!(
        "todo-branch (forked from turn 1 of todo) handled {} task(s)",
        exit.counters.items_delivered
    );
    rt.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    if exit.counters.items_delivered != 2 {
        return Err("expected the fork to handle the two tasks queued after turn 1".into());
    }
    Ok(())
}
