//! A service that embeds the runtime with a configuration, a cleanup hook and the
//! default signal handling, then shuts down gracefully (DESIGN S27, S28).
//!
//! `cargo run --example graceful_shutdown` runs three sessions, starts the shutdown
//! itself after a moment (press Ctrl+C earlier to see the signal path; twice to force)
//! and prints the report. Run it again: it resumes the sessions it saved. The data
//! directory is `target/graceful-shutdown-example` unless given as the first argument.

use std::time::Duration;

use agentloop::config::RuntimeConfig;
use agentloop::shutdown::listen_for_signals;
use agentloop::{shutdown::CleanupHook, Runtime, SessionSpec};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data_dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/graceful-shutdown-example".into());
    let config = RuntimeConfig::from_toml_str(&format!(
        r#"
        [shutdown]
        strategy = "cooperative"
        grace = "10s"
        force_timeout = "2s"
        cleanup = "3s"
        [store]
        data_dir = {data_dir:?}
        "#
    ))?;
    let (rt, start) = Runtime::<SimItem, SimEvent>::builder()
        .config(&config)
        .register_agent("sim", |_cfg: &[u8]| {
            Ok(SimAgent::new(Script::react(
                5,
                Duration::from_millis(200),
                Duration::from_millis(100),
            )))
        })
        .on_shutdown(CleanupHook::new("say goodbye", || async {
            println!("cleanup hook: closing connections");
            Ok(())
        }))
        .start()
        .await?;
    println!(
        "resumed {} sessions carrying {} items",
        start.resumed.len(),
        start.items
    );
    let _signals = listen_for_signals(rt.shutdown_handle(), |sig, n| {
        println!(
            "{sig} #{n}: {}",
            if n == 1 { "shutting down" } else { "forcing" }
        )
    })?;
    for s in 0..3u64 {
        let id = format!("example-{s}-{}", std::process::id());
        let session = rt
            .supervisor()
            .spawn(SessionSpec::new(id, "sim").persistent(true))
            .await?;
        for i in 0..3 {
            session
                .push(SimItem::new(s * 10 + i, format!("task {i}")))
                .await?;
        }
    }
    // A service would wait for its own stop condition; this one stops after a moment
    // (unless a signal came first: then this joins that shutdown and gets its report).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = rt.shutdown().await?;
    println!(
        "shutdown: {} sessions ({} in grace, {} forced, {} killed), {} saved Interrupted with {} items, took {:?}",
        report.sessions.total,
        report.sessions.exited_in_grace,
        report.sessions.forced,
        report.sessions.killed,
        report.checkpoints.saved,
        report.checkpoints.items_saved,
        report.phases.total
    );
    Ok(())
}
