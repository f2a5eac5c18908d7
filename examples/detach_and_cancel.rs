//! Detach and cancel by id (S23, S24): a client hands its session to the background and
//! goes away; the session keeps working, its record `Running` with everything it holds.
//! Later, anyone who knows the id (another request handler, another process on the same
//! store) cancels it: the record turns `Canceled` at once and the live session stops at
//! its next safe point, its unhandled items kept in its exit state and its record.
//!
//! Run: `cargo run --example detach_and_cancel`

use std::time::Duration;

use agentloop::prelude::*;
use tokio::sync::mpsc;

/// Indexes documents, one per "tool round".
struct Indexer;

impl Agent for Indexer {
    type Item = String;
    type Event = String;
    type State = usize;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<usize>, AgentError> {
        for (n, doc) in turn.items.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cx.emit(format!("indexed {doc}")).await;
            cx.safe_point(SafePoint::AfterToolCalls, &(n + 1))?;
        }
        Ok(TurnOutcome::Completed)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!(
        "agentloop-detach-and-cancel-{}",
        std::process::id()
    ));
    let (ends, mut ended) = mpsc::unbounded_channel();
    let (rt, _) = Runtime::<String, String>::builder()
        .data_dir(&dir)
        .register_agent("indexer", |_config: &[u8]| Ok(Indexer))
        .session_ends(ends)
        .start()
        .await?;

    // A client starts a long job, hands it to the background and leaves.
    {
        let session = rt
            .supervisor()
            .spawn(SessionSpec::new("index-all", "indexer").persistent(true))
            .await?;
        for n in 1..=100 {
            session.push(format!("doc-{n}")).await?;
        }
        session.detach().await?;
    }
    let view = rt.view("index-all").await?.ok_or("the record is missing")?;
    println!(
        "detached: record status {}, the client is gone",
        view.status
    );

    // Someone else watches it for a moment, then cancels it by id.
    let mut events = rt
        .supervisor()
        .subscribe("index-all", agentloop::EventFilter::all())
        .await?;
    let mut seen = 0;
    while let Some(event) = events.next().await {
        if let SessionEvent::Agent { event, .. } = event {
            println!("  {event}");
            seen += 1;
            if seen == 3 {
                break;
            }
        }
    }
    let status = rt.supervisor().cancel("index-all").await?;
    println!("canceled by id: record status {status}");

    let end = ended
        .recv()
        .await
        .ok_or("the runtime ended without reporting the session")?;
    let (cut, queued) = (
        end.exit.interrupted_items.len(),
        end.exit.unhandled_items.len(),
    );
    println!(
        "index-all ended {}: the cut turn's {cut} document(s) and {queued} queued are handed \
         back in its exit state (its record keeps them too), none lost",
        match end.exit.reason {
            ExitReason::Canceled(_) => "Canceled",
            _ => "otherwise",
        }
    );
    rt.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    if !matches!(end.exit.reason, ExitReason::Canceled(_)) || cut + queued == 0 {
        return Err("expected a canceled session with documents left".into());
    }
    Ok(())
}
