//! Requests that cross nodes (issue 18, S36): what a node sends the owner of a session
//! it does not run, and what it gets back. Only serializable requests cross: a push's
//! item as JSON and a static preempt as data; a push with an S9 strategy (a closure)
//! is refused with [`crate::push::PushError::NotForwardable`].
//!
//! This file owns the wire shapes and the [`Forward`] hook a cluster node installs on
//! the runtime's handle; the transport is the `agentloop-cluster` crate
//! (`ractor_cluster`), and the local handling is the supervisor's.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::cancel::{CancelMode, CancelRequest, SafePoint};
use crate::events::{EventFilter, EventStream};
use crate::options::{Preempt, StopOptions};
use crate::push::{PreemptAck, PushError};

/// A request for the owner of a session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Request {
    /// A push (S5), with a static preempt (S7) when it carries one.
    Push {
        /// The session.
        session: String,
        /// The item, as JSON.
        item: serde_json::Value,
        /// The preempt, as data.
        preempt: Option<WirePreempt>,
        /// Answer once the item is accepted ([`crate::options::PushOptions::answer_at_acceptance`]).
        #[serde(default)]
        early: bool,
        /// The idempotency key and fingerprint ([`crate::options::PushOptions::idempotency`]).
        #[serde(default)]
        idempotency: Option<(String, u64)>,
        /// A durable timer's fire (S39): the timer's change rides the write that
        /// accepts the item on the owner.
        #[serde(default)]
        timer: Option<crate::store::TimerChange>,
    },
    /// Resume a stored session whose lease was handed to the receiving node (a planned
    /// move, S38).
    Resume {
        /// The session.
        session: String,
    },
    /// Stop or detach a session the receiving node runs.
    Control {
        /// The session.
        session: String,
        /// What to do.
        op: Control,
    },
    /// Open a relay of the event stream of a session the receiving node runs
    /// (the `agentloop-cluster` crate's `relay`), after event `after` when given.
    Subscribe {
        /// The session.
        session: String,
        /// The last event number the subscriber saw, if any.
        after: Option<u64>,
        /// Which events.
        filter: EventFilter,
    },
    /// The next events of relay `stream` (waits up to [`RELAY_POLL`] for the first).
    NextEvents {
        /// The relay.
        stream: u64,
    },
    /// Close relay `stream` (its subscriber went away).
    CloseEvents {
        /// The relay.
        stream: u64,
    },
}

/// How long the owner holds a [`Request::NextEvents`] waiting for an event before it
/// answers with none (well inside the forwarding timeout).
pub const RELAY_POLL: Duration = Duration::from_secs(5);

/// A control request that crosses nodes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Control {
    /// A stop with these options (S11).
    Stop(WireStop),
    /// A detach (S23).
    Detach,
}

/// Where a stop's cancel ends the running turn.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum WireCancel {
    /// At once.
    Immediate,
    /// At the next safe point of these kinds.
    At(WireSafePoint),
}

/// [`StopOptions`] as data.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireStop {
    /// The cancel of the running turn, if any.
    pub cancel: Option<WireCancel>,
    /// The cancel's escalation timeout, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Finish every accepted item first.
    pub drain: bool,
    /// Exit once idle this long, in milliseconds.
    pub idle_for_ms: Option<u64>,
    /// Do not persist at exit.
    pub skip_checkpoint: bool,
    /// The business reason.
    pub cause: Option<String>,
}

impl WireStop {
    /// The options as data; `None` for a cancel at a safe-point set other than the
    /// three named ones (it cannot cross).
    pub fn from_options(o: &StopOptions) -> Option<Self> {
        let cancel = match &o.cancel {
            None => None,
            Some(c) => Some(match c.mode {
                CancelMode::Immediate => WireCancel::Immediate,
                CancelMode::At(at) => WireCancel::At(WireSafePoint::from_safe_point(at)?),
            }),
        };
        Some(WireStop {
            cancel,
            timeout_ms: o
                .cancel
                .as_ref()
                .and_then(|c| c.timeout)
                .map(|d| d.as_millis() as u64),
            drain: o.drain,
            idle_for_ms: o.idle_for.map(|d| d.as_millis() as u64),
            skip_checkpoint: o.skip_checkpoint,
            cause: o.cause.clone(),
        })
    }

    /// Back to options.
    pub fn to_options(&self) -> StopOptions {
        StopOptions {
            cancel: self.cancel.map(|c| CancelRequest {
                mode: match c {
                    WireCancel::Immediate => CancelMode::Immediate,
                    WireCancel::At(at) => CancelMode::At(at.to_safe_point()),
                },
                timeout: self.timeout_ms.map(Duration::from_millis),
            }),
            drain: self.drain,
            idle_for: self.idle_for_ms.map(Duration::from_millis),
            skip_checkpoint: self.skip_checkpoint,
            cause: self.cause.clone(),
            ..StopOptions::default()
        }
    }
}

/// What became of a control request sent to another node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlOutcome {
    /// Done there.
    Done,
    /// No node runs it.
    UnknownSession,
    /// The node that runs it could not be reached.
    Unreachable {
        /// That node.
        node: String,
        /// What happened.
        error: String,
    },
    /// That node refused it (the message says why).
    Refused(String),
}

/// A static preempt as data.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WirePreempt {
    /// `model`, `tools` or `any`.
    pub at: WireSafePoint,
    /// Escalation timeout, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Delay before the cancel, in milliseconds.
    pub delay_ms: Option<u64>,
}

/// The safe points a preempt targets.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum WireSafePoint {
    /// After a model call.
    Model,
    /// After tool calls.
    Tools,
    /// Either.
    Any,
}

impl WireSafePoint {
    /// One of the three named sets, or `None`.
    pub fn from_safe_point(at: SafePoint) -> Option<Self> {
        if at == SafePoint::AfterModelCall {
            Some(WireSafePoint::Model)
        } else if at == SafePoint::AfterToolCalls {
            Some(WireSafePoint::Tools)
        } else if at == SafePoint::AnySafePoint {
            Some(WireSafePoint::Any)
        } else {
            None
        }
    }

    /// The safe-point set.
    pub fn to_safe_point(self) -> SafePoint {
        match self {
            WireSafePoint::Model => SafePoint::AfterModelCall,
            WireSafePoint::Tools => SafePoint::AfterToolCalls,
            WireSafePoint::Any => SafePoint::AnySafePoint,
        }
    }
}

impl WirePreempt {
    /// The preempt as data (every valid preempt has one of the three safe-point sets).
    pub fn from_preempt(p: &Preempt) -> Option<Self> {
        let at = WireSafePoint::from_safe_point(p.at)?;
        Some(WirePreempt {
            at,
            timeout_ms: p.timeout.map(|d| d.as_millis() as u64),
            delay_ms: p.delay.map(|d| d.as_millis() as u64),
        })
    }

    /// Back to a preempt.
    pub fn to_preempt(self) -> Preempt {
        Preempt {
            at: self.at.to_safe_point(),
            timeout: self.timeout_ms.map(Duration::from_millis),
            delay: self.delay_ms.map(Duration::from_millis),
        }
    }
}

/// The receiving node's answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum PushAnswer {
    /// The handed-over session runs here now.
    Resumed,
    /// Accepted (durable under `sync`), with what the preempt did.
    Accepted(WireAck),
    /// The owner does not run it either (it moved, or ended).
    UnknownSession,
    /// The session is stopping: late; the caller still holds the item.
    Late,
    /// Accepted but not durable: the owner's store failed.
    NotDurable(String),
    /// Refused: the session holds all its bound allows (S34a); the caller still holds
    /// the item.
    Full(crate::push::BufferFull),
    /// Refused for another reason (invalid options, not storable), said in words.
    Refused(String),
    /// A control request was done.
    Done,
    /// A relay of the session's events is open under this number.
    Subscribed(u64),
    /// A relay's next events (JSON of [`crate::events::Sequenced`]), in order; `ended` once the
    /// last of them is `Ended` (the relay is closed then).
    Events {
        /// The events.
        events: Vec<serde_json::Value>,
        /// Whether the stream ended.
        ended: bool,
    },
    /// The relay is gone (closed, or unpolled for too long): resubscribe.
    UnknownStream,
}

/// [`PreemptAck`] as data.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum WireAck {
    /// No preempt requested.
    NotRequested,
    /// Nothing to preempt.
    NoTarget,
    /// Submitted to this turn.
    Submitted(u64),
    /// The target ended first.
    TargetEnded(u64),
    /// Accepted; the preempt of this turn waits.
    Scheduled(u64),
    /// A retry of a push with the same idempotency key: nothing delivered again.
    Duplicate,
}

impl From<PreemptAck> for WireAck {
    fn from(a: PreemptAck) -> Self {
        match a {
            PreemptAck::NotRequested => WireAck::NotRequested,
            PreemptAck::NoTarget => WireAck::NoTarget,
            PreemptAck::Submitted { turn } => WireAck::Submitted(turn),
            PreemptAck::TargetEnded { turn } => WireAck::TargetEnded(turn),
            PreemptAck::Scheduled { turn } => WireAck::Scheduled(turn),
            PreemptAck::Duplicate => WireAck::Duplicate,
        }
    }
}

impl From<WireAck> for PreemptAck {
    fn from(a: WireAck) -> Self {
        match a {
            WireAck::NotRequested => PreemptAck::NotRequested,
            WireAck::NoTarget => PreemptAck::NoTarget,
            WireAck::Submitted(turn) => PreemptAck::Submitted { turn },
            WireAck::TargetEnded(turn) => PreemptAck::TargetEnded { turn },
            WireAck::Scheduled(turn) => PreemptAck::Scheduled { turn },
            WireAck::Duplicate => PreemptAck::Duplicate,
        }
    }
}

/// The options of a push that cross nodes: everything of [`crate::options::PushOptions`] but a
/// strategy (S9 strategies are closures and stay on their node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// The static preempt.
    pub preempt: Option<Preempt>,
    /// [`crate::options::PushOptions::answer_at_acceptance`].
    pub answer_at_acceptance: bool,
    /// [`crate::options::PushOptions::idempotency`].
    pub idempotency: Option<(String, u64)>,
    /// A durable timer's fire (S39), whose change rides the owner's write.
    pub timer: Option<crate::store::TimerChange>,
}

impl Forwarded {
    /// The options of `options` that cross nodes.
    pub fn of<I>(options: &crate::options::PushOptions<I>) -> Self {
        Forwarded {
            preempt: options.preempt,
            answer_at_acceptance: options.answer_at_acceptance,
            idempotency: options.idempotency.clone(),
            timer: options.timer.clone(),
        }
    }

    /// The push options they stand for on the owner.
    pub fn to_options<I>(&self) -> crate::options::PushOptions<I> {
        let mut o = match self.preempt {
            Some(p) => crate::options::PushOptions::preempt(p),
            None => crate::options::PushOptions::new(),
        };
        o.answer_at_acceptance = self.answer_at_acceptance;
        o.idempotency = self.idempotency.clone();
        o.timer = self.timer.clone();
        o
    }
}

/// How a runtime reaches the owner of a session it does not run: installed by a
/// cluster node ([`crate::runtime::RuntimeHandle::set_forwarder`]).
pub trait Forward<I, E>: Send + Sync + 'static {
    /// Pushes `item` to the owner of `session`, if another node owns it:
    /// `UnknownSession` when none does; `NotForwardable` when one does and the push is
    /// not `forwardable` (it carries an S9 strategy).
    fn push(
        &self,
        session: String,
        item: I,
        options: Forwarded,
        forwardable: bool,
    ) -> BoxFuture<'static, Result<PreemptAck, PushError<I>>>;

    /// Asks node `node` to resume stored session `session`, whose lease was handed to
    /// it; resolves once it runs there (or why not).
    fn resume_on(&self, node: String, session: String) -> BoxFuture<'static, Result<(), String>>;

    /// Whether node `node` can be asked now (it is joined), checked before a move.
    fn reachable(&self, node: &str) -> bool;

    /// Sends a stop or detach to the node that runs `session`, if another one does.
    fn control(&self, session: String, op: Control) -> BoxFuture<'static, ControlOutcome>;

    /// Subscribes to the events of `session` at the node that runs it, if another one
    /// does: a stream relayed from there (after event `after` when given). The error
    /// is never [`ControlOutcome::Done`].
    fn subscribe(
        &self,
        session: String,
        after: Option<u64>,
        filter: EventFilter,
    ) -> BoxFuture<'static, Result<EventStream<E>, ControlOutcome>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preempts_and_acks_survive_the_wire() {
        for at in [
            SafePoint::AfterModelCall,
            SafePoint::AfterToolCalls,
            SafePoint::AnySafePoint,
        ] {
            let p = Preempt {
                at,
                timeout: Some(Duration::from_millis(250)),
                delay: None,
            };
            let w = WirePreempt::from_preempt(&p).unwrap();
            let back: WirePreempt =
                serde_json::from_str(&serde_json::to_string(&w).unwrap()).unwrap();
            assert_eq!(back.to_preempt(), p);
        }
        for a in [
            PreemptAck::NotRequested,
            PreemptAck::NoTarget,
            PreemptAck::Submitted { turn: 3 },
            PreemptAck::TargetEnded { turn: 4 },
        ] {
            assert_eq!(PreemptAck::from(WireAck::from(a)), a);
        }
        for o in [
            StopOptions::graceful_timeout(Duration::from_secs(2)).cause("deploy"),
            StopOptions::immediate(),
            StopOptions::drain().skip_checkpoint(),
            StopOptions::until_idle_for(Duration::from_millis(300)),
            StopOptions::bare(),
        ] {
            let w = WireStop::from_options(&o).expect("crosses");
            let back: WireStop = serde_json::from_str(&serde_json::to_string(&w).unwrap()).unwrap();
            assert_eq!(back.to_options(), o);
        }
    }
}
