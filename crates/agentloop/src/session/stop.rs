//! The stop state of one session: how successive stop requests combine (DESIGN S11, S12).
//!
//! This module owns the rules that are about stops themselves, independent of turns:
//! a stop commits once and only escalates; `until_idle_for` does not commit and only the
//! first one counts; `drain` is the weakest committing stop and any later non-drain stop
//! overrides it; `skip_checkpoint` and `shutdown` are sticky. The first non-empty cause
//! is kept in the session's shared state. Cancels are merged by the turn's control
//! block (S3); this module only reports what a request asks for.

use std::time::Duration;

use crate::cancel::CancelRequest;
use crate::options::StopOptions;

/// The combined effect of all stop requests so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StopState {
    /// A non-idle stop has been accepted: new pushes are late from now on.
    pub(crate) committed: bool,
    /// Every committing stop so far was `drain`: finish every accepted item first.
    pub(crate) drain: bool,
    /// The first `until_idle_for` (S11: only the first one counts).
    pub(crate) idle_for: Option<Duration>,
    /// Sticky: once set by any stop, never cleared.
    pub(crate) skip_checkpoint: bool,
    /// Sticky: a shutdown stop was received.
    pub(crate) shutdown: bool,
    /// Sticky: the session was canceled by id; its record already says so.
    pub(crate) canceled: bool,
}

/// What one stop request asks the loop to do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopEffect {
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
    pub(crate) fn apply(&mut self, opts: &StopOptions) -> StopEffect {
        self.skip_checkpoint |= opts.skip_checkpoint;
        self.shutdown |= opts.shutdown;
        self.canceled |= opts.canceled;
        if opts.is_idle_only() {
            if self.idle_for.is_none() && !self.committed {
                self.idle_for = opts.idle_for;
            }
            return StopEffect::IdleOnly;
        }
        let newly = !self.committed;
        // A drain that also asks for a cancel is a cancel: the stronger request wins.
        let is_drain = opts.drain && opts.cancel.is_none();
        if newly {
            self.drain = is_drain;
        } else if !is_drain {
            self.drain = false;
        }
        self.committed = true;
        StopEffect::Commit {
            cancel: opts.cancel,
            newly,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s11_skip_checkpoint_is_sticky() {
        let mut s = StopState::default();
        s.apply(&StopOptions::bare().skip_checkpoint());
        s.apply(&StopOptions::immediate());
        assert!(s.skip_checkpoint);
    }

    #[test]
    fn s11_only_the_first_idle_request_counts_and_it_does_not_commit() {
        let mut s = StopState::default();
        assert_eq!(
            s.apply(&StopOptions::until_idle_for(Duration::from_secs(3))),
            StopEffect::IdleOnly
        );
        s.apply(&StopOptions::until_idle_for(Duration::from_secs(9)));
        assert_eq!(s.idle_for, Some(Duration::from_secs(3)));
        assert!(!s.committed);
        assert!(matches!(
            s.apply(&StopOptions::bare()),
            StopEffect::Commit { newly: true, .. }
        ));
    }

    #[test]
    fn s11_drain_is_overridden_by_any_later_non_drain_stop() {
        let mut s = StopState::default();
        s.apply(&StopOptions::drain());
        assert!(s.drain && s.committed);
        s.apply(&StopOptions::drain());
        assert!(s.drain);
        assert!(matches!(
            s.apply(&StopOptions::bare()),
            StopEffect::Commit { newly: false, .. }
        ));
        assert!(!s.drain, "a bare stop after drain escalates");
        s.apply(&StopOptions::drain());
        assert!(!s.drain, "a drain after a bare stop never de-escalates");
    }
}
