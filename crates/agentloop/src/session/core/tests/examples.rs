//! The core without a runtime, by example: a `sync` push's write, an unstorable item
//! handed back, an idle session's sleep (S39) and a turn's end answered by its write,
//! each driven through the harness of `mod.rs` one event at a time.

use super::*;

/// A `sync` push writes one item entry and the header, whatever waits (the cost of a
/// push does not depend on the backlog).
#[test]
fn a_sync_push_writes_one_entry_whatever_waits() {
    let mut h = Harness::new(true, Durability::Sync);
    h.push(false); // turn 0 plans item 0
    h.apply(Action::Plan {
        k: 1,
        r: 0,
        reverse: false,
    });
    for _ in 0..500 {
        h.push(false);
    }
    let before = h.results.len();
    let mut fx = Vec::new();
    h.core.handle(
        Event::Push {
            item: 9999,
            options: PushOptions::new(),
            reply: None,
        },
        Instant::now(),
        &mut fx,
    );
    assert_eq!(fx.len(), 1, "one store operation");
    match fx.pop() {
        Some(Effect::Store {
            op: StoreOp::Write(w),
            ..
        }) => {
            assert!(!w.replace);
            assert_eq!(w.items.len(), 1, "one entry");
            assert_eq!(w.header.cut.len(), 1, "the running turn's item");
            assert!(w.header.front.is_empty());
        }
        _ => panic!("expected a write"),
    }
    assert_eq!(h.results.len(), before);
}

/// S15a: a persistent session refuses an item that cannot be stored, hands it back
/// with the type and the reason, and acknowledges nothing.
#[test]
fn a_persistent_push_of_an_unstorable_item_is_handed_back() {
    struct Wide;
    impl Agent for Wide {
        type Item = WideItem;
        type Event = ();
        type State = u64;
        async fn run_turn(
            &self,
            _turn: Turn<Self>,
            _cx: TurnCx<Self>,
        ) -> Result<TurnOutcome<u64>, AgentError> {
            Ok(TurnOutcome::Completed)
        }
    }
    let shared = Arc::new(SessionShared::new("w".to_string()));
    let mut core: Core<Wide> = Core::new(
        CoreConfig {
            id: "w".into(),
            agent_kind: "wide".into(),
            agent_version: 1,
            agent_config: Vec::new(),
            persist: true,
            durability: Durability::Sync,
            owner: None,
            poll_interval: std::time::Duration::from_secs(1),
            supervised: false,
            history: 0,
            settings: Default::default(),
            buffer_bound: Default::default(),
            idle_after: None,
        },
        shared,
    );
    core.handle(Event::Start, Instant::now(), &mut Vec::new());
    let (tx, mut rx) = oneshot::channel();
    let mut fx = Vec::new();
    core.handle(
        Event::Push {
            item: WideItem::Big { n: 1 },
            options: PushOptions::new(),
            reply: Some(ractor::RpcReplyPort::from(tx)),
        },
        Instant::now(),
        &mut fx,
    );
    assert!(
        fx.iter()
            .all(|f| !matches!(f, Effect::Store { .. } | Effect::StartTurn { .. })),
        "nothing written, no turn"
    );
    for f in fx {
        if let Effect::AnswerPush { reply, result } = f {
            let _ = reply.send(result);
        }
    }
    match rx.try_recv().expect("answered") {
        Err(PushError::NotStorable { item, error }) => {
            assert_eq!(item, WideItem::Big { n: 1 });
            assert!(error.type_name.ends_with("WideItem"), "{error}");
            assert!(error.to_string().contains("u128"), "{error}");
        }
        other => panic!("expected NotStorable, got {other:?}"),
    }
    assert_eq!(core.counters.items_accepted, 0);
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind")]
enum WideItem {
    Big { n: u128 },
}

/// S39: an idle supervised session sleeps after its `idle_after`: a write marked asleep,
/// then (once durable, still idle) the sleep; nothing is held.
#[test]
fn an_idle_session_writes_its_record_asleep_then_sleeps() {
    let mut h = sleepy(Durability::Sync);
    h.event(Event::Stop {
        options: StopOptions::until_idle_for(std::time::Duration::from_secs(3600)),
        reply: None,
    }); // any event at an idle boundary arms the sleep timer
    assert!(
        h.timers
            .iter()
            .any(|t| matches!(t, crate::session::core::Timed::SleepDue { .. })),
        "the sleep timer is armed at the idle boundary"
    );
    let sleep_due = h
        .timers
        .iter()
        .position(|t| matches!(t, crate::session::core::Timed::SleepDue { .. }))
        .unwrap();
    let t = h.timers.remove(sleep_due).unwrap();
    h.event(Event::from(t));
    assert!(h.exit.is_none(), "not before its record is durable");
    let (seq, result) = h.written.pop_front().expect("the sleep write");
    assert!(h.core.sleep_write.is_some());
    h.event(Event::Written { seq, result });
    let (exit, _) = h.exit.as_ref().expect("asleep");
    assert_eq!(exit.reason, crate::exit::ExitReason::Asleep);
    match h.store.get_stored(ID) {
        Some(crate::store::Stored::Current(r)) => {
            assert!(r.header.asleep);
            assert_eq!(r.header.status, SessionStatus::Running);
        }
        other => panic!("{other:?}"),
    }
}

/// S39: a push accepted while the sleep write is in flight voids the sleep; the push's
/// own write clears the mark.
#[test]
fn a_push_during_the_sleep_write_keeps_the_session_awake() {
    let mut h = sleepy(Durability::Sync);
    h.event(Event::Stop {
        options: StopOptions::until_idle_for(std::time::Duration::from_secs(3600)),
        reply: None,
    });
    let i = h
        .timers
        .iter()
        .position(|t| matches!(t, crate::session::core::Timed::SleepDue { .. }))
        .unwrap();
    let t = h.timers.remove(i).unwrap();
    h.event(Event::from(t));
    h.push(false);
    while let Some((seq, result)) = h.written.pop_front() {
        h.event(Event::Written { seq, result });
    }
    assert!(h.exit.is_none(), "awake: a push came");
    match h.store.get_stored(ID) {
        Some(crate::store::Stored::Current(r)) => {
            assert!(!r.header.asleep, "the push's write clears the mark")
        }
        other => panic!("{other:?}"),
    }
}

/// S39: a session somebody listens to, or one started alone (nobody would wake it),
/// does not sleep.
#[test]
fn a_watched_or_unsupervised_session_does_not_sleep() {
    let mut h = sleepy(Durability::Sync);
    h.event(Event::Stop {
        options: StopOptions::until_idle_for(std::time::Duration::from_secs(3600)),
        reply: None,
    });
    let before = h.results.len();
    let epoch = h.core.idle_epoch;
    h.event(Event::SleepDue {
        epoch,
        watched: true,
    });
    assert_eq!(h.results.len(), before, "no sleep write while watched");
    assert!(h.exit.is_none());
    assert!(
        h.timers
            .iter()
            .filter(|t| matches!(t, crate::session::core::Timed::SleepDue { .. }))
            .count()
            >= 2,
        "looked at again after another period"
    );
    let mut alone = Harness::new(true, Durability::Sync);
    alone.core.config.idle_after = Some(std::time::Duration::from_secs(1));
    alone.event(Event::Stop {
        options: StopOptions::until_idle_for(std::time::Duration::from_secs(3600)),
        reply: None,
    });
    assert!(!alone
        .timers
        .iter()
        .any(|t| matches!(t, crate::session::core::Timed::SleepDue { .. })));
}

/// S16b, issue 54: under `sync` and `turn`, the write that records a turn's end answers
/// the turn's waiter from its completion, as it answers a durable step's (S1b): the
/// turn task learns its end is durable without waiting for the session to take the
/// write's result (`Written`) from its mailbox, and the session sends no `TurnDurable`
/// of its own for it.
#[test]
fn the_write_of_a_turn_end_answers_the_turn_itself() {
    for durability in [Durability::Sync, Durability::Turn] {
        let mut h = Harness::new(true, durability);
        h.push(false);
        h.apply(Action::Plan {
            k: 1,
            r: 0,
            reverse: false,
        });
        let mut durable_end = h
            .turn
            .as_ref()
            .and_then(|t| t.control.take_durable_end())
            .expect("a turn whose end is written waits for that write");
        h.apply(Action::Finish(0));
        // The harness performs each write at once and answers its waiters, but feeds
        // no `Written` to the core until `Action::Written`.
        assert_eq!(
            durable_end.try_recv(),
            Ok(true),
            "{durability:?}: the turn's end is answered by its write's completion"
        );
        while !h.written.is_empty() {
            h.apply(Action::Written);
        }
        assert!(
            h.durable_ends.is_empty(),
            "{durability:?}: the session answers no turn end itself: {:?}",
            h.durable_ends
        );
        assert_eq!(
            h.delivered,
            vec![0],
            "{durability:?}: the turn delivered its item"
        );
    }
}
