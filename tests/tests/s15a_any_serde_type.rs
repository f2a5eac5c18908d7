//! S15a: items and agent state of any serde type round-trip through the store, or are
//! refused when they are pushed (issue 12). The shapes agent frameworks use:
//! `serde_json::Value`, `skip_serializing_if`, untagged, internally and adjacently
//! tagged enums, `flatten`, renames, maps with non-string keys, `u128`, unit structs,
//! large strings.
//!
//! * a property test over generated values of each shape: they encode, read back equal,
//!   and encode again to the same value; `u128` inside an untagged, internally tagged or
//!   flattened type (which serde cannot buffer) is refused with a typed error naming
//!   the type, and never half-stored;
//! * end to end on sled: each kind is pushed into a persistent `sync` session, the
//!   runtime stops (the records stay `Interrupted`), a new runtime starts on the same
//!   directory and its agent gets every item back equal, in order; the cut turn's state
//!   (with a `serde_json::Value` and a flattened map) comes back equal too;
//! * a push of a value that cannot be stored is handed back with the type, the field and
//!   serde's reason, and nothing is written; an agent state that cannot be stored fails
//!   the turn and the record keeps its last good state.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use agentloop::store::codec::{self, PayloadStage};
use agentloop::{
    exit::FailureKind, store::SessionStatus, Agent, AgentError, CheckpointStore, Durability,
    ExitReason, PushError, Runtime, SafePoint, SessionHandle, SessionSpec, StopOptions, Turn,
    TurnCx, TurnOutcome,
};
use agentloop_tests::{within, TempDir};
use parking_lot::Mutex;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

// ------------------------------------------------------------------------------------
// The shapes.

/// A chat message as frameworks type it: internally tagged by `role`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum Chat {
    User {
        content: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: Value,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    arguments: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Loose {
    Text(String),
    Pair { a: i64, b: bool },
    List(Vec<u16>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", content = "c")]
enum Adjacent {
    Num(i32),
    Named { label: String },
    Nothing,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Flat {
    id: u32,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Renamed {
    #[serde(rename = "msgId")]
    message_id: u64,
    created_by: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Unit;

/// Every shape, one variant each (externally tagged, the serde default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Item {
    Json {
        value: Value,
    },
    Chat(Chat),
    Loose(Loose),
    Adjacent(Adjacent),
    Flat(Flat),
    Renamed(Renamed),
    Keys(BTreeMap<(u8, u8), String>),
    Hashed(HashMap<u32, Vec<String>>),
    Unit(Unit),
    Large(String),
    Wide(u128),
    /// Not storable: u128 inside an untagged enum.
    WideLoose(WideLoose),
    /// Not storable: u128 inside an internally tagged enum.
    WideTagged(WideTagged),
    /// Not storable: u128 inside a flattened struct.
    WideFlat(WideFlat),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum WideLoose {
    N(u128),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k")]
enum WideTagged {
    N { n: u128 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct WideFlat {
    #[serde(flatten)]
    inner: WideInner,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct WideInner {
    n: u128,
}

impl Item {
    /// Whether serde can store it (S15a's exception).
    fn storable(&self) -> bool {
        !matches!(
            self,
            Item::WideLoose(_) | Item::WideTagged(_) | Item::WideFlat(_)
        )
    }
}

// ------------------------------------------------------------------------------------
// Generators.

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn chat() -> impl Strategy<Value = Chat> {
    prop_oneof![
        (".{0,40}", proptest::option::of("[a-z]{1,8}"))
            .prop_map(|(content, name)| Chat::User { content, name }),
        (
            proptest::option::of(".{0,20}"),
            proptest::collection::vec(
                ("[a-z0-9]{1,8}", json_value()).prop_map(|(id, arguments)| ToolCall {
                    id,
                    kind: "function".into(),
                    arguments
                }),
                0..3
            )
        )
            .prop_map(|(content, tool_calls)| Chat::Assistant {
                content,
                tool_calls
            }),
        ("[a-z0-9]{1,8}", json_value()).prop_map(|(tool_call_id, content)| Chat::Tool {
            tool_call_id,
            content
        }),
    ]
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        json_value().prop_map(|value| Item::Json { value }),
        chat().prop_map(Item::Chat),
        prop_oneof![
            ".{0,10}".prop_map(Loose::Text),
            (any::<i64>(), any::<bool>()).prop_map(|(a, b)| Loose::Pair { a, b }),
            proptest::collection::vec(any::<u16>(), 0..5).prop_map(Loose::List),
        ]
        .prop_map(Item::Loose),
        prop_oneof![
            any::<i32>().prop_map(Adjacent::Num),
            ".{0,8}".prop_map(|label| Adjacent::Named { label }),
            Just(Adjacent::Nothing),
        ]
        .prop_map(Item::Adjacent),
        (
            any::<u32>(),
            proptest::collection::btree_map("[a-z]{2,6}", json_value(), 0..4)
        )
            .prop_map(|(id, extra)| Item::Flat(Flat { id, extra })),
        (any::<u64>(), ".{0,10}").prop_map(|(message_id, created_by)| Item::Renamed(Renamed {
            message_id,
            created_by
        })),
        proptest::collection::btree_map((any::<u8>(), any::<u8>()), ".{0,6}", 0..5)
            .prop_map(Item::Keys),
        proptest::collection::hash_map(
            any::<u32>(),
            proptest::collection::vec(".{0,4}", 0..3),
            0..5
        )
        .prop_map(Item::Hashed),
        Just(Item::Unit(Unit)),
        (0usize..200_000).prop_map(|n| Item::Large("x".repeat(n))),
        any::<u128>().prop_map(Item::Wide),
        any::<u128>().prop_map(|n| Item::WideLoose(WideLoose::N(n))),
        any::<u128>().prop_map(|n| Item::WideTagged(WideTagged::N { n })),
        any::<u128>().prop_map(|n| Item::WideFlat(WideFlat {
            inner: WideInner { n }
        })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    /// S15a: every shape reads back equal, or is refused with a typed error.
    #[test]
    fn s15a_every_shape_round_trips_or_is_refused(value in item()) {
        match codec::encode_item(&value) {
            Ok(bytes) => {
                prop_assert!(value.storable(), "{value:?} should have been refused");
                let back: Item = codec::payload::decode(&bytes).expect("stored bytes decode");
                prop_assert_eq!(&back, &value);
                let again = codec::encode_item(&back).expect("the value encodes again");
                // Equal as values (a HashMap writes its entries in any order).
                prop_assert_eq!(
                    codec::payload::to_json(&again).unwrap(),
                    codec::payload::to_json(&bytes).unwrap()
                );
            }
            Err(e) => {
                prop_assert!(!value.storable(), "{value:?} refused: {e}");
                prop_assert!(e.type_name.ends_with("Item"), "{e}");
                prop_assert!(e.to_string().contains("u128"), "{e}");
                prop_assert!(matches!(e.stage, PayloadStage::Decode | PayloadStage::RoundTrip), "{e}");
            }
        }
    }
}

// ------------------------------------------------------------------------------------
// End to end on sled, through a runtime stop and a restart.

/// The agent's state: a conversation with JSON in it and a flattened map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct State {
    seen: Vec<Item>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
    /// When set, the state cannot be stored (u128 in an untagged enum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    poison: Option<WideLoose>,
}

/// Consumes everything; records what it got. Turn 0 of a session built with `block`
/// reaches one safe point and then waits forever (so its items stay cut); a session
/// built with `poison` records an unstorable state at its second safe point.
struct Recorder {
    got: Arc<Mutex<Vec<Item>>>,
    resumed: Arc<Mutex<Vec<State>>>,
    block: bool,
    poison: bool,
}

impl Agent for Recorder {
    type Item = Item;
    type Event = ();
    type State = State;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<State>, AgentError> {
        if let Some(s) = &turn.resume {
            self.resumed.lock().push(s.clone());
        }
        let mut extra = BTreeMap::new();
        extra.insert("model".into(), json!({"name": "sim", "temperature": 0.5}));
        let state = State {
            seen: turn.items.clone(),
            extra,
            poison: None,
        };
        cx.safe_point(SafePoint::AfterModelCall, &state)?;
        if self.poison {
            let bad = State {
                poison: Some(WideLoose::N(1)),
                ..state.clone()
            };
            cx.safe_point(SafePoint::AfterToolCalls, &bad)?;
        }
        if self.block {
            std::future::pending::<()>().await;
        }
        self.got.lock().extend(turn.items);
        Ok(TurnOutcome::Completed)
    }
}

fn storable_items() -> Vec<Item> {
    let mut extra = BTreeMap::new();
    extra.insert("lang".to_string(), json!("fr"));
    extra.insert("score".to_string(), json!(0.25));
    vec![
        Item::Chat(Chat::User {
            content: "what's the weather in Paris?".into(),
            name: None,
        }),
        Item::Chat(Chat::Assistant {
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                kind: "function".into(),
                arguments: json!({"city": "Paris", "days": [1, 2, 3], "metric": true}),
            }],
        }),
        Item::Chat(Chat::Tool {
            tool_call_id: "call_1".into(),
            content: json!({"forecast": [{"t": 14.5}, {"t": -2}], "source": null}),
        }),
        Item::Json {
            value: json!([1, "two", {"three": [3.5]}]),
        },
        Item::Loose(Loose::Pair { a: -7, b: true }),
        Item::Adjacent(Adjacent::Named {
            label: "tagged".into(),
        }),
        Item::Flat(Flat { id: 9, extra }),
        Item::Renamed(Renamed {
            message_id: u64::MAX,
            created_by: "me".into(),
        }),
        Item::Keys([((1, 2), "a".to_string()), ((3, 4), "b".to_string())].into()),
        Item::Hashed((0..20).map(|i| (i, vec![format!("v{i}")])).collect()),
        Item::Unit(Unit),
        Item::Large("y".repeat(300_000)),
        Item::Wide(u128::MAX),
    ]
}

type Rt = Runtime<Item, ()>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15a_every_kind_survives_a_restart_on_sled() {
    let dir = TempDir::new("s15a");
    let items = storable_items();
    let got = Arc::new(Mutex::new(Vec::new()));
    let resumed = Arc::new(Mutex::new(Vec::new()));

    // Run 1: the first turn takes the first item and blocks after its safe point; every
    // other item is pushed (each acknowledged after its write), then the runtime stops.
    let (g, r) = (got.clone(), resumed.clone());
    let (rt, _) = Rt::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("rec", move |_cfg: &[u8]| {
            Ok(Recorder {
                got: g.clone(),
                resumed: r.clone(),
                block: true,
                poison: false,
            })
        })
        .start()
        .await
        .unwrap();
    let sup = rt.supervisor().clone();
    sup.spawn(
        SessionSpec::new("chat", "rec")
            .persistent(true)
            .durability(Durability::Sync),
    )
    .await
    .unwrap();
    for it in &items {
        sup.push("chat", it.clone()).await.expect("acknowledged");
    }
    // The blocked turn recorded its state at the safe point; the record says so.
    let store = rt.store().unwrap();
    let rec = within("the record", async {
        loop {
            if let Some(r) = store.load("chat").await.unwrap() {
                if r.state.is_some() {
                    return r;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(rec.interrupted_items, vec![items[0].clone()]);
    assert_eq!(rec.unhandled_items, items[1..].to_vec());
    let exits = rt
        .stop(StopOptions::immediate().shutdown().cause("shutdown"))
        .await
        .unwrap();
    assert_eq!(exits.len(), 1);
    assert!(got.lock().is_empty());

    // Run 2: the runtime resumes the session; the agent gets every item back equal, in
    // order, and the cut turn's state.
    let (g, r) = (got.clone(), resumed.clone());
    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("rec", move |_cfg: &[u8]| {
            Ok(Recorder {
                got: g.clone(),
                resumed: r.clone(),
                block: false,
                poison: false,
            })
        })
        .start()
        .await
        .unwrap();
    assert_eq!(report.resumed, vec!["chat".to_string()], "{report:?}");
    assert_eq!(report.items, items.len());
    rt.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(*got.lock(), items, "every item back, equal, in order");
    let states = resumed.lock().clone();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].seen, vec![items[0].clone()]);
    assert_eq!(
        states[0].extra["model"],
        json!({"name": "sim", "temperature": 0.5})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15a_an_unstorable_push_is_handed_back_and_nothing_is_written() {
    let dir = TempDir::new("s15a-refuse");
    let c = agentloop::store::CheckpointActor::<Item>::spawn(dir.path())
        .await
        .unwrap();
    let store: Arc<dyn CheckpointStore<Item>> = Arc::new(c.clone());
    let got = Arc::new(Mutex::new(Vec::new()));
    let h: SessionHandle<Item, ()> = SessionHandle::spawn(
        SessionSpec::new("refuse", "default")
            .persistent(true)
            .kind("rec")
            .durability(Durability::Sync),
        Arc::new(Recorder {
            got: got.clone(),
            resumed: Arc::new(Mutex::new(Vec::new())),
            block: false,
            poison: false,
        }),
        Some(store.clone()),
    )
    .await
    .unwrap();
    for bad in [
        Item::WideLoose(WideLoose::N(5)),
        Item::WideTagged(WideTagged::N { n: 5 }),
        Item::WideFlat(WideFlat {
            inner: WideInner { n: 5 },
        }),
    ] {
        match h.push(bad.clone()).await {
            Err(PushError::NotStorable { item, error }) => {
                assert_eq!(item, bad, "the item comes back");
                let msg = error.to_string();
                assert!(msg.contains("Item") && msg.contains("u128"), "{msg}");
            }
            other => panic!("{bad:?}: expected NotStorable, got {other:?}"),
        }
    }
    assert!(
        store.load("refuse").await.unwrap().is_none(),
        "nothing was written for a refused item"
    );
    h.push(Item::Unit(Unit))
        .await
        .expect("a storable item is accepted");
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_accepted, 1);
    assert_eq!(*got.lock(), vec![Item::Unit(Unit)]);
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15a_an_unstorable_state_fails_the_turn_and_the_record_keeps_the_last_good_one() {
    let dir = TempDir::new("s15a-state");
    let c = agentloop::store::CheckpointActor::<Item>::spawn(dir.path())
        .await
        .unwrap();
    let store: Arc<dyn CheckpointStore<Item>> = Arc::new(c.clone());
    let h: SessionHandle<Item, ()> = SessionHandle::spawn(
        SessionSpec::new("poison", "default")
            .persistent(true)
            .kind("rec")
            .durability(Durability::Sync),
        Arc::new(Recorder {
            got: Arc::new(Mutex::new(Vec::new())),
            resumed: Arc::new(Mutex::new(Vec::new())),
            block: false,
            poison: true,
        }),
        Some(store.clone()),
    )
    .await
    .unwrap();
    h.push(Item::Unit(Unit)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("cannot be stored") && e.contains("u128")),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.failure, Some(FailureKind::Record));
    assert_eq!(exit.interrupted_items, vec![Item::Unit(Unit)]);
    // S18: the record is left with the last good state (the first safe point's).
    let rec = store
        .load("poison")
        .await
        .unwrap()
        .expect("the record is kept");
    assert_eq!(rec.status, SessionStatus::Running);
    let state: State = codec::decode_state("poison", rec.state.as_ref().unwrap()).unwrap();
    assert_eq!(state.poison, None);
    assert_eq!(state.seen, vec![Item::Unit(Unit)]);
    c.close().await.unwrap();
}

/// Issue 13 (1): an answer that cannot be stored is refused before anything is read
/// or written, and comes back.
#[tokio::test(start_paused = true)]
async fn s15a_an_unstorable_answer_is_handed_back() {
    let store: Arc<dyn CheckpointStore<Item>> = Arc::new(agentloop::MemoryStore::<Item>::new());
    let bad = Item::WideLoose(WideLoose::N(5));
    let r = SessionHandle::<Item, ()>::resume_with_answer(
        SessionSpec::new("answer", "default")
            .persistent(true)
            .kind("rec"),
        Arc::new(Recorder {
            got: Arc::new(Mutex::new(Vec::new())),
            resumed: Arc::new(Mutex::new(Vec::new())),
            block: false,
            poison: false,
        }),
        Some(store.clone()),
        bad.clone(),
        8,
    )
    .await;
    match r {
        Err(e @ agentloop::session::AnswerError::NotStorable { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("u128"), "names the reason: {msg}");
            assert_eq!(e.into_answer(), Some(bad));
        }
        other => panic!("expected NotStorable, got {:?}", other.map(|_| ())),
    }
    assert!(store.load("answer").await.unwrap().is_none());
}
