//! "Check the build in a while": a turn that ends with a wake-up time, a session that
//! sleeps meanwhile, the timer that wakes it (also after a restart), and a schedule
//! (S39, durable timers and sleeping sessions).
//!
//! The agent gets `start <build>`: it starts the build and ends its turn with
//! `cx.end_and_wake_at(now + 2 s, "check <build>")`. The timer is stored with the
//! session; the runtime puts the idle session to sleep after one second (its record is
//! written, its actor exits); two seconds after the turn the timer pushes `check
//! <build>` and the session wakes to run it. A second build is started, and the runtime
//! is shut down before its check is due: the next runtime on the same data directory
//! fires it. Last, a schedule (`Schedule::Every`) pushes `digest` every second until it
//! is canceled.
//!
//! Run: `cargo run --example check_build_later`

use std::time::{Duration, SystemTime};

use agentloop::prelude::*;
use agentloop::Schedule;
use tokio::sync::mpsc;

const SESSION: &str = "ci-bot";

/// Starts builds and checks them later; reports every turn's work on `said`.
struct CiBot {
    said: mpsc::UnboundedSender<String>,
}

impl Agent for CiBot {
    type Item = String;
    type Event = String;
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        let mut check = None;
        for item in &turn.items {
            let _ = self.said.send(item.clone());
            if let Some(build) = item.strip_prefix("start ") {
                check = Some(format!("check {build}"));
            }
        }
        match check {
            // The turn's last word: "come back to me in two seconds with this item".
            Some(item) => cx.end_and_wake_at(SystemTime::now() + Duration::from_secs(2), item),
            None => Ok(TurnOutcome::Completed),
        }
    }
}

async fn runtime(
    dir: &std::path::Path,
    said: &mpsc::UnboundedSender<String>,
) -> Result<Runtime<String, String>, Box<dyn std::error::Error>> {
    let said = said.clone();
    let (rt, _report) = Runtime::<String, String>::builder()
        .data_dir(dir)
        .idle_after(Duration::from_secs(1))
        .register_agent("ci-bot", move |_config: &[u8]| {
            Ok(CiBot { said: said.clone() })
        })
        .start()
        .await?;
    Ok(rt)
}

/// What the agent reported, kept in `log`, until it reports `what`.
struct Heard {
    said: mpsc::UnboundedReceiver<String>,
    log: Vec<String>,
}

impl Heard {
    async fn until(&mut self, what: &str) -> Result<(), String> {
        let wait = async {
            while let Some(line) = self.said.recv().await {
                self.log.push(line.clone());
                if line == what {
                    return Ok(());
                }
            }
            Err(format!("the agent stopped before it said {what:?}"))
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .map_err(|_| format!("the agent did not say {what:?} within 30 s"))?
    }

    /// How many times the agent was given `what`.
    fn count(&self, what: &str) -> usize {
        self.log.iter().filter(|l| *l == what).count()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = std::env::temp_dir().join(format!(
        "agentloop-check-build-later-{}",
        std::process::id()
    ));
    let (said_tx, said) = mpsc::unbounded_channel();
    let mut said = Heard {
        said,
        log: Vec::new(),
    };

    let rt = runtime(&dir, &said_tx).await?;
    rt.supervisor()
        .spawn(
            SessionSpec::new(SESSION, "ci-bot")
                .persistent(true)
                .durability(Durability::Sync),
        )
        .await?;
    rt.supervisor()
        .push(SESSION, "start build-1".into())
        .await?;
    said.until("start build-1").await?;
    println!("turn: started build-1, ended with a wake-up in 2 s");
    // The idle session falls asleep after a second; its timer is in the store.
    loop {
        let counts = rt.supervisor().counts().await;
        if counts.sleeping == 1 {
            println!("asleep: live {}, sleeping {}", counts.live, counts.sleeping);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let timers = rt.timers(SESSION).await?;
    println!(
        "timers: {} armed, pushing {:?}",
        timers.len(),
        timers[0].item
    );
    said.until("check build-1").await?;
    println!("woken: the timer pushed \"check build-1\"");

    // A check due after a restart: stored with the session, fired by the next runtime.
    rt.supervisor()
        .push(SESSION, "start build-2".into())
        .await?;
    said.until("start build-2").await?;
    rt.shutdown().await?;
    println!("shutdown before build-2's check was due");
    let rt = runtime(&dir, &said_tx).await?;
    said.until("check build-2").await?;
    println!("restarted: the new runtime fired \"check build-2\"");

    // A schedule: `digest` every second until canceled.
    let n = rt
        .schedule(
            SESSION,
            Schedule::Every(Duration::from_secs(1)),
            "digest".into(),
        )
        .await?;
    said.until("digest").await?;
    said.until("digest").await?;
    rt.cancel_timer(SESSION, n).await?;
    println!("schedule {n}: two digests, then canceled");
    rt.shutdown().await?;
    while let Ok(line) = said.said.try_recv() {
        said.log.push(line);
    }
    println!(
        "each check ran once: build-1 {}, build-2 {}",
        said.count("check build-1"),
        said.count("check build-2")
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
