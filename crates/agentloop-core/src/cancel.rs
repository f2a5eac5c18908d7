//! Cancel types and the cancel merge algebra (DESIGN S1–S3).
//!
//! This module owns the vocabulary of cancellation: the [`SafePoint`] bit set, the
//! user-facing [`CancelMode`] and [`CancelRequest`], the merged [`CancelState`] that a
//! running turn holds, and the [`CancelInfo`] reported when a turn was cut. It is pure
//! data and arithmetic: it must not touch actors, tasks, channels or clocks (callers pass
//! `now` in: the runtime's shell turns tokio's instant into a `std::time::Instant`, so
//! a paused test clock still drives it), so the algebra can be tested as a property.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use std::time::Instant;

/// A set of safe-point kinds (S1): places in a turn where the agent has recorded a
/// resumable state and where a cancel may end the turn.
///
/// It is a bit set: [`SafePoint::AfterModelCall`] and [`SafePoint::AfterToolCalls`] are
/// the two kinds, [`SafePoint::AnySafePoint`] is both.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SafePoint(u8);

#[allow(non_upper_case_globals)]
impl SafePoint {
    /// No safe point at all (the empty set). Not a valid cancel target.
    pub const None: SafePoint = SafePoint(0);
    /// Right after a model call returned.
    pub const AfterModelCall: SafePoint = SafePoint(0b01);
    /// Right after a round of tool calls finished.
    pub const AfterToolCalls: SafePoint = SafePoint(0b10);
    /// Either kind.
    pub const AnySafePoint: SafePoint = SafePoint(0b11);

    /// The union of two sets.
    pub const fn union(self, other: SafePoint) -> SafePoint {
        SafePoint(self.0 | other.0)
    }

    /// Whether the two sets share a kind.
    pub const fn intersects(self, other: SafePoint) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether every kind of `other` is in `self`.
    pub const fn contains(self, other: SafePoint) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The raw bits (bit 0: after model call, bit 1: after tool calls).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Builds a set from raw bits; unknown bits are ignored.
    pub const fn from_bits(bits: u8) -> SafePoint {
        SafePoint(bits & 0b11)
    }
}

impl fmt::Debug for SafePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("None"),
            0b01 => f.write_str("AfterModelCall"),
            0b10 => f.write_str("AfterToolCalls"),
            _ => f.write_str("AnySafePoint"),
        }
    }
}

impl fmt::Display for SafePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// How a cancel ends a turn (S2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum CancelMode {
    /// Drop the turn's future at its current await point, now.
    Immediate,
    /// End the turn at the next safe point of one of these kinds.
    At(SafePoint),
}

impl CancelMode {
    /// Whether this mode is at least as strong as `other` (Immediate dominates; a
    /// safe-point set dominates its subsets).
    pub fn dominates(self, other: CancelMode) -> bool {
        match (self, other) {
            (CancelMode::Immediate, _) => true,
            (CancelMode::At(_), CancelMode::Immediate) => false,
            (CancelMode::At(a), CancelMode::At(b)) => a.contains(b),
        }
    }

    /// Merges two modes: Immediate absorbs, safe-point sets union (S3).
    pub fn merge(self, other: CancelMode) -> CancelMode {
        match (self, other) {
            (CancelMode::Immediate, _) | (_, CancelMode::Immediate) => CancelMode::Immediate,
            (CancelMode::At(a), CancelMode::At(b)) => CancelMode::At(a.union(b)),
        }
    }
}

impl fmt::Display for CancelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CancelMode::Immediate => f.write_str("Immediate"),
            CancelMode::At(sp) => write!(f, "At({sp})"),
        }
    }
}

/// A cancel as a caller asks for it: a mode and an optional timeout after which it
/// escalates to [`CancelMode::Immediate`] (S2). The timeout is relative; it becomes an
/// absolute deadline when the request is submitted to a running turn.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CancelRequest {
    /// Where the turn should end.
    pub mode: CancelMode,
    /// Escalate to Immediate when the turn has not ended this long after submission.
    pub timeout: Option<Duration>,
}

impl CancelRequest {
    /// Turns the request into a state, anchoring its timeout at `now`. A timeout too
    /// large to represent as an instant (e.g. `Duration::MAX`) means no deadline.
    pub fn at(self, now: Instant) -> CancelState {
        CancelState {
            mode: self.mode,
            deadline: self.timeout.and_then(|t| now.checked_add(t)),
            timed_out: false,
        }
        .normalized(now)
    }

    /// Merges two pending (not yet submitted) requests: modes merge, the shorter
    /// timeout wins.
    pub fn merge(self, other: CancelRequest) -> CancelRequest {
        CancelRequest {
            mode: self.mode.merge(other.mode),
            timeout: min_opt(self.timeout, other.timeout),
        }
    }
}

/// The merged cancel a turn holds (S3): a mode, the earliest absolute deadline, and
/// whether a deadline has already expired (which made the mode Immediate).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CancelState {
    /// The merged mode.
    pub mode: CancelMode,
    /// The earliest absolute deadline of all merged requests.
    pub deadline: Option<Instant>,
    /// A deadline expired: the mode was escalated to Immediate by time.
    pub timed_out: bool,
}

impl CancelState {
    /// Applies the "a deadline already past becomes Immediate" rule.
    ///
    /// Invariant: normalization is idempotent, so merging normalized states in any
    /// order and grouping gives the same result (the algebra is associative and
    /// commutative for a fixed `now`).
    pub fn normalized(mut self, now: Instant) -> CancelState {
        if let Some(d) = self.deadline {
            if d <= now {
                self.mode = CancelMode::Immediate;
                self.timed_out = true;
            }
        }
        self
    }

    /// Merges two states at `now` (S3): Immediate dominates, safe-point sets union, the
    /// earliest deadline wins, a past deadline becomes Immediate.
    pub fn merge(self, other: CancelState, now: Instant) -> CancelState {
        CancelState {
            mode: self.mode.merge(other.mode),
            deadline: min_opt(self.deadline, other.deadline),
            timed_out: self.timed_out || other.timed_out,
        }
        .normalized(now)
    }

    /// Merges an optional existing state with an optional new one. `None` stands for a
    /// request with no cancel intent (a bare Stop): it never weakens an existing cancel.
    pub fn merge_opt(
        a: Option<CancelState>,
        b: Option<CancelState>,
        now: Instant,
    ) -> Option<CancelState> {
        match (a, b) {
            (None, None) => None,
            (Some(x), None) | (None, Some(x)) => Some(x.normalized(now)),
            (Some(x), Some(y)) => Some(x.merge(y, now)),
        }
    }

    /// Whether a turn reaching a safe point of `kind` must end there.
    pub fn matches(&self, kind: SafePoint) -> bool {
        match self.mode {
            CancelMode::Immediate => true,
            CancelMode::At(set) => set.intersects(kind),
        }
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// What a cut turn reports about the cancel that ended it (S2, S13).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct CancelInfo {
    /// The merged mode in force when the turn ended.
    pub mode: CancelMode,
    /// The safe point at which the turn ended, or `None` when its future was dropped
    /// (Immediate).
    pub at: Option<SafePoint>,
    /// The mode in force at the end is stronger than the first one submitted (a later
    /// request or a timeout raised it).
    pub escalated: bool,
    /// A cancel timeout expired before the turn ended, which made it Immediate.
    pub timed_out: bool,
    /// The error the agent returned after the cancel was captured, if it returned one
    /// of its own: the cancel decides how the turn ended (S1), and this keeps what the
    /// agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_error: Option<String>,
}

/// The error `TurnCx::safe_point` returns when a pending cancel matches: the
/// agent propagates it with `?`. The runtime has already captured the cancel, so an
/// agent that swallows this error does not hide it (S1).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("turn canceled at safe point {at}: return this error with `?` so the turn ends here")]
pub struct Canceled {
    /// The safe point at which the cancel was honoured.
    pub at: SafePoint,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mode_strategy() -> impl Strategy<Value = CancelMode> {
        prop_oneof![
            Just(CancelMode::Immediate),
            (1u8..=3).prop_map(|b| CancelMode::At(SafePoint::from_bits(b))),
        ]
    }

    fn state_strategy(base: Instant) -> impl Strategy<Value = Option<CancelState>> {
        proptest::option::of((
            mode_strategy(),
            proptest::option::of(0u64..20),
            any::<bool>(),
        ))
        .prop_map(move |o| {
            o.map(|(mode, d, timed_out)| CancelState {
                mode,
                deadline: d.map(|ms| base + Duration::from_millis(ms)),
                timed_out,
            })
        })
    }

    fn now_and_states() -> impl Strategy<
        Value = (
            Instant,
            Option<CancelState>,
            Option<CancelState>,
            Option<CancelState>,
        ),
    > {
        let base = Instant::now();
        (0u64..20).prop_flat_map(move |n| {
            (
                Just(base + Duration::from_millis(n)),
                state_strategy(base),
                state_strategy(base),
                state_strategy(base),
            )
        })
    }

    proptest! {
        /// S3: merging is commutative.
        #[test]
        fn s3_merge_is_commutative((now, a, b, _c) in now_and_states()) {
            prop_assert_eq!(CancelState::merge_opt(a, b, now), CancelState::merge_opt(b, a, now));
        }

        /// S3: merging is associative.
        #[test]
        fn s3_merge_is_associative((now, a, b, c) in now_and_states()) {
            let left = CancelState::merge_opt(CancelState::merge_opt(a, b, now), c, now);
            let right = CancelState::merge_opt(a, CancelState::merge_opt(b, c, now), now);
            prop_assert_eq!(left, right);
        }

        /// S3: Immediate absorbs everything.
        #[test]
        fn s3_immediate_is_absorbing((now, a, _b, _c) in now_and_states()) {
            let imm = Some(CancelState { mode: CancelMode::Immediate, deadline: None, timed_out: false });
            let m = CancelState::merge_opt(a, imm, now).map(|s| s.mode);
            prop_assert_eq!(m, Some(CancelMode::Immediate));
        }

        /// S3/S12: merging never de-escalates: the result dominates both inputs, and a
        /// request with no cancel intent (None) leaves the other unchanged.
        #[test]
        fn s3_merge_never_deescalates((now, a, b, _c) in now_and_states()) {
            let m = CancelState::merge_opt(a, b, now);
            for x in [a, b].into_iter().flatten() {
                let m = m.expect("merging with a cancel yields a cancel");
                prop_assert!(m.mode.dominates(x.normalized(now).mode));
                if let Some(d) = x.deadline {
                    prop_assert!(m.deadline.is_some_and(|md| md <= d));
                }
            }
            prop_assert_eq!(CancelState::merge_opt(a, None, now), a.map(|s| s.normalized(now)));
        }
    }

    #[test]
    fn s2_huge_timeout_means_no_deadline_not_a_panic() {
        let now = Instant::now();
        let s = CancelRequest {
            mode: CancelMode::At(SafePoint::AnySafePoint),
            timeout: Some(Duration::MAX),
        }
        .at(now);
        assert_eq!(s.deadline, None);
        assert_eq!(s.mode, CancelMode::At(SafePoint::AnySafePoint));
    }

    #[test]
    fn s3_past_deadline_becomes_immediate() {
        let now = Instant::now();
        let s = CancelRequest {
            mode: CancelMode::At(SafePoint::AfterToolCalls),
            timeout: Some(Duration::ZERO),
        }
        .at(now);
        assert_eq!(s.mode, CancelMode::Immediate);
        assert!(s.timed_out);
    }

    #[test]
    fn s3_earliest_deadline_wins_and_sets_union() {
        let now = Instant::now();
        let a = CancelRequest {
            mode: CancelMode::At(SafePoint::AfterModelCall),
            timeout: Some(Duration::from_secs(5)),
        }
        .at(now);
        let b = CancelRequest {
            mode: CancelMode::At(SafePoint::AfterToolCalls),
            timeout: Some(Duration::from_secs(2)),
        }
        .at(now);
        let m = a.merge(b, now);
        assert_eq!(m.mode, CancelMode::At(SafePoint::AnySafePoint));
        assert_eq!(m.deadline, Some(now + Duration::from_secs(2)));
        assert!(!m.timed_out);
    }

    #[test]
    fn s1_safe_point_set_operations() {
        assert!(SafePoint::AnySafePoint.contains(SafePoint::AfterModelCall));
        assert!(SafePoint::AnySafePoint.intersects(SafePoint::AfterToolCalls));
        assert!(!SafePoint::AfterModelCall.intersects(SafePoint::AfterToolCalls));
        assert_eq!(
            SafePoint::AfterModelCall.union(SafePoint::AfterToolCalls),
            SafePoint::AnySafePoint
        );
        assert!(SafePoint::None.is_empty());
    }
}
