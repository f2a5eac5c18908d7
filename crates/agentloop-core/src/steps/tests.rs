use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn key(occurrence: u32, name: &str) -> StepKey {
    StepKey {
        session: "s/1".into(),
        turn: 7,
        occurrence,
        name: name.into(),
    }
}

#[test]
fn a_key_prints_and_reads_back_with_slashes_in_the_session_id() {
    let k = key(3, "charge");
    assert_eq!(k.to_string(), "s/1/7/3/charge");
    assert_eq!("s/1/7/3/charge".parse::<StepKey>(), Ok(k));
    for bad in [
        "",
        "charge",
        "s/x/3/charge",
        "s/7/x/charge",
        "/7/3/charge",
        "s/7/3/",
    ] {
        assert!(bad.parse::<StepKey>().is_err(), "{bad:?} read as a key");
    }
}

#[test]
fn the_decision_table() {
    let entries = vec![
        JournalEntry {
            occurrence: 0,
            name: "search".into(),
            result: Some(b"r0".to_vec()),
        },
        JournalEntry {
            occurrence: 1,
            name: "charge".into(),
            result: None,
        },
    ];
    // Finished, same name: replayed.
    let mut j = Journal::resume("s/1", 7, 0, entries.clone(), 100);
    assert_eq!(
        j.begin("search", StepPolicy::Retry),
        StepDecision::Replay {
            key: key(0, "search"),
            result: b"r0".to_vec()
        }
    );
    // Begun, not finished: run again with the same key under Retry...
    assert_eq!(
        j.begin("charge", StepPolicy::Retry),
        StepDecision::Run {
            key: key(1, "charge"),
            unknown: true,
            journal_begin: false
        }
    );
    // ...unknown under NoRetry.
    let mut j = Journal::resume("s/1", 7, 0, entries.clone(), 100);
    j.begin("search", StepPolicy::NoRetry);
    assert_eq!(
        j.begin("charge", StepPolicy::NoRetry),
        StepDecision::Unknown {
            key: key(1, "charge")
        }
    );
    // Nothing journaled: fresh; a NoRetry step journals its beginning first.
    assert_eq!(
        j.begin("mail", StepPolicy::NoRetry),
        StepDecision::Run {
            key: key(2, "mail"),
            unknown: false,
            journal_begin: true
        }
    );
    // Another name at a journaled position: divergence, and the journal does not move.
    let mut j = Journal::resume("s/1", 7, 0, entries, 100);
    let d = j.begin("refund", StepPolicy::Retry);
    assert_eq!(
        d,
        StepDecision::Refused(StepError::Diverged {
            turn: 7,
            occurrence: 0,
            asked: "refund".into(),
            journaled: "search".into()
        })
    );
    assert_eq!(j.next_occurrence(), 0);
    // A name that cannot be part of a key.
    assert!(matches!(
        j.begin("a/b", StepPolicy::Retry),
        StepDecision::Refused(StepError::BadName(_))
    ));
}

#[test]
fn a_result_over_the_bound_is_refused_and_nothing_is_journaled() {
    let mut j = Journal::new("s", 1, 10);
    j.begin("a", StepPolicy::Retry);
    j.finish(0, "a", vec![0; 6]).unwrap();
    j.begin("b", StepPolicy::Retry);
    let e = j.finish(1, "b", vec![0; 5]).unwrap_err();
    assert_eq!(
        e,
        StepError::TooLarge {
            name: "b".into(),
            bytes: 5,
            total: 11,
            limit: 10
        }
    );
    assert_eq!(j.bytes(), 6);
    assert_eq!(j.entries().len(), 1);
    assert!(j.check().is_ok());
    assert_eq!(
        j.finish(5, "z", vec![]),
        Err(StepError::NotStarted { occurrence: 5 })
    );
    // A step a safe point's state covers is not journaled again.
    j.safe_point();
    assert_eq!(
        j.finish(0, "a", b"late".to_vec()),
        Err(StepError::NotStarted { occurrence: 0 })
    );
    assert_eq!(
        j.began(1, "b"),
        Err(StepError::NotStarted { occurrence: 1 })
    );
    assert!(j.check().is_ok());
}

#[test]
fn a_safe_point_covers_the_steps_before_it() {
    let mut j = Journal::new("s", 1, 100);
    j.begin("a", StepPolicy::Retry);
    j.finish(0, "a", b"x".to_vec()).unwrap();
    j.begin("b", StepPolicy::Retry);
    j.finish(1, "b", b"y".to_vec()).unwrap();
    assert_eq!(j.safe_point(), vec![0, 1], "the entries it drops");
    assert_eq!(j.covered(), 2);
    assert!(j.entries().is_empty());
    // Resumed from that state, numbering goes on at 2; older entries are dropped.
    let stale = vec![JournalEntry {
        occurrence: 1,
        name: "b".into(),
        result: Some(b"y".to_vec()),
    }];
    let mut r = Journal::resume("s", 1, 2, stale, 100);
    assert!(r.entries().is_empty());
    assert!(matches!(
        r.begin("c", StepPolicy::Retry),
        StepDecision::Run { key, .. } if key.occurrence == 2
    ));
}

/// Steps may overlap (parallel tool calls): a safe point covers only the steps before
/// the first one still running, so a resumed turn meets the running one again and
/// replays the finished ones after it.
#[test]
fn a_safe_point_does_not_cover_a_running_step() {
    let mut j = Journal::new("s", 1, 100);
    let a = j.begin("a", StepPolicy::Retry);
    let b = j.begin("b", StepPolicy::Retry);
    assert!(matches!(
        (&a, &b),
        (StepDecision::Run { .. }, StepDecision::Run { .. })
    ));
    j.finish(1, "b", b"y".to_vec()).unwrap();
    assert!(j.is_running());
    assert!(j.safe_point().is_empty());
    assert_eq!(j.covered(), 0, "step 0 still runs");
    assert_eq!(j.entries().len(), 1);
    // A crash now: the rerun runs a again (same key) and replays b.
    let mut r = Journal::resume("s", 1, j.covered(), j.entries().to_vec(), 100);
    assert!(
        matches!(r.begin("a", StepPolicy::Retry), StepDecision::Run { key, unknown: false, .. } if key.occurrence == 0)
    );
    assert!(
        matches!(r.begin("b", StepPolicy::Retry), StepDecision::Replay { result, .. } if result == b"y")
    );
    // Live: a finishes; the next safe point covers both.
    j.finish(0, "a", b"x".to_vec()).unwrap();
    assert!(!j.is_running());
    assert_eq!(j.safe_point(), vec![0, 1]);
    assert_eq!(j.covered(), 2);
    assert!(j.check().is_ok());
    // A step abandoned (its future dropped) no longer holds safe points back.
    let c = j.begin("c", StepPolicy::Retry);
    assert!(matches!(c, StepDecision::Run { .. }));
    j.abandon(2);
    j.safe_point();
    assert_eq!(j.covered(), 3);
}

/// One move of the simulated agent's program.
#[derive(Clone, Debug)]
enum Op {
    Step(&'static str, StepPolicy),
    SafePoint,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::sample::select(vec!["search", "charge", "mail"]), any::<bool>()).prop_map(
            |(n, no_retry)| Op::Step(
                n,
                if no_retry { StepPolicy::NoRetry } else { StepPolicy::Retry }
            )
        ),
        1 => Just(Op::SafePoint),
    ]
}

/// What is durable: where the program resumes (after its last safe point), the
/// state's covered count and the journal's entries (under `sync`, every entry the
/// journal returns is written before the step goes on).
#[derive(Default)]
struct Stored {
    resume_at: usize,
    covered: u32,
    entries: BTreeMap<u32, JournalEntry>,
}

proptest! {
    /// A turn's program run, killed after any number of moves, and run again from
    /// what was stored, until it completes: every finished step is replayed and never
    /// run again; a step runs again only when it was killed between running and its
    /// result being stored, and a `NoRetry` step never does; each run of a step has
    /// the same key; the journal's invariants hold after every move.
    #[test]
    fn crashes_never_run_a_finished_step_again(
        program in prop::collection::vec(op(), 1..12),
        kills in prop::collection::vec(1usize..20, 0..4),
    ) {
        let mut stored = Stored::default();
        let mut runs: BTreeMap<StepKey, u32> = BTreeMap::new();
        let mut finished: BTreeSet<StepKey> = BTreeSet::new();
        let mut kills = kills.into_iter();
        let mut moves = 0usize;
        let mut kill_at = kills.next();
        'attempt: loop {
            let mut j = Journal::resume(
                "s",
                3,
                stored.covered,
                stored.entries.values().cloned().collect(),
                1 << 20,
            );
            for (at, op) in program.iter().enumerate().skip(stored.resume_at) {
                moves += 1;
                if kill_at == Some(moves) {
                    kill_at = kills.next().map(|k| k + moves);
                    continue 'attempt;
                }
                match op {
                    Op::SafePoint => {
                        j.safe_point();
                        stored.covered = j.covered();
                        stored.resume_at = at + 1;
                        stored.entries.clear();
                    }
                    Op::Step(name, policy) => match j.begin(name, *policy) {
                        StepDecision::Run { key, unknown, journal_begin } => {
                            prop_assert!(!finished.contains(&key), "finished step {} ran again", key);
                            if unknown {
                                prop_assert_eq!(*policy, StepPolicy::Retry);
                            }
                            if journal_begin {
                                let e = j.began(key.occurrence, name).unwrap();
                                stored.entries.insert(e.occurrence, e);
                            }
                            *runs.entry(key.clone()).or_default() += 1;
                            // A kill between the effect and its result on record.
                            moves += 1;
                            if kill_at == Some(moves) {
                                kill_at = kills.next().map(|k| k + moves);
                                continue 'attempt;
                            }
                            let e = j
                                .finish(key.occurrence, name, key.to_string().into_bytes())
                                .unwrap();
                            stored.entries.insert(e.occurrence, e);
                            finished.insert(key);
                        }
                        StepDecision::Replay { key, result } => {
                            prop_assert_eq!(result, key.to_string().into_bytes());
                            prop_assert!(finished.contains(&key));
                        }
                        StepDecision::Unknown { key } => {
                            prop_assert_eq!(*policy, StepPolicy::NoRetry);
                            prop_assert!(!finished.contains(&key));
                            // The agent reconciles and records what it found.
                            let e = j
                                .finish(key.occurrence, name, key.to_string().into_bytes())
                                .unwrap();
                            stored.entries.insert(e.occurrence, e);
                            finished.insert(key);
                        }
                        StepDecision::Refused(e) => {
                            prop_assert!(false, "the same program diverged: {}", e);
                        }
                    },
                }
                prop_assert!(j.check().is_ok(), "{:?}", j.check());
            }
            break;
        }
        // Every step of the program finished, once each key.
        let steps = program.iter().filter(|o| matches!(o, Op::Step(..))).count();
        prop_assert_eq!(finished.len(), steps);
        for (key, n) in &runs {
            let policy = program
                .iter()
                .filter_map(|o| match o {
                    Op::Step(_, p) => Some(*p),
                    Op::SafePoint => None,
                })
                .nth(key.occurrence as usize)
                .unwrap();
            if policy == StepPolicy::NoRetry {
                prop_assert_eq!(*n, 1, "a NoRetry step ran twice: {}", key);
            }
        }
    }
}
