//! Push, preempt and stop options as callers build them (DESIGN S7, S9, S11, S12).
//!
//! This module owns the option types and their validation (non-positive durations are
//! refused with [`OptionsError`], never a panic). It does not decide what the options do
//! to a session: that is the TurnLoop's job (`session::turn_loop` and `session::stop`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::cancel::{CancelMode, CancelRequest, SafePoint};

/// An option value that cannot be used. Every variant names the option at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A duration was zero or negative.
    #[error(
        "option `{option}` must be a positive duration (got {got}); pass a value greater than zero"
    )]
    NonPositiveDuration {
        /// The option's name, e.g. `graceful_timeout`.
        option: &'static str,
        /// The value as given.
        got: String,
    },
    /// A push strategy panicked; the push was refused and its item handed back.
    #[error("the push strategy panicked; the push was refused and its item is handed back")]
    StrategyPanicked,
    /// A preempt or cancel targets no safe point.
    #[error(
        "option `{option}` names no safe point; use AfterModelCall, AfterToolCalls or AnySafePoint"
    )]
    NoSafePoint {
        /// The option's name.
        option: &'static str,
    },
}

/// Converts a signed millisecond count from an external source (a config value, a wire
/// message) into a positive [`Duration`], refusing zero and negative values.
///
/// `std::time::Duration` cannot be negative, so inside Rust only zero can be wrong; use
/// this at boundaries where a signed value arrives.
pub fn positive_millis(option: &'static str, millis: i64) -> Result<Duration, OptionsError> {
    if millis <= 0 {
        return Err(OptionsError::NonPositiveDuration {
            option,
            got: format!("{millis}ms"),
        });
    }
    Ok(Duration::from_millis(millis.unsigned_abs()))
}

fn check_positive(option: &'static str, d: Option<Duration>) -> Result<(), OptionsError> {
    match d {
        Some(d) if d.is_zero() => Err(OptionsError::NonPositiveDuration {
            option,
            got: format!("{d:?}"),
        }),
        _ => Ok(()),
    }
}

/// A preemption request carried by a push (S7): cancel the turn that was planning or
/// running when the push was accepted, at a safe point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preempt {
    /// The safe points at which the target turn may end.
    pub at: SafePoint,
    /// Escalate to Immediate when the target has not ended this long after the cancel
    /// was submitted.
    pub timeout: Option<Duration>,
    /// Submit the cancel only after this delay, and only if the target turn is still
    /// going then (a delayed preempt never cancels a later turn).
    pub delay: Option<Duration>,
}

impl Preempt {
    /// Preempt at the next safe point of the given kinds.
    pub fn at(at: SafePoint) -> Self {
        Preempt {
            at,
            timeout: None,
            delay: None,
        }
    }

    /// Preempt right after the target's next model call.
    pub fn after_model_call() -> Self {
        Self::at(SafePoint::AfterModelCall)
    }

    /// Preempt right after the target's next round of tool calls.
    pub fn after_tool_calls() -> Self {
        Self::at(SafePoint::AfterToolCalls)
    }

    /// Preempt at the target's next safe point of any kind.
    pub fn any_safe_point() -> Self {
        Self::at(SafePoint::AnySafePoint)
    }

    /// Escalate to Immediate after `d`.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Submit the cancel after `d`.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }

    /// Checks durations and the safe-point set.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.at.is_empty() {
            return Err(OptionsError::NoSafePoint { option: "preempt" });
        }
        check_positive("preempt.timeout", self.timeout)?;
        check_positive("preempt.delay", self.delay)
    }

    /// The cancel this preempt submits.
    pub fn cancel_request(&self) -> CancelRequest {
        CancelRequest {
            mode: CancelMode::At(self.at),
            timeout: self.timeout,
        }
    }
}

/// The phase of the turn a push lands on, as seen by a [`PushStrategy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnPhase {
    /// No turn is planning or running.
    Idle,
    /// The turn's plan is being computed; its consumed items are not known yet.
    Planning,
    /// The turn is running.
    Running,
}

/// The turn a push lands on, as a [`PushStrategy`] sees it (S9).
#[derive(Debug)]
pub struct TurnView<'a, I> {
    /// The turn's index, or `None` when idle.
    pub index: Option<u64>,
    /// The turn's phase.
    pub phase: TurnPhase,
    /// The items the turn consumed (empty while planning or idle).
    pub consumed: &'a [I],
}

/// A dynamic push strategy (S9): evaluated by the TurnLoop in its own message order, so
/// it sees exactly the turn the push lands on, and returns the preempt to apply (or
/// `None` to only buffer the item).
pub type PushStrategy<I> = Arc<dyn Fn(&TurnView<'_, I>) -> Option<Preempt> + Send + Sync>;

/// Options for one push. Build with [`PushOptions::new`], [`PushOptions::preempt`] or
/// [`PushOptions::strategy`].
pub struct PushOptions<I> {
    /// A static preempt.
    pub preempt: Option<Preempt>,
    /// A dynamic strategy; when set it replaces `preempt`.
    pub strategy: Option<PushStrategy<I>>,
    /// Set by `handle.push(item).no_wait()`: accounts for the item if the message is
    /// dropped unprocessed.
    pub(crate) unprocessed: Option<crate::shared::UnprocessedPush<I>>,
    /// Answer the push once its item is accepted (durable under `sync`), with
    /// [`crate::session::PreemptAck::Scheduled`] when its preempt still waits, instead of when
    /// the cancel is submitted (S7). See [`PushOptions::answer_at_acceptance`].
    pub answer_at_acceptance: bool,
    /// An idempotency key and a fingerprint of what the push carries (S34a): a
    /// session that accepted a push with this key answers a retry
    /// [`crate::session::PreemptAck::Duplicate`] and delivers nothing, also after a restart
    /// (the record keeps its last keys); the same key with another fingerprint is
    /// refused ([`crate::session::PushError::KeyReused`]).
    pub idempotency: Option<(String, u64)>,
    /// Set by the runtime's timers (S39): the push is a durable timer's fire, so the
    /// write that accepts its item also removes the timer (or moves a recurring one to
    /// its next slot), and it is written at once whatever the session's durability.
    pub(crate) timer: Option<crate::store::TimerChange>,
}

impl<I> Default for PushOptions<I> {
    fn default() -> Self {
        PushOptions {
            preempt: None,
            strategy: None,
            unprocessed: None,
            answer_at_acceptance: false,
            idempotency: None,
            timer: None,
        }
    }
}

impl<I> Clone for PushOptions<I> {
    fn clone(&self) -> Self {
        PushOptions {
            preempt: self.preempt,
            strategy: self.strategy.clone(),
            unprocessed: None,
            answer_at_acceptance: self.answer_at_acceptance,
            idempotency: self.idempotency.clone(),
            timer: self.timer.clone(),
        }
    }
}

impl<I> fmt::Debug for PushOptions<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PushOptions")
            .field("preempt", &self.preempt)
            .field("strategy", &self.strategy.as_ref().map(|_| "<fn>"))
            .field("answer_at_acceptance", &self.answer_at_acceptance)
            .finish()
    }
}

impl<I> PushOptions<I> {
    /// Only buffer the item.
    pub fn new() -> Self {
        Self::default()
    }

    /// Preempt the current turn.
    pub fn preempt(p: Preempt) -> Self {
        PushOptions {
            preempt: Some(p),
            ..Self::default()
        }
    }

    /// Decide the preempt from the turn the push lands on (S9).
    pub fn strategy<F>(f: F) -> Self
    where
        F: Fn(&TurnView<'_, I>) -> Option<Preempt> + Send + Sync + 'static,
    {
        PushOptions {
            strategy: Some(Arc::new(f)),
            ..Self::default()
        }
    }

    /// Answers the push once its item is accepted (durable under `sync`), also when its
    /// preempt still waits for a delay or a planning target: the answer is then
    /// [`crate::session::PreemptAck::Scheduled`], and the preempt's effect shows in the events
    /// (S34a; the HTTP front asks for this, so no client waits out a delay).
    pub fn answer_at_acceptance(mut self) -> Self {
        self.answer_at_acceptance = true;
        self
    }

    /// Carries an idempotency key and a fingerprint of the push (see
    /// [`PushOptions::idempotency`]).
    pub fn idempotency_key(mut self, key: impl Into<String>, fingerprint: u64) -> Self {
        self.idempotency = Some((key.into(), fingerprint));
        self
    }

    /// Checks the static preempt (a strategy's result is checked when it is evaluated).
    pub fn validate(&self) -> Result<(), OptionsError> {
        match &self.preempt {
            Some(p) => p.validate(),
            None => Ok(()),
        }
    }
}

/// Options for one stop request (S11). Build with the constructors, chain the
/// modifiers:
///
/// ```
/// use std::time::Duration;
/// use agentloop::StopOptions;
/// let opts = StopOptions::graceful_timeout(Duration::from_secs(5))
///     .cause("user closed the tab")
///     .skip_checkpoint();
/// assert!(opts.validate().is_ok());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOptions {
    /// The cancel to apply to the running turn, if any.
    pub cancel: Option<CancelRequest>,
    /// Finish every accepted item before exiting.
    pub drain: bool,
    /// Exit once idle for this long (does not commit the stop).
    pub idle_for: Option<Duration>,
    /// Do not persist at exit (sticky).
    pub skip_checkpoint: bool,
    /// A business reason (first non-empty wins).
    pub cause: Option<String>,
    /// Set by the shutdown coordinator: the session ends because the process shuts
    /// down, so its exit reason is `Shutdown`. The runtime's own: not part of the
    /// public surface (issue 31).
    pub(crate) shutdown: bool,
    /// Set by `cancel(id)` (S24): the record was already flipped to `Canceled`, so the
    /// exit leaves it as it is. Sticky. The runtime's own, like `shutdown`.
    pub(crate) canceled: bool,
}

impl StopOptions {
    /// A bare stop: no cancel; the running turn completes; the loop exits at the
    /// boundary; buffered items become unhandled.
    pub fn bare() -> Self {
        Self::default()
    }

    /// Cancel at the next safe point of any kind.
    pub fn graceful() -> Self {
        StopOptions {
            cancel: Some(CancelRequest {
                mode: CancelMode::At(SafePoint::AnySafePoint),
                timeout: None,
            }),
            ..Self::default()
        }
    }

    /// Cancel at the next safe point of any kind, escalating to Immediate after `d`.
    pub fn graceful_timeout(d: Duration) -> Self {
        StopOptions {
            cancel: Some(CancelRequest {
                mode: CancelMode::At(SafePoint::AnySafePoint),
                timeout: Some(d),
            }),
            ..Self::default()
        }
    }

    /// Cancel at the next safe point of the given kinds.
    pub fn at(points: SafePoint) -> Self {
        StopOptions {
            cancel: Some(CancelRequest {
                mode: CancelMode::At(points),
                timeout: None,
            }),
            ..Self::default()
        }
    }

    /// Drop the running turn's future now.
    pub fn immediate() -> Self {
        StopOptions {
            cancel: Some(CancelRequest {
                mode: CancelMode::Immediate,
                timeout: None,
            }),
            ..Self::default()
        }
    }

    /// Finish every accepted item (turns run as usual), then exit with nothing
    /// unhandled. New pushes are rejected as late from now on.
    pub fn drain() -> Self {
        StopOptions {
            drain: true,
            ..Self::default()
        }
    }

    /// Exit once the loop has been idle for `d` continuously. Never cancels a running
    /// turn; cancel options in the same call are ignored; only the first such request
    /// counts; a later non-idle stop commits at once.
    pub fn until_idle_for(d: Duration) -> Self {
        StopOptions {
            idle_for: Some(d),
            ..Self::default()
        }
    }

    /// Do not persist at exit. Sticky: no later stop can clear it.
    pub fn skip_checkpoint(mut self) -> Self {
        self.skip_checkpoint = true;
        self
    }

    /// Attach a business reason. The first non-empty cause across all stops wins.
    pub fn cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// Mark the stop as part of a process shutdown (exit reason `Shutdown`).
    pub fn shutdown(mut self) -> Self {
        self.shutdown = true;
        self
    }

    /// Adds a cancel timeout to this stop's cancel (turning a bare stop into a graceful
    /// one with a timeout).
    pub fn with_timeout(mut self, d: Duration) -> Self {
        let mode = self
            .cancel
            .map(|c| c.mode)
            .unwrap_or(CancelMode::At(SafePoint::AnySafePoint));
        self.cancel = Some(CancelRequest {
            mode,
            timeout: Some(d),
        });
        self
    }

    /// Whether this request only asks for an idle exit (it does not commit the stop).
    pub fn is_idle_only(&self) -> bool {
        self.idle_for.is_some()
    }

    /// What the session's stop fold reads of these options (`agentloop_core::stop`).
    pub(crate) fn request(&self) -> agentloop_core::stop::StopRequest {
        agentloop_core::stop::StopRequest {
            cancel: self.cancel,
            drain: self.drain,
            idle_for: self.idle_for,
            skip_checkpoint: self.skip_checkpoint,
            shutdown: self.shutdown,
            canceled: self.canceled,
        }
    }

    /// Checks durations and safe-point sets (S12): zero durations are refused.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if let Some(c) = &self.cancel {
            if let CancelMode::At(sp) = c.mode {
                if sp.is_empty() {
                    return Err(OptionsError::NoSafePoint {
                        option: "stop.cancel",
                    });
                }
            }
            check_positive("graceful_timeout", c.timeout)?;
        }
        check_positive("until_idle_for", self.idle_for)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s12_zero_durations_are_refused_with_the_option_named() {
        let e = StopOptions::graceful_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("graceful_timeout"), "{e}");
        let e = StopOptions::until_idle_for(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("until_idle_for"), "{e}");
        let e = Preempt::any_safe_point()
            .delay(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("preempt.delay"), "{e}");
        let e = Preempt::any_safe_point()
            .timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("preempt.timeout"), "{e}");
        assert!(Preempt::at(SafePoint::None).validate().is_err());
    }

    #[test]
    fn s12_negative_millis_are_refused() {
        let e = positive_millis("grace", -5).unwrap_err();
        assert_eq!(
            e,
            OptionsError::NonPositiveDuration {
                option: "grace",
                got: "-5ms".into()
            }
        );
        assert!(positive_millis("grace", 0).is_err());
        assert_eq!(
            positive_millis("grace", 7).unwrap(),
            Duration::from_millis(7)
        );
    }
}
