//! Whose a stored record is, judged from its header and what the store said about its
//! owner: whether this instance may resume it now (`resumable`, S19: the one
//! judgement a session's load, the runtime's start and the adoption sweep all use), and
//! why a by-id request found no live session although one is stored ([`judge`], issue
//! 28): a session being recovered, resumed or waiting for its dead owner's lease is *not
//! live yet* (retry, and when), one that stopped, ended or waits for an answer is *not
//! running* (what to do instead); only an id with nothing stored is unknown.
//!
//! This file is the judgements alone, plain functions tested without a runtime. It
//! reads nothing and touches nothing: its callers read the record and the owner's
//! heartbeat, and turn the answers into their errors, skips and retries.

use std::time::Duration;

use crate::store::lease::is_fresh;
use crate::store::{RecordHeader, SessionStatus};

/// How soon to retry a session that is starting, ending or moving here or on a live
/// node: a resume or a move takes well under this.
pub const RETRY_SOON: Duration = Duration::from_secs(1);

/// Whether an instance may resume a stored record now (S19).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resumable {
    /// Yes: nobody else holds it.
    Now,
    /// Yes, recovering it from `owner`, which is gone: its lease expired (`orphaned`
    /// false), or the store proved its process gone (`orphaned`, issue 28).
    Recover {
        /// The former owner.
        owner: String,
        /// How long ago the owner was last seen.
        age: Duration,
        /// Whether the store proved the owner gone (no lease was waited for).
        orphaned: bool,
    },
    /// Not yet: it is `Running` under `owner`, whose lease is fresh; it expires in
    /// `left` if that process is gone.
    Held {
        /// The owner holding it.
        owner: String,
        /// How long ago the owner was last seen.
        age: Duration,
        /// How long until its lease expires.
        left: Duration,
    },
    /// Not by itself: canceled, failed, or waiting for an answer; `why` says which and
    /// what to do.
    Never {
        /// Why, and what to do.
        why: String,
    },
}

/// The one judgement of S19: a record may be resumed by instance `me` unless it is
/// `Canceled`, `Failed`, `Stopped` waiting for an answer, or `Running` under another
/// owner that holds it ([`holder`]: a fresh heartbeat); a record this instance owns,
/// one with no owner and one whose owner the store proved gone (`orphaned`) are
/// resumable at once.
pub(crate) fn resumable(
    h: &RecordHeader,
    me: Option<&str>,
    owner_beat: Option<u64>,
    orphaned: bool,
    now_ms: u64,
    lease_timeout: Duration,
) -> Resumable {
    match &h.status {
        SessionStatus::Canceled => Resumable::Never {
            why: "it was canceled".into(),
        },
        SessionStatus::Failed(e) => Resumable::Never {
            why: format!("it failed: {e}"),
        },
        SessionStatus::Stopped if h.awaiting_answer && h.answer.is_none() => {
            let reason = h.interrupt.as_ref().map_or("", |i| i.reason.as_str());
            Resumable::Never {
                why: format!(
                    "it waits for an answer to its interrupt ({reason:?}); answer it with \
                     resume_with_answer (the record is kept)"
                ),
            }
        }
        SessionStatus::Running => {
            let Some(owner) = h.owner.as_deref().filter(|o| Some(*o) != me) else {
                return Resumable::Now;
            };
            match holder(h, me, owner_beat, orphaned, now_ms, lease_timeout) {
                Some(Holder { owner, age, left }) => Resumable::Held { owner, age, left },
                None => Resumable::Recover {
                    owner: owner.to_string(),
                    age: Duration::from_millis(
                        now_ms.saturating_sub(owner_beat.unwrap_or(h.heartbeat_ms)),
                    ),
                    orphaned,
                },
            }
        }
        SessionStatus::Stopped | SessionStatus::Interrupted | SessionStatus::Completed => {
            Resumable::Now
        }
    }
}

/// Another instance that holds a record: its lease is fresh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The owner.
    pub(crate) owner: String,
    /// How long ago it was last seen.
    pub(crate) age: Duration,
    /// How long until its lease expires.
    pub(crate) left: Duration,
}

/// The instance other than `me` that holds record `h` (whatever its status), if any:
/// one whose heartbeat is fresher than the lease timeout (S19: its instance heartbeat
/// `owner_beat`, or the record's own heartbeat where the store keeps none), and that
/// the store did not prove gone (`orphaned`). The adoption sweep leaves a record
/// alone while it has a holder; [`resumable`] waits for a `Running` record's.
pub(crate) fn holder(
    h: &RecordHeader,
    me: Option<&str>,
    owner_beat: Option<u64>,
    orphaned: bool,
    now_ms: u64,
    lease_timeout: Duration,
) -> Option<Holder> {
    let owner = h.owner.as_deref().filter(|o| Some(*o) != me)?;
    let seen = owner_beat.unwrap_or(h.heartbeat_ms);
    if orphaned || !is_fresh(seen, now_ms, lease_timeout) {
        return None;
    }
    let age = Duration::from_millis(now_ms.saturating_sub(seen));
    Some(Holder {
        owner: owner.to_string(),
        age,
        left: lease_timeout.saturating_sub(age),
    })
}

/// Why a stored session is not live where a request looked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Absence {
    /// It is stored as running, or is being recovered: it will be live again by
    /// itself; retry after `retry_after`.
    NotLive {
        /// When to retry.
        retry_after: Duration,
        /// What is happening to it.
        why: String,
    },
    /// It is stored, but nothing will run it until someone acts: `hint` says what.
    NotRunning {
        /// Its stored status.
        status: String,
        /// What to do.
        hint: String,
    },
}

/// What the runtime that looked knows about itself and its store.
#[derive(Clone, Copy, Debug)]
pub struct Looker<'a> {
    /// This runtime's instance (or node name).
    pub me: &'a str,
    /// When it looked (ms since the epoch).
    pub now_ms: u64,
    /// The lease timeout owners are judged by (S19).
    pub lease_timeout: Duration,
    /// How often this runtime sweeps for records whose owner's lease expired.
    pub heartbeat: Duration,
    /// Whether it recovers such records while it runs: a cluster node, or a runtime on
    /// a shared store (a store one process holds recovers everything at start).
    pub sweeps: bool,
    /// Whether it is a cluster node (its peers' leases are judged by membership: a
    /// fresh owner is live, not a process that may be gone).
    pub node: bool,
    /// Whether it forwards by-id requests to the node that runs a session (a node
    /// joined on ractor_cluster): finding no live session there then means it is
    /// starting or moving.
    pub forwards: bool,
}

/// Judges stored header `h` for a request that found no live session with its id.
/// `owner_beat` is the owner's instance heartbeat, if the store has one; `orphaned` is
/// whether the store proved the owner gone ([`crate::store::CheckpointStore::orphaned`]).
pub fn judge(h: &RecordHeader, owner_beat: Option<u64>, orphaned: bool, at: Looker<'_>) -> Absence {
    let owner = h.owner.as_deref();
    let held = holder(
        h,
        Some(at.me),
        owner_beat,
        orphaned,
        at.now_ms,
        at.lease_timeout,
    );
    let owner_live = owner == Some(at.me) || held.is_some();
    let left = || held.as_ref().map_or(Duration::ZERO, |x| x.left);
    match &h.status {
        SessionStatus::Running => match owner {
            Some(o) if o == at.me => Absence::NotLive {
                retry_after: RETRY_SOON,
                why: "it is starting or ending on this instance".into(),
            },
            Some(o) if owner_live && at.forwards => Absence::NotLive {
                retry_after: RETRY_SOON,
                why: format!("it is starting or moving on node `{o}`"),
            },
            Some(o) if owner_live && at.node => Absence::NotRunning {
                status: h.status.to_string(),
                hint: format!(
                    "it runs on node `{o}`; send requests for it there (this node does not \
                     forward them: join the nodes with --cluster-listen to reach it from any \
                     node)"
                ),
            },
            Some(o) if owner_live => Absence::NotLive {
                retry_after: left() + at.heartbeat,
                why: format!(
                    "it is stored as running on instance `{o}`, whose lease expires in {}; \
                     if that process is gone, this runtime recovers it then",
                    agentloop_core::duration_text::format_duration(left())
                ),
            },
            Some(o) => Absence::NotLive {
                retry_after: at.heartbeat.max(RETRY_SOON),
                why: format!("its owner `{o}` is gone and it is being recovered"),
            },
            None => Absence::NotLive {
                retry_after: at.heartbeat.max(RETRY_SOON),
                why: "it is stored as running with no owner and is being recovered".into(),
            },
        },
        SessionStatus::Interrupted if !owner_live && at.sweeps => Absence::NotLive {
            retry_after: at.heartbeat.max(RETRY_SOON),
            why: "it was interrupted by a shutdown of a runtime that is gone, and is being \
                  recovered"
                .into(),
        },
        SessionStatus::Interrupted => Absence::NotRunning {
            status: h.status.to_string(),
            hint: "it was interrupted by a shutdown and resumes when its runtime starts \
                   again; spawn it again by id to resume it now"
                .into(),
        },
        SessionStatus::Stopped if h.awaiting_answer && h.answer.is_none() => Absence::NotRunning {
            status: h.status.to_string(),
            hint: "it waits for an answer to its interrupt; answer it \
                       (POST /sessions/{id}/answer, `agentloop sessions resume`) to resume it"
                .into(),
        },
        SessionStatus::Stopped => Absence::NotRunning {
            status: h.status.to_string(),
            hint: "it was stopped; spawn it again by id to resume it with what it holds".into(),
        },
        SessionStatus::Completed | SessionStatus::Canceled | SessionStatus::Failed(_) => {
            Absence::NotRunning {
                status: h.status.to_string(),
                hint: "it has ended and its record is kept for inspection; delete it, or spawn \
                       a session under another id"
                    .into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;
    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn resumable_refuses_what_never_resumes_by_itself() {
        for status in [
            SessionStatus::Canceled,
            SessionStatus::Failed("boom".into()),
        ] {
            let h = header(status, None, NOW);
            assert!(matches!(
                resumable(&h, Some("me"), None, false, NOW, LEASE),
                Resumable::Never { .. }
            ));
        }
        let mut h = header(SessionStatus::Stopped, None, NOW);
        h.awaiting_answer = true;
        let Resumable::Never { why } = resumable(&h, Some("me"), None, false, NOW, LEASE) else {
            panic!("a record waiting for an answer is not resumed");
        };
        assert!(why.contains("resume_with_answer"), "{why}");
        for status in [
            SessionStatus::Stopped,
            SessionStatus::Interrupted,
            SessionStatus::Completed,
        ] {
            let h = header(status, Some("other"), NOW);
            assert_eq!(
                resumable(&h, Some("me"), None, false, NOW, LEASE),
                Resumable::Now
            );
        }
    }

    #[test]
    fn resumable_waits_for_a_fresh_owner_and_recovers_a_stale_or_orphaned_one() {
        // Own records and ownerless ones: at once.
        let h = header(SessionStatus::Running, Some("me"), NOW);
        assert_eq!(
            resumable(&h, Some("me"), None, false, NOW, LEASE),
            Resumable::Now
        );
        let h = header(SessionStatus::Running, None, NOW);
        assert_eq!(
            resumable(&h, Some("me"), None, false, NOW, LEASE),
            Resumable::Now
        );
        // Another owner seen 4 s ago under a 30 s lease: held for 26 s more.
        let h = header(SessionStatus::Running, Some("old"), NOW - 40_000);
        assert_eq!(
            resumable(&h, Some("me"), Some(NOW - 4_000), false, NOW, LEASE),
            Resumable::Held {
                owner: "old".into(),
                age: Duration::from_secs(4),
                left: Duration::from_secs(26),
            }
        );
        // Proved gone by the store: at once, whatever its lease says.
        assert!(matches!(
            resumable(&h, Some("me"), Some(NOW - 4_000), true, NOW, LEASE),
            Resumable::Recover { orphaned: true, .. }
        ));
        // Stale: recovered.
        assert!(matches!(
            resumable(&h, Some("me"), Some(NOW - 31_000), false, NOW, LEASE),
            Resumable::Recover {
                orphaned: false,
                ..
            }
        ));
    }

    /// S19 judges the owner by its instance heartbeat (one beat per instance, not a
    /// write per session): a record written after a beat that went stale does not hold
    /// it (the adoption sweep once counted from the record's write, the session's load
    /// and the runtime's start from the beat). Where the store keeps no instance
    /// heartbeat, the record's own heartbeat decides.
    #[test]
    fn resumable_judges_the_owner_by_its_heartbeat() {
        let mut h = header(SessionStatus::Running, Some("old"), NOW - 40_000);
        h.updated_at_ms = NOW - 5_000;
        assert!(matches!(
            resumable(&h, Some("me"), Some(NOW - 40_000), false, NOW, LEASE),
            Resumable::Recover {
                orphaned: false,
                ..
            }
        ));
        assert!(holder(&h, Some("me"), Some(NOW - 40_000), false, NOW, LEASE).is_none());
        h.heartbeat_ms = NOW - 5_000;
        assert!(matches!(
            resumable(&h, Some("me"), None, false, NOW, LEASE),
            Resumable::Held { .. }
        ));
    }

    fn header(status: SessionStatus, owner: Option<&str>, beat: u64) -> RecordHeader {
        RecordHeader {
            session_id: "s".into(),
            status,
            owner: owner.map(str::to_string),
            heartbeat_ms: beat,
            updated_at_ms: beat,
            ..Default::default()
        }
    }

    fn looker(sweeps: bool, node: bool) -> Looker<'static> {
        Looker {
            me: "me",
            now_ms: NOW,
            lease_timeout: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            sweeps,
            node,
            forwards: node,
        }
    }

    fn retry(a: &Absence) -> Duration {
        match a {
            Absence::NotLive { retry_after, .. } => *retry_after,
            other => panic!("expected NotLive, got {other:?}"),
        }
    }

    #[test]
    fn running_here_is_retried_soon() {
        let h = header(SessionStatus::Running, Some("me"), NOW);
        assert_eq!(
            retry(&judge(&h, None, false, looker(false, false))),
            RETRY_SOON
        );
    }

    #[test]
    fn a_fresh_owner_elsewhere_is_retried_after_its_lease_and_one_sweep() {
        // Beat 4 s ago under a 30 s lease: 26 s left, then one 10 s sweep.
        let h = header(SessionStatus::Running, Some("old"), NOW - 4_000);
        let a = judge(&h, Some(NOW - 4_000), false, looker(true, false));
        assert_eq!(retry(&a), Duration::from_secs(36));
        let Absence::NotLive { why, .. } = a else {
            unreachable!()
        };
        assert!(why.contains("`old`") && why.contains("26s"), "{why}");
        // A cluster node forwards to live owners: finding none means it is moving.
        let a = judge(&h, Some(NOW - 4_000), false, looker(true, true));
        assert_eq!(retry(&a), RETRY_SOON);
        // A node that does not forward: it runs there, go there.
        let a = judge(
            &h,
            Some(NOW - 4_000),
            false,
            Looker {
                forwards: false,
                ..looker(true, true)
            },
        );
        let Absence::NotRunning { hint, .. } = a else {
            panic!("{a:?}")
        };
        assert!(hint.contains("runs on node `old`"), "{hint}");
    }

    #[test]
    fn the_owners_own_heartbeat_counts_as_well_as_the_records() {
        // The record was written long ago, but the owner beat a moment ago: live.
        let h = header(SessionStatus::Running, Some("old"), NOW - 100_000);
        let a = judge(&h, Some(NOW - 1_000), false, looker(true, false));
        assert_eq!(retry(&a), Duration::from_secs(39));
    }

    #[test]
    fn a_stale_or_orphaned_owner_is_being_recovered() {
        let h = header(SessionStatus::Running, Some("old"), NOW - 60_000);
        assert_eq!(
            retry(&judge(&h, Some(NOW - 60_000), false, looker(true, false))),
            Duration::from_secs(10)
        );
        // Fresh by the clock, but the store proved it gone.
        let h = header(SessionStatus::Running, Some("old"), NOW - 1_000);
        let a = judge(&h, Some(NOW - 1_000), true, looker(false, false));
        let Absence::NotLive { why, .. } = a else {
            panic!("{a:?}")
        };
        assert!(why.contains("gone"), "{why}");
    }

    #[test]
    fn interrupted_is_recovered_only_where_someone_sweeps_for_a_dead_owner() {
        let dead = header(SessionStatus::Interrupted, Some("old"), NOW - 60_000);
        assert!(matches!(
            judge(&dead, None, false, looker(true, false)),
            Absence::NotLive { .. }
        ));
        assert!(matches!(
            judge(&dead, None, false, looker(false, false)),
            Absence::NotRunning { .. }
        ));
        let mine = header(SessionStatus::Interrupted, Some("me"), NOW - 60_000);
        assert!(matches!(
            judge(&mine, None, false, looker(true, false)),
            Absence::NotRunning { .. }
        ));
    }

    #[test]
    fn stopped_answered_and_ended_records_say_what_to_do() {
        let stopped = header(SessionStatus::Stopped, None, NOW);
        let Absence::NotRunning { hint, status } =
            judge(&stopped, None, false, looker(true, false))
        else {
            panic!()
        };
        assert!(
            hint.contains("spawn it again") && status == "Stopped",
            "{status}: {hint}"
        );
        let mut waiting = header(SessionStatus::Stopped, None, NOW);
        waiting.awaiting_answer = true;
        let Absence::NotRunning { hint, .. } = judge(&waiting, None, false, looker(true, false))
        else {
            panic!()
        };
        assert!(hint.contains("answer"), "{hint}");
        for s in [
            SessionStatus::Completed,
            SessionStatus::Canceled,
            SessionStatus::Failed("boom".into()),
        ] {
            let Absence::NotRunning { hint, .. } =
                judge(&header(s, None, NOW), None, false, looker(true, false))
            else {
                panic!()
            };
            assert!(hint.contains("ended"), "{hint}");
        }
    }
}
