//! The restart budget and the restart decision (S26) as plain data and a plain
//! function: at most `max_restarts` restarts within `window` (OTP's intensity and
//! period), and, for an incarnation that failed, whether its policy, the kind of its
//! failure and its budget let it restart. No I/O and no clock of its own (the caller
//! passes `now`); the supervisor's registry acts on the answer, and the session asks it
//! at its end whether it will be started again (`RestartOracle`). It lives beside the
//! restart policy it applies, so a session names nothing of its supervisor.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::session::{FailureKind, RestartPolicy};

/// At most `max_restarts` restarts within `window` (OTP's intensity and period).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartBudget {
    /// Restarts allowed within the window.
    pub max_restarts: u32,
    /// The window.
    pub window: Duration,
}

impl Default for RestartBudget {
    /// 3 restarts per 60 s.
    fn default() -> Self {
        RestartBudget {
            max_restarts: 3,
            window: Duration::from_secs(60),
        }
    }
}

/// What becomes of an incarnation that ended `Failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestartDecision {
    /// Start a new incarnation (its restart is counted in the budget).
    Restart,
    /// The policy does not restart this failure: the session stays failed.
    NotWanted,
    /// A failure of the session's own record (refused or unreadable): a restart would
    /// not fix it, and the record stays as it was (S18).
    Unrecoverable,
    /// The agent failed permanently ([`FailureKind::AgentPermanent`]): a restart would
    /// fail the same way, so none is made whatever the policy; the session ends
    /// `Failed` at once, and its record says so.
    Permanent,
    /// The policy would restart it, but the budget is spent: the session stays failed.
    BudgetSpent,
}

/// Decides whether an incarnation that failed with `kind` restarts under `policy` and
/// `budget`, given the times of its earlier restarts. Forgets restarts older than the
/// window and, on [`RestartDecision::Restart`], counts this one at `now`.
pub(crate) fn decide(
    policy: RestartPolicy,
    kind: FailureKind,
    budget: &RestartBudget,
    restarts: &mut VecDeque<Instant>,
    now: Instant,
) -> RestartDecision {
    if kind == FailureKind::AgentPermanent {
        return RestartDecision::Permanent;
    }
    let wants = match policy {
        RestartPolicy::Permanent => true,
        RestartPolicy::Transient => matches!(kind, FailureKind::Panic | FailureKind::Internal),
        RestartPolicy::Never => false,
    };
    if !wants {
        return RestartDecision::NotWanted;
    }
    if kind == FailureKind::Record {
        return RestartDecision::Unrecoverable;
    }
    while restarts
        .front()
        .is_some_and(|t| now.duration_since(*t) > budget.window)
    {
        restarts.pop_front();
    }
    if restarts.len() as u32 >= budget.max_restarts {
        return RestartDecision::BudgetSpent;
    }
    restarts.push_back(now);
    RestartDecision::Restart
}

/// One incarnation's view of its supervisor's restart decision, asked by the
/// incarnation's teardown before it ends its streams (S26, issue 53: "`ended` means
/// ended"): when the supervisor will start the session again, the streams end with
/// `Restarting` instead of `Ended`. The decision is made once, here, with the
/// incarnation's policy, the supervisor's budget and the restarts its predecessors
/// used; the supervisor then acts on it ([`RestartOracle::verdict`]), so what the
/// subscribers were told and what happens never differ. (Should the restart itself
/// fail to start, the session stays failed: its subscribers, told `Restarting`, find
/// it failed when they subscribe again.)
pub(crate) struct RestartOracle {
    policy: RestartPolicy,
    budget: RestartBudget,
    /// The times of the restarts before this incarnation (set at its start).
    pub(crate) restarts: parking_lot::Mutex<VecDeque<Instant>>,
    /// How many restarts led to this incarnation.
    pub(crate) restarted: std::sync::atomic::AtomicU32,
    /// The supervisor is stopping: nothing restarts.
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The session was canceled (S24): nothing of it runs again.
    canceled: std::sync::atomic::AtomicBool,
    /// The decision, once made, with the restart times it counts.
    verdict: parking_lot::Mutex<Option<(RestartDecision, VecDeque<Instant>)>>,
}

impl RestartOracle {
    pub(crate) fn new(
        policy: RestartPolicy,
        budget: RestartBudget,
        stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        RestartOracle {
            policy,
            budget,
            restarts: Default::default(),
            restarted: Default::default(),
            stopping,
            canceled: Default::default(),
            verdict: parking_lot::Mutex::new(None),
        }
    }

    /// The session was canceled (S24): if it fails now, it is not restarted and its
    /// streams end with `Ended` (a cancel is final, S26).
    pub(crate) fn cancel(&self) {
        self.canceled
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Decides (once) what becomes of the incarnation that ends with `summary`, and
    /// says what `Restarting` carries when it restarts. `None`: it ends for good
    /// (not failed, a failure that is not restarted, the budget spent, the supervisor
    /// stopping, or asleep).
    pub(crate) fn foresee(
        &self,
        summary: &crate::session::ExitSummary,
    ) -> Option<crate::events::Restart> {
        use std::sync::atomic::Ordering;
        let crate::session::ExitReason::Failed(error) = &summary.reason else {
            return None;
        };
        if self.stopping.load(Ordering::Acquire) || self.canceled.load(Ordering::Acquire) {
            return None;
        }
        let kind = summary.failure.unwrap_or(FailureKind::Internal);
        let (decision, _) = self.decide_once(kind);
        (decision == RestartDecision::Restart).then(|| crate::events::Restart {
            attempt: self.restarted.load(Ordering::Acquire) + 1,
            after_ms: 0,
            error: error.clone(),
        })
    }

    /// The decision for a failure of `kind`, with the restart times it counts: made
    /// by the first to ask (the teardown or the supervisor), the same for the other.
    pub(crate) fn decide_once(&self, kind: FailureKind) -> (RestartDecision, VecDeque<Instant>) {
        let mut verdict = self.verdict.lock();
        if let Some(v) = &*verdict {
            return v.clone();
        }
        let mut restarts = self.restarts.lock().clone();
        let d = decide(
            self.policy,
            kind,
            &self.budget,
            &mut restarts,
            Instant::now(),
        );
        *verdict = Some((d, restarts.clone()));
        (d, restarts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max_restarts: u32, secs: u64) -> RestartBudget {
        RestartBudget {
            max_restarts,
            window: Duration::from_secs(secs),
        }
    }

    #[test]
    fn each_policy_restarts_what_it_says() {
        use FailureKind::*;
        use RestartPolicy::*;
        let now = Instant::now();
        let table = [
            (Permanent, Panic, RestartDecision::Restart),
            (Permanent, Internal, RestartDecision::Restart),
            (Permanent, Agent, RestartDecision::Restart),
            (Transient, Panic, RestartDecision::Restart),
            (Transient, Internal, RestartDecision::Restart),
            (Transient, Agent, RestartDecision::NotWanted),
            (Never, Panic, RestartDecision::NotWanted),
            (Permanent, Record, RestartDecision::Unrecoverable),
            (Transient, Record, RestartDecision::NotWanted),
            (Permanent, AgentPermanent, RestartDecision::Permanent),
            (Transient, AgentPermanent, RestartDecision::Permanent),
            (Never, AgentPermanent, RestartDecision::Permanent),
        ];
        for (policy, kind, expected) in table {
            let mut restarts = VecDeque::new();
            let got = decide(policy, kind, &budget(3, 60), &mut restarts, now);
            assert_eq!(got, expected, "{policy:?} after {kind:?}");
            let counted = usize::from(expected == RestartDecision::Restart);
            assert_eq!(restarts.len(), counted, "only a restart is counted");
        }
    }

    #[test]
    fn the_budget_counts_restarts_within_its_window_only() {
        let b = budget(2, 60);
        let start = Instant::now();
        let mut restarts = VecDeque::new();
        let at = |s: u64| start + Duration::from_secs(s);
        let decide_at = |r: &mut VecDeque<Instant>, s| {
            decide(RestartPolicy::Permanent, FailureKind::Panic, &b, r, at(s))
        };
        assert_eq!(decide_at(&mut restarts, 0), RestartDecision::Restart);
        assert_eq!(decide_at(&mut restarts, 10), RestartDecision::Restart);
        // Two within 60 s: the third is refused, and not counted.
        assert_eq!(decide_at(&mut restarts, 20), RestartDecision::BudgetSpent);
        assert_eq!(restarts.len(), 2);
        // At 61 s the first has left the window (more than 60 s ago): room for one.
        assert_eq!(decide_at(&mut restarts, 61), RestartDecision::Restart);
        assert_eq!(decide_at(&mut restarts, 62), RestartDecision::BudgetSpent);
        // Exactly at the window's edge a restart still counts.
        assert_eq!(decide_at(&mut restarts, 70), RestartDecision::BudgetSpent);
        assert_eq!(decide_at(&mut restarts, 71), RestartDecision::Restart);
    }

    #[test]
    fn a_zero_budget_never_restarts() {
        let mut restarts = VecDeque::new();
        let got = decide(
            RestartPolicy::Permanent,
            FailureKind::Panic,
            &budget(0, 60),
            &mut restarts,
            Instant::now(),
        );
        assert_eq!(got, RestartDecision::BudgetSpent);
    }
}
