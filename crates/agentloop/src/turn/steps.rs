//! Durable steps on the turn context (DESIGN S1b, issue 32): `cx.step(name, |key| …)`
//! runs a side effect once. The decision (run, run again, replay, unknown, diverged)
//! is the journal's, in `agentloop_core::steps`; the journal lives in the turn's
//! control block beside the safe points' state; the session writes each entry
//! (`sync`, `turn`) and this file waits for that write before handing the result to
//! the agent.
//!
//! This file owns the agent-facing shape of a step: its outcome, its errors, its
//! events and its trace. It never touches the store and never decides what is journaled.

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

use crate::cancel::Canceled;
use crate::events::SessionEvent;
use crate::store::codec::payload;
use crate::turn::agent::TurnCx;
use crate::turn::agent::{Agent, AgentError};
use crate::turn::control::{StepDurable, StepWrite, TurnControl};
pub use agentloop_core::steps::{StepDecision, StepError, StepKey, StepPolicy};

/// What a step with a policy gives the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOutcome<T> {
    /// The step's result: it ran now, or it had run and its journaled result is
    /// replayed.
    Done(T),
    /// A [`StepPolicy::NoRetry`] step began in an earlier run of the turn and left no
    /// result: it may or may not have had its effect. It is not run again; reconcile
    /// with the external system by `key` (for example, look the payment up).
    Unknown {
        /// The step's key, as the earlier run handed it to the external system.
        key: StepKey,
    },
}

/// Why a step did not give a result. Propagate it with `?` (it converts into
/// [`AgentError`]); the turn ends as the error says whatever the agent returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepFailed {
    /// A cancel in force matched the step boundary (a boundary counts as a safe point
    /// of kind `AfterToolCalls`): the step did not run; the turn ends canceled or
    /// preempted and resumes from its last safe point, replaying the steps journaled
    /// since.
    #[error(transparent)]
    Canceled(#[from] Canceled),
    /// The journal refused the step: it diverged from what the journal holds at its
    /// position, its name is unusable, or its result is over the turn's bound. The
    /// turn ends `Failed` and the record is kept.
    #[error("step `{name}`: {error}")]
    Refused {
        /// The step's name.
        name: String,
        /// Why.
        error: StepError,
    },
    /// The step ran but its result cannot be journaled (it does not encode, or does not
    /// read back). The turn ends `Failed`; after a restart it runs again with the same
    /// key.
    #[error("the result of step `{name}` cannot be journaled: {reason}; return a value whose serde form reads back (for example, no maps with non-string keys)")]
    Encode {
        /// The step's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The step ran but the write holding its result failed: it is not durable. The
    /// turn ends `Failed`; after a restart it runs again with the same key (or is
    /// unknown, for `NoRetry`).
    #[error("step `{name}` ran but its journal entry was not written: {reason}; the turn fails and the step runs again with the same key after a restart")]
    NotDurable {
        /// The step's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A journaled result does not decode as the type this run asks for: the step's
    /// result type changed since it ran. The turn ends `Failed` and the record is kept.
    #[error("the journaled result of step `{name}` does not decode as the type asked for: {reason}; deploy the code that journaled it, or delete the session")]
    Decode {
        /// The step's name.
        name: String,
        /// Why.
        reason: String,
    },
}

impl From<StepFailed> for AgentError {
    fn from(e: StepFailed) -> Self {
        match e {
            StepFailed::Canceled(c) => AgentError::Canceled(c),
            other => AgentError::Failed(other.to_string()),
        }
    }
}

/// Abandons a running step when its future is dropped (an Immediate cancel, a
/// `select!` that lost), so it no longer holds safe points back.
struct Running<I: Clone, S: Clone> {
    control: Arc<TurnControl<I, S>>,
    occurrence: u32,
    armed: bool,
}

impl<I: Clone, S: Clone> Drop for Running<I, S> {
    fn drop(&mut self) {
        if self.armed {
            self.control.step_abandon(self.occurrence);
        }
    }
}

/// Waits for the write holding a step's entry; `false` (or a session that went
/// away) means it is not durable.
async fn durable(wait: Option<StepDurable>) -> bool {
    match wait {
        None => true,
        Some(rx) => rx.await.unwrap_or(false),
    }
}

impl<A: Agent> TurnCx<A> {
    /// Runs a durable step (S1b) with the default policy, [`StepPolicy::Retry`]:
    /// `f` gets the step's [`StepKey`] (hand it to the external API as its
    /// idempotency key) and its result, any serde type (a `Result` of yours
    /// included), is journaled, durably under `sync` and `turn`, before this returns.
    /// When the turn runs again (after a crash, a restart, a move or a failover) a
    /// step that finished is answered from the journal without running `f`; one that
    /// began and left no result runs again with the same key.
    ///
    /// ```ignore
    /// let receipt: Result<Receipt, PaymentError> =
    ///     cx.step("charge", |key| async move { payments.charge(&key.to_string(), 42).await }).await?;
    /// ```
    pub async fn step<T, F, Fut>(&self, name: &str, f: F) -> Result<T, StepFailed>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.step_with(name, StepPolicy::Retry, f).await? {
            StepOutcome::Done(v) => Ok(v),
            // A Retry step is never unknown: it runs again instead.
            StepOutcome::Unknown { key } => Err(StepFailed::Refused {
                name: name.to_string(),
                error: StepError::NotStarted {
                    occurrence: key.occurrence,
                },
            }),
        }
    }

    /// Runs a durable step with `policy` (see [`TurnCx::step`]). With
    /// [`StepPolicy::NoRetry`] the step's beginning is journaled (durably under `sync`
    /// and `turn`) before `f` runs, and a step that began in an earlier run and left
    /// no result is not run again: the agent gets [`StepOutcome::Unknown`].
    pub async fn step_with<T, F, Fut>(
        &self,
        name: &str,
        policy: StepPolicy,
        f: F,
    ) -> Result<StepOutcome<T>, StepFailed>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = T>,
    {
        let session = &self.session.id;
        let (decision, begin_written) = self.control.step_begin(name, policy, session)?;
        let failed = |e: StepFailed| {
            self.control.step_failed(e.to_string());
            self.count(crate::metrics::StepResult::Failed);
            e
        };
        match decision {
            StepDecision::Refused(error) => {
                self.count(crate::metrics::StepResult::Failed);
                tracing::error!(session = %session, turn = self.turn, step = name, %error, "a durable step is refused; the turn fails and the record is kept");
                Err(StepFailed::Refused {
                    name: name.to_string(),
                    error,
                })
            }
            StepDecision::Replay { key, result } => {
                let value = payload::decode::<T>(&result).map_err(|e| {
                    failed(StepFailed::Decode {
                        name: name.to_string(),
                        reason: e.to_string(),
                    })
                })?;
                tracing::debug!(session = %session, turn = self.turn, step = %key, "durable step replayed from the journal");
                self.count(crate::metrics::StepResult::Replayed);
                self.step_event(SessionEvent::StepFinished {
                    turn: self.turn,
                    key,
                    replayed: true,
                    unknown: false,
                })
                .await;
                Ok(StepOutcome::Done(value))
            }
            StepDecision::Unknown { key } => {
                tracing::warn!(session = %session, turn = self.turn, step = %key, "a NoRetry step began before and left no result: its outcome is unknown and the agent reconciles");
                self.count(crate::metrics::StepResult::Unknown);
                self.step_event(SessionEvent::StepFinished {
                    turn: self.turn,
                    key: key.clone(),
                    replayed: false,
                    unknown: true,
                })
                .await;
                Ok(StepOutcome::Unknown { key })
            }
            StepDecision::Run { key, unknown, .. } => {
                let occurrence = key.occurrence;
                let mut running = Running {
                    control: self.control.clone(),
                    occurrence,
                    armed: true,
                };
                if !durable(begin_written).await {
                    return Err(failed(StepFailed::NotDurable {
                        name: name.to_string(),
                        reason: "the beginning of a NoRetry step was not written".into(),
                    }));
                }
                // On record before it starts (S1a).
                tracing::info!(
                    target: "agentloop::audit",
                    session = %session,
                    turn = self.turn,
                    step = %key,
                    rerun = unknown,
                    "durable step begins"
                );
                if unknown {
                    tracing::warn!(session = %session, turn = self.turn, step = %key, "a step that began before and left no result runs again with the same key");
                }
                self.step_event(SessionEvent::StepStarted {
                    turn: self.turn,
                    key: key.clone(),
                    rerun: unknown,
                })
                .await;
                let span =
                    tracing::info_span!("step", session = %session, turn = self.turn, key = %key);
                let value = f(key.clone()).instrument(span).await;
                let bytes = match payload::encode_checked(&value) {
                    Ok(b) => b,
                    Err(e) => {
                        return Err(failed(StepFailed::Encode {
                            name: name.to_string(),
                            reason: e.to_string(),
                        }))
                    }
                };
                let wait = self
                    .control
                    .step_finish(occurrence, name, bytes, session)
                    .map_err(|error| StepFailed::Refused {
                        name: name.to_string(),
                        error,
                    })?;
                running.armed = false;
                let wait = match wait {
                    None => None,
                    Some(StepWrite::Session(rx)) => Some(rx),
                    Some(StepWrite::Direct(rx, entry)) => match rx.await {
                        Ok(Ok(())) => None,
                        // Not straight into the record (none yet, or another format):
                        // with the session's next write.
                        Ok(Err(
                            crate::store::StoreError::NoRecord { .. }
                            | crate::store::StoreError::Refused { .. },
                        )) => self.control.step_requeue(&entry, session),
                        Ok(Err(e)) => {
                            return Err(failed(StepFailed::NotDurable {
                                name: name.to_string(),
                                reason: e.to_string(),
                            }))
                        }
                        Err(_) => {
                            return Err(failed(StepFailed::NotDurable {
                                name: name.to_string(),
                                reason: "the store went away".into(),
                            }))
                        }
                    },
                };
                if !durable(wait).await {
                    return Err(failed(StepFailed::NotDurable {
                        name: name.to_string(),
                        reason: "the write holding it failed".into(),
                    }));
                }
                self.count(crate::metrics::StepResult::Ran);
                self.step_event(SessionEvent::StepFinished {
                    turn: self.turn,
                    key,
                    replayed: false,
                    unknown: false,
                })
                .await;
                Ok(StepOutcome::Done(value))
            }
        }
    }

    fn count(&self, r: crate::metrics::StepResult) {
        if let Some(m) = &self.metrics {
            m.step(r);
        }
    }

    async fn step_event(&self, event: SessionEvent<A::Event>) {
        if !self.subscribers.wants(|f| f.steps) {
            self.subscribers.skip();
            return;
        }
        self.subscribers.send(event).await;
    }
}
