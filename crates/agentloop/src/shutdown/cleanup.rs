//! The cleanup phase (DESIGN S27 step 4): flush the store, run the registered cleanup
//! hooks in registration order, flush the logs, all within the `cleanup` bound.
//!
//! Each hook runs in its own task, so a panic stays isolated, and is bounded by an
//! even share of what is left of the phase (the time left divided by the hooks not yet
//! run): a hook that hangs is cut at its share and the ones after it still run; a fast
//! hook leaves its unused time to the later ones. This module owns the hook type and
//! that bound; it does not know about sessions.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::report::{HookOutcome, HookReport};

/// A cleanup hook: an async function run once at shutdown. An `Err` is reported, never
/// fatal to the other hooks.
pub type CleanupFn = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A named cleanup hook.
#[derive(Clone)]
pub struct CleanupHook {
    /// Its name in the report.
    pub name: String,
    /// What it runs.
    pub run: CleanupFn,
}

impl CleanupHook {
    /// A hook from an async closure.
    pub fn new<F, Fut>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        CleanupHook {
            name: name.into(),
            run: Arc::new(move || Box::pin(f())),
        }
    }
}

impl std::fmt::Debug for CleanupHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CleanupHook")
            .field("name", &self.name)
            .finish()
    }
}

/// Runs `hooks` in order before `deadline`, each bounded by its share.
pub(crate) async fn run_hooks(hooks: &[CleanupHook], deadline: Instant) -> Vec<HookReport> {
    let mut out = Vec::with_capacity(hooks.len());
    for (i, hook) in hooks.iter().enumerate() {
        let started = Instant::now();
        let left = deadline.saturating_duration_since(started);
        let share = left / (hooks.len() - i) as u32;
        if share.is_zero() {
            tracing::warn!(hook = %hook.name, "cleanup bound spent: hook not run");
            out.push(HookReport {
                name: hook.name.clone(),
                outcome: HookOutcome::TimedOut,
                took: Duration::ZERO,
            });
            continue;
        }
        // Called inside the task: a panic before its future exists stays isolated too.
        let run = hook.run.clone();
        let task = tokio::spawn(async move { run().await });
        let abort = task.abort_handle();
        let outcome = match tokio::time::timeout(share, task).await {
            Ok(Ok(Ok(()))) => HookOutcome::Ok,
            Ok(Ok(Err(e))) => HookOutcome::Failed(e),
            Ok(Err(e)) => HookOutcome::Failed(format!("panicked: {e}")),
            Err(_) => {
                abort.abort();
                HookOutcome::TimedOut
            }
        };
        match &outcome {
            HookOutcome::Ok => tracing::info!(hook = %hook.name, "cleanup hook done"),
            HookOutcome::Failed(e) => {
                tracing::warn!(hook = %hook.name, error = %e, "cleanup hook failed")
            }
            HookOutcome::TimedOut => {
                tracing::warn!(hook = %hook.name, ?share, "cleanup hook cut at its share of the cleanup bound")
            }
        }
        out.push(HookReport {
            name: hook.name.clone(),
            outcome,
            took: started.elapsed(),
        });
    }
    out
}
