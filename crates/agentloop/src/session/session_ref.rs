//! Where a session's own turn task, timers and store completions send it messages:
//! its TurnLoop actor (the product), or, with the `bench-shell` feature, the channel of
//! the bench's plain-task shell over the same core (a diagnostic of ractor's share of
//! B1, DESIGN §10; see `bench_shell`).
//!
//! It only carries messages; it decides nothing and never blocks.

use std::time::Duration;

use ractor::ActorRef;

use crate::session::messages::TurnLoopMsg;

/// The address a session's own tasks report to.
pub(crate) enum SessionRef<I, E> {
    /// The session's TurnLoop actor.
    Actor(ActorRef<TurnLoopMsg<I, E>>),
    /// The bench's plain-task shell.
    #[cfg(feature = "bench-shell")]
    Task(tokio::sync::mpsc::UnboundedSender<TurnLoopMsg<I, E>>),
}

impl<I, E> Clone for SessionRef<I, E> {
    fn clone(&self) -> Self {
        match self {
            SessionRef::Actor(a) => SessionRef::Actor(a.clone()),
            #[cfg(feature = "bench-shell")]
            SessionRef::Task(t) => SessionRef::Task(t.clone()),
        }
    }
}

impl<I, E> SessionRef<I, E>
where
    I: Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    /// Sends `msg`; a session that is gone drops it (its destructor runs then: a
    /// turn's final events are delivered by it).
    pub(crate) fn send_message(&self, msg: TurnLoopMsg<I, E>) {
        match self {
            SessionRef::Actor(a) => drop(a.send_message(msg)),
            #[cfg(feature = "bench-shell")]
            SessionRef::Task(t) => drop(t.send(msg)),
        }
    }

    /// Sends the message `msg` makes after `after` (a timer); aborting the handle
    /// cancels it. A session gone by then drops the message.
    pub(crate) fn send_after(
        &self,
        after: Duration,
        msg: impl FnOnce() -> TurnLoopMsg<I, E> + Send + 'static,
    ) -> tokio::task::AbortHandle {
        match self {
            SessionRef::Actor(a) => a.send_after(after, msg).abort_handle(),
            #[cfg(feature = "bench-shell")]
            SessionRef::Task(t) => {
                let t = t.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = t.send(msg());
                })
                .abort_handle()
            }
        }
    }

    /// Lets the mailbox drain and the session stop after what it holds (the teardown's
    /// last step). The plain-task shell stops when its exit is published instead.
    pub(crate) fn drain(&self) {
        match self {
            // Already stopping: nothing to drain.
            SessionRef::Actor(a) => drop(a.drain()),
            #[cfg(feature = "bench-shell")]
            SessionRef::Task(_) => {}
        }
    }
}
