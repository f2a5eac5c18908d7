//! How successive stop requests combine (DESIGN S11, S12), sans IO: a stop commits once
//! and only escalates; `until_idle_for` does not commit and only the first one counts;
//! `drain` is the weakest committing stop and any later non-drain stop overrides it;
//! `skip_checkpoint`, `shutdown` and `canceled` are sticky.
//!
//! [`StopState`] is a plain value folded over [`StopRequest`]s (the part of a stop's
//! options the fold reads); [`StopState::apply`] says what the request asks of the
//! session now ([`StopEffect`]). The session core keeps one per session and acts on the
//! effect (the first non-empty cause, the cancel of the turn in flight, the boundary);
//! this module never sees a turn, an item or a clock.

use std::time::Duration;

use crate::cancel::CancelRequest;

/// What the fold reads of one stop request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopRequest {
    /// The cancel to apply to the running turn, if any.
    pub cancel: Option<CancelRequest>,
    /// Finish every accepted item before exiting.
    pub drain: bool,
    /// Exit once idle for this long: a request with it does not commit the stop.
    pub idle_for: Option<Duration>,
    /// Do not persist at exit (sticky).
    pub skip_checkpoint: bool,
    /// The process shuts down (sticky).
    pub shutdown: bool,
    /// The session was canceled by id; its record already says so (sticky).
    pub canceled: bool,
}

impl StopRequest {
    /// Whether the request only asks for an exit once idle (it does not commit).
    pub fn is_idle_only(&self) -> bool {
        self.idle_for.is_some()
    }
}

/// The combined effect of all stop requests so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopState {
    /// A non-idle stop has been accepted: new pushes are late from now on.
    pub committed: bool,
    /// Every committing stop so far was `drain`: finish every accepted item first.
    pub drain: bool,
    /// The first `until_idle_for` (S11: only the first one counts).
    pub idle_for: Option<Duration>,
    /// Sticky: once set by any stop, never cleared.
    pub skip_checkpoint: bool,
    /// Sticky: a shutdown stop was received.
    pub shutdown: bool,
    /// Sticky: the session was canceled by id; its record already says so.
    pub canceled: bool,
}

/// What one stop request asks the session to do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopEffect {
    /// An idle-exit request: nothing to do but (re)arm the idle timer.
    IdleOnly,
    /// A committing stop.
    Commit {
        /// The cancel to submit to the running turn (ignored for drain).
        cancel: Option<CancelRequest>,
        /// This request is the one that committed the stop.
        newly: bool,
    },
}

impl StopState {
    /// Folds one request in (S11, S12).
    pub fn apply(&mut self, req: &StopRequest) -> StopEffect {
        self.skip_checkpoint |= req.skip_checkpoint;
        self.shutdown |= req.shutdown;
        self.canceled |= req.canceled;
        if req.is_idle_only() {
            if self.idle_for.is_none() && !self.committed {
                self.idle_for = req.idle_for;
            }
            return StopEffect::IdleOnly;
        }
        let newly = !self.committed;
        // A drain that also asks for a cancel is a cancel: the stronger request wins.
        let is_drain = req.drain && req.cancel.is_none();
        if newly {
            self.drain = is_drain;
        } else if !is_drain {
            self.drain = false;
        }
        self.committed = true;
        StopEffect::Commit {
            cancel: req.cancel,
            newly,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::{CancelMode, SafePoint};
    use proptest::prelude::*;

    fn cancel() -> Option<CancelRequest> {
        Some(CancelRequest {
            mode: CancelMode::At(SafePoint::AnySafePoint),
            timeout: None,
        })
    }

    #[test]
    fn s11_the_first_committing_stop_commits_and_says_so_once() {
        let mut s = StopState::default();
        let bare = StopRequest::default();
        assert_eq!(
            s.apply(&bare),
            StopEffect::Commit {
                cancel: None,
                newly: true
            }
        );
        assert_eq!(
            s.apply(&bare),
            StopEffect::Commit {
                cancel: None,
                newly: false
            }
        );
        assert!(s.committed);
    }

    #[test]
    fn s11_only_the_first_idle_request_counts_and_none_after_a_commit() {
        let mut s = StopState::default();
        let idle = |ms| StopRequest {
            idle_for: Some(Duration::from_millis(ms)),
            ..StopRequest::default()
        };
        assert_eq!(s.apply(&idle(50)), StopEffect::IdleOnly);
        assert_eq!(s.apply(&idle(10)), StopEffect::IdleOnly);
        assert_eq!(s.idle_for, Some(Duration::from_millis(50)));
        assert!(!s.committed, "an idle request does not commit");
        let mut t = StopState::default();
        t.apply(&StopRequest::default());
        t.apply(&idle(10));
        assert_eq!(
            t.idle_for, None,
            "after a commit an idle request changes nothing"
        );
    }

    #[test]
    fn s12_drain_is_the_weakest_and_a_later_stop_overrides_it() {
        let mut s = StopState::default();
        let drain = StopRequest {
            drain: true,
            ..StopRequest::default()
        };
        s.apply(&drain);
        assert!(s.drain);
        s.apply(&drain);
        assert!(s.drain, "drain after drain stays drain");
        s.apply(&StopRequest::default());
        assert!(!s.drain, "a bare stop overrides a drain");
        s.apply(&drain);
        assert!(!s.drain, "a later drain does not weaken it again");
        let mut t = StopState::default();
        t.apply(&StopRequest {
            drain: true,
            cancel: cancel(),
            ..StopRequest::default()
        });
        assert!(!t.drain, "a drain that cancels is a cancel");
    }

    fn request() -> impl Strategy<Value = StopRequest> {
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(1u64..100),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(c, drain, idle, skip, shutdown, canceled)| StopRequest {
                cancel: if c { cancel() } else { None },
                drain,
                idle_for: idle.map(Duration::from_millis),
                skip_checkpoint: skip,
                shutdown,
                canceled,
            })
    }

    proptest! {
        /// Over any sequence of requests: the sticky flags are the OR of every request's,
        /// `committed` never goes back and is set by the first non-idle request (which
        /// alone says `newly`), the idle time is the first idle request's before any
        /// commit, and `drain` holds exactly when every committing request was a drain
        /// without a cancel.
        #[test]
        fn s11_s12_stops_only_escalate(reqs in proptest::collection::vec(request(), 0..20)) {
            let mut s = StopState::default();
            let mut newly_seen = 0;
            let mut first_idle = None;
            let mut all_drains = true;
            for (i, r) in reqs.iter().enumerate() {
                let was = s.clone();
                let effect = s.apply(r);
                prop_assert!(!was.committed || s.committed);
                prop_assert_eq!(s.skip_checkpoint, reqs[..=i].iter().any(|r| r.skip_checkpoint));
                prop_assert_eq!(s.shutdown, reqs[..=i].iter().any(|r| r.shutdown));
                prop_assert_eq!(s.canceled, reqs[..=i].iter().any(|r| r.canceled));
                match effect {
                    StopEffect::IdleOnly => {
                        prop_assert!(r.is_idle_only());
                        if !was.committed && first_idle.is_none() {
                            first_idle = r.idle_for;
                        }
                    }
                    StopEffect::Commit { cancel, newly } => {
                        prop_assert!(!r.is_idle_only());
                        prop_assert_eq!(cancel, r.cancel);
                        prop_assert_eq!(newly, !was.committed);
                        newly_seen += usize::from(newly);
                        all_drains &= r.drain && r.cancel.is_none();
                        prop_assert_eq!(s.drain, all_drains);
                    }
                }
                prop_assert_eq!(s.idle_for, first_idle);
            }
            prop_assert!(newly_seen <= 1);
            prop_assert_eq!(newly_seen == 1, s.committed);
        }
    }
}
