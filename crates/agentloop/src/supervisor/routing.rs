//! A push routed through the supervisor (the way a push goes when the directory has no
//! live incarnation for it): to the live incarnation, answered from a task; when that
//! incarnation has just ended and is restarting, again to the new one (bounded), so a
//! push that meets a restart is delivered, not bounced (S26).

use super::messages::{InternalMsg, Reroute, SupervisorInternal, SupervisorMsg};
use super::registry::SupervisorState;
use crate::options::PushOptions;
use crate::session::{ExitReason, PreemptAck, PushError};
use ractor::{ActorRef, RpcReplyPort};

/// Routes a push; a push that finds its incarnation ended (late, because it exited)
/// is retried once the supervisor has restarted it, so it reaches the new incarnation.
pub(super) async fn route_push<I, E>(
    myself: &ActorRef<SupervisorMsg<I, E>>,
    st: &mut SupervisorState<I, E>,
    id: String,
    item: I,
    options: PushOptions<I>,
    reply: RpcReplyPort<Result<PreemptAck, PushError<I>>>,
    tries: u32,
) where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    use crate::metrics::PushResult;
    let directory = st.directory.clone();
    let count = move |r: PushResult| directory.count(r);
    if st.directory.gate_closed() {
        // S27 drain gate: the item goes back to the caller as a late item.
        st.directory.count_gate_late();
        let _ = reply.send(Err(PushError::Late { item }));
        return;
    }
    if let Some(why) = st.wake_refused(&id) {
        count(PushResult::Refused);
        let _ = reply.send(Err(PushError::NotLive {
            id,
            item,
            retry_after: std::time::Duration::from_secs(1),
            why,
        }));
        return;
    }
    let Some(h) = st.live(myself, &id).await else {
        count(PushResult::Refused);
        let _ = reply.send(Err(PushError::UnknownSession { id, item }));
        return;
    };
    let myself = myself.clone();
    let retry_options = options.clone();
    // Sent here, in the order the supervisor routes (pushes that queued behind a wake
    // or a restart keep their order, S39); only the answer is awaited off the actor.
    let answer = h.push_sent(item, options);
    tokio::spawn(async move {
        match answer.await {
            Ok(ack) => {
                count(PushResult::Accepted);
                let _ = reply.send(Ok(ack));
            }
            // The incarnation ended between routing and delivery: if it is being
            // restarted, the supervisor routes the item again (a bounded number of
            // times); a session that was stopped answers late as usual.
            Err(PushError::Late { item })
                if tries < 3
                    && h.exit_state().is_some_and(|e| {
                        matches!(e.reason, ExitReason::Failed(_) | ExitReason::Asleep)
                    }) =>
            {
                let _ = h.take_late_items();
                let msg = SupervisorMsg::from(InternalMsg::Reroute(Reroute {
                    id,
                    item,
                    options: retry_options,
                    reply,
                    tries: tries + 1,
                }));
                if let Err(ractor::MessagingErr::SendErr(SupervisorMsg::Internal(
                    SupervisorInternal(InternalMsg::Reroute(r)),
                ))) = myself.send_message(msg)
                {
                    let _ = r.reply.send(Err(PushError::Late { item: r.item }));
                }
            }
            Err(e) => {
                count(match e {
                    PushError::Late { .. } => PushResult::Late,
                    _ => PushResult::Refused,
                });
                let _ = reply.send(Err(e));
            }
        }
    });
}
