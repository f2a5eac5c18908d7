//! The store conformance suite (`agentloop_tests::conformance`, issue 12) on every
//! backend this workspace has: the memory store and sled through the checkpoint actor.

use std::sync::Arc;

use agentloop::{CheckpointActor, MemoryStore};
use agentloop_sim::SimItem;
use agentloop_tests::conformance::{run_all, Store};
use agentloop_tests::TempDir;

#[tokio::test]
async fn s15_memory_store_conforms() {
    let store: Store = Arc::new(MemoryStore::<SimItem>::new());
    run_all(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_sled_store_conforms() {
    let dir = TempDir::new("conformance");
    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let store: Store = Arc::new(client.clone());
    run_all(store).await;
    client.close().await.unwrap();
    // What it wrote is still there after a restart.
    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let store: Store = Arc::new(client.clone());
    let incr = store.load("incr").await.unwrap().expect("a record");
    assert_eq!(agentloop_tests::ids(&incr.unhandled_items), vec![3]);
    assert_eq!(incr.version, 6);
    let whole = store.load("whole").await.unwrap().expect("a record");
    assert_eq!(agentloop_tests::ids(&whole.interrupted_items), vec![4, 1]);
    client.close().await.unwrap();
}
