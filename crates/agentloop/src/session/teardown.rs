//! The session's teardown (DESIGN S21): final checkpoint → session-end hooks →
//! `Ended` → stream close → actor exit (ractor's `drain()`, so queued messages are
//! answered, never dropped).
//!
//! It performs the final action the core chose (`core::exit`) and settles the writes
//! still in flight; it never decides what the record becomes and never moves an item.

use std::collections::HashMap;

use crate::session::core::ExitPlan;
use crate::session::loop_state::{LoopState, Myself};
use crate::store::StoreError;
use crate::turn::agent::Agent;

/// S21 teardown: final checkpoint → session-end hooks → `Ended` → stream close →
/// actor exit (drain, so queued messages are answered).
pub(super) async fn teardown<A: Agent>(
    myself: &Myself<A>,
    state: &mut LoopState<A>,
    plan: ExitPlan<A::Item>,
) {
    let ExitPlan { exit, last } = plan;
    // Invariant: from here until it is published, the exit state lives in
    // `final_exit`, so an actor killed during the awaits below (store, hooks) still
    // hands every item back from its destructor.
    state.final_exit = Some(Box::new(exit));
    let result = match (&last, &state.store) {
        (crate::session::core::FinalAction::Write { write, .. }, Some(store)) => {
            store.write((**write).clone()).await.map(|()| true)
        }
        (crate::session::core::FinalAction::Delete, Some(store)) => {
            store.delete(&state.core.config.id).await
        }
        (crate::session::core::FinalAction::End { write }, Some(store)) => {
            // One whole write: the final record in place of what it held (S26a).
            store.write((**write).clone()).await.map(|()| true)
        }
        _ => Ok(false),
    };
    let checkpoint = match (&last, state.final_exit.as_deref()) {
        // A sleep's record was written before it fell asleep (S39).
        (crate::session::core::FinalAction::Nothing, Some(e))
            if e.reason == crate::session::ExitReason::Asleep =>
        {
            e.checkpoint.clone()
        }
        _ => last.outcome(result),
    };
    // Each push waiting for its write is answered with that write's own result.
    let mut results = HashMap::new();
    for (seq, done) in std::mem::take(&mut state.writes) {
        // A completion is always called (a dropped one says `Closed`); a receiver
        // without a value means its completion panicked.
        let r = done.await.unwrap_or(Err(StoreError::Closed));
        results.insert(seq, r);
    }
    let final_durable = matches!(
        checkpoint,
        crate::session::CheckpointOutcome::Saved | crate::session::CheckpointOutcome::Deleted
    );
    state.core.settle(
        |seq| results.get(&seq).cloned().unwrap_or(Ok(true)),
        final_durable,
    );
    let summary = match state.final_exit.as_mut() {
        Some(exit) => {
            exit.checkpoint = checkpoint;
            exit.summary()
        }
        None => return, // unreachable: set above and only taken below
    };
    // A sleep (S39) is not an end: no end hooks, no `Ended` (its subscriptions were
    // closed when it fell asleep), the supervisor keeps it.
    let asleep = summary.reason == crate::session::ExitReason::Asleep;
    if asleep {
        tracing::debug!("session asleep");
    } else {
        tracing::info!(reason = ?summary.reason, cause = ?summary.stop_cause, checkpoint = ?summary.checkpoint,
            unhandled = summary.unhandled, interrupted = summary.interrupted, "session ended");
        run_end_hooks(&state.end_hooks, state.hook_timeout, &summary).await;
    }
    // A delayed preempt's timer outlives no session (issue 52).
    for (_, t) in state.preempt_timers.drain() {
        t.abort();
    }
    // `Ended` only when nothing of the session runs again; `Restarting` when its
    // supervisor starts it again (S26). Decided before the exit is published, which
    // lets the supervisor act (it reads the same decision).
    let last = (!asleep).then(|| state.last(summary));
    if let Some(exit) = state.final_exit.take() {
        state.published = true;
        state.core.shared.fire_stopped();
        state.core.shared.publish_exit(*exit);
    }
    if let Some(last) = last {
        state.subscribers.end(last);
    }
    // Process what is already queued (pushes become late, with their items handed
    // back), then stop; later sends are refused with the message handed back.
    myself.drain();
}

/// S21: each hook bounded by the timeout and isolated (its own task: a panic or a hang
/// does not stop the next one).
async fn run_end_hooks(
    hooks: &[crate::session::EndHook],
    timeout: std::time::Duration,
    summary: &crate::session::ExitSummary,
) {
    for (i, hook) in hooks.iter().enumerate() {
        // The hook is called inside its task, so even a panic before its future exists
        // stays isolated from the session and from the next hook.
        let (hook, summary) = (hook.clone(), summary.clone());
        let task = tokio::spawn(async move { hook(summary).await });
        let abort = task.abort_handle();
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(hook = i, error = %e, "session-end hook failed"),
            Ok(Err(e)) => tracing::warn!(hook = i, error = %e, "session-end hook panicked"),
            Err(_) => {
                abort.abort();
                tracing::warn!(hook = i, ?timeout, "session-end hook timed out");
            }
        }
    }
}
