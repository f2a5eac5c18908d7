//! A push to a session by its handle ([`SessionHandle::push`]): the builder that takes
//! the push's options and the named future that waits for the session's answer. One
//! way to push (issue 54); it decides nothing: the session answers.

use std::sync::Arc;

use ractor::{MessagingErr, RpcReplyPort};
use tokio::sync::oneshot;

use crate::options::PushOptions;
use crate::push::{PreemptAck, PushError};
use crate::session::messages::TurnLoopMsg;
use crate::session::SessionHandle;
use crate::shared::{SessionShared, UnprocessedPush};

impl<I, E> SessionHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Pushes an item (S5): the one way to push to a session you hold a handle on.
    /// Chain [`Push::options`] for preempts, strategies, idempotency keys and timers
    /// (S7, S9, S34a), then await it: it resolves when the item was accepted
    /// (`PreemptAck::NotRequested` without a preempt) and its preempt (if any) was
    /// submitted or found nothing to cancel; a rejection hands the item back (S14).
    /// [`Push::no_wait`] sends it without waiting for the answer, like another actor's
    /// `cast!`.
    ///
    /// ```no_run
    /// # async fn f(h: agentloop::SessionHandle<String, ()>) -> Result<(), agentloop::PushError<String>> {
    /// use agentloop::{Preempt, PushOptions};
    /// h.push("hello".to_string()).await?;
    /// h.push("stop that".to_string())
    ///     .options(PushOptions::preempt(Preempt::any_safe_point()))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn push(&self, item: I) -> Push<'_, I, E> {
        Push {
            handle: self,
            item,
            options: PushOptions::new(),
        }
    }

    /// Pushes an item with options (S7, S9).
    #[deprecated(note = "one way to push (issue 54): `handle.push(item).options(options).await`")]
    pub async fn push_with(
        &self,
        item: I,
        options: PushOptions<I>,
    ) -> Result<PreemptAck, PushError<I>> {
        self.push_sent(item, options).await
    }

    /// Sends a push now, so pushes sent one after the other reach the session in that
    /// order whoever awaits their answers; the future resolves to the answer.
    pub(crate) fn push_sent(&self, item: I, options: PushOptions<I>) -> Pushed<I> {
        // A copy for the one case where the actor drops the message unanswered (it was
        // killed with the push still queued): the caller still gets the item back.
        let copy = item.clone();
        let (tx, rx) = oneshot::channel();
        let msg = TurnLoopMsg::Push {
            item,
            options,
            reply: Some(RpcReplyPort::from(tx)),
        };
        let shared = self.shared.clone();
        let state = match self.actor.send_message(msg) {
            Ok(()) => PushedState::Waiting { rx, copy, shared },
            Err(e) => PushedState::Refused {
                item: match e {
                    MessagingErr::SendErr(TurnLoopMsg::Push { item, .. }) => item,
                    _ => copy,
                },
                shared,
            },
        };
        Pushed { state: Some(state) }
    }

    /// Pushes an item without waiting for the session's answer, like another actor's
    /// `cast!`.
    #[deprecated(note = "one way to push (issue 54): `handle.push(item).no_wait()`")]
    pub fn push_nowait(&self, item: I) {
        self.push(item).no_wait()
    }

    /// Sends a push whose answer nobody waits for. A rejection is not reported, but the
    /// item is never lost: a late item goes to the late list (S14), and so does an item
    /// whose send fails because the session is gone.
    fn send_unanswered(&self, item: I, mut options: PushOptions<I>) {
        options.unprocessed = Some(UnprocessedPush::new(item.clone(), self.shared.clone()));
        let msg = TurnLoopMsg::Push {
            item,
            options,
            reply: None,
        };
        // A refused send hands the message back; dropping it lets its guard put the
        // item on the late list.
        drop(self.actor.send_message(msg));
    }
}

/// A push to a session by its handle, being made ([`SessionHandle::push`]): chain
/// [`Push::options`], then await it, or send it with [`Push::no_wait`]. Nothing is sent
/// before one of those.
#[must_use = "a push is sent when it is awaited, or by `.no_wait()`"]
pub struct Push<'h, I, E> {
    pub(super) handle: &'h SessionHandle<I, E>,
    pub(super) item: I,
    pub(super) options: PushOptions<I>,
}

impl<I, E> Push<'_, I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// The push's options (S7 preempt, S9 strategy, S34a idempotency key, S39 timer);
    /// without them a push only buffers its item.
    pub fn options(mut self, options: PushOptions<I>) -> Self {
        self.options = options;
        self
    }

    /// Sends the push without waiting for the session's answer, like another actor's
    /// `cast!`. A rejection is not reported to the caller, but the item is never lost:
    /// a late item goes to the late list (S14), and so does an item whose send fails
    /// because the session is gone.
    pub fn no_wait(self) {
        self.handle.send_unanswered(self.item, self.options)
    }
}

impl<I, E> std::future::IntoFuture for Push<'_, I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    type Output = Result<PreemptAck, PushError<I>>;
    type IntoFuture = Pushed<I>;

    /// Sends the push; the future resolves to the session's answer.
    fn into_future(self) -> Pushed<I> {
        self.handle.push_sent(self.item, self.options)
    }
}

/// A push sent to a session, waiting for its answer (awaiting a [`Push`]). The message
/// is already in the session's mailbox: dropping this does not take it back. If the
/// session goes without answering, the item comes back as `Late` and is kept in its
/// late list (S14).
#[must_use = "the push is sent; await this for its answer"]
pub struct Pushed<I> {
    pub(super) state: Option<PushedState<I>>,
}

// Nothing in it is pinned: the receiver is polled through `Pin::new` (it is `Unpin`),
// and the items are only moved out once it resolves.
impl<I> Unpin for Pushed<I> {}

pub(super) enum PushedState<I> {
    /// The session's mailbox refused the message (the session is gone).
    Refused {
        item: I,
        shared: Arc<SessionShared<I>>,
    },
    /// Sent; the answer comes on `rx`. `copy` is handed back if none comes.
    Waiting {
        rx: oneshot::Receiver<Result<PreemptAck, PushError<I>>>,
        copy: I,
        shared: Arc<SessionShared<I>>,
    },
}

impl<I: Clone> std::future::Future for Pushed<I> {
    type Output = Result<PreemptAck, PushError<I>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        if let Some(PushedState::Waiting { rx, .. }) = self.state.as_mut() {
            match std::pin::Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(answer)) => {
                    self.state = None;
                    return Poll::Ready(answer);
                }
                // The session went without answering: the item comes back below.
                Poll::Ready(Err(_)) => {}
            }
        }
        match self.state.take() {
            Some(PushedState::Waiting {
                copy: item, shared, ..
            })
            | Some(PushedState::Refused { item, shared }) => {
                shared.push_late(item.clone());
                Poll::Ready(Err(PushError::Late { item }))
            }
            // As `async` blocks do: a future is not polled after it resolved.
            None => panic!("a push's answer was polled after it resolved"),
        }
    }
}
