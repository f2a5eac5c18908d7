//! The routes over stored sessions and the request options (issue 17, S33, S34): the
//! S24 view through the runtime's redaction, the list with live and stored sessions
//! marked, history, resume with an answer, delete, detach, preempt options, idempotent
//! pushes, every stop mode, the event-stream bound (429) and CORS only when configured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentloop::{view::Redaction, Runtime, StopOptions};
use agentloop_http::{router, HttpOptions};
use agentloop_sim::{Fault, Ledger, SimEvent, SimItem};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use parking_lot::Mutex;
use serde_json::{json, Value};

mod common;
use common::*;

type Ledgers = Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>>;

/// A persistent runtime in `dir`: kind `asks` interrupts turn 1 in every other agent
/// built (the 1st, 3rd, ...: the tests resume each asking session once before the next
/// one starts, and a resumed agent must not ask again); kind `sim` never does. Items' `text` and
/// questions' `items` are redacted for clients.
async fn stored_runtime(dir: &std::path::Path, ledgers: Ledgers) -> Rt {
    let built = Arc::new(AtomicUsize::new(0));
    let l = ledgers.clone();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir)
        .flush_logs(None)
        .redact(Redaction::fields(["text", "items"]))
        .register_agent("asks", move |_cfg: &[u8]| {
            let a = react_agent();
            Ok(if built.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
                a
            } else {
                a.with_fault(Some(1), 0, Fault::Interrupt, true)
            })
        })
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = react_agent();
            l.lock().push(a.ledger());
            Ok(a)
        })
        .start()
        .await
        .unwrap();
    rt
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..400 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_session_is_viewed_redacted_listed_answered_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let rt = stored_runtime(dir.path(), Ledgers::default()).await;
    let app = router(&rt, HttpOptions::default());
    let (s, v) = spawn(
        &app,
        json!({"id": "ask", "kind": "asks", "persistent": true, "history": 4}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // history needs a store behind it.
    let (s, v) = spawn(&app, json!({"id": "h", "kind": "sim", "history": 2})).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{v}"
    );

    // Turn 0 completes; turn 1 asks and the session stops awaiting an answer.
    assert_eq!(push(&app, "ask", 1, "secret one").await.0, StatusCode::OK);
    eventually("turn 0's checkpoint", || async {
        call(&app, "GET", "/sessions/ask/history", None)
            .await
            .1
            .as_array()
            .is_some_and(|a| !a.is_empty())
    })
    .await;
    assert_eq!(push(&app, "ask", 2, "secret two").await.0, StatusCode::OK);
    eventually("the interrupt", || async {
        let (_, v) = call(&app, "GET", "/sessions/ask", None).await;
        v["status"] == "stopped" && v["live"] == false
    })
    .await;

    let (s, v) = call(&app, "GET", "/sessions/ask", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["agent_kind"], "asks");
    assert_eq!(
        v["interrupted_items"],
        json!([{"id": 2, "text": "[redacted]"}]),
        "{v}"
    );
    assert_eq!(v["interrupt"]["question"]["items"], "[redacted]", "{v}");
    // The stored record itself is untouched (S24).
    let stored = rt.store().unwrap().load("ask").await.unwrap().unwrap();
    assert_eq!(stored.interrupted_items[0].text, "secret two");

    let (s, list) = call(&app, "GET", "/sessions", None).await;
    assert_eq!(s, StatusCode::OK);
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "ask")
        .cloned()
        .unwrap();
    assert_eq!(
        (
            row["live"].clone(),
            row["status"].clone(),
            row["kind"].clone()
        ),
        (json!(false), json!("stopped"), json!("asks"))
    );

    let (s, hist) = call(&app, "GET", "/sessions/ask/history", None).await;
    assert_eq!(s, StatusCode::OK);
    let turn = hist[0]["turn"].as_u64().unwrap();
    let (s, cp) = call(&app, "GET", &format!("/sessions/ask/history/{turn}"), None).await;
    assert_eq!(s, StatusCode::OK, "{cp}");
    assert_eq!(cp["session_id"], "ask");
    let (s, v) = call(&app, "GET", "/sessions/ask/history/99", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "unknown_checkpoint"));

    // The answer resumes it; a second answer finds nothing awaiting one.
    let answer = Some(json!({"answer": {"id": 99, "text": "approved"}}));
    let (s, v) = call(&app, "POST", "/sessions/ask/resume", answer.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call(&app, "POST", "/sessions/ask/resume", answer.clone()).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
    let (s, v) = call(&app, "POST", "/sessions/ghost/resume", answer).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::NOT_FOUND, "unknown_session"),
        "{v}"
    );

    // Delete is refused while it runs; a stop that leaves nothing to resume removes
    // the record by itself.
    let (s, v) = call(&app, "DELETE", "/sessions/ask", None).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
    let (s, _) = call(
        &app,
        "POST",
        "/sessions/ask/stop",
        Some(json!({"mode": "immediate"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    eventually("the stop", || async {
        let (s, v) = call(&app, "GET", "/sessions/ask", None).await;
        s == StatusCode::NOT_FOUND || v["live"] == false
    })
    .await;

    // A second session awaiting an answer is deleted with its history.
    spawn(
        &app,
        json!({"id": "ask2", "kind": "asks", "persistent": true, "history": 4}),
    )
    .await;
    for i in [10, 11] {
        assert_eq!(push(&app, "ask2", i, "x").await.0, StatusCode::OK);
    }
    eventually("the second interrupt", || async {
        let (_, v) = call(&app, "GET", "/sessions/ask2", None).await;
        v["status"] == "stopped" && v["live"] == false
    })
    .await;
    let (s, v) = call(&app, "DELETE", "/sessions/ask2", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["deleted"], true);
    assert_eq!(
        call(&app, "GET", "/sessions/ask2", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, "GET", "/sessions/ask2/history", None).await.0,
        StatusCode::NOT_FOUND
    );
    let (s, v) = call(&app, "DELETE", "/sessions/ask2", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "unknown_session"));
    rt.shutdown().await.unwrap();
}

/// Sends one push with an `Idempotency-Key`.
async fn keyed_push(app: &Router, key: &str, id: u64) -> (StatusCode, Value) {
    let body = json!({"item": {"id": id, "text": "t"}});
    let (status, bytes) = post_keyed(app, "/sessions/k/items", key, &body).await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_delivers_once_and_preempts_are_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let ledgers = Ledgers::default();
    let rt = stored_runtime(dir.path(), ledgers.clone()).await;
    let app = router(&rt, HttpOptions::default());
    spawn(&app, json!({"id": "k", "kind": "sim"})).await;

    let first = keyed_push(&app, "order-1", 1).await;
    assert_eq!(first.0, StatusCode::OK, "{first:?}");
    for _ in 0..3 {
        assert_eq!(
            keyed_push(&app, "order-1", 1).await,
            first,
            "a retry answers the first outcome"
        );
    }
    let (s, v) = keyed_push(&app, "order-1", 2).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::CONFLICT, "idempotency_mismatch"),
        "{v}"
    );
    assert_eq!(keyed_push(&app, "order-2", 3).await.0, StatusCode::OK);

    // A preempt on an idle session has nothing to cancel.
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/k/items",
        Some(json!({"item": {"id": 4, "text": "t"}, "preempt": {"at": "any", "timeout": "1s"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(
        ["no_target", "submitted", "target_ended"]
            .contains(&v["preempt"]["kind"].as_str().unwrap()),
        "{v}"
    );
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/k/items",
        Some(json!({"item": {"id": 5, "text": "t"}, "preempt": {"at": "sometimes"}})),
    )
    .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{v}"
    );

    // Drain: every accepted item is delivered, item 1 once, item 5 never.
    let (s, _) = call(
        &app,
        "POST",
        "/sessions/k/stop",
        Some(json!({"mode": "drain"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    eventually("the drain", || async {
        call(&app, "GET", "/sessions", None)
            .await
            .1
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["live"] == false)
    })
    .await;
    let mut delivered: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    delivered.sort_unstable();
    assert_eq!(delivered, [1, 3, 4]);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_and_every_stop_mode() {
    let dir = tempfile::tempdir().unwrap();
    let rt = stored_runtime(dir.path(), Ledgers::default()).await;
    let app = router(&rt, HttpOptions::default());
    for (id, persistent) in [("mem", false), ("bg", true), ("at", false), ("idle", false)] {
        let (s, v) = spawn(
            &app,
            json!({"id": id, "kind": "sim", "persistent": persistent}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (s, v) = call(&app, "POST", "/sessions/mem/detach", None).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
    let (s, v) = call(&app, "POST", "/sessions/bg/detach", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["detached"], true);
    let (s, v) = call(&app, "POST", "/sessions/ghost/detach", None).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::NOT_FOUND, "unknown_session"),
        "{v}"
    );

    for (body, want) in [
        (json!({"mode": "at"}), StatusCode::BAD_REQUEST),
        (
            json!({"mode": "at", "at": "never"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"mode": "graceful", "idle_for": "1s"}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"mode": "idle"}), StatusCode::BAD_REQUEST),
        (
            json!({"mode": "drain", "timeout": "1s"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"mode": "graceful", "timeout": "0s"}),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (s, v) = call(&app, "POST", "/sessions/at/stop", Some(body.clone())).await;
        assert_eq!((s, code(&v)), (want, "bad_request"), "{body}: {v}");
    }
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/at/stop",
        Some(json!({"mode": "at", "at": "after_tool_calls", "timeout": "2s", "cause": "user"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/idle/stop",
        Some(json!({"mode": "idle", "idle_for": "10ms"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    eventually("both stops", || async {
        let (_, l) = call(&app, "GET", "/sessions", None).await;
        !l.as_array()
            .unwrap()
            .iter()
            .any(|r| (r["id"] == "at" || r["id"] == "idle") && r["live"] == true)
    })
    .await;
    rt.stop(StopOptions::immediate()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_are_bounded_and_cors_is_off_unless_configured() {
    let rt = runtime().await;
    let app = router(
        &rt,
        HttpOptions {
            max_event_streams: Some(1),
            ..HttpOptions::default()
        },
    );
    spawn(&app, json!({"id": "s", "kind": "sim"})).await;
    let first = open_events(&app, "s", None).await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = open_events(&app, "s", None).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    // Over a socket the server sees the client go away a moment later.
    drop(first);
    eventually("the stream slot to free", || async {
        open_events(&app, "s", None).await.status() == StatusCode::OK
    })
    .await;

    let with_origin = |app: Router| async move {
        let req = Request::builder()
            .uri("/healthz")
            .header("origin", "http://app.example")
            .body(Body::empty())
            .unwrap();
        send(&app, req)
            .await
            .headers()
            .get("access-control-allow-origin")
            .cloned()
    };
    assert_eq!(with_origin(app.clone()).await, None);
    let cors = router(
        &rt,
        HttpOptions {
            cors_origins: vec!["http://app.example".into()],
            ..HttpOptions::default()
        },
    );
    assert_eq!(with_origin(cors).await.unwrap(), "http://app.example");
    rt.stop(StopOptions::immediate()).await.unwrap();
}

/// The number on the metrics line that starts with `prefix`.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_turns_pushes_checkpoints_and_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let ledgers = Ledgers::default();
    let rt = stored_runtime(dir.path(), ledgers.clone()).await;
    let app = router(&rt, HttpOptions::default());
    spawn(&app, json!({"id": "m", "kind": "sim", "persistent": true})).await;
    for i in 0..3 {
        assert_eq!(push(&app, "m", i, "t").await.0, StatusCode::OK);
    }
    assert_eq!(push(&app, "ghost", 9, "t").await.0, StatusCode::NOT_FOUND);
    eventually("three items delivered", || async {
        ledgers
            .lock()
            .iter()
            .map(|l| l.lock().delivered_ids().len())
            .sum::<usize>()
            == 3
    })
    .await;

    let text = metrics_text(&app).await;
    assert!(sample(&text, "agentloop_turns_total{outcome=\"completed\"}") >= 1.0);
    assert_eq!(
        sample(&text, "agentloop_pushes_total{result=\"accepted\"}"),
        3.0
    );
    assert_eq!(
        sample(&text, "agentloop_pushes_total{result=\"refused\"}"),
        1.0
    );
    // sync durability: every accepted item was a group commit of its own or a share of one.
    assert!(sample(&text, "agentloop_checkpoint_apply_seconds_count") >= 1.0);
    assert!(sample(&text, "agentloop_checkpoint_flush_seconds_count") >= 1.0);
    assert_eq!(sample(&text, "agentloop_sessions{status=\"live\"}"), 1.0);
    assert_eq!(sample(&text, "agentloop_draining"), 0.0);
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_restarts_and_show_the_shutdown_phases() {
    // An agent whose first turn fails: the supervisor restarts the session (S26).
    let (rt, _) = Rt::builder()
        .flush_logs(None)
        .register_agent("flaky", |_cfg: &[u8]| {
            Ok(react_agent().with_fault(Some(0), 0, Fault::Fail, true))
        })
        .start()
        .await
        .unwrap();
    let app = router(&rt, HttpOptions::default());
    spawn(&app, json!({"id": "f", "kind": "flaky"})).await;
    assert_eq!(push(&app, "f", 1, "t").await.0, StatusCode::OK);
    let metrics = || metrics_text(&app);
    eventually("a restart", || async {
        metrics()
            .await
            .lines()
            .any(|l| l.starts_with("agentloop_restarts_total ") && !l.ends_with(" 0"))
    })
    .await;
    assert!(
        sample(
            &metrics().await,
            "agentloop_turns_total{outcome=\"failed\"}"
        ) >= 1.0
    );

    rt.shutdown_handle()
        .shutdown()
        .await
        .expect("the shutdown report");
    eventually("the shutdown phases", || async {
        metrics()
            .await
            .contains("agentloop_shutdown_phase_seconds{phase=\"total\"}")
    })
    .await;
    let text = metrics().await;
    assert_eq!(sample(&text, "agentloop_draining"), 1.0);
    for phase in ["gate", "grace", "force", "cleanup"] {
        sample(
            &text,
            &format!("agentloop_shutdown_phase_seconds{{phase=\"{phase}\"}}"),
        );
    }
    rt.shutdown().await.unwrap();
}

/// S1b (issue 32, 2): a cut turn's durable steps are in the view, with their keys and
/// their results through the redaction (as the state is), and counted in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_shows_a_cut_turns_durable_steps_and_metrics_count_them() {
    struct Pays;
    impl agentloop::Agent for Pays {
        type Item = SimItem;
        type Event = SimEvent;
        type State = u32;
        async fn run_turn(
            &self,
            _turn: agentloop::Turn<Self>,
            cx: agentloop::TurnCx<Self>,
        ) -> Result<agentloop::TurnOutcome<u32>, agentloop::AgentError> {
            let r: Value = cx
                .step("charge", |key| async move {
                    json!({"receipt": key.to_string(), "items": "card 4242"})
                })
                .await?;
            assert!(r["receipt"].is_string());
            // The turn fails after its step: the record keeps the cut turn (S18).
            Err(agentloop::AgentError::failed("the model went away"))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .redact(Redaction::fields(["text", "items"]))
        .register_agent("pays", |_cfg: &[u8]| Ok(Pays))
        .start()
        .await
        .unwrap();
    let app = router(&rt, HttpOptions::default());
    let (s, v) = spawn(
        &app,
        json!({"id": "p", "kind": "pays", "persistent": true, "durability": "sync"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(push(&app, "p", 1, "buy").await.0, StatusCode::OK);
    eventually("the failed turn", || async {
        call(&app, "GET", "/sessions/p", None).await.1["live"] == false
    })
    .await;
    let (s, v) = call(&app, "GET", "/sessions/p", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let step = &v["steps"]["journaled"][0];
    assert_eq!(step["key"], "p/0/0/charge", "{v}");
    assert_eq!(step["finished"], true);
    assert_eq!(step["result"]["receipt"], "p/0/0/charge");
    assert_eq!(step["result"]["items"], "[redacted]", "{v}");
    let text = metrics_text(&app).await;
    // The supervisor restarts the failed session from its record (S26) until its
    // budget is spent: each restart replays the charge, none runs it again.
    assert_eq!(sample(&text, "agentloop_steps_total{result=\"ran\"}"), 1.0);
    assert!(sample(&text, "agentloop_steps_total{result=\"replayed\"}") >= 1.0);
    assert!(sample(&text, "agentloop_restarts_total") >= 1.0);
}

/// A kept checkpoint forks into a new session over HTTP (issue 35's inspector): 201,
/// the new session is on record with the checkpoint's kind; the same id again is a
/// duplicate; an unknown checkpoint, a bad body and a bad id are said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_checkpoint_forks_into_a_new_session() {
    let dir = tempfile::tempdir().unwrap();
    let rt = stored_runtime(dir.path(), Ledgers::default()).await;
    let app = router(&rt, HttpOptions::default());
    let (s, v) = spawn(
        &app,
        json!({"id": "src", "kind": "sim", "persistent": true, "history": 2}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = push(&app, "src", 1, "one").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    eventually("a kept checkpoint", || async {
        let (s, h) = call(&app, "GET", "/sessions/src/history", None).await;
        s == StatusCode::OK && h.as_array().is_some_and(|a| !a.is_empty())
    })
    .await;
    let (_, hist) = call(&app, "GET", "/sessions/src/history", None).await;
    let turn = hist[0]["turn"].as_u64().unwrap();
    let fork = format!("/sessions/src/history/{turn}/fork");
    let (s, v) = call(&app, "POST", &fork, Some(json!({"id": "src-fork"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v, json!({"id": "src-fork", "from": "src", "turn": turn}));
    let (s, forked) = call(&app, "GET", "/sessions/src-fork", None).await;
    assert_eq!(s, StatusCode::OK, "{forked}");
    assert_eq!(forked["agent_kind"], "sim", "{forked}");
    let (s, v) = call(&app, "POST", &fork, Some(json!({"id": "src-fork"}))).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "duplicate"), "{v}");
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/src/history/99/fork",
        Some(json!({"id": "nope"})),
    )
    .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::NOT_FOUND, "unknown_checkpoint"),
        "{v}"
    );
    let (s, v) = call(&app, "POST", &fork, Some(json!({"name": "x"}))).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{v}"
    );
    let (s, v) = call(&app, "POST", &fork, Some(json!({"id": "bad id\n"}))).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{v}"
    );
    rt.stop(agentloop::StopOptions::immediate()).await.unwrap();
}

/// `GET /metrics` as text.
async fn metrics_text(app: &Router) -> String {
    let resp = get(app, "/metrics").await;
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let (status, bytes) = status_body(resp).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// S26a (issue 53.1): a session whose record is gone while its checkpoint history and
/// kept events remain (a build before S26a deleted a clean end's record, as
/// `CheckpointStore::delete` still does) is known at every door: listed `completed`
/// (kind `null`) in id order among the recorded and live ones, on the right page, by
/// the status filter, at the get, and counted by `/metrics`'s one judgement; a delete
/// removes it from all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_kept_only_as_history_and_events_is_listed_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let rt = stored_runtime(dir.path(), Ledgers::default()).await;
    let app = router(&rt, HttpOptions::default());
    for (id, persistent) in [("a-runs", false), ("b-kept", true), ("c-stops", true)] {
        let (s, v) = spawn(
            &app,
            if persistent {
                json!({"id": id, "kind": "sim", "persistent": true, "history": 3})
            } else {
                json!({"id": id, "kind": "sim"})
            },
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{id}: {v}");
    }
    for id in ["b-kept", "c-stops"] {
        let (s, v) = push(&app, id, 1, "x").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        eventually("a kept checkpoint", || async {
            call(&app, "GET", &format!("/sessions/{id}/history"), None)
                .await
                .1
                .as_array()
                .is_some_and(|a| !a.is_empty())
        })
        .await;
        let (s, v) = call(
            &app,
            "POST",
            &format!("/sessions/{id}/stop"),
            Some(json!({"mode": "graceful"})),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        eventually("the stop", || async {
            let (_, v) = call(&app, "GET", &format!("/sessions/{id}"), None).await;
            v["status"] == "stopped" && v["live"] == false
        })
        .await;
    }
    // Its record deleted as S16's clean end did before S26a: history and events stay.
    let store = rt.store().expect("a store");
    assert!(store.delete("b-kept").await.expect("delete"));
    assert!(store.load_stored("b-kept").await.expect("load").is_none());

    let (s, rows) = call(&app, "GET", "/sessions", None).await;
    assert_eq!(s, StatusCode::OK, "{rows}");
    let ids: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a-runs", "b-kept", "c-stops"], "{rows}");
    let kept = &rows[1];
    assert_eq!(kept["status"], "completed", "{kept}");
    assert_eq!(kept["kind"], Value::Null, "{kept}");
    assert_eq!(kept["live"], false, "{kept}");
    assert_eq!(rows[0]["status"], "running");
    assert_eq!(rows[2]["status"], "stopped");
    // Pages of one: each id once, in order, the kept one on its own page.
    let mut paged = Vec::new();
    let mut uri = "/sessions?limit=1".to_string();
    for _ in 0..5 {
        let resp = get(&app, &uri).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let link = resp
            .headers()
            .get("link")
            .map(|l| l.to_str().unwrap().to_string());
        let (_, bytes) = status_body(resp).await;
        let page: Value = serde_json::from_slice(&bytes).unwrap();
        paged.extend(
            page.as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_string()),
        );
        match link {
            Some(l) => uri = l[1..l.find('>').unwrap()].to_string(),
            None => break,
        }
    }
    assert_eq!(paged, ["a-runs", "b-kept", "c-stops"]);
    let (_, completed) = call(&app, "GET", "/sessions?status=completed", None).await;
    assert_eq!(completed.as_array().unwrap().len(), 1, "{completed}");
    assert_eq!(completed[0]["id"], "b-kept");
    let (_, stopped) = call(&app, "GET", "/sessions?status=stopped", None).await;
    assert_eq!(stopped.as_array().unwrap().len(), 1, "{stopped}");
    assert_eq!(stopped[0]["id"], "c-stops");
    let (s, v) = call(&app, "GET", "/sessions/b-kept", None).await;
    assert_eq!(
        (s, v["status"].clone()),
        (StatusCode::OK, json!("completed")),
        "{v}"
    );
    assert_eq!(v["kept"]["record"], false, "{v}");
    // The metrics judge the same way.
    let text = metrics_text(&app).await;
    assert_eq!(
        sample(&text, "agentloop_sessions_known{status=\"running\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "agentloop_sessions_known{status=\"completed\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "agentloop_sessions_known{status=\"stopped\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "agentloop_sessions_known{status=\"failed\"}"),
        0.0
    );

    // A delete removes what is kept: unknown at every door.
    let (s, v) = call(&app, "DELETE", "/sessions/b-kept", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        call(&app, "GET", "/sessions/b-kept", None).await.0,
        StatusCode::NOT_FOUND
    );
    let (_, rows) = call(&app, "GET", "/sessions", None).await;
    assert!(
        rows.as_array().unwrap().iter().all(|r| r["id"] != "b-kept"),
        "{rows}"
    );
    let text = metrics_text(&app).await;
    assert_eq!(
        sample(&text, "agentloop_sessions_known{status=\"completed\"}"),
        0.0
    );
    rt.shutdown().await.unwrap();
}
