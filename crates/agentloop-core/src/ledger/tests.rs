//! Table tests: phase × event → placement and entry changes.
use super::*;

fn enc(v: &String) -> Result<Vec<u8>, PayloadError> {
    crate::codec::payload::encode_checked(v)
}

fn persistent() -> Ledger<String> {
    Ledger::new(true)
}

fn push(l: &mut Ledger<String>, v: &str) -> (Seq, Vec<ItemChange>) {
    let b: Payload = enc(&v.to_string()).unwrap().into();
    l.accept(v.to_string(), Some(b))
}

fn entries(changes: &[ItemChange]) -> Vec<(char, Seq)> {
    changes
        .iter()
        .map(|c| match c {
            ItemChange::Put(s, _) => ('+', *s),
            ItemChange::Delete(s) => ('-', *s),
        })
        .collect()
}

fn plan(l: &mut Ledger<String>, index: u64, f: impl Fn(PlanInput<String>) -> Plan<String>) {
    let Offer::Plan { input, bytes } = l.offer(index) else {
        panic!("expected a plan offer");
    };
    let split = split_plan(input.len(), bytes.as_deref(), f(input), enc).unwrap();
    l.decide(split);
    l.check().unwrap();
}

fn place(l: &Ledger<String>) -> (Vec<Seq>, Vec<Seq>) {
    let p = l.placement();
    (p.interrupted, p.unhandled)
}

#[test]
fn idle_push_puts_one_entry_whatever_waits() {
    let mut l = persistent();
    for i in 0..1000 {
        let (seq, ch) = push(&mut l, &format!("m{i}"));
        assert_eq!(entries(&ch), vec![('+', seq)], "one entry per push");
    }
    assert_eq!(place(&l).1.len(), 1000);
    assert!(l.header_front().is_empty(), "push order is key order");
    l.check().unwrap();
}

#[test]
fn planning_then_running_then_completed() {
    let mut l = persistent();
    push(&mut l, "a");
    push(&mut l, "b");
    let Offer::Plan { input, .. } = l.offer(0) else {
        panic!()
    };
    assert_eq!(input.buffered, vec!["a".to_string(), "b".to_string()]);
    // Planning: everything offered is still unhandled (a crash re-plans it).
    assert_eq!(place(&l), (vec![], vec![0, 1]));
    push(&mut l, "c"); // arrives while planning
    assert_eq!(place(&l), (vec![], vec![0, 1, 2]));
    let split = PlanSplit {
        consumed: vec![Planned {
            pos: 0,
            item: "a".into(),
            rewritten: None,
        }],
        remaining: vec![Planned {
            pos: 1,
            item: "b".into(),
            rewritten: None,
        }],
        dropped: vec![],
    };
    assert!(
        l.decide(split).1.is_empty(),
        "a plan that keeps its items writes none"
    );
    // Running: the consumed item is the cut turn of a live record.
    assert_eq!(place(&l), (vec![0], vec![1, 2]));
    let (delivered, ch) = l.end_turn(TurnFate::Completed);
    assert_eq!((delivered, entries(&ch)), (1, vec![('-', 0)]));
    assert_eq!(place(&l), (vec![], vec![1, 2]));
    l.check().unwrap();
}

#[test]
fn preempted_items_go_first_and_the_header_says_so() {
    let mut l = persistent();
    for v in ["a", "b", "c"] {
        push(&mut l, v);
    }
    // A plan consumes b and a (in that order), hands c back.
    plan(&mut l, 0, |input| {
        let mut it = input.into_items();
        let c = it.pop().unwrap();
        it.reverse();
        Plan {
            consumed: it,
            remaining: vec![c],
        }
    });
    assert_eq!(place(&l), (vec![1, 0], vec![2]));
    push(&mut l, "d");
    assert_eq!(
        l.end_turn(TurnFate::Preempted).1.len(),
        0,
        "a preemption writes no entry"
    );
    // Offered next: the preempted turn's items (in its order), then c, then d.
    assert_eq!(place(&l), (vec![], vec![1, 0, 2, 3]));
    assert_eq!(
        l.header_front(),
        vec![1],
        "only the out-of-order prefix is listed"
    );
    let Offer::Plan { input, .. } = l.offer(1) else {
        panic!()
    };
    assert_eq!(input.preempted, vec!["b".to_string(), "a".to_string()]);
    assert_eq!(input.buffered, vec!["c".to_string(), "d".to_string()]);
    l.check().unwrap();
}

#[test]
fn drops_and_rewrites_change_entries() {
    let mut l = persistent();
    for v in ["keep", "spam", "edit"] {
        push(&mut l, v);
    }
    let Offer::Plan { input, bytes } = l.offer(0) else {
        panic!()
    };
    let offered = input.len();
    let items = input.into_items();
    let p = Plan {
        consumed: vec![items[0].clone(), "edited".to_string()],
        remaining: vec![],
    };
    let split = split_plan(offered, bytes.as_deref(), p, enc).unwrap();
    // The changed value cannot be told apart from the one it replaced: it takes the
    // first entry left over in offer order (1), whose bytes it rewrites, and the
    // entry still left over (2) is the one dropped. Values and counts are exact.
    assert_eq!(split.dropped, vec![2]);
    let (dropped, ch) = l.decide(split);
    assert_eq!(dropped, 1);
    assert_eq!(entries(&ch), vec![('+', 1), ('-', 2)]);
    assert_eq!(place(&l), (vec![0, 1], vec![]));
    assert_eq!(
        l.values(&[0, 1]),
        vec!["keep".to_string(), "edited".to_string()]
    );
    l.check().unwrap();
}

#[test]
fn an_aborted_plan_restores_the_original_order() {
    let mut l = persistent();
    for v in ["a", "b", "c"] {
        push(&mut l, v);
    }
    plan(&mut l, 0, |input| Plan {
        consumed: input.into_items(),
        remaining: vec![],
    });
    l.end_turn(TurnFate::Preempted); // a, b, c preempted
    push(&mut l, "d");
    let _ = l.offer(1);
    push(&mut l, "e"); // arrives while planning
    l.turn_not_run();
    assert_eq!(place(&l), (vec![], vec![0, 1, 2, 3, 4]));
    let Offer::Plan { input, .. } = l.offer(2) else {
        panic!()
    };
    assert_eq!(
        input.preempted.len(),
        3,
        "preempted items stay preempted (S6)"
    );
    l.check().unwrap();
}

#[test]
fn a_cut_turn_and_its_resume() {
    let mut l = persistent();
    for v in ["a", "b"] {
        push(&mut l, v);
    }
    plan(&mut l, 4, |input| {
        let mut it = input.into_items();
        let b = it.pop().unwrap();
        Plan {
            consumed: it,
            remaining: vec![b],
        }
    });
    l.end_turn(TurnFate::Cut);
    assert_eq!(
        l.cut(),
        Some(&Cut {
            index: 4,
            items: vec![0]
        })
    );
    assert_eq!(place(&l), (vec![0], vec![1]));
    // The next turn is the resume: no plan, the cut's items.
    let Offer::Resume { items } = l.offer(4) else {
        panic!("a resume")
    };
    assert_eq!(items, vec!["a".to_string()]);
    assert_eq!(place(&l), (vec![0], vec![1]), "a resume turn holds the cut");
    l.turn_not_run(); // a stop before it ran: the cut again
    assert_eq!(
        l.cut(),
        Some(&Cut {
            index: 4,
            items: vec![0]
        })
    );
    l.check().unwrap();
}

#[test]
fn a_loaded_record_seeds_places_and_numbering() {
    let header = crate::header::RecordHeader {
        session_id: "s".into(),
        turn_index: 7,
        next_seq: 20,
        cut: vec![12],
        front: vec![15, 11],
        ..Default::default()
    };
    let item = |seq: u64| crate::record::LoadedItem {
        seq,
        item: format!("i{seq}"),
        bytes: Payload::from(enc(&format!("i{seq}")).unwrap()),
    };
    let mut rec = LoadedRecord {
        header,
        interrupted: vec![item(12)],
        unhandled: vec![item(15), item(11), item(13)],
        state: None,
        journal: None,
        format1: false,
    };
    let mut l = persistent();
    assert_eq!(l.seed(&mut rec), Some(7));
    assert_eq!(place(&l), (vec![12], vec![15, 11, 13]));
    assert_eq!(l.header_front(), vec![15], "11, 13 ascend after it");
    let (seq, _) = push(&mut l, "new");
    assert_eq!(seq, 20, "numbering continues above the record's");
    l.check().unwrap();
}

#[test]
fn without_a_store_nothing_is_encoded_and_no_entry_changes() {
    let mut l: Ledger<String> = Ledger::new(false);
    let (_, ch) = l.accept("a".into(), None);
    assert!(ch.is_empty());
    l.accept("b".into(), None);
    let Offer::Plan { input, bytes } = l.offer(0) else {
        panic!()
    };
    assert!(bytes.is_none());
    let split = split_plan(
        input.len(),
        None,
        Plan {
            consumed: vec![input.buffered[1].clone()],
            remaining: vec![],
        },
        |_| unreachable!("nothing is encoded without a store"),
    )
    .unwrap();
    assert_eq!(split.dropped, vec![1]);
    assert!(l.decide(split).1.is_empty());
    assert_eq!(l.end_turn(TurnFate::Completed), (1, vec![]));
    l.check().unwrap();
}

#[test]
fn a_plan_returning_too_much_or_unstorable_fails() {
    let e = split_plan(
        1,
        None,
        Plan {
            consumed: vec![1, 2],
            remaining: vec![],
        },
        |_: &u32| Ok(vec![]),
    )
    .unwrap_err();
    assert!(e.contains("offered 1"), "{e}");
    let e = split_plan(
        1,
        Some(&[Payload::from(vec![0u8])]),
        Plan {
            consumed: vec![5u32],
            remaining: vec![],
        },
        |_| {
            Err(PayloadError {
                type_name: "u32",
                path: String::new(),
                stage: crate::codec::PayloadStage::Encode,
                reason: "refused".into(),
            })
        },
    )
    .unwrap_err();
    assert!(
        e.contains("cannot be stored") && e.contains("refused"),
        "{e}"
    );
}
