//! Deploying new agent code (S40): a support agent whose state changes shape between
//! version 1 and version 2, and the three things a deploy can do to a session that
//! version 1 left in the store.
//!
//! Version 1 counts the messages of a conversation (`StateV1 { messages }`); version 2
//! keeps them as a list of topics too (`StateV2 { messages, topics }`). A session runs on
//! version 1 and the runtime is shut down (its record says "version 1").
//!
//! 1. A runtime with version 2 alone refuses the session: the error names the kind, the
//!    record's version and the versions available, and the record is kept.
//! 2. A dry run of a runtime with version 2 and the migration from 1 says the session
//!    would be migrated, without writing.
//! 3. That runtime starts: the migration runs (typed, over `StateV1` kept in the new
//!    code), the session resumes on version 2 with the migrated state, and a new
//!    message is handled by version 2.
//!
//! Run: `cargo run --example deploy_new_version`

use agentloop::prelude::*;
use agentloop::versions::Migration;
use agentloop::versions::SessionFate;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

const SESSION: &str = "ticket-7";

/// Version 1's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StateV1 {
    messages: u32,
}

/// Version 2's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StateV2 {
    messages: u64,
    topics: Vec<String>,
}

struct SupportV1 {
    said: mpsc::UnboundedSender<String>,
}

impl Agent for SupportV1 {
    type Item = String;
    type Event = String;
    type State = StateV1;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<StateV1>, AgentError> {
        let messages = turn.state.map_or(0, |s| s.messages) + turn.items.len() as u32;
        let _ = self.said.send(format!("v1: {messages} message(s) so far"));
        Ok(TurnOutcome::CompletedWith {
            state: StateV1 { messages },
        })
    }
}

struct SupportV2 {
    said: mpsc::UnboundedSender<String>,
}

impl Agent for SupportV2 {
    type Item = String;
    type Event = String;
    type State = StateV2;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<StateV2>, AgentError> {
        let mut state = turn.state.unwrap_or(StateV2 {
            messages: 0,
            topics: Vec::new(),
        });
        state.messages += turn.items.len() as u64;
        state.topics.extend(turn.items.iter().cloned());
        let _ = self.said.send(format!(
            "v2: {} message(s) so far, topics {:?}",
            state.messages, state.topics
        ));
        Ok(TurnOutcome::CompletedWith { state })
    }
}

/// A builder on `dir` with the given versions of kind `support`, and the migration from
/// version 1 when `migrate`.
fn builder(
    dir: &std::path::Path,
    versions: &[u32],
    migrate: bool,
    said: &mpsc::UnboundedSender<String>,
) -> RuntimeBuilder<String, String> {
    let mut b = Runtime::<String, String>::builder().data_dir(dir);
    for &v in versions {
        let said = said.clone();
        b = match v {
            1 => b.register_agent_version("support", 1, move |_: &[u8]| {
                Ok(SupportV1 { said: said.clone() })
            }),
            _ => b.register_agent_version("support", 2, move |_: &[u8]| {
                Ok(SupportV2 { said: said.clone() })
            }),
        };
    }
    if migrate {
        b = b.register_migration(
            "support",
            1,
            // Typed: the old state type stays in the new code for as long as old
            // records may exist.
            Migration::new().state(|old: StateV1| {
                Ok(StateV2 {
                    messages: u64::from(old.messages),
                    topics: vec!["(before the upgrade)".to_string()],
                })
            }),
        );
    }
    b
}

async fn heard(said: &mut mpsc::UnboundedReceiver<String>) -> Result<String, String> {
    tokio::time::timeout(std::time::Duration::from_secs(30), said.recv())
        .await
        .map_err(|_| "the agent said nothing within 30 s".to_string())?
        .ok_or_else(|| "the agent is gone".to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = std::env::temp_dir().join(format!(
        "agentloop-deploy-new-version-{}",
        std::process::id()
    ));
    let (tx, mut said) = mpsc::unbounded_channel();

    // Version 1 runs the session; the runtime is shut down.
    let (rt, _) = builder(&dir, &[1], false, &tx).start().await?;
    rt.supervisor()
        .spawn(SessionSpec::new(SESSION, "support").persistent(true))
        .await?;
    rt.supervisor().push(SESSION, "refund".into()).await?;
    println!("{}", heard(&mut said).await?);
    rt.supervisor().push(SESSION, "invoice".into()).await?;
    println!("{}", heard(&mut said).await?);
    rt.shutdown().await?;
    println!("shut down: the record says version 1");

    // 1. Version 2 alone: refused, the record kept.
    let (rt, report) = builder(&dir, &[2], false, &tx).start().await?;
    for (id, why) in &report.skipped {
        println!("version 2 alone: not resumed: {id}: {why}");
    }
    rt.shutdown().await?;

    // 2. The dry run of the deploy: version 2 and the migration from 1.
    let store = agentloop::store::CheckpointActor::<String>::spawn(&dir).await?;
    let plan = builder(&dir, &[2], true, &tx).dry_run(&store).await?;
    store.close().await?;
    for s in &plan.sessions {
        if let SessionFate::Migrated { from, to } = s.fate {
            println!(
                "dry run: {} would be migrated from version {from} to {to}",
                s.id
            );
        }
    }

    // 3. The deploy: migrated, resumed on version 2 with the migrated state.
    let (rt, report) = builder(&dir, &[2], true, &tx).start().await?;
    println!("deployed: resumed {:?}", report.resumed);
    rt.supervisor().push(SESSION, "delivery".into()).await?;
    println!("{}", heard(&mut said).await?);
    rt.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
