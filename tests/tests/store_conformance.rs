//! The store conformance suite (`agentloop_tests::conformance`, issue 12) on every
//! backend this workspace has: the memory store, and sled and fjall (both durability
//! levels) through the checkpoint actor (issue 15).

use std::sync::Arc;

use agentloop::store::{CheckpointStore, Engine, FjallDurability, StoreError};
use agentloop::{CheckpointActor, MemoryStore};
use agentloop_sim::SimItem;
use agentloop_tests::conformance::{run_all, Store};
use agentloop_tests::TempDir;

#[tokio::test]
async fn s15_memory_store_conforms() {
    let store: Store = Arc::new(MemoryStore::<SimItem>::new());
    run_all(store).await;
}

/// The suite through the checkpoint actor on `engine`, then a restart: what it wrote is
/// still there.
async fn conforms_on(engine: Engine) {
    let dir = TempDir::new("conformance");
    let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), engine)
        .await
        .unwrap();
    let store: Store = Arc::new(client.clone());
    run_all(store).await;
    client.close().await.unwrap();
    let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), engine)
        .await
        .unwrap();
    let store: Store = Arc::new(client.clone());
    let incr = store.load("incr").await.unwrap().expect("a record");
    assert_eq!(agentloop_tests::ids(&incr.unhandled_items), vec![3]);
    assert_eq!(incr.version, 6);
    let whole = store.load("whole").await.unwrap().expect("a record");
    assert_eq!(agentloop_tests::ids(&whole.interrupted_items), vec![4, 1]);
    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_fjall_crash_store_conforms() {
    conforms_on(Engine::Fjall(FjallDurability::Crash)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_fjall_power_store_conforms() {
    conforms_on(Engine::Fjall(FjallDurability::Power)).await;
}

/// Opening one engine in a directory the other wrote is refused, names both engines and
/// says how to move the records; the records stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mismatch_is_refused_with_the_way_out() {
    for (wrote, opened) in [
        (Engine::Sled, Engine::Fjall(FjallDurability::Crash)),
        (Engine::Fjall(FjallDurability::Crash), Engine::Sled),
    ] {
        let dir = TempDir::new("mismatch");
        let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), wrote)
            .await
            .unwrap();
        let r = agentloop::SessionRecord::<SimItem>::new("kept", "sim", 0);
        client.save(r).await.unwrap();
        client.close().await.unwrap();
        let err = match CheckpointActor::<SimItem>::spawn_engine(dir.path(), opened).await {
            Ok(_) => panic!("{} opened a {} directory", opened.name(), wrote.name()),
            Err(e) => e,
        };
        assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("holds a {} database", wrote.name()))
                && msg.contains(&format!("configured for {}", opened.name()))
                && msg.contains("agentloop sessions export"),
            "{msg}"
        );
        let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), wrote)
            .await
            .unwrap();
        assert!(client.load("kept").await.unwrap().is_some());
        client.close().await.unwrap();
    }
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
