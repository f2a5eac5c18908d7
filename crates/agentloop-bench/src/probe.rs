//! TEMPORARY investigation probe (to be removed).
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{SessionConfig, SessionEvent, SessionHandle};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};

use crate::report::median;

const N: u64 = 20_000;
const R: usize = 9;

enum Msg {
    Push(u64, Option<RpcReplyPort<()>>, u8),
    Done(u64),
}
struct A;
impl Actor for A {
    type Msg = Msg;
    type State = mpsc::Sender<u64>;
    type Arguments = mpsc::Sender<u64>;
    async fn pre_start(
        &self,
        _m: ActorRef<Msg>,
        a: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(a)
    }
    async fn handle(
        &self,
        myself: ActorRef<Msg>,
        msg: Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Msg::Push(n, reply, events) => {
                if let Some(r) = reply {
                    let _ = r.send(());
                }
                let tx = st.clone();
                tokio::spawn(async move {
                    // events==2: the task sends a "started" event itself first
                    if events == 2 {
                        let _ = tx.send(u64::MAX).await;
                    }
                    let _ = myself.send_message(Msg::Done(n));
                });
            }
            Msg::Done(n) => {
                let _ = st.send(n).await;
            }
        }
        Ok(())
    }
}

async fn base(
    actor: &ActorRef<Msg>,
    rx: &mut mpsc::Receiver<u64>,
    ack: bool,
    events: u8,
) -> Duration {
    let t0 = Instant::now();
    for n in 0..N {
        if ack {
            let (tx, orx) = oneshot::channel();
            actor
                .send_message(Msg::Push(n, Some(RpcReplyPort::from(tx)), events))
                .ok()
                .unwrap();
            orx.await.unwrap();
        } else {
            actor.send_message(Msg::Push(n, None, events)).ok().unwrap();
        }
        loop {
            if rx.recv().await.unwrap() == n {
                break;
            }
        }
    }
    t0.elapsed()
}

pub async fn run() {
    let mode = std::env::var("PROBE_RT").unwrap_or_default();
    match mode.as_str() {
        "current" => std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(inner())
        })
        .join()
        .unwrap(),
        "worker" => tokio::spawn(inner()).await.unwrap(),
        _ => inner().await,
    }
}

async fn inner() {
    let (tx, mut rx) = mpsc::channel(256);
    let (actor, _j) = Actor::spawn(None, A, tx).await.unwrap();
    let h: SessionHandle<SimItem, SimEvent> = SessionHandle::spawn(
        SessionConfig::new("p"),
        Arc::new(SimAgent::new(Script::noop())),
        None,
    )
    .await
    .unwrap();
    let mut ev = h.subscribe();
    let mut id = 0u64;
    let mut s = [
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    ];
    for r in 0..R + 1 {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / N as f64;
        let b0 = us(base(&actor, &mut rx, false, 1).await);
        let b1 = us(base(&actor, &mut rx, true, 1).await);
        let b2 = us(base(&actor, &mut rx, true, 2).await);
        // agentloop with phase stamps
        let (mut ack, mut started, mut ended) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let t0 = Instant::now();
        for _ in 0..N {
            id += 1;
            let a = Instant::now();
            h.push(SimItem::new(id, "x")).await.unwrap();
            let b = Instant::now();
            let mut c = b;
            loop {
                match ev.next().await.unwrap() {
                    SessionEvent::TurnStarted { .. } => c = Instant::now(),
                    SessionEvent::TurnEnded { .. } => break,
                    _ => {}
                }
            }
            let d = Instant::now();
            ack += b - a;
            started += c - b;
            ended += d - c;
        }
        let total = us(t0.elapsed());
        // push-ack only (items pile up into turns; fine for a probe)
        let t1 = Instant::now();
        for _ in 0..N {
            id += 1;
            h.push(SimItem::new(id, "x")).await.unwrap();
        }
        let ack_only = us(t1.elapsed());
        // drain
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(50), ev.next()).await {}
        if r == 0 {
            continue;
        }
        for (i, v) in [b0, b1, b2, total, us(ack), us(started), us(ended), ack_only]
            .into_iter()
            .enumerate()
        {
            s[i].push(v);
        }
    }
    let names = [
        "baseline (cast, 1 event)",
        "baseline + oneshot ack",
        "baseline + ack + task sends 'started' event",
        "agentloop total",
        "  push -> ack",
        "  ack -> TurnStarted read",
        "  TurnStarted -> TurnEnded read",
        "agentloop push-ack only (no waiting for turns)",
    ];
    for (n, v) in names.iter().zip(s.iter()) {
        println!("{:<50} {:>8.3} µs", n, median(v));
    }
}

pub fn al_only() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let h: SessionHandle<SimItem, SimEvent> = SessionHandle::spawn(
            SessionConfig::new("p"),
            Arc::new(SimAgent::new(Script::noop())),
            None,
        )
        .await
        .unwrap();
        let mut ev = h.subscribe();
        let t0 = Instant::now();
        let n = 2_000_000u64;
        for id in 0..n {
            h.push(SimItem::new(id, "x")).await.unwrap();
            loop {
                if let SessionEvent::TurnEnded { .. } = ev.next().await.unwrap() {
                    break;
                }
            }
        }
        println!("{:.3} µs/op", t0.elapsed().as_secs_f64() * 1e6 / n as f64);
    });
}
