//! Session events and their delivery to subscribers (DESIGN S20, S21).
//!
//! This module owns the event vocabulary, the subscriber registry and the stream a
//! subscriber reads. Delivery rules:
//!
//! * Each subscriber has its own bounded channel, and a subscriber never slows the
//!   session by default (S20): when its channel is full it *lags*: nothing more is
//!   queued to it, and when it has read what its channel holds it catches up from the
//!   replay buffer (the events since the first it missed, under the same lock that
//!   numbers events, so nothing is repeated or reordered), preceded by
//!   [`SessionEvent::Lagged`] for what the buffer no longer holds. A subscriber that
//!   asked for backpressure ([`EventFilter::with_backpressure`], in-process only) is
//!   different: turn events (turn started, agent events, preempted, turn ended) are
//!   sent from the turn task and wait for its capacity, so it slows the agent down,
//!   without ever blocking the TurnLoop actor. A dropped subscriber's sends fail at
//!   once: it costs nothing and is pruned.
//! * `StopRequested` is sent by the actor, which never waits: when a subscriber's buffer
//!   is full it is skipped for that subscriber (the cause is repeated in `Ended`).
//! * `Ended` never needs buffer capacity: teardown writes it into each subscriber's
//!   terminal slot, which the stream reads after its buffer drains. Teardown never
//!   waits on a subscriber, and `Ended` is always the last event; `None` after it is the
//!   authoritative end of the stream.
//! * Every event the session emits gets the next number of the session's sequence
//!   ([`Sequenced::seq`]), whether or not anybody listens, so the numbers are a
//!   property of the session's history, not of its audience. Numbers are given and
//!   events queued under one lock, so each stream sees them strictly increasing; a
//!   stream skips the numbers of events its filter drops (and of a `StopRequested`
//!   skipped for a full buffer). The sequence continues across restarts and resumes:
//!   the record keeps the last number written (S26).
//! * A session with a replay buffer (`SessionSpec::replay`) keeps its last
//!   events, so a subscriber can start after a number it saw
//!   (`Subscribers::subscribe_after`) and get exactly what it missed, or a
//!   [`SessionEvent::Lagged`] marker when the buffer no longer holds it. The buffer
//!   allocates at its first event: an idle session pays nothing for it (B2).
//! * A session that keeps its events in the store (S20a, `keeper`) answers what the
//!   replay buffer no longer holds from the store, for a new subscriber after `n` and
//!   for a lagging one catching up, with a `Lagged` where numbers are missing: an
//!   upper bound where a crash left numbers reserved and maybe never given
//!   ([`EventStream::lagged_upper_bound`]), exact elsewhere.
//!
//! It must not decide anything about turns or stops. Its rooms: `seq` (the numbers),
//! `filter`, `subscribers` (the registry and replay buffer), `keeper` (events kept in
//! the store) and `stream` (what a subscriber reads).

use serde::{Deserialize, Serialize};

use crate::cancel::CancelMode;
use crate::exit::ExitSummary;
use agentloop_core::steps::StepKey;
pub use agentloop_core::turn::TurnEnd;

mod filter;
pub(crate) mod keeper;
mod seq;
mod slot;
mod stream;
mod subscribers;

pub use filter::EventFilter;
pub use keeper::{set_replay_rate, EventCodec};
pub(crate) use seq::EventSeq;
pub use stream::EventStream;
pub(crate) use subscribers::Subscribers;

/// The default capacity of a subscriber's event buffer.
pub const DEFAULT_EVENT_CAPACITY: usize = 256;

/// An event of a session's stream (S20). It crosses nodes as JSON when a node relays
/// another node's stream (issue 18).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SessionEvent<E> {
    /// A turn's plan is done and the turn runs.
    TurnStarted {
        /// The turn's index.
        turn: u64,
        /// How many items it consumes.
        items: usize,
        /// Whether it resumes a cut turn (S17).
        resumed: bool,
    },
    /// An event emitted by the agent.
    Agent {
        /// The turn that emitted it.
        turn: u64,
        /// The event.
        event: E,
    },
    /// A durable step (S1b) begins to run: on record before its effect.
    StepStarted {
        /// The turn.
        turn: u64,
        /// The step's key (the same for every run of the step).
        key: StepKey,
        /// It began before and left no result (its effect may have happened): it runs
        /// again with the same key.
        rerun: bool,
    },
    /// A durable step (S1b) has its result: it ran and its result is journaled (and
    /// durable under `sync` and `turn`), or it was answered from the journal without
    /// running (`replayed`), or its outcome is unknown (`unknown`: a `NoRetry` step
    /// that began before and left no result; the agent reconciles).
    StepFinished {
        /// The turn.
        turn: u64,
        /// The step's key.
        key: StepKey,
        /// Answered from the journal, not run.
        replayed: bool,
        /// Not run and not answered: its outcome is unknown.
        unknown: bool,
    },
    /// The turn was preempted and ends at a safe point (S8).
    Preempted {
        /// The turn's index.
        turn: u64,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn's index.
        turn: u64,
        /// How it ended.
        outcome: TurnEnd,
        /// Whether the record holds this turn's end: under `Durability::Turn` and
        /// `Sync` the event is sent only after the write holding it is flushed, and
        /// says whether it succeeded; without a store and under `Exit` it is false.
        durable: bool,
    },
    /// A stop request was accepted (best effort when the buffer is full).
    StopRequested {
        /// The cancel mode the stop carried, if any.
        cancel: Option<CancelMode>,
        /// The cause it carried, if any.
        cause: Option<String>,
    },
    /// The session ended and nothing of it will run again (it completed, was stopped,
    /// or failed for good: a permanent error, its policy, or its restart budget spent).
    /// Always the last event.
    Ended(ExitSummary),
    /// The incarnation failed and its supervisor starts it again (S26, issue 53):
    /// sent instead of [`SessionEvent::Ended`], as the last event of this
    /// incarnation's stream, which ends after it. Subscribe again after its number
    /// (`subscribe_after`; over HTTP, the SSE client's reconnect with
    /// `Last-Event-ID` does it) to follow the new incarnation: the sequence goes on.
    Restarting {
        /// Which restart this is within the session's life (1 for the first).
        attempt: u32,
        /// In how many milliseconds the new incarnation starts (0: at once).
        after_ms: u64,
        /// Why the incarnation failed.
        error: String,
    },
    /// A stream that asked to start after a sequence number the replay buffer no longer
    /// holds: `missed` events are gone. Only ever the first event of such a stream; its
    /// number is the last one missed, so a client that records numbers resumes after
    /// it. A replay from the store (S20a) sends one at each gap; across a crash some of
    /// the numbers may never have been given to an event, and
    /// [`EventStream::lagged_upper_bound`] says the count is then an upper bound.
    Lagged {
        /// How many numbers the stream skips here (all of them events, or at most, see
        /// above).
        missed: u64,
    },
}

/// How an incarnation's streams end: `Ended` with its summary, or, when its
/// supervisor starts it again, `Restarting` (the summary then stays with the
/// supervisor and the exit state).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Last {
    pub(crate) summary: ExitSummary,
    pub(crate) restarting: Option<Restart>,
}

/// What [`SessionEvent::Restarting`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Restart {
    pub(crate) attempt: u32,
    pub(crate) after_ms: u64,
    pub(crate) error: String,
}

impl Last {
    /// An end for good.
    pub(crate) fn ended(summary: ExitSummary) -> Self {
        Last {
            summary,
            restarting: None,
        }
    }

    /// The event the streams end with.
    pub(crate) fn event<E>(&self) -> SessionEvent<E> {
        match &self.restarting {
            None => SessionEvent::Ended(self.summary.clone()),
            Some(r) => SessionEvent::Restarting {
                attempt: r.attempt,
                after_ms: r.after_ms,
                error: r.error.clone(),
            },
        }
    }
}

/// An event with its place in the session's sequence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sequenced<E> {
    /// The event's number: strictly increasing in every stream, and across the
    /// session's restarts and resumes (S20, S26).
    pub seq: u64,
    /// The event.
    pub event: SessionEvent<E>,
}
