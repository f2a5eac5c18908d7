//! Writes the v1 record fixture (`tests/fixtures/v1/`): a sled data directory holding
//! records in record format 1 (bincode payload), written by the checkpoint actor of
//! this commit. Kept so the fixture's origin can be read; format 1 is only read now.

use agentloop::store::codec;
use agentloop::{CheckpointActor, CheckpointStore, SessionRecord, SessionStatus};
use agentloop_sim::{SimItem, SimState};

fn rec(id: &str, status: SessionStatus, turn: u64) -> SessionRecord<SimItem> {
    let mut r = SessionRecord::new(id, "sim", turn);
    r.status = status;
    r.agent_config = b"cfg".to_vec();
    r.created_at_ms = 1_795_300_000_000;
    r.updated_at_ms = 1_795_300_000_500;
    r.heartbeat_ms = 1_795_300_000_500;
    r
}

#[tokio::main]
async fn main() {
    let dir = std::env::args().nth(1).expect("usage: gen_v1_fixture DIR");
    let c = CheckpointActor::<SimItem>::spawn(&dir).await.expect("open");
    let mut stopped = rec("v1-stopped", SessionStatus::Stopped, 3);
    stopped.unhandled_items = vec![SimItem::new(1, "one"), SimItem::new(2, "two")];
    stopped.stop_cause = Some("user left".into());
    let mut interrupted = rec("v1-interrupted", SessionStatus::Interrupted, 5);
    interrupted.interrupted_items = vec![SimItem::new(10, "cut")];
    interrupted.unhandled_items = vec![SimItem::new(11, "queued a"), SimItem::new(12, "queued b")];
    let state = SimState { turn: 5, items: vec![10], steps_done: 1, payload: vec![1, 2, 3] };
    interrupted.state = Some(codec::encode_state("v1-interrupted", &state).expect("state"));
    interrupted.stop_cause = Some("shutdown".into());
    let mut running = rec("v1-running", SessionStatus::Running, 1);
    running.owner = Some("instance-dead".into());
    running.heartbeat_ms = 0;
    running.unhandled_items = vec![SimItem::new(20, "while running")];
    let completed = rec("v1-completed", SessionStatus::Completed, 9);
    let mut failed = rec("v1-failed", SessionStatus::Failed("model call failed".into()), 2);
    failed.last_error = Some("model call failed".into());
    failed.unhandled_items = vec![SimItem::new(30, "never handled")];
    let mut canceled = rec("v1-canceled", SessionStatus::Canceled, 4);
    canceled.interrupted_items = vec![SimItem::new(40, "canceled mid-turn")];
    for r in [stopped, interrupted, running, completed, failed, canceled] {
        c.save(r).await.expect("save");
    }
    c.close().await.expect("close");
}
