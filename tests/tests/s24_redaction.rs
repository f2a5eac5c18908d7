//! S24 (issue 13, 5): the client view of a record goes through the runtime's redaction;
//! a redacted field never reaches a view and stays intact in the store.

use std::sync::Arc;

use agentloop::view::REDACTED;
use agentloop::{
    view::Part, view::Redaction, CheckpointStore, MemoryStore, Runtime, SessionSpec, StopOptions,
};
use agentloop_sim::{Fault, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s24_a_redacted_field_never_reaches_a_view_and_is_intact_in_the_store() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let store: Arc<dyn CheckpointStore<SimItem>> = mem.clone();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone())
        .flush_logs(None)
        .register_agent("sim", |_cfg: &[u8]| {
            Ok(SimAgent::new(steps(1))
                .with_fault(Some(0), 0, Fault::Interrupt, true)
                .with_state_payload(4))
        })
        // Item texts are secrets; questions are shown without their item ids.
        .redact(Redaction::new(|part, v| match part {
            Part::Question => json!({"redacted": true}),
            _ => mask(v, "text"),
        }))
        .start()
        .await
        .unwrap();
    let h = rt
        .supervisor()
        .spawn(SessionSpec::new("secret", "sim").persistent(true))
        .await
        .unwrap();
    h.push(SimItem::new(1, "my password is hunter2"))
        .await
        .unwrap();
    within("the interrupt", h.wait()).await;

    let view = rt.view("secret").await.unwrap().expect("a view");
    let shown = serde_json::to_string(&view).unwrap();
    assert!(
        !shown.contains("hunter2"),
        "the secret reached the view: {shown}"
    );
    assert_eq!(
        view.interrupted_items,
        vec![json!({"id": 1, "text": REDACTED})]
    );
    let interrupt = view.interrupt.expect("the interrupt");
    assert_eq!(interrupt.question, json!({"redacted": true}));
    assert!(interrupt.awaiting_answer);
    assert!(
        view.state.is_some(),
        "the state is shown (redacted by the same function)"
    );
    // The store keeps everything.
    let rec = mem.get("secret").expect("the record");
    assert_eq!(rec.interrupted_items[0].text, "my password is hunter2");
    assert_eq!(
        rec.interrupt.map(|i| i.question),
        Some(json!({"turn": 0, "step": 0, "items": [1]}))
    );
    assert!(rt.view("nobody").await.unwrap().is_none());
    rt.stop(StopOptions::bare()).await.unwrap();
}

fn mask(v: serde_json::Value, field: &str) -> serde_json::Value {
    Redaction::fields([field]).apply(Part::Item, v)
}

/// The `[redact] fields` of agentloop.toml build the same redaction.
#[test]
fn s24_redact_fields_from_the_config_file() {
    let c = agentloop::RuntimeConfig::from_toml_str("[redact]\nfields = [\"api_key\"]").unwrap();
    assert_eq!(c.redact.fields, vec!["api_key".to_string()]);
    let r = c.redact.redaction();
    assert_eq!(
        r.apply(Part::Event, json!({"call": {"api_key": "k"}})),
        json!({"call": {"api_key": REDACTED}})
    );
    let err = agentloop::RuntimeConfig::from_toml_str("[redact]\nfields = [\"\"]").unwrap_err();
    assert!(err.to_string().contains("redact.fields"), "{err}");
}
