//! The sessions of one shutdown: who is still alive, in which phase each one ended,
//! and the records of the ones that had to be killed (DESIGN S27).
//!
//! It owns the grace and force mechanics behind [`ShutdownCx`](super::ShutdownCx):
//! stops are sent in-band (never ractor's `stop`), each session's end is read from the
//! supervisor's feed of session ends (the one feed, opened with the drain gate), and a
//! kill is followed by marking the session's record `Interrupted` from its last
//! durable state. It never runs agent code and never
//! decides the order of phases (the strategy does).

use crate::store::transition::StatusChange;
use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::ShutdownConfig;
use crate::options::StopOptions;
use crate::session::{CheckpointOutcome, Durability, ExitState, TurnLoopMsg};
use crate::store::{CasOutcome, CheckpointStore, SessionRecord, SessionStatus};
use crate::supervisor::{GateMember, SessionEnd};

use super::strategy::{Phases, Tally, SHUTDOWN_CAUSE};

/// Where a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Grace,
    Forced,
    Killed,
}

struct Member<I, E> {
    m: GateMember<I, E>,
    fate: Option<Fate>,
}

/// The sessions being shut down.
pub(crate) struct SessionSet<I, E> {
    config: ShutdownConfig,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    owner: Option<String>,
    members: Vec<Member<I, E>>,
    /// Each member's place in `members`, by id.
    index: HashMap<String, usize>,
    /// The supervisor's feed of session ends (replaced by the members' own ends if the
    /// supervisor goes away first).
    ends: mpsc::UnboundedReceiver<SessionEnd<I>>,
    /// The feed closed early and the members still alive are watched directly.
    watching_handles: bool,
    force: watch::Receiver<bool>,
    live: usize,
    /// The phase an exit received now is counted in.
    phase: Fate,
    pub(crate) tally: Tally,
}

impl<I, E> SessionSet<I, E>
where
    I: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// The sessions `members`, whose ends arrive on `ends` (the supervisor's feed,
    /// opened with the gate that named them).
    pub(crate) fn new(
        config: ShutdownConfig,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        owner: Option<String>,
        members: Vec<GateMember<I, E>>,
        ends: mpsc::UnboundedReceiver<SessionEnd<I>>,
        force: watch::Receiver<bool>,
    ) -> Self {
        let index = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.spec.id.clone(), i))
            .collect();
        let live = members.len();
        SessionSet {
            config,
            store,
            owner,
            tally: Tally {
                total: live as u64,
                ..Tally::default()
            },
            members: members
                .into_iter()
                .map(|m| Member { m, fate: None })
                .collect(),
            index,
            ends,
            watching_handles: false,
            force,
            live,
            phase: Fate::Grace,
        }
    }

    /// Sends `stop` to every live session without waiting for its answer (a stop is
    /// in-band: queued pushes are answered before it, as unhandled or late).
    fn stop_all(&self, stop: &StopOptions) {
        for m in self.members.iter().filter(|m| m.fate.is_none()) {
            let _ = m.m.handle.actor().send_message(TurnLoopMsg::Stop {
                options: stop.clone(),
                reply: None,
            });
        }
    }

    /// Receives exits until every session has ended, `deadline` passes, or (when
    /// `watch_force`) force is requested.
    async fn collect_until(&mut self, deadline: Instant, mut watch_force: bool) {
        while self.live > 0 {
            if watch_force && *self.force.borrow() {
                return;
            }
            tokio::select! {
                got = self.ends.recv() => match got {
                    Some(end) => self.ended(end).await,
                    None if self.watching_handles => return,
                    None => self.watch_handles(),
                },
                _ = tokio::time::sleep_until(deadline) => return,
                // Nobody can request force any more: stop watching.
                changed = self.force.changed(), if watch_force => watch_force = changed.is_ok(),
            }
        }
    }

    /// The supervisor's feed closed with members still alive (the supervisor stopped or
    /// failed during the shutdown): their ends are read from their own handles from
    /// now on, so each is still counted and a killed one's record still marked.
    fn watch_handles(&mut self) {
        tracing::warn!(
            sessions = self.live,
            "the supervisor's feed of session ends closed during the shutdown; watching the sessions still alive directly"
        );
        self.watching_handles = true;
        let (tx, rx) = mpsc::unbounded_channel();
        for member in self.members.iter().filter(|m| m.fate.is_none()) {
            let (spec, handle, tx) = (&member.m.spec, member.m.handle.clone(), tx.clone());
            let (id, kind, persistent) = (spec.id.clone(), spec.kind.clone(), spec.persist);
            tokio::spawn(async move {
                let exit = handle.wait().await;
                let _ = tx.send(SessionEnd {
                    id,
                    kind,
                    persistent,
                    restarts: 0,
                    exit,
                });
            });
        }
        self.ends = rx;
    }

    /// One session ended: count it in the current phase and account for its items.
    /// (An end of a session that was not a member, e.g. one that ended as the gate
    /// closed, is not this shutdown's.)
    async fn ended(&mut self, end: SessionEnd<I>) {
        let Some(&i) = self.index.get(&end.id) else {
            return;
        };
        let exit = end.exit;
        if self.members[i].fate.is_some() {
            return;
        }
        let fate = self.phase;
        self.members[i].fate = Some(fate);
        self.live -= 1;
        self.tally.late += exit.counters.items_late;
        match fate {
            Fate::Grace => self.tally.exited_in_grace += 1,
            Fate::Forced => self.tally.forced += 1,
            Fate::Killed => self.tally.killed += 1,
        }
        let items = (exit.unhandled_items.len() + exit.interrupted_items.len()) as u64;
        if fate == Fate::Killed && exit.checkpoint != CheckpointOutcome::Saved {
            return self.mark_killed(i, exit).await;
        }
        match &exit.checkpoint {
            CheckpointOutcome::Saved => {
                self.tally.saved += 1;
                self.tally.items_saved += items;
            }
            CheckpointOutcome::Failed(e) => {
                tracing::error!(session = %exit.session_id, error = %e, items, "shutdown checkpoint failed");
                self.tally.failed += 1;
                self.tally.items_unsaved += items;
            }
            CheckpointOutcome::NotAttempted | CheckpointOutcome::Deleted => {
                self.tally.items_unsaved += items;
            }
        }
    }

    /// A killed session's record: a `sync` session's last durable record (every write
    /// it issued was ordered before this call) is marked `Interrupted`; a session with
    /// no such record gets one written from what its exit state handed back.
    async fn mark_killed(&mut self, i: usize, exit: ExitState<I>) {
        let spec = &self.members[i].m.spec;
        let items = (exit.unhandled_items.len() + exit.interrupted_items.len()) as u64;
        let Some(store) = self.store.clone().filter(|_| spec.persist) else {
            self.tally.items_unsaved += items;
            return;
        };
        let id = spec.id.clone();
        if spec.durability == Durability::Sync {
            let cas = StatusChange::KilledByShutdown.apply(&*store, &id).await;
            match cas {
                Ok(CasOutcome::Swapped(_) | CasOutcome::Mismatch(SessionStatus::Interrupted)) => {
                    match store.load(&id).await {
                        Ok(Some(rec)) => {
                            self.tally.saved += 1;
                            self.tally.items_saved +=
                                (rec.unhandled_items.len() + rec.interrupted_items.len()) as u64;
                        }
                        Ok(None) | Err(_) => self.tally.failed += 1,
                    }
                    return;
                }
                Ok(CasOutcome::Mismatch(other)) => {
                    // Canceled / Completed / Failed: final, and left as it is (S19).
                    tracing::info!(session = %id, status = ?other, "killed session's record is final; left");
                    return;
                }
                Ok(CasOutcome::Missing) => {}
                Err(e) => {
                    tracing::error!(session = %id, error = %e, "cannot mark the killed session Interrupted");
                    self.tally.failed += 1;
                    self.tally.items_unsaved += items;
                    return;
                }
            }
        }
        let mut rec = SessionRecord::new(id.clone(), spec.kind.clone(), exit.next_turn_index);
        rec.agent_config = spec.agent_config.clone();
        rec.status = SessionStatus::Interrupted;
        rec.owner = self.owner.clone();
        rec.stop_cause = exit.stop_cause.clone();
        // The killed turn left no state: its items are offered first to a fresh turn.
        rec.unhandled_items = exit.interrupted_items;
        rec.unhandled_items.extend(exit.unhandled_items);
        match store.save(rec).await {
            Ok(()) => {
                self.tally.saved += 1;
                self.tally.items_saved += items;
            }
            Err(e) => {
                tracing::error!(session = %id, error = %e, items, "cannot write the killed session's record");
                self.tally.failed += 1;
                self.tally.items_unsaved += items;
            }
        }
    }

    async fn run_grace(&mut self, stop: StopOptions) {
        let started = Instant::now();
        let mut stop = stop.shutdown();
        if stop.cause.as_deref().is_none_or(str::is_empty) {
            stop = stop.cause(SHUTDOWN_CAUSE);
        }
        self.phase = Fate::Grace;
        if self.live > 0 && !*self.force.borrow() {
            tracing::info!(sessions = self.live, grace = ?self.config.grace, "grace: graceful stops sent");
            self.stop_all(&stop);
            self.collect_until(started + self.config.grace, true).await;
        }
        self.tally.grace += started.elapsed();
    }

    async fn run_force(&mut self) {
        // Exits already waiting were reached before force: they count where they were.
        while let Ok(end) = self.ends.try_recv() {
            self.ended(end).await;
        }
        if self.live == 0 {
            return;
        }
        let started = Instant::now();
        self.phase = Fate::Forced;
        tracing::warn!(sessions = self.live, force_timeout = ?self.config.force_timeout, "force: Immediate stops sent");
        self.stop_all(&StopOptions::immediate().shutdown().cause(SHUTDOWN_CAUSE));
        self.collect_until(started + self.config.force_timeout, false)
            .await;
        if self.live > 0 {
            self.phase = Fate::Killed;
            tracing::error!(
                sessions = self.live,
                "force timeout passed: killing the sessions still alive"
            );
            for m in self.members.iter().filter(|m| m.fate.is_none()) {
                m.m.handle.actor().kill();
            }
            // A killed actor publishes its exit state from its destructor at once; the
            // bound only guards against a runtime that never runs it.
            let bound = Instant::now() + self.config.force_timeout;
            self.collect_until(bound, false).await;
            let lost = self.live;
            if lost > 0 {
                tracing::error!(sessions = lost, "killed sessions never reported an exit");
                self.tally.killed += lost as u64;
                self.live = 0;
            }
        }
        self.tally.force += started.elapsed();
    }
}

impl<I, E> Phases for SessionSet<I, E>
where
    I: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn config(&self) -> &ShutdownConfig {
        &self.config
    }

    fn live(&self) -> usize {
        self.live
    }

    fn force_requested(&self) -> bool {
        *self.force.borrow()
    }

    fn grace(&mut self, stop: StopOptions) -> BoxFuture<'_, ()> {
        Box::pin(self.run_grace(stop))
    }

    fn force(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(self.run_force())
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{SessionHandle, SessionSpec, TurnCx};
    use crate::turn::agent::{Agent, AgentError, Turn, TurnOutcome};

    struct Idle;

    impl Agent for Idle {
        type Item = u32;
        type Event = ();
        type State = ();

        async fn run_turn(
            &self,
            _turn: Turn<Self>,
            _cx: TurnCx<Self>,
        ) -> Result<TurnOutcome<()>, AgentError> {
            Ok(TurnOutcome::Completed)
        }
    }

    /// The supervisor's feed of ends closes while members are alive (the supervisor
    /// stopped or failed during the shutdown): the members' ends still arrive, each is
    /// counted where it was reached, and nothing is reported lost.
    #[tokio::test(start_paused = true)]
    async fn ends_are_still_read_when_the_supervisors_feed_closes() {
        let mut members = Vec::new();
        for id in ["a", "b"] {
            let spec = SessionSpec::<u32>::new(id, "idle");
            let handle = SessionHandle::<u32, ()>::spawn(spec.clone(), Arc::new(Idle), None)
                .await
                .expect("spawn");
            members.push(GateMember { spec, handle });
        }
        // A feed whose sender is already gone.
        let (_, ends) = mpsc::unbounded_channel::<SessionEnd<u32>>();
        let (_force_tx, force) = watch::channel(false);
        let mut set = SessionSet::new(ShutdownConfig::default(), None, None, members, ends, force);
        set.run_grace(StopOptions::drain()).await;
        assert_eq!(set.live, 0, "every member's end was read");
        assert_eq!(set.tally.exited_in_grace, 2);
        assert_eq!(set.tally.killed, 0);
    }
}
