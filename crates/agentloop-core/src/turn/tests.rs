//! The turn's state machine without a runtime: each rule it decides (S1, S1b, S2, S3,
//! S6, S7, S8, S13, S15a), one event at a time, and a property test over random runs
//! of cancels, safe points, steps and time (cancel merging, safe-point capture, the
//! step book).

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::cancel::{CancelInfo, CancelMode, CancelRequest, SafePoint};
use crate::interrupt::InterruptInfo;
use crate::steps::{Journal, StepDecision, StepPolicy};
use crate::write::JournalChange;

/// Item `u32`, state `String`, an acknowledgement is a `u32` token.
type Machine = TurnMachine<u32, String, u32>;

fn machine(settings: TurnSettings) -> Machine {
    let input = StateSnap {
        value: "input".to_string(),
        bytes: None,
        tag: 0,
    };
    TurnMachine::new(7, Some(input), Journal::new("s", 7, 1 << 20), settings)
}

fn at(sp: SafePoint) -> CancelRequest {
    CancelRequest {
        mode: CancelMode::At(sp),
        timeout: None,
    }
}

fn immediate() -> CancelRequest {
    CancelRequest {
        mode: CancelMode::Immediate,
        timeout: None,
    }
}

fn written() -> TurnSettings {
    TurnSettings {
        safe_points_written: true,
        journal_writes: true,
    }
}

fn completed() -> RunEnd<String> {
    RunEnd::Returned(Ok(Outcome::Completed))
}

#[test]
fn s7_a_cancel_submitted_while_planning_waits_for_the_turn_to_run() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    let (sub, back, fx) = m.submit(at(SafePoint::AnySafePoint), Origin::Preempt, now, Some(1));
    assert_eq!((sub, back), (Submitted::Pending, None));
    assert_eq!(fx, Effects::none(), "a held cancel wakes nobody");
    assert!(!m.cancel_matches(SafePoint::AnySafePoint));

    let fx = m.start_running(None, now);
    assert_eq!(
        fx.acks,
        vec![1],
        "the held acknowledgement is answered at the start"
    );
    assert_eq!(fx.ack_answer, AckAnswer::Submitted);
    assert!(
        fx.preempted,
        "a preempt held while planning reaches the running turn"
    );
    assert!(m.cancel_matches(SafePoint::AfterModelCall));
}

#[test]
fn s7_a_cancel_to_a_running_turn_applies_now_and_hands_the_ack_back() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    let (sub, back, fx) = m.submit(at(SafePoint::AfterToolCalls), Origin::Stop, now, Some(2));
    assert_eq!((sub, back), (Submitted::Active, Some(2)));
    assert!(fx.wake_task && fx.cancel_watch);
    assert!(!fx.preempted, "a stop is not a preempt");
    let (_, _, fx) = m.submit(at(SafePoint::AfterToolCalls), Origin::Preempt, now, None);
    assert!(fx.preempted);
}

#[test]
fn an_ended_turn_is_no_target_for_a_cancel() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    m.finish(completed(), None, None);
    let (sub, back, fx) = m.submit(immediate(), Origin::Stop, now, Some(3));
    assert_eq!((sub, back), (Submitted::TurnEnded, Some(3)));
    assert_eq!(fx, Effects::none());
    assert!(!m.must_kill(), "nothing changes after the end");
}

#[test]
fn s1_a_capture_is_sticky_and_wins_over_what_the_agent_returned() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    m.submit(at(SafePoint::AfterToolCalls), Origin::Stop, now, None);
    let s = "after model".to_string();
    assert_eq!(m.safe_point(SafePoint::AfterModelCall, &s, None).0, Ok(()));
    let (r, _) = m.safe_point(SafePoint::AfterToolCalls, &"after tools".to_string(), None);
    assert_eq!(
        r,
        Err(Canceled {
            at: SafePoint::AfterToolCalls
        })
    );
    // The agent swallowed it: the next safe point still answers Canceled, at the first.
    let (r, _) = m.safe_point(SafePoint::AfterModelCall, &"later".to_string(), None);
    assert_eq!(
        r,
        Err(Canceled {
            at: SafePoint::AfterToolCalls
        })
    );
    assert!(m.is_captured() && !m.outcome_would_stand());

    let end = m.finish(completed(), None, None);
    assert_eq!(
        end,
        TurnEnd::Canceled(CancelInfo {
            mode: CancelMode::At(SafePoint::AfterToolCalls),
            at: Some(SafePoint::AfterToolCalls),
            escalated: false,
            timed_out: false,
            agent_error: None,
        })
    );
    match m.take_ending() {
        Some(Ending::Ran {
            resume_state: Some(s),
            failure: None,
            ..
        }) => assert_eq!(s.value, "later", "the last safe point's state is resumed"),
        other => panic!("unexpected ending {other:?}"),
    }
}

#[test]
fn s8_a_cancel_only_preempts_contributed_to_is_a_preemption_and_a_stop_makes_it_a_cancel() {
    let now = Instant::now();
    for (origins, canceled) in [
        (vec![Origin::Preempt], false),
        (vec![Origin::Preempt, Origin::Stop], true),
        (vec![Origin::Stop, Origin::Preempt], true),
    ] {
        let mut m = machine(TurnSettings::default());
        m.start_running(None, now);
        for o in origins {
            m.submit(at(SafePoint::AnySafePoint), o, now, None);
        }
        assert!(m
            .safe_point(SafePoint::AfterModelCall, &"x".into(), None)
            .0
            .is_err());
        let end = m.finish(
            RunEnd::Returned(Err(AgentError::Canceled(Canceled {
                at: SafePoint::AfterModelCall,
            }))),
            None,
            None,
        );
        assert_eq!(matches!(end, TurnEnd::Canceled(_)), canceled, "{end:?}");
        assert_eq!(matches!(end, TurnEnd::Preempted(_)), !canceled, "{end:?}");
    }
}

#[test]
fn s2_a_timeout_escalates_to_immediate_and_the_kill_reports_it() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    let req = CancelRequest {
        mode: CancelMode::At(SafePoint::AfterToolCalls),
        timeout: Some(Duration::from_secs(2)),
    };
    m.submit(req, Origin::Stop, now, None);
    assert_eq!(m.deadline(), Some(now + Duration::from_secs(2)));
    assert!(!m.must_kill());
    m.escalate_on_timeout(now + Duration::from_secs(1));
    assert!(!m.must_kill(), "not before the deadline");
    m.escalate_on_timeout(now + Duration::from_secs(2));
    assert!(m.must_kill());
    let end = m.finish(RunEnd::Killed, None, None);
    assert_eq!(
        end,
        TurnEnd::Canceled(CancelInfo {
            mode: CancelMode::Immediate,
            at: None,
            escalated: true,
            timed_out: true,
            agent_error: None,
        })
    );
}

#[test]
fn s13_an_agent_error_after_a_capture_is_kept_beside_the_cancel() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    m.submit(immediate(), Origin::Stop, now, None);
    let _ = m.safe_point(SafePoint::AfterModelCall, &"x".into(), None);
    let end = m.finish(
        RunEnd::Returned(Err(AgentError::failed("boom"))),
        None,
        None,
    );
    match end {
        TurnEnd::Canceled(info) => assert_eq!(info.agent_error.as_deref(), Some("boom")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn s26_failures_are_classified_where_they_happen() {
    let now = Instant::now();
    let cases: Vec<(RunEnd<String>, FailureKind)> = vec![
        (
            RunEnd::Returned(Err(AgentError::failed("t"))),
            FailureKind::Agent,
        ),
        (
            RunEnd::Returned(Err(AgentError::permanent("p"))),
            FailureKind::AgentPermanent,
        ),
        (RunEnd::Panicked("oops".into()), FailureKind::Panic),
        (RunEnd::Killed, FailureKind::Internal),
    ];
    for (run, kind) in cases {
        let mut m = machine(TurnSettings::default());
        m.start_running(None, now);
        assert!(matches!(m.finish(run, None, None), TurnEnd::Failed(_)));
        match m.take_ending() {
            Some(Ending::Ran { failure, .. }) => assert_eq!(failure, Some(kind)),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn s15a_a_state_that_does_not_encode_fails_the_turn_and_keeps_the_last_good_one() {
    let now = Instant::now();
    let mut m = machine(written());
    m.start_running(None, now);
    let good = Payload::from(vec![1u8]);
    let (r, fx) = m.safe_point(SafePoint::AfterModelCall, &"good".into(), Some(Ok(good)));
    assert_eq!(r, Ok(()));
    assert!(fx.progress, "a written safe point is progress");
    let (r, fx) = m.safe_point(
        SafePoint::AfterToolCalls,
        &"bad".into(),
        Some(Err("does not read back".into())),
    );
    assert_eq!(
        r,
        Err(Canceled {
            at: SafePoint::AfterToolCalls
        })
    );
    assert!(!fx.progress);
    let end = m.finish(completed(), None, None);
    assert!(matches!(&end, TurnEnd::Failed(e) if e.contains("does not read back")));
    match m.take_ending() {
        Some(Ending::Ran {
            resume_state: Some(s),
            failure: Some(FailureKind::Record),
            ..
        }) => assert_eq!(s.value, "good"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn s4_an_interrupt_continues_from_its_state_unless_it_does_not_encode() {
    let now = Instant::now();
    let info = InterruptInfo::new("approve");
    let mut m = machine(written());
    m.start_running(None, now);
    let run = RunEnd::Returned(Ok(Outcome::Interrupted(info.clone(), "asking".into())));
    let bytes = Some(Ok(Payload::from(vec![9u8])));
    assert_eq!(
        m.finish(run.clone(), bytes, None),
        TurnEnd::Interrupted(info)
    );
    match m.take_ending() {
        Some(Ending::Ran {
            resume_state: Some(s),
            ..
        }) => {
            assert_eq!(s.value, "asking");
            assert_eq!(s.tag >> 32, 7, "a tag of this turn");
        }
        other => panic!("{other:?}"),
    }

    let mut m = machine(written());
    m.start_running(None, now);
    let end = m.finish(run, Some(Err("no".into())), None);
    assert!(matches!(end, TurnEnd::Failed(_)));
    match m.take_ending() {
        Some(Ending::Ran {
            resume_state: Some(s),
            failure: Some(FailureKind::Record),
            ..
        }) => assert_eq!(s.value, "input"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_carried_state_gets_the_carried_tag_and_one_that_does_not_encode_fails() {
    let now = Instant::now();
    let mut m = machine(written());
    m.start_running(None, now);
    let run = RunEnd::Returned(Ok(Outcome::CompletedWith("next".to_string())));
    assert_eq!(
        m.finish(run.clone(), None, Some(Ok(Payload::from(vec![1u8])))),
        TurnEnd::Completed
    );
    match m.take_ending() {
        Some(Ending::Ran {
            carried: Some(c), ..
        }) => {
            assert_eq!(c.tag, carried_tag(7));
            assert!(is_carried(c.tag) && is_carried(LOADED_CARRIED_TAG));
            assert!(!is_carried(7 << 32 | 1));
        }
        other => panic!("{other:?}"),
    }
    let mut m = machine(written());
    m.start_running(None, now);
    assert!(matches!(
        m.finish(run, None, Some(Err("x".into()))),
        TurnEnd::Failed(_)
    ));
}

#[test]
fn s6_a_stop_while_planning_aborts_it_and_answers_held_acks() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.submit(at(SafePoint::AnySafePoint), Origin::Preempt, now, Some(4));
    assert!(m.abort_planning(Some(immediate())));
    assert!(m.planning_aborted());
    let fx = m.end_planning("stopped".into(), None);
    assert_eq!((fx.acks, fx.ack_answer), (vec![4], AckAnswer::TargetEnded));
    assert_eq!(
        m.take_ending(),
        Some(Ending::PlanAborted {
            reason: "stopped".into(),
            plan_failed: None
        })
    );

    // A plan that returned before the abort was seen stands, under the stop's cancel.
    let mut m = machine(TurnSettings::default());
    assert!(m.abort_planning(Some(immediate())));
    m.start_running(None, now);
    assert!(!m.abort_planning(None), "only a planning turn aborts");
    assert!(m.must_kill());
    assert!(matches!(
        m.finish(RunEnd::Killed, None, None),
        TurnEnd::Canceled(_)
    ));
}

#[test]
fn a_turn_abandoned_by_its_task_is_accounted_for_once() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.submit(immediate(), Origin::Preempt, now, Some(5));
    let fx = m.abandon("task died".into());
    assert_eq!(fx.acks, vec![5]);
    assert!(matches!(
        m.take_ending(),
        Some(Ending::PlanAborted {
            plan_failed: Some(FailureKind::Panic),
            ..
        })
    ));
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    m.finish(completed(), None, None);
    assert_eq!(
        m.abandon("late".into()),
        Effects::none(),
        "an ending stands"
    );
    assert!(matches!(
        m.take_ending(),
        Some(Ending::Ran {
            end: TurnEnd::Completed,
            ..
        })
    ));
}

#[test]
fn s1b_a_step_boundary_honours_a_cancel_like_a_safe_point_after_tool_calls() {
    let now = Instant::now();
    let mut m = machine(TurnSettings::default());
    m.start_running(None, now);
    m.submit(at(SafePoint::AfterModelCall), Origin::Stop, now, None);
    assert!(
        m.step_begin("a", StepPolicy::Retry, "s").is_ok(),
        "not its kind"
    );
    m.submit(at(SafePoint::AfterToolCalls), Origin::Stop, now, None);
    assert_eq!(
        m.step_begin("b", StepPolicy::Retry, "s").err(),
        Some(Canceled {
            at: SafePoint::AfterToolCalls
        })
    );
    assert!(m.is_captured());
}

#[test]
fn s1b_the_step_book_queues_entries_until_the_record_shows_the_turn_then_writes_direct() {
    let now = Instant::now();
    let mut m = machine(written());
    m.start_running(None, now);
    // A NoRetry step's beginning is queued for the session's next write.
    let (d, queued, fx) = m.step_begin("charge", StepPolicy::NoRetry, "s").unwrap();
    assert!(matches!(
        d,
        StepDecision::Run {
            journal_begin: true,
            ..
        }
    ));
    assert!(queued && fx.progress);
    let (f, fx) = m
        .step_finish(0, "charge", b"ok".to_vec(), "s", true)
        .unwrap();
    assert_eq!(
        f,
        StepFinish::Queued,
        "not direct before the record shows the turn"
    );
    assert!(fx.progress);
    let live = m.take_for_write(false, "s");
    assert_eq!(live.changes.len(), 2, "the beginning and the result");
    assert_eq!(live.mark.map(|k| k.turn), Some(7));

    m.cut_on_record();
    m.step_begin("mail", StepPolicy::Retry, "s").unwrap();
    let (f, fx) = m
        .step_finish(1, "mail", b"sent".to_vec(), "s", true)
        .unwrap();
    assert!(matches!(f, StepFinish::Direct(JournalChange::Put(1, _), _)));
    assert!(!fx.progress, "a direct entry is not the session's to write");
    m.step_begin("mail", StepPolicy::Retry, "s").unwrap();
    let (f, _) = m
        .step_finish(2, "mail", b"again".to_vec(), "s", false)
        .unwrap();
    assert_eq!(
        f,
        StepFinish::Queued,
        "no writer installed: with the next write"
    );

    // A whole write takes every entry and turns direct writes off for the turn.
    let live = m.take_for_write(true, "s");
    assert_eq!(live.changes.len(), 3);
    m.step_begin("log", StepPolicy::Retry, "s").unwrap();
    let (f, _) = m.step_finish(3, "log", b"x".to_vec(), "s", true).unwrap();
    assert_eq!(f, StepFinish::Queued);

    // A safe point covers the steps before it: their deletes go with its write.
    let _ = m.safe_point(
        SafePoint::AfterToolCalls,
        &"s".into(),
        Some(Ok(Payload::from(vec![0u8]))),
    );
    let live = m.take_for_write(false, "s");
    let deletes: Vec<_> = live
        .changes
        .iter()
        .filter_map(|c| match c {
            JournalChange::Delete(o) => Some(*o),
            JournalChange::Put(..) => None,
        })
        .collect();
    assert_eq!(deletes, vec![0, 1, 2, 3]);
    assert_eq!(m.journal(), Some(m.steps.journal.to_record()));

    // A refused direct entry of a covered step is not put back.
    let entry = crate::steps::JournalEntry {
        occurrence: 1,
        name: "mail".into(),
        result: Some(b"sent".to_vec()),
    };
    assert_eq!(m.step_requeue(&entry, "s").0, Requeue::Covered);
    m.finish(completed(), None, None);
    assert_eq!(m.step_requeue(&entry, "s").0, Requeue::TurnOver);
    assert_eq!(
        m.step_finish(9, "late", vec![], "s", true)
            .err()
            .map(|e| e.to_string().is_empty()),
        Some(false),
        "a step never begun is refused"
    );
}

#[test]
fn s1b_a_step_result_over_the_bound_fails_the_turn() {
    let now = Instant::now();
    let mut m: Machine =
        TurnMachine::new(1, None, Journal::new("s", 1, 4), TurnSettings::default());
    m.start_running(None, now);
    m.step_begin("big", StepPolicy::Retry, "s").unwrap();
    assert!(m.step_finish(0, "big", vec![0; 64], "s", false).is_err());
    assert!(!m.outcome_would_stand());
    let end = m.finish(completed(), None, None);
    assert!(matches!(end, TurnEnd::Failed(_)), "{end:?}");
}

#[test]
fn the_journal_left_over_names_every_entry_a_write_may_hold() {
    let now = Instant::now();
    let mut m = machine(written());
    m.start_running(None, now);
    m.step_begin("a", StepPolicy::NoRetry, "s").unwrap();
    m.step_begin("b", StepPolicy::Retry, "s").unwrap();
    m.step_finish(1, "b", vec![1], "s", false).unwrap();
    assert_eq!(m.journal_leftovers(), vec![0, 1]);
}

/// One event of a random run.
#[derive(Clone, Debug)]
enum Op {
    Submit(CancelRequest, Origin),
    SafePoint(SafePoint),
    Step(StepPolicy, bool),
    Advance(u64),
    Write(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![
        Just(CancelMode::Immediate),
        (1u8..=3).prop_map(|b| CancelMode::At(SafePoint::from_bits(b))),
    ];
    let req = (mode, proptest::option::of(0u64..50)).prop_map(|(mode, t)| CancelRequest {
        mode,
        timeout: t.map(Duration::from_millis),
    });
    let origin = prop_oneof![Just(Origin::Stop), Just(Origin::Preempt)];
    prop_oneof![
        (req, origin).prop_map(|(r, o)| Op::Submit(r, o)),
        (1u8..=3).prop_map(|b| Op::SafePoint(SafePoint::from_bits(b))),
        (any::<bool>(), any::<bool>()).prop_map(|(no_retry, finish)| Op::Step(
            if no_retry {
                StepPolicy::NoRetry
            } else {
                StepPolicy::Retry
            },
            finish
        )),
        (0u64..40).prop_map(Op::Advance),
        any::<bool>().prop_map(Op::Write),
    ]
}

proptest! {
    /// Over any run of cancels, safe points, steps, time and writes:
    /// - S3: the cancel in force is the merge of every cancel submitted (in any order),
    ///   escalated by the time that passed;
    /// - S1: the first safe point (or step boundary) whose kind the cancel in force
    ///   matches captures it, and every later one answers the same capture;
    /// - S8/S13: a captured turn ends Canceled if any stop contributed, else Preempted,
    ///   at the captured safe point, whatever the agent returned;
    /// - S1b: the journal keeps its invariants, state tags only grow, and a write never
    ///   gets a change twice.
    #[test]
    fn a_random_turn_keeps_the_rules(ops in proptest::collection::vec(op(), 0..40),
                                     stop_first in any::<bool>()) {
        let base = Instant::now();
        let mut now = base;
        let mut m: Machine = TurnMachine::new(3, None, Journal::new("s", 3, 1 << 16), written());
        if stop_first {
            m.submit(at(SafePoint::AfterModelCall), Origin::Stop, now, None);
        }
        m.start_running(None, now);
        let mut merged = if stop_first {
            Some(at(SafePoint::AfterModelCall).at(now))
        } else {
            None
        };
        let mut first_capture: Option<SafePoint> = None;
        let mut any_stop = stop_first;
        let mut any_cancel = stop_first;
        let mut last_tag = 0u64;
        let mut occurrence = 0u32;
        for op in ops {
            match op {
                Op::Submit(req, origin) => {
                    any_stop |= origin == Origin::Stop;
                    any_cancel = true;
                    let (sub, _, fx) = m.submit(req, origin, now, None);
                    prop_assert_eq!(sub, Submitted::Active);
                    prop_assert!(fx.wake_task && fx.cancel_watch);
                    merged = CancelState::merge_opt(merged, Some(req.at(now)), now);
                }
                Op::SafePoint(kind) => {
                    let would = merged.is_some_and(|c| c.matches(kind));
                    let (r, _) = m.safe_point(kind, &"st".to_string(), Some(Ok(Payload::from(vec![1u8]))));
                    // A matching cancel answers at this safe point; a capture already
                    // made (and swallowed) keeps answering at the first one.
                    match (would, first_capture) {
                        (true, _) => {
                            prop_assert_eq!(r, Err(Canceled { at: kind }));
                            first_capture.get_or_insert(kind);
                        }
                        (false, Some(at)) => prop_assert_eq!(r, Err(Canceled { at })),
                        (false, None) => prop_assert_eq!(r, Ok(())),
                    }
                    let tag = m.state_snapshot().map(|s| s.tag).unwrap_or(0);
                    prop_assert!(tag >= last_tag, "tags only grow");
                    last_tag = tag;
                }
                Op::Step(policy, finish) => {
                    let would = merged.is_some_and(|c| c.matches(SafePoint::AfterToolCalls));
                    match m.step_begin("step", policy, "s") {
                        Err(c) => {
                            prop_assert!(would || first_capture.is_some());
                            let at = first_capture.unwrap_or(SafePoint::AfterToolCalls);
                            prop_assert_eq!(c, Canceled { at });
                            first_capture = Some(at);
                        }
                        Ok((StepDecision::Run { key, .. }, _, _)) => {
                            prop_assert!(first_capture.is_none() && !would);
                            prop_assert_eq!(key.occurrence, occurrence);
                            occurrence += 1;
                            if finish {
                                prop_assert!(m.step_finish(key.occurrence, "step", vec![7], "s", true).is_ok());
                            } else {
                                m.step_abandon(key.occurrence);
                            }
                        }
                        Ok((other, _, _)) => prop_assert!(false, "a new turn's step must run: {:?}", other),
                    }
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(ms);
                    m.escalate_on_timeout(now);
                    merged = merged.map(|c| c.normalized(now));
                }
                Op::Write(whole) => {
                    let entries = m.steps.journal.entries().len();
                    let live = m.take_for_write(whole, "s");
                    let mut seen = std::collections::BTreeSet::new();
                    for c in &live.changes {
                        let o = match c {
                            JournalChange::Put(o, _) | JournalChange::Delete(o) => *o,
                        };
                        prop_assert!(o < occurrence, "a change names a step that began");
                        if whole {
                            prop_assert!(matches!(c, JournalChange::Put(..)));
                            prop_assert!(seen.insert(o), "a whole write puts each entry once");
                        }
                    }
                    if whole {
                        prop_assert_eq!(live.changes.len(), entries);
                    }
                    m.cut_on_record();
                }
            }
            prop_assert_eq!(m.steps.journal.check(), Ok(()));
            prop_assert_eq!(m.deadline(), merged.and_then(|c| c.deadline));
            prop_assert_eq!(m.must_kill(), merged.is_some_and(|c| c.mode == CancelMode::Immediate));
        }
        let run = if m.must_kill() { RunEnd::Killed } else { completed() };
        let killed = matches!(run, RunEnd::Killed);
        let end = m.finish(run, None, None);
        match (first_capture, killed) {
            (None, false) => prop_assert_eq!(end, TurnEnd::Completed),
            (capture, _) => {
                prop_assert!(any_cancel);
                let info = match (&end, any_stop) {
                    (TurnEnd::Canceled(i), true) | (TurnEnd::Preempted(i), false) => i.clone(),
                    _ => return Err(TestCaseError::fail(format!("{end:?} with stop {any_stop}"))),
                };
                prop_assert_eq!(info.at, if killed { None } else { capture });
                prop_assert_eq!(Some(info.mode), merged.map(|c| c.mode));
            }
        }
    }
}
