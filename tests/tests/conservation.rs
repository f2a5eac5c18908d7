//! S10 conservation as a property: random schedules of push / preempt (every safe-point
//! kind, with and without timeout and delay) / stop (every option) / agent faults
//! against the simulated agent; every accepted item ends in exactly one place.
//!
//! `PROPTEST_CASES` sets the number of cases (256 by default here).

use std::time::Duration;

use agentloop::{Preempt, PushError, PushOptions, SafePoint, StopOptions};
use agentloop_sim::{Fault, PlanPolicy, Script, SimAgent, SimStep};
use agentloop_tests::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Push,
    Preempt {
        at: u8,
        timeout_ms: Option<u64>,
        delay_ms: Option<u64>,
    },
    Stop(StopKind),
    Wait(u64),
}

#[derive(Clone, Debug)]
enum StopKind {
    Bare,
    Graceful,
    GracefulTimeout(u64),
    Immediate,
    Drain,
    Idle(u64),
    Skip,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => Just(Op::Push),
        2 => (1u8..=3, proptest::option::of(1u64..50), proptest::option::of(1u64..50))
            .prop_map(|(at, timeout_ms, delay_ms)| Op::Preempt { at, timeout_ms, delay_ms }),
        1 => prop_oneof![
            Just(StopKind::Bare),
            Just(StopKind::Graceful),
            (1u64..40).prop_map(StopKind::GracefulTimeout),
            Just(StopKind::Immediate),
            Just(StopKind::Drain),
            (1u64..40).prop_map(StopKind::Idle),
            Just(StopKind::Skip),
        ].prop_map(Op::Stop),
        3 => (0u64..30).prop_map(Op::Wait),
    ]
}

#[derive(Clone, Debug)]
struct Schedule {
    ops: Vec<Op>,
    plan_limit: Option<usize>,
    drop_every: bool,
    fault: Option<(u64, usize, u8)>,
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (
        proptest::collection::vec(op(), 1..40),
        proptest::option::of(1usize..4),
        any::<bool>(),
        proptest::option::of((0u64..6, 0usize..4, 0u8..3)),
    )
        .prop_map(|(ops, plan_limit, drop_every, fault)| Schedule {
            ops,
            plan_limit,
            drop_every,
            fault,
        })
}

/// Time unit of a schedule: milliseconds on the paused clock, microseconds on real
/// threads (so the multi-thread run stays fast).
fn script(unit: fn(u64) -> Duration) -> Script {
    Script {
        steps: (0..4)
            .map(|i| {
                if i % 2 == 0 {
                    SimStep::ModelCall {
                        latency: unit(7),
                        input_tokens: 10,
                    }
                } else {
                    SimStep::ToolRound {
                        latency: unit(5),
                        calls: 1,
                    }
                }
            })
            .collect(),
    }
}

async fn run(s: Schedule, unit: fn(u64) -> Duration) -> Result<(), String> {
    let mut agent = SimAgent::new(script(unit)).with_plan(PlanPolicy {
        limit: s.plan_limit,
        drop_prefix: s.drop_every.then(|| "drop".to_string()),
        ..Default::default()
    });
    if let Some((turn, step, f)) = s.fault {
        let fault = match f {
            0 => Fault::Fail,
            1 => Fault::Panic,
            _ => Fault::Interrupt,
        };
        agent = agent.with_fault(Some(turn), step, fault, true);
    }
    let ledger = agent.ledger();
    let h = spawn("conservation", agent).await;
    let mut accepted = Vec::new();
    let mut rejected = Vec::new();
    let mut next = 0u64;
    let mut acks = Vec::new();
    for op in s.ops {
        match op {
            Op::Push | Op::Preempt { .. } => {
                next += 1;
                let text = if s.drop_every && next.is_multiple_of(3) {
                    "drop"
                } else {
                    "keep"
                };
                let it = agentloop_sim::SimItem::new(next, format!("{text}-{next}"));
                let opts = match op {
                    Op::Preempt {
                        at,
                        timeout_ms,
                        delay_ms,
                    } => {
                        let mut p = Preempt::at(SafePoint::from_bits(at));
                        if let Some(t) = timeout_ms {
                            p = p.timeout(unit(t));
                        }
                        if let Some(d) = delay_ms {
                            p = p.delay(unit(d));
                        }
                        PushOptions::preempt(p)
                    }
                    _ => PushOptions::new(),
                };
                // Delayed preempts resolve later: run them concurrently.
                let h2 = h.clone();
                acks.push((
                    next,
                    tokio::spawn(async move { h2.push(it).options(opts).await }),
                ));
            }
            Op::Stop(k) => {
                let opts = match k {
                    StopKind::Bare => StopOptions::bare(),
                    StopKind::Graceful => StopOptions::graceful(),
                    StopKind::GracefulTimeout(ms) => StopOptions::graceful_timeout(unit(ms)),
                    StopKind::Immediate => StopOptions::immediate(),
                    StopKind::Drain => StopOptions::drain(),
                    StopKind::Idle(ms) => StopOptions::until_idle_for(unit(ms)),
                    StopKind::Skip => StopOptions::bare().skip_checkpoint(),
                };
                h.stop(opts).await.map_err(|e| e.to_string())?;
            }
            Op::Wait(ms) => tokio::time::sleep(unit(ms)).await,
        }
    }
    h.stop(StopOptions::bare())
        .await
        .map_err(|e| e.to_string())?;
    let exit = within("exit", h.wait()).await;
    for (id, ack) in acks {
        match ack.await.map_err(|e| e.to_string())? {
            Ok(_) => accepted.push(id),
            Err(PushError::Late { item }) => {
                if item.id != id {
                    return Err(format!("late error handed back {} for {id}", item.id));
                }
                rejected.push(id)
            }
            Err(e) => return Err(format!("unexpected push error: {e}")),
        }
    }
    let ledger = ledger.lock().clone();
    // Late items recorded after the exit are in the handle's list, not the snapshot.
    let mut all_late = ids(&h.take_late_items());
    all_late.sort();
    let mut rej = rejected.clone();
    rej.sort();
    if all_late != rej {
        return Err(format!("late list {all_late:?} != rejected pushes {rej:?}"));
    }
    if exit.counters.items_accepted != accepted.len() as u64 {
        return Err(format!(
            "counted {} accepted, callers saw {}",
            exit.counters.items_accepted,
            accepted.len()
        ));
    }
    if exit.counters.items_delivered != ledger.delivered_ids().len() as u64 {
        return Err("delivered counter disagrees with the agent's ledger".into());
    }
    check_conservation(
        &accepted,
        &rejected,
        &exit,
        &ledger.delivered_ids(),
        &ledger.dropped,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    /// S10: every item handed to push ends in exactly one place.
    #[test]
    fn s10_conservation_over_random_schedules(s in schedule()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let r = rt.block_on(run(s, Duration::from_millis));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(64, |c| c / 4),
        ..ProptestConfig::default()
    })]

    /// S10 on real threads: the actor and its turn tasks race for real (multi-thread
    /// runtime, real clock, durations in microseconds).
    #[test]
    fn s10_conservation_on_a_multi_thread_runtime(s in schedule()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let r = rt.block_on(run(s, Duration::from_micros));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}
