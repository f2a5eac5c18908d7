//! Shared helpers for agentloop's cross-crate tests: spawning simulated sessions, the
//! probe that tells a test where the agent is, bounded waits, and the conservation
//! check of DESIGN S10.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    CheckpointStore, ExitState, MemoryStore, SessionEvent, SessionHandle, SessionSpec,
};
use agentloop_sim::{Notice, Script, SimAgent, SimEvent, SimItem, SimStep};
use tokio::sync::mpsc;

pub mod conformance;

/// A simulated session's handle.
pub type Handle = SessionHandle<SimItem, SimEvent>;

/// An item with this id.
pub fn item(id: u64) -> SimItem {
    SimItem::new(id, format!("item-{id}"))
}

/// The ids of some items.
pub fn ids(items: &[SimItem]) -> Vec<u64> {
    items.iter().map(|i| i.id).collect()
}

/// A script of `n` zero-latency steps alternating model call / tool round.
pub fn steps(n: usize) -> Script {
    let steps = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                SimStep::ModelCall {
                    latency: Duration::ZERO,
                    input_tokens: 100,
                }
            } else {
                SimStep::ToolRound {
                    latency: Duration::ZERO,
                    calls: 1,
                }
            }
        })
        .collect();
    Script { steps }
}

/// Fails the test instead of hanging: on a paused clock, an idle runtime jumps to this
/// deadline at once.
/// Takes anything awaitable (a push being made, too).
pub async fn within<T>(what: &str, fut: impl IntoFuture<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(120), fut.into_future()).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Where the simulated agent is.
pub struct Probe(mpsc::UnboundedReceiver<Notice>);

/// A probe channel for `SimAgent::with_probe`.
pub fn probe() -> (mpsc::UnboundedSender<Notice>, Probe) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, Probe(rx))
}

impl Probe {
    /// Waits for the first notice matching `pred` (skipping others).
    pub async fn until(&mut self, what: &str, pred: impl Fn(&Notice) -> bool) -> Notice {
        within(what, async {
            loop {
                match self.0.recv().await {
                    Some(n) if pred(&n) => return n,
                    Some(_) => continue,
                    None => panic!("probe closed while waiting for {what}"),
                }
            }
        })
        .await
    }

    /// Waits until turn `turn` is about to run step `step`.
    pub async fn at_step(&mut self, turn: u64, step: usize) {
        self.until(
            &format!("turn {turn} step {step}"),
            |n| matches!(n, Notice::StepBegin { turn: t, step: s } if *t == turn && *s == step),
        )
        .await;
    }

    /// Waits for turn `turn` to start and returns its item ids.
    pub async fn turn_begins(&mut self, turn: u64) -> (Vec<u64>, bool) {
        match self
            .until(
                &format!("turn {turn} begins"),
                |n| matches!(n, Notice::TurnBegin { turn: t, .. } if *t == turn),
            )
            .await
        {
            Notice::TurnBegin { items, resumed, .. } => (items, resumed),
            _ => unreachable!("filtered above"),
        }
    }

    /// Waits for the plan of turn `turn` to begin.
    pub async fn plan_begins(&mut self, turn: u64) {
        self.until(
            &format!("plan of turn {turn}"),
            |n| matches!(n, Notice::PlanBegin { turn: t } if *t == turn),
        )
        .await;
    }

    /// The notices received so far, without waiting.
    pub fn drain(&mut self) -> Vec<Notice> {
        let mut v = Vec::new();
        while let Ok(n) = self.0.try_recv() {
            v.push(n);
        }
        v
    }
}

/// Spawns a non-persistent session.
pub async fn spawn(id: &str, agent: SimAgent) -> Handle {
    SessionHandle::spawn(SessionSpec::new(id, "default"), Arc::new(agent), None)
        .await
        .expect("spawn")
}

/// Spawns a persistent session on `store` with `exit` durability (records written at
/// exit only, S16).
pub async fn spawn_persistent(
    id: &str,
    agent: SimAgent,
    store: Arc<MemoryStore<SimItem>>,
) -> Handle {
    spawn_on(
        SessionSpec::new(id, "default")
            .persistent(true)
            .kind("sim")
            .durability(agentloop::Durability::Exit),
        agent,
        store,
    )
    .await
}

/// Spawns a session with `config` on any store.
pub async fn spawn_on(
    config: SessionSpec<SimItem>,
    agent: SimAgent,
    store: Arc<dyn CheckpointStore<SimItem>>,
) -> Handle {
    SessionHandle::spawn(config, Arc::new(agent), Some(store))
        .await
        .expect("spawn")
}

/// Reads a stream to its end (`None`), bounded.
pub async fn collect(mut events: agentloop::EventStream<SimEvent>) -> Vec<SessionEvent<SimEvent>> {
    within("the event stream to end", async move {
        let mut v = Vec::new();
        while let Some(e) = events.next().await {
            v.push(e);
        }
        v
    })
    .await
}

/// S10: every pushed id is in exactly one place. `accepted` are the ids whose push was
/// accepted, `rejected` the ids handed back as late. Returns a description of the
/// first violation.
pub fn check_conservation(
    accepted: &[u64],
    rejected: &[u64],
    exit: &ExitState<SimItem>,
    delivered: &[u64],
    dropped: &[u64],
) -> Result<(), String> {
    let mut seen: std::collections::HashMap<u64, Vec<&str>> = Default::default();
    for id in delivered {
        seen.entry(*id).or_default().push("delivered");
    }
    for id in dropped {
        seen.entry(*id).or_default().push("dropped by plan");
    }
    for i in &exit.unhandled_items {
        seen.entry(i.id).or_default().push("unhandled");
    }
    for i in &exit.interrupted_items {
        seen.entry(i.id).or_default().push("interrupted");
    }
    for id in accepted {
        match seen.get(id).map(|v| v.as_slice()) {
            Some([_]) => {}
            None | Some([]) => return Err(format!("accepted item {id} is nowhere")),
            Some(places) => return Err(format!("accepted item {id} is in {places:?}")),
        }
    }
    for id in rejected {
        if seen.contains_key(id) {
            return Err(format!("late item {id} is also in {:?}", seen[id]));
        }
    }
    let extra: Vec<_> = seen.keys().filter(|k| !accepted.contains(k)).collect();
    if !extra.is_empty() {
        return Err(format!("items never accepted turned up: {extra:?}"));
    }
    let late: Vec<u64> = ids(&exit.late_items);
    for id in &late {
        if !rejected.contains(id) {
            return Err(format!("late list holds {id}, which was not rejected"));
        }
    }
    Ok(())
}

/// A session whose agent's every step waits at a gate the test opens, with a probe on
/// where the agent is.
pub async fn gated(id: &str, agent: SimAgent) -> (Handle, agentloop_sim::Gate, Probe) {
    let gate = agentloop_sim::Gate::new();
    let (tx, probe) = probe();
    let h = spawn(id, agent.with_step_gate(gate.clone()).with_probe(tx)).await;
    (h, gate, probe)
}

/// [`gated`], with item 1 pushed and turn 0 waiting at its first step.
pub async fn running(id: &str, agent: SimAgent) -> (Handle, agentloop_sim::Gate, Probe) {
    let (h, gate, mut probe) = gated(id, agent).await;
    h.push(item(1)).await.expect("push");
    probe.at_step(0, 0).await;
    (h, gate, probe)
}

/// A unique temporary directory, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// A fresh directory named after `label`.
    pub fn new(label: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "agentloop-{label}-{}-{}-{}",
            std::process::id(),
            agentloop::store::now_ms(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// [`gated`], persistent on `store` with `exit` durability.
pub async fn gated_persistent(
    id: &str,
    agent: SimAgent,
    store: Arc<MemoryStore<SimItem>>,
) -> (Handle, agentloop_sim::Gate, Probe) {
    let gate = agentloop_sim::Gate::new();
    let (tx, probe) = probe();
    let h = spawn_persistent(id, agent.with_step_gate(gate.clone()).with_probe(tx), store).await;
    (h, gate, probe)
}

/// [`gated_persistent`], with item 1 pushed and turn 0 waiting at its first step.
pub async fn running_persistent(
    id: &str,
    agent: SimAgent,
    store: Arc<MemoryStore<SimItem>>,
) -> (Handle, agentloop_sim::Gate, Probe) {
    let (h, gate, mut probe) = gated_persistent(id, agent, store).await;
    h.push(item(1)).await.expect("push");
    probe.at_step(0, 0).await;
    (h, gate, probe)
}
