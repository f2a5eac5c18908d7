//! The store conformance suite (`agentloop_tests::conformance`, issue 12) on every
//! backend this workspace has: the memory store, sled and fjall at both durability
//! levels (S15b) through the checkpoint actor (issue 15), and PostgreSQL.

use std::sync::Arc;

use agentloop::store::{CheckpointStore, Engine, StoreDurability, StoreError};
use agentloop::{store::CheckpointActor, MemoryStore};
use agentloop_sim::SimItem;
use agentloop_tests::conformance::{run_all, Store};
use agentloop_tests::TempDir;

#[tokio::test]
async fn s15_memory_store_conforms() {
    let memory = Arc::new(MemoryStore::<SimItem>::new());
    let store: Store = memory.clone();
    run_all(store.clone()).await;
    agentloop_tests::conformance::shared_membership(&store).await;
    memory.put_raw(&agentloop_core::table::header_key(CORRUPT), GARBAGE);
    agentloop_tests::conformance::a_corrupt_record_is_listed_on_its_page(&store, CORRUPT).await;
}

/// A record whose head does not decode, planted by the engine tests below (issue 52: a
/// page lists it with its error).
const CORRUPT: &str = "list-bb-corrupt";
const GARBAGE: &[u8] = b"ALCK\x02\x00garbage";

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
    // A head that does not decode, as a broken disk would leave it: listed on its page.
    let path = dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let b = agentloop::store::Backend::open(&path, engine).unwrap();
        b.put_raw(&agentloop_core::table::header_key(CORRUPT), GARBAGE)
            .unwrap();
        b.flush().unwrap();
    })
    .await
    .unwrap();
    let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), engine)
        .await
        .unwrap();
    let store: Store = Arc::new(client.clone());
    agentloop_tests::conformance::a_corrupt_record_is_listed_on_its_page(&store, CORRUPT).await;
    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_fjall_crash_store_conforms() {
    conforms_on(Engine::Fjall(StoreDurability::Crash)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_fjall_power_store_conforms() {
    conforms_on(Engine::Fjall(StoreDurability::Power)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15b_sled_crash_store_conforms() {
    conforms_on(Engine::Sled(StoreDurability::Crash)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15b_sled_power_store_conforms() {
    conforms_on(Engine::Sled(StoreDurability::Power)).await;
}

/// A sled record larger than a log segment's share (sled writes it to a blob file of
/// its own, outside the data file) round-trips at `power`, whose flush fsyncs the new
/// blob file and its directory; the level is the store's, reported by the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15b_sled_power_writes_blobs_durably() {
    let dir = TempDir::new("sled-blob");
    let engine = Engine::Sled(StoreDurability::Power);
    let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), engine)
        .await
        .unwrap();
    let mut r = agentloop::store::SessionRecord::<SimItem>::new("big", "sim", 0);
    r.unhandled_items = vec![SimItem::new(1, "x".repeat(600 * 1024))];
    client.save(r).await.expect("a blob-sized write at power");
    let blobs = std::fs::read_dir(dir.path().join("blobs"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        blobs > 0,
        "the record did not go to a blob: the test proves nothing"
    );
    client.close().await.unwrap();
    let backend = agentloop::store::Backend::open(dir.path(), engine).unwrap();
    assert_eq!(backend.engine(), engine, "the level is the store's");
    drop(backend);
    let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), engine)
        .await
        .unwrap();
    let back = client.load("big").await.unwrap().expect("the record");
    assert_eq!(back.unhandled_items.len(), 1);
    assert_eq!(back.unhandled_items[0].text.len(), 600 * 1024);
    client.close().await.unwrap();
}

/// Opening one engine in a directory the other wrote is refused, names both engines and
/// says how to move the records; the records stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mismatch_is_refused_with_the_way_out() {
    for (wrote, opened) in [
        (Engine::SLED, Engine::Fjall(StoreDurability::Crash)),
        (Engine::Fjall(StoreDurability::Crash), Engine::SLED),
    ] {
        let dir = TempDir::new("mismatch");
        let client = CheckpointActor::<SimItem>::spawn_engine(dir.path(), wrote)
            .await
            .unwrap();
        let r = agentloop::store::SessionRecord::<SimItem>::new("kept", "sim", 0);
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

/// The store's level on PostgreSQL (S15b), a floor applied to every connection:
/// `power` is refused on a server that runs with `fsync = off` (it cannot give it),
/// naming the level it can; on a server whose `synchronous_commit` is `off` it sets it
/// `on` (the connect re-reads it and refuses a connection where it did not take, so a
/// connect that succeeds proves it took); a server at `local` is kept as it is (it
/// flushes locally); `crash` is never refused (a listing at `crash` works on any server).
#[test]
fn s15b_postgres_levels() {
    use agentloop_postgres::local_server::LocalServer;
    use agentloop_postgres::{PostgresOptions, PostgresStore};

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let connect = |url: String, level: StoreDurability| {
        rt.block_on(PostgresStore::<SimItem>::connect(
            PostgresOptions::new(url).durability(level),
        ))
    };
    let no_fsync = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let url = no_fsync.database("levels").expect("a database");
    let e = connect(url.clone(), StoreDurability::Power).expect_err("power without fsync");
    let msg = e.to_string();
    assert!(
        msg.contains("fsync = off") && msg.contains("durability crash"),
        "{msg}"
    );
    connect(url, StoreDurability::Crash).expect("crash on a server without fsync");
    drop(no_fsync);

    for setting in ["synchronous_commit=off", "synchronous_commit=local"] {
        let server = LocalServer::start(&[setting]).expect("a local PostgreSQL server");
        let url = server.database("levels").expect("a database");
        let store = connect(url.clone(), StoreDurability::Power).expect(setting);
        let r = agentloop::store::SessionRecord::<SimItem>::new("p", "sim", 0);
        rt.block_on(CheckpointStore::<SimItem>::save(&store, r))
            .expect("a write at power");
        connect(url, StoreDurability::Crash).expect("crash is never refused");
    }
}

/// The suite on PostgreSQL (issue 18): a server started for the test on loopback, the
/// suite through one store, then a second store (another process would be the same):
/// what the first wrote is there, and the two are fenced against each other (S37) and
/// serialized per session (two conditional writes racing: exactly one wins).
#[test]
fn s15_postgres_store_conforms() {
    use agentloop::store::StoreDurability;
    use agentloop::store::{RecordHeader, RecordWrite, StateChange, WriteCondition};
    use agentloop::{store::CasOutcome, store::SessionStatus, store::StatusKind};
    use agentloop_postgres::local_server::LocalServer;
    use agentloop_postgres::{PostgresOptions, PostgresStore};

    let server = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let url = server.database("conformance").expect("a database");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The server runs with fsync = off: it gives durability crash only (S15b).
        let first = PostgresStore::<SimItem>::connect(
            PostgresOptions::new(url.clone()).durability(StoreDurability::Crash),
        )
        .await
        .expect("connect");
        run_all(Arc::new(first.clone())).await;
        agentloop_tests::conformance::shared_membership(&(Arc::new(first.clone()) as Store)).await;
        first
            .put_raw(
                CORRUPT,
                &agentloop_core::table::header_key(CORRUPT),
                GARBAGE,
            )
            .await
            .expect("a raw row");
        agentloop_tests::conformance::a_corrupt_record_is_listed_on_its_page(
            &(Arc::new(first.clone()) as Store),
            CORRUPT,
        )
        .await;

        let second = PostgresStore::<SimItem>::connect(PostgresOptions {
            url: url.clone(),
            connections: 2,
            durability: StoreDurability::Crash,
        })
        .await
        .expect("a second store");
        let incr = CheckpointStore::<SimItem>::load(&second, "incr")
            .await
            .unwrap()
            .expect("what the first store wrote");
        assert_eq!(agentloop_tests::ids(&incr.unhandled_items), vec![3]);
        assert_eq!(incr.version, 6);

        // Owner A holds epoch 1; B cancels by id (no epoch) and A's next write is refused.
        let id = "two-nodes";
        let at = |epoch: u64, condition: WriteCondition| RecordWrite {
            header: RecordHeader {
                session_id: id.into(),
                agent_kind: "sim".into(),
                status: SessionStatus::Running,
                lease_epoch: epoch,
                ..RecordHeader::default()
            },
            items: vec![],
            state: StateChange::Keep,
            journal: Vec::new(),
            replace: false,
            condition,
            history: None,
            timers: Vec::new(),
        };
        CheckpointStore::<SimItem>::write(&first, at(1, WriteCondition::NotFinal))
            .await
            .expect("A claims");
        assert!(matches!(
            CheckpointStore::<SimItem>::cas_status(
                &second,
                id,
                vec![StatusKind::Running],
                SessionStatus::Canceled
            )
            .await
            .unwrap(),
            CasOutcome::Swapped(SessionStatus::Running)
        ));
        let e = CheckpointStore::<SimItem>::write(&first, at(1, WriteCondition::Always))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Fenced {
                    held: 1,
                    current: 2,
                    ..
                }
            ),
            "{e}"
        );

        // Two stores racing conditional writes on one version: exactly one wins.
        let race = "race";
        CheckpointStore::<SimItem>::write(&first, {
            let mut w = at(1, WriteCondition::Always);
            w.header.session_id = race.into();
            w
        })
        .await
        .unwrap();
        for round in 0..20u64 {
            let v = match CheckpointStore::<SimItem>::load_stored(&first, race)
                .await
                .unwrap()
            {
                Some(agentloop::store::Stored::Current(r)) => r.header.version,
                other => panic!("{other:?}"),
            };
            let w = |n: u64| {
                let mut w = at(1, WriteCondition::AtVersion(v));
                w.header.session_id = race.into();
                w.header.turn_index = n;
                w
            };
            let (a, b) = tokio::join!(
                CheckpointStore::<SimItem>::write(&first, w(round * 2)),
                CheckpointStore::<SimItem>::write(&second, w(round * 2 + 1)),
            );
            assert!(
                a.is_ok() != b.is_ok(),
                "round {round}: exactly one of two racing writes wins: {a:?} {b:?}"
            );
            let loser = a.err().or(b.err()).unwrap();
            assert!(matches!(loser, StoreError::Changed { .. }), "{loser}");
        }
    });
}
