//! S20a (issue 33): events kept in the store, through real sessions on a store (the
//! memory store and sled). A subscriber after `n` gets what the replay buffer no longer
//! holds from the store; a next incarnation numbers after everything kept or reserved;
//! retention trims by count. The process-level tests (SIGTERM, SIGKILL, a real HTTP
//! client) are `s20a_restarts.rs`.

use std::sync::Arc;

use agentloop::event_log::Retention;
use agentloop::{
    events::EventCodec, events::Sequenced, CheckpointStore, EventFilter, EventStream, MemoryStore,
    SessionEvent, SessionHandle, SessionSpec, StopOptions,
};
use agentloop_sim::{Notice, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

async fn collect(mut events: EventStream<SimEvent>) -> Vec<Sequenced<SimEvent>> {
    within("the event stream to end", async move {
        let mut v = Vec::new();
        while let Some(e) = events.next_sequenced().await {
            v.push(e);
        }
        v
    })
    .await
}

/// The events of a stream up to (not including) `Ended`, or until it has `n`.
async fn take(events: &mut EventStream<SimEvent>, n: usize) -> Vec<Sequenced<SimEvent>> {
    within("events", async move {
        let mut v = Vec::new();
        while v.len() < n {
            match events.next_sequenced().await {
                Some(e) => v.push(e),
                None => break,
            }
        }
        v
    })
    .await
}

fn spec(id: &str, count: u64) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .keep_events(Retention {
            count,
            max_age_ms: None,
        })
        .event_codec(EventCodec::<SimEvent>::json())
}

fn lagged(evs: &[Sequenced<SimEvent>]) -> Vec<(u64, u64)> {
    evs.iter()
        .filter_map(|e| match e.event {
            SessionEvent::Lagged { missed } => Some((e.seq, missed)),
            _ => None,
        })
        .collect()
}

/// S20a: with no replay buffer at all, a subscriber after 0 gets every event the
/// session gave, from the store (and the keeper, for what is not written yet), in
/// order, each once, without `Lagged`; then the live ones.
#[tokio::test(start_paused = true)]
async fn a_subscriber_after_n_gets_what_memory_no_longer_holds_from_the_store() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut probe) = probe();
    let h = SessionHandle::spawn(
        spec("kept", 1_000).replay(0),
        Arc::new(SimAgent::new(steps(3)).with_probe(tx)),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    let live = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe
        .until("turn 0 done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    h.push(item(2)).await.unwrap();
    probe
        .until("turn 1 done", |n| matches!(n, Notice::TurnDone { turn: 1 }))
        .await;
    let mut late = h.subscribe_after(0, 64, EventFilter::all());
    let mut mid = h.subscribe_after(3, 64, EventFilter::all());
    h.stop(StopOptions::bare().cause("done")).await.unwrap();
    within("exit", h.wait()).await;
    let live = collect(live).await;
    let n = live.len();
    assert!(n > 8, "two turns of three steps: {live:?}");
    let late = take(&mut late, n + 1).await;
    assert_eq!(
        late, live,
        "the late subscriber sees exactly what the live one saw"
    );
    let mid = take(&mut mid, n + 1).await;
    assert_eq!(mid.as_slice(), &live[3..], "after 3: the rest, in order");
    assert!(lagged(&late).is_empty());
    // Kept in the store with their numbers.
    let kept = store
        .read_events("kept", 0, usize::MAX)
        .await
        .expect("read");
    assert_eq!(
        kept.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        live.iter().map(|e| e.seq).collect::<Vec<_>>(),
        "every event kept, Ended too"
    );
}

/// S20a: the next incarnation numbers after everything the previous one kept or
/// reserved, and a subscriber after the previous incarnation's numbers gets its kept
/// events (not its `Ended`: history, not news) and then the new ones; after a stop,
/// the previous `Ended` is kept with the number the mark was lowered to, so no number
/// in between is missing.
#[tokio::test(start_paused = true)]
async fn the_next_incarnation_continues_after_the_kept_events_without_a_gap() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let dyn_store = store.clone() as Arc<dyn CheckpointStore<SimItem>>;
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = probe();
    let h = SessionHandle::spawn(
        spec("again", 1_000).replay(4),
        Arc::new(
            SimAgent::new(steps(2))
                .with_probe(tx)
                .with_step_gate(gate.clone()),
        ),
        Some(dyn_store.clone()),
    )
    .await
    .expect("spawn");
    let first = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    // Item 2 stays in the record: the stop leaves something to resume.
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    within("exit", h.wait()).await;
    let first = collect(first).await;
    let ended = first.last().expect("Ended").seq;
    let kept = store.read_events("again", 0, usize::MAX).await.unwrap();
    assert_eq!(
        kept.reserved, ended,
        "the last append lowers the mark to Ended's number"
    );

    let (tx, _probe2) = agentloop_tests::probe();
    let h2 = SessionHandle::spawn(
        spec("again", 1_000).replay(4),
        Arc::new(SimAgent::new(steps(2)).with_probe(tx)),
        Some(dyn_store.clone()),
    )
    .await
    .expect("respawn");
    let mut after = h2.subscribe_after(0, 256, EventFilter::all());
    h2.stop(StopOptions::bare()).await.unwrap();
    within("exit", h2.wait()).await;
    let all = take(&mut after, 1_000).await;
    assert!(lagged(&all).is_empty(), "no gap after a stop: {all:?}");
    let numbers: Vec<u64> = all.iter().map(|e| e.seq).collect();
    let mut sorted = numbers.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(numbers, sorted, "in order, each once");
    assert_eq!(
        numbers.iter().filter(|s| **s <= ended).count(),
        first.len() - 1,
        "every event of the first incarnation but its Ended"
    );
    assert_eq!(
        numbers.iter().find(|s| **s > ended).copied(),
        Some(ended + 1),
        "the next incarnation's first number follows the kept Ended"
    );
}

/// S20a: retention by count, trimmed as part of the session's appends; a subscriber
/// after a number no longer kept is told exactly how many it missed.
#[tokio::test(start_paused = true)]
async fn retention_trims_and_a_subscriber_behind_it_is_told_what_it_missed() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut probe) = probe();
    let h = SessionHandle::spawn(
        spec("trim", 5).replay(0),
        Arc::new(SimAgent::new(steps(3)).with_probe(tx)),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    for turn in 0..40u64 {
        h.push(item(turn + 1)).await.unwrap();
        probe
            .until(
                "turn done",
                |n| matches!(n, Notice::TurnDone { turn: t } if *t == turn),
            )
            .await;
    }
    let kept = store.read_events("trim", 0, usize::MAX).await.unwrap();
    assert!(
        kept.events.len() < 5 + 40,
        "trimmed: {} kept",
        kept.events.len()
    );
    let first_kept = kept.events.first().expect("some kept").seq;
    let mut s = h.subscribe_after(0, 64, EventFilter::all());
    let first = take(&mut s, 1).await;
    assert_eq!(
        lagged(&first),
        vec![(first_kept - 1, first_kept - 1)],
        "everything before the first kept event is missed, counted exactly"
    );
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
}

/// A session that asks to keep events without what it takes is refused at spawn with
/// what to do.
#[tokio::test]
async fn keeping_events_without_a_codec_or_a_store_is_refused() {
    let store = Arc::new(MemoryStore::<SimItem>::new()) as Arc<dyn CheckpointStore<SimItem>>;
    let no_codec = SessionSpec::new("x", "default")
        .persistent(true)
        .keep_events(Retention::default());
    let e = SessionHandle::<SimItem, SimEvent>::spawn(
        no_codec,
        Arc::new(SimAgent::new(steps(1))),
        Some(store),
    )
    .await
    .expect_err("refused");
    assert!(e.to_string().contains("keep_events()"), "{e}");
    let e = SessionHandle::<SimItem, SimEvent>::spawn(
        spec("y", 10).persistent(false),
        Arc::new(SimAgent::new(steps(1))),
        None,
    )
    .await
    .expect_err("refused");
    assert!(e.to_string().contains("persistent"), "{e}");
}

/// S20a: a live subscriber that falls behind catches up from the store while its
/// events are kept (the replay buffer holds only 4): every event, in order, no
/// `Lagged`; with a retention of 5 it is told exactly what it missed.
#[tokio::test(start_paused = true)]
async fn a_slow_subscriber_catches_up_from_the_store_within_the_retention() {
    for (count, lags) in [(1_000u64, false), (5, true)] {
        let store = Arc::new(MemoryStore::<SimItem>::new());
        let (tx, mut probe) = probe();
        let h = SessionHandle::spawn(
            spec(&format!("slow-{count}"), count).replay(4),
            Arc::new(SimAgent::new(steps(3)).with_probe(tx)),
            Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
        )
        .await
        .expect("spawn");
        let live = h.subscribe();
        let slow = h.subscribe_with_capacity(2);
        for turn in 0..10u64 {
            h.push(item(turn + 1)).await.unwrap();
            probe
                .until(
                    "turn done",
                    |n| matches!(n, Notice::TurnDone { turn: t } if *t == turn),
                )
                .await;
        }
        h.stop(StopOptions::bare()).await.unwrap();
        within("exit", h.wait()).await;
        let all = collect(live).await;
        let slow = collect(slow).await;
        assert!(all.len() > 40, "{}", all.len());
        if !lags {
            assert_eq!(
                slow, all,
                "caught up from the store: every event, each once"
            );
            continue;
        }
        let missed: u64 = lagged(&slow).iter().map(|(_, m)| m).sum();
        assert!(missed > 0, "behind the retention: {slow:?}");
        let mut next = 1;
        for e in &slow {
            match e.event {
                SessionEvent::Lagged { missed } => {
                    assert_eq!(e.seq, next + missed - 1, "exactly the missing numbers")
                }
                _ => {
                    assert_eq!(e.seq, next, "in order, no silent gap");
                    assert_eq!(Some(e), all.iter().find(|a| a.seq == e.seq));
                }
            }
            next = e.seq + 1;
        }
    }
}

/// S20a: retention by age, on the store's clock: what is older than the age is trimmed
/// by a later append.
#[tokio::test]
async fn retention_by_age_trims_what_is_older() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut probe) = probe();
    let h = SessionHandle::spawn(
        SessionSpec::new("aged", "default")
            .persistent(true)
            .kind("sim")
            .keep_events(Retention {
                count: 1_000,
                max_age_ms: Some(40),
            })
            .event_codec(EventCodec::<SimEvent>::json()),
        Arc::new(SimAgent::new(steps(2)).with_probe(tx)),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    let live = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe
        .until("turn 0 done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    let first = store.read_events("aged", 0, usize::MAX).await.unwrap();
    assert!(!first.events.is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    h.push(item(2)).await.unwrap();
    probe
        .until("turn 1 done", |n| matches!(n, Notice::TurnDone { turn: 1 }))
        .await;
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    let all = collect(live).await;
    let turn_1_started = all
        .iter()
        .find(|e| matches!(e.event, SessionEvent::TurnStarted { .. }) && e.seq > 1)
        .expect("turn 1")
        .seq;
    let kept = store.read_events("aged", 0, usize::MAX).await.unwrap();
    assert!(
        kept.events.iter().all(|e| e.seq >= turn_1_started - 1),
        "turn 0's events are older than 40 ms and trimmed: {:?}",
        kept.events.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    assert!(kept.events.iter().any(|e| e.seq > turn_1_started));
}

/// The keeper's slack for the events the actor numbers without waiting, and the
/// fewest numbers it reserves ahead (`events/keeper/mod.rs` `SLACK`, `MIN_BLOCK`: twice the
/// slack and room for a few events).
const SLACK: u64 = 64;
const MIN_BLOCK: u64 = 2 * SLACK + 32;

/// S20a (2026-11-28, issue 53 point 3): after a crash the next incarnation numbers after
/// the killed one's reserved mark, and a subscriber after the last number it saw gets
/// the kept events, then one `Lagged` for the numbers between the last kept event and
/// the mark, which says it is an upper bound (some of them were reserved and never
/// given) and counts no more than the killed incarnation reserved ahead at its pace
/// (a few events a turn: [`MIN_BLOCK`]), not a 1024-number block. The crash is the
/// store as it was mid-life, copied into a new store, on which the session is spawned
/// again (what a SIGKILL leaves); the memory store writes every event at once, so
/// every number in the gap was reserved and never given.
#[tokio::test(start_paused = true)]
async fn a_lagged_across_a_crash_is_an_upper_bound_near_what_could_be_lost() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut probe) = probe();
    let h = SessionHandle::spawn(
        spec("crash", 1_000).replay(4),
        Arc::new(SimAgent::new(steps(2)).with_probe(tx)),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    let mut live = h.subscribe();
    for turn in 0..3u64 {
        h.push(item(turn + 1)).await.unwrap();
        probe
            .until(
                "turn done",
                |n| matches!(n, Notice::TurnDone { turn: t } if *t == turn),
            )
            .await;
    }
    let kept = store.read_events("crash", 0, usize::MAX).await.unwrap();
    let last_kept = kept.last;
    assert!(
        kept.reserved > last_kept && kept.reserved <= last_kept + MIN_BLOCK,
        "reserved ahead at the pace of a few events a turn: {} after {last_kept}",
        kept.reserved
    );
    // The client saw the first turn's events.
    let seen = take(&mut live, 3).await;
    let last_seen = seen.last().expect("events").seq;
    // The crash: the store as it is now, alive again without the process.
    let copy = Arc::new(MemoryStore::<SimItem>::new());
    for (k, v) in store.raw_entries() {
        copy.put_raw(&k, &v);
    }
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;

    let (tx, _probe2) = agentloop_tests::probe();
    let h2 = SessionHandle::spawn(
        spec("crash", 1_000).replay(4),
        Arc::new(SimAgent::new(steps(2)).with_probe(tx)),
        Some(copy.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("respawn after the crash");
    let mut after = h2.subscribe_after(last_seen, 256, EventFilter::all());
    h2.push(item(10)).await.unwrap();
    let mut got = Vec::new();
    let mut bound = None;
    while let Some(e) = within("events", after.next_sequenced()).await {
        if let SessionEvent::Lagged { .. } = e.event {
            bound = Some(after.lagged_upper_bound());
        }
        let past = e.seq > kept.reserved;
        got.push(e);
        if past {
            break;
        }
    }
    h2.stop(StopOptions::bare()).await.unwrap();
    within("exit", h2.wait()).await;
    let kept_events: Vec<u64> = kept
        .events
        .iter()
        .map(|e| e.seq)
        .filter(|s| *s > last_seen)
        .collect();
    assert_eq!(
        got.iter()
            .map(|e| e.seq)
            .take(kept_events.len())
            .collect::<Vec<_>>(),
        kept_events,
        "the kept events after the last one seen come first: {got:?}"
    );
    assert_eq!(
        lagged(&got),
        vec![(kept.reserved, kept.reserved - last_kept)],
        "one Lagged for the numbers between the last kept event and the mark: {got:?}"
    );
    assert_eq!(
        bound,
        Some(true),
        "the Lagged says its count is an upper bound"
    );
    assert!(
        kept.reserved - last_kept <= MIN_BLOCK,
        "and counts no more than was reserved ahead at this pace"
    );
    assert_eq!(
        got.last().map(|e| e.seq),
        Some(kept.reserved + 1),
        "the next incarnation numbers right after the mark: {got:?}"
    );
    // A later subscriber from 0 (a replay of the store from its start) reports the
    // same gap the same way: the crash note is kept.
    let copy2 = Arc::new(MemoryStore::<SimItem>::new());
    for (k, v) in copy.raw_entries() {
        copy2.put_raw(&k, &v);
    }
    let (tx, _probe3) = agentloop_tests::probe();
    let h3 = SessionHandle::spawn(
        spec("crash", 1_000).replay(4),
        Arc::new(SimAgent::new(steps(2)).with_probe(tx)),
        Some(copy2 as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("respawn");
    let mut from_zero = h3.subscribe_after(0, 1024, EventFilter::all());
    h3.stop(StopOptions::bare()).await.unwrap();
    within("exit", h3.wait()).await;
    let mut lags = Vec::new();
    while let Some(e) = within("events", from_zero.next_sequenced()).await {
        if let SessionEvent::Lagged { missed } = e.event {
            lags.push((e.seq, missed, from_zero.lagged_upper_bound()));
        }
    }
    assert_eq!(
        lags,
        vec![(kept.reserved, kept.reserved - last_kept, true)],
        "the gap a crash left is an upper bound in every later replay"
    );
}
