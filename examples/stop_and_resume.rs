//! Stop and resume across a restart (S17, S27): a persistent session is cut by a
//! graceful shutdown at its next safe point; its record keeps the cut turn's items and
//! the state of that safe point. A new runtime on the same data directory (a restarted
//! process does the same) resumes it: the resume turn continues from the saved state,
//! then the session handles what was still queued.
//!
//! Run: `cargo run --example stop_and_resume`

use std::time::Duration;

use agentloop::prelude::*;
use tokio::sync::mpsc;

/// A researcher whose turn takes three steps per question (search, read, write), each
/// a slow "model call" followed by a safe point; its state is how many steps are done.
struct Researcher;

const STEPS: [&str; 3] = [
    "searched the literature",
    "read the papers",
    "wrote the summary",
];

impl Agent for Researcher {
    type Item = String;
    type Event = String;
    type State = usize;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<usize>, AgentError> {
        // A resume turn gets the state saved at the cut turn's last safe point.
        let done = turn.resume.unwrap_or(0);
        if turn.resume.is_some() {
            println!("  [agent] resumes {:?} after step {done} of 3", turn.items);
        }
        for (step, what) in STEPS.iter().enumerate().skip(done) {
            tokio::time::sleep(Duration::from_millis(100)).await; // the model call
            println!("  [agent] step {}: {what}", step + 1);
            cx.emit(what.to_string()).await;
            cx.safe_point(SafePoint::AfterModelCall, &(step + 1))?;
        }
        Ok(TurnOutcome::Completed)
    }
}

/// A runtime on `dir` with the researcher registered; session ends go to `ends`.
async fn start(
    dir: &std::path::Path,
    ends: mpsc::UnboundedSender<agentloop::supervisor::SessionEnd<String>>,
) -> Result<(Runtime<String, String>, agentloop::runtime::StartReport), agentloop::RuntimeError> {
    Runtime::<String, String>::builder()
        .data_dir(dir)
        .register_agent("researcher", |_config: &[u8]| Ok(Researcher))
        .session_ends(ends)
        .start()
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir =
        std::env::temp_dir().join(format!("agentloop-stop-and-resume-{}", std::process::id()));
    let (ends, _) = mpsc::unbounded_channel();

    println!("first run:");
    let (rt, _) = start(&dir, ends).await?;
    let session = rt
        .supervisor()
        .spawn(SessionSpec::new("report-1", "researcher").persistent(true))
        .await?;
    let mut events = session.subscribe();
    session
        .push("what limits battery life?".to_string())
        .await?;
    // Shut down after the first step: the turn ends at its next safe point.
    while let Some(event) = events.next().await {
        if let SessionEvent::Agent { .. } = event {
            break;
        }
    }
    let report = rt.shutdown().await?;
    println!(
        "  shutdown: {} session(s) saved as Interrupted, carrying {} item(s)",
        report.checkpoints.saved, report.checkpoints.items_saved
    );

    println!("second run, same data directory:");
    let (ends, mut ended) = mpsc::unbounded_channel();
    let (rt, start_report) = start(&dir, ends).await?;
    println!(
        "  resumed {:?}, carrying {} item(s)",
        start_report.resumed, start_report.items
    );
    // Let it finish what it has (the resumed turn), then end.
    rt.supervisor()
        .stop("report-1", StopOptions::drain())
        .await?;
    let end = ended
        .recv()
        .await
        .ok_or("the runtime ended without reporting the session")?;
    println!(
        "  report-1 ended {}: {} turn(s) completed, {} item(s) handled, none lost ({} left over)",
        if matches!(end.exit.reason, ExitReason::Completed) {
            "Completed"
        } else {
            "otherwise"
        },
        end.exit.counters.turns_completed,
        end.exit.counters.items_delivered,
        end.exit.unhandled_items.len() + end.exit.interrupted_items.len()
    );
    rt.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    if start_report.resumed != ["report-1"] || end.exit.counters.items_delivered != 1 {
        return Err("expected report-1 resumed and its question answered".into());
    }
    Ok(())
}
