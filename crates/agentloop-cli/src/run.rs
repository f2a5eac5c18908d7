//! `agentloop run`: runs sessions of the simulated agent, pushes items to them, drains
//! them and prints each session's exit state and a total. Sessions run in memory for
//! now; the sled store, live progress, signals and the shutdown report come with the
//! checkpoint and shutdown issues.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{SessionConfig, SessionHandle, StopOptions};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};

/// The usage line of `agentloop run`.
pub(crate) const RUN_USAGE: &str =
    "usage: agentloop run [--sessions N] [--items-per-session M] [--model-ms MS] [--tool-ms MS]";

pub(crate) struct RunArgs {
    sessions: usize,
    items: u64,
    model_ms: u64,
    tool_ms: u64,
}

pub(crate) fn parse_run(args: &[String]) -> Result<RunArgs, String> {
    let mut run = RunArgs {
        sessions: 4,
        items: 5,
        model_ms: 20,
        tool_ms: 10,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{RUN_USAGE}"))?;
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{flag} takes a whole number, got `{value}`\n{RUN_USAGE}"))?;
        match flag.as_str() {
            "--sessions" if n > 0 => run.sessions = n as usize,
            "--items-per-session" if n > 0 => run.items = n,
            "--model-ms" => run.model_ms = n,
            "--tool-ms" => run.tool_ms = n,
            "--sessions" | "--items-per-session" => {
                return Err(format!("{flag} must be at least 1\n{RUN_USAGE}"))
            }
            _ => return Err(format!("unknown option {flag}\n{RUN_USAGE}")),
        }
    }
    Ok(run)
}

pub(crate) async fn run(args: RunArgs) -> Result<(), String> {
    let started = Instant::now();
    let script = Script::react(
        1,
        Duration::from_millis(args.model_ms),
        Duration::from_millis(args.tool_ms),
    );
    let mut handles: Vec<SessionHandle<SimItem, SimEvent>> = Vec::new();
    for s in 0..args.sessions {
        let agent = Arc::new(SimAgent::new(script.clone()));
        let h = SessionHandle::spawn(SessionConfig::new(format!("session-{s}")), agent, None)
            .await
            .map_err(|e| e.to_string())?;
        handles.push(h);
    }
    println!(
        "agentloop: {} sessions running the simulated agent",
        handles.len()
    );
    for (s, h) in handles.iter().enumerate() {
        for i in 0..args.items {
            let id = s as u64 * args.items + i;
            h.push(SimItem::new(id, format!("message {i}")))
                .await
                .map_err(|e| e.to_string())?;
        }
        h.stop(StopOptions::drain().cause("all items pushed"))
            .await
            .map_err(|e| e.to_string())?;
    }
    let (mut turns, mut delivered) = (0, 0);
    for h in &handles {
        let exit = h.wait().await;
        turns += exit.counters.turns_completed;
        delivered += exit.counters.items_delivered;
        println!(
            "{:<12} {:?}  turns {:>3}  items {:>4}  unhandled {}",
            exit.session_id,
            exit.reason,
            exit.counters.turns_completed,
            exit.counters.items_delivered,
            exit.unhandled_items.len()
        );
    }
    println!(
        "done: {} sessions, {turns} turns, {delivered} items delivered in {:.2?}",
        handles.len(),
        started.elapsed()
    );
    Ok(())
}
